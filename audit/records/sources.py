"""Where lines come from: blocks of whole lines, numbered, from any source of bytes.

The engine (`audit.engine.runner.audit_blocks`) reads `LineBlock`s and never knows their source. A
source cuts bytes into whole lines and numbers them from the physical line number its first
byte starts:

    file_blocks(path, start=, end=, first_line=)   a file, or a byte range of it (a shard)
    memory_blocks(lines, first_line=)              lines held in memory (the generator's canary)
    GrowingFile(path).new_blocks()                 the whole lines appended since the last call
    chunk_blocks(chunks, first_line=)              any stream of byte chunks: an object-store
                                                   body, a socket, a decompressor

A block holds at most `block_bytes` of input and `MAX_BLOCK_LINES` lines, so memory is bounded
by the block, never by the source. Every source goes through `chunk_blocks`, so a line is cut,
numbered and counted blank or not the same way whatever produced it. A line longer than
`MAX_LINE_BYTES` is never held: it is skipped to its newline, and its block keeps only where it
starts and its size (`LongLine`), for the reader to report.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from audit.base.errors import InputError
from audit.base.storage import AnyPath

# A block's records, decoded texts and the rules' working columns take ~25-40x its bytes at the
# peak; 4 MB keeps that near 100 MB, and per-block overheads stay a few percent of the work.
DEFAULT_BLOCK_BYTES = 4 << 20
# At most this many lines per block, however short they are: what the rules hold per record
# (decoded texts, findings) is then what bounds memory.
MAX_BLOCK_LINES = 16_384
# The longest line read. A longer one is no record a loader could hold, and holding it is what a
# file ending in a crash's preallocated zeros would cost: it is skipped unread to its newline and
# reported as unreadable with its size. The same bound `generate` puts on a prompts file's rows.
MAX_LINE_BYTES = 64 << 20


def is_blank(raw: bytes) -> bool:
    """A line of whitespace only (a `\\r` included) is not a record: no finding, not counted."""
    return not raw.strip()


@dataclass(frozen=True)
class LongLine:
    """A line over `MAX_LINE_BYTES`, skipped unread: where it starts in the source and its size."""

    offset: int  # of its first byte, counted from the source's start (a file's, not a range's)
    size: int  # its bytes, without the newline


@dataclass
class LineBlock:
    """Consecutive physical lines of the input, as raw bytes without their `\\n`, numbered
    from `first_line`. `last_unterminated`: the last line had no newline (the end of a source
    that may still be being written). `long_lines`: the lines over `MAX_LINE_BYTES`, by line
    number; each is a record that was not read, held in `lines` as `b""`."""

    first_line: int
    lines: list[bytes]
    last_unterminated: bool = False
    long_lines: dict[int, LongLine] = field(default_factory=dict)

    @property
    def last_line(self) -> int:
        """The physical line number of the block's last line."""
        return self.first_line + len(self.lines) - 1

    @property
    def nbytes(self) -> int:
        """The input bytes the block stands for, newlines included."""
        skipped = sum(long.size for long in self.long_lines.values())
        return sum(map(len, self.lines)) + skipped + len(self.lines) - (1 if self.last_unterminated else 0)

    def record_lines(self) -> Iterator[tuple[int, bytes]]:
        """(physical line number, bytes) of each line that is a record (not blank): a long line
        is one, given as `b""` (look it up in `long_lines`)."""
        long = self.long_lines
        for offset, raw in enumerate(self.lines):
            if not is_blank(raw) or (long and self.first_line + offset in long):
                yield self.first_line + offset, raw

    def blank_lines(self) -> Iterator[int]:
        """The physical line numbers of the block's blank lines (no record)."""
        for line, raw in enumerate(self.lines, self.first_line):
            if is_blank(raw) and line not in self.long_lines:
                yield line


class InputDigest:
    """The sha256 and size of the input, computed as it streams by."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.bytes = 0

    def update(self, chunk: bytes) -> None:
        self._hash.update(chunk)
        self.bytes += len(chunk)

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()


def chunk_blocks(
    chunks: Iterable[bytes], *, first_line: int = 1, digest: InputDigest | None = None, start: int = 0
) -> Iterator[LineBlock]:
    """Cut a stream of byte chunks into blocks of whole lines, numbered from `first_line`.

    A chunk may end anywhere: the part of a line after its last newline waits for the next
    chunk, kept as pieces joined once when its newline comes, so a line costs time linear in its
    length however many chunks it spans. A line over `MAX_LINE_BYTES` is not kept at all: only
    its size is counted until its newline, and its block gives it as a `LongLine`. Bytes after
    the last newline of the stream are a last block of one unterminated line. Each chunk becomes
    at most one block (or several of `MAX_BLOCK_LINES` lines), so the chunk size bounds a
    block's size. `start`: the source offset of the first chunk's first byte.
    """
    limit = MAX_LINE_BYTES  # looked up now, not when the module was loaded
    next_line = first_line
    at = start  # the source offset of the next chunk's first byte
    pieces: list[bytes] = []  # the line carried over from earlier chunks, while it is kept
    carried = 0  # its size so far, kept or not
    carry_at = 0  # its offset
    for chunk in chunks:
        if digest is not None:
            digest.update(chunk)
        # Split where the chunk is (no copy of it): the line it starts with continues the last
        # chunk's, the part after its last newline waits for the next. The chunk itself is let
        # go: while its block is audited, this generator holds none of its bytes.
        chunk_size = len(chunk)
        lines = chunk.split(b"\n")
        del chunk
        tail = lines.pop()
        if carried and not lines:  # no newline here: the carried line goes on
            carried += len(tail)
            if carried <= limit:
                pieces.append(tail)
            else:
                pieces.clear()
            at += chunk_size
            continue
        # A line wholly inside the chunk may be over the limit too (a chunk larger than it).
        long = dict(_long_lines(lines, next_line, at, continued=carried > 0)) if chunk_size > limit else {}
        if carried:
            size = carried + len(lines[0])
            if size > limit:
                long[next_line] = LongLine(carry_at, size)
                lines[0] = b""
            else:
                lines[0] = b"".join([*pieces, lines[0]])
        carried, carry_at = len(tail), at + chunk_size - len(tail)
        pieces = [tail] if carried <= limit else []
        at += chunk_size
        parts = [lines[begin : begin + MAX_BLOCK_LINES] for begin in range(0, len(lines), MAX_BLOCK_LINES)]
        del lines
        while parts:
            end = next_line + len(parts[0])
            # Given away, not kept: a block's lines are freed as soon as its reader drops them.
            yield LineBlock(next_line, parts.pop(0), long_lines={k: v for k, v in long.items() if next_line <= k < end})
            next_line = end
    if carried > limit:
        yield LineBlock(next_line, [b""], last_unterminated=True, long_lines={next_line: LongLine(carry_at, carried)})
    elif carried:
        yield LineBlock(next_line, [b"".join(pieces)], last_unterminated=True)


def _long_lines(lines: list[bytes], first_line: int, at: int, *, continued: bool) -> Iterator[tuple[int, LongLine]]:
    """The whole lines of a chunk starting at source offset `at` that are over `MAX_LINE_BYTES`,
    each replaced by `b""` in `lines` (the first is left alone when it `continued` a carried line)."""
    limit = MAX_LINE_BYTES
    for index, raw in enumerate(lines):
        if len(raw) > limit and not (index == 0 and continued):
            yield first_line + index, LongLine(at, len(raw))
            lines[index] = b""
        at += len(raw) + 1


def file_chunks(
    path: AnyPath, *, start: int = 0, end: int | None = None, chunk_bytes: int = DEFAULT_BLOCK_BYTES
) -> Iterator[bytes]:
    """The bytes [start, end) of `path`, `chunk_bytes` at a time; InputError when unreadable."""
    remaining = None if end is None else end - start
    try:
        with path.open("rb") as handle:
            handle.seek(start)
            while chunk := handle.read(
                chunk_bytes if remaining is None else min(chunk_bytes, remaining)
            ):
                if remaining is not None:
                    remaining -= len(chunk)
                # Handed over, not kept: bound here, the chunk would live on while its block is
                # audited, and while the next chunk is read.
                given = [chunk]
                del chunk
                yield given.pop()
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def file_blocks(
    path: AnyPath,
    *,
    start: int = 0,
    end: int | None = None,
    first_line: int = 1,
    digest: InputDigest | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> Iterator[LineBlock]:
    """`path` (or its bytes [start, end), a range beginning at a line start) as line blocks.

    `first_line` is the physical line number at `start` (see `audit.flows.parallel.plan_shards`).
    """
    chunks = file_chunks(path, start=start, end=end, chunk_bytes=block_bytes)
    return chunk_blocks(chunks, first_line=first_line, digest=digest, start=start)


def first_line(path: AnyPath, *, chunk_bytes: int = 1 << 20) -> bytes | None:
    """The first line of `path` without its newline, or None when it is over `MAX_LINE_BYTES`
    (read no further than that: never held)."""
    pieces: list[bytes] = []
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(chunk_bytes):
            end = chunk.find(b"\n")
            if end != -1:
                size += end
                pieces.append(chunk[:end])
                break
            size += len(chunk)
            pieces.append(chunk)
            if size > MAX_LINE_BYTES:
                return None
    return None if size > MAX_LINE_BYTES else b"".join(pieces)


def memory_blocks(
    lines: Sequence[bytes], *, first_line: int = 1, digest: InputDigest | None = None
) -> Iterator[LineBlock]:
    """Lines held in memory (each with or without its `\\n`), numbered from `first_line`."""
    joined = b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines)
    return chunk_blocks([joined] if joined else [], first_line=first_line, digest=digest)


class GrowingFile:
    """A file being appended to, read as the whole lines added since the last look.

    A partial last line waits until its newline arrives. A file that shrinks below what was
    read (replaced, or cut) is read again from its start: `restarted` says so. The new lines
    are read as they are consumed, a block at a time, however much was appended.
    """

    def __init__(self, path: Path, *, block_bytes: int = DEFAULT_BLOCK_BYTES):
        self.path = path
        self.block_bytes = block_bytes
        self.offset = 0  # bytes consumed: whole lines only
        self.lines = 0  # physical lines consumed
        self.size = 0  # the file's size at the last look
        self.pending = 0  # bytes of a partial last line, waiting for its newline
        self.restarted = False
        self._scanned = 0  # the bytes before this offset were looked at for a newline already

    def new_blocks(self) -> Iterator[LineBlock]:
        """The whole lines appended since the last call, as blocks numbered in the file.

        Consume them before the next call: the line count moves on as they are read.
        """
        self.size = self.path.stat().st_size if self.path.exists() else 0
        self.restarted = self.size < self.offset
        if self.restarted:
            self.offset = self.lines = self._scanned = 0
        # A partial line is not read again at every look for its newline: only what was appended
        # (all of it again if the file was cut meanwhile).
        scanned = self._scanned if self._scanned <= self.size else self.offset
        end = self._after_last_newline(max(self.offset, scanned), self.size) or self.offset
        self._scanned = self.size
        self.pending = self.size - end
        start, self.offset = self.offset, end
        return self._blocks(start, end)

    def _blocks(self, start: int, end: int) -> Iterator[LineBlock]:
        if end <= start:
            return
        blocks = file_blocks(
            self.path, start=start, end=end, first_line=self.lines + 1, block_bytes=self.block_bytes
        )
        for block in blocks:
            self.lines = block.last_line
            yield block

    def _after_last_newline(self, start: int, end: int, window: int = 1 << 16) -> int:
        """The offset just past the last newline in bytes [start, end), or 0 if none."""
        with self.path.open("rb") as handle:
            at = end
            while at > start:
                begin = max(start, at - window)
                handle.seek(begin)
                found = handle.read(at - begin).rfind(b"\n")
                if found != -1:
                    return begin + found + 1
                at = begin
        return 0

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
numbered and counted blank or not the same way whatever produced it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from audit.base.errors import InputError
from audit.base.storage import AnyPath

# A block's records, decoded texts and the rules' working columns take ~25-40x its bytes at the
# peak; 4 MB keeps that near 100 MB, and per-block overheads stay a few percent of the work.
DEFAULT_BLOCK_BYTES = 4 << 20
# At most this many lines per block, however short they are: what the rules hold per record
# (decoded texts, findings) is then what bounds memory.
MAX_BLOCK_LINES = 16_384


def is_blank(raw: bytes) -> bool:
    """A line of whitespace only (a `\\r` included) is not a record: no finding, not counted."""
    return not raw.strip()


@dataclass
class LineBlock:
    """Consecutive physical lines of the input, as raw bytes without their `\\n`, numbered
    from `first_line`. `last_unterminated`: the last line had no newline (the end of a source
    that may still be being written)."""

    first_line: int
    lines: list[bytes]
    last_unterminated: bool = False

    @property
    def last_line(self) -> int:
        """The physical line number of the block's last line."""
        return self.first_line + len(self.lines) - 1

    @property
    def nbytes(self) -> int:
        """The input bytes the block stands for, newlines included."""
        return sum(map(len, self.lines)) + len(self.lines) - (1 if self.last_unterminated else 0)

    def record_lines(self) -> Iterator[tuple[int, bytes]]:
        """(physical line number, bytes) of each line that is a record (not blank)."""
        for offset, raw in enumerate(self.lines):
            if not is_blank(raw):
                yield self.first_line + offset, raw


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
    chunks: Iterable[bytes], *, first_line: int = 1, digest: InputDigest | None = None
) -> Iterator[LineBlock]:
    """Cut a stream of byte chunks into blocks of whole lines, numbered from `first_line`.

    A chunk may end anywhere: the part of a line after its last newline waits for the next
    chunk. Bytes after the last newline of the stream are a last block of one unterminated line.
    Each chunk becomes at most one block (or several of `MAX_BLOCK_LINES` lines), so the chunk
    size bounds a block's size.
    """
    next_line = first_line
    carry = b""
    for chunk in chunks:
        if digest is not None:
            digest.update(chunk)
        # Split where the chunk is (no copy of it): the line it starts with continues the last
        # chunk's, the part after its last newline waits for the next.
        lines = chunk.split(b"\n")
        if carry:
            lines[0] = carry + lines[0]
        carry = lines.pop()
        for begin in range(0, len(lines), MAX_BLOCK_LINES):
            part = lines[begin : begin + MAX_BLOCK_LINES]
            yield LineBlock(next_line, part)
            next_line += len(part)
    if carry:
        yield LineBlock(next_line, [carry], last_unterminated=True)


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
                yield chunk
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
    return chunk_blocks(chunks, first_line=first_line, digest=digest)


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

    def new_blocks(self) -> Iterator[LineBlock]:
        """The whole lines appended since the last call, as blocks numbered in the file.

        Consume them before the next call: the line count moves on as they are read.
        """
        self.size = self.path.stat().st_size if self.path.exists() else 0
        self.restarted = self.size < self.offset
        if self.restarted:
            self.offset = self.lines = 0
        end = self._after_last_newline(self.offset, self.size)
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
        """The offset just past the last newline in bytes [start, end), or `start` if none."""
        with self.path.open("rb") as handle:
            at = end
            while at > start:
                begin = max(start, at - window)
                handle.seek(begin)
                found = handle.read(at - begin).rfind(b"\n")
                if found != -1:
                    return begin + found + 1
                at = begin
        return start

"""The run's output files: the append-only samples file, and errors.jsonl beside it.

Exactly once: the output is append-only, one flushed line per finished sample. A run that
starts on an existing output resumes it: `recover_output` cuts what a crash leaves after the
last whole line, and only that: a partial last line (it starts as a sample does, `{`), zero
bytes (space the file system had allocated but no write reached), or a partial line followed by
zero bytes; anything else there is refused as not this generator's. It lists the ids already
written, which the run then skips. A write is synchronous,
so no task switch (and no cancellation on Ctrl-C) can happen in the middle of a line.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import orjson

from audit.base.errors import InputError
from audit.base.files import fsync_directory

ERRORS_FILE = "errors.jsonl"


@dataclass(frozen=True)
class Resumed:
    """What an existing output already holds."""

    keys: frozenset[str]
    lines: int
    truncated_bytes: int  # cut off after the last whole line: a partial line and zero bytes
    zero_bytes: int = 0  # of those, the zero bytes that ended the file

    def what_was_cut(self) -> str | None:
        """What recovering the output cut after its last whole line, in words (None: nothing)."""
        partial = self.truncated_bytes - self.zero_bytes
        if not self.truncated_bytes:
            return None
        if not partial:
            return f"{self.zero_bytes:,} zero {_bytes(self.zero_bytes)} after the last whole line (space allocated, never written)"
        line = f"a partial last line ({partial:,} bytes)"
        return f"{line} and {self.zero_bytes:,} zero {_bytes(self.zero_bytes)} after it" if self.zero_bytes else line


def recover_output(path: Path) -> Resumed:
    """Make `path` end on a whole line (cutting a crash's partial line and zero bytes after the
    last whole line) and list the ids in it."""
    if not path.exists():
        return Resumed(frozenset(), 0, 0)
    if path.is_dir():
        raise InputError(f"--out {path} is a directory; name the output file")
    size = path.stat().st_size
    not_ours = "not a sample this generator wrote (no JSON object with an id); pass another --out, or move the file away"
    with path.open("rb") as handle:
        # Find the end of the last whole line by reading backwards from the end, and where the
        # zero bytes that end the file begin.
        end = zeros_from = size
        while end > 0:
            start = max(0, end - (1 << 16))
            handle.seek(start)
            chunk = handle.read(end - start)
            if zeros_from == end:  # every byte after this chunk is a zero
                zeros_from = start + len(chunk.rstrip(b"\0"))
            cut = chunk.rfind(b"\n")
            if cut != -1:
                end = start + cut + 1
                break
            end = start
        if zeros_from > end:  # not zero bytes alone: a partial line, perhaps zeros after it
            handle.seek(end)
            if not handle.read(1) == b"{":
                raise InputError(f"{path}:{_line_count(path, end) + 1}: {not_ours}")
    keys: set[str] = set()
    lines = 0
    # Every whole line is checked before the partial one is cut: a file that is not ours is left intact.
    # Only the whole lines are read: what follows them (a crash's partial line, a gigabyte of
    # zeros) is never held.
    with path.open("rb") as handle:
        number = 0
        while handle.tell() < end:
            raw = handle.readline()  # each ends in a newline at or before `end`
            number += 1
            lines = number
            if not raw.strip():
                continue
            try:
                value = orjson.loads(raw)
                key = str(value["id"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                raise InputError(f"{path}:{number}: {not_ours}") from None
            keys.add(key)
    truncated = size - end
    if truncated:
        with path.open("rb+") as handle:
            handle.truncate(end)
            handle.flush()
            os.fsync(handle.fileno())
    return Resumed(frozenset(keys), lines, truncated, size - max(zeros_from, end))


def _bytes(count: int) -> str:
    return "byte" if count == 1 else "bytes"


def _line_count(path: Path, end: int) -> int:
    with path.open("rb") as handle:
        return handle.read(end).count(b"\n")


class ResponseLog:
    """The append-only output: one line per sample, flushed at once, fsync'd every few seconds."""

    def __init__(self, path: Path, fsync_interval: float):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        created = not path.exists()
        self._handle = path.open("ab")
        if created:  # the new file's name survives a power cut along with its synced lines
            fsync_directory(path.parent)
        self._fsync_interval = fsync_interval
        self._synced = time.monotonic()

    def append(self, line: bytes) -> None:
        """Write one whole line. Synchronous on purpose: no task switch can happen mid-line."""
        self._handle.write(line)
        self._handle.flush()
        if time.monotonic() - self._synced >= self._fsync_interval:
            self.sync()

    def sync(self) -> None:
        os.fsync(self._handle.fileno())
        self._synced = time.monotonic()

    def close(self) -> None:
        if not self._handle.closed:
            self._handle.flush()
            self.sync()
            self._handle.close()


class ErrorLog:
    """errors.jsonl: one line per prompt that failed, with its reason; opened on the first one."""

    def __init__(self, path: Path):
        self.path = path
        self._handle: IO[bytes] | None = None

    def append(self, entry: dict[str, Any]) -> None:
        """Write one entry, stamped with the time, and flush it."""
        if self._handle is None:
            self._handle = self.path.open("ab")
        entry = {**entry, "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
        self._handle.write(orjson.dumps(entry) + b"\n")
        self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self._handle.close()
            fsync_directory(self.path.parent)

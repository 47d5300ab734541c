"""Single lines of a data file read again, for the viewers (`audit inspect`, the HTML samples).

`LineIndex` finds the byte offset of every line in one streamed pass (numpy over the bytes,
the file never held) to re-read any line by number. `read_record` reads one line with the
audit's own reader (`audit.records.reader.parse_block`: the same normalisation, the `prompt_ids`
alias, finish reasons, as the rules saw), and for a line the reader refuses, salvages what a
viewer can still show and says why it is not a record.
"""

from __future__ import annotations

import numpy as np
import orjson
import polars as pl

from audit.base.storage import AnyPath
from audit.records import sources
from audit.records.line_reading import long_line
from audit.records.reader import RECORD_COLUMNS, empty_records, parse_block
from audit.records.sources import LineBlock

# What is read of a line too long for the audit to read: enough to show how it begins.
LONG_LINE_HEAD = 4096


class LineIndex:
    """Byte offsets of every line of a file, found in one streamed pass, to re-read any line."""

    def __init__(self, path: AnyPath, chunk_bytes: int = 16 << 20):
        self.path = path
        starts = [np.zeros(1, dtype=np.int64)]
        offset = 0
        with path.open("rb") as handle:
            while chunk := handle.read(chunk_bytes):
                newlines = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 0x0A)
                starts.append(newlines.astype(np.int64) + offset + 1)
                offset += len(chunk)
        self.size = offset
        self._starts = np.concatenate(starts)
        # A trailing newline starts no line.
        if len(self._starts) > 1 and self._starts[-1] == self.size:
            self._starts = self._starts[:-1]

    @property
    def lines(self) -> int:
        return len(self._starts)

    def line_bytes(self, line: int) -> int:
        """The length of physical line `line` (1-based), without its newline."""
        if not 1 <= line <= self.lines:
            raise IndexError(line)
        end = int(self._starts[line]) - 1 if line < self.lines else self.size
        return end - int(self._starts[line - 1])

    def read(self, line: int) -> bytes:
        """The bytes of physical line `line` (1-based), without its newline; of a line over
        `MAX_LINE_BYTES`, which the audit never reads, only its first `LONG_LINE_HEAD` bytes."""
        size = self.line_bytes(line)
        if size > sources.MAX_LINE_BYTES:
            size = LONG_LINE_HEAD
        with self.path.open("rb") as handle:
            handle.seek(int(self._starts[line - 1]))
            return handle.read(size)


def read_record(raw: bytes, line: int, *, size: int | None = None) -> tuple[pl.DataFrame, str | None]:
    """Physical line `line` as a one-row record frame and None; for a line the reader refuses,
    the parts that are readable (an empty frame when none are) and what is wrong with it.
    `size`: the line's whole length, when `raw` is only its head (`LineIndex.read`)."""
    if size is not None and size > sources.MAX_LINE_BYTES:
        return empty_records(), long_line(line, size, unterminated=False).reason
    parsed = parse_block(LineBlock(line, [raw.rstrip(b"\r")]), keep_source=True)
    if parsed.records.height == 1:
        return parsed.records, None
    return _salvage(raw, line)


def _salvage(raw: bytes, line: int) -> tuple[pl.DataFrame, str]:
    """For a line `parse_block` refused: a one-row record frame of the parts that are readable
    (id lists that are lists of integers, the id), and what keeps it from being a record.

    What a viewer shows of a broken line; the audit itself reports the line as unreadable.
    """
    if not raw.strip():
        return empty_records(), "a blank line: no record here"
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return empty_records(), f"not a JSON record: {exc}"
    if not isinstance(value, dict):
        return empty_records(), f"a JSON {type(value).__name__}, not an object"
    problems: list[str] = []

    def ids(*names: str) -> list[int] | None:
        for name in names:
            found = value.get(name)
            if found is None:
                continue
            if not isinstance(found, list):
                problems.append(f"{name} is not a list of token ids")
            elif not all(isinstance(i, int) and not isinstance(i, bool) and -(1 << 63) <= i < 1 << 63 for i in found):
                problems.append(f"{name} holds values that are not token ids")
            else:
                return found
            return None
        problems.append(f"{names[0]} is missing")
        return None

    prompt, output = ids("input_ids", "prompt_ids"), ids("output_ids")
    record_id = value.get("id")
    frame = pl.DataFrame(
        {"line": [line], "id": [None if record_id is None else str(record_id)], "input_ids": [prompt], "output_ids": [output]},
        schema={name: RECORD_COLUMNS[name] for name in ("line", "id", "input_ids", "output_ids")},
    )
    frame = frame.with_columns(
        pl.lit(None, dtype=dtype).alias(name) for name, dtype in RECORD_COLUMNS.items() if name not in frame.columns
    ).select(list(RECORD_COLUMNS))
    return frame, "; ".join(problems) or "does not fit the record contract"


"""The record contract on disk, and reading it in streamed batches.

One JSON object per line (SGLang `/generate` output saved raw):

    id            string or int; absent: the line number identifies the record
    input_ids     list of ints (alias: prompt_ids)
    output_ids    list of ints
    meta_info     optional, as SGLang returns it: finish_reason {type, matched | length |
                  message}, prompt_tokens, completion_tokens, ...
    text          optional, the server's decoded text
    messages, tools optional, the source prompt: kept as the line's raw text in `source`
                  (only for lines that have them, and only when a rule reads it: the
                  template-fidelity rule, and the tool-call rules for declared types)
    anything else: kept on disk, ignored here

The file is read in byte blocks, each block parsed by polars with an explicit schema. A
block polars refuses is split in halves until the offending lines are single: each becomes
an `UnreadableLine` with its physical line number and the rest of the file is still read.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import polars as pl

# The raw schema polars parses against; fields beyond it are ignored.
RAW_SCHEMA: dict[str, pl.DataType] = {
    "id": pl.String(),
    "input_ids": pl.List(pl.Int64()),
    "prompt_ids": pl.List(pl.Int64()),
    "output_ids": pl.List(pl.Int64()),
    "text": pl.String(),
    "meta_info": pl.Struct(
        {
            "finish_reason": pl.Struct(
                {
                    "type": pl.String(),
                    "matched": pl.String(),
                    "length": pl.Int64(),
                    "message": pl.String(),
                }
            ),
            "prompt_tokens": pl.Int64(),
            "completion_tokens": pl.Int64(),
        }
    ),
}

# The columns every batch frame has, one row per readable record.
RECORD_COLUMNS: dict[str, pl.DataType] = {
    "line": pl.UInt32(),
    "id": pl.String(),
    "input_ids": pl.List(pl.Int64()),
    "output_ids": pl.List(pl.Int64()),
    "text": pl.String(),
    "has_meta": pl.Boolean(),
    "finish_type": pl.String(),
    "finish_matched": pl.String(),
    "finish_length": pl.Int64(),
    "finish_message": pl.String(),
    "prompt_tokens": pl.Int64(),
    "completion_tokens": pl.Int64(),
    # The raw JSON line, kept only when it carries `messages` or `tools` and a rule reads it
    # (the template rule, the tool-call rules), so other runs never copy the prompt.
    "source": pl.String(),
}

# A line carrying its source prompt (messages, or the tools the tool-call rules read).
_PROMPT_KEYS = (b'"messages"', b'"tools"')

_LIST_FIELDS = ("input_ids", "prompt_ids", "output_ids")

DEFAULT_BLOCK_BYTES = 32 << 20


@dataclass(frozen=True)
class UnreadableLine:
    """A line that is not a record: bad JSON, not UTF-8, wrong types, or cut short."""

    line: int
    reason: str
    contract: bool  # True: valid JSON that breaks the record contract; False: not JSON at all

    @property
    def rule(self) -> str:
        """The rule that reports it: INT002 (record contract) or INT001 (not JSON)."""
        return "INT002" if self.contract else "INT001"


@dataclass
class LineBlock:
    """Consecutive physical lines of the input, as raw bytes, numbered from `first_line`."""

    first_line: int
    lines: list[bytes]
    last_unterminated: bool = False


@dataclass
class ParsedBlock:
    """A block parsed: readable records as a frame, the rest as unreadable lines."""

    records: pl.DataFrame
    unreadable: list[UnreadableLine] = field(default_factory=list)
    blank_lines: int = 0


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


def iter_line_blocks(
    path: Path,
    digest: InputDigest | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    *,
    start: int = 0,
    end: int | None = None,
    first_line: int = 1,
) -> Iterator[LineBlock]:
    """Stream `path` as blocks of whole lines; memory is bounded by `block_bytes`.

    `start`/`end` restrict the read to a byte range that begins at a line start (a shard of
    the file, see `audit.parallel`); `first_line` is the physical line number at `start`.
    """
    next_line = first_line
    carry = b""
    remaining = None if end is None else end - start
    with path.open("rb") as handle:
        handle.seek(start)
        while chunk := handle.read(block_bytes if remaining is None else min(block_bytes, remaining)):
            if remaining is not None:
                remaining -= len(chunk)
            if digest is not None:
                digest.update(chunk)
            data = carry + chunk if carry else chunk
            cut = data.rfind(b"\n")
            if cut == -1:
                carry = data
                continue
            lines = data[:cut].split(b"\n")
            carry = data[cut + 1 :]
            yield LineBlock(next_line, lines)
            next_line += len(lines)
    if carry:
        yield LineBlock(next_line, [carry], last_unterminated=True)


def parse_block(block: LineBlock, *, keep_source: bool = True) -> ParsedBlock:
    """Parse a block's lines into a record frame; blank lines are skipped, bad lines reported.

    `keep_source=False` leaves the `source` column null (no rule in the run reads it).
    """
    numbered: list[tuple[int, bytes]] = []
    blank = 0
    for offset, raw in enumerate(block.lines):
        text = raw.rstrip(b"\r")
        if text.strip():
            numbered.append((block.first_line + offset, text))
        else:
            blank += 1
    frames: list[pl.DataFrame] = []
    unreadable: list[UnreadableLine] = []
    _parse_bisecting(numbered, frames, unreadable, block, keep_source)
    # One chunk per column: polars 2.1 panics ("i < self.len()") formatting string columns
    # taken from a multi-chunk struct after a filter; rechunking here costs well under 1 ms.
    records = pl.concat(frames, how="vertical").rechunk() if frames else empty_records()
    return ParsedBlock(records=records, unreadable=unreadable, blank_lines=blank)


def empty_records() -> pl.DataFrame:
    """A record frame with no rows (every column of `RECORD_COLUMNS`)."""
    return pl.DataFrame(schema=RECORD_COLUMNS)


def _parse_bisecting(
    numbered: list[tuple[int, bytes]],
    frames: list[pl.DataFrame],
    unreadable: list[UnreadableLine],
    block: LineBlock,
    keep_source: bool,
) -> None:
    if not numbered:
        return
    try:
        raw = pl.read_ndjson(io.BytesIO(b"\n".join(text for _, text in numbered)), schema=RAW_SCHEMA)
        if raw.height != len(numbered):
            raise ValueError("row count differs from line count")
    except Exception as exc:  # polars raises several types; the halves will tell which line
        if len(numbered) == 1:
            line, text = numbered[0]
            last = block.last_unterminated and line == block.first_line + len(block.lines) - 1
            unreadable.append(_diagnose(line, text, exc, last_line_unterminated=last))
            return
        middle = len(numbered) // 2
        _parse_bisecting(numbered[:middle], frames, unreadable, block, keep_source)
        _parse_bisecting(numbered[middle:], frames, unreadable, block, keep_source)
        return
    lines = pl.Series("line", [line for line, _ in numbered], dtype=pl.UInt32())
    if keep_source:
        source: pl.Series | pl.Expr = pl.Series(
            "source",
            [text.decode() if any(key in text for key in _PROMPT_KEYS) else None for _, text in numbered],
            dtype=pl.String(),
        )
    else:
        source = pl.lit(None, dtype=pl.String()).alias("source")
    frames.append(_normalise(raw, lines).with_columns(source))


def _normalise(raw: pl.DataFrame, lines: pl.Series) -> pl.DataFrame:
    """Raw parsed columns to the record columns the rules read."""
    meta = pl.col("meta_info")
    finish = meta.struct.field("finish_reason")
    return raw.select(
        lines,
        pl.col("id"),
        pl.coalesce("input_ids", "prompt_ids").alias("input_ids"),
        pl.col("output_ids"),
        pl.col("text"),
        meta.is_not_null().alias("has_meta"),
        finish.struct.field("type").alias("finish_type"),
        finish.struct.field("matched").alias("finish_matched"),
        finish.struct.field("length").alias("finish_length"),
        finish.struct.field("message").alias("finish_message"),
        meta.struct.field("prompt_tokens").alias("prompt_tokens"),
        meta.struct.field("completion_tokens").alias("completion_tokens"),
    )


def _diagnose(line: int, text: bytes, exc: Exception, *, last_line_unterminated: bool) -> UnreadableLine:
    """Say, for one line polars refused, what is wrong with it in terms a person can act on."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as err:
        try:
            text.decode("utf-8")
        except UnicodeDecodeError as bad:
            return UnreadableLine(line, f"bytes that are not UTF-8 at column {bad.start + 1}", False)
        if last_line_unterminated:
            return UnreadableLine(
                line,
                "last line is cut short with no newline: is the file still being written?",
                False,
            )
        return UnreadableLine(line, f"not valid JSON: {err}", False)
    if not isinstance(value, dict):
        return UnreadableLine(line, f"a JSON {type(value).__name__}, expected an object", True)
    for name in _LIST_FIELDS:
        ids = value.get(name)
        if ids is None:
            continue
        if not isinstance(ids, list):
            return UnreadableLine(line, f"{name} must be a list of token ids, got {type(ids).__name__}", True)
        wrong = next((v for v in ids if not isinstance(v, int) or isinstance(v, bool)), None)
        if wrong is not None or any(isinstance(v, bool) for v in ids):
            return UnreadableLine(line, f"{name} must hold integers only, found {wrong!r}", True)
        if any(v >= 1 << 63 or v < -(1 << 63) for v in ids):
            return UnreadableLine(line, f"{name} holds an integer too large for a token id", True)
    meta = value.get("meta_info")
    if meta is not None and not isinstance(meta, dict):
        return UnreadableLine(line, f"meta_info must be an object, got {type(meta).__name__}", True)
    if isinstance(meta, dict):
        finish = meta.get("finish_reason")
        if finish is not None and not isinstance(finish, dict):
            return UnreadableLine(
                line,
                f"meta_info.finish_reason must be an object like SGLang's "
                f"{{\"type\": \"stop\", ...}}, got {finish!r}",
                True,
            )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return UnreadableLine(line, f"does not fit the record contract: {first}", True)


def salvage_record(raw: bytes, line: int) -> tuple[pl.DataFrame, str]:
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


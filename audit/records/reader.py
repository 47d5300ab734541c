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

Lines come in blocks from any source (`audit.records.sources`); each line is read once by a strict
JSON parser, and the block's record frame (polars, the contract's column types) is built from
the values it gave. The id lists, nearly all of a line's bytes, are read natively into int64
buffers (`audit.records.id_lists`), never into Python ints. A line that is not a record becomes a
`RejectedLine` with its physical line number and the kind of problem, and the rest of the block
is still read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson
import polars as pl

from audit.base.json_values import json_type
from audit.records.id_lists import ID_LIST_FIELDS, IdLists, ids_column
from audit.records.sources import LineBlock

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
    # The record's source prompt as JSON ({messages, tools, chat_template_kwargs}), kept only when
    # it has `messages` or `tools` and a rule reads it (the template rule, the tool-call rules).
    "source": pl.String(),
}

# The kinds of problem that keep a line from being a record (`RejectedLine.problem`); the rule
# that reports each kind says so itself (`Rule.problem`).
UNREADABLE = "unreadable"  # not JSON for a strict parser, not UTF-8, cut short, a key given twice
CONTRACT = "contract"  # JSON, but not of the record contract's shape and types


@dataclass(frozen=True)
class RejectedLine:
    """A line that is not a record: bad JSON, not UTF-8, wrong types, or cut short."""

    line: int
    reason: str
    problem: str  # UNREADABLE or CONTRACT
    field: str | None = None  # the id list a bad token id is in, and its index there
    position: int | None = None


@dataclass
class ParsedBlock:
    """A block parsed: readable records as a frame, the rest as rejected lines."""

    records: pl.DataFrame
    rejected: list[RejectedLine] = field(default_factory=list)
    blank_lines: int = 0


def parse_block(block: LineBlock, *, keep_source: bool = True) -> ParsedBlock:
    """Parse a block's lines into a record frame; blank lines are skipped, bad lines reported.

    Every line is read once, by a strict JSON parser (orjson), which a training loader is as
    likely to use as polars: a line it refuses, an object with a key given twice, or a field of
    the wrong JSON type never becomes a record. The record frame is built from the values that
    reading gave (no second parse of the text), and the token-id policy is applied to the id
    columns as list expressions. `keep_source=False` leaves the `source` column null (no rule in
    the run reads it).
    """
    lines: list[int] = []
    values: list[dict[str, Any]] = []
    rejected: list[RejectedLine] = []
    last_unterminated = block.last_line if block.last_unterminated else None
    booleans = _hold_boolean_literals(block.lines)
    id_lists = IdLists()
    for line, raw in block.record_lines():
        text = raw.rstrip(b"\r")
        value, problem = _read_strictly(line, text, last_unterminated=line == last_unterminated, id_lists=id_lists)
        if problem is None and booleans[line - block.first_line]:
            # A boolean inside an id list reads as 0 or 1 in an integer column: found here, where
            # the line can hold one at all (its text has the literal), before the frame is built.
            problem = _bad_id_line(line, value)
        if problem is not None:
            rejected.append(problem)
            continue
        lines.append(line)
        values.append(value)
    records = _records_frame(lines, values, rejected, keep_source=keep_source)
    del values
    records, refused = _apply_id_policy(records)
    rejected.extend(refused)
    blank = len(block.lines) - records.height - len(rejected)
    return ParsedBlock(records=records, rejected=rejected, blank_lines=blank)


def _hold_boolean_literals(lines: list[bytes]) -> list[bool]:
    """Per line: does its text hold `true` or `false`? One search over the block (polars'
    SIMD substring search: a quarter of the time of Python's `in` on each line)."""
    if not lines:
        return []
    text = pl.Series(lines, dtype=pl.Binary())
    return (text.bin.contains(b"true") | text.bin.contains(b"false")).to_list()


def empty_records() -> pl.DataFrame:
    """A record frame with no rows (every column of `RECORD_COLUMNS`)."""
    return pl.DataFrame(schema=RECORD_COLUMNS)


# -- the strict reading of one line ------------------------------------------------------------

# A JSON escape that decodes to ":" (see `_may_repeat_keys`).
_ESCAPED_COLONS = (b"\\u003a", b"\\u003A")


def _read_strictly(
    line: int, text: bytes, *, last_unterminated: bool, id_lists: IdLists | None = None
) -> tuple[Any, RejectedLine | None]:
    """The line's JSON value, or why it is not a record (polars is never asked about it then).

    With `id_lists`, the id lists of a line that allows it are read natively (`IdLists`): the
    value then holds them as int64 arrays, and everything else as the full reading gives it.
    """
    read = id_lists.read(text) if id_lists is not None else None
    if read is not None:
        value, text, arrays = read
    else:
        arrays = None
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError as err:
            return None, _not_json(line, text, err, last_unterminated=last_unterminated)
    if not isinstance(value, dict):
        return None, RejectedLine(line, f"a JSON {json_type(value)}, expected an object", CONTRACT)
    if _may_repeat_keys(text, value) and (repeated := _repeated_key(text)) is not None:
        return None, RejectedLine(line, repeated, UNREADABLE)
    problem = _field_problem(value)
    if problem is not None:
        return None, RejectedLine(line, problem, CONTRACT)
    if arrays:
        value.update(arrays)
    return value, None


def _not_json(line: int, text: bytes, err: Exception, *, last_unterminated: bool) -> RejectedLine:
    try:
        text.decode("utf-8")
    except UnicodeDecodeError as bad:
        return RejectedLine(line, f"bytes that are not UTF-8 at column {bad.start + 1}", UNREADABLE)
    if last_unterminated:
        return RejectedLine(
            line, "last line is cut short with no newline: is the file still being written?", UNREADABLE
        )
    return RejectedLine(line, f"not valid JSON: {err}", UNREADABLE)


def _may_repeat_keys(text: bytes, value: dict[str, Any]) -> bool:
    """A cheap test that is True for every line holding an object with a repeated key.

    Each key is followed by one ":" outside strings. Written again without repeats
    (`orjson.dumps` of the parsed value, which kept one value per key), the line has exactly as
    many ":" as before, plus one per `\u003a` escape that decoded to ":". A repeated key takes
    its ":" with it, so fewer means a repeat. The id lists, nearly all of a line, are left out
    of the writing: a list of integers holds no ":", so the line's own count can only be higher
    when one holds something else, and such a line gets the careful parse too. Only the rare
    lines this flags (a repeat, a `\\u003a` that was not an escape, an id list of objects or
    strings) get the careful parse.
    """
    escaped = sum(text.count(escape) for escape in _ESCAPED_COLONS) if b"\\u003" in text else 0
    rest = {key: item for key, item in value.items() if key not in ID_LIST_FIELDS}
    keys_of_id_lists = len(value) - len(rest)
    return orjson.dumps(rest).count(b":") + keys_of_id_lists != text.count(b":") + escaped


def _repeated_key(text: bytes) -> str | None:
    """Parse `text` again noting every object's keys; the finding when one repeats, else None."""
    repeated: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in items]
        if len(set(keys)) != len(keys):
            repeated.append(next(key for i, key in enumerate(keys) if key in keys[:i]))
        return dict(items)

    try:
        json.loads(text, object_pairs_hook=pairs)
    except RecursionError:
        return "nested too deeply to check that no key repeats"
    if not repeated:
        return None
    return (
        f"key {json.dumps(repeated[0])} appears twice in one object: JSON readers disagree on "
        "which value counts (polars keeps the first, json and orjson the last)"
    )


def _is_int(value: Any) -> bool:
    """A JSON integer that fits the 64 bits polars reads counts into."""
    return isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < 1 << 63


def _shown(value: Any) -> str:
    """A value for a message: its JSON type and a short excerpt."""
    if value is None:
        return "null"
    text = orjson.dumps(value).decode() if not isinstance(value, float) else repr(value)
    return f"{json_type(value)} {text[:40]}{'…' if len(text) > 40 else ''}"


def _field_problem(value: dict[str, Any]) -> str | None:
    """What is wrong with the JSON types of the fields the audit reads, or None.

    Polars would coerce some of them silently (an id `true`, `1.5` or `[1]` all become strings),
    so their types are checked on the strictly parsed value. A few dict look-ups per record.
    """
    sample_id = value.get("id", "")
    if not isinstance(sample_id, str) and not (isinstance(sample_id, int) and not isinstance(sample_id, bool)):
        # orjson reads integers beyond 64 bits as floats: such an id is not kept exactly either.
        return f"id must be a string or an integer, got {_shown(sample_id)}"
    for name in ID_LIST_FIELDS:
        ids = value.get(name)
        if ids is not None and not isinstance(ids, list):
            return f"{name} must be a list of token ids, got {json_type(ids)}"
    text = value.get("text")
    if text is not None and not isinstance(text, str):
        return f"text must be a string (the server's decoded output), got {_shown(text)}"
    for name in ("messages", "tools"):
        prompt = value.get(name)
        if prompt is not None and not (isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt)):
            return f"{name} must be a list of objects, got {_shown(prompt)}"
    meta = value.get("meta_info")
    if meta is None:
        return None
    if not isinstance(meta, dict):
        return f"meta_info must be an object, got {_shown(meta)}"
    for name in ("prompt_tokens", "completion_tokens"):
        count = meta.get(name)
        if count is not None and not _is_int(count):
            return f"meta_info.{name} must be an integer, got {_shown(count)}"
    finish = meta.get("finish_reason")
    if finish is None:
        return None
    if not isinstance(finish, dict):
        return (
            f"meta_info.finish_reason must be an object like SGLang's "
            f"{{\"type\": \"stop\", ...}}, got {_shown(finish)}"
        )
    kind = finish.get("type")
    if kind is None:
        return "meta_info.finish_reason has no type (SGLang writes stop, length or abort)"
    if not isinstance(kind, str):
        shown = orjson.dumps(kind).decode()[:40]
        return (
            f"meta_info.finish_reason.type is '{shown}' (a JSON {json_type(kind)}), not one SGLang "
            "writes (stop, length, abort)"
        )
    matched = finish.get("matched")
    if matched is not None and not (_is_int(matched) or isinstance(matched, str)):
        return f"meta_info.finish_reason.matched must be a token id or a string, got {_shown(matched)}"
    length = finish.get("length")
    if length is not None and not _is_int(length):
        return f"meta_info.finish_reason.length must be an integer, got {_shown(length)}"
    message = finish.get("message")
    if message is not None and not isinstance(message, str):
        return f"meta_info.finish_reason.message must be a string, got {_shown(message)}"
    return None


def _id_list_problem(value: dict[str, Any]) -> tuple[str, int, str] | None:
    """(field, index, reason) of the first element of an id list that is not a 64-bit integer
    (or null, the policy's), or None.

    Per-element Python: only for lines whose text holds a boolean literal, or the lines of a
    block whose id columns could not be built (see `_records_frame`).
    """
    for name in ID_LIST_FIELDS:
        ids = value.get(name)
        if not isinstance(ids, list):
            continue
        for index, token in enumerate(ids):
            if token is not None and not _is_int(token):
                return name, index, f"{name}[{index}] = {_shown(token)} {NOT_A_TOKEN_ID}"
    return None


def _source_prompt(value: dict[str, Any]) -> str | None:
    """The record's source prompt as JSON (`messages`, `tools`, `chat_template_kwargs`), if any."""
    if value.get("messages") is None and value.get("tools") is None:
        return None
    prompt = {key: value[key] for key in ("messages", "tools", "chat_template_kwargs") if key in value}
    return orjson.dumps(prompt).decode()


# -- the record frame, from the values the strict reading gave -----------------------------------


def _records_frame(
    lines: list[int], values: list[dict[str, Any]], rejected: list[RejectedLine], *, keep_source: bool
) -> pl.DataFrame:
    """The record frame of the lines that passed (`RECORD_COLUMNS` plus the id lists the policy
    reads). An id list an integer column cannot hold (a float, a string, an integer beyond 64
    bits) rejects its line, with the field and index, and the rest are built again."""
    try:
        return _frame(lines, values, keep_source=keep_source)
    except (TypeError, OverflowError, ValueError, pl.exceptions.PolarsError):
        pass
    keep = []
    for index, (line, value) in enumerate(zip(lines, values, strict=True)):
        problem = _bad_id_line(line, value)
        if problem is None:
            keep.append(index)
        else:
            rejected.append(problem)
    lines, values = [lines[i] for i in keep], [values[i] for i in keep]
    try:
        return _frame(lines, values, keep_source=keep_source)
    except (TypeError, OverflowError, ValueError, pl.exceptions.PolarsError):
        pass
    # The last resort, for what the checks above passed: each line on its own.
    frames = []
    for line, value in zip(lines, values, strict=True):
        try:
            frames.append(_frame([line], [value], keep_source=keep_source))
        except (TypeError, OverflowError, ValueError, pl.exceptions.PolarsError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            rejected.append(RejectedLine(line, f"does not fit the record contract: {first}", CONTRACT))
    return pl.concat(frames, how="vertical") if frames else _frame([], [], keep_source=keep_source)


def _bad_id_line(line: int, value: dict[str, Any]) -> RejectedLine | None:
    problem = _id_list_problem(value)
    if problem is None:
        return None
    name, at, reason = problem
    return RejectedLine(line, reason, CONTRACT, name, at)


def _text(value: Any) -> str | None:
    """A string field as polars reads it into a string column: integers written as digits."""
    return value if value is None or isinstance(value, str) else str(value)


def _frame(lines: list[int], values: list[dict[str, Any]], *, keep_source: bool) -> pl.DataFrame:
    """Columns from the parsed values (their JSON types were checked by `_field_problem`)."""
    metas = [value.get("meta_info") for value in values]
    finishes = [meta.get("finish_reason") if meta is not None else None for meta in metas]

    def finish(key: str) -> list[Any]:
        return [f.get(key) if f is not None else None for f in finishes]

    def meta(key: str) -> list[Any]:
        return [m.get(key) if m is not None else None for m in metas]

    def ids(name: str) -> pl.Series:
        return ids_column(name, [value.get(name) for value in values])

    given_input, given_prompt = ids("input_ids"), ids("prompt_ids")
    columns = [
        pl.Series("line", lines, dtype=pl.UInt32()),
        pl.Series("id", [_text(value.get("id")) for value in values], dtype=pl.String()),
        given_input.alias("_input_ids"),
        ids("output_ids"),
        pl.Series("text", [value.get("text") for value in values], dtype=pl.String()),
        pl.Series("has_meta", [m is not None for m in metas], dtype=pl.Boolean()),
        pl.Series("finish_type", finish("type"), dtype=pl.String()),
        pl.Series("finish_matched", [_text(v) for v in finish("matched")], dtype=pl.String()),
        pl.Series("finish_length", finish("length"), dtype=pl.Int64(), strict=True),
        pl.Series("finish_message", finish("message"), dtype=pl.String()),
        pl.Series("prompt_tokens", meta("prompt_tokens"), dtype=pl.Int64(), strict=True),
        pl.Series("completion_tokens", meta("completion_tokens"), dtype=pl.Int64(), strict=True),
        pl.Series(
            "source",
            [_source_prompt(value) for value in values] if keep_source else [None] * len(values),
            dtype=pl.String(),
        ),
        # Kept until the id policy has looked at it (`_apply_id_policy`).
        given_prompt.alias("_prompt_ids"),
    ]
    frame = pl.DataFrame(columns)
    return frame.select(
        *[
            pl.coalesce("_input_ids", "_prompt_ids").alias(name) if name == "input_ids" else pl.col(name)
            for name in RECORD_COLUMNS
        ],
        "_prompt_ids",
        "_input_ids",
    )


# -- the token-id policy -------------------------------------------------------------------------

# A token id is an integer in [0, 2**32): no tokenizer has more ids, and every training loader
# stores them in 32 bits at most.
TOKEN_ID_LIMIT = 1 << 32
NOT_A_TOKEN_ID = "is not a token id (integers only, from 0 to 2**32 - 1)"


def _first_bad_id(column: str) -> pl.Expr:
    element = pl.element()
    bad = element.is_null() | (element < 0) | (element >= TOKEN_ID_LIMIT)
    return pl.col(column).list.eval(pl.arg_where(bad).first()).list.first()


def _apply_id_policy(records: pl.DataFrame) -> tuple[pl.DataFrame, list[RejectedLine]]:
    """Records whose id lists hold a null, a negative id or one >= 2**32 leave the frame as contract problems.

    Vectorised: min, max and null counts per list, and the first offending index only for the
    rows that have one. Also refused: `input_ids` and `prompt_ids` both given and different (a
    loader could take either).
    """
    if records.is_empty():
        return records.drop("_prompt_ids", "_input_ids", strict=False), []
    checks = []
    for column in ("_input_ids", "_prompt_ids", "output_ids"):
        ids = pl.col(column)
        checks.append(
            ((ids.list.min() < 0) | (ids.list.max() >= TOKEN_ID_LIMIT) | ids.list.eval(pl.element().is_null().any()).list.first())
            .fill_null(False)
        )
    both = pl.col("_input_ids").is_not_null() & pl.col("_prompt_ids").is_not_null()
    differ = (both & (pl.col("_input_ids") != pl.col("_prompt_ids"))).fill_null(False)
    flagged = records.select(pl.any_horizontal(*checks, differ)).to_series()
    if not flagged.any():
        return records.drop("_prompt_ids", "_input_ids"), []
    bad = records.filter(flagged)

    def describe(column: str, name: str) -> pl.Expr:
        at = _first_bad_id(column)
        value = pl.col(column).list.get(at.cast(pl.Int64), null_on_oob=True)
        return pl.when(at.is_not_null()).then(
            pl.struct(
                pl.lit(name).alias("field"),
                at.cast(pl.Int64).alias("position"),
                pl.format(
                    "{}[{}] = {} " + NOT_A_TOKEN_ID,
                    pl.lit(name),
                    at,
                    pl.coalesce(value.cast(pl.String), pl.lit("null")),
                ).alias("reason"),
            )
        )

    both = pl.struct(
        pl.lit(None, dtype=pl.String).alias("field"),
        pl.lit(None, dtype=pl.Int64).alias("position"),
        pl.lit("input_ids and prompt_ids are both given and differ: a loader could take either").alias("reason"),
    )
    reasons = bad.select(
        "line",
        pl.coalesce(
            describe("_input_ids", "input_ids"),
            describe("_prompt_ids", "prompt_ids"),
            describe("output_ids", "output_ids"),
            both,
        ).struct.unnest(),
    )
    refused = [
        RejectedLine(line, reason, CONTRACT, field, position)
        for line, field, position, reason in reasons.select("line", "field", "position", "reason").iter_rows()
    ]
    return records.filter(~flagged).drop("_prompt_ids", "_input_ids"), refused

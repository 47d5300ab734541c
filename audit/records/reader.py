"""The record contract on disk, and reading it in streamed batches.

One JSON object per line (SGLang `/generate` output saved raw):

    id            string or int; absent: the line number identifies the record
    input_ids     list of ints (alias: prompt_ids)
    output_ids    list of ints
    meta_info     optional, as SGLang returns it: finish_reason {type, matched | length |
                  message}, prompt_tokens, completion_tokens, ...
    text          optional, the server's decoded text
    image_data    optional, the images sent with the prompt, in placeholder order: a list of
                  strings (a path relative to the data file's folder, an http(s) URL or a
                  data: URI), or one such string for one image, as SGLang's
                  `GenerateReqInput.image_data` takes them
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

import traceback
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from audit.base.errors import one_line
from audit.records.id_lists import ID_LIST_FIELDS, IdLists, ids_column
from audit.records.line_reading import (
    CONTRACT,
    NOT_A_TOKEN_ID,
    TOKEN_ID_LIMIT,
    RejectedLine,
    id_list_problem,
    long_line,
    prompt_fields,
    read_strictly,
    record_id,
    source_prompt,
)
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
    "finish_matched_id": pl.Int64(),  # `matched` when it is a token id, not a stop string
    "finish_length": pl.Int64(),
    "finish_message": pl.String(),
    "prompt_tokens": pl.Int64(),
    "completion_tokens": pl.Int64(),
    # The images the record sends (`image_data`), null when it sends none.
    "image_data": pl.List(pl.String()),
    # The record's source prompt as JSON ({messages, tools, chat_template_kwargs}), kept only when
    # it has `messages` or `tools` and a rule reads it (the template rule, the tool-call rules).
    "source": pl.String(),
}

@dataclass
class ParsedBlock:
    """A block parsed: readable records as a frame, the rest as rejected lines."""

    records: pl.DataFrame
    rejected: list[RejectedLine] = field(default_factory=list)
    blank_lines: int = 0
    # The source prompts the reading gave (`messages`, `tools`, `chat_template_kwargs`), by
    # line: what the `source` column holds as JSON, kept so that no rule parses it again.
    source_prompts: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Lines the reading itself raised on (a bug: every line should read or be rejected), as
    # (line, the exception on one line, its traceback): the engine makes each an internal error.
    raised: list[tuple[int, str, str]] = field(default_factory=list)


def parse_block(block: LineBlock, *, keep_source: bool = True, consume: bool = False) -> ParsedBlock:
    """Parse a block's lines into a record frame; blank lines are skipped, bad lines reported.

    Every line is read once, by a strict JSON parser (orjson), which a training loader is as
    likely to use as polars: a line it refuses, an object with a key given twice, or a field of
    the wrong JSON type never becomes a record. The record frame is built from the values that
    reading gave (no second parse of the text), and the token-id policy is applied to the id
    columns as list expressions. `keep_source=False` leaves the `source` column null (no rule in
    the run reads it). `consume=True` lets the block's lines go as they are read (each becomes
    `b""`: the block keeps its numbering, not its bytes), so the block's bytes and its parsed
    values are never all held at once; take `block.nbytes` before.
    """
    lines: list[int] = []
    values: list[dict[str, Any]] = []
    rejected: list[RejectedLine] = []
    last_unterminated = block.last_line if block.last_unterminated else None
    id_lists = IdLists()
    raised: list[tuple[int, str, str]] = []
    for line, raw in block.record_lines():
        if block.long_lines and line in block.long_lines:
            rejected.append(long_line(line, block.long_lines[line].size, unterminated=line == last_unterminated))
            continue
        text = raw.rstrip(b"\r")
        if consume:
            block.lines[line - block.first_line] = b""
        try:
            value, problem = read_strictly(line, text, last_unterminated=line == last_unterminated, id_lists=id_lists)
            if problem is None and _may_hold_boolean_ids(value, text):
                # A boolean inside an id list reads as 0 or 1 in an integer column: found here, where
                # the line can hold one at all, before the frame is built.
                problem = _bad_id_line(line, value)
        except Exception as exc:  # noqa: BLE001 - one line the reading cannot take costs that line
            raised.append((line, one_line(exc), traceback.format_exc()))
            continue
        if problem is not None:
            rejected.append(problem)
            continue
        lines.append(line)
        values.append(value)
    records = _records_frame(lines, values, rejected, keep_source=keep_source)
    prompts = {}
    if keep_source:
        prompts = {line: prompt for line, value in zip(lines, values, strict=True) if (prompt := prompt_fields(value))}
    del values
    records, refused = _apply_id_policy(records)
    rejected.extend(refused)
    blank = len(block.lines) - records.height - len(rejected) - len(raised)
    return ParsedBlock(records=records, rejected=rejected, blank_lines=blank, source_prompts=prompts, raised=raised)


def _may_hold_boolean_ids(value: dict[str, Any], text: bytes) -> bool:
    """Can one of the line's id lists hold a JSON boolean? Only a list orjson read (a Python
    list) can: the native reading (`IdLists`) refuses a boolean, and such a line is read whole
    by orjson. Nearly every line's lists are read natively, and its text is never searched."""
    return any(type(value.get(name)) is list for name in ID_LIST_FIELDS) and (b"true" in text or b"false" in text)


def empty_records() -> pl.DataFrame:
    """A record frame with no rows (every column of `RECORD_COLUMNS`)."""
    return pl.DataFrame(schema=RECORD_COLUMNS)


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
            rejected.append(RejectedLine(line, f"does not fit the record contract: {first}", CONTRACT, id=record_id(value)))
    return pl.concat(frames, how="vertical") if frames else _frame([], [], keep_source=keep_source)


def _bad_id_line(line: int, value: dict[str, Any]) -> RejectedLine | None:
    problem = id_list_problem(value)
    if problem is None:
        return None
    name, at, reason = problem
    return RejectedLine(line, reason, CONTRACT, name, at, id=record_id(value))


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
    if given_prompt.null_count() == len(given_prompt):  # nearly always: no `prompt_ids`
        input_ids = given_input.alias("input_ids")
    else:
        input_ids = pl.select(pl.coalesce(given_input, given_prompt).alias("input_ids")).to_series()
    matched = finish("matched")
    columns = {
        "line": pl.Series("line", lines, dtype=pl.UInt32()),
        "id": pl.Series("id", [_text(value.get("id")) for value in values], dtype=pl.String()),
        "input_ids": input_ids,
        "output_ids": ids("output_ids"),
        "text": pl.Series("text", [value.get("text") for value in values], dtype=pl.String()),
        "has_meta": pl.Series("has_meta", [m is not None for m in metas], dtype=pl.Boolean()),
        "finish_type": pl.Series("finish_type", finish("type"), dtype=pl.String()),
        "finish_matched": pl.Series("finish_matched", [_text(v) for v in matched], dtype=pl.String()),
        "finish_matched_id": pl.Series(
            "finish_matched_id", [None if isinstance(v, str) else v for v in matched], dtype=pl.Int64()
        ),
        "finish_length": pl.Series("finish_length", finish("length"), dtype=pl.Int64(), strict=True),
        "finish_message": pl.Series("finish_message", finish("message"), dtype=pl.String()),
        "prompt_tokens": pl.Series("prompt_tokens", meta("prompt_tokens"), dtype=pl.Int64(), strict=True),
        "completion_tokens": pl.Series("completion_tokens", meta("completion_tokens"), dtype=pl.Int64(), strict=True),
        # One string is one image, as SGLang's GenerateReqInput.image_data takes it.
        "image_data": pl.Series(
            "image_data", [_listed(value.get("image_data")) for value in values], dtype=pl.List(pl.String())
        ),
        "source": pl.Series(
            "source",
            [source_prompt(value) for value in values] if keep_source else [None] * len(values),
            dtype=pl.String(),
        ),
    }
    # The given lists are kept until the id policy has looked at them (`_apply_id_policy`).
    return pl.DataFrame(
        [*(columns[name] for name in RECORD_COLUMNS), given_prompt.alias("_prompt_ids"), given_input.alias("_input_ids")]
    )


# -- the token-id policy -------------------------------------------------------------------------

# A token id is an integer in [0, 2**32): no tokenizer has more ids, and every training loader
# stores them in 32 bits at most.

def _first_bad_id(column: str) -> pl.Expr:
    element = pl.element()
    bad = element.is_null() | (element < 0) | (element >= TOKEN_ID_LIMIT)
    return pl.col(column).list.eval(pl.arg_where(bad).first()).list.first()


def _ids_within_policy(column: pl.Series) -> bool:
    """Is every id of every list in the column an integer in [0, 2**32)? One pass over the
    block's ids (the lists' own buffer, not a query per list); a null list is fine here."""
    values = column.explode(empty_as_null=False, keep_nulls=False)
    if values.is_empty():
        return True
    if values.null_count():
        return False
    low, high = values.min(), values.max()
    return isinstance(low, int) and isinstance(high, int) and low >= 0 and high < TOKEN_ID_LIMIT


def _apply_id_policy(records: pl.DataFrame) -> tuple[pl.DataFrame, list[RejectedLine]]:
    """Records whose id lists hold a null, a negative id or one >= 2**32 leave the frame as contract problems.

    Vectorised: min, max and null counts per list, and the first offending index only for the
    rows that have one. Also refused: `input_ids` and `prompt_ids` both given and different (a
    loader could take either).
    """
    if records.is_empty():
        return records.drop("_prompt_ids", "_input_ids", strict=False), []
    if records["_prompt_ids"].null_count() == records.height and all(
        _ids_within_policy(records[column]) for column in ("_input_ids", "output_ids")
    ):
        return records.drop("_prompt_ids", "_input_ids"), []  # nearly every block: no query
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
        "id",
        pl.coalesce(
            describe("_input_ids", "input_ids"),
            describe("_prompt_ids", "prompt_ids"),
            describe("output_ids", "output_ids"),
            both,
        ).struct.unnest(),
    )
    refused = [
        RejectedLine(line, reason, CONTRACT, field, position, id=sample_id)
        for line, sample_id, field, position, reason in reasons.select(
            "line", "id", "field", "position", "reason"
        ).iter_rows()
    ]
    return records.filter(~flagged).drop("_prompt_ids", "_input_ids"), refused


def _listed(images: Any) -> Any:
    """`image_data` as a list: one string is a list of one."""
    return [images] if isinstance(images, str) else images

"""Tool calls: markers kept as their special ids, in grammar order, with readable calls inside."""

from __future__ import annotations

import re

import numpy as np
import orjson
import polars as pl

from audit.batch import Batch
from audit.checks.base import RecordRule, findings_frame, first_index_in, id_set
from audit.fastcodec import FlatIds
from audit.toolcall_formats import ROLE_LETTERS

_ROLE_OF_LETTER = {letter: role for role, letter in ROLE_LETTERS.items()}


def marker_letters(batch: Batch) -> pl.Expr:
    """Per record, its tool-call markers in order as role letters, e.g. "SCAEs"."""
    markers = batch.profile.tool_markers
    ids = list(markers.values())
    letters = [ROLE_LETTERS[role] for role in markers]
    return (
        pl.col("output_ids")
        .list.eval(pl.element().replace_strict(ids, letters, default=None, return_dtype=pl.String))
        .list.drop_nulls()
        .list.join("")
    )


def _empty_call_head(batch: Batch) -> pl.Expr:
    """A call begin followed at once by another marker: the call's id or name is missing."""
    markers = batch.profile.tool_markers
    others = id_set(list(markers.values()))
    element = pl.element()
    return (
        pl.col("output_ids")
        .list.eval(((element == markers["call_begin"]) & element.shift(-1).is_in(others)).any())
        .list.first()
        .fill_null(False)
    )


def _grammar_ok(batch: Batch) -> pl.Series:
    """Per record: do its tool-call markers follow the family's grammar? (one pass per batch)"""
    return batch.shared(_match_grammar)


def _match_grammar(batch: Batch) -> pl.Series:
    grammar = batch.profile.tool_calls.format.grammar
    matches = marker_letters(batch).str.contains(f"^(?:{grammar})$") & ~_empty_call_head(batch)
    return batch.records.select(matches.alias("grammar_ok")).to_series()


def parsed_calls(batch: Batch) -> pl.DataFrame:
    """One row per tool call of every grammar-valid record, its text decoded and read.

    Columns: `row`, `head_at` / `body_at` (token index where the call's head and body start),
    `name`, `call_id`, `arguments`, `arguments_error` (null when the arguments parse).
    """
    return batch.shared(_parse_calls)


def _parse_calls(batch: Batch) -> pl.DataFrame:
    spec = batch.profile.tool_calls
    markers = batch.profile.tool_markers
    has_arguments = "argument_begin" in markers

    def at(role: str) -> pl.Expr:
        return pl.col("output_ids").list.eval(pl.arg_where(pl.element() == markers[role]))

    positions = {"c": at("call_begin"), "e": at("call_end")}
    if has_arguments:
        positions["a"] = at("argument_begin")
    with_calls = batch.records.with_row_index("row").filter(
        pl.lit(_grammar_ok(batch)) & (pl.col("output_ids").list.count_matches(markers["call_begin"]) > 0)
    )
    # One flat copy of these outputs; each call's head and body are slices of it, so memory
    # follows the output's length, not its length times its number of calls.
    flat = FlatIds.from_series(with_calls["output_ids"])
    calls = with_calls.select(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("sequence"), "row", **positions
    ).explode(list(positions))
    base = flat.offsets[calls["sequence"].to_numpy()]
    call_begin = calls["c"].to_numpy().astype(np.int64)
    call_end = calls["e"].to_numpy().astype(np.int64)
    head_end = calls["a"].to_numpy().astype(np.int64) if has_arguments else call_end
    calls = calls.select("row").with_columns(
        pl.Series("head_at", call_begin + 1, dtype=pl.Int64),
        pl.Series("body_at", head_end + 1, dtype=pl.Int64),
    )
    values = flat.values
    heads_ids = [values[s:t].tolist() for s, t in zip(base + call_begin + 1, base + head_end, strict=True)]
    bodies_ids = (
        [values[s:t].tolist() for s, t in zip(base + head_end + 1, base + call_end, strict=True)]
        if has_arguments
        else [[] for _ in range(calls.height)]
    )
    heads = batch.tokenizer.decode_batch(heads_ids)
    bodies = batch.tokenizer.decode_batch(bodies_ids)
    names, call_ids, arguments, errors = [], [], [], []
    for head, body in zip(heads, bodies, strict=True):
        call = spec.format.read_call(head, body)
        names.append(call.name)
        call_ids.append(call.call_id)
        arguments.append(call.arguments)
        errors.append(_json_error(call.arguments))
    return calls.select("row", "head_at", "body_at").with_columns(
        pl.Series("name", names, dtype=pl.String),
        pl.Series("call_id", call_ids, dtype=pl.String),
        pl.Series("arguments", arguments, dtype=pl.String),
        pl.Series("arguments_error", errors, dtype=pl.String),
    )


def _json_error(text: str) -> str | None:
    try:
        orjson.loads(text.strip())
    except orjson.JSONDecodeError as exc:
        return str(exc)
    return None


class ToolCallRule(RecordRule):
    """A rule over tool calls: it applies when the profile names tool-call markers."""

    def applies(self, batch: Batch) -> bool:
        return batch.profile.tool_calls is not None and bool(batch.profile.tool_markers)


class ToolMarkerGrammar(ToolCallRule):
    """Tool-call markers unbalanced or out of the family's grammar order.

    What it checks:
        The output's tool-call marker ids, read in order, follow the profile's grammar. Kimi:
        section begin, then per call: call begin, call id, argument begin, arguments, call
        end; then section end. Every call closed, every section closed.

    Why it matters:
        A marker dropped or moved means the token stream is not one the model produced: a
        tool-call parser rewrote it, or a post-processing step cut part of it. The drafter
        would learn a grammar the target never speaks.

    Example:
        <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
        <|tool_call_argument_begin|>{"city": "Paris"}<|tool_calls_section_end|>   (no call end)

    Fix:
        Save `output_ids` from `/generate` without a tool-call parser; never rebuild tool
        calls from parsed JSON.
    """

    code = "TCL001"
    name = "tool-marker-grammar"

    def violation(self, batch: Batch) -> pl.Expr:
        return ~pl.lit(_grammar_ok(batch))

    def position(self, batch: Batch) -> pl.Expr:
        return first_index_in("output_ids", list(batch.profile.tool_markers.values()))

    def find(self, batch: Batch) -> pl.DataFrame:
        found = super().find(batch)
        if found.is_empty():
            return found
        flagged = batch.records.select(pl.all().gather(found["row"])).select(
            marker_letters(batch).alias("letters"), _empty_call_head(batch).alias("empty_head")
        )
        expected = batch.profile.tool_calls.format.description
        messages = [
            "a call begins with no id or name before the next marker"
            if empty_head
            else "tool-call markers out of order: "
            + " ".join(_ROLE_OF_LETTER[letter].replace("_", "-") for letter in letters)
            + f"; expected {expected}"
            for letters, empty_head in flagged.iter_rows()
        ]
        return found.with_columns(pl.Series("message", messages, dtype=pl.String))

    def message(self, batch: Batch) -> pl.Expr:
        return pl.lit("")  # replaced in check(), which names the markers


class ToolArgumentsInvalidJson(ToolCallRule):
    """Tool-call arguments that do not parse as JSON.

    What it checks:
        In every well-formed tool call, the text between argument begin and call end is one
        JSON value (fenced JSON for DeepSeek-R1).

    Why it matters:
        The target model writes valid JSON arguments nearly always; broken JSON is the trace
        of truncation inside a call or of a parser that re-serialised the arguments and cut
        them. Training on it teaches the drafter malformed calls.

    Example:
        <|tool_call_argument_begin|>{"city": "Paris"<|tool_call_end|>

    Fix:
        Save raw `output_ids`; check the record's finish reason (a length stop inside a call
        is a truncation to drop, not to repair).
    """

    code = "TCL002"
    name = "tool-arguments-invalid-json"

    def find(self, batch: Batch) -> pl.DataFrame:
        bad = parsed_calls(batch).filter(pl.col("arguments_error").is_not_null())
        first = bad.group_by("row", maintain_order=True).first()
        return findings_frame(
            first["row"].to_list(),
            first["body_at"].to_list(),
            [
                f"arguments of call {name or '?'} are not valid JSON ({error}): {args[:80]!r}"
                for name, error, args in first.select("name", "arguments_error", "arguments").iter_rows()
            ],
        )


class ToolCallIdMalformed(ToolCallRule):
    """A tool-call id (or function name) not of the family's form, e.g. Kimi's `functions.NAME:IDX`.

    What it checks:
        Each call's id matches the profile's `call_id_pattern`; for families without call
        ids, the function name is present.

    Why it matters:
        Kimi's serving stack routes tool results by these ids; an id without its index or
        prefix was rewritten by a parser (`get_weather:0`, `functions.get_weather`) and is
        not what the model emits.

    Example:
        <|tool_call_begin|>get_weather:0<|tool_call_argument_begin|>{...}<|tool_call_end|>

    Fix:
        Save raw `output_ids`; do not re-render tool calls from an OpenAI-style
        `tool_calls` list.
    """

    code = "TCL003"
    name = "tool-call-id-malformed"

    def find(self, batch: Batch) -> pl.DataFrame:
        spec = batch.profile.tool_calls
        calls = parsed_calls(batch)
        if spec.format.has_call_ids and spec.call_id_pattern:
            pattern = re.compile(spec.call_id_pattern)
            bad_mask = [not (cid and pattern.match(cid.strip())) for cid in calls["call_id"].to_list()]
            what = f"does not match {spec.call_id_pattern}"
            shown = calls["call_id"]
        else:
            bad_mask = [not name for name in calls["name"].to_list()]
            what = "has no function name"
            shown = calls["name"]
        bad = calls.with_columns(shown.alias("shown")).filter(pl.Series(bad_mask, dtype=pl.Boolean))
        first = bad.group_by("row", maintain_order=True).first()
        return findings_frame(
            first["row"].to_list(),
            first["head_at"].to_list(),
            [f"tool call id {value!r} {what}" for value in first["shown"].to_list()],
        )


class ToolMarkerAsText(ToolCallRule):
    """A tool-call marker present only as plain text: its string decoded, its special id gone.

    What it checks:
        The decoded output does not contain a marker's string more often than the output
        contains the marker's special id.

    Why it matters:
        This is exactly what a pipeline that decodes with `skip_special_tokens` or through
        a tool-call parser, then re-tokenises, leaves behind: `<|tool_call_begin|>` spelled
        with ordinary BPE pieces. The model never emits that sequence.

    Example:
        output_ids decode to "...<|tool_call_begin|>functions.f:0..." but contain no 163597.

    Fix:
        Generate with `/generate` and save `output_ids`; never re-encode decoded text.
    """

    code = "TCL004"
    name = "tool-marker-as-text"

    def frame(self, batch: Batch) -> pl.DataFrame:
        return batch.records.with_columns(batch.decoded_output.alias("decoded"))

    def _excess(self, batch: Batch) -> list[tuple[str, pl.Expr]]:
        spec = batch.profile.tool_calls
        return [
            (
                spec.markers[role],
                pl.col("decoded").str.count_matches(spec.markers[role], literal=True)
                > pl.col("output_ids").list.count_matches(token_id),
            )
            for role, token_id in batch.profile.tool_markers.items()
        ]

    def violation(self, batch: Batch) -> pl.Expr:
        return pl.any_horizontal([excess for _, excess in self._excess(batch)])

    def message(self, batch: Batch) -> pl.Expr:
        names = [pl.when(excess).then(pl.lit(text)) for text, excess in self._excess(batch)]
        return pl.format(
            "marker as plain text, not its special token: {}",
            pl.concat_list(names).list.drop_nulls().list.join(", "),
        )

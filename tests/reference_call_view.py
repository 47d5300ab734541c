"""The tool-call view as it was computed with polars list expressions, kept as the reference the
numpy implementation (`audit.records.call_view`) is compared with in `tests/test_vectorised.py`.

Written out as it stood before the marker index read the answers' markers: one list query per
step over each record's answer.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl

from audit.model.calls.call_formats import ROLE_LETTERS
from audit.model.tokens.flat_ids import FlatIds
from audit.records.batch import Batch
from audit.records.call_arguments import CALLS_SCHEMA, ReadCall, judge_calls
from audit.records.call_view import STRAY_SCHEMA, ToolCallView, _problem_token
from audit.records.response import response_bounds


def _answer_frame(batch: Batch) -> pl.DataFrame:
    """Per record: the answer's ids (empty when there is none) and where the answer starts."""
    bounds = response_bounds(batch)
    length = pl.col("output_ids").list.len().cast(pl.Int64)
    start = pl.col("answer_start").fill_null(length)
    return pl.concat(
        [batch.records.select("output_ids"), bounds.select("answer_start", "answer_end")], how="horizontal"
    ).select(
        start.alias("answer_from"),
        (pl.col("answer_end").fill_null(length) - start).clip(lower_bound=0).alias("answer_length"),
        pl.col("output_ids").list.slice(start, length - start).alias("answer"),
    )


def reference_view(batch: Batch) -> ToolCallView:
    profile = batch.profile
    fmt = profile.tool_call_spec.format
    markers = profile.tool_markers
    answers = _answer_frame(batch)
    element = pl.element()
    letters = (
        pl.col("answer")
        .list.eval(
            element.replace_strict(
                list(markers.values()), [ROLE_LETTERS[r] for r in markers], default=None, return_dtype=pl.String
            )
        )
        .list.drop_nulls()
        .list.join("")
        .fill_null("")
    )
    # A call with no name before the next marker, in formats that name it there (a MiniMax-M3
    # call names its function in its <invoke> element instead).
    if fmt.name_after_begin and "call_begin" in markers:
        others = pl.lit(pl.Series(list(markers.values()), dtype=pl.Int64)).implode()
        empty_head = (
            pl.col("answer")
            .list.eval(((element == markers["call_begin"]) & element.shift(-1).is_in(others)).any())
            .list.first()
            .fill_null(False)
        )
    else:
        empty_head = pl.lit(False)
    wanted = pl.lit(pl.Series(list(markers.values()), dtype=pl.Int64)).implode()
    first_marker = pl.col("answer_from") + pl.col("answer").list.eval(
        pl.arg_where(element.is_in(wanted)).first()
    ).list.first().cast(pl.Int64)
    judged = answers.select(
        letters.alias("letters"), empty_head.alias("empty_head"), first_marker.alias("first_marker")
    )
    grammar_ok = judged["letters"].str.contains(f"^(?:{fmt.grammar})$") & ~judged["empty_head"]
    prefix_ok = judged["letters"].str.contains(f"^(?:{fmt.cut_grammar})$") & ~judged["empty_head"]
    view = ToolCallView(
        letters=judged["letters"],
        grammar_ok=grammar_ok.alias("grammar_ok"),
        prefix_ok=prefix_ok.alias("prefix_ok"),
        empty_head=judged["empty_head"],
        first_marker=judged["first_marker"],
        calls=pl.DataFrame(schema=CALLS_SCHEMA),
    )
    # A record holding an id the tokenizer lacks has no text to read (INT003 names the id); its
    # markers' order is judged above all the same.
    with_calls = answers.with_row_index("row").filter(grammar_ok & (judged["letters"] != "") & batch.decodable)
    if with_calls.is_empty():
        return view
    read = _read_calls if fmt.unit == "call" else _read_answers
    calls = read(batch, with_calls)
    return replace(view, calls=judge_calls(batch, calls), stray=_stray_text(batch, with_calls))


def _stray_text(batch: Batch, frame: pl.DataFrame) -> pl.DataFrame:
    """Text between consecutive markers whose roles the format keeps apart by whitespace only
    (`ToolCallFormat.blank_between`): decoded in one batch, the gaps that hold more."""
    fmt = batch.profile.tool_call_spec.format
    if not fmt.blank_between:
        return pl.DataFrame(schema=STRAY_SCHEMA)
    markers = batch.profile.tool_markers
    wanted = pl.lit(pl.Series(list(markers.values()), dtype=pl.Int64)).implode()
    letter = pl.col("at_id").replace_strict(
        list(markers.values()), [ROLE_LETTERS[r] for r in markers], return_dtype=pl.String
    )
    positions = (
        frame.with_columns(
            pl.col("answer").list.eval(pl.arg_where(pl.element().is_in(wanted))).alias("at"),
            pl.int_range(pl.len(), dtype=pl.Int64).alias("sequence"),
        )
        .with_columns(pl.col("answer").list.gather(pl.col("at")).alias("at_id"))
        .select("row", "sequence", "answer_from", "at", "at_id")
        .explode("at", "at_id")
        .with_columns(letter.alias("role"))
    )
    gaps = positions.with_columns(
        pl.col("at").shift(-1).over("sequence").alias("next"),
        (pl.col("role") + pl.col("role").shift(-1).over("sequence")).alias("pair"),
    ).filter(pl.col("pair").is_in(list(fmt.blank_between)) & (pl.col("next") - pl.col("at") > 1))
    if gaps.is_empty():
        return pl.DataFrame(schema=STRAY_SCHEMA)
    flat = FlatIds.from_series(frame["answer"])
    base = flat.offsets[gaps["sequence"].to_numpy()]
    texts = batch.tokenizer.decode_flat(
        FlatIds.slices(flat.values, base + gaps["at"].to_numpy() + 1, base + gaps["next"].to_numpy())
    )
    found = gaps.select(
        pl.col("row").cast(pl.UInt32),
        (pl.col("answer_from") + pl.col("at") + 1).cast(pl.Int64).alias("position"),
    ).with_columns(pl.Series("text", texts, dtype=pl.String))
    return found.filter(pl.col("text").str.strip_chars() != "").group_by("row", maintain_order=True).first()


def _read_calls(batch: Batch, frame: pl.DataFrame) -> list[ReadCall]:
    """Formats whose calls sit between call begin and call end ids: slice, decode, read."""
    markers = batch.profile.tool_markers
    fmt = batch.profile.tool_call_spec.format
    has_arguments = "argument_begin" in markers

    def at(role: str) -> pl.Expr:
        return pl.col("answer").list.eval(pl.arg_where(pl.element() == markers[role]))

    positions = {"c": at("call_begin"), "e": at("call_end")}
    if has_arguments:
        positions["a"] = at("argument_begin")
    frame = frame.filter(pl.col("answer").list.count_matches(markers["call_begin"]) > 0)
    # One flat copy of these answers; heads and bodies are slices of it, so memory follows the
    # answers' length, not the outputs' (reasoning is never copied).
    flat = FlatIds.from_series(frame["answer"])
    calls = frame.select(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("sequence"), "row", "answer_from", **positions
    ).explode(list(positions))
    base = flat.offsets[calls["sequence"].to_numpy()]
    call_begin = calls["c"].to_numpy().astype(np.int64)
    call_end = calls["e"].to_numpy().astype(np.int64)
    head_end = calls["a"].to_numpy().astype(np.int64) if has_arguments else call_end
    heads = batch.tokenizer.decode_flat(FlatIds.slices(flat.values, base + call_begin + 1, base + head_end))
    bodies = (
        batch.tokenizer.decode_flat(FlatIds.slices(flat.values, base + head_end + 1, base + call_end))
        if has_arguments
        else [""] * calls.height
    )
    offset = calls["answer_from"].to_numpy().astype(np.int64)
    read: list[ReadCall] = []
    rows = calls["row"].to_list()
    for i, (head, body) in enumerate(zip(heads, bodies, strict=True)):
        start = int(offset[i] + call_begin[i])
        spans = (rows[i], start, int(offset[i] + call_end[i] + 1), start + 1, int(offset[i] + head_end[i] + 1))
        for call in fmt.read(head, body):
            problem_token = None
            if call.problem_at is not None:
                first = base[i] + call_begin[i] + 1
                pieces = [(head, flat.values[first : base[i] + head_end[i]], start + 1)]
                if has_arguments:
                    pieces.append((body, flat.values[base[i] + head_end[i] + 1 : base[i] + call_end[i]], spans[4]))
                problem_token = _problem_token(batch, call, pieces)
            read.append(ReadCall(*spans, call, problem_token))
    return read


def _read_answers(batch: Batch, frame: pl.DataFrame) -> list[ReadCall]:
    """Formats whose calls are delimited by text (DSML): decode each answer with markers, read it."""
    fmt = batch.profile.tool_call_spec.format
    wanted = pl.lit(pl.Series(list(batch.profile.tool_markers.values()), dtype=pl.Int64)).implode()
    first = frame.select(
        pl.col("answer").list.eval(pl.arg_where(pl.element().is_in(wanted)).first()).list.first()
    ).to_series()
    # The answer without its trailing stop token(s): the end of turn is not the calls' text.
    answers = frame.select(pl.col("answer").list.head(pl.col("answer_length"))).to_series()
    flat = FlatIds.from_series(answers)
    texts = batch.tokenizer.decode_flat(flat)
    read: list[ReadCall] = []
    lengths = frame["answer_length"].to_list()
    for i, (row, answer_from, at, length, text) in enumerate(zip(
        frame["row"].to_list(), frame["answer_from"].to_list(), first.to_list(), lengths, texts, strict=True
    )):
        start = answer_from + at
        ids = flat.values[flat.offsets[i] : flat.offsets[i + 1]]
        for call in fmt.read(text, ""):
            problem = _problem_token(batch, call, [(text, ids, answer_from)])
            read.append(ReadCall(row, start, answer_from + length, start, start, call, problem))
    return read

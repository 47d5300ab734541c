"""Where each output's reasoning ends and its answer begins, for a whole batch at once.

The response token (`</think>`) splits an output of a thinking family in two. Where the
reasoning starts depends on the record's prompt: its ending, one the profile accepts, leaves
the output in a reasoning state (`prompt_reasoning`): the prompt opened `<think>`, the model
opens it, it may, or there is no reasoning at all (thinking off, or a family whose turn after a
tool result has none: an agentic continuation). Where the reasoning ends depends on the
output: at the first `</think>`, or, for families whose profile says a tool call may end the
reasoning (`may_end_reasoning`: Kimi, Qwen3.5/3.6), at a tool call
entered with no `</think>` before it, as SGLang's reasoning parsers split it. Everything after
is the answer, up to the trailing stop token(s).

`response_bounds(batch)` computes these bounds once per batch from the batch's marker index
(`audit.model.flat_ids`: one look-up over the flat output ids, no per-token Python); the tool-call
grammar, the segmentation and degenerate-output rules, the record statistics, `audit inspect`
and the HTML samples all read them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from audit.model.flat_ids import ABSENT, MarkerIndex, absent_as_null
from audit.model.profiles import ResolvedProfile
from audit.model.prompt_endings import REASONING_STATES
from audit.records.batch import Batch
from audit.records.expressions import ends_with

REASONING = pl.Enum(REASONING_STATES)

# One row per record, in batch order. Indexes are into `output_ids`; ends are exclusive.
BOUNDS_SCHEMA: dict[str, pl.DataType] = {
    "reasoning": REASONING,  # the state the prompt's ending leaves the output in
    "reasoning_start": pl.Int64(),  # null: no reasoning segment (thinking off, harmony, never opened)
    "reasoning_end": pl.Int64(),
    "response_at": pl.Int64(),  # the first response token (</think>), or null
    "tool_entry": pl.Int64(),  # the first id that opens a tool call (section or call begin), or null
    "answer_start": pl.Int64(),  # null: the reasoning never ended, there is no answer
    "answer_end": pl.Int64(),  # before the trailing stop token(s)
}


def tool_entry_ids(profile: ResolvedProfile) -> list[int]:
    """Ids that open a tool call: the section begin where the family has one, else call begin."""
    markers = profile.tool_markers
    return [markers[role] for role in ("section_begin", "call_begin") if role in markers][:1]


def prompt_reasoning(profile: ResolvedProfile) -> pl.Expr:
    """Per record, the reasoning state its prompt leaves the output in (`REASONING`): that of
    the longest accepted ending `input_ids` end with, else the generation prompt's."""
    default = pl.lit(profile.reasoning, dtype=REASONING)
    states = profile.suffix_reasoning
    if len(set(states)) <= 1:
        return default
    expression: Any = None  # polars' when/then chain, grown one ending at a time
    endings = sorted(zip(profile.prompt_suffixes, states, strict=True), key=lambda p: -len(p[0]))
    for suffix, state in endings:
        matched = ends_with("input_ids", suffix)
        value = pl.lit(state, dtype=REASONING)
        chain = pl.when(matched) if expression is None else expression.when(matched)
        expression = chain.then(value)
    return expression.otherwise(default)


def answer_text(profile: ResolvedProfile) -> pl.Expr:
    """The decoded answer of each record, over a frame of the records' `decoded` output
    (special tokens kept) beside their bounds: after the response token's text, from the
    entry of a call that ended the reasoning, the whole output when there is no reasoning;
    empty when the reasoning never ended."""
    decoded = pl.col("decoded")
    think_end = profile.profile.think_end
    after_response = decoded.str.split(think_end).list.last() if think_end else decoded
    spec = profile.tool_calls
    entry = next(iter(spec.markers.values()), None) if spec is not None else None
    from_entry = (
        decoded.str.slice(decoded.str.find(entry, literal=True).fill_null(0)) if entry else decoded
    )
    return (
        pl.when(pl.col("reasoning_start").is_null())
        .then(decoded)
        .when(pl.col("response_at").is_not_null())
        .then(after_response)
        .when(pl.col("answer_start").is_not_null())
        .then(from_entry)
        .otherwise(pl.lit(""))
        .fill_null("")
    )


def response_bounds(batch: Batch) -> pl.DataFrame:
    """Reasoning and answer bounds of every record of the batch (`BOUNDS_SCHEMA`), computed once."""
    return batch.shared(_bounds)


def _first(markers: MarkerIndex, token_ids: Sequence[int | None]) -> np.ndarray:
    wanted = [i for i in token_ids if i is not None]
    return markers.first(wanted) if wanted else np.full(markers.sequences, ABSENT, dtype=np.int64)


def stop_run(batch: Batch) -> np.ndarray:
    """Per record: how many stop tokens end its output (usually one; 0 for none or no output)."""
    return batch.markers.trailing_run(batch.profile.stop_ids)


def _bounds(batch: Batch) -> pl.DataFrame:
    profile = batch.profile
    markers = batch.markers
    null = pl.lit(None, dtype=pl.Int64)
    # The scans over every id come from the batch's marker index (one look-up over the flat
    # ids); what follows is arithmetic on a few numbers per record.
    lengths = pl.Series("length", batch.output_flat.lengths, dtype=pl.Int64)
    scanned = pl.DataFrame(
        [
            lengths.set(pl.Series(~batch.output_present), None),
            pl.Series("trailing", stop_run(batch), dtype=pl.Int64),
            absent_as_null(_first(markers, [profile.think_end]), "close"),
            absent_as_null(_first(markers, tool_entry_ids(profile)), "entry"),
            absent_as_null(_first(markers, [profile.think_start]), "opened"),
        ]
    ).with_columns(
        batch.records.select(
            prompt_reasoning(profile).alias("reasoning"),
            pl.col("output_ids").list.first().cast(pl.Int64).alias("first_id"),
        )
    )
    end = pl.col("length") - pl.col("trailing")
    close = pl.col("close")
    entry = pl.col("entry")

    state = pl.col("reasoning")
    if profile.think_start is not None:
        opened = pl.col("opened")
        # A `<think>` lost but its `</think>` kept: the reasoning still ran from the start.
        model_start = (
            pl.when(opened.is_not_null())
            .then(opened + 1)
            .when(close.is_not_null())
            .then(0)
            .otherwise(null)
        )
        own_think = pl.col("first_id") == profile.think_start
        start = (
            pl.when(state == "prompt_opens")
            .then(pl.lit(0, dtype=pl.Int64))
            .when(state == "model_opens")
            .then(model_start)
            .when(state == "may_open")
            .then(pl.when(own_think.fill_null(False)).then(1).otherwise(0).cast(pl.Int64))
            .otherwise(null)
        )
    else:  # a family without think tokens: everything is answer
        start = null

    spec = profile.tool_calls
    call_ends_reasoning = spec is not None and spec.may_end_reasoning
    closed_by_call = (close.is_null() & entry.is_not_null()) if call_ends_reasoning else pl.lit(False)
    reasoning_end = (
        pl.when(start.is_null())
        .then(null)
        .when(close.is_not_null())
        .then(close)
        .when(closed_by_call)
        .then(entry)
        .otherwise(end)
    )
    answer_start = (
        pl.when(start.is_null())
        .then(pl.lit(0, dtype=pl.Int64))
        .when(close.is_not_null())
        .then(close + 1)
        .when(closed_by_call)
        .then(entry)
        .otherwise(null)
    )
    return scanned.select(
        "reasoning",
        start.alias("reasoning_start"),
        reasoning_end.alias("reasoning_end"),
        close.alias("response_at"),
        entry.alias("tool_entry"),
        answer_start.alias("answer_start"),
        pl.max_horizontal(end, answer_start).alias("answer_end"),
    ).cast(pl.Schema(BOUNDS_SCHEMA))

"""Where each output's reasoning ends and its answer begins, for a whole batch at once.

The response token (`</think>`) splits an output of a thinking family in two. Where the
reasoning starts depends on the profile (the prompt opened `<think>`, or the model opens it);
where it ends, on the output: at the first `</think>`, or, for families whose profile says a
tool call may end the reasoning (`may_end_reasoning`: Kimi, Qwen3.5/3.6), at a tool call
entered with no `</think>` before it, as SGLang's reasoning parsers split it. Everything after
is the answer, up to the trailing stop token(s).

`response_bounds(batch)` computes these bounds once per batch with polars list expressions (no
per-token Python); the tool-call grammar, the segmentation and degenerate-output rules, the
record statistics, `audit inspect` and the HTML samples all read them.
"""

from __future__ import annotations

import polars as pl

from audit.batch import Batch
from audit.profiles import ResolvedProfile

# One row per record, in batch order. Indexes are into `output_ids`; ends are exclusive.
BOUNDS_SCHEMA: dict[str, pl.DataType] = {
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


def response_bounds(batch: Batch) -> pl.DataFrame:
    """Reasoning and answer bounds of every record of the batch (`BOUNDS_SCHEMA`), computed once."""
    return batch.shared(_bounds)


def _first(token_ids: list[int]) -> pl.Expr:
    if not token_ids:
        return pl.lit(None, dtype=pl.Int64)
    wanted = pl.lit(pl.Series(token_ids, dtype=pl.Int64)).implode()
    return (
        pl.col("output_ids")
        .list.eval(pl.arg_where(pl.element().is_in(wanted)).first())
        .list.first()
        .cast(pl.Int64)
    )


def trailing_stops(stop_ids: tuple[int, ...]) -> pl.Expr:
    """How many stop tokens end each output (usually one)."""
    stops = pl.lit(pl.Series(list(stop_ids), dtype=pl.Int64)).implode()
    return (
        pl.col("output_ids")
        .list.reverse()
        .list.eval(pl.element().is_in(stops).cum_min())
        .list.sum()
        .fill_null(0)
        .cast(pl.Int64)
    )


def _bounds(batch: Batch) -> pl.DataFrame:
    profile = batch.profile
    length = pl.col("output_ids").list.len().cast(pl.Int64)
    end = length - trailing_stops(profile.stop_ids)
    close = _first([profile.think_end] if profile.think_end is not None else [])
    entry = _first(tool_entry_ids(profile))
    null = pl.lit(None, dtype=pl.Int64)

    if profile.reasoning == "prompt_opens":
        start = pl.lit(0, dtype=pl.Int64)
    elif profile.reasoning == "model_opens":
        opened = _first([profile.think_start])
        # A `<think>` lost but its `</think>` kept: the reasoning still ran from the start.
        start = pl.when(opened.is_not_null()).then(opened + 1).when(close.is_not_null()).then(0).otherwise(null)
    else:  # thinking off, or a family without think tokens: everything is answer
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
    return batch.records.select(
        start.alias("reasoning_start"),
        reasoning_end.alias("reasoning_end"),
        close.alias("response_at"),
        entry.alias("tool_entry"),
        answer_start.alias("answer_start"),
        pl.max_horizontal(end, answer_start).alias("answer_end"),
    ).cast(BOUNDS_SCHEMA)

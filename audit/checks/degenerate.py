"""Degenerate outputs: loops to the length limit, and reasoning or answers with nothing in them."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import polars as pl

from audit.checks.base import MAX_TOKEN_COUNT, Parameter, RecordRule, empty_findings, findings_frame
from audit.model.tokens.flat_ids import is_in_few
from audit.records.batch import Batch
from audit.records.channels import harmony_messages
from audit.records.expressions import truncated
from audit.records.response import response_bounds
from audit.records.segments import nonblank_counts

# Segments this many tokens longer than the minimum are long enough without looking inside:
# only shorter ones are checked for whitespace-only tokens (a small decode).
_WHITESPACE_SLACK = 16


class RepetitionLoop(RecordRule):
    """The output ends in a loop: the same n-gram repeated over its last tokens.

    What it checks:
        The last `loop_min_tokens` ids of the output (its final stop token set aside) repeat
        with a period of at most `loop_max_period` tokens: `ids[i] == ids[i - period]`
        throughout. Vectorised over the flat output ids, a few comparisons per period.

    Why it matters:
        A model stuck in a loop repeats a phrase until `max_new_tokens` cuts it. Those tokens
        are real model output but teach the drafter to predict the loop, and the record has
        no real answer. Seen in every large regeneration run at a small rate.

    Example:
        ... so the answer is 4. Wait, so the answer is 4. Wait, so the answer is 4. Wait, ...

    Fix:
        Drop such records (and consider a repetition penalty or a lower temperature for the
        prompts that loop). Tune `loop_max_period` / `loop_min_tokens` under `[rules.DEG001]`.
    """

    code = "DEG001"
    name = "repetition-loop"
    parameters: ClassVar[dict[str, Parameter]] = {
        # One vectorised comparison per period: the upper bound keeps a rule set from asking for
        # millions of them.
        "loop_max_period": Parameter(32, 1, 1024, "longest n-gram looked for, in tokens"),
        "loop_min_tokens": Parameter(
            64, 1, MAX_TOKEN_COUNT, "how many final tokens must repeat to call it a loop"
        ),
    }

    def find(self, batch: Batch) -> pl.DataFrame:
        span = self.options["loop_min_tokens"]
        periods = loop_periods(batch, span, self.options["loop_max_period"])
        rows = np.flatnonzero(periods)
        if not len(rows):
            return empty_findings()
        lengths = batch.output_flat.lengths
        finish = batch.records["finish_type"].gather(rows).to_list()
        return findings_frame(
            rows.tolist(),
            (lengths[rows] - span).tolist(),
            [
                f"output ends in a loop: a {period}-token n-gram repeated over its last {span} tokens "
                f"(finish {kind if kind is not None else 'not saved'})"
                for period, kind in zip(periods[rows].tolist(), finish, strict=True)
            ],
        )


# Tokens compared first, for every record, before a whole tail is (only loops get that far).
_LOOP_PROBE = 8


def loop_periods(batch: Batch, span: int, max_period: int) -> np.ndarray:
    """Per record: the shortest period (1..max_period) with which the last `span` ids of its
    output repeat, its final stop token set aside; 0 when there is none.

    Over the flat output ids (numpy): for each period, `ids[i] == ids[i - period]` over each
    tail, first for its last few ids (which rules out nearly every record at once), then over
    the whole tail for the records still in the running.
    """
    flat = batch.output_flat
    lengths = flat.lengths
    ends = flat.offsets[1:]
    last = flat.values[np.maximum(ends - 1, 0)] if len(flat.values) else np.zeros(len(lengths), np.int64)
    ends_with_stop = (lengths > 0) & is_in_few(last, batch.profile.stop_ids)
    usable = lengths - ends_with_stop
    end = flat.offsets[:-1] + usable  # one past the last id of each usable tail, in the flat array
    periods = np.zeros(len(lengths), dtype=np.int64)
    probe = np.arange(1, min(span, _LOOP_PROBE) + 1)
    for period in range(1, max_period + 1):
        rows = np.flatnonzero((usable >= span + period) & (periods == 0))
        if not len(rows):
            if not (usable >= span + period).any():
                break  # longer periods need longer outputs still
            continue
        at = end[rows, None] - probe  # the probe's positions, per record
        rows = rows[(flat.values[at] == flat.values[at - period]).all(axis=1)]
        if len(rows):
            at = (end[rows, None] - span + np.arange(span)).ravel()  # whole tails, record by record
            mismatched = np.add.reduceat(flat.values[at] != flat.values[at - period], np.arange(len(rows)) * span)
            periods[rows[mismatched == 0]] = period
    return periods


class SegmentTooShort(RecordRule):
    """A finished output whose reasoning or answer is empty (or shorter than the set minimum).

    What it checks:
        In outputs that finished (not cut by length or abort), the reasoning segment holds at
        least `min_reasoning_tokens` tokens and the answer at least `min_answer_tokens`,
        whitespace-only tokens not counted. Reasoning: between the opening `<think>` (or the
        output start, when the prompt opened it) and `</think>`; for harmony families the
        `analysis` messages. Answer: after `</think>` up to the end-of-turn token, tool calls
        included; for harmony, the `final` message or a tool call. Thinking off: the answer only.

    Why it matters:
        A thinking model with thinking on always reasons, and a finished turn always answers
        or calls a tool. `<think></think>` followed by an answer, or reasoning followed by
        nothing, is the trace of a template that closed the thinking for the model, a parser
        that moved the content elsewhere, or an empty generation written anyway.

    Example:
        output: </think>\\n\\nThe answer is 4.<|im_end|>        (reasoning empty)
        output: Let me compute 2+2 ... </think><|im_end|>      (answer empty)

    Fix:
        Check the thinking mode of the run and that outputs are saved before any parser;
        raise the minimums under `[rules.DEG002]` to drop implausibly short samples.
    """

    code = "DEG002"
    name = "segment-too-short"
    parameters: ClassVar[dict[str, Parameter]] = {
        "min_reasoning_tokens": Parameter(
            1, 0, MAX_TOKEN_COUNT, "fewest non-blank reasoning tokens; 0 accepts an empty one"
        ),
        "min_answer_tokens": Parameter(
            1, 0, MAX_TOKEN_COUNT, "fewest non-blank answer tokens; 0 accepts an empty one"
        ),
    }

    def find(self, batch: Batch) -> pl.DataFrame:
        if batch.profile.reasoning == "none":
            return self._harmony(batch)
        output = pl.col("output_ids")
        # A segment whose bounds are missing (no </think>) is left to the segmentation rules:
        # only records whose answer was reached are judged.
        bounds = response_bounds(batch)
        segments = {
            "reasoning": (pl.col("reasoning_start"), pl.col("reasoning_end")),
            "answer": (pl.col("answer_start"), pl.col("answer_end")),
        }
        reached = pl.col("answer_start").is_not_null()
        # The records judged, as a mask: a filtered frame would copy every output's ids (a
        # block's worth of memory) to keep the few that may be short.
        frame = (
            pl.concat([batch.records.select("output_ids", "finish_type"), bounds], how="horizontal")
            .with_row_index("row")
        )
        judged = _finished() & reached
        minimum = self._minimum()
        limits = {name: minimum[name] + _WHITESPACE_SLACK for name in segments}
        # Only segments that may be short are cut out of the output (not every output copied):
        # by their bounds, or whose end is open or past the output's.
        may_be_short = {
            name: judged
            & begin.is_not_null()
            & (stop_at.is_null() | (stop_at - begin < limits[name]) | (stop_at > output.list.len()))
            for name, (begin, stop_at) in segments.items()
        }
        candidates = frame.select(short.any().alias(name) for name, short in may_be_short.items()).row(0, named=True)
        rows: dict[int, str] = {}
        for name, (begin, stop_at) in segments.items():
            if not candidates[name]:
                continue  # (nearly always: one query for both segments, nothing cut out)
            limit, maybe_short = limits[name], may_be_short[name]
            short = (
                frame.filter(maybe_short)
                .select("row", output.list.slice(begin, (stop_at - begin).clip(lower_bound=0)).alias(name))
                .filter(pl.col(name).is_not_null() & (pl.col(name).list.len() < limit))
            )
            if short.is_empty():
                continue
            counts = nonblank_counts(batch, short[name].to_list())
            for row, count in zip(short["row"].to_list(), counts, strict=True):
                if count < minimum[name] and row not in rows:
                    rows[row] = _describe(name, count, minimum[name])
        return findings_frame(list(rows), [None] * len(rows), list(rows.values()))

    def _harmony(self, batch: Batch) -> pl.DataFrame:
        spec = batch.profile.channels
        if spec is None:
            return empty_findings()
        messages = harmony_messages(batch)
        finished_rows = batch.records.with_row_index("row").filter(_finished())["row"]
        messages = messages.filter(pl.col("row").is_in(finished_rows.implode()))
        if messages.is_empty():
            return empty_findings()
        per_row = messages.group_by("row", maintain_order=True).agg(
            pl.col("content_tokens").filter(pl.col("channel") == spec.reasoning).sum().alias("reasoning"),
            pl.col("content_tokens").filter(
                (pl.col("channel") == spec.answer) | (pl.col("terminator") == "call")
            ).sum().alias("answer"),
        )
        minimum = self._minimum()
        rows, messages_out = [], []
        for row, reasoning, answer in per_row.iter_rows():
            for name, count in (("reasoning", reasoning), ("answer", answer)):
                if count < minimum[name]:
                    rows.append(row)
                    messages_out.append(_describe(name, count, minimum[name]))
                    break
        return findings_frame(rows, [None] * len(rows), messages_out)

    def _minimum(self) -> dict[str, int]:
        """The fewest non-blank tokens each segment must hold."""
        return {"reasoning": self.options["min_reasoning_tokens"], "answer": self.options["min_answer_tokens"]}


def _finished() -> pl.Expr:
    """The output was not cut (length, abort) and is not empty: a turn the model ended."""
    return (pl.col("output_ids").list.len() > 0) & ~truncated()


def _describe(name: str, count: int, minimum: int) -> str:
    if count == 0:
        return f"{name} segment is empty in a finished output"
    return f"{name} segment has {count} non-blank tokens, fewer than the minimum {minimum}"

"""Degenerate outputs: loops to the length limit, and reasoning or answers with nothing in them."""

from __future__ import annotations

from typing import ClassVar

import polars as pl

from audit.batch import Batch
from audit.channels import harmony_messages
from audit.checks.base import MAX_TOKEN_COUNT, Parameter, RecordRule, empty_findings, findings_frame
from audit.expressions import id_set, truncated
from audit.response import response_bounds

# Segments this many tokens longer than the minimum are long enough without looking inside:
# only shorter ones are checked for whitespace-only tokens (a small decode).
_WHITESPACE_SLACK = 16


class RepetitionLoop(RecordRule):
    """The output ends in a loop: the same n-gram repeated over its last tokens.

    What it checks:
        The last `loop_min_tokens` ids of the output (its final stop token set aside) repeat
        with a period of at most `loop_max_period` tokens: `ids[i] == ids[i - period]`
        throughout. One vectorised comparison per period over the output tails.

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

    def _loop_period(self, batch: Batch) -> pl.Expr:
        span = self.options["loop_min_tokens"]
        output = pl.col("output_ids")
        ends_with_stop = output.list.last().is_in(id_set(batch.profile.stop_ids)).fill_null(False)
        usable = output.list.len() - ends_with_stop.cast(pl.Int64)
        periods = []
        for period in range(1, self.options["loop_max_period"] + 1):
            window = output.list.slice(usable - span - period, span + period)
            periodic = (window.list.head(span) == window.list.tail(span)) & (usable >= span + period)
            periods.append(pl.when(periodic).then(pl.lit(period)))
        return pl.coalesce(periods)

    def violation(self, batch: Batch) -> pl.Expr:
        return self._loop_period(batch).is_not_null()

    def position(self, batch: Batch) -> pl.Expr:
        return pl.col("output_ids").list.len() - self.options["loop_min_tokens"]

    def message(self, batch: Batch) -> pl.Expr:
        return pl.format(
            "output ends in a loop: a {}-token n-gram repeated over its last {} tokens (finish {})",
            self._loop_period(batch),
            pl.lit(self.options["loop_min_tokens"]),
            pl.coalesce(pl.col("finish_type"), pl.lit("not saved")),
        )


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
        frame = (
            pl.concat([batch.records.select("output_ids", "finish_type"), bounds], how="horizontal")
            .with_row_index("row")
            .filter(_finished() & reached)
            .select(
                "row",
                *[
                    output.list.slice(begin, (stop_at - begin).clip(lower_bound=0)).alias(name)
                    for name, (begin, stop_at) in segments.items()
                ],
            )
        )
        minimum = self._minimum()
        rows: dict[int, str] = {}
        for name in segments:
            short = frame.filter(
                pl.col(name).is_not_null() & (pl.col(name).list.len() < minimum[name] + _WHITESPACE_SLACK)
            ).select("row", name)
            if short.is_empty():
                continue
            counts = _content_counts(batch, short[name])
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


def _content_counts(batch: Batch, segments: pl.Series) -> list[int]:
    """Per segment, how many of its tokens are not whitespace only (one small batched decode)."""
    sequences = segments.to_list()  # only short segments come here (see _WHITESPACE_SLACK)
    known = batch.tokenizer.known_ids
    ids = sorted({i for segment in sequences for i in segment if i in known})
    pieces = batch.tokenizer.token_strings(ids)
    blank = {i for i, piece in zip(ids, pieces, strict=True) if not piece.strip()}
    return [sum(1 for i in segment if i not in blank) for segment in sequences]


def _describe(name: str, count: int, minimum: int) -> str:
    if count == 0:
        return f"{name} segment is empty in a finished output"
    return f"{name} segment has {count} non-blank tokens, fewer than the minimum {minimum}"

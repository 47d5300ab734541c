"""Segmentation: the response token `</think>` splits reasoning from the answer, exactly once."""

from __future__ import annotations

import polars as pl

from audit.checks.base import RecordRule, Severity, empty_findings, findings_frame
from audit.model.families.prompt_endings import THINKING_STATES
from audit.model.tokens.flat_ids import view_of
from audit.records.batch import Batch
from audit.records.expressions import first_index_in, first_index_of, nth_index_of, truncated
from audit.records.response import record_modes, response_bounds, tool_entry_ids


def _thinking(batch: Batch) -> bool:
    """Can records of this run hold reasoning? (Each record's own state is in its bounds.)"""
    return batch.profile.thinks


def _reasons() -> pl.Expr:
    """The record's prompt leaves its output reasoning to close (its bounds' `reasoning`)."""
    return pl.col("reasoning").cast(pl.String).is_in(list(THINKING_STATES))


def _with_bounds(batch: Batch) -> pl.DataFrame:
    """The records with their reasoning/answer bounds (`audit.records.response`) beside them."""
    return batch.with_marker_ids(pl.concat([batch.records, response_bounds(batch)], how="horizontal"))


def _call_ends_reasoning(batch: Batch) -> bool:
    spec = batch.profile.tool_calls
    return spec is not None and spec.may_end_reasoning and bool(tool_entry_ids(batch.profile))


class ResponseTokenMissing(RecordRule):
    """A finished output with no `</think>`: reasoning and answer cannot be told apart.

    What it checks:
        When the prompt (or the model) opened `<think>`, the output contains the response
        token `</think>`; each record as its own prompt leaves it (an agentic continuation
        after a tool result may leave no reasoning: DeepSeek-V3.1). Truncated and aborted
        outputs are left to the termination rules; for families whose profile says a tool
        call may end the reasoning (Kimi, `may_end_reasoning`), a tool-call section entered
        without `</think>` to SEG004.

    Why it matters:
        Without it everything lands in the reasoning segment and the training sequence no
        longer matches what the model emits: a reasoning parser or `skip_special_tokens`
        stripped the token the model really produced.

    Example:
        ... so the answer is 4.The answer is **4**.<|im_end|>     (no </think>)

    Fix:
        Generate with SGLang's native `/generate` and no `--reasoning-parser`; save
        `output_ids`, never text re-tokenised after `skip_special_tokens=True`.
    """

    code = "SEG001"
    name = "response-token-missing"

    def applies(self, batch: Batch) -> bool:
        return _thinking(batch)

    def frame(self, batch: Batch) -> pl.DataFrame:
        return _with_bounds(batch)

    def violation(self, batch: Batch) -> pl.Expr:
        output = pl.col("output_ids")
        missing = pl.col("response_at").is_null()
        # Only families known to enter a tool call straight from reasoning (Kimi, Qwen3.5/3.6)
        # are excused: elsewhere a tool call with no </think> before it means the token was stripped.
        in_tool_call = pl.col("tool_entry").is_not_null() if _call_ends_reasoning(batch) else pl.lit(False)
        finished = (output.list.len() > 0) & ~truncated()
        return _reasons() & missing & finished & ~in_tool_call

    def message(self, batch: Batch) -> pl.Expr:
        end = batch.profile.profile.think_end
        return pl.lit(f"no {end!r} in a finished output: reasoning and answer cannot be separated")


class ResponseTokenRepeated(RecordRule):
    """More than one `</think>` in one output.

    What it checks:
        The response token appears at most once in `output_ids`.

    Why it matters:
        A model closes its reasoning once per turn. A second `</think>` means outputs were
        concatenated, a template rendered an assistant turn into the output, or text was
        re-tokenised after a parser moved pieces around.

    Example:
        ... reasoning </think> answer </think> more answer <|im_end|>

    Fix:
        Save each `/generate` response as its own record, `output_ids` untouched.
    """

    code = "SEG002"
    name = "response-token-repeated"

    def applies(self, batch: Batch) -> bool:
        return _thinking(batch)

    def frame(self, batch: Batch) -> pl.DataFrame:
        return batch.with_marker_ids(batch.records)

    def violation(self, batch: Batch) -> pl.Expr:
        return pl.col(batch.marker_column).list.count_matches(batch.profile.think_ids[1]) > 1

    def position(self, batch: Batch) -> pl.Expr:
        return nth_index_of(batch.marker_column, batch.profile.think_ids[1], 1)

    def message(self, batch: Batch) -> pl.Expr:
        end = batch.profile.profile.think_end
        count = pl.col(batch.marker_column).list.count_matches(batch.profile.think_end)
        return pl.format("{} appears {} times; expected once", pl.lit(repr(end)), count)


class ThinkTokenInOutput(RecordRule):
    """A `<think>` in the output where none belongs.

    What it checks:
        As each record's prompt leaves it: when the prompt already opened `<think>`, the
        output has none; when the model opens it itself, only once and only at the start;
        when the output is reasoning from its start (DeepSeek-R1 after tool results), at most
        one, as its first token; when thinking is off, or the prompt is a continuation after
        a tool result the family answers without thinking (DeepSeek-V3.1), the output has
        neither `<think>` nor `</think>`.

    Why it matters:
        A `<think>` the model did not emit at that place means the prompt and output were
        stitched from different templates (a chat-completions parser re-inserting the
        reasoning markers, or `<think>` counted twice), so the sequence is not what the model
        would produce.

    Example:
        prompt: ...<|im_middle|><think>   output: <think>Let me see...</think>...

    Fix:
        Keep the generation prompt's `<think>` in `input_ids` only; save `output_ids` exactly
        as the server returned them.
    """

    code = "SEG003"
    name = "think-token-in-output"

    def applies(self, batch: Batch) -> bool:
        return batch.profile.reasoning != "none"

    def frame(self, batch: Batch) -> pl.DataFrame:
        return _with_bounds(batch)

    def _stray(self, batch: Batch) -> tuple[pl.Expr, pl.Expr, pl.Expr]:
        """Per record, as its prompt left it: is a think token out of place, where, and why."""
        profile = batch.profile
        start, end = profile.think_ids
        column = batch.marker_column
        output = pl.col(column)
        state = pl.col("reasoning")
        think = repr(profile.profile.think_start)
        opens = output.list.count_matches(start)
        own_first = (output.list.first() == start).fill_null(False)
        first, second = first_index_of(column, start), nth_index_of(column, start, 1)
        cases = [
            # the prompt opened it: none in the output
            ("prompt_opens", opens > 0, first, f"{think} in the output, but the prompt opened it"),
            # the model opens it: once
            ("model_opens", opens > 1, second, f"{think} opened a second time"),
            # the model may open it: only as its first token
            (
                "may_open",
                opens > own_first.cast(pl.UInt32),
                pl.when(own_first).then(second).otherwise(first),
                f"{think} after the start of an output that is reasoning from its first token",
            ),
            # no reasoning: no think tokens at all
            (
                "closed",
                (opens + output.list.count_matches(end)) > 0,
                first_index_in(column, [start, end]),
                (
                    "think token in the output, but its prompt leaves no reasoning (thinking off, "
                    "or a turn after a tool result that the family answers without thinking)"
                ),
            ),
        ]
        violation = pl.lit(False)
        position = pl.lit(None, dtype=pl.Int64)
        message = pl.lit(None, dtype=pl.String)
        for name, bad, at, text in reversed(cases):
            here = state == name
            violation = pl.when(here).then(bad).otherwise(violation)
            position = pl.when(here).then(at.cast(pl.Int64)).otherwise(position)
            message = pl.when(here).then(pl.lit(text)).otherwise(message)
        return violation.fill_null(False), position, message

    def violation(self, batch: Batch) -> pl.Expr:
        return self._stray(batch)[0]

    def position(self, batch: Batch) -> pl.Expr:
        return self._stray(batch)[1]

    def message(self, batch: Batch) -> pl.Expr:
        return self._stray(batch)[2]


class ToolCallInReasoning(RecordRule):
    """A tool call entered with no `</think>` before it: the call ended the model's reasoning.

    What it checks:
        When an output holds a tool call (its section or call begin) and no `</think>` at all,
        the call was entered straight from the reasoning. A call marker inside the reasoning
        followed by `</think>` is text the model thinks with, not a call: not counted.

    Why it matters:
        Kimi and Qwen3.5/3.6 models sometimes open a tool call without closing their
        reasoning (Kimi-K2 issue 89; SGLang's reasoning parsers end the reasoning there). That
        is real model behaviour, so the record may be kept, but a drafter trained on many such
        samples learns it as the norm; count it and decide. An output generated with thinking
        off (its prompt closed the reasoning, or the model never opened it) has no reasoning
        to be inside: the message says so, and PRM001 judges the prompt. With `--thinking
        mixed`, a record whose prompt ending is thinking off is judged as in an off run: its
        calls are not counted.

    Example:
        <think>... I should look up the weather.<|tool_calls_section_begin|><|tool_call_begin|>...

    Fix:
        Nothing to fix in the pipeline if the ids are untouched; gate on the rate (the rule's
        `warn_above` / `fail_above`) rather than on single records.
    """

    code = "SEG004"
    name = "tool-call-in-reasoning"
    severity = Severity.WARNING

    def applies(self, batch: Batch) -> bool:
        return _thinking(batch) and bool(tool_entry_ids(batch.profile))

    def find(self, batch: Batch) -> pl.DataFrame:
        profile = batch.profile
        # A record of a mixed run whose prompt shows thinking off is judged as an off run judges
        # it: its calls are in an answer, with no reasoning to be inside.
        flagged = (
            _with_bounds(batch)
            .with_row_index("row")
            .filter(
                pl.col("tool_entry").is_not_null()
                & pl.col("response_at").is_null()
                & pl.Series(record_modes(batch))
            )
        )
        if flagged.is_empty():
            return empty_findings()
        start, end = profile.profile.think_start, profile.profile.think_end
        # The prompt's last think token says whether reasoning was open when the output began
        # (looked for in the prompt's marker view where the think tokens are sequences).
        if profile.sequences:
            views = [view_of(ids or [], profile.sequences) for ids in flagged["input_ids"].to_list()]
            flagged = flagged.with_columns(pl.Series("input_ids", views, dtype=pl.List(pl.Int64)))
        last = [
            pl.col("input_ids").list.eval(pl.arg_where(pl.element() == token).last()).list.first()
            for token in (profile.think_start, profile.think_end)
        ]
        prompt_open = (last[0].is_not_null() & (last[1].is_null() | (last[0] > last[1]))).fill_null(
            False
        )
        state = pl.col("reasoning")
        reasoning_open = (
            pl.when(state == "prompt_opens")
            .then(prompt_open)
            .otherwise(pl.col("reasoning_start").is_not_null())
        )
        why_not = (
            pl.when(state == "prompt_opens")
            .then(pl.lit(f"the prompt does not leave {start!r} open"))
            .when(state == "model_opens")
            .then(pl.lit(f"the model never opened {start!r}"))
            .otherwise(pl.lit("its prompt leaves no reasoning"))
        )
        rows, positions, messages = [], [], []
        for row, entry, is_open, reason in flagged.select(
            "row", "tool_entry", reasoning_open.alias("open"), why_not.alias("why")
        ).iter_rows():
            rows.append(row)
            positions.append(entry)
            messages.append(
                f"tool call entered before {end!r}: the call ended the reasoning"
                if is_open
                else f"tool call in an output with no reasoning ({reason}): was it generated "
                "with thinking off?"
            )
        return findings_frame(rows, positions, messages)

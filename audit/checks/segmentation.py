"""Segmentation: the response token `</think>` splits reasoning from the answer, exactly once."""

from __future__ import annotations

import polars as pl

from audit.batch import Batch
from audit.checks.base import (
    RecordRule,
    Severity,
    first_index_in,
    first_index_of,
    nth_index_of,
    truncated,
)


def _thinking(batch: Batch) -> bool:
    return batch.profile.reasoning in ("prompt_opens", "model_opens")


def _tool_entry_ids(batch: Batch) -> list[int]:
    """Ids that open a tool call: the section begin where the family has one, else call begin."""
    markers = batch.profile.tool_markers
    return [markers[role] for role in ("section_begin", "call_begin") if role in markers][:1]


class ResponseTokenMissing(RecordRule):
    """A finished output with no `</think>`: reasoning and answer cannot be told apart.

    What it checks:
        When the prompt (or the model) opened `<think>`, the output contains the response
        token `</think>`. Truncated and aborted outputs are left to the termination rules;
        for families whose profile says a tool call may end the reasoning (Kimi,
        `may_end_reasoning`), a tool-call section entered without `</think>` to SEG004.

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

    def violation(self, batch: Batch) -> pl.Expr:
        output = pl.col("output_ids")
        missing = output.list.count_matches(batch.profile.think_end) == 0
        # Only families known to enter a tool call straight from reasoning (Kimi) are excused:
        # elsewhere a tool call with no </think> before it means the token was stripped.
        spec = batch.profile.tool_calls
        entry = _tool_entry_ids(batch) if spec is not None and spec.may_end_reasoning else []
        in_tool_call = first_index_in("output_ids", entry).is_not_null() if entry else pl.lit(False)
        return missing & (output.list.len() > 0) & ~truncated() & ~in_tool_call

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

    def violation(self, batch: Batch) -> pl.Expr:
        return pl.col("output_ids").list.count_matches(batch.profile.think_end) > 1

    def position(self, batch: Batch) -> pl.Expr:
        return nth_index_of("output_ids", batch.profile.think_end, 1)

    def message(self, batch: Batch) -> pl.Expr:
        end = batch.profile.profile.think_end
        count = pl.col("output_ids").list.count_matches(batch.profile.think_end)
        return pl.format("{} appears {} times; expected once", pl.lit(repr(end)), count)


class ThinkTokenInOutput(RecordRule):
    """A `<think>` in the output where none belongs.

    What it checks:
        When the prompt already opened `<think>`, the output has none; when the model opens
        it itself, only once and only at the start; when thinking is off, the output has
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

    def _stray(self, batch: Batch) -> tuple[pl.Expr, pl.Expr]:
        profile = batch.profile
        start, end = profile.think_start, profile.think_end
        output = pl.col("output_ids")
        if profile.reasoning == "prompt_opens":
            return output.list.count_matches(start) > 0, first_index_of("output_ids", start)
        if profile.reasoning == "model_opens":
            second = nth_index_of("output_ids", start, 1)
            return second.is_not_null(), second
        # thinking off: no think tokens at all
        return (
            (output.list.count_matches(start) + output.list.count_matches(end)) > 0,
            first_index_in("output_ids", [start, end]),
        )

    def violation(self, batch: Batch) -> pl.Expr:
        return self._stray(batch)[0]

    def position(self, batch: Batch) -> pl.Expr:
        return self._stray(batch)[1]

    def message(self, batch: Batch) -> pl.Expr:
        profile = batch.profile
        think = repr(profile.profile.think_start)
        if profile.reasoning == "prompt_opens":
            return pl.lit(f"{think} in the output, but the prompt already opened it")
        if profile.reasoning == "model_opens":
            return pl.lit(f"{think} opened a second time")
        return pl.lit("think token in the output, but thinking is off for this run")


class ToolCallInReasoning(RecordRule):
    """A tool-call section entered before `</think>`: the model called a tool while reasoning.

    What it checks:
        When an output holds a tool call, `</think>` comes before it.

    Why it matters:
        Kimi models sometimes enter `<|tool_calls_section_begin|>` straight from their
        reasoning (Kimi-K2 issue 89). That is real model behaviour, so the record may be kept,
        but a drafter trained on many such samples learns it as the norm; count it and decide.

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
        return _thinking(batch) and bool(_tool_entry_ids(batch))

    def violation(self, batch: Batch) -> pl.Expr:
        entered = first_index_in("output_ids", _tool_entry_ids(batch))
        closed = first_index_of("output_ids", batch.profile.think_end)
        return entered.is_not_null() & (closed.is_null() | (closed > entered))

    def position(self, batch: Batch) -> pl.Expr:
        return first_index_in("output_ids", _tool_entry_ids(batch))

    def message(self, batch: Batch) -> pl.Expr:
        end = batch.profile.profile.think_end
        return pl.lit(f"tool call entered before {end!r}, inside the reasoning")

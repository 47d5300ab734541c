"""Prompt ending: the generation prompt the chat template should have left the model in."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import polars as pl

from audit.checks.base import Explanation, RecordRule, empty_findings, findings_frame
from audit.model.families.thinking_modes import mode_key
from audit.model.tokens.token_text import token_strings
from audit.records.batch import Batch
from audit.records.expressions import ends_with, first_index_of
from audit.records.response import prompt_endings, record_reasoning


class PromptSuffix(RecordRule):
    """The prompt does not end with the model's generation-prompt suffix.

    What it checks:
        `input_ids` end with the profile's generation-prompt suffix for the thinking mode in
        use (with `--thinking mixed`, that of either mode), resolved to ids by the tokenizer.
        Kimi-K2.5 thinking: `<|im_assistant|>assistant<|im_middle|><think>`; DeepSeek-V3.1 thinking:
        `<｜Assistant｜><think>`. Or with one of the profile's agentic continuations, the
        endings its template gives a prompt that ends after a tool result (DeepSeek-V3.1:
        `<｜tool▁output▁end｜>`, no assistant prefix; V3.2:
        `</function_results>\\n\\n<think>`). Where the family's template marks thinking in
        the prompt itself (`tokens.thinking_token`, Gemma-4's `<|think|>` in the system turn),
        the prompt holds that token when, and only when, the record's mode is thinking: after a
        tool result Gemma-4's prompts of both modes end alike.

    Why it matters:
        The drafter learns from the target's hidden states at every prompt position. A prompt
        without the `<think>` the server's template appends (a thinking-off template, an old
        template revision, `add_generation_prompt=False`) conditions the target differently
        from serving time, and acceptance collapses.

    Example:
        ... <|im_assistant|> assistant <|im_middle|>        (no <think>: thinking-off or stale template)

    Fix:
        Render prompts with the model's own tokenizer:
        `apply_chat_template(messages, tools=tools, add_generation_prompt=True)`, and send
        the ids to `/generate` as `input_ids`. Check `--thinking` matches the run (`mixed`
        for a partition of both modes: each record is judged in the mode its ending shows).
    """

    code = "PRM001"
    name = "prompt-suffix"
    position_field: ClassVar[str] = "input_ids"

    def violation(self, batch: Batch) -> pl.Expr:
        accepted = [ends_with("input_ids", suffix) for suffix in batch.profile.prompt_suffixes]
        wrong_mode = _other_mode(batch)
        wrong = ~pl.any_horizontal(accepted)
        if wrong_mode is not None:
            wrong = wrong | pl.lit(pl.Series(wrong_mode))
        return wrong & (pl.col("input_ids").list.len() > 0)

    def explain(self, batch: Batch, row: int, position: int | None) -> Explanation | None:
        """The expected suffixes (text and ids) above the prompt's real ending."""
        prompt = batch.records["input_ids"][row]
        if prompt is None or prompt.is_empty():
            return None
        profile = batch.profile
        rows = [
            ("expected", f"{text!r}  {list(ids)}")
            for text, ids in zip(profile.prompt_suffix_texts, profile.prompt_suffixes, strict=True)
        ]
        actual = prompt.tail(max(len(s) for s in profile.prompt_suffixes) + 2).to_list()
        tokenizer = batch.tokenizer
        text = tokenizer.decode_batch([actual])[0] if tokenizer.can_decode(actual) else "(ids outside the vocabulary)"
        rows.append(("actual", f"{text!r}  {actual}"))
        mode = " and ".join(mode_key(m) for m in profile.modes)
        return Explanation(self.code, f"generation suffix ({profile.name}, {mode})", tuple(rows))

    def find(self, batch: Batch) -> pl.DataFrame:
        accepted = [ends_with("input_ids", suffix) for suffix in batch.profile.prompt_suffixes]
        not_empty = pl.col("input_ids").list.len() > 0
        flagged = batch.records.with_row_index("row").filter((~pl.any_horizontal(accepted) & not_empty).fill_null(False))
        findings = self._endings(batch, flagged)
        wrong_mode = _other_mode(batch)
        if wrong_mode is None:
            return findings
        other = batch.records.with_row_index("row").filter(
            pl.lit(pl.Series(wrong_mode)) & not_empty & pl.any_horizontal(accepted).fill_null(False)
        )
        return pl.concat([findings, self._mode_token(batch, other)]).sort("row")

    def _mode_token(self, batch: Batch, flagged: pl.DataFrame) -> pl.DataFrame:
        """Prompts whose thinking token says the other mode than their ending (or the run)."""
        if flagged.is_empty():
            return empty_findings()
        token = batch.profile.thinking_token
        text = batch.profile.profile.thinking_token
        assert token is not None  # _other_mode flags nothing without one
        against = "the run" if len(batch.profile.modes) == 1 else "its ending"
        holds = _holds_token(batch)
        positions, messages = [], []
        for row, at, length in flagged.select(
            "row", first_index_of("input_ids", token).alias("at"), pl.col("input_ids").list.len().alias("length")
        ).iter_rows():
            if holds[row]:
                positions.append(at)
                messages.append(f"prompt holds {text!r}, which the template writes only with thinking on, "
                                f"but {against} is thinking off")
            else:
                positions.append(length - 1)
                messages.append(f"prompt has no {text!r}, which the template writes with thinking on, "
                                f"but {against} is thinking on")
        return findings_frame(flagged["row"].to_list(), positions, messages)

    def _endings(self, batch: Batch, flagged: pl.DataFrame) -> pl.DataFrame:
        """Prompts that end with none of the accepted endings."""
        if flagged.is_empty():
            return empty_findings()
        profile = batch.profile
        # The generation prompt of each mode of the run (thinking's first, as the records are judged).
        expected = [profile.mode_endings(mode)[0] for mode in profile.modes]
        width = max(len(profile.prompt_suffixes[index]) for index in expected)
        tails = flagged.select(pl.col("input_ids").list.tail(width + 1)).to_series().to_list()
        lengths = flagged.select(pl.col("input_ids").list.len()).to_series().to_list()
        shown_ids = sorted({t for tail in tails for t in tail})
        text_of = dict(zip(shown_ids, token_strings(batch.tokenizer, shown_ids), strict=True))
        expected_text = " or ".join(repr(profile.prompt_suffix_texts[index]) for index in expected)
        positions, messages = [], []
        for tail, length in zip(tails, lengths, strict=True):
            shown = "".join(text_of[t] for t in tail)
            positions.append(length - 1)
            messages.append(f"prompt ends with {shown!r}, expected it to end with {expected_text}")
        return findings_frame(flagged["row"].to_list(), positions, messages)


def _other_mode(batch: Batch) -> np.ndarray | None:
    """Per record, does its prompt's thinking token (`tokens.thinking_token`) say the other mode
    than its ending (a single-mode run: than the run's)? None for families without one."""
    profile = batch.profile
    if profile.thinking_token is None:
        return None
    holds = _holds_token(batch)
    if len(profile.modes) == 1:
        return holds != profile.modes[0]
    ending = prompt_endings(batch)
    ending_modes = np.asarray(profile.suffix_modes, dtype=bool)[np.maximum(ending, 0)]
    return (ending >= 0) & (ending_modes != holds)


def _holds_token(batch: Batch) -> np.ndarray:
    token = batch.profile.thinking_token
    holds = batch.records.select(pl.col("input_ids").list.contains(token).fill_null(False)).to_series()
    return np.asarray(holds.to_numpy(), dtype=bool)


class ThinkNotOpened(RecordRule):
    """The output does not open `<think>` although the template leaves that to the model.

    What it checks:
        For templates that do not prefill `<think>` (Kimi-K2-Thinking, Qwen3 hybrid, GLM),
        the output starts with the think-start token, within the profile's
        `think_open_window` leading tokens.

    Why it matters:
        With such templates the model always opens its reasoning itself; an output without
        it was rewritten (a reasoning parser moved it into `reasoning_content`) or was
        generated with thinking disabled.

    Example:
        output_ids decode to "The user wants ... </think>The answer is 4<|im_end|>"

    Fix:
        Use `/generate` (no reasoning parser) and save `output_ids` untouched; check that
        thinking was on for the run.
    """

    code = "PRM002"
    name = "think-not-opened"

    def applies(self, batch: Batch) -> bool:
        return "model_opens" in batch.profile.reasonings

    def frame(self, batch: Batch) -> pl.DataFrame:
        return batch.with_marker_ids(batch.records)

    def violation(self, batch: Batch) -> pl.Expr:
        opened_at = first_index_of(batch.marker_column, batch.profile.think_ids[0])
        window = batch.profile.profile.think_open_window
        # Only records whose prompt leaves the opening to the model (not an agentic
        # continuation with a reasoning state of its own).
        model_opens = pl.lit(record_reasoning(batch)) == "model_opens"
        not_opened = opened_at.is_null() | (opened_at > window)
        return model_opens & (pl.col("output_ids").list.len() > 0) & not_opened

    def position(self, batch: Batch) -> pl.Expr:
        return pl.lit(0)

    def message(self, batch: Batch) -> pl.Expr:
        think = batch.profile.profile.think_start
        return pl.lit(f"output does not start with {think!r}; this template leaves it to the model")

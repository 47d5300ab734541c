"""The serving mix: the modes a model is served in, each present in the data at its share.

A drafter predicts what its target emits in every mode it is served in: thinking on, thinking
off, answers that call tools. A drafter trained on one mode alone loses most of its acceptance
in the others (a Qwen3.5 drafter trained on thinking outputs only fell from 9.5 to 2.7-3.9
accepted tokens with thinking off or with tool calls: z-lab/dflash#60). Each record shows its
mode (`audit.records.segments.record_summary`: `thinking`, `tool_calls`); the report counts
them (`audit.report.distributions.mode_counts`: `serving_mix`), and a rule set declares the least share of
each mode its model is served with:

    [mix]
    thinking_on = "50%"      # a rate of the records whose mode is known ...
    thinking_off = "10%"
    tool_calls = 100         # ... or a count of records
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import polars as pl

from audit.base.config import expect
from audit.base.errors import ConfigError
from audit.checks.base import Rule, Threshold, empty_findings
from audit.records.batch import Batch

# The modes a record shows, in the order every output lists them, with what people read.
MODES: dict[str, str] = {
    "thinking_on": "thinking on",
    "thinking_off": "thinking off",
    "tool_calls": "tool calls in the answer",
}


@dataclass(frozen=True)
class ServingMix:
    """A rule set's `[mix]`: the least share of records each declared mode must have."""

    minimums: dict[str, Threshold]

    @classmethod
    def parse(cls, table: Any, where: str) -> ServingMix:
        """The `[mix]` table of a rule set; ConfigError naming the file and key."""
        expect(table, dict, where)
        for key in table:
            if key not in MODES:
                raise ConfigError(f"{where}: unknown mode {key!r} (known: {', '.join(MODES)})")
        return cls({key: Threshold.parse(table[key], f"{where}.{key}") for key in MODES if key in table})

    def to_json(self) -> dict[str, int | str]:
        return {key: minimum.to_json() for key, minimum in self.minimums.items()}


class ServingModeMissing(Rule):
    """A mode the model is served in is missing from the partition, or under its declared share.

    What it checks:
        The rule set's `[mix]` table declares the least share of records each serving mode
        must have: `thinking_on`, `thinking_off` (records whose output reasons, and records
        whose output does not: the prompt closed the reasoning or the model closed it empty)
        and `tool_calls` (records whose answer calls a tool). A share is a rate of the records
        whose mode is known (`"10%"`) or a count of records (`100`). Each mode under its share
        is one failing mode; the result's detail names it, with its count and share. A rule set
        without `[mix]` declares nothing and the rule passes; the report shows the mix anyway.

    Why it matters:
        A drafter learns to predict its target in the modes its data shows. Served in a mode
        it never saw (thinking off, tool calls), its acceptance collapses: a drafter trained on
        thinking outputs only fell from 9.5 to 2.7-3.9 accepted tokens per step when served
        with thinking off or with tool calls (z-lab/dflash#60). No single record is wrong, so
        no other rule can see it.

    Example:
        [mix] thinking_off = "10%"; the partition: 300 records, all thinking on
        -> thinking off: 0 of 300 records (0%), the rule set asks at least 10%

    Fix:
        Generate the missing mode too (`audit generate` with thinking off, prompts with
        tools), add it to the partition and audit both modes together (`--thinking mixed`:
        each record judged in the mode its prompt shows), or declare the mix the model is
        really served in.
    """

    code = "MIX001"
    name = "serving-mode-missing"
    # Judged over the whole partition's statistics (`check_partition`), never per record.
    partition_level: ClassVar[bool] = True

    def check(self, batch: Batch) -> pl.DataFrame:
        return empty_findings()

    def check_partition(self, counts: dict[str, int], mix: ServingMix | None) -> list[str]:
        """One sentence per declared mode under its share (none when every mode meets it)."""
        if mix is None:
            return []
        short = []
        for mode, minimum in mix.minimums.items():
            present = counts[mode]
            # A thinking mode's share is of the records whose thinking shows; tool calls, of all.
            over = counts["thinking_known"] if mode.startswith("thinking") else counts["records"]
            if _meets(present, over, minimum):
                continue
            whose = " whose thinking shows" if mode.startswith("thinking") else ""
            share = f" ({present / over:.1%})" if over else ""
            asked = f"{minimum.count} records" if minimum.count is not None else str(minimum)
            short.append(f"{MODES[mode]}: {present} of {over} records{whose}{share}, the rule set asks at least {asked}")
        return short


def _meets(present: int, over: int, minimum: Threshold) -> bool:
    if minimum.count is not None:
        return present >= minimum.count
    rate = minimum.rate or 0.0
    return rate == 0.0 or (over > 0 and present / over >= rate)

"""The trainer view in one sentence: how many records a trainer fed text would train on something else.

    SpecForge 0.2.0 (qwen3-thinking) would train 41% of these records (12 of 29) on something
    else: 30% because its default system prompt was added, 14% because its re-tokenized text
    differs from the exact ids.

Counted from the TRN findings of a run (`audit.checks.trainer`): a record is trained on
something else when an error-severity trainer finding names it; the causes are each rule's
records, as rates of the records the view saw (those with `messages`). Warnings (the prompt's
earlier turns trained) are said after. The JSON report carries the counts beside the sentence.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from audit.checks import RULES
from audit.checks.ruleset import RuleSet
from audit.checks.trainer import TrainerNotViewed, TrainerViewRule
from audit.engine.findings import FindingsLog

# The rule that reports the records the view could not see.
_NOT_VIEWED = TrainerNotViewed.code


def trainer_summary(log: FindingsLog, rule_set: RuleSet, trainer: dict[str, Any], readable: int) -> dict[str, Any]:
    """The summary of the trainer view over a run's findings (`readable`: records read)."""
    codes = [c.code for c in rule_set.rules if c.rule.requires == "trainer"]
    found = (
        log.scan()
        .filter(pl.col("rule").is_in(codes))
        .select("line", "rule", "severity")
        .collect(engine="streaming")
    )
    per_rule = dict(found.group_by("rule").agg(pl.col("line").n_unique()).iter_rows())
    not_viewed = int(per_rule.get(_NOT_VIEWED, 0))
    viewed = max(readable - not_viewed, 0)
    judged = found.filter(pl.col("rule") != _NOT_VIEWED)
    changed = int(judged.filter(pl.col("severity") == "error")["line"].n_unique())
    causes: list[dict[str, Any]] = []
    for code in codes:
        records = int(per_rule.get(code, 0))
        if code == _NOT_VIEWED or not records:
            continue
        severity = rule_set[code].severity.value
        causes.append({
            "code": code,
            "name": RULES[code].name,
            "severity": severity,
            "records": records,
            "rate": round(records / viewed, 6) if viewed else 0.0,
            "cause": _cause(code),
        })
    causes.sort(key=lambda cause: (cause["severity"] != "error", -cause["records"], cause["code"]))
    label = trainer.get("label") or trainer.get("name", "the trainer")
    return {
        **trainer,
        "records": readable,
        "viewed": viewed,
        "not_viewed": not_viewed,
        "changed": changed,
        "rate": round(changed / viewed, 6) if viewed else 0.0,
        "causes": causes,
        "summary": _sentence(label, viewed, not_viewed, changed, causes) + _load_sentence(trainer),
    }


def _load_sentence(trainer: dict[str, Any]) -> str:
    """Once per run: the trainer's transformers loads the tokenizer folder otherwise, and the fix."""
    load = trainer.get("tokenizer_load")
    if not isinstance(load, dict):
        return ""
    return (
        f" Its transformers {load.get('transformers')} loads this tokenizer folder as {load.get('builds')}: "
        f"every text it encodes differs from the folder's tokenizer.json (fix: {load.get('fix')})."
    )


def _cause(code: str) -> str:
    rule = RULES[code]
    return rule.cause if issubclass(rule, TrainerViewRule) else rule.name


def _percent(part: int, whole: int) -> str:
    share = 100 * part / whole if whole else 0.0
    return f"{share:.0f}%" if share >= 1 or share == 0 else "<1%"


def _sentence(label: str, viewed: int, not_viewed: int, changed: int, causes: list[dict[str, Any]]) -> str:
    unseen = (
        f" ({not_viewed} record{'s' if not_viewed != 1 else ''} could not be viewed: see TRN010)"
        if not_viewed else ""
    )
    if not viewed:
        return f"The {label} view saw none of these records{unseen}."
    if changed:
        errors = [c for c in causes if c["severity"] == "error"]
        because = ", ".join(f"{_percent(c['records'], viewed)} because {c['cause']}" for c in errors)
        text = (
            f"{label} would train {_percent(changed, viewed)} of these records ({changed} of {viewed}) on "
            f"something else: {because}"
        )
    else:
        text = f"{label} would train each of these {viewed} records on its exact sample"
    warnings = [c for c in causes if c["severity"] != "error"]
    if warnings:
        text += "; " + ", ".join(
            f"for {_percent(c['records'], viewed)} {c['cause']}" for c in warnings
        ) + " (warning)"
    return text + unseen + "."

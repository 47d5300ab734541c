"""A rule with a bug, on demand: it raises on the records whose id contains a trigger.

In this process, `inject_fault(monkeypatch, code)`; in every process of a run (`--jobs`
workers, Ray workers), this directory's sitecustomize.py with `AUDIT_TEST_FAULT=CODE`.
"""

from __future__ import annotations

from typing import Any

import polars as pl

TRIGGER = "boom"


def raising_check(code: str, original: Any, trigger: str = TRIGGER) -> Any:
    """`original` (a rule's check), raising ZeroDivisionError on a batch that holds a record
    whose id contains `trigger` (every record when `trigger` is empty)."""

    def check(self, batch):
        ids = batch.records["id"].cast(pl.String).fill_null("")
        if batch.height and ids.str.contains(trigger, literal=True).any():
            raise ZeroDivisionError(f"injected fault in {code}")
        return original(self, batch)

    return check


def inject(code: str) -> None:
    """For the whole process (sitecustomize): rule `code` raises on TRIGGER's records."""
    from audit.checks import RULES

    rule = RULES[code]
    rule.check = raising_check(code, rule.check)  # type: ignore[method-assign]


def inject_fault(monkeypatch: Any, code: str, trigger: str = TRIGGER) -> None:
    """For one test: rule `code` raises on the records whose id contains `trigger`."""
    from audit.checks import RULES

    rule = RULES[code]
    monkeypatch.setattr(rule, "check", raising_check(code, rule.check, trigger))

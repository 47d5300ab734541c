"""The rules that are one polars expression over a batch's columns, asked in one query.

A `RecordRule` whose findings are its `violation` over the batch's own columns (the default
`find` and `frame`: INT002, INT003, PRM002, SEG002, TRM001, TRM003, TRM004) costs a polars
query per block for flags that are nearly always all false. The engine asks for all of their
flags in one query (`fused_checks`) and hands each rule its own (`RecordRule.flagged`); the
findings are each rule's. A query that raises leaves each rule to ask, and be isolated
(`audit.engine.isolation`), on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl

from audit.checks.base import RecordRule
from audit.engine.isolation import is_failure
from audit.records.batch import Batch


def fusable_rules(rules: list[Any]) -> list[tuple[int, RecordRule]]:
    """The rules of `rules` whose flags one query can give (`RecordRule.fusable`), with their
    places in `rules`."""
    return [(index, rule) for index, rule in enumerate(rules) if isinstance(rule, RecordRule) and rule.fusable]


def fused_checks(batch: Batch, rules: list[tuple[int, RecordRule]]) -> dict[int, Callable[[Batch], pl.DataFrame]]:
    """The check of every rule in `rules` that applies to the batch, by the rule's place, with
    its flags (`violation`, nulls as False) from one query over the batch's columns for all of
    them; none when fewer than two apply or the query raises (each rule then asks, and is
    isolated, on its own)."""
    if batch.height == 0 or len(rules) < 2:
        return {}
    try:
        applying = [(index, rule) for index, rule in rules if rule.applies(batch)]
        if len(applying) < 2:
            return {}
        flags = batch.records.select(
            rule.violation(batch).fill_null(False).alias(str(n)) for n, (_, rule) in enumerate(applying)
        )
    except BaseException as exc:
        if not is_failure(exc):
            raise
        return {}
    return {index: _flagged_in(batch, rule, flags.to_series(n)) for n, (index, rule) in enumerate(applying)}


def _flagged_in(batch: Batch, rule: RecordRule, flags: pl.Series) -> Callable[[Batch], pl.DataFrame]:
    """`rule.check`, with the flags the fused query gave for `batch` (a part of it that
    isolation audits again asks on its own)."""
    def check(part: Batch) -> pl.DataFrame:
        return rule.flagged(part, flags) if part is batch else rule.check(part)

    return check

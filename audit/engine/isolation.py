"""A rule that raises on a record costs that record, not the run.

Every rule is meant to be total over what the record contract admits; when one still raises
(a bug), the engine runs it again on each half of the batch, and on each half of a half that
raises, down to the records that raise alone. Those records get an internal-error finding
(`INTERNAL_ERROR`, error severity: the gate quarantines them) naming the rule and the exception;
every other record keeps its findings, the report is written, and the run exits 2 saying how
many records hit an internal error. The traceback is kept as text (it crosses process and
Ray boundaries) and printed on request (`--debug`, `AUDIT_DEBUG=1`).

Halving costs nothing when nothing raises (one `try`), and about twice the batch's work per
record that does; a budget bounds it when a rule raises on nearly everything.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from audit.base.errors import RunStopped, one_line
from audit.checks.internal import InternalError as InternalErrorRule
from audit.records.batch import Batch

# The code of an internal-error finding, which the engine reports itself.
INTERNAL_ERROR = InternalErrorRule.code
DEBUG_ENV = "AUDIT_DEBUG"

T = TypeVar("T")


def debug_requested() -> bool:
    """Did the user ask for full tracebacks (`--debug`, which sets `AUDIT_DEBUG=1`)?"""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in {"", "0", "false", "no", "off"}


@dataclass(frozen=True)
class InternalError:
    """One record a rule (or the record statistics) raised on: plain data, for any process."""

    line: int
    id: str | None
    rule: str  # the code of the rule that raised, or "statistics"
    error: str  # the exception, on one line: "IndexError: index 7 is out of bounds"
    traceback: str

    @property
    def message(self) -> str:
        """The finding's message: the rule and the exception."""
        return f"{self.rule} raised {self.error} on this record (a bug in audit; --debug shows the traceback)"

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "id": self.id, "rule": self.rule, "error": self.error, "traceback": self.traceback}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InternalError:
        return cls(int(data["line"]), data.get("id"), str(data["rule"]), str(data["error"]), str(data["traceback"]))


def is_failure(exc: BaseException) -> bool:
    """An exception a rule may raise: any `Exception`, and the panics of Rust extensions
    (polars, tokenizers, fastokens), which derive from BaseException; never an interrupt, nor
    an error that stops the run (`RunStopped`: no record is at fault)."""
    if isinstance(exc, RunStopped):
        return False
    return isinstance(exc, Exception) or type(exc).__name__ == "PanicException"


# Runs of a rule one block may spend finding the records it raises on: enough to single out a
# dozen bad records among thousands; past it, a part that raises counts all its records as hit
# (a rule that raises on everything costs a few seconds per block, not a run through each record).
ISOLATION_BUDGET = 256


def isolated(
    compute: Callable[[Batch], T], batch: Batch, budget: list[int] | None = None
) -> tuple[list[tuple[int, T]], list[tuple[int, str, str]]]:
    """`compute(batch)`, or, when it raises, `compute` over parts of the batch that do not.

    Returns each result with the row its part starts at, and (row, error, traceback) for each
    record that raises alone (or that sits in a part that raised once the budget was spent).
    """
    budget = [ISOLATION_BUDGET] if budget is None else budget
    try:
        budget[0] -= 1
        return [(0, compute(batch))], []
    except BaseException as exc:
        if not is_failure(exc):
            raise
        if batch.height <= 1 or budget[0] <= 0:
            error, trace = one_line(exc), traceback.format_exc()
            return [], [(row, error, trace) for row in range(batch.height)]
    results: list[tuple[int, T]] = []
    failures: list[tuple[int, str, str]] = []
    half = batch.height // 2
    for start, length in ((0, half), (half, batch.height - half)):
        part = Batch(batch.records.slice(start, length), batch.context, batch.source_prompts)
        done, failed = isolated(compute, part, budget)
        results.extend((start + offset, value) for offset, value in done)
        failures.extend((start + row, error, trace) for row, error, trace in failed)
    return results, failures

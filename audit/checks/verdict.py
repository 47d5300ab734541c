"""The verdict: how a rule's failing records compare with its thresholds, and what a run's rules
add up to. Every report, format, page, gate manifest and live view reads it from here.

    judge(failing, records, warn_above, fail_above)  one rule: "pass", "warn" or "fail"
    threshold_text(warn_above, fail_above)           "warn >0, fail >2%", as every output shows it
    Verdict.of(results)                              a run: the worst verdict, the rules behind it
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from audit.checks.base import Threshold

PASS, WARN, FAIL = "pass", "warn", "fail"
# A verdict's rank: what "got worse" means between two reports.
VERDICT_RANK = {PASS: 0, WARN: 1, FAIL: 2}

# The exit codes of a judged run (2, nothing judged, is the CLI's: `audit.cli.app.EXIT_USAGE`).
EXIT_PASSED = 0
EXIT_FAILED = 1
# The tool broke: a usage, configuration or input error, or a rule that raised on a record.
EXIT_ERROR = 2


def judge(
    failing: int, records: int, warn_above: Threshold | None, fail_above: Threshold | None
) -> str:
    """One rule's verdict for `failing` of `records`: fail above `fail_above`, else warn above
    `warn_above`, else pass."""
    if fail_above is not None and fail_above.exceeded(failing, records):
        return FAIL
    if warn_above is not None and warn_above.exceeded(failing, records):
        return WARN
    return PASS


def threshold_text(warn_above: object | None, fail_above: object | None) -> str:
    """A rule's thresholds as people read them: `warn >0, fail >2%`, or `never fails`.

    Takes `Threshold`s or their JSON form (a count, or a rate as `"2%"`): both print alike.
    """
    parts = []
    if warn_above is not None:
        parts.append(f"warn >{warn_above}")
    if fail_above is not None:
        parts.append(f"fail >{fail_above}")
    return ", ".join(parts) or "never fails"


def failing_verdicts(fail_on_warning: bool = False) -> frozenset[str]:
    """The verdicts that fail the gate: `fail`, and `warn` too under `--fail-on warning`."""
    return frozenset((FAIL, WARN)) if fail_on_warning else frozenset((FAIL,))


class Judged(Protocol):
    """A rule's standing in a run: its code and verdict (a report's rule result, a live count)."""

    @property
    def code(self) -> str: ...

    @property
    def verdict(self) -> str: ...


@dataclass(frozen=True)
class Verdict:
    """What a run's rules add up to: the worst of their verdicts, and which rules failed or
    warned."""

    standings: tuple[tuple[str, str], ...]  # (code, verdict) of every rule, in rule order

    @classmethod
    def of(cls, results: Iterable[Judged]) -> Verdict:
        """The verdict of rules with these standings, in their order."""
        return cls(tuple((r.code, r.verdict) for r in results))

    @property
    def value(self) -> str:
        """pass, warn or fail: the worst verdict of any rule."""
        verdicts = {verdict for _, verdict in self.standings}
        return FAIL if FAIL in verdicts else WARN if WARN in verdicts else PASS

    @property
    def failed(self) -> tuple[str, ...]:
        """The rules over their fail threshold."""
        return self.failing_rules()

    @property
    def warned(self) -> tuple[str, ...]:
        """The rules over their warn threshold but not their fail one."""
        return tuple(code for code, verdict in self.standings if verdict == WARN)

    def fails(self, *, fail_on_warning: bool = False) -> bool:
        """Does the gate fail? On `fail`; on `warn` too under `--fail-on warning`."""
        return self.value in failing_verdicts(fail_on_warning)

    def gate(self, *, fail_on_warning: bool = False) -> str:
        """The verdict the gate reached: `fail` whenever it fails (a `warn` under `--fail-on
        warning` too), else pass or warn. What a verdict line says, beside its exit code."""
        return FAIL if self.fails(fail_on_warning=fail_on_warning) else self.value

    def failing_rules(self, *, fail_on_warning: bool = False) -> tuple[str, ...]:
        """The rules that fail the gate, in rule order: failed ones, and warned ones under
        `--fail-on warning`."""
        failing = failing_verdicts(fail_on_warning)
        return tuple(code for code, verdict in self.standings if verdict in failing)

    def exit_code(self, *, fail_on_warning: bool = False) -> int:
        """0 the gate passed, 1 it failed: the exit codes of `check`, `gate` and `watch --once`."""
        return EXIT_FAILED if self.fails(fail_on_warning=fail_on_warning) else EXIT_PASSED

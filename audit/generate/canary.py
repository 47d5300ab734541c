"""The canary: the first N prompts of a run are audited before the rest are sent.

Their samples are audited with the rule set, the same engine as `audit check`, so a broken
pipeline (a parser stripping `</think>`, the wrong template) stops the run in its first
minute instead of after the GPU hours are spent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from audit.checks.ruleset import RuleSet
from audit.engine.runner import audit_input
from audit.generate.server_errors import describe
from audit.records.batch import AuditContext
from audit.records.sources import InputDigest, memory_blocks
from audit.report.report import Report, build_report


class Canary:
    """Collects the first `size` outcomes of a run, then audits the samples among them.

    `state` moves off -> (pending -> auditing -> passed | failed); `gate` opens when the
    canary passed (or at once when it is off): the prompts after the canary wait for it.
    `on_change` is called on each change of state after the pending one.
    """

    def __init__(
        self,
        size: int,
        audit: Callable[[list[bytes]], Report],
        *,
        errors_path: Path,
        on_change: Callable[[Canary], None],
    ):
        self.size = size
        self.state = "pending" if size else "off"
        self.gate = asyncio.Event()
        if not size:
            self.gate.set()
        self.report: Report | None = None
        self.message: str | None = None  # why it failed, when no report says it
        self._audit = audit
        self._errors_path = errors_path
        self._on_change = on_change
        self._lines: list[bytes] = []
        self._resolved = 0
        self._task: asyncio.Task | None = None

    def resolved(self, line: bytes | None) -> None:
        """One of the run's prompts is done: its written line, or None when it failed."""
        if self.state != "pending":
            return
        if line is not None:
            self._lines.append(line)
        self._resolved += 1
        if self._resolved >= self.size:
            self.state = "auditing"
            self._on_change(self)
            self._task = asyncio.get_running_loop().create_task(self._judge())

    async def _judge(self) -> None:
        if not self._lines:
            self.message = (
                f"every one of the first {self.size} requests failed: see {self._errors_path}"
            )
            self._finish(passed=False)
            return
        try:
            self.report = await asyncio.to_thread(self._audit, list(self._lines))
        except Exception as exc:  # a canary that cannot judge must not let the run go on unjudged
            self.message = f"the canary audit itself failed: {describe(exc)}"
            self._finish(passed=False)
            return
        if self.report.internal_errors:  # not judged: a bug, which stops the run as a failure does
            self.message = (
                f"the canary audit hit an internal error on {self.report.internal_error_records} "
                "records (a bug in audit, not in the samples)"
            )
        self._finish(passed=not self.report.judgement.fails())

    def _finish(self, *, passed: bool) -> None:
        self.state = "passed" if passed else "failed"
        if passed:
            self.gate.set()
        self._on_change(self)

    async def verdict(self) -> None:
        """Wait for the audit under way, if any, to give its verdict."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def cancel(self) -> None:
        """Stop an audit still running (the run ends before its verdict)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def audit_lines(
    lines: list[bytes],
    context: AuditContext,
    rule_set: RuleSet,
    *,
    target: str,
    first_line: int = 1,
    path: Path | None = None,
) -> Report:
    """Audit JSONL lines held in memory (a run's first samples), numbered from `first_line`.

    `path` is the file the lines were written to, named in the report (none: `<memory>`).
    """
    digest = InputDigest()
    blocks = memory_blocks(lines, first_line=first_line, digest=digest)
    audited = audit_input(blocks, digest, context, rule_set, path=path or Path("<memory>"))
    report = build_report(
        target,
        audited,
        rule_set,
        profile=context.profile.to_dict(),
        tokenizer=context.tokenizer.fingerprint.to_dict(),
    )
    report.input["first_line"] = first_line
    return report

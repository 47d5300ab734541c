"""The report of a run: per-rule results, the verdict, and every finding, as data.

`Report.to_json()` is the machine contract (`schema_version`, changed only by addition);
rendering for people lives in `audit.render`, so this module knows nothing of terminals.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from audit import __version__
from audit.distributions import summarize
from audit.engine import FINDINGS_SCHEMA, FileAudit
from audit.errors import InputError
from audit.files import write_atomically
from audit.ruleset import RuleSet

SCHEMA_VERSION = 1
EXAMPLE_LINES = 5

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_ERROR = 2


@dataclass(frozen=True)
class RuleResult:
    """How one rule fared over one input."""

    code: str
    name: str
    severity: str
    summary: str
    failing: int
    records: int
    warn_above: int | str | None
    fail_above: int | str | None
    threshold: str
    verdict: str  # pass | warn | fail
    example_lines: list[int]

    @property
    def rate(self) -> float:
        return self.failing / self.records if self.records else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "name": self.name,
            "severity": self.severity,
            "summary": self.summary,
            "failing": self.failing,
            "rate": round(self.rate, 6),
            "warn_above": self.warn_above,
            "fail_above": self.fail_above,
            "verdict": self.verdict,
            "example_lines": self.example_lines,
        }


@dataclass
class Report:
    """One audited input: what was read, with what, and what every rule concluded."""

    target: str
    input: dict[str, Any]
    profile: dict[str, Any]
    tokenizer: dict[str, Any]
    rule_set: dict[str, Any]
    results: list[RuleResult]
    findings: pl.DataFrame
    created_at: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    seconds: float = 0.0
    # The partition's shape (audit.distributions.summarize), for plots; None in older reports.
    distributions: dict[str, Any] | None = None

    @property
    def verdict(self) -> str:
        verdicts = {r.verdict for r in self.results}
        return "fail" if "fail" in verdicts else "warn" if "warn" in verdicts else "pass"

    @property
    def records(self) -> int:
        return int(self.input["records"])

    @property
    def failing_records(self) -> int:
        """Records with at least one error-severity finding: the ones a gate would quarantine."""
        errors = self.findings.filter(pl.col("severity") == "error")
        return errors["line"].n_unique() if errors.height else 0

    def exit_code(self, *, fail_on_warning: bool = False) -> int:
        if self.verdict == "fail" or (fail_on_warning and self.verdict == "warn"):
            return EXIT_FAILED
        return EXIT_PASSED

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "audit", "version": __version__},
            "created_at": self.created_at,
            "target": self.target,
            "verdict": self.verdict,
            "input": self.input,
            "profile": self.profile,
            "tokenizer": self.tokenizer,
            "rule_set": self.rule_set,
            "seconds": round(self.seconds, 3),
            "summary": {
                "records": self.records,
                "records_with_errors": self.failing_records,
                "findings": self.findings.height,
            },
            "results": [r.to_json() for r in self.results],
            "findings": self.findings.to_dicts(),
            "distributions": self.distributions,
        }

    def write_json(self, path: Path) -> Path:
        """Write the JSON report atomically (temporary file, then rename)."""
        if path.is_dir():
            raise InputError(f"report path {path} is a directory; name a file, e.g. {path / 'report.json'}")
        return write_atomically(path, json.dumps(self.to_json(), ensure_ascii=False, indent=1) + "\n")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        """Rebuild a report from its JSON form (for `audit report`, `audit diff`)."""
        results = []
        for r in data["results"]:
            results.append(
                RuleResult(
                    code=r["code"],
                    name=r["name"],
                    severity=r["severity"],
                    summary=r.get("summary", ""),
                    failing=r["failing"],
                    records=data["input"]["records"],
                    warn_above=r.get("warn_above"),
                    fail_above=r.get("fail_above"),
                    threshold=_threshold_text(r.get("warn_above"), r.get("fail_above")),
                    verdict=r["verdict"],
                    example_lines=r.get("example_lines", []),
                )
            )
        findings = pl.DataFrame(data.get("findings", []), schema=FINDINGS_SCHEMA)
        return cls(
            target=data["target"],
            input=data["input"],
            profile=data["profile"],
            tokenizer=data["tokenizer"],
            rule_set=data["rule_set"],
            results=results,
            findings=findings,
            created_at=data["created_at"],
            seconds=data.get("seconds", 0.0),
            distributions=data.get("distributions"),
        )


def _threshold_text(warn: int | str | None, fail: int | str | None) -> str:
    parts = []
    if warn is not None:
        parts.append(f"warn >{warn}")
    if fail is not None:
        parts.append(f"fail >{fail}")
    return ", ".join(parts) or "never fails"


def build_report(
    target: str,
    audited: FileAudit,
    rule_set: RuleSet,
    *,
    profile: dict[str, Any],
    tokenizer: dict[str, Any],
) -> Report:
    """Count each rule's failing records and judge them against the rule set's thresholds."""
    results = []
    for configured in rule_set.rules:
        mine = audited.findings.filter(pl.col("rule") == configured.code)
        failing_lines = mine["line"].unique(maintain_order=True)
        failing = failing_lines.len()
        results.append(
            RuleResult(
                code=configured.code,
                name=configured.rule.name,
                severity=configured.severity.value,
                summary=configured.rule.summary(),
                failing=failing,
                records=audited.records,
                warn_above=configured.warn_above.to_json() if configured.warn_above else None,
                fail_above=configured.fail_above.to_json() if configured.fail_above else None,
                threshold=configured.threshold_text,
                verdict=configured.verdict(failing, audited.records),
                example_lines=failing_lines.head(EXAMPLE_LINES).to_list(),
            )
        )
    return Report(
        target=target,
        input={
            "path": str(audited.path),
            "sha256": audited.sha256,
            "bytes": audited.bytes,
            "lines": audited.lines,
            "records": audited.records,
            "output_tokens": audited.output_tokens,
        },
        profile=profile,
        tokenizer=tokenizer,
        rule_set={"path": str(rule_set.source), "sha256": rule_set.sha256},
        results=results,
        findings=audited.findings,
        seconds=audited.seconds,
        distributions=summarize(audited.stats),
    )

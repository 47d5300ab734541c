"""The report of a run: per-rule results, the verdict, and every finding, as data.

`Report.to_json()` is the machine contract (`schema_version`, changed only by addition);
`findings` is every finding as a polars frame of the same columns. Machine formats are
`audit.report.formats`; what people see is drawn by the CLI (`audit.cli.tables`) and the HTML page,
so this module knows nothing of terminals.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from audit import __version__
from audit.base.destinations import refuse_overlap
from audit.base.errors import InputError
from audit.base.storage import ObjectPath, location, write_output
from audit.checks.ruleset import RuleSet
from audit.checks.verdict import EXIT_ERROR, Verdict, threshold_text
from audit.engine.findings import FINDINGS_SCHEMA, FindingsLog
from audit.engine.isolation import InternalError
from audit.engine.runner import FileAudit
from audit.report.distributions import summarize
from audit.report.trainer_summary import trainer_summary

SCHEMA_VERSION = 1
EXAMPLE_LINES = 5


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
    # What a partition-level rule found (MIX001: the modes under their share), else None; such a
    # rule flags no record (`failing` 0) and its verdict comes from the detail.
    detail: str | None = None

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
            **({"detail": self.detail} if self.detail is not None else {}),
        }


# Findings encoded to JSON at a time: a block of short records may hold hundreds of thousands.
_JSON_ROWS = 16_384


@dataclass
class Report:
    """One audited input: what was read, with what, and what every rule concluded.

    The findings stay in their log (`audit.engine.findings`, mostly on disk); the counts a verdict
    needs are computed once when the report is built.
    """

    target: str
    input: dict[str, Any]
    profile: dict[str, Any]
    tokenizer: dict[str, Any]
    rule_set: dict[str, Any]
    results: list[RuleResult]
    log: FindingsLog
    created_at: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    seconds: float = 0.0
    # The partition's shape (audit.report.distributions.summarize), for plots; None in older reports.
    distributions: dict[str, Any] | None = None
    # Taken from the result cache (an identical earlier audit), not audited by this run.
    cached: bool = False
    # Records a rule raised on (audit.engine.isolation): each an ERR001 finding; the run exits 2.
    internal_errors: list[InternalError] = field(default_factory=list)
    # The trainer view's summary (`--trainer`: audit.report.trainer_summary), else None.
    trainer_view: dict[str, Any] | None = None

    @property
    def judgement(self) -> Verdict:
        """The verdict with the rules behind it (failed, warned), as every output states it."""
        return Verdict.of(self.results)

    @property
    def verdict(self) -> str:
        """pass, warn or fail: the worst verdict of any rule."""
        return self.judgement.value

    @property
    def records(self) -> int:
        return int(self.input["records"])

    @property
    def findings(self) -> pl.DataFrame:
        """Every finding in one frame, by line then rule (memory grows with the findings: the
        CLI streams them from `log` instead)."""
        return self.log.collect()

    @cached_property
    def failing_records(self) -> int:
        """Records with at least one error-severity finding: the ones a gate would quarantine."""
        return self.log.lines_with("error")

    @property
    def internal_error_records(self) -> int:
        """Records some rule raised on: each is quarantined, and the run exits 2."""
        return len({error.line for error in self.internal_errors})

    def exit_code(self, *, fail_on_warning: bool = False) -> int:
        """0 when the gate passed, 1 when it failed (warnings fail it under `fail_on_warning`),
        2 when a rule raised on some record (the tool broke: audit.engine.isolation)."""
        if self.internal_errors:
            return EXIT_ERROR
        return self.judgement.exit_code(fail_on_warning=fail_on_warning)

    def to_json(self) -> dict[str, Any]:
        """The report as one JSON value (every finding as a dict: for small reports; files and
        stdout get `json_chunks`, which streams them)."""
        return {**self._head(), "findings": self.findings.to_dicts(), "distributions": self.distributions}

    def _head(self) -> dict[str, Any]:
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
                "findings": self.log.height,
                "internal_error_records": self.internal_error_records,
            },
            "results": [r.to_json() for r in self.results],
            "internal_errors": [error.to_json() for error in self.internal_errors],
            # Only in a run with a trainer view: a report without one reads as before.
            **({"trainer_view": self.trainer_view} if self.trainer_view is not None else {}),
        }

    def json_chunks(self, *, indent: bool = True) -> Iterator[bytes]:
        """The JSON report as UTF-8 pieces, findings streamed from the log a part at a time.

        The same document as `to_json()`, key for key; memory holds one part of findings.
        """
        options = orjson.OPT_NON_STR_KEYS | (orjson.OPT_INDENT_2 if indent else 0)
        newline, pad = (b"\n", b" ") if indent else (b"", b"")
        head = orjson.dumps(self._head(), option=options)
        yield head[:-1].rstrip() + b"," + newline + pad + b'"findings": ['
        separator = b"," + newline + pad + pad
        first = True
        for part in self.log.batches():
            # Encoded by polars a slice at a time: the same objects as `to_json()`, key for key.
            for start in range(0, part.height, _JSON_ROWS):
                batch = part.slice(start, _JSON_ROWS)
                rows = batch.select(pl.struct(pl.all()).struct.json_encode()).to_series().to_list()
                yield (newline + pad + pad if first else separator) + separator.join(r.encode() for r in rows)
                first = False
        distributions = orjson.dumps(self.distributions, option=orjson.OPT_NON_STR_KEYS)
        yield newline + pad + b"]," + newline + pad + b'"distributions": ' + distributions + newline + b"}\n"

    def write_json(self, path: Path | ObjectPath) -> Path | ObjectPath:
        """Write the JSON report atomically (temporary file then rename, or one upload), findings
        streamed."""
        if path.is_dir():
            raise InputError(f"report path {path} is a directory; name a file, e.g. {path / 'report.json'}")
        refuse_overlap([("the report", path)], [("its input", self.input_location())])
        return write_output(path, self.json_chunks())

    def input_location(self) -> Path | ObjectPath:
        """The audited file, as a path (or a URL in object storage)."""
        return location(str(self.input["path"]))

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
                    threshold=threshold_text(r.get("warn_above"), r.get("fail_above")),
                    verdict=r["verdict"],
                    example_lines=r.get("example_lines", []),
                    detail=r.get("detail"),
                )
            )
        findings = FindingsLog.from_frame(pl.DataFrame(data.get("findings", []), schema=FINDINGS_SCHEMA))
        return cls(
            target=data["target"],
            input=data["input"],
            profile=data["profile"],
            tokenizer=data["tokenizer"],
            rule_set=data["rule_set"],
            results=results,
            log=findings,
            created_at=data["created_at"],
            seconds=data.get("seconds", 0.0),
            distributions=data.get("distributions"),
            internal_errors=[InternalError.from_json(e) for e in data.get("internal_errors", [])],
            trainer_view=data.get("trainer_view"),
        )


def build_report(
    target: str,
    audited: FileAudit,
    rule_set: RuleSet,
    *,
    profile: dict[str, Any],
    tokenizer: dict[str, Any],
    trainer: dict[str, Any] | None = None,
) -> Report:
    """Count each rule's failing records and judge them against the rule set's thresholds;
    with `trainer` (the run's trainer view), its summary too."""
    # Failing records and the first lines of each rule, counted a part of the log at a time.
    per_rule = audited.log.per_rule(EXAMPLE_LINES)
    distributions = summarize(audited.stats)
    results = []
    for configured in rule_set.rules:
        failing, example_lines = per_rule.get(configured.code, (0, []))
        detail = None
        verdict = configured.verdict(failing, audited.records)
        if configured.rule.partition_level:
            # Judged over the partition's counts: no record is at fault (failing stays 0); each
            # mode short of its share is a sentence, and the verdict counts them against the
            # rule's thresholds.
            short = configured.rule.check_partition(distributions["serving_mix"], rule_set.mix)
            verdict, detail = configured.verdict(len(short), audited.records), "; ".join(short) or None
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
                verdict=verdict,
                example_lines=list(example_lines),
                detail=detail,
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
        rule_set={
            "path": str(rule_set.source),
            "sha256": rule_set.sha256,
            **({"mix": rule_set.mix.to_json()} if rule_set.mix is not None else {}),
        },
        results=results,
        log=audited.log,
        seconds=audited.seconds,
        distributions=distributions,
        cached=audited.cached,
        internal_errors=audited.internal_errors,
        trainer_view=(
            None if trainer is None else trainer_summary(audited.log, rule_set, trainer, audited.stats.height)
        ),
    )

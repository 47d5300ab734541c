"""Machine output formats of reports, for CI: json, jsonl, junit, sarif, github.

Each writer takes one or more `Report`s and returns text; the CLI only chooses which one to
print. Nothing here knows of terminals (the rich tables live in `audit.cli.tables`).

Every machine format carries `schema_version` (`FORMAT_SCHEMA_VERSION`) where the format has
room for it, and changes only by addition:

    json    the report itself (`Report.to_json()`), one document per target
    jsonl   one finding per line, with the target and data file it belongs to
    junit   one <testsuite> per target, one <testcase> per rule; a failing rule is a <failure>
            whose message holds its failing count, rate and threshold
    sarif   SARIF 2.1.0, one run per target, one result per rule that has failing records,
            with at most `EXAMPLE_LOCATIONS` locations (data file + line)
    github  `::error file=...,line=...,title=...::message` workflow commands, one per rule
            (GitHub shows only ten annotations of a kind per step, so they are aggregated),
            and `step_summary()` for $GITHUB_STEP_SUMMARY
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import polars as pl

from audit import __version__
from audit.base import inert
from audit.checks.verdict import failing_verdicts
from audit.report.report import SCHEMA_VERSION, Report, RuleResult

FORMAT_SCHEMA_VERSION = SCHEMA_VERSION
EXAMPLE_LOCATIONS = 5
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_VERSION = "2.1.0"


class OutputFormat(StrEnum):
    """What `--format` accepts; `rich` is the human format, rendered by the CLI."""

    rich = "rich"
    json = "json"
    jsonl = "jsonl"
    junit = "junit"
    sarif = "sarif"
    github = "github"


def format_reports(reports: Sequence[Report], fmt: OutputFormat | str, *, fail_on_warning: bool = False) -> str:
    """`reports` in a machine format, as text that ends with a newline."""
    return b"".join(format_chunks(reports, fmt, fail_on_warning=fail_on_warning)).decode("utf-8")


def format_chunks(
    reports: Sequence[Report], fmt: OutputFormat | str, *, fail_on_warning: bool = False
) -> Iterator[bytes]:
    """`format_reports` as UTF-8 pieces: json and jsonl stream the findings, so memory does not
    follow them."""
    fmt = OutputFormat(fmt)
    if fmt is OutputFormat.json:
        for report in reports:
            yield from report.json_chunks(indent=False)
        return
    if fmt is OutputFormat.jsonl:
        yield from jsonl_chunks(reports)
        return
    yield _format_text(reports, fmt, fail_on_warning=fail_on_warning).encode("utf-8")


def _format_text(reports: Sequence[Report], fmt: OutputFormat, *, fail_on_warning: bool) -> str:
    if fmt is OutputFormat.junit:
        return render_junit(reports, fail_on_warning=fail_on_warning)
    if fmt is OutputFormat.sarif:
        return render_sarif(reports, fail_on_warning=fail_on_warning)
    if fmt is OutputFormat.github:
        return render_github(reports, fail_on_warning=fail_on_warning)
    raise ValueError(f"{fmt} is rendered by the CLI, not as text")


def jsonl_chunks(reports: Sequence[Report]) -> Iterator[bytes]:
    """One finding per line (schema_version, target, file, line, id, rule, severity, field,
    position, message), a part of the findings at a time."""
    for report in reports:
        data_file = report.input.get("path")
        head = pl.struct(
            pl.lit(FORMAT_SCHEMA_VERSION).alias("schema_version"),
            pl.lit(report.target).alias("target"),
            pl.lit(data_file, dtype=pl.String).alias("file"),
            pl.all(),
        )
        for batch in report.log.batches():
            rows = batch.select(head.struct.json_encode()).to_series().to_list()
            yield "".join(row + "\n" for row in rows).encode()


def rule_message(result: RuleResult, records: int) -> str:
    """One sentence a CI user reads: how many records fail, at what rate, against what threshold
    (a partition-level rule: what the partition lacks)."""
    if result.detail is not None:
        return f"{result.code} {result.name}: {result.detail}; verdict {result.verdict}"
    message = (
        f"{result.code} {result.name}: {result.failing} of {records} records "
        f"({result.rate:.2%}), threshold {result.threshold}, verdict {result.verdict}"
    )
    if result.example_lines:
        message += f"; first lines {', '.join(map(str, result.example_lines))}"
    if result.summary:
        message += f". {result.summary.rstrip('.')}."
    return message


# -- JUnit -----------------------------------------------------------------------------------


def render_junit(reports: Sequence[Report], *, fail_on_warning: bool = False) -> str:
    """JUnit XML: a testsuite per target, a testcase per rule, a failure per failing rule."""
    failing = failing_verdicts(fail_on_warning)
    suites = ET.Element("testsuites", name="audit")
    total_tests = total_failures = 0
    total_time = 0.0
    for report in reports:
        failures = len(report.judgement.failing_rules(fail_on_warning=fail_on_warning))
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=inert.xml(f"audit {report.target}"),
            tests=str(len(report.results)),
            failures=str(failures),
            errors="0",
            skipped="0",
            time=f"{report.seconds:.3f}",
            timestamp=inert.xml(report.created_at),
        )
        properties = ET.SubElement(suite, "properties")
        for name, value in (
            ("schema_version", FORMAT_SCHEMA_VERSION),
            ("tool_version", __version__),
            ("data_file", report.input.get("path")),
            ("data_sha256", report.input.get("sha256")),
            ("records", report.records),
            ("profile", report.profile.get("name")),
            ("verdict", report.verdict),
        ):
            ET.SubElement(properties, "property", name=name, value=inert.xml(value))
        for result in report.results:
            case = ET.SubElement(
                suite,
                "testcase",
                name=inert.xml(f"{result.code} {result.name}"),
                classname=inert.xml(f"audit.{report.target}"),
                file=inert.xml(report.input.get("path", "")),
                time="0",
            )
            message = inert.xml(rule_message(result, report.records))
            if result.verdict in failing:
                failure = ET.SubElement(
                    case, "failure", message=message, type=inert.xml(result.verdict)
                )
                failure.text = message
            elif result.failing:
                ET.SubElement(case, "system-out").text = message
        total_tests += len(report.results)
        total_failures += failures
        total_time += report.seconds
    suites.set("tests", str(total_tests))
    suites.set("failures", str(total_failures))
    suites.set("errors", "0")
    suites.set("time", f"{total_time:.3f}")
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


# -- SARIF -----------------------------------------------------------------------------------


def checkout_path(path: str | os.PathLike[str], outside: Callable[[Path], str] = str) -> str:
    """A data file's path as CI tools resolve it: relative to the working directory (the
    checkout) when under it, else `outside(the absolute path)`."""
    try:
        resolved = Path(path).resolve()
    except (OSError, ValueError):  # a hand-edited report's path may hold a NUL byte
        return str(path)
    try:
        return resolved.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return outside(resolved)


def artifact_uri(path: str | os.PathLike[str]) -> str:
    """A SARIF artifact URI: relative to the checkout when under it, else a file:// URI."""
    return checkout_path(path, Path.as_uri)


_SARIF_LEVEL = {"fail": "error", "warn": "warning", "pass": "note"}


def render_sarif(reports: Sequence[Report], *, fail_on_warning: bool = False) -> str:
    """SARIF 2.1.0 JSON: one run per target; one result per rule with failing records."""
    runs = []
    for report in reports:
        rules = [
            {
                "id": r.code,
                "name": r.name,
                "shortDescription": {"text": r.summary or r.name},
                # The project has no web page of its own: a rule's documentation is a command.
                "help": {"text": f"audit explain {r.code}"},
                "defaultConfiguration": {"level": "error" if r.severity == "error" else "warning"},
                "properties": {"severity": r.severity, "threshold": r.threshold},
            }
            for r in report.results
        ]
        uri = artifact_uri(report.input.get("path", report.target))
        results = []
        for index, result in enumerate(report.results):
            if not result.failing and result.detail is None:
                continue
            level = _SARIF_LEVEL[result.verdict]
            if fail_on_warning and result.verdict == "warn":
                level = "error"
            results.append(
                {
                    "ruleId": result.code,
                    "ruleIndex": index,
                    "level": level,
                    "message": {"text": rule_message(result, report.records)},
                    "locations": [
                        {
                            "physicalLocation": {
                                "artifactLocation": {"uri": uri},
                                "region": {"startLine": int(line)},
                            }
                        }
                        for line in result.example_lines[:EXAMPLE_LOCATIONS]
                    ],
                    "properties": {
                        "failing": result.failing,
                        "records": report.records,
                        "rate": round(result.rate, 6),
                        "verdict": result.verdict,
                    },
                }
            )
        runs.append(
            {
                "tool": {
                    "driver": {
                        "name": "audit",
                        "version": __version__,
                        "rules": rules,
                    }
                },
                "automationDetails": {"id": f"audit/{report.target}/"},
                "artifacts": [{"location": {"uri": uri}, "hashes": {"sha-256": report.input.get("sha256")}}],
                "results": results,
                "properties": {
                    "schema_version": FORMAT_SCHEMA_VERSION,
                    "target": report.target,
                    "verdict": report.verdict,
                    "records": report.records,
                },
            }
        )
    document = {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": runs}
    return json.dumps(document, ensure_ascii=False, indent=1) + "\n"


# -- GitHub Actions --------------------------------------------------------------------------


def render_github(reports: Sequence[Report], *, fail_on_warning: bool = False) -> str:
    """GitHub workflow commands: one annotation per rule with failing records, at its first
    failing line (the others are named in the message), then a `::notice` verdict per target."""
    failing = failing_verdicts(fail_on_warning)
    out = []
    for report in reports:
        file = inert.github_property(checkout_path(report.input.get("path", report.target)))
        for result in report.results:
            if not result.failing and result.detail is None:
                continue
            command = "error" if result.verdict in failing else "warning" if result.verdict == "warn" else "notice"
            title = inert.github_property(f"audit {report.target}: {result.code} {result.name}")
            message = inert.github_data(rule_message(result, report.records))
            # A partition-level rule's finding is about the file, at no line.
            at = f"line={int(result.example_lines[0]) if result.example_lines else 1}," if result.failing else ""
            out.append(f"::{command} file={file},{at}title={title}::{message}\n")
        fails = report.judgement.fails(fail_on_warning=fail_on_warning)
        verdict, command = ("failed", "error") if fails else ("passed", "notice")
        out.append(
            f"::{command} title={inert.github_property('audit ' + report.target)}::"
            + inert.github_data(
                f"gate {verdict}: {report.failing_records} of {report.records} records have errors "
                f"(verdict {report.verdict})"
            )
            + "\n"
        )
    return "".join(out)


def step_summary(reports: Sequence[Report], *, fail_on_warning: bool = False) -> str:
    """A markdown summary for $GITHUB_STEP_SUMMARY: one table across targets, one per target.

    Every value from a report goes through `inert.markdown`: a target or rule name is never
    a link, an image, HTML or a new table cell.
    """
    icon = {"pass": "✅", "warn": "⚠️", "fail": "❌"}
    md = inert.markdown
    parts = ["## audit\n", "| target | records | with errors | verdict | failed rules |", "|---|--:|--:|---|---|"]
    for report in reports:
        failed = ", ".join(report.judgement.failing_rules(fail_on_warning=fail_on_warning)) or "-"
        gated = report.judgement.gate(fail_on_warning=fail_on_warning)
        parts.append(
            f"| {md(report.target)} | {report.records} | {report.failing_records} | "
            f"{icon[gated]} {gated} | {md(failed)} |"
        )
    for report in reports:
        flagged = [r for r in report.results if r.failing]
        if not flagged:
            continue
        parts += ["", f"### {md(report.target)}", "",
                  "| rule | failing | rate | threshold | verdict | first lines |",
                  "|---|--:|--:|---|---|---|"]
        for r in flagged:
            lines = ", ".join(map(str, r.example_lines))
            parts.append(
                f"| {md(r.code)} {md(r.name)} | {r.failing} | {r.rate:.2%} | {md(r.threshold)} | "
                f"{icon[r.verdict]} {r.verdict} | {md(lines)} |"
            )
    return "\n".join(parts) + "\n"


def summary_rows(reports: Sequence[Report], *, fail_on_warning: bool = False) -> list[dict[str, Any]]:
    """One row per target for a cross-partition summary: records, errors, verdict, failed rules."""
    rows = []
    for r in reports:
        judgement = r.judgement
        rows.append(
            {
                "target": r.target,
                "records": r.records,
                "records_with_errors": r.failing_records,
                "verdict": judgement.gate(fail_on_warning=fail_on_warning),
                "failed": list(judgement.failing_rules(fail_on_warning=fail_on_warning)),
                "warned": [] if fail_on_warning else list(judgement.warned),
                "exit_code": judgement.exit_code(fail_on_warning=fail_on_warning),
            }
        )
    return rows

"""`audit check`: run the rule set over targets, print the verdict, write JSON reports."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from audit.cli.app import (
    DataRootOption,
    ExitZeroOption,
    FailOn,
    FailOnOption,
    ProfileOption,
    RulesOption,
    Targets,
    ThinkingOption,
    TokenizerOption,
    TrustOption,
    app,
    check_options,
    console,
    errors,
    fail,
)
from audit.errors import AuditError

DEFAULT_REPORTS_DIR = Path("reports")


class OutputFormat(StrEnum):
    rich = "rich"
    json = "json"


@app.command()
def check(
    targets: Targets,
    data_root: DataRootOption = None,
    profile: ProfileOption = None,
    tokenizer: TokenizerOption = None,
    trust_remote_code: TrustOption = False,
    thinking: ThinkingOption = None,
    rules: RulesOption = None,
    report: Annotated[
        Path | None, typer.Option("--report", help="Where to write the JSON report (one target only).")
    ] = None,
    reports_dir: Annotated[
        Path, typer.Option("--reports-dir", help="Directory for reports named <partition>-<UTC time>.json.")
    ] = DEFAULT_REPORTS_DIR,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", help="rich tables, or the JSON report on stdout.")
    ] = OutputFormat.rich,
    fail_on: FailOnOption = FailOn.error,
    exit_zero: ExitZeroOption = False,
) -> None:
    """Audit partitions of generated data; exit 0 (pass), 1 (gate failed) or 2 (error)."""
    from audit.check import check_target, prepare
    from audit.render import first_findings, report_table, verdict_line
    from audit.targets import data_root as resolve_root
    from audit.targets import resolve_target

    if report is not None and len(targets) > 1:
        raise fail("--report names one file; with several targets use --reports-dir")
    root, note = resolve_root(data_root)
    if note and output_format is OutputFormat.rich:
        errors.print(f"[dim]{note}[/]")
    options = check_options(profile, tokenizer, trust_remote_code, thinking, rules)
    worst = 0
    try:
        sessions = [prepare(resolve_target(spec, root), options) for spec in targets]
        for session in sessions:
            result = check_target(session)
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            path = report or reports_dir / f"{result.target}-{stamp}.json"
            result.write_json(path)
            if output_format is OutputFormat.json:
                json.dump(result.to_json(), sys.stdout, ensure_ascii=False)
                sys.stdout.write("\n")
            else:
                console.print(report_table(result))
                if (findings := first_findings(result)) is not None:
                    console.print(findings)
                console.print(verdict_line(result))
                console.print(f"[dim]report: {path}[/]", highlight=False)
            worst = max(worst, result.exit_code(fail_on_warning=fail_on is FailOn.warning))
    except AuditError as exc:
        raise fail(str(exc)) from None
    raise typer.Exit(0 if exit_zero else worst)

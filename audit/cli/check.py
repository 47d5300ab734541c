"""`audit check`: run the rule set over targets, print the verdict, write JSON reports.

Also home of what `check`, `gate` and `report` share: the `--format` option and `emit()`,
which prints reports in the chosen format (the writers themselves live in `audit.report.formats`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from audit.base.errors import AuditError, InputError
from audit.base.storage import AnyPath
from audit.cli.app import (
    EXIT_USAGE,
    DataRootOption,
    Engine,
    EngineOption,
    ExitZeroOption,
    FailOn,
    FailOnOption,
    JobsOption,
    NoCacheOption,
    ProfileOption,
    PromptsOption,
    RulesOption,
    ShardSizeOption,
    ThinkingOption,
    TokenizerOption,
    TrustOption,
    app,
    check_options,
    console,
    data_root_for,
    errors,
    fail,
    internal_errors_line,
    os_error,
    writing,
)
from audit.cli.progress import audit_progress
from audit.cli.tables import VERDICT_STYLE, plain
from audit.cli.trainer_options import (
    ReplyShapeOption,
    TrainerMaxLengthOption,
    TrainerOption,
    TrainerPythonOption,
    TrainerTimeoutOption,
    with_trainer,
)
from audit.report.formats import OutputFormat, format_chunks, step_summary, summary_rows
from audit.report.history import KEEP_REPORTS, dated_report_path, prune_reports
from audit.report.report import Report

DEFAULT_REPORTS_DIR = Path("reports")

FetchImagesOption = Annotated[
    bool,
    typer.Option(
        "--fetch-images",
        help="Fetch the images records name by http(s) URL, to check them (never fetched otherwise; no cache then).",
    ),
]

FormatOption = Annotated[
    OutputFormat,
    typer.Option(
        "--format",
        help="rich tables; json (the report); jsonl (one finding per line); junit; sarif (2.1.0); "
        "github (::error annotations, and a summary in $GITHUB_STEP_SUMMARY when set).",
    ),
]
OptionalTargets = Annotated[
    list[str] | None,
    typer.Argument(help="Partition names, partition directories or .jsonl files.", show_default=False),
]
HtmlOption = Annotated[
    str | None,
    typer.Option(
        "--html",
        metavar="FILE|URL",
        help="Also write a self-contained HTML page (verdict, plots, samples); with several targets, "
        "one page each, named FILE-<partition>.html. A path or an object storage URL.",
    ),
]
AllOption = Annotated[
    bool, typer.Option("--all", help="Every partition under the data root that has raw_responses.jsonl.")
]


def emit(
    reports: Sequence[Report],
    output_format: OutputFormat,
    *,
    fail_on_warning: bool,
    report_paths: Sequence[AnyPath] = (),
) -> None:
    """Print `reports` in `output_format`; rich prints per-report tables and, for several, a summary."""
    if output_format is not OutputFormat.rich:
        for chunk in format_chunks(reports, output_format, fail_on_warning=fail_on_warning):
            sys.stdout.write(chunk.decode("utf-8"))  # streamed: a million findings never sit in memory
        sys.stdout.flush()
        if output_format is OutputFormat.github and (summary := os.environ.get("GITHUB_STEP_SUMMARY")):
            try:
                with open(summary, "a", encoding="utf-8") as out:
                    out.write(step_summary(reports, fail_on_warning=fail_on_warning))
            except OSError as exc:
                problem = (
                    f"audit: could not append to $GITHUB_STEP_SUMMARY ({summary}): {exc.strerror}"
                )
                errors.print(plain(problem, limit=None), soft_wrap=True)
        return
    for index, report in enumerate(reports):
        path = report_paths[index] if index < len(report_paths) else None
        print_rich_report(report, path, fail_on_warning=fail_on_warning)
    if len(reports) > 1:
        console.print(summary_table(reports, fail_on_warning=fail_on_warning))


def print_rich_report(report: Report, path: AnyPath | None = None, *, fail_on_warning: bool = False) -> None:
    """The rule table, the first findings and the verdict line of one report."""
    from audit.cli.tables import first_findings, report_table, serving_mix_lines, verdict_line

    path = kept_file(path)

    console.print(report_table(report, console.width))
    if (findings := first_findings(report, report_path=path)) is not None:
        console.print(findings)
    for line in serving_mix_lines(report):
        console.print(line)
    console.print(verdict_line(report, fail_on_warning=fail_on_warning))
    if report.trainer_view is not None:
        console.print(plain(report.trainer_view["summary"], "bold", limit=None), soft_wrap=True)
    if isinstance(load := report.tokenizer.get("load"), dict) and load.get("warning"):
        console.print(plain(f"warning: {load['warning']}", "yellow", limit=None), soft_wrap=True)
    if path is not None:
        console.print(plain(f"report: {path}", "dim", limit=None), soft_wrap=True)


def kept_file(path: AnyPath | None) -> AnyPath | None:
    """`path`, where an output was kept; None for a device or FIFO it went through (`--report
    /dev/null`): there is no file to name."""
    if isinstance(path, Path):
        from audit.base.destinations import destination

        with contextlib.suppress(AuditError, OSError):
            if destination(path).through:
                return None
    return path


def explain_shipped_sample(target) -> None:
    """Say, on stderr, that a shipped sample fails on purpose and which one passes.

    Wrapped at word boundaries, a `quoted command` kept whole, so nothing breaks at the
    terminal's edge in the middle of a name or of the command to paste.
    """
    import re
    import textwrap

    from audit.flows.targets import shipped_sample_note

    if note := shipped_sample_note(target):
        whole = re.sub(r"`[^`]*`", lambda quoted: quoted.group().replace(" ", "\0"), note)
        for line in textwrap.wrap(whole, width=max(errors.width, 40), break_long_words=False):
            errors.print(plain(line.replace("\0", " "), "yellow", limit=None), soft_wrap=True)


def summary_table(reports: Sequence[Report], *, fail_on_warning: bool) -> Table:
    """One row per partition: records, records with errors, verdict, failed and warned rules."""
    table = Table(title=Text(f"summary · {len(reports)} partitions"), title_justify="left",
                  header_style="bold", box=box.SIMPLE_HEAD)
    for column in ("partition", "records", "with errors", "verdict", "failed", "warnings"):
        table.add_column(column, justify="right" if column in ("records", "with errors") else "left",
                         overflow="fold")
    for row in summary_rows(reports, fail_on_warning=fail_on_warning):
        table.add_row(
            plain(row["target"]), str(row["records"]), str(row["records_with_errors"]),
            Text(row["verdict"], style=VERDICT_STYLE[row["verdict"]]),
            plain(", ".join(row["failed"]) or "-"), plain(", ".join(row["warned"]) or "-"),
        )
    return table


def all_partitions(root) -> list[str]:
    """The names of every partition under `root` (a directory or URL prefix holding
    raw_responses.jsonl)."""
    from audit.flows.targets import DATA_FILE, partition_names

    if not root.is_dir():
        raise InputError(f"data root {root}/ does not exist: pass --data-root DIR or set AUDIT_DATA_ROOT")
    names = partition_names(root)
    if not names:
        raise InputError(f"no partitions under {root}/ (a partition is a directory holding {DATA_FILE})")
    return names


def _named_outputs(target, report: str | None, html: str | None, *, several: bool) -> list[tuple[str, AnyPath]]:
    """The files --report and --html name for `target` (a page each with several targets)."""
    from audit.base.storage import location

    named: list[tuple[str, AnyPath]] = []
    if report is not None:
        named.append(("--report", location(report)))
    if html is not None:
        from audit.report.html import html_path

        named.append(("--html", html_path(location(html), target.partition, several=several)))
    return named


def _dated_report(result: Report, directory: AnyPath, keep: int) -> AnyPath | None:
    """Save the report in `directory` under a dated name, pruning older ones; when it cannot be
    written, say so in one line and go on: the verdict and its exit code do not depend on a
    report nobody named (see docs/gating-and-ci.md)."""
    path = dated_report_path(directory, result.target)
    try:
        result.write_json(path)
    except (OSError, AuditError) as exc:
        reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
        problem = (
            f"audit: could not write the report {path} ({reason}); the verdict stands: "
            "pass --report FILE (or --reports-dir DIR) to keep it elsewhere, or --report none"
        )
        errors.print(plain(problem, "yellow", limit=None), soft_wrap=True)
        return None
    if isinstance(path, Path):  # an object store keeps its own
        prune_reports(path.parent, result.target, keep)
    return path


@app.command(short_help="Audit partitions; exit 0 pass, 1 gate failed, 2 error.")
def check(
    targets: OptionalTargets = None,
    all_: AllOption = False,
    data_root: DataRootOption = None,
    profile: ProfileOption = None,
    tokenizer: TokenizerOption = None,
    trust_remote_code: TrustOption = False,
    thinking: ThinkingOption = None,
    rules: RulesOption = None,
    prompts: PromptsOption = None,
    report: Annotated[
        str | None,
        typer.Option(
            "--report",
            metavar="FILE|URL|none",
            help="Where to write the JSON report (one target only): a path or a URL; none writes no report.",
        ),
    ] = None,
    reports_dir: Annotated[
        str,
        typer.Option(
            "--reports-dir",
            metavar="DIR|URL",
            help="Directory (or URL prefix) for reports named <partition>-<UTC time>.json.",
        ),
    ] = str(DEFAULT_REPORTS_DIR),
    keep_reports: Annotated[
        int,
        typer.Option(
            "--keep-reports",
            envvar="AUDIT_KEEP_REPORTS",
            min=0,
            metavar="N",
            help="Keep the newest N dated reports per partition in a local --reports-dir (0 keeps all).",
        ),
    ] = KEEP_REPORTS,
    output_format: FormatOption = OutputFormat.rich,
    html: HtmlOption = None,
    fail_on: FailOnOption = FailOn.error,
    exit_zero: ExitZeroOption = False,
    jobs: JobsOption = 1,
    engine: EngineOption = Engine.local,
    shard_size: ShardSizeOption = None,
    no_cache: NoCacheOption = False,
    fetch_images: FetchImagesOption = False,
    trainer: TrainerOption = None,
    trainer_max_length: TrainerMaxLengthOption = None,
    trainer_python: TrainerPythonOption = None,
    trainer_timeout: TrainerTimeoutOption = None,
    reply_shape: ReplyShapeOption = None,
) -> None:
    """Audit partitions of generated data; exit 0 (pass), 1 (gate failed) or 2 (error).

    With several targets (or --all), every target is prepared first: a configuration error in
    any of them exits 2 before anything is audited. Then each is audited in turn; the exit code
    is the worst of them.
    """
    from audit.base.storage import location
    from audit.flows.checking import check_session
    from audit.flows.output_paths import refuse_destructive_outputs
    from audit.flows.parallel import start_workers
    from audit.flows.session import prepare
    from audit.flows.targets import resolve_target

    targets = list(targets or [])
    if all_ and targets:
        raise fail("--all audits every partition under the data root; give no targets with it")
    if not all_ and not targets:
        raise fail("name a target (a partition, a partition directory or a .jsonl file), or pass --all")
    root = data_root_for(data_root, targets, announce=output_format is OutputFormat.rich)
    options = check_options(
        profile, tokenizer, trust_remote_code, thinking, rules, prompts, jobs=jobs, cache=not no_cache,
        engine=engine, shard_size=shard_size,
    )
    options = dataclasses.replace(options, fetch_images=fetch_images)
    options = with_trainer(options, trainer, trainer_max_length, reply_shape=reply_shape, python=trainer_python,
                           timeout=trainer_timeout)
    fail_on_warning = fail_on is FailOn.warning
    try:
        if all_:
            targets = all_partitions(root)
        no_report = report is not None and str(report) == "none"
        if report is not None and not no_report and len(targets) > 1:
            raise fail("--report names one file; with several targets use --reports-dir")
        if report is not None and not no_report and Path(report).is_dir():
            raise fail(
                f"--report {report} is a directory; name a file, pass --reports-dir {report} "
                "to keep the dated reports there, or --report none to write none"
            )
        resolved = [resolve_target(spec, root) for spec in targets]
        for target in resolved:
            refuse_destructive_outputs(
                target, files=_named_outputs(target, report if report and not no_report else None, html, several=len(resolved) > 1),
                inputs=[("the rule set", options.rules), ("--prompts", options.prompts)],
            )
        # --jobs: the workers start now and prepare the first target while this process does.
        start_workers(jobs, resolved[0] if resolved else None, options)
        sessions = [prepare(target, options) for target in resolved]
        if sessions and (read := sessions[0].prompt_summary) is not None and read.notable:
            for line in read.lines():  # what --prompts held: rows refused give TPL001 no source
                errors.print(plain(line, limit=None), soft_wrap=True)
        reports: list[Report] = []
        for session in sessions:
            with audit_progress(errors, session.target.partition, session.target.data_file) as progress:
                result = check_session(session, progress)
            path = None
            if report and not no_report:
                path = location(report)
                with writing("the report", path):
                    result.write_json(path)
            elif not no_report:
                path = _dated_report(result, location(reports_dir), keep_reports)
            reports.append(result)
            if output_format is OutputFormat.rich:
                # as each finishes: a long run shows progress
                print_rich_report(result, path, fail_on_warning=fail_on_warning)
                explain_shipped_sample(session.target)
            if html is not None:
                from audit.report.html import collect_samples, html_path, write_html

                samples = collect_samples(
                    result, session.tokenizer, profile=session.profile, data_file=session.target.data_file
                )
                page = html_path(location(html), result.target, several=len(sessions) > 1)
                with writing("the HTML page", page):
                    write_html(result, page, samples)
                if output_format is OutputFormat.rich and kept_file(page) is not None:
                    console.print(plain(f"html: {page}", "dim", limit=None), soft_wrap=True)
    except AuditError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:  # what the audit read (the writes above say so themselves)
        raise fail(os_error(exc)) from None
    if output_format is OutputFormat.rich:
        if len(reports) > 1:
            console.print(summary_table(reports, fail_on_warning=fail_on_warning))
    else:
        emit(reports, output_format, fail_on_warning=fail_on_warning)
    internal_errors_line([(r.target, r.internal_errors) for r in reports])  # the last line, when some rule raised on a record
    worst = max(r.exit_code(fail_on_warning=fail_on_warning) for r in reports)
    # --exit-zero forgives the data, never the tool: an internal error still exits 2.
    raise typer.Exit(0 if exit_zero and worst != EXIT_USAGE else worst)

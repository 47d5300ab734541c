"""`audit report` renders a saved report again; `audit diff` compares two of them."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from typing import Annotated, Literal

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from audit.base.errors import AuditError
from audit.base.inert import CELL_LIMIT, terminal
from audit.base.storage import AnyPath
from audit.cli.app import (
    FailOn,
    FailOnOption,
    TokenizerOption,
    TrustOption,
    app,
    console,
    errors,
    fail,
    os_error,
    writing,
)
from audit.cli.check import FormatOption, HtmlOption, emit, kept_file
from audit.cli.tables import plain
from audit.report.formats import OutputFormat

ReportFile = Annotated[
    str, typer.Argument(help="A JSON report written by `audit check` (or --report): a path or a URL.")
]


@app.command("report")
def report_command(
    files: Annotated[
        list[str], typer.Argument(help="JSON reports written by `audit check` (or --report): paths or URLs.")
    ],
    output_format: FormatOption = OutputFormat.rich,
    fail_on: FailOnOption = FailOn.error,
    html: HtmlOption = None,
    tokenizer: TokenizerOption = None,
    trust_remote_code: TrustOption = False,
) -> None:
    """Render saved reports again, in any --format. Exits 0 once rendered, 2 on an unreadable file.

    --html draws the page again; its samples come from the report's data file and tokenizer when
    both are still there and unchanged (checked by sha256), and are left out with a note otherwise.
    --tokenizer DIR names the tokenizer instead of the path the report records; it is required with
    --trust-remote-code, since a report is data and never chooses whose code runs.
    """
    from audit.base.destinations import refuse_overlap
    from audit.base.storage import location
    from audit.report.history import load_report

    if trust_remote_code and tokenizer is None:
        raise fail(
            "--trust-remote-code runs a tokenizer's own code: name that tokenizer with --tokenizer DIR "
            "(the path a report records is data, not your choice)"
        )
    pages: list[AnyPath] = []
    try:
        reports = [load_report(location(path)) for path in files]
        if html is not None:
            from audit.report.html import html_path, samples_for_saved_report, write_html

            for saved in reports:
                page = html_path(location(html), saved.target, several=len(reports) > 1)
                refuse_overlap([("--html", page)], [("the report", location(path)) for path in files])
                samples = samples_for_saved_report(saved, tokenizer=tokenizer, trust_remote_code=trust_remote_code)
                with writing("the HTML page", page):
                    write_html(saved, page, samples)
                pages.append(page)
    except AuditError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:  # what the samples read
        raise fail(os_error(exc)) from None
    emit(reports, output_format, fail_on_warning=fail_on is FailOn.warning, report_paths=[location(path) for path in files])
    for page in pages:  # where the pages went; on stderr when stdout carries a machine format
        where = console if output_format is OutputFormat.rich else errors
        if kept_file(page) is not None:  # not a device it went through (--html /dev/null)
            where.print(plain(f"html: {page}", "dim", limit=None), soft_wrap=True)


class DiffFormat(StrEnum):
    rich = "rich"
    json = "json"


def _shown(value: object) -> str:
    return terminal(value, CELL_LIMIT)


_STYLE = {"worse": "bold red", "better": "green", "same": "dim", "added": "cyan", "removed": "dim"}


@app.command()
def diff(
    old: ReportFile,
    new: ReportFile,
    output_format: Annotated[DiffFormat, typer.Option("--format", help="rich table or JSON.")] = DiffFormat.rich,
    fail_on: FailOnOption = FailOn.error,
) -> None:
    """Show how each rule's failing rate moved from OLD to NEW.

    Exit 1 when a rule regressed: in NEW it fails the gate and it is worse than in OLD (its
    verdict rose, or it failed both times at a higher rate). Exit 0 otherwise, 2 when a file
    cannot be read as a report.
    """
    from audit.base.storage import location
    from audit.report.history import diff_reports, load_report

    try:
        before, after = load_report(location(old)), load_report(location(new))
    except AuditError as exc:
        raise fail(str(exc)) from None
    compared = diff_reports(before, after, fail_on_warning=fail_on is FailOn.warning)
    if output_format is DiffFormat.json:
        sys.stdout.write(json.dumps(compared.to_json(), ensure_ascii=False) + "\n")
        raise typer.Exit(compared.exit_code)

    def side(report) -> str:
        return f"{_shown(report.target)} ({_shown(report.created_at)}, {report.records} records)"

    title = Text(f"audit diff  ·  {side(before)}  ->  {side(after)}")
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    for column in ("code", "old", "new", "Δ rate", "verdict", "threshold", "change"):
        justify: Literal["left", "right"] = "right" if column in ("old", "new", "Δ rate") else "left"
        table.add_column(column, justify=justify, no_wrap=column != "threshold", overflow="fold")
    for move in compared.moves:
        old_side, new_side = move.old, move.new
        cells = ["-" if side is None else f"{side.failing} ({side.rate:.2%})" for side in (old_side, new_side)]
        delta = (new_side.rate if new_side else 0.0) - (old_side.rate if old_side else 0.0)
        verdicts = f"{old_side.verdict if old_side else '-'} → {new_side.verdict if new_side else '-'}"
        change = move.change + (" · regressed" if move.regressed else "")
        style = "bold red" if move.regressed else _STYLE[move.change]
        table.add_row(
            plain(move.code), *cells, f"{delta:+.2%}", verdicts,
            plain(either.threshold if (either := new_side or old_side) is not None else ""), Text(change, style=style),
        )
    console.print(table)
    if before.target != after.target:
        note = (
            f"note: comparing different targets ({_shown(before.target)} "
            f"and {_shown(after.target)})"
        )
        console.print(Text(note, style="yellow"))
    if compared.regressions:  # wrapped at the commas: no code split at the terminal's edge
        regressed = Text("REGRESSED ", style="bold red")
        regressed.append_text(plain(", ".join(m.code for m in compared.regressions), limit=None))
        console.print(regressed)
    else:
        console.print(Text("no rule regressed", style="green"))
    raise typer.Exit(compared.exit_code)

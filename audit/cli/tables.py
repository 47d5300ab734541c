"""What people read in a terminal: rich tables of reports, rules and profiles, and untrusted text
made plain (`plain`). Presentation: the core never imports it."""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from audit import inert
from audit.checks import RULES, Rule
from audit.checks.base import DOC_SECTIONS
from audit.report import Report

VERDICT_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}
SEVERITY_STYLE = {"error": "red", "warning": "yellow"}
# A finding's message may quote decoded text from the record; the table shows its start.
FINDING_MESSAGE_LIMIT = 500


def plain(value: object, style: str = "", limit: int | None = inert.CELL_LIMIT) -> Text:
    """Untrusted text (data, a saved report, a server's answer) as rich text that is only text.

    A `str` given to rich is parsed as markup (`[/]` crashes, `[link=...]` makes a link);
    a `Text` is not. Control bytes, bidi overrides and lone surrogates are shown escaped
    (`audit.inert.terminal`), and a value longer than `limit` is cut.
    """
    return Text(inert.terminal(value, limit), style=style)


def report_table(report: Report) -> Table:
    """One row per rule: code, name, severity, failing records, rate, threshold, verdict, lines."""
    target = inert.terminal(report.target, inert.CELL_LIMIT)
    profile = inert.terminal(report.profile.get("name"), inert.CELL_LIMIT)
    title = Text(f"audit check {target}  ·  {report.records} records  ·  profile {profile}")
    table = Table(
        title=title,
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
    )
    # Nothing is ever cut: at 100 columns every name fits whole, narrower the cells wrap.
    table.add_column("code", no_wrap=True)
    table.add_column("rule", overflow="fold")
    table.add_column("severity", no_wrap=True)
    table.add_column("failing", justify="right", no_wrap=True)
    table.add_column("threshold", overflow="fold", min_width=9)
    table.add_column("verdict", no_wrap=True)
    table.add_column("lines", overflow="fold", min_width=8)
    for result in report.results:
        quiet = result.failing == 0
        table.add_row(
            plain(result.code, "" if quiet else SEVERITY_STYLE.get(result.severity, "")),
            plain(result.name),
            plain(result.severity),
            f"{result.failing} ({result.rate:.1%})" if result.failing else "0",
            plain(result.threshold),
            Text(result.verdict, style=VERDICT_STYLE[result.verdict]),
            ", ".join(map(str, result.example_lines)),
            style="dim" if quiet else None,
        )
    return table


def verdict_line(report: Report, *, fail_on_warning: bool = False) -> Text:
    """The one-line verdict: pass, warn or fail, how many records have errors, which rules.

    It says what the exit code says: under `--fail-on warning` a warned rule fails the gate,
    and the line reads FAIL with that rule among the failed ones.
    """
    judgement = report.judgement
    failed = judgement.failing_rules(fail_on_warning=fail_on_warning)
    warned = () if fail_on_warning else judgement.warned
    verdict = judgement.gate(fail_on_warning=fail_on_warning)
    text = Text()
    text.append(f"{verdict.upper()} ", style=VERDICT_STYLE[verdict])
    text.append(
        f"{inert.terminal(report.target, inert.CELL_LIMIT)}: "
        f"{report.failing_records} of {report.records} records have errors"
    )
    if failed:
        text.append(f"; failed: {inert.terminal(', '.join(failed), inert.CELL_LIMIT)}", style="red")
    if warned:
        warnings = inert.terminal(", ".join(warned), inert.CELL_LIMIT)
        text.append(f"; warnings: {warnings}", style="yellow")
    if fail_on_warning and judgement.warned:
        text.append(" (--fail-on warning)", style="red")
    if report.cached:
        text.append(f"  (cached: an identical earlier audit; --no-cache audits again, {report.seconds:.2f}s)",
                    style="dim")
    else:
        text.append(f"  ({report.seconds:.2f}s)", style="dim")
    return text


def first_findings(report: Report, limit: int = 8, *, report_path: object = None) -> Table | None:
    """The first few findings, so the table's numbers point at something concrete, and how many
    more there are and where to see them (the saved report, `audit inspect`)."""
    shown = report.log.head(limit)
    if shown.is_empty():
        return None
    more = report.log.height - shown.height
    caption = None
    if more > 0:
        where = f"audit report {report_path}" if report_path is not None else "the JSON report"
        target = inert.terminal(report.target, inert.CELL_LIMIT)
        caption = Text(
            f"and {more} more: see {inert.terminal(where, None)}, or audit inspect {target}",
            style="dim",
        )
    table = Table(title="first findings", title_justify="left", header_style="bold", show_lines=False,
                  caption=caption, caption_justify="left")
    # Lines, codes and positions never break inside; ids and messages wrap when they must.
    for column in ("line", "id", "rule", "position", "message"):
        table.add_column(column, overflow="fold", no_wrap=column in ("line", "rule", "position"))
    for row in shown.iter_rows(named=True):
        position = "" if row["position"] is None else f"{row['field']}[{row['position']}]"
        table.add_row(
            str(row["line"]),
            plain(row["id"] or ""),
            plain(row["rule"], SEVERITY_STYLE.get(row["severity"], "")),
            plain(position),
            plain(row["message"] or "", limit=FINDING_MESSAGE_LIMIT),
        )
    return table


def rules_table() -> Table:
    """Every registered rule: code, name, default severity and one-line summary."""
    table = Table(title="rules", title_justify="left", header_style="bold")
    for column in ("code", "name", "severity", "summary"):
        table.add_column(column, no_wrap=column != "summary")
    for code, rule in RULES.items():
        table.add_row(
            plain(code),
            plain(rule.name),
            Text(rule.severity.value, style=SEVERITY_STYLE[rule.severity.value]),
            plain(rule.summary(), limit=None),
        )
    return table


def _reflow(text: str) -> str:
    """Join the hard-wrapped lines of each paragraph so the terminal wraps them."""
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))


def rule_panel(rule: type[Rule]) -> Panel:
    """A rule's documentation, section by section, with its parameters (`audit explain CODE`)."""
    docs = rule.docs()
    parts: list = [Text(rule.summary(), style="bold")]
    for section in DOC_SECTIONS:
        if section in docs:
            parts.append(Text(f"\n{section}", style="bold cyan"))
            body = docs[section] if section == "Example" else _reflow(docs[section])
            parts.append(Text(body, style="green" if section == "Example" else ""))
    if rule.parameters:
        parts.append(Text(f"\nParameters (set under [rules.{rule.code}])", style="bold cyan"))
        parts.append(Text("\n".join(f"{k} = {v.describe()}" for k, v in rule.parameters.items())))
    return Panel(
        Group(*parts),
        title=Text(f"{rule.code} {rule.name}  ·  default severity {rule.severity.value}"),
        title_align="left",
    )


def profiles_table(profiles: list, tokenizer=None, thinking: bool = True) -> Table:
    """Built-in profiles, and with a tokenizer the ids each resolves to (or why it does not fit)."""
    from audit.errors import AuditError

    table = Table(title="profiles", title_justify="left", header_style="bold")
    for column in ("name", "description", "generation suffix", "resolved"):
        table.add_column(column, overflow="fold")
    mode = "thinking" if thinking else "no_thinking"
    for profile in profiles:
        suffix = " | ".join(profile.prompt_suffixes.get(mode, ("-",)))
        resolved = "-"
        if tokenizer is not None:
            try:
                r = profile.resolve(tokenizer, thinking=thinking)
                resolved = (
                    f"think {r.think_start}/{r.think_end}, end of turn {list(r.end_of_turn)}, "
                    f"suffix {[list(s) for s in r.prompt_suffixes]}, reasoning {r.reasoning}"
                    + (f", tool markers {r.tool_markers}" if r.tool_markers else "")
                )
            except AuditError as exc:
                resolved = f"does not fit: {exc}"
        table.add_row(
            plain(profile.name),
            plain(profile.description, limit=None),
            plain(suffix),
            plain(resolved, limit=None),
        )
    return table

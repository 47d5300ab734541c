"""What people read in a terminal: rich tables of reports, rules and profiles, and untrusted text
made plain (`plain`). Presentation: the core never imports it."""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from audit.base import inert
from audit.checks import RULES, Rule
from audit.checks.base import DOC_SECTIONS
from audit.model.tokens.token_text import token_pieces
from audit.report.report import Report, RuleResult

VERDICT_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}
SEVERITY_STYLE = {"error": "red", "warning": "yellow"}
# A finding's message may quote decoded text from the record; the table shows its start.
FINDING_MESSAGE_LIMIT = 500


def plain(value: object, style: str = "", limit: int | None = inert.CELL_LIMIT) -> Text:
    """Untrusted text (data, a saved report, a server's answer) as rich text that is only text.

    A `str` given to rich is parsed as markup (`[/]` crashes, `[link=...]` makes a link);
    a `Text` is not. Control bytes, bidi overrides and lone surrogates are shown escaped
    (`audit.base.inert.terminal`), and a value longer than `limit` is cut.
    """
    return Text(inert.terminal(value, limit), style=style)


def report_table(report: Report, width: int | None = None) -> Table:
    """One row per rule: code, name, severity, failing records, rate, threshold, verdict, lines.

    `width`: the terminal's; when the table is wider, a two-part threshold takes two lines and
    the example lines wrap, so that every column keeps its room and nothing is cut down to 80.
    """
    target = inert.terminal(report.target, inert.CELL_LIMIT)
    profile = inert.terminal(report.profile.get("name"), inert.CELL_LIMIT)
    title = Text(f"audit check {target}  ·  {report.records} records  ·  profile {profile}")
    # Nothing is ever cut. At its natural width the table fits 100 columns; narrower, the
    # rule names keep theirs and a two-part threshold takes two lines, example lines wrap.
    rows = [
        (
            result,
            _failing(result),
            ", ".join(map(str, result.example_lines)),
        )
        for result in report.results
    ]
    natural = {
        "code": max((len(r.code) for r in report.results), default=4),
        "rule": max((len(r.name) for r in report.results), default=4),
        "severity": 8,
        "failing": max((len(f) for _, f, _ in rows), default=7),
        "threshold": max((len(r.threshold) for r in report.results), default=9),
        "verdict": 7,
        "lines": max((len(lines) for _, _, lines in rows), default=5),
    }
    natural = {name: max(width, len(name)) for name, width in natural.items()}  # the header's too
    gaps = 2 * (len(natural) - 1)
    narrow = width is not None and sum(natural.values()) + gaps > width
    fixed: dict[str, int | None] = {name: None for name in natural}
    if narrow:
        gaps = len(natural) - 1  # one space between columns
        parts = [part for r in report.results for part in r.threshold.split(", ")]
        threshold_width = max(9, *(len(p) for p in parts)) if parts else 9
        fixed["threshold"] = threshold_width
        others = sum(v for k, v in natural.items() if k != "lines") - natural["threshold"] + threshold_width
        fixed["lines"] = max(3, (width or 0) - others - gaps)
    table = Table(
        title=title,
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        padding=(0, 0 if narrow else 1, 0, 0),  # and the box's blank divider between columns
        pad_edge=False,
        show_edge=False,
    )
    table.add_column("code", no_wrap=True)
    table.add_column("rule", overflow="fold", min_width=natural["rule"])
    table.add_column("severity", no_wrap=True)
    table.add_column("failing", justify="right", no_wrap=True)
    table.add_column("threshold", overflow="fold", width=fixed["threshold"])
    table.add_column("verdict", no_wrap=True)
    table.add_column("lines", overflow="fold", width=fixed["lines"])
    for result, failing, lines in rows:
        quiet = result.failing == 0 and result.verdict == "pass"
        threshold = plain(result.threshold)
        if narrow:
            threshold = Text("\n").join(plain(part) for part in result.threshold.split(", "))
        table.add_row(
            plain(result.code, "" if quiet else SEVERITY_STYLE.get(result.severity, "")),
            plain(result.name),
            plain(result.severity),
            failing,
            threshold,
            Text(result.verdict, style=VERDICT_STYLE[result.verdict]),
            lines,
            style="dim" if quiet else None,
        )
    return table


def _failing(result: RuleResult) -> str:
    """Failing records and their rate; a partition-level rule's findings are modes, not records."""
    if result.detail is not None:
        modes = len(result.detail.split("; "))
        return f"{modes} mode{'s' if modes > 1 else ''}"
    if not result.failing:
        return "0"
    return f"{result.failing} ({result.rate:.1%})"


def serving_mix_lines(report: Report) -> list[Text]:
    """The modes the records show (thinking on/off, tool calls), then each mode a rule set's
    `[mix]` asks for and the partition lacks (MIX001's detail)."""
    mix = (report.distributions or {}).get("serving_mix")
    if not mix or not mix["records"]:
        return []
    parts = []
    for key, label in (("thinking_on", "thinking on"), ("thinking_off", "thinking off")):
        if mix["thinking_known"]:
            parts.append(f"{label} {mix[key]} ({mix[key] / mix['thinking_known']:.0%})")
    parts.append(f"tool calls {mix['tool_calls']} ({mix['tool_calls'] / mix['records']:.0%})")
    declared = report.rule_set.get("mix")
    text = Text("serving mix: " + ", ".join(parts), style="dim")
    if not declared:
        text.append("  (no [mix] declared in the rule set)", style="dim")
    lines = [text]
    for result in report.results:
        if result.detail is not None:
            lines.append(plain(f"{result.code} {result.name}: {result.detail}", VERDICT_STYLE[result.verdict], limit=None))
    return lines


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
        where = f"audit report {inert.terminal(report_path, None)}, or " if report_path is not None else ""
        target = inert.terminal(report.target, inert.CELL_LIMIT)
        caption = Text(f"and {more} more: see {where}audit inspect {target}", style="dim")
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


def escaped(text: str) -> Text:
    """Text whose newlines and tabs must be seen: `\\n` and `\\t` as Python writes them
    (GLM's two generation prompts differ only by a trailing newline)."""
    shown = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return plain(shown, limit=None)


def _suffixes(texts: tuple[str, ...] | list[str]) -> Text:
    """Each generation-prompt ending on its own line, escapes shown."""
    out = Text()
    for k, text in enumerate(texts or ("-",)):
        if k:
            out.append("\n")
        out.append_text(escaped(text))
    return out


def resolved_table(resolved, tokenizer) -> Table:
    """What a profile resolves to in a tokenizer: one row per token, its text and its id."""
    title = Text(f"{resolved.name}: token -> id in {inert.terminal(tokenizer.directory, None)}")
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    table.add_column("role", no_wrap=True)
    table.add_column("token", overflow="fold")
    table.add_column("id", justify="right", overflow="fold")
    rows: list[tuple[str, int | None]] = [("think start", resolved.think_start), ("think end", resolved.think_end)]
    rows += [("end of turn", i) for i in resolved.end_of_turn]
    rows += [("eos", i) for i in resolved.eos]
    rows += [(f"tool {role.replace('_', ' ')}", i) for role, i in resolved.tool_markers.items()]
    rows += [(f"channel {role}", i) for role, i in resolved.channel_markers.items()]
    rows += [("tool result", i) for i in resolved.tool_result]
    shown = [(role, i) for role, i in rows if i is not None]
    pieces = token_pieces(tokenizer, [i for _, i in shown])
    for (role, token_id), piece in zip(shown, pieces, strict=True):
        table.add_row(role, escaped(piece), str(token_id))
    for text, ids in zip(resolved.prompt_suffix_texts, resolved.prompt_suffixes, strict=False):
        table.add_row("prompt ends", escaped(text), " ".join(map(str, ids)))
    reasoning = "/".join(dict.fromkeys(resolved.suffix_reasoning or (resolved.reasoning,)))
    table.add_row("reasoning", reasoning, "")
    return table


def profiles_table(
    profiles: list, tokenizer=None, thinking: bool = True, width: int | None = None
) -> Group:
    """Built-in profiles: how each one's generation prompt ends (escapes shown); with a
    tokenizer, whether each fits it, and for each that does a table of token -> id.

    From 100 columns (`width`) each prompt ending has a line to itself: folded, `<|im_middle|>`
    or a `\\n` would break across lines and read as something else.
    """
    from audit.base.errors import AuditError

    table = Table(title="profiles", title_justify="left", header_style="bold", show_lines=True)
    mode = "thinking" if thinking else "no_thinking"
    endings = [text for p in profiles for text in p.prompt_suffixes.get(mode, ())]
    endings += [c.suffix for p in profiles for c in p.continuations if mode in c.modes]
    longest = max((escaped(text).cell_len for text in endings), default=0)
    columns = ["name", "description", "generation prompt ends"] + (["tokenizer"] if tokenizer else [])
    # The columns of prose share what the name and the endings leave (rich's own sharing
    # can crop the table instead: its borders and padding are 3 cells a column, plus 1).
    whole = width is not None and width >= 100
    prose = None
    if width is not None and whole:
        names = max((len(p.name) for p in profiles), default=4)
        prose = (width - 3 * len(columns) - 1 - names - longest) // (len(columns) - 2)
    for column in columns:
        table.add_column(
            column,
            overflow="fold",
            no_wrap=column == "name",
            min_width=longest if whole and column == "generation prompt ends" else None,
            max_width=prose if column in ("description", "tokenizer") else None,
        )
    resolved_tables = []
    for profile in profiles:
        ends = _suffixes(profile.prompt_suffixes.get(mode, ()))
        for c in profile.continuations:
            if mode in c.modes:  # the label on a line of its own: the ending keeps one line whole
                label = {None: "after a tool result", "no_thinking": "rendered with thinking off"}.get(
                    c.rendered, "rendered with thinking on"
                )
                ends.append(f"\n{label} ({c.reasoning}):\n")
                ends.append_text(escaped(c.suffix))
        row: list = [plain(profile.name), plain(profile.description, limit=None), ends]
        if tokenizer is not None:
            try:
                resolved_tables.append(resolved_table(profile.resolve(tokenizer, thinking=thinking), tokenizer))
                row.append(Text("fits: ids below", style="green"))
            except AuditError as exc:
                reason = str(exc).split("): ", 1)[-1]  # the profile is named in its row already
                row.append(plain(f"does not fit: {reason}", "dim", limit=None))
        table.add_row(*row)
    return Group(table, *resolved_tables)

"""`audit inspect`: the records with findings, token by token, in a terminal viewer or printed."""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from enum import StrEnum
from typing import Annotated

import typer

from audit.base.errors import AuditError
from audit.cli.app import (
    DataRootOption,
    ProfileOption,
    RulesOption,
    ThinkingOption,
    TokenizerOption,
    TrustOption,
    app,
    check_options,
    console,
    data_root_for,
    errors,
    fail,
)
from audit.cli.tables import plain

JSON_SCHEMA_VERSION = 1


class InspectFormat(StrEnum):
    rich = "rich"
    json = "json"


@app.command("inspect", short_help="Look at the records with findings, token by token.")
def inspect_command(
    target: Annotated[str, typer.Argument(help="A partition name, partition directory or .jsonl file.")],
    rule: Annotated[
        str | None,
        typer.Option(
            "--rule", metavar="CODE", help="Only records broken by this rule (a code, e.g. SEG001)."
        ),
    ] = None,
    record_id: Annotated[
        str | None,
        typer.Option("--id", metavar="ID", help="Start at (or print) the record with this id."),
    ] = None,
    line: Annotated[
        int | None, typer.Option("--line", min=1, help="Start at (or print) the record on this line.")
    ] = None,
    print_: Annotated[
        bool, typer.Option("--print", help="Print the detail instead of opening the viewer (default when piped).")
    ] = False,
    output_format: Annotated[
        InspectFormat, typer.Option("--format", help="With --print: rich text, or JSON for tools.")
    ] = InspectFormat.rich,
    limit: Annotated[
        int, typer.Option("--limit", min=1, help="With --print: at most this many records.")
    ] = 10,
    prompt_tail: Annotated[
        int, typer.Option("--prompt-tail", min=0, help="Prompt tokens shown before the output.")
    ] = 16,
    all_tokens: Annotated[
        bool,
        typer.Option(
            "--all-tokens",
            help="Every token of each record; by default a long record shows its output's ends and "
            "a window around each finding.",
        ),
    ] = False,
    data_root: DataRootOption = None,
    profile: ProfileOption = None,
    tokenizer: TokenizerOption = None,
    trust_remote_code: TrustOption = False,
    thinking: ThinkingOption = None,
    rules: RulesOption = None,
) -> None:
    """Look at the records with findings token by token: special tokens by role, findings marked."""
    from audit.checks import RULES
    from audit.flows.checking import check_session
    from audit.flows.session import prepare
    from audit.flows.targets import resolve_target
    from audit.flows.token_view import Inspector

    if record_id is not None and line is not None:
        raise fail("--id and --line both pick a record: give one of them")
    if rule is not None:
        rule = rule.strip().upper()
        if rule not in RULES:
            raise fail(f"no rule {rule!r}: `audit rules` lists them")
    interactive = not print_ and output_format is InspectFormat.rich and sys.stdout.isatty()
    root = data_root_for(data_root, [target], announce=output_format is InspectFormat.rich)
    try:
        session = prepare(resolve_target(target, root), check_options(profile, tokenizer, trust_remote_code, thinking, rules))
        auditing = plain(f"auditing {session.target.data_file}…", limit=None)
        with errors.status(auditing, spinner="dots") if interactive else nullcontext():
            report = check_session(session)
    except AuditError as exc:
        raise fail(str(exc)) from None

    inspector = Inspector(
        session.target.data_file,
        report.findings,
        session.profile,
        session.tokenizer,
        prompt_tail=prompt_tail,
        all_tokens=all_tokens,
        rules={configured.code: configured.rule for configured in session.rule_set.rules},
    )
    if not inspector.entries and record_id is None and line is None:
        message = f"no findings in {report.target}: all {report.records} records pass every rule"
        if output_format is InspectFormat.json:
            _dump_json(report.target, inspector, [])
        else:
            console.print(plain(message, "green", limit=None), soft_wrap=True)
        raise typer.Exit(0)

    start_line = _start_line(inspector, record_id, line)
    entries = inspector.select(rule)
    if rule is not None and not entries:
        raise fail(f"no record breaks {rule} in {report.target} (rules with findings: {', '.join(inspector.rules)})")

    if interactive:
        from audit.tui.app import InspectApp

        InspectApp(inspector, title=report.target, rule=rule, start_line=start_line).run()
        raise typer.Exit(0)

    lines = [start_line] if start_line is not None else [e.line for e in entries[:limit]]
    if output_format is InspectFormat.json:
        _dump_json(report.target, inspector, lines)
    else:
        _print_rich(report.target, inspector, lines)
        left = len(entries) - len(lines) if start_line is None else 0
        if left > 0:
            console.print(
                f"[dim]{left} more records with findings: narrow with --rule/--id/--line or raise --limit[/]",
                highlight=False,
            )
    raise typer.Exit(0)


def _start_line(inspector, record_id: str | None, line: int | None) -> int | None:
    """The line --id or --line names, checked against the file."""
    if record_id is not None:
        found = inspector.line_of_id(record_id)
        if found is None:
            known = ", ".join(str(e.id) for e in inspector.entries[:8] if e.id is not None)
            some = f" (some with findings: {known})" if known else ""
            raise fail(f"no record in {inspector.data_file} has id {record_id!r}{some}")
        return found
    if line is not None and line > inspector.lines:
        raise fail(f"line {line} is past the end of {inspector.data_file} ({inspector.lines} lines)")
    return line


def _print_rich(target: str, inspector, lines: list[int]) -> None:
    from audit.tui.detail import DetailLines

    for number, line in enumerate(lines):
        if number:
            console.print()
        for text in DetailLines(inspector.view(line), title=target):
            console.print(text, soft_wrap=True, highlight=False)


def _dump_json(target: str, inspector, lines: list[int]) -> None:
    document = {
        "schema_version": JSON_SCHEMA_VERSION,
        "target": target,
        "data_file": str(inspector.data_file),
        "profile": inspector.profile.to_dict(),
        "records": [inspector.view(line).to_json() for line in lines],
    }
    json.dump(document, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")


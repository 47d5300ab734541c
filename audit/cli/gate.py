"""`audit gate`: audit one target and split it into clean.jsonl and quarantine.jsonl."""

from __future__ import annotations

import dataclasses
from enum import StrEnum
from typing import Annotated

import typer
from rich.text import Text

from audit.base.errors import AuditError
from audit.base.inert import terminal
from audit.cli.app import (
    EXIT_USAGE,
    DataRootOption,
    Engine,
    EngineOption,
    ExitZeroOption,
    FailOn,
    FailOnOption,
    NoCacheOption,
    ProfileOption,
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
from audit.cli.check import FetchImagesOption, FormatOption, emit, explain_shipped_sample
from audit.report.formats import OutputFormat


class QuarantineOn(StrEnum):
    error = "error"
    warning = "warning"


@app.command(short_help="Split a target into clean.jsonl and quarantine.jsonl.")
def gate(
    target: Annotated[str, typer.Argument(help="A partition name, partition directory or .jsonl file.")],
    out: Annotated[
        str,
        typer.Option(
            "--out",
            metavar="DIR|URL",
            help="Directory (or object storage URL prefix) for clean.jsonl, quarantine.jsonl and manifest.json.",
        ),
    ],
    data_root: DataRootOption = None,
    profile: ProfileOption = None,
    tokenizer: TokenizerOption = None,
    trust_remote_code: TrustOption = False,
    thinking: ThinkingOption = None,
    rules: RulesOption = None,
    quarantine_on: Annotated[
        QuarantineOn,
        typer.Option("--quarantine-on", help="Lowest finding severity that quarantines a record."),
    ] = QuarantineOn.error,
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite a gate output made from a different input.")
    ] = False,
    report: Annotated[
        str | None,
        typer.Option("--report", metavar="FILE|URL", help="Also write the JSON report here (a path or a URL)."),
    ] = None,
    output_format: FormatOption = OutputFormat.rich,
    fail_on: FailOnOption = FailOn.error,
    exit_zero: ExitZeroOption = False,
    engine: EngineOption = Engine.local,
    shard_size: ShardSizeOption = None,
    no_cache: NoCacheOption = False,
    fetch_images: FetchImagesOption = False,
) -> None:
    """Split TARGET into the records training may use and the ones it must not.

    Writes clean.jsonl (the passing lines, byte for byte), quarantine.jsonl (each rejected
    line with its findings) and manifest.json into --out, then prints the report. Exit codes
    as for check: 0 the gate passed, 1 it failed (the split is written either way), 2 error.
    """
    from audit.base.storage import location
    from audit.flows.gating import (
        CLEAN_FILE,
        MANIFEST_FILE,
        OUTPUT_FILES,
        QUARANTINE_FILE,
        gate_session,
    )
    from audit.flows.output_paths import refuse_destructive_outputs
    from audit.flows.session import prepare
    from audit.flows.targets import resolve_target

    out_dir = location(out)
    report_path = location(report) if report is not None else None
    root = data_root_for(data_root, [target], announce=output_format is OutputFormat.rich)
    options = check_options(
        profile, tokenizer, trust_remote_code, thinking, rules, cache=not no_cache, engine=engine,
        shard_size=shard_size,
    )
    options = dataclasses.replace(options, fetch_images=fetch_images)
    fail_on_warning = fail_on is FailOn.warning
    try:
        resolved = resolve_target(target, root)
        refuse_destructive_outputs(
            resolved, files=[("--report", report_path)], directories=[("the gate output", out_dir, OUTPUT_FILES)],
            inputs=[("the rule set", options.rules)],
        )
        session = prepare(resolved, options)
        with writing("the gate output into", out_dir):
            result = gate_session(session, out_dir, quarantine_on=quarantine_on.value, force=force)
        if report_path is not None:
            with writing("the report", report_path):
                result.report.write_json(report_path)
    except AuditError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:  # what the audit read
        raise fail(os_error(exc)) from None

    emit([result.report], output_format, fail_on_warning=fail_on_warning, report_paths=[report_path] if report_path else [])
    counts = result.manifest["counts"]
    line = (
        f"gate {result.report.target}: {counts['clean']} clean, {counts['quarantined']} quarantined "
        f"of {counts['in']} records -> {out_dir}/ ({CLEAN_FILE}, {QUARANTINE_FILE}, {MANIFEST_FILE})"
        + ("; unchanged, the same gate was already there" if result.unchanged else "")
    )
    # On stdout with the tables; on stderr when stdout carries a machine format.
    where = console if output_format is OutputFormat.rich else errors
    where.print(Text(terminal(line)), soft_wrap=True)
    if output_format is OutputFormat.rich:
        explain_shipped_sample(session.target)
    internal_errors_line([(result.report.target, result.report.internal_errors)])  # the last line, when some rule raised on a record
    code = result.report.exit_code(fail_on_warning=fail_on_warning)
    raise typer.Exit(0 if exit_zero and code != EXIT_USAGE else code)

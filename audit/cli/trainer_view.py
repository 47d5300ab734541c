"""`audit trainer-view`: only the trainer view of a target, what a trainer fed text would train on.

    audit trainer-view B2_sharegpt --trainer specforge:kimi-k2-thinking

The same audit as `audit check TARGET --trainer ...`, with the TRN rules alone: their table,
the first findings, the verdict and the summary sentence. Exit codes as `check`'s: 0 when no
TRN error rule fails, 1 when one does, 2 on a usage or configuration error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, cast

import typer

from audit.base.errors import AuditError
from audit.cli.app import (
    EXIT_USAGE,
    DataRootOption,
    ExitZeroOption,
    NoCacheOption,
    ProfileOption,
    PromptsOption,
    RulesOption,
    ThinkingOption,
    TokenizerOption,
    TrustOption,
    app,
    check_options,
    data_root_for,
    errors,
    fail,
    internal_errors_line,
    os_error,
    writing,
)
from audit.cli.check import FormatOption, emit, print_rich_report
from audit.cli.progress import audit_progress
from audit.cli.trainer_options import (
    ReplyShapeOption,
    TrainerMaxLengthOption,
    TrainerPythonOption,
    TrainerTimeoutOption,
    with_trainer,
)
from audit.report.formats import OutputFormat


@app.command("trainer-view", short_help="What a trainer fed text would train on, beside the exact ids.")
def trainer_view(
    target: Annotated[str, typer.Argument(help="A partition name, a partition directory or a .jsonl file.")],
    trainer: Annotated[
        str,
        typer.Option(
            "--trainer",
            metavar="NAME[:TEMPLATE]",
            help="specforge[:TEMPLATE] (SpecForge 0.2.0; TEMPLATE a name of its registry, default by "
            "profile) or speculators (0.9.0).",
        ),
    ],
    data_root: DataRootOption = None,
    profile: ProfileOption = None,
    tokenizer: TokenizerOption = None,
    trust_remote_code: TrustOption = False,
    thinking: ThinkingOption = None,
    rules: RulesOption = None,
    prompts: PromptsOption = None,
    trainer_max_length: TrainerMaxLengthOption = None,
    trainer_python: TrainerPythonOption = None,
    trainer_timeout: TrainerTimeoutOption = None,
    reply_shape: ReplyShapeOption = None,
    report: Annotated[
        str | None,
        typer.Option("--report", metavar="FILE|URL", help="Also write the JSON report (TRN findings and summary)."),
    ] = None,
    output_format: FormatOption = OutputFormat.rich,
    exit_zero: ExitZeroOption = False,
    no_cache: NoCacheOption = False,
) -> None:
    """Re-do, per record, what the trainer's own preprocessing does to the conversation it is
    given (the record's messages and tools, the output as the server's reply), compare it with
    the exact sample (input_ids + output_ids, the output trained), and print each difference
    (TRN rules) and the share of records trained on something else. docs/trainer-view.md.
    """
    from audit.base.storage import location
    from audit.flows.checking import check_session
    from audit.flows.output_paths import refuse_destructive_outputs
    from audit.flows.session import prepare
    from audit.flows.targets import resolve_target

    root = data_root_for(data_root, [target], announce=output_format is OutputFormat.rich)
    options = check_options(profile, tokenizer, trust_remote_code, thinking, rules, prompts, cache=not no_cache)
    options = with_trainer(
        options, trainer, trainer_max_length, only=True, reply_shape=reply_shape, python=trainer_python,
        timeout=trainer_timeout,
    )
    try:
        resolved = resolve_target(target, root)
        written = location(report) if report is not None else None
        refuse_destructive_outputs(
            resolved, files=[("--report", written)], inputs=[("the rule set", options.rules), ("--prompts", options.prompts)]
        )
        session = prepare(resolved, options)
        # The data file and the report may be object-store paths: these helpers only name them.
        with audit_progress(errors, session.target.partition, cast(Path, session.target.data_file)) as progress:
            result = check_session(session, progress)
        path: Path | None = None
        if written is not None:
            with writing("the report", cast(Path, written)):
                result.write_json(written)
            path = written if isinstance(written, Path) else None
    except AuditError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(os_error(exc)) from None
    if output_format is OutputFormat.rich:
        print_rich_report(result, path)
    else:
        emit([result], output_format, fail_on_warning=False)
    internal_errors_line([(result.target, result.internal_errors)])
    code = result.exit_code()
    raise typer.Exit(0 if exit_zero and code != EXIT_USAGE else code)

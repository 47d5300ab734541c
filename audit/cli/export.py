"""`audit export` and `audit vocab`: a partition's clean records as training samples, and the
draft vocabulary their trained tokens call for."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, NoReturn

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from audit.base.errors import AuditError
from audit.base.inert import terminal
from audit.cli.app import (
    DataRootOption,
    JobsOption,
    NoCacheOption,
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
    internal_errors_line,
    os_error,
    writing,
)


class SampleFormat(StrEnum):
    parquet = "parquet"
    datasets = "datasets"
    jsonl = "jsonl"


class Long(StrEnum):
    keep = "keep"
    drop = "drop"
    truncate = "truncate"


class TieBreak(StrEnum):
    specforge = "specforge"
    speculators = "speculators"


TargetArgument = Annotated[
    str, typer.Argument(help="A partition name, partition directory or .jsonl file; or a gate output directory.")
]
NoEndOfTurnOption = Annotated[
    bool, typer.Option("--no-end-of-turn", help="Leave the trailing stop token(s) out of the loss mask (the ids stay).")
]
NoReasoningOption = Annotated[
    bool, typer.Option("--no-reasoning", help="Leave the reasoning (up to where the answer starts) out of the loss mask.")
]
MaxLengthOption = Annotated[
    int | None,
    typer.Option("--max-length", metavar="N", min=1, help="Report rows longer than N tokens, and rows whose trained tokens all lie past N."),
]
LongOption = Annotated[
    Long, typer.Option("--long", help="What rows longer than --max-length become: kept whole, dropped, or cut to N (rows left with no trained token are dropped).")
]
ForceOption = Annotated[bool, typer.Option("--force", help="Write into --out even if it holds more than an earlier output of this command.")]


def _prepare(target, data_root, profile, tokenizer, trust_remote_code, thinking, rules, jobs, no_cache,
             no_end_of_turn, no_reasoning, max_length, long):
    """The source and sample options from the command's flags; configuration errors exit 2."""
    from audit.flows.export import SampleOptions
    from audit.flows.export_rows import MaskOptions
    from audit.flows.export_sources import open_source

    root = data_root_for(data_root, [target], announce=True)
    options = check_options(profile, tokenizer, trust_remote_code, thinking, rules, jobs=jobs, cache=not no_cache)
    samples = SampleOptions(
        mask=MaskOptions(end_of_turn=not no_end_of_turn, reasoning=not no_reasoning), max_length=max_length, long=long.value
    )
    return open_source(target, root, options), samples


@app.command(short_help="Write the clean records as training samples (ids, loss mask).")
def export(
    target: TargetArgument,
    out: Annotated[str, typer.Option("--out", metavar="DIR|URL", help="Directory (or object storage URL prefix) for the samples and export.json.")],
    output_format: Annotated[SampleFormat, typer.Option("--format", help="parquet (sharded), datasets (a Hugging Face save_to_disk directory) or jsonl.")] = SampleFormat.parquet,
    data_root: DataRootOption = None,
    profile: ProfileOption = None,
    tokenizer: TokenizerOption = None,
    trust_remote_code: TrustOption = False,
    thinking: ThinkingOption = None,
    rules: RulesOption = None,
    no_end_of_turn: NoEndOfTurnOption = False,
    no_reasoning: NoReasoningOption = False,
    max_length: MaxLengthOption = None,
    long: LongOption = Long.keep,
    rows_per_shard: Annotated[int, typer.Option("--rows-per-shard", metavar="N", min=1, help="Rows per Parquet or datasets shard.")] = 100_000,
    force: ForceOption = False,
    jobs: JobsOption = 1,
    no_cache: NoCacheOption = False,
) -> None:
    """Write the records `audit gate` would put in clean.jsonl as exact training samples.

    One row per record: id, line, input_ids (the prompt ids, then the output ids, unchanged) and
    loss_mask (0 over the prompt, 1 over the output, unshifted). TARGET is checked first; a gate
    output directory is exported as it is. Exit codes as for gate: 0 the gate passed, 1 it
    failed (the clean records are exported either way), 2 error.
    """
    from audit.base.storage import location
    from audit.flows.export import ExportOptions, NothingToExport, export_samples

    out_dir = location(out)
    try:
        source, samples = _prepare(target, data_root, profile, tokenizer, trust_remote_code, thinking, rules, jobs,
                                   no_cache, no_end_of_turn, no_reasoning, max_length, long)
        options = ExportOptions(format=output_format.value, rows_per_shard=rows_per_shard, force=force)
        with writing("the export into", out_dir):
            result = export_samples(source, out_dir, options, samples)
    except NothingToExport as exc:
        _nothing_left(exc)
    except AuditError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(os_error(exc)) from None
    _print_report(result.source)
    counts = result.summary["counts"]
    _say(
        f"export {result.summary['source']['target']}: {counts['rows']} rows ({counts['tokens']} tokens, "
        f"{counts['trained_tokens']} trained) from {counts['clean_records']} clean records -> {out_dir}/ "
        f"({', '.join(result.files[:3])}{', ...' if len(result.files) > 3 else ''}, export.json)"
    )
    _notes(counts, samples)
    for trainer in result.summary["trainers"]:
        _say(trainer["summary"])
    _finish(result.source)


@app.command(short_help="Write the draft vocabulary (d2t, t2d) of the trained tokens.")
def vocab(
    target: TargetArgument,
    out: Annotated[str, typer.Option("--out", metavar="DIR|URL", help="Directory (or object storage URL prefix) for d2t.npy, t2d.npy, vocab_mapping.safetensors, token_counts.npy, vocab.json.")],
    draft_vocab: Annotated[int, typer.Option("--draft-vocab", metavar="N", min=1, help="Draft vocabulary size: the N most frequent trained ids.")],
    tie_break: Annotated[TieBreak, typer.Option("--tie-break", help="Equal counts at the cut-off: the first met (SpecForge) or the smallest id (speculators).")] = TieBreak.specforge,
    target_vocab: Annotated[int | None, typer.Option("--target-vocab", metavar="N", min=1, help="The target model's vocabulary size (default: config.json beside the tokenizer, else the tokenizer's).")] = None,
    html: Annotated[str | None, typer.Option("--html", metavar="FILE|URL", help="Also write a page with the coverage curve.")] = None,
    data_root: DataRootOption = None,
    profile: ProfileOption = None,
    tokenizer: TokenizerOption = None,
    trust_remote_code: TrustOption = False,
    thinking: ThinkingOption = None,
    rules: RulesOption = None,
    no_end_of_turn: NoEndOfTurnOption = False,
    no_reasoning: NoReasoningOption = False,
    max_length: MaxLengthOption = None,
    long: LongOption = Long.keep,
    force: ForceOption = False,
    jobs: JobsOption = 1,
    no_cache: NoCacheOption = False,
) -> None:
    """Count the trained tokens of the samples `audit export` writes (same records, same options)
    and write the draft vocabulary both trainers define: d2t[i] = used[i] - i, t2d over the
    target vocabulary. Exit codes as for export."""
    from audit.base.storage import location
    from audit.flows.draft_vocab import VOCAB_NAMES, VocabOptions
    from audit.flows.draft_vocab import draft_vocab as build
    from audit.flows.export import NothingToExport
    from audit.flows.output_paths import refuse_destructive_outputs
    from audit.report.html.vocab import write_vocab_html

    out_dir = location(out)
    html_path = location(html) if html is not None else None
    try:
        source, samples = _prepare(target, data_root, profile, tokenizer, trust_remote_code, thinking, rules, jobs,
                                   no_cache, no_end_of_turn, no_reasoning, max_length, long)
        options = VocabOptions(draft_size=draft_vocab, tie_break=tie_break.value, target_size=target_vocab, force=force)
        refuse_destructive_outputs(
            source.session.target, files=[("--html", html_path)], directories=[("the draft vocabulary", out_dir, VOCAB_NAMES)]
        )
        with writing("the draft vocabulary into", out_dir):
            result = build(source, out_dir, options, samples)
        if html_path is not None:
            with writing("the page", html_path):
                write_vocab_html(result.summary, html_path)
    except NothingToExport as exc:
        _nothing_left(exc)
    except AuditError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(os_error(exc)) from None
    _print_report(result.source)
    console.print(_coverage_table(result.summary))
    counts = result.summary["counts"]
    _say(
        f"vocab {result.summary['source']['target']}: {counts['trained_tokens']} trained tokens of "
        f"{counts['distinct_trained_ids']} distinct ids over {counts['rows']} rows; draft vocabulary {draft_vocab} "
        f"of {result.summary['target_vocab']['size']} -> {out_dir}/ (d2t.npy, t2d.npy, vocab_mapping.safetensors, "
        "token_counts.npy, vocab.json)" + (f"; page {html_path}" if html_path is not None else "")
    )
    _notes(counts, samples)
    _finish(result.source)


def _coverage_table(summary: dict[str, Any]) -> Table:
    table = Table(title="trained tokens covered by the top N ids", box=box.SIMPLE_HEAD, title_justify="left", min_width=40)
    for name in ("N", "coverage", "trained tokens covered"):
        table.add_column(name, justify="right")
    chosen = summary["options"]["draft_vocab"]
    for row in summary["coverage"]:
        style = "bold" if row["draft_size"] == chosen else ""
        table.add_row(f"{row['draft_size']:,}", f"{row['coverage']:.2%}", f"{row['covered_tokens']:,}", style=style)
    return table


def _print_report(source: Any) -> None:
    """The check's rule table and verdict (a partition), or the gate's verdict (a gate output)."""
    from audit.cli.check import print_rich_report

    if source.report is not None:
        print_rich_report(source.report)
    else:
        _say(f"gate output {source.gate_dir}: verdict {source.verdict()} (as its manifest.json records it)")


def _notes(counts: dict[str, Any], samples: Any) -> None:
    from audit.flows.export import image_notes

    if samples.max_length is not None:
        handled = {"keep": "kept whole", "drop": f"{counts['max_length_dropped']} dropped",
                   "truncate": f"{counts['max_length_truncated']} cut to {samples.max_length}, {counts['max_length_dropped']} left with no trained token dropped"}
        _say(
            f"--max-length {samples.max_length}: {counts['max_length_longer']} rows longer, {counts['max_length_cut_entirely']} "
            f"with every trained token past it (the trainers cut such rows and drop them silently); {handled[samples.long]}"
        )
    if counts["untrained_rows"]:
        _say(f"{counts['untrained_rows']} rows have no trained token (both trainers drop such rows)")
    for line in image_notes(counts):
        _say(line)
    if counts["unreadable_clean_records"]:
        _say(f"{counts['unreadable_clean_records']} clean records are not readable records and are not exported "
             f"(lines {', '.join(map(str, counts['unreadable_lines']))})")


def _say(line: str) -> None:
    console.print(Text(terminal(line)), soft_wrap=True)


def _nothing_left(exc: Any) -> NoReturn:
    """No row left to write: the check's report, why in one line, and exit 1 as a failed gate
    does (2 stays for a run the tool could not finish: a rule that raised on a record)."""
    _print_report(exc.source)
    errors.print(Text.assemble(("audit:", "bold"), " ", terminal(str(exc))), soft_wrap=True)
    raise typer.Exit(max(1, exc.source.exit_code()))


def _finish(source: Any) -> None:
    if source.report is not None:
        internal_errors_line([(source.report.target, source.report.internal_errors)])
    raise typer.Exit(source.exit_code())

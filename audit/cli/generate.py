"""`audit generate`: prompts to SGLang `/generate` as raw ids, with progress, resume and a canary."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from audit.base.errors import AuditError
from audit.base.inert import terminal
from audit.cli.app import EXIT_USAGE, Thinking, TrustOption, app, errors, fail, internal_errors_line

EXIT_INTERRUPTED = 130
# Without a terminal, a plain progress line this often (seconds).
PLAIN_PROGRESS_EVERY = 10.0


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


def _counters(stats) -> str:
    return (
        f"in flight {stats.in_flight} · {stats.tokens_per_second:,.0f} tok/s · ETA {_duration(stats.eta_seconds)} · "
        f"retries {stats.retries} · errors {stats.errors} · canary {stats.canary}"
    )


def _make_events(console: Console, live: bool):
    """Progress for people: a rich bar on a terminal, a plain line every few seconds otherwise."""
    from audit.cli.tables import first_findings, report_table
    from audit.generate import GenerationEvents, RunStats

    class Events(GenerationEvents):
        def __init__(self) -> None:
            self.progress_bar: Progress | None = None
            self.task: TaskID | None = None
            self.last_plain = 0.0
            self.stats: RunStats | None = None

        def start(self, stats: RunStats) -> None:
            self.stats = stats
            if live:
                self.progress_bar = Progress(
                    TextColumn("[bold]generate"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    TextColumn("{task.fields[counters]}", markup=False),
                    console=console,
                    refresh_per_second=4,
                )
                self.task = self.progress_bar.add_task(
                    "generate", total=stats.total, completed=stats.done, counters=""
                )
                self.progress_bar.start()

        def stop(self) -> None:
            if self.progress_bar is not None:
                self.progress_bar.stop()

        def warning(self, message: str) -> None:
            # A server's answer (its model name, an error body) is untrusted text.
            line = Text.assemble(("warning:", "bold red"), " ", terminal(message))
            console.print(line, soft_wrap=True)

        def notice(self, message: str) -> None:
            console.print(Text(terminal(message)), soft_wrap=True)

        def progress(self, stats: RunStats) -> None:
            if self.progress_bar is not None and self.task is not None:
                self.progress_bar.update(
                    self.task, completed=stats.done + stats.errors, counters=_counters(stats)
                )
            elif time.monotonic() - self.last_plain >= PLAIN_PROGRESS_EVERY:
                self.last_plain = time.monotonic()
                line = f"generate: {stats.done}/{stats.total} · {_counters(stats)}"
                console.print(Text(line), soft_wrap=True)

        def canary(self, report) -> None:
            if report.judgement.fails():
                console.print(report_table(report))
                if (findings := first_findings(report)) is not None:
                    console.print(findings)
            else:
                stats = self.stats
                more = stats is None or stats.done + stats.errors < stats.total
                console.print(
                    Text.assemble(
                        ("canary passed", "green"),
                        f": the first {report.records} samples pass the rule set "
                        f"({report.verdict})" + ("; sending the rest" if more else ""),
                    ),
                    soft_wrap=True,
                )

    return Events()


@app.command(short_help="Generate raw_responses.jsonl through SGLang /generate.")
def generate(
    prompts: Annotated[
        Path,
        typer.Argument(
            help="Prompts: JSONL, Parquet, Arrow or a `datasets` folder of prompts (id, messages, "
            "tools), OpenAI messages, ShareGPT conversations or UltraChat rows."
        ),
    ],
    server: Annotated[
        list[str],
        typer.Option("--server", metavar="URL", help="SGLang server URL; repeat to share the load over several."),
    ],
    tokenizer: Annotated[
        Path, typer.Option("--tokenizer", metavar="DIR", help="Local tokenizer directory of the served model.")
    ],
    profile: Annotated[
        str, typer.Option("--profile", metavar="NAME|FILE", help="Profile name (see `audit profiles`) or .toml file.")
    ],
    out: Annotated[
        Path,
        typer.Option("--out", metavar="FILE", help="Output JSONL (e.g. prepared/B1_glaive/raw_responses.jsonl)."),
    ],
    concurrency: Annotated[
        int, typer.Option("--concurrency", help="Requests in flight for short prompts.")
    ] = 64,
    long_concurrency: Annotated[
        int,
        typer.Option(
            "--long-concurrency", help="Requests in flight for long prompts (a separate limit)."
        ),
    ] = 8,
    long_threshold: Annotated[
        int, typer.Option("--long-threshold", help="Prompts with more ids than this count as long.")
    ] = 8192,
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", help="sampling_params.max_new_tokens.")
    ] = 16384,
    temperature: Annotated[
        float | None,
        typer.Option("--temperature", help="Unset: not sent, the model's default applies."),
    ] = None,
    top_p: Annotated[
        float | None, typer.Option("--top-p", help="Unset: not sent, the model's default applies.")
    ] = None,
    thinking: Annotated[
        Thinking, typer.Option("--thinking", help="Render prompts with thinking on or off.")
    ] = Thinking.on,
    limit: Annotated[
        int | None, typer.Option("--limit", help="Use only the first N prompts of the file.")
    ] = None,
    split: Annotated[
        str | None,
        typer.Option(
            "--split", metavar="NAME", help="The split of a DatasetDict folder of prompts (default train)."
        ),
    ] = None,
    skip_bad_lines: Annotated[
        bool,
        typer.Option(
            "--skip-bad-lines",
            help="Skip JSONL prompt lines that are not JSON objects, reporting each (line and reason) "
            "and counting them in generation.json, instead of stopping before the first request.",
        ),
    ] = False,
    fetch_images: Annotated[
        bool,
        typer.Option(
            "--fetch-images",
            help="Fetch the images prompts name by http(s) URL, to check them and record their sha256 "
            "(else they are sent as given, unread, with no hash).",
        ),
    ] = False,
    canary: Annotated[
        int,
        typer.Option(
            "--canary", help="Audit the first N samples before sending the rest; 0 disables."
        ),
    ] = 16,
    rules: Annotated[
        Path | None,
        typer.Option("--rules", metavar="FILE", help="Rule set for the canary (default rules/default.toml)."),
    ] = None,
    trust_remote_code: TrustOption = False,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            help="Seconds one request may take, whole: connecting, waiting and every byte of the answer.",
        ),
    ] = 3600.0,
    max_attempts: Annotated[
        int,
        typer.Option(
            "--max-attempts",
            help="Attempts per prompt on transient failures (5xx, timeouts); also the failed "
            "probes in a row after which a run whose servers all left the rotation stops.",
        ),
    ] = 10,
    retry_backoff: Annotated[
        float,
        typer.Option(
            "--retry-backoff",
            help="Delay before the first retry in seconds; doubles, capped at 30 s.",
        ),
    ] = 0.5,
) -> None:
    """Generate raw_responses.jsonl through SGLang /generate; exit 0 (all done), 1 (canary failed or
    prompts failed), 2 (usage error) or 130 (interrupted; run again to resume)."""
    from audit.generate import GenerateOptions, Generator, plan_generation

    options = GenerateOptions(
        prompts=prompts,
        out=out,
        servers=tuple(s.rstrip("/") for s in server),
        tokenizer=tokenizer,
        profile=profile,
        trust_remote_code=trust_remote_code,
        thinking=thinking is Thinking.on,
        concurrency=concurrency,
        long_concurrency=long_concurrency,
        long_threshold=long_threshold,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        limit=limit,
        split=split,
        skip_bad_lines=skip_bad_lines,
        fetch_images=fetch_images,
        canary=canary,
        rules=rules,
        timeout=timeout,
        max_attempts=max_attempts,
        retry_backoff=retry_backoff,
    )
    try:
        plan = plan_generation(options)
    except AuditError as exc:
        raise fail(str(exc)) from None

    console = errors  # progress and summaries on stderr; stdout stays free
    if plan.prompt_summary is not None and plan.prompt_summary.notable:
        for line in plan.prompt_summary.lines():
            console.print(Text(terminal(line)), soft_wrap=True)
    if (cut := plan.resumed.what_was_cut()) is not None:
        console.print(Text(f"resume: cut {cut} left by a crash in {terminal(out)}"), soft_wrap=True)
    if plan.resumed.keys:
        console.print(
            Text(
                f"resume: {len(plan.resumed.keys)} samples already in {terminal(out)}; "
                "skipping them"
            ),
            soft_wrap=True,
        )
    import asyncio  # here, not at import: every other command would pay for it at start-up

    events = _make_events(console, live=sys.stderr.isatty())
    generator = Generator(plan, events)

    async def run():
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, generator.request_stop)
        events.start(generator.stats)
        try:
            return await generator.run()
        finally:
            events.stop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)

    try:
        result = asyncio.run(run())
    except AuditError as exc:
        raise fail(str(exc)) from None

    stats = result.stats
    skipped = plan.prompt_summary.skipped if plan.prompt_summary is not None else 0
    console.print(
        Text(
            f"wrote {stats.written} samples to {terminal(out)} ({stats.done}/{stats.total} done"
            + (f", {stats.resumed} from earlier runs" if stats.resumed else "")
            + f") · {stats.output_tokens:,} output tokens in {_duration(stats.elapsed)} "
            f"({stats.tokens_per_second:,.0f} tok/s) · {stats.retries} retries · "
            f"{stats.errors} errors"
            + (f" · {skipped:,} bad prompt lines skipped" if skipped else "")
            + (f" · canary {stats.canary}" if stats.canary != "off" else "")
        ),
        soft_wrap=True,
    )
    if stats.errors:
        console.print(
            Text.assemble(
                (f"{stats.errors} prompts failed", "yellow"),
                f": reasons in {terminal(plan.errors_path)}; run again to retry them",
            ),
            soft_wrap=True,
        )
    if result.stopped == "interrupted":
        console.print(
            Text(
                "interrupted: nothing half-written; run the same command again to resume "
                f"{terminal(out)}"
            ),
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_INTERRUPTED)
    if result.stopped == "canary":
        canary_report = result.canary_report
        if canary_report is not None and canary_report.internal_errors:
            internal_errors_line([(canary_report.target, canary_report.internal_errors)])
            raise typer.Exit(EXIT_USAGE)
        reason = result.canary_message or "the first samples fail the rule set (table above)"
        console.print(
            Text.assemble(
                ("canary failed", "bold red"),
                f": {terminal(reason)}. Stopped after {stats.written} samples; what was written "
                f"stays in {terminal(out)}. Fix the pipeline, then remove it and run again.",
            ),
            soft_wrap=True,
        )
        raise typer.Exit(1)
    raise typer.Exit(1 if stats.errors else 0)

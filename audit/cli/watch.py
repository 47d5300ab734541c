"""`audit watch`: a live view of a growing raw_responses.jsonl; q or Ctrl-C quits."""

from __future__ import annotations

import math
import os
import select
import sys
import time
from contextlib import contextmanager
from typing import Annotated, Literal

import typer
from rich import box
from rich.live import Live
from rich.table import Table
from rich.text import Text

from audit.base.errors import AuditError
from audit.base.inert import terminal
from audit.cli.app import (
    EXIT_USAGE,
    DataRootOption,
    ProfileOption,
    RulesOption,
    ThinkingOption,
    TokenizerOption,
    TrustOption,
    app,
    check_options,
    console,
    fail,
    internal_errors_line,
)
from audit.cli.tables import VERDICT_STYLE, plain


def snapshot_table(snapshot, *, live: bool = True) -> Table:
    """Lines so far, lines per minute, and each rule's pass rate so far.

    The live view says how to leave it; a one-shot table (`--once`) does not wait for a key.
    """
    stalled = (
        f" · no growth for {snapshot.seconds_since_growth:.0f}s"
        if snapshot.seconds_since_growth >= 60
        else ""
    )
    pending = f" · partial line {snapshot.pending_bytes} bytes" if snapshot.pending_bytes else ""
    table = Table(
        title=Text(
            f"audit watch  ·  {snapshot.records} lines  ·  "
            f"{snapshot.lines_per_minute:,.1f} lines/min{pending}{stalled}"
        ),
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        caption=Text(f"{terminal(snapshot.path)}" + ("  ·  q or Ctrl-C quits" if live else "")),
        caption_justify="left",
    )
    columns: tuple[tuple[str, Literal["left", "right"]], ...] = (
        ("code", "left"),
        ("rule", "left"),
        ("severity", "left"),
        ("failing", "right"),
        ("pass rate", "right"),
        ("so far", "left"),
    )
    for column, justify in columns:
        table.add_column(
            column,
            justify=justify,
            no_wrap=True,
            overflow="ellipsis",
            min_width=len(column),
            max_width=28 if column == "rule" else None,
        )
    for rule in snapshot.rules:
        table.add_row(
            plain(rule.code),
            plain(rule.name),
            plain(rule.severity),
            str(rule.failing),
            f"{rule.pass_rate:.1%}",
            Text(rule.verdict, style=VERDICT_STYLE[rule.verdict]),
            style="dim" if rule.failing == 0 else None,
        )
    return table


def once_verdict(snapshot) -> Text:
    """The verdict line of `watch --once`: what its exit code says, with the rules behind it."""
    judgement = snapshot.judgement
    verdict = judgement.value
    text = Text()
    text.append(f"{verdict.upper()} ", style=VERDICT_STYLE[verdict])
    text.append(f"so far, {snapshot.records} lines")
    if judgement.failed:
        text.append(f"; failed: {', '.join(judgement.failed)}", style="red")
    if judgement.warned:
        text.append(f"; warnings: {', '.join(judgement.warned)}", style="yellow")
    return text


@contextmanager
def _keys():
    """Read single key presses without waiting for Enter, when stdin is a terminal."""
    if not sys.stdin.isatty():

        def wait(timeout: float) -> str:
            time.sleep(timeout)
            return ""

        yield wait
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def read(timeout: float) -> str:
        ready, _, _ = select.select([fd], [], [], timeout)
        return os.read(fd, 32).decode(errors="ignore") if ready else ""

    try:
        yield read
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _seconds(value: float) -> float:
    """Seconds to wait between looks: finite, 0.1 or more (NaN, which a range check lets
    through, and infinity are refused: the wait between looks could not take them)."""
    if not (value >= 0.1 and math.isfinite(value)):
        raise typer.BadParameter(f"{value} is not a number of seconds of 0.1 or more")
    return value


@app.command(short_help="A live audit of a growing raw_responses.jsonl.")
def watch(
    target: Annotated[
        str,
        typer.Argument(help="Partition name, partition directory or .jsonl file being written."),
    ],
    data_root: DataRootOption = None,
    profile: ProfileOption = None,
    tokenizer: TokenizerOption = None,
    trust_remote_code: TrustOption = False,
    thinking: ThinkingOption = None,
    rules: RulesOption = None,
    interval: Annotated[
        float,
        typer.Option("--interval", callback=_seconds, help="Seconds between looks at the file (0.1 or more)."),
    ] = 2.0,
    once: Annotated[
        bool, typer.Option("--once", help="Audit what is there now, print it and exit (1 when a rule fails, as check).")
    ] = False,
) -> None:
    """Watch a growing raw_responses.jsonl: lines, lines per minute and each rule's pass rate so far."""
    from audit.flows.session import prepare
    from audit.flows.targets import data_root as resolve_root
    from audit.flows.watching import LiveAudit, watch_target

    root, _ = resolve_root(data_root)
    try:
        session = prepare(
            watch_target(target, root),
            check_options(profile, tokenizer, trust_remote_code, thinking, rules),
        )
        live_audit = LiveAudit(session)
        snapshot = live_audit.poll()
    except AuditError as exc:
        raise fail(str(exc)) from None
    if once:
        # A one-shot watch is a check of what is there so far: the same exit codes.
        console.print(snapshot_table(snapshot, live=False))
        console.print(once_verdict(snapshot))
        internal_errors_line([(session.target.partition, snapshot.internal_errors)])
        raise typer.Exit(EXIT_USAGE if snapshot.internal_errors else snapshot.judgement.exit_code())
    try:
        with (
            _keys() as read_key,
            Live(snapshot_table(snapshot), console=console, auto_refresh=False) as live,
        ):
            while "q" not in read_key(interval).lower():
                live.update(snapshot_table(live_audit.poll()), refresh=True)
    except KeyboardInterrupt:
        pass

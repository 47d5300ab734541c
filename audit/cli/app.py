"""The typer app, the options every command shares, and the entry point.

Exit codes are a contract a CI job can gate on:

    0  the gate passed (warnings allowed, unless --fail-on warning)
    1  the gate failed: some rule exceeded its fail threshold
    2  usage, configuration or input error: nothing was judged

Each command lives in its own module of this package and registers itself on `app`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from audit import __version__
from audit.base import inert
from audit.base.storage import AnyPath
from audit.cli.conventions import conventional_help, one_line_usage_errors

EXIT_USAGE = 2
DEBUG_ENV = "AUDIT_DEBUG"  # audit.engine.isolation reads it; the CLI cannot import the core at start-up

app = typer.Typer(
    name="audit",
    help="Gate LLM-generated token data before it trains an EAGLE-3 drafter.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    # Every command inherits the context settings: `audit check -h` as `audit check --help`,
    # and help as wide as the terminal (click stops at 80 and cuts command summaries there).
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 140},
)

console = Console()
errors = Console(stderr=True)
conventional_help()
one_line_usage_errors(errors)


def fail(message: str) -> typer.Exit:
    """Print one error line on stderr and return the exit to raise (code 2)."""
    # The message is plain text: a "[tokens]" or "[rules.TRM001]" in it is a TOML table, not markup,
    # and whatever it quotes from a file (an id, a path) prints as text, on one line.
    line = Text.assemble(("audit: error:", "bold red"), " ", inert.terminal(message))
    errors.print(line, soft_wrap=True)
    return typer.Exit(EXIT_USAGE)


def os_error(exc: OSError) -> str:
    """A file the command could not use, and why, in one line: `PATH: reason`."""
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason


@contextmanager
def writing(what: str, path: AnyPath) -> Iterator[None]:
    """Around the writing of an output: one error line naming it when it cannot be written."""
    try:
        yield
    except OSError as exc:
        raise fail(f"cannot write {what} {path}: {exc.strerror or exc}") from None


# A thinking mode: one (generate, profiles); for an audit, one or both (each record in its prompt's).
Thinking = StrEnum("Thinking", [("on", "on"), ("off", "off")])
AuditedThinking = StrEnum("AuditedThinking", [("on", "on"), ("off", "off"), ("mixed", "mixed")])


class FailOn(StrEnum):
    error = "error"
    warning = "warning"


# -- options shared by every command that audits a target ------------------------------------
DataRootOption = Annotated[
    str | None,
    typer.Option(
        "--data-root",
        envvar="AUDIT_DATA_ROOT",
        metavar="DIR|URL",
        help="Where partitions live: a directory or an object storage URL (default prepared/).",
    ),
]
ProfileOption = Annotated[
    str | None,
    typer.Option("--profile", metavar="NAME|FILE", help="Profile name (see `audit profiles`) or a profile .toml file."),
]
TokenizerOption = Annotated[
    Path | None, typer.Option("--tokenizer", metavar="DIR", help="Local Hugging Face tokenizer directory.")
]
TrustOption = Annotated[
    bool,
    typer.Option("--trust-remote-code", help="Allow the tokenizer's own code (Kimi's tiktoken tokenizer needs it)."),
]
ThinkingOption = Annotated[AuditedThinking | None, typer.Option("--thinking", help=(
    "Thinking mode the data was generated with; mixed: both, each record in the mode its prompt ending shows "
    "(default: generation.json's, else on; mixed for a family whose prompt marks its mode, gemma-4)."))]
RulesOption = Annotated[
    Path | None, typer.Option("--rules", metavar="FILE", help="Rule set file (default rules/default.toml).")
]
PromptsOption = Annotated[
    Path | None,
    typer.Option(
        "--prompts",
        metavar="FILE",
        help="JSONL of id, messages and tools: re-render each prompt with the chat template (TPL001).",
    ),
]
FailOnOption = Annotated[FailOn, typer.Option("--fail-on", help="Lowest verdict that fails the gate.")]
JobsOption = Annotated[
    int,
    typer.Option("--jobs", "-j", min=1, help="Worker processes over shards of each file (results identical to one)."),
]
NoCacheOption = Annotated[
    bool,
    typer.Option("--no-cache", help="Audit again even when an identical earlier audit is cached (.audit-cache/)."),
]
ExitZeroOption = Annotated[bool, typer.Option("--exit-zero", help="Exit 0 even when the gate fails.")]


class Engine(StrEnum):
    local = "local"
    ray = "ray"


EngineOption = Annotated[
    Engine,
    typer.Option(
        "--engine",
        help="local: this process (or --jobs processes); ray: shards as tasks on the Ray cluster at "
        "$RAY_ADDRESS (a local one when unset). Findings are identical.",
    ),
]
ShardSizeOption = Annotated[
    str | None,
    typer.Option(
        "--shard-size",
        metavar="SIZE",
        help="With --engine ray: bytes per task, e.g. 64M, 512K (default: a few shards per CPU, at most 32M).",
    ),
]


def parse_size(text: str | None) -> int | None:
    """`64M`, `512K`, `1G` or a number of bytes; a usage error (exit 2) otherwise."""
    if text is None:
        return None
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    number, unit = text.strip().upper().rstrip("B"), ""
    if number and number[-1] in "KMG":
        number, unit = number[:-1], number[-1]
    if not number.isdigit() or int(number) == 0:
        raise fail(f"--shard-size {text!r}: give a positive size such as 64M, 512K or 1048576")
    return int(number) * units[unit]


def check_options(
    profile: str | None,
    tokenizer: Path | None,
    trust_remote_code: bool,
    thinking: AuditedThinking | None,
    rules: Path | None,
    prompts: Path | None = None,
    jobs: int = 1,
    cache: bool = True,
    engine: Engine = Engine.local,
    shard_size: str | None = None,
):
    """The core's CheckOptions from the shared CLI options."""
    from audit.flows.session import CheckOptions
    from audit.model.families.thinking_modes import flag_mode

    if engine is Engine.ray and jobs > 1:
        raise fail("--jobs sets local worker processes; with --engine ray the cluster's CPUs run the shards")
    if shard_size is not None and engine is not Engine.ray:
        raise fail("--shard-size sizes the tasks of --engine ray; the local engine sizes its own shards")
    return CheckOptions(
        jobs=jobs,
        cache=cache,
        engine=engine.value,
        shard_bytes=parse_size(shard_size),
        profile=profile,
        tokenizer=tokenizer,
        trust_remote_code=trust_remote_code,
        thinking=None if thinking is None else flag_mode(thinking.value),
        rules=rules,
        prompts=prompts,
    )


def data_root_for(data_root: str | None, targets: list[str], announce: bool):
    """The data root for these targets; say so when the shipped sample stands in for it."""
    from audit.flows.targets import data_root as resolve_root
    from audit.flows.targets import names_a_path

    root, note = resolve_root(data_root)
    if note and announce and not all(names_a_path(spec) for spec in targets or [""]):
        errors.print(Text(inert.terminal(note), style="dim"), soft_wrap=True)
    return root


def internal_errors_line(found: Sequence[tuple[str, Sequence[Any]]]) -> None:
    """After a command's own output, for targets where some rule raised on a record (pairs of
    a target and its `audit.engine.isolation.InternalError`s): each traceback under `--debug`, then
    the last line, which says how many records and how to see why. The command exits 2."""
    from audit.engine.isolation import debug_requested

    broken = [(target, raised) for target, raised in found if raised]
    if not broken:
        return
    debug = debug_requested()
    if debug:
        for target, raised in broken:
            for error in raised:
                print_traceback(f"{target} line {error.line}: {error.rule} raised:\n{error.traceback}")
    count = sum(len({error.line for error in raised}) for _, raised in broken)
    rules = sorted({error.rule for _, raised in broken for error in raised})
    how = "the tracebacks are above" if debug else "run again with --debug to see the tracebacks"
    errors.print(
        Text.assemble(
            ("audit: internal error:", "bold red"),
            f" {count} record{'s' if count != 1 else ''} hit an internal error in {', '.join(rules)} "
            f"(a bug in audit, not a verdict on the data; ERR001 in the report, quarantined by a gate): {how}",
        ),
        soft_wrap=True,
    )


def print_traceback(text: str) -> None:
    """A traceback on stderr, line by line, inert (it may quote the data: never markup)."""
    for line in text.rstrip().splitlines():
        errors.print(Text(inert.terminal(line)), soft_wrap=True)


def version_callback(value: bool) -> None:
    if value:
        console.print(f"audit {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=version_callback, is_eager=True, help="Print the version.")
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            envvar=DEBUG_ENV,
            help="Print the full traceback of any internal error (also after a command: "
            "`audit check X --debug`; or set AUDIT_DEBUG=1).",
        ),
    ] = False,
) -> None:
    """Gate LLM-generated token data before it trains an EAGLE-3 drafter."""
    if debug:
        os.environ[DEBUG_ENV] = "1"


def _take_debug_flag(argv: list[str]) -> list[str]:
    """`--debug` anywhere before `--` (`audit check X --debug` as `audit --debug check X`): every
    command honours it, through AUDIT_DEBUG."""
    end = argv.index("--") if "--" in argv else len(argv)
    if "--debug" not in argv[:end]:
        return argv
    os.environ[DEBUG_ENV] = "1"
    return [arg for i, arg in enumerate(argv) if i >= end or arg != "--debug"]


def _exit_without_teardown(code: int) -> NoReturn:
    """Exit once the command is done, skipping the interpreter's teardown.

    Freeing every object one by one (the tokenizer's tables, polars frames, modules) takes a
    tenth of a second, a sixth of a small audit. Exit handlers still run and the output is
    flushed first, so nothing the command wrote is lost.
    """
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`audit check | head`) or stream
            stream.flush()
    os._exit(code)


class _ReaderMayLeave:
    """stdout for a pipe whose reader may stop reading (`audit check | head`).

    Once the reader has gone, what is left to print is dropped and the command runs on to its
    own exit code: click would exit 1, which reads as "the gate failed", for a gate that passed.
    """

    def __init__(self, stream) -> None:
        self._stream = stream
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._left()
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._left()

    def _left(self) -> None:
        self._gone = True
        # Whatever the closed pipe still buffers would fail again when the interpreter flushes.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def main() -> None:
    """Entry point: run the app; an unexpected failure is one line and exit 2, never a traceback."""
    # pandera imports hypothesis when it is installed (as in test environments), for data
    # synthesis that no command uses: ~70 ms of every start-up. Commands do without it.
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]
    if not sys.stdout.isatty():
        sys.stdout = _ReaderMayLeave(sys.stdout)
    sys.argv[1:] = _take_debug_flag(sys.argv[1:])
    try:
        app()
    except KeyboardInterrupt:
        errors.print("audit: interrupted")
        sys.exit(130)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            _exit_without_teardown(exc.code or 0)
        raise
    except BaseException as exc:  # the last guard (polars panics derive from BaseException)
        from audit.engine.isolation import debug_requested

        if debug_requested():
            print_traceback(traceback.format_exc())
        how = "" if debug_requested() else "; run again with --debug to see the traceback"
        errors.print(
            Text(
                f"audit: internal error: {type(exc).__name__}: {inert.terminal(exc, 2000)} "
                f"(please report it with the command you ran{how})"
            ),
            soft_wrap=True,
        )
        sys.exit(EXIT_USAGE)

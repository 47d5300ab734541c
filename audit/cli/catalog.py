"""`audit rules`, `audit explain`, `audit profiles`: what the tool knows, for people."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from audit.base.errors import AuditError
from audit.cli.app import Thinking, TokenizerOption, TrustOption, app, console, fail

if TYPE_CHECKING:
    from audit.checks import Rule

# The command that writes docs/rules/; each page says so, and tests/test_docs.py checks it was run.
RULE_DOCS_COMMAND = "audit rules --docs docs/rules"
# A page named like a rule code (INT001.md): the only files `--docs` removes, when no rule has it.
_RULE_PAGE = re.compile(r"^[A-Z]{3}[0-9]{3}\.md$")


@app.command("rules")
def list_rules(
    docs: Annotated[
        str | None,
        typer.Option(
            "--docs",
            metavar="DIR",
            help="Write the rules' documentation pages instead: DIR/CODE.md per rule and DIR/index.md.",
        ),
    ] = None,
) -> None:
    """List every rule: code, name, default severity, summary."""
    if docs is not None:
        if not docs.strip():
            raise fail("--docs needs a directory, e.g. --docs docs/rules")
        written = write_rule_pages(Path(docs))
        console.print(f"wrote {written} pages to {docs}", markup=False, highlight=False)
        return
    from audit.cli.tables import rules_table

    console.print(rules_table())


def write_rule_pages(directory: Path) -> int:
    """Write every rule's page and the index into `directory` (created if missing), and remove
    the pages of rules that no longer exist. Returns the number of pages written."""
    from audit.base.files import write_file

    if directory.exists() and not directory.is_dir():
        raise fail(f"--docs {directory}: not a directory")
    pages = rule_pages()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for stale in sorted(directory.iterdir()):
            if _RULE_PAGE.match(stale.name) and stale.name not in pages and stale.is_file():
                stale.unlink()
        for name, text in pages.items():
            write_file(directory / name, text)
    except OSError as exc:
        raise fail(f"--docs {directory}: cannot write the rule pages: {exc.strerror or exc}") from None
    return len(pages)


def rule_pages() -> dict[str, str]:
    """Every rule's documentation page, and the index, as Markdown: file name -> text."""
    from audit.checks import RULES

    pages = {f"{code}.md": rule_page(rule) for code, rule in RULES.items()}
    rows = [
        f"| [{code}]({code}.md) | `{rule.name}` | {rule.severity.value} | {_markdown(rule.summary())} |"
        for code, rule in RULES.items()
    ]
    pages["index.md"] = "\n".join([
        "# Rules",
        "",
        _generated_note("the docstrings of the rule classes in `RULES`"),
        "",
        "`audit rules` lists them, `audit explain CODE` prints one: what it checks, why it matters",
        "for the drafter, an example, and how to fix the pipeline; each page below is that text.",
        "Which rules run, at what severity and from which threshold they fail the gate is the rule",
        "set's: see [Rule sets and thresholds](../rule-sets.md).",
        "",
        "`tests/rule_cases/CODE.toml` holds each rule's cases, records that pass and records that",
        "fail, on every profile the rule applies to, each saying why: executable documentation, run",
        "by `tests/test_rule_cases.py` on the families' real tokenizers. Adding a case needs no code;",
        "the runner's docstring lists the keys, and a case with an unknown key, rule or profile fails.",
        "",
        "| code | name | default severity | what it flags |",
        "|---|---|---|---|",
        *rows,
        "",
    ])
    return pages


def rule_page(rule: type[Rule]) -> str:
    """One rule's page: its docstring's summary and sections, its severity and parameters."""
    docs = rule.docs()
    lines = [
        f"# {rule.code} {rule.name}",
        "",
        _generated_note(f"the docstring of the rule class `{rule.__name__}`"),
        "",
        _markdown(rule.summary()),
        "",
        f"Code `{rule.code}`, name `{rule.name}`, default severity **{rule.severity.value}**.",
    ]
    for section in ("What it checks", "Why it matters", "Example", "Fix"):
        if section not in docs:
            continue
        body = f"```text\n{docs[section]}\n```" if section == "Example" else _markdown(docs[section])
        lines += ["", f"## {section}", "", body]
    if rule.parameters:
        lines += ["", "## Parameters", "", f"Set under `[rules.{rule.code}]` in a rule set.", "",
                  "| parameter | default | range | |", "|---|---|---|---|"]
        lines += [
            f"| `{key}` | {spec.default} | {spec.minimum} to {spec.maximum} | {_markdown(spec.help)} |"
            for key, spec in rule.parameters.items()
        ]
    return "\n".join(lines) + "\n"


def _generated_note(source: str) -> str:
    return f"<!-- Written by `{RULE_DOCS_COMMAND}` from {source}: edit the docstring, then run it again. -->"


def _markdown(text: str) -> str:
    """Docstring prose as Markdown: code spans kept, and outside them the characters Markdown
    would read as markup (`*`, `_`, `<`, `\\`, a table's `|`) escaped."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(
        part if part.startswith("`") else re.sub(r"([\\*_|])", r"\\\1", part).replace("<", "&lt;")
        for part in parts
    )


@app.command(short_help="What a rule checks, why it matters, an example and the fix.")
def explain(code: Annotated[str, typer.Argument(help="A rule code, e.g. SEG001, or its name.")]) -> None:
    """Print a rule's documentation: what it checks, why it matters, an example, the fix."""
    from audit.checks import RULES
    from audit.cli.tables import rule_panel

    wanted = code.strip()
    rule = RULES.get(wanted.upper()) or next((r for r in RULES.values() if r.name == wanted), None)
    if rule is None:
        raise fail(f"no rule {code!r}: `audit rules` lists them")
    console.print(rule_panel(rule))


@app.command(short_help="The model profiles; with --tokenizer, the ids they resolve to.")
def profiles(
    tokenizer: TokenizerOption = None,
    trust_remote_code: TrustOption = False,
    thinking: Annotated[
        Thinking | None, typer.Option("--thinking", help="The thinking mode whose prompt endings to show (default: on).")
    ] = None,
) -> None:
    """List the built-in profiles; with --tokenizer, the ids each one resolves to."""
    from audit.cli.tables import profiles_table
    from audit.model.families.profiles import builtin_profiles, load_profile
    from audit.model.tokens.tokenizer_loading import load_tokenizer

    try:
        loaded = load_tokenizer(tokenizer, trust_remote_code=trust_remote_code) if tokenizer else None
        console.print(
            profiles_table(
                [load_profile(name) for name in builtin_profiles()],
                loaded,
                thinking is not Thinking.off,
                width=console.width,
            )
        )
    except AuditError as exc:
        raise fail(str(exc)) from None

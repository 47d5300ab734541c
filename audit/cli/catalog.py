"""`audit rules`, `audit explain`, `audit profiles`: what the tool knows, for people."""

from __future__ import annotations

from typing import Annotated

import typer

from audit.base.errors import AuditError
from audit.cli.app import Thinking, ThinkingOption, TokenizerOption, TrustOption, app, console, fail


@app.command("rules")
def list_rules() -> None:
    """List every rule: code, name, default severity, summary."""
    from audit.cli.tables import rules_table

    console.print(rules_table())


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
    thinking: ThinkingOption = None,
) -> None:
    """List the built-in profiles; with --tokenizer, the ids each one resolves to."""
    from audit.cli.tables import profiles_table
    from audit.model.profiles import builtin_profiles, load_profile
    from audit.model.tokenizer_loading import load_tokenizer

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

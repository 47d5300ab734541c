"""How help and usage errors read: the conventions of command-line tools, not click's defaults."""

from __future__ import annotations

import re
from typing import Any

import typer
from rich.console import Console
from rich.text import Text

# How help names a value: the conventions of command-line help (TEXT, N, PATH, [on|off],
# TARGETS...), not Python's type names (<str>, <list[str]>, {prompts}) typer prints otherwise.
_VALUE_NAMES = {
    "str": "TEXT", "int": "N", "int range": "N", "float": "NUMBER", "float range": "NUMBER",
    "path": "PATH", "bool": "BOOLEAN",
}


def conventional_help() -> None:
    """Help names values as command-line help does (TEXT, N, PATH, [on|off], TARGETS...).

    For typer 0.28 (pyproject.toml holds it there), where each parameter makes its own metavar
    (`make_metavar`): options name their value, arguments their name and value, and usage
    their name. On another typer its own notation stands, and tests/test_cli_presentation.py fails."""
    core = getattr(typer, "core", None)
    argument, option = getattr(core, "TyperArgument", None), getattr(core, "TyperOption", None)
    if argument is None or option is None or "usage" not in (argument.make_metavar.__kwdefaults__ or {}):
        return

    def option_metavar(self: Any, ctx: Any) -> str:
        return _value_name(self) + ("..." if self.nargs != 1 else "")

    def argument_metavar(self: Any, ctx: Any, *, usage: bool = False) -> str:
        dots = "..." if self.nargs != 1 else ""
        if usage:
            name = (self.metavar or self.name or "").upper()
            return (name if self.required else f"[{name}]") + dots
        return f"{self.name}{dots} {_value_name(self)}"

    option.make_metavar = option_metavar
    argument.make_metavar = argument_metavar


def _value_name(param: Any) -> str:
    """What a parameter's value is called in help: its metavar, its choices in brackets, or its
    type's conventional name (`_VALUE_NAMES`)."""
    if param.metavar is not None:
        return param.metavar
    choices = getattr(param.type, "choices", None)
    if choices is not None:
        return "[" + "|".join(str(getattr(choice, "value", choice)) for choice in choices) + "]"
    label = str(getattr(param.type, "name", "")).strip("<>")
    return _VALUE_NAMES.get(label, label.upper())


_PLAIN_WORDS = {"int": "is not a whole number", "float": "is not a number"}
_PYTHON_TYPE_WORDS = re.compile(r"is not a valid (int|float)(?: range)?\b")


def one_line_usage_errors(errors: Console) -> None:
    """A usage error (an unknown option or command, a value of the wrong type) is one line that
    says what to do, like every other error, not click's usage block (exit code 2 still)."""
    from typer._click import core, exceptions  # (the click typer 0.28 vendors)

    def show(self: Any, file: Any = None) -> None:
        command = self.ctx.command_path if self.ctx is not None else "audit"
        message = " ".join(self.format_message().split()).rstrip(".")
        # click names the type it wanted by its Python name ("'x' is not a valid int range")
        message = _PYTHON_TYPE_WORDS.sub(lambda found: _PLAIN_WORDS[found.group(1)], message)
        errors.print(Text(f"audit: error: {message}; see '{command} -h'"), soft_wrap=True)

    exceptions.UsageError.show = show  # type: ignore[method-assign]
    _name_the_command(core.Command, exceptions.UsageError)


def _name_the_command(command: Any, usage_error: Any) -> None:
    """An error click's parser raises (an option missing its value) names no command; the command
    whose line it was is the one whose help to point to (`audit check -h`, not `audit -h`)."""
    parse_args = command.parse_args

    def parse_naming_the_command(self: Any, ctx: Any, args: list[str]) -> list[str]:
        try:
            return parse_args(self, ctx, args)
        except usage_error as error:
            if error.ctx is None:
                error.ctx, error.cmd = ctx, ctx.command
            raise

    command.parse_args = parse_naming_the_command

"""How help and usage errors read: the conventions of command-line tools, not click's defaults."""

from __future__ import annotations

import contextlib
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
    """Help names values as command-line help does (TEXT, N, PATH, [on|off], TARGETS...)."""
    core = getattr(typer, "core", None)
    parameter, argument = getattr(core, "_TyperParameter", None), getattr(core, "TyperArgument", None)
    if parameter is None and argument is not None and "usage" in getattr(argument.make_metavar, "__kwdefaults__", {}):
        _conventional_metavars(core)  # typer 0.28: each parameter makes its own metavar
        return
    if parameter is None or argument is None or not hasattr(parameter, "display_type"):
        return  # another typer: its own notation stands
    python_names = parameter.display_type

    def display_type(self, ctx):
        if self.metavar is not None:
            return self.metavar
        label = str(python_names(self, ctx)).strip("<>")
        if "|" in label:  # choices
            return "[" + label.removeprefix("list[").removesuffix("]") + "]"
        label = label.removeprefix("list[").removesuffix("]")
        return _VALUE_NAMES.get(label, label.upper())

    def usage_name(self) -> str:
        name = (self.metavar or self.name or "").upper()
        name = name if self.required else f"[{name}]"
        return name + ("..." if self.nargs != 1 else "")

    parameter.display_type = display_type
    argument._usage_display_name = usage_name


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


def _conventional_metavars(core: Any) -> None:
    """The notation of `conventional_help` for typer 0.28, where each parameter makes its own
    metavar (`make_metavar`): options name their value, arguments their name and value."""

    def option_metavar(self: Any, ctx: Any) -> str:
        return _value_name(self) + ("..." if self.nargs != 1 else "")

    def argument_metavar(self: Any, ctx: Any, *, usage: bool = False) -> str:
        dots = "..." if self.nargs != 1 else ""
        if usage:
            name = (self.metavar or self.name or "").upper()
            return (name if self.required else f"[{name}]") + dots
        return f"{self.name}{dots} {_value_name(self)}"

    core.TyperOption.make_metavar = option_metavar
    core.TyperArgument.make_metavar = argument_metavar


_PLAIN_WORDS = {"int": "is not a whole number", "float": "is not a number"}
_PYTHON_TYPE_WORDS = re.compile(r"is not a valid (int|float)(?: range)?\b")


def one_line_usage_errors(errors: Console) -> None:
    """A usage error (an unknown option or command, a value of the wrong type) is one line that
    says what to do, like every other error, not click's usage block (exit code 2 still)."""
    import importlib

    def show(self: Any, file: Any = None) -> None:
        command = self.ctx.command_path if self.ctx is not None else "audit"
        message = " ".join(self.format_message().split()).rstrip(".")
        # typer checks a value with pydantic, whose message starts "Value error, ": not ours to show
        message = message.replace(": Value error, ", ": ")
        # click names the type it wanted by its Python name ("'x' is not a valid int range")
        message = _PYTHON_TYPE_WORDS.sub(lambda found: _PLAIN_WORDS[found.group(1)], message)
        errors.print(Text(f"audit: error: {message}; see '{command} -h'"), soft_wrap=True)

    # typer vendors its click (typer._click, 0.2x); older releases use click itself (imported
    # only then: it is no small part of a start-up).
    for name in ("typer._click", "click"):
        with contextlib.suppress(ImportError):
            exceptions = importlib.import_module(f"{name}.exceptions")
            exceptions.UsageError.show = show
            _name_the_command(importlib.import_module(f"{name}.core").Command, exceptions.UsageError)
            return


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

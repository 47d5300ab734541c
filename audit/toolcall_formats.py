"""Tool-call grammars of the model families, and how to read one call's text.

A profile names its markers by their token strings and picks one of these formats. The
tool-call rules map every marker id in `output_ids` to a one-letter role and match the
resulting string against the format's grammar, so the order check is a vectorised regex
over all records at once:

    S  section begin      s  section end
    C  call begin         A  argument begin (or separator)      E  call end

Only the text between markers is decoded, one batch for all calls, then `read_call`
splits it into the call's name, its call id (where the family has one) and its arguments.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

ROLE_LETTERS = {
    "section_begin": "S",
    "section_end": "s",
    "call_begin": "C",
    "argument_begin": "A",
    "call_end": "E",
}


@dataclass(frozen=True)
class ToolCall:
    """One call as the model wrote it: the text between call begin and argument begin (`head`)
    and between argument begin and call end (`body`)."""

    name: str | None
    call_id: str | None
    arguments: str


@dataclass(frozen=True)
class ToolCallFormat:
    """A family's tool-call grammar: which marker roles it uses, their order, how to read a call."""

    name: str
    roles: tuple[str, ...]
    grammar: str  # regex over role letters, anchored by the rule
    read_call: Callable[[str, str], ToolCall]
    has_call_ids: bool = False
    description: str = ""

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(self.grammar)


def _kimi_call(head: str, body: str) -> ToolCall:
    # Kimi writes `functions.NAME:IDX` as the call id; the name is inside it.
    call_id = head.strip()
    name = call_id.removeprefix("functions.").rsplit(":", 1)[0] if call_id else None
    return ToolCall(name=name or None, call_id=call_id, arguments=body)


def _named_call(head: str, body: str) -> ToolCall:
    # DeepSeek V3.1 writes the function name, then the separator, then the JSON arguments.
    return ToolCall(name=head.strip() or None, call_id=None, arguments=body)


FORMATS: dict[str, ToolCallFormat] = {
    "kimi": ToolCallFormat(
        name="kimi",
        roles=("section_begin", "section_end", "call_begin", "argument_begin", "call_end"),
        grammar=r"(?:S(?:CAE)+s)*",
        read_call=_kimi_call,
        has_call_ids=True,
        description="section( call-begin ID argument-begin JSON call-end )+ section-end",
    ),
    "deepseek-v3.1": ToolCallFormat(
        name="deepseek-v3.1",
        roles=("section_begin", "section_end", "call_begin", "argument_begin", "call_end"),
        grammar=r"(?:S(?:CAE)+s)*",
        read_call=_named_call,
        description="calls-begin( call-begin NAME sep JSON call-end )+ calls-end",
    ),
}


def tool_call_format(name: str) -> ToolCallFormat:
    """The format called `name`; KeyError lists none, the caller says what is known."""
    return FORMATS[name]

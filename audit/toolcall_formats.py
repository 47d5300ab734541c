"""Tool-call grammars of the model families, and how to read one call's text.

A profile names its markers by their token strings and picks one of these formats. The
tool-call rules map every marker id in `output_ids` to a one-letter role and match the
resulting string against the format's grammar, so the order check is a vectorised regex
over all records at once:

    S  section begin      s  section end
    C  call begin         A  argument begin (or separator)      E  call end
    K  key begin          k  key end      V  value begin      v  value end   (GLM arguments)

Only the text between markers is decoded, one batch for all calls, then `read_call`
splits it into the call's name, its call id (where the family has one) and its arguments.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import orjson

ROLE_LETTERS = {
    "section_begin": "S",
    "section_end": "s",
    "call_begin": "C",
    "argument_begin": "A",
    "call_end": "E",
    "key_begin": "K",
    "key_end": "k",
    "value_begin": "V",
    "value_end": "v",
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


def _r1_call(head: str, body: str) -> ToolCall:
    # DeepSeek-R1 writes the call type ("function"), the separator, then NAME, a newline and
    # the arguments as a fenced JSON block: NAME\n```json\n{...}\n```
    name, _, rest = body.partition("\n")
    match = _FENCED_JSON.match(rest)
    arguments = match.group(1) if match else rest  # no fence: left for the JSON check to judge
    return ToolCall(name=name.strip() or None, call_id=None, arguments=arguments)


_FENCED_JSON = re.compile(r"^\s*```(?:json)?[ \t]*\n(.*?)\n?```\s*$", re.DOTALL)


def _qwen3_call(head: str, body: str) -> ToolCall:
    # Qwen3 writes one JSON object per call: {"name": ..., "arguments": {...}}. Text that does
    # not parse is passed on whole as the arguments, so the JSON rule names it.
    try:
        call = orjson.loads(head.strip())
    except orjson.JSONDecodeError:
        return ToolCall(name=_json_name(head), call_id=None, arguments=head)
    if not isinstance(call, dict):
        return ToolCall(name=None, call_id=None, arguments=head)
    name = call.get("name")
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some pipelines double-encode; the model writes an object
        return ToolCall(name=name if isinstance(name, str) else None, call_id=None, arguments=arguments)
    return ToolCall(
        name=name if isinstance(name, str) and name else None,
        call_id=None,
        arguments=orjson.dumps(arguments).decode(),
    )


_JSON_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')


def _json_name(text: str) -> str | None:
    match = _JSON_NAME.search(text)
    return match.group(1) if match else None


_GLM_ARGUMENT = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _glm_call(head: str, body: str) -> ToolCall:
    # GLM-4.5 writes NAME, a newline, then <arg_key>k</arg_key>\n<arg_value>v</arg_value> pairs.
    # Its template renders string values raw and everything else as JSON, so a value that
    # starts like a JSON object or array must parse as one.
    name, _, rest = head.partition("<arg_key>")
    rest = "<arg_key>" + rest if rest else ""
    arguments: dict[str, object] = {}
    for key, value in _GLM_ARGUMENT.findall(rest):
        if value.lstrip()[:1] in ("{", "["):
            try:
                arguments[key.strip()] = orjson.loads(value)
            except orjson.JSONDecodeError:
                return ToolCall(name=name.strip() or None, call_id=None, arguments=value)
        else:
            arguments[key.strip()] = value
    return ToolCall(name=name.strip() or None, call_id=None, arguments=orjson.dumps(arguments).decode())


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
    "deepseek-r1": ToolCallFormat(
        name="deepseek-r1",
        roles=("section_begin", "section_end", "call_begin", "argument_begin", "call_end"),
        grammar=r"(?:S(?:CAE)+s)*",
        read_call=_r1_call,
        description="calls-begin( call-begin function sep NAME fenced-JSON call-end )+ calls-end",
    ),
    "qwen3": ToolCallFormat(
        name="qwen3",
        roles=("call_begin", "call_end"),
        grammar=r"(?:CE)*",
        read_call=_qwen3_call,
        description='( <tool_call> {"name": ..., "arguments": {...}} </tool_call> )*',
    ),
    "glm-4.5": ToolCallFormat(
        name="glm-4.5",
        roles=("call_begin", "call_end", "key_begin", "key_end", "value_begin", "value_end"),
        grammar=r"(?:C(?:KkVv)*E)*",
        read_call=_glm_call,
        description="( <tool_call> NAME ( <arg_key> k </arg_key> <arg_value> v </arg_value> )* </tool_call> )*",
    ),
}

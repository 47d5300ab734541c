"""DSML, the XML-like tool-call markup of DeepSeek-V3.2 and V4.

A call is an `invoke` element holding one `parameter` element per argument. A string value is
written as is with `string="true"`; any other value as JSON with `string="false"`, which is how
the serving parsers know to convert it back. V3.2 wraps the calls in `function_calls`, V4 in
`tool_calls`. `｜DSML｜` is one token in both vocabularies (special in V3.2's, not in V4's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from audit.model.encoders.base import to_json

DSML = "｜DSML｜"


def parameter(name: str, value: Any) -> str:
    """One argument: `<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>`."""
    is_text = isinstance(value, str)
    text = value if is_text else to_json(value)
    flag = "true" if is_text else "false"
    return f'<{DSML}parameter name="{name}" string="{flag}">{text}</{DSML}parameter>'


def invoke(name: str, arguments: Mapping[str, Any]) -> str:
    """One call: its `invoke` element, one parameter per line, in the arguments' order."""
    parameters = "\n".join(parameter(key, value) for key, value in arguments.items())
    return f'<{DSML}invoke name="{name}">\n{parameters}\n</{DSML}invoke>'


def calls_block(block: str, tool_calls: Sequence[Mapping[str, Any]]) -> str:
    """An assistant turn's calls (OpenAI `tool_calls`, arguments already mappings) in one block."""
    invokes = "\n".join(
        invoke(call["function"]["name"], call["function"]["arguments"]) for call in tool_calls
    )
    return f"<{DSML}{block}>\n{invokes}\n</{DSML}{block}>"


def tool_schemas(tools: Sequence[Mapping[str, Any]]) -> str:
    """The request tools' function objects, one JSON line each."""
    return "\n".join(to_json(tool["function"]) for tool in tools)

"""The conversation as SGLang's chat serving path hands it to DeepSeek's Python encoders.

SGLang (`serving_chat.py`, 0.5.23) does not pass the OpenAI request to `encode_messages` as
sent. Each message is dumped from its pydantic model, then: assistant tool-call arguments
given as JSON strings are parsed into mappings (invalid JSON, or JSON that is not an object,
is a 400 error); list content is flattened to its text parts joined by one space; `None`
content becomes `""`; a conversation ending with an assistant message turns it into a user
message (no `continue_final_message`); an empty system message is inserted first unless the
conversation starts with one; and the request's tools are put on that first message, where
the encoder renders them after the system text. `sglang_request_messages` does the same, so
the built-in encoders render what a DeepSeek model served by SGLang was given.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from audit.model.encoders.base import EncoderError

# The fields SGLang's request models keep (others are dropped when the request is parsed):
# a user message has role and content; every other role is the generic message.
_USER_FIELDS = ("role", "content")
_GENERIC_FIELDS = (
    "role",
    "content",
    "tool_call_id",
    "name",
    "phase",
    "reasoning_content",
    "tool_calls",
    "tools",
    "prefix",
)
_ROLES = frozenset(
    {"system", "user", "assistant", "tool", "function", "developer", "latest_reminder"}
)
# A request tool's function as SGLang's `Function` model keeps it; strict and defer_loading
# only when set.
_FUNCTION_FIELDS = ("description", "name", "parameters", "strict", "defer_loading")


def sglang_request_messages(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The messages, prepared as SGLang's serving path prepares them for DeepSeek's encoders.

    Returns new dicts; the input is not changed. Raises `EncoderError` for what SGLang
    refuses: a message that is not an object or has no known role, or tool-call arguments
    that are not a JSON object.
    """
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise EncoderError("messages must be a non-empty list of message objects")
    prepared: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise EncoderError(f"messages[{index}] is not an object")
        role = message.get("role")
        if not isinstance(role, str) or role.lower() not in _ROLES:
            raise EncoderError(f"messages[{index}] has no known role ({role!r})")
        role = role.lower()
        fields = _USER_FIELDS if role == "user" else _GENERIC_FIELDS
        item = {key: copy.deepcopy(message.get(key)) for key in fields}
        item["role"] = role
        item["content"] = _flat_content(item.get("content"), index)
        if item["role"] == "assistant" and item.get("tool_calls") is not None:
            item["tool_calls"] = _parsed_tool_calls(item["tool_calls"], index)
        prepared.append(item)
    last = prepared[-1]
    if last["role"] == "assistant":
        prepared[-1] = {"role": "user", "content": last["content"]}
    if prepared[0]["role"] != "system":
        prepared.insert(0, {"role": "system", "content": ""})
    if tools:
        prepared[0]["tools"] = [_tool(tool, number) for number, tool in enumerate(tools)]
    return prepared


def _flat_content(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") in ("text", "input_text"):
                text = part.get("text")
                if not isinstance(text, str):
                    raise EncoderError(f"messages[{index}].content has a text part without text")
                texts.append(text)
        return " ".join(texts)
    raise EncoderError(f"messages[{index}].content is neither text nor a list of parts")


def _parsed_tool_calls(tool_calls: Any, index: int) -> list[dict[str, Any]]:
    if not isinstance(tool_calls, list):
        raise EncoderError(f"messages[{index}].tool_calls is not a list")
    parsed = []
    for number, call in enumerate(tool_calls):
        where = f"messages[{index}].tool_calls[{number}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise EncoderError(f"{where} has no function name")
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                raise EncoderError(f"{where}.function.arguments is not valid JSON") from None
        if not isinstance(arguments, Mapping):
            raise EncoderError(f"{where}.function.arguments is not a JSON object")
        parsed.append({**call, "function": {**function, "arguments": dict(arguments)}})
    return parsed


def _tool(tool: Any, number: int) -> dict[str, Any]:
    """A request tool as SGLang's `Tool` model dumps it.

    The function keeps the client's key order; fields the model does not know are dropped;
    `description` and `parameters` the client left out are appended as null (the model's
    defaults); `strict` and `defer_loading` appear only when set.
    """
    function = tool.get("function") if isinstance(tool, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise EncoderError(f"tools[{number}] has no function name")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise EncoderError(f"tools[{number}].function.description is not text")
    dumped = {
        key: copy.deepcopy(value)
        for key, value in function.items()
        if key in _FUNCTION_FIELDS and (value is not None or key in ("description", "parameters"))
    }
    for key in ("description", "parameters"):
        dumped.setdefault(key, None)
    return {"type": tool.get("type", "function"), "function": dumped}

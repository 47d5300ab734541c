"""A conversation's tool-call arguments in the other form: JSON strings parsed to objects, or
objects written as JSON strings, for templates that take one form and data that saves the other."""

from __future__ import annotations

import json
from typing import Any

Messages = list[dict[str, Any]]


def other_argument_form(messages: Messages, to_objects: bool | None = None) -> Messages | None:
    """The messages with every assistant tool call's arguments in the other form: JSON strings
    parsed to objects, or objects written as JSON strings (`to_objects` chooses; by default
    objects when any argument is a string). None when there are no arguments to turn, or a
    string does not parse to an object."""
    calls = [
        call["function"]
        for message in messages
        if isinstance(message, dict) and isinstance(message.get("tool_calls"), list)
        for call in message["tool_calls"]
        if isinstance(call, dict) and isinstance(call.get("function"), dict) and "arguments" in call["function"]
    ]
    if not calls:
        return None
    if to_objects is None:
        to_objects = any(isinstance(function["arguments"], str) for function in calls)
    turned: dict[int, Any] = {}
    for function in calls:
        value = function["arguments"]
        if to_objects and isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                return None
            if not isinstance(value, dict):
                return None
        elif not to_objects and not isinstance(value, str):
            value = json.dumps(value, ensure_ascii=False)
        turned[id(function)] = value
    return [_with_arguments(message, turned) for message in messages]


def _with_arguments(message: Any, turned: dict[int, Any]) -> Any:
    if not (isinstance(message, dict) and isinstance(message.get("tool_calls"), list)):
        return message
    calls = []
    for call in message["tool_calls"]:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and id(function) in turned:
            call = {**call, "function": {**function, "arguments": turned[id(function)]}}
        calls.append(call)
    return {**message, "tool_calls": calls}

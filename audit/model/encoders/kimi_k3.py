"""Kimi-K3's prompt encoder, a reimplementation of `encoding_k3.py`'s `build_chat_segments`.

Kimi-K3 ships no chat template: the checkpoint renders prompts in Python (`encoding_k3.py`
beside `tokenization_kimi.py`, whose `apply_chat_template` calls it), in XTML. Its markup is
four special tokens, `<|open|>`, `<|close|>`, `<|sep|>` and `<|end_of_msg|>`; tag names and
attributes between them are ordinary text:

    <|open|>message role="user"<|sep|>TEXT<|close|>message<|sep|><|end_of_msg|>
    <|open|>message role="assistant"<|sep|>
      <|open|>think<|sep|>REASONING<|close|>think<|sep|>
      <|open|>response<|sep|>ANSWER<|close|>response<|sep|>
      <|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|>
        <|open|>argument key="K" type="string"<|sep|>VALUE<|close|>argument<|sep|>
      <|close|>call<|sep|><|close|>tools<|sep|>
    <|close|>message<|sep|><|end_of_msg|>

(no newlines in the real text). The prompt is built as segments, each encoded on its own:
markers with special-token strings recognised, everything else (content, reasoning, argument
values, tag names, attribute fragments) with them not recognised, so message content that
spells `<|open|>` is text, never a marker. `render` returns the joined text as a
`SegmentedPrompt`, which `audit.model.templating.encode_prompts` encodes segment by segment.

What it renders, in the reference's order:
- the request's tools first, as a `type="tool-declare"` system message (`# Tools` and the tools
  as compact JSON, keys sorted at every depth); a system message carrying `tools` mid-way is the
  lazy-loading declaration (`## New Tools Available`);
- with thinking on, the `type="thinking-effort"` system message; `apply_chat_template` defaults
  `thinking_effort` to "max" (`kwargs.setdefault("thinking_effort", "max")`); "low" and "high"
  are the other values accepted (the note names `medium` too, which the reference refuses);
- each message: user and system (a `name` attribute when named), tool results as
  `role="tool" tool="NAME" index="N"` (N counts from 1 after each assistant turn; results are
  put into the order of the calls by `tool_call_id` first), assistant turns as above. With
  thinking on every assistant turn carries its think channel, empty when it has no reasoning:
  past reasoning is kept, never dropped; with thinking off the channel is absent. The response
  channel is always there, empty for a turn with only calls. A call's arguments: a string value
  raw with `type="string"`, others as JSON (`json.dumps` defaults) typed
  boolean/null/number/object/array; arguments given as a string that is not JSON render as
  `<|open|>json type="object"<|sep|>RAW<|close|>json<|sep|>`. Attribute values escape `&`
  then `"` (`&amp;`, `&quot;`); `<` and `>` stay as they are;
- `tool_choice` "required"/"none" and `response_format` notes (type `tool-choice`,
  `response-format`) after the conversation;
- the generation prompt, an open assistant message and channel:
  `<|open|>message role="assistant"<|sep|><|open|>think<|sep|>` (thinking) or
  `...<|open|>response<|sep|>` (off). No BOS.

Sources (public ports of `encoding_k3.py`; nothing from a model directory is executed here):
- `xtml.py` of a serving engine (SQLite Cloud, Apache-2.0), a port checked by a differential
  test against the release's `encoding_k3.py`: the one followed where ports disagree;
- vLLM's port "derived from moonshotai/Kimi-K3 encoding_k3.py at commit c5d1dd4";
- a Rust port's exact-string tests (the thinking-effort text, message wrapping, the generation
  prompts, attribute escaping, the stop token `<|end_of_msg|>` 163586);
- a wrapper around the vendored file (the marker ids 163586-163589, `apply_chat_template`'s
  "max" default, segment-by-segment encoding with `allow_special_tokens`);
- SGLang's `function_call/kimik3_format.py` and `kimik3_detector.py` for what the model emits.
Where they disagree: vLLM's port writes an attribute ` key="value"` as one segment and gives
an assistant message no `name` attribute; the tested port (followed here) writes ` key`, `="`,
the value and `"` as four segments (each BPE-encoded alone) and names a named assistant. The
reference skips a message whose role it does not know, in silence; this encoder refuses it
(`EncoderError`), so a prompt that lost a message is never taken for the rendering.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from audit.model.encoders import xtml
from audit.model.encoders.base import EncoderError, SegmentedPrompt
from audit.model.encoders.xtml import IMAGE_PLACEHOLDER, Segments

THINKING_EFFORTS = frozenset({"low", "high", "max"})
DEFAULT_THINKING_EFFORT = "max"  # apply_chat_template's default
THINKING_EFFORT_NOTE = (
    "`thinking_effort` guides on how much to think in your thinking channel (not including the "
    "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort={effort}`."
)
TOOLS_NOTE = "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n{tools}\n```"
NEW_TOOLS_NOTE = (
    "## New Tools Available\n"
    "The system dynamically extends the toolset via lazy-loading.\n"
    "You have access to all existing and extended tools.\n"
    "Here are the specs for the extended tools.\n\n"
    "```json\n{tools}\n```"
)
TOOL_CHOICE_NOTES = {
    "required": "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.",
    "none": "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.",
}
_RAW_JSON = "Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting."
JSON_OBJECT_NOTE = f"The system is invoked with `response_format=json_object`.\n{_RAW_JSON}"
JSON_SCHEMA_NOTE = (
    f"The system is invoked with `response_format=json_schema`.\n{_RAW_JSON}\n"
    "The JSON data must match the following schema:\n```json\n{schema}\n```"
)
ROLES = frozenset({"system", "user", "assistant", "tool"})



def render(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    thinking: bool,
    thinking_effort: str | None = DEFAULT_THINKING_EFFORT,
    tool_choice: Any = None,
    response_format: Any = None,
) -> SegmentedPrompt:
    """The prompt Kimi-K3 is given for an OpenAI-style conversation, generation prompt included,
    as `apply_chat_template(messages, tools, add_generation_prompt=True, thinking=...)` renders it.

    `thinking_effort` is "low", "high", "max" or None (no note). Raises `EncoderError` for a
    conversation the reference refuses (or would render without one of its messages).
    """
    return SegmentedPrompt(
        segments(
            messages,
            tools,
            thinking=thinking,
            thinking_effort=thinking_effort,
            tool_choice=tool_choice,
            response_format=response_format,
        )
    )


def render_conversation(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    thinking: bool,
    thinking_effort: str | None = DEFAULT_THINKING_EFFORT,
) -> SegmentedPrompt:
    """The whole conversation with no generation prompt (`add_generation_prompt=False`), as a
    trainer renders the turns it trains on."""
    return SegmentedPrompt(
        segments(messages, tools, thinking=thinking, thinking_effort=thinking_effort, add_generation_prompt=False)
    )


def segments(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    thinking: bool,
    thinking_effort: str | None = DEFAULT_THINKING_EFFORT,
    tool_choice: Any = None,
    response_format: Any = None,
    add_generation_prompt: bool = True,
) -> Segments:
    """`build_chat_segments` of the reference: the prompt's segments, in order."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise EncoderError("messages must be a list of message objects")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise EncoderError(f"messages[{index}] is not an object")
        if message.get("role") not in ROLES:
            raise EncoderError(
                f"messages[{index}] has role {message.get('role')!r}, which Kimi-K3's encoder does "
                "not render (it knows system, user, assistant, tool)"
            )
    prepared = [_normalized(message, index) for index, message in _in_call_order(messages)]
    out: Segments = []
    if tools:
        out += _tool_declare(tools, dynamic=False)
    if thinking and thinking_effort is not None:
        if thinking_effort not in THINKING_EFFORTS:
            raise EncoderError(
                f"thinking_effort {thinking_effort!r} is not one of {', '.join(sorted(THINKING_EFFORTS))}"
            )
        out += _internal_system_message("thinking-effort", THINKING_EFFORT_NOTE.format(effort=thinking_effort))
    calls: list[Any] | None = None
    tool_index = 0
    for index, message in prepared:
        role = message["role"]
        if role == "system" and message.get("tools"):
            out += _tool_declare(message["tools"], dynamic=True)
        elif role in ("system", "user"):
            out += xtml.open_tag("message", _named([("role", role)], message))
            out += _content(message.get("content"), index)
            out += xtml.close_tag("message") + xtml.end_of_msg()
        elif role == "tool":
            tool_index += 1
            name = message.get("tool", message.get("name"))
            if name is None and calls is not None and tool_index <= len(calls):
                name = _function(calls[tool_index - 1]).get("name")
            if name is None:
                raise EncoderError(
                    f"messages[{index}] is a tool result with no tool name: it names none (tool or "
                    "name) and matches no call of the assistant turn before it"
                )
            out += xtml.open_tag("message", [("role", "tool"), ("tool", name), ("index", tool_index)])
            out += _content(message.get("content"), index)
            out += xtml.close_tag("message") + xtml.end_of_msg()
        else:
            calls = message.get("tool_calls") or None
            tool_index = 0
            out += xtml.open_tag("message", _named([("role", "assistant")], message))
            out += _assistant(message, index, thinking=thinking)
            out += xtml.close_tag("message") + xtml.end_of_msg()
    if tool_choice in TOOL_CHOICE_NOTES:
        out += _internal_system_message("tool-choice", TOOL_CHOICE_NOTES[tool_choice])
    kind = response_format.get("type") if isinstance(response_format, Mapping) else response_format
    if kind == "json_object":
        out += _internal_system_message("response-format", JSON_OBJECT_NOTE)
    elif kind == "json_schema":
        schema = _json_compact(_sorted_keys(_response_schema(response_format)))
        out += _internal_system_message("response-format", JSON_SCHEMA_NOTE.format(schema=schema))
    if add_generation_prompt:
        out += generation_prompt(thinking)
    return out


def generation_prompt(thinking: bool) -> Segments:
    """The open assistant message and the channel the model writes first."""
    return xtml.open_tag("message", [("role", "assistant")]) + xtml.open_tag("think" if thinking else "response")


def _internal_system_message(kind: str, body: str) -> Segments:
    """A system message the encoder adds, typed by its `type` attribute."""
    return (
        xtml.open_tag("message", [("role", "system"), ("type", kind)])
        + xtml.text(body.strip())
        + xtml.close_tag("message")
        + xtml.end_of_msg()
    )


def _tool_declare(tools: Any, *, dynamic: bool) -> Segments:
    note = NEW_TOOLS_NOTE if dynamic else TOOLS_NOTE
    return _internal_system_message("tool-declare", note.format(tools=_json_compact(_sorted_keys(tools))))


def _named(attributes: list[tuple[str, Any]], message: Mapping[str, Any]) -> list[tuple[str, Any]]:
    return [*attributes, ("name", message["name"])] if message.get("name") else attributes


def _content(content: Any, index: int) -> Segments:
    """A message's content: text, or a list of parts (text parts; image parts as the
    placeholder the vision processor replaces)."""
    if content is None:
        return []
    if isinstance(content, str):
        return xtml.text(content)
    if not isinstance(content, list):
        raise EncoderError(f"messages[{index}].content is neither text nor a list of parts")
    out: Segments = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("image", "image_url"):
            out += xtml.control(IMAGE_PLACEHOLDER)
        elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
            out += xtml.text(part["text"])
        else:
            raise EncoderError(f"messages[{index}].content has a part that is neither text nor an image")
    return out


def _assistant(message: Mapping[str, Any], index: int, *, thinking: bool) -> Segments:
    out: Segments = []
    if thinking:  # the think channel is structural: there, empty or not, with thinking on
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        out += xtml.open_tag("think")
        if reasoning is not None and str(reasoning).strip():
            out += xtml.text(reasoning)
        out += xtml.close_tag("think")
    out += xtml.open_tag("response") + _content(message.get("content"), index) + xtml.close_tag("response")
    calls = message.get("tool_calls")
    if calls:
        out += xtml.open_tag("tools")
        for number, call in enumerate(calls, start=1):
            function = _function(call)
            out += xtml.open_tag("call", [("tool", function["name"]), ("index", number)])
            if "_raw_arguments" in function:
                out += xtml.open_tag("json", [("type", "object")]) + xtml.text(function["_raw_arguments"]) + xtml.close_tag("json")
            else:
                for key, value in function["arguments"].items():
                    out += xtml.open_tag("argument", [("key", key), ("type", xtml.argument_type(value))])
                    out += xtml.text(xtml.argument_text(value))
                    out += xtml.close_tag("argument")
            out += xtml.close_tag("call")
        out += xtml.close_tag("tools")
    return out


# -- preparation --------------------------------------------------------------------------------


def _function(call: Any) -> Mapping[str, Any]:
    """A call's function object (OpenAI's `{"function": {...}}`, or the call itself)."""
    if not isinstance(call, Mapping):
        return {}
    function = call.get("function", call)
    return function if isinstance(function, Mapping) else {}


def _normalized(message: Mapping[str, Any], index: int) -> tuple[int, dict[str, Any]]:
    """The message as the reference renders it: tools keys sorted, each call's arguments a
    mapping (parsed from a JSON string) or, when the string is not JSON, kept raw."""
    normalized = dict(message)
    if normalized.get("tools") is not None:
        normalized["tools"] = _sorted_keys(normalized["tools"])
    calls = normalized.get("tool_calls")
    if not calls:
        return index, normalized
    if not isinstance(calls, list):
        raise EncoderError(f"messages[{index}].tool_calls is not a list")
    prepared = []
    for number, call in enumerate(calls):
        where = f"messages[{index}].tool_calls[{number}]"
        function = _function(call)
        if not isinstance(call, Mapping) or not isinstance(function.get("name"), str) or not function["name"]:
            raise EncoderError(f"{where} has no function name")
        arguments = function.get("arguments")
        kept: dict[str, Any] = {"name": function["name"]}
        if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
            kept["arguments"] = {}
        elif isinstance(arguments, str):
            try:
                parsed = json.loads(arguments)
            except ValueError:
                kept["_raw_arguments"] = arguments
            else:
                if not isinstance(parsed, dict):
                    raise EncoderError(f"{where}.function.arguments is JSON but not an object")
                kept["arguments"] = parsed
        elif isinstance(arguments, Mapping):
            kept["arguments"] = dict(arguments)
        else:
            raise EncoderError(f"{where}.function.arguments is neither an object nor a JSON string")
        prepared.append({**call, "function": kept})
    normalized["tool_calls"] = prepared
    return index, normalized


def _in_call_order(messages: Sequence[Mapping[str, Any]]) -> list[tuple[int, Mapping[str, Any]]]:
    """(index, message) with each run of tool results sorted into the order of the calls of the
    assistant turn before it, by `tool_call_id`, each then named by its call; a run in which
    one result matches no call is left as it is."""
    out: list[tuple[int, Mapping[str, Any]]] = []
    positions: dict[str, tuple[int, Any]] = {}
    index = 0
    while index < len(messages):
        message = messages[index]
        if message.get("role") != "tool":
            if message.get("role") == "assistant":
                positions = {}
                for number, call in enumerate(message.get("tool_calls") or [], start=1):
                    if isinstance(call, Mapping) and call.get("id") is not None:
                        positions.setdefault(str(call["id"]), (number, _function(call).get("name")))
            out.append((index, message))
            index += 1
            continue
        run: list[tuple[int, int, Mapping[str, Any], Any]] = []
        resolved = True
        while index < len(messages) and messages[index].get("role") == "tool":
            result = messages[index]
            call_id = result.get("tool_call_id", result.get("id"))
            match = positions.get(str(call_id)) if call_id is not None else None
            if match is None:
                resolved = False
                run.append((0, index, result, None))
            else:
                run.append((match[0], index, result, match[1]))
            index += 1
        if not resolved:
            out += [(at, result) for _, at, result, _ in run]
            continue
        for _, at, result, name in sorted(run, key=lambda item: (item[0], item[1])):
            if name is None:
                out.append((at, result))
                continue
            named = {**result, "tool": name}
            if "name" in named:
                named["name"] = name
            out.append((at, named))
    return out


def _sorted_keys(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(item) for item in value]
    return value


def _json_compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _response_schema(response_format: Any) -> Any:
    schema = response_format.get("json_schema") if isinstance(response_format, Mapping) else None
    if isinstance(schema, Mapping):
        return schema.get("schema", schema.get("json_schema", schema))
    return schema

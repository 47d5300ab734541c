"""Kimi-K3's prompt encoder, a reimplementation of `encoding_k3.py`'s `build_chat_segments`.

Kimi-K3 ships no chat template: its tokenizer's `apply_chat_template` (`tokenization_kimi.py`)
renders in Python, with `encoding_k3.py`, in XTML (`audit.model.encoders.xtml`). The prompt is
a list of segments, each encoded on its own: markers with special-token strings recognised,
everything else (content, reasoning, argument values, tag names, attribute fragments) with
them not recognised, so content that spells `<|open|>` is text, never a marker. `render`
returns the joined text as a `SegmentedPrompt`, which `audit.model.rendering.templating.encode_prompts`
encodes segment by segment. What it renders, in the reference's order:

- the request's tools, as a `type="tool-declare"` system message (`# Tools`, the tools as
  compact JSON with keys sorted at every depth); a system message carrying `tools` later is the
  lazy-loading declaration (`## New Tools Available`);
- with thinking on, the `type="thinking-effort"` system message: `apply_chat_template` defaults
  `thinking_effort` to "max" (`kwargs.setdefault("thinking_effort", "max")`) and thinking to on;
  "low" and "high" are the other efforts accepted (the note names `medium`, which is refused);
- the messages: user and system (`name` attribute when named); tool results as
  `role="tool" tool="NAME" index="N"` (N from 1 after each assistant turn, results first put
  into the order of the calls by `tool_call_id`); assistant turns as think channel (thinking on
  only, there even when empty: past reasoning is kept, never dropped), response channel (always
  there), then the calls in a tools channel, one `argument key="K" type="T"` per argument (a
  string raw, others JSON) or arguments that are no JSON object raw in a `json type="object"`
  element;
- `tool_choice` ("required"/"none") and `response_format` notes, then the generation prompt:
  `<|open|>message role="assistant"<|sep|><|open|>think<|sep|>`, or `<|open|>response<|sep|>`
  with thinking off. No BOS.

Two revisions of the checkpoint's file render string arguments and reasoning differently
(SGLang's router port pins a590ce09 and says the repo "has shipped two different
tool-argument renderings"): a590ce09 (`REVISION`, the default) reads arguments given as a JSON
string one level deep and writes each value's own text (`[1,2]` stays `[1,2]`), writes any
text that is not such an object raw, and writes whitespace-only reasoning; c5d1dd4 (`EARLIER`)
parses the string and writes each value again with `json.dumps` (`[1, 2]`), refuses JSON that
is not an object, and leaves whitespace-only reasoning out. Both are real renderings.

Sources (public ports of `encoding_k3.py`; nothing from a model directory is executed here):
SGLang's router port (`kimi_k3` encoder, tested against fixtures the real encoder made at
a590ce09); `xtml.py` of a serving engine (SQLite Cloud), checked by a differential test against
the release; vLLM's port "derived from moonshotai/Kimi-K3 encoding_k3.py at commit c5d1dd4";
a Rust port's exact-string tests (the thinking-effort text, message wrapping, generation
prompts, escaping); a wrapper around the vendored file (marker ids, the "max" default,
encoding with `allow_special_tokens`); SGLang's `function_call/kimik3_format.py` and
`kimik3_detector.py` for what the model writes. Where the ports disagree, the tested ones are
followed: vLLM's writes an attribute ` key="value"` as one segment and names no assistant; the
tested ports write ` key`, `="`, the value and `"` as four segments and name a named
assistant. A role the encoder does not know is refused with an `EncoderError` (a590ce09 raises
too; c5d1dd4 dropped the message in silence).
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
REVISION = "a590ce09"  # the checkpoint file's revision rendered by default
EARLIER = "c5d1dd4"  # the earlier revision (see the module docs)
REVISIONS = (REVISION, EARLIER)



def render(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    thinking: bool,
    thinking_effort: str | None = DEFAULT_THINKING_EFFORT,
    tool_choice: Any = None,
    response_format: Any = None,
    revision: str = REVISION,
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
            revision=revision,
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
    revision: str = REVISION,
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
    if revision not in REVISIONS:
        raise EncoderError(f"no Kimi-K3 encoder revision {revision!r} (known: {', '.join(REVISIONS)})")
    prepared = [_normalized(message, index, revision) for index, message in _in_call_order(messages)]
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
            out += _assistant(message, index, thinking=thinking, revision=revision)
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


def _assistant(message: Mapping[str, Any], index: int, *, thinking: bool, revision: str) -> Segments:
    out: Segments = []
    if thinking:  # the think channel is structural: there, empty or not, with thinking on
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        out += xtml.open_tag("think")
        # a590ce09 writes any reasoning but "" (whitespace too); c5d1dd4 only one with a non-space
        if reasoning is not None and (str(reasoning).strip() if revision == EARLIER else str(reasoning)):
            out += xtml.text(reasoning)
        out += xtml.close_tag("think")
    out += xtml.open_tag("response") + _content(message.get("content"), index) + xtml.close_tag("response")
    calls = message.get("tool_calls")
    if calls:
        out += xtml.open_tag("tools")
        for number, call in enumerate(calls, start=1):
            function = _function(call)
            out += xtml.open_tag("call", [("tool", function["name"]), ("index", number)])
            if "raw" in function:
                out += xtml.open_tag("json", [("type", "object")]) + xtml.text(function["raw"]) + xtml.close_tag("json")
            for key, kind, text in function.get("arguments", ()):
                out += xtml.open_tag("argument", [("key", key), ("type", kind)])
                out += xtml.text(text)
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


def _normalized(message: Mapping[str, Any], index: int, revision: str) -> tuple[int, dict[str, Any]]:
    """The message as the reference renders it: tools keys sorted, each call's arguments as the
    (key, type, text) it writes, or `raw` text it writes in a `json` element."""
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
        kept = {"name": function["name"], **_arguments(function.get("arguments"), where, revision)}
        prepared.append({**call, "function": kept})
    normalized["tool_calls"] = prepared
    return index, normalized


def _arguments(arguments: Any, where: str, revision: str) -> dict[str, Any]:
    """`{"arguments": [(key, type, text), ...]}` or `{"raw": text}`, as the revision writes them:
    a590ce09 reads a JSON string one level deep (`xtml.text_arguments`, any other string raw);
    c5d1dd4 parses it whole and writes each value again, refusing JSON that is not an object."""
    if arguments is None or arguments == "" or (revision == EARLIER and isinstance(arguments, str) and not arguments.strip()):
        return {"arguments": []}
    if isinstance(arguments, Mapping):
        return {"arguments": xtml.mapping_arguments(arguments)}
    if not isinstance(arguments, str):
        raise EncoderError(f"{where}.function.arguments is neither an object nor a JSON string")
    if revision != EARLIER:
        parsed = xtml.text_arguments(arguments)
        return {"raw": arguments} if parsed is None else {"arguments": parsed}
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"raw": arguments}
    if not isinstance(value, dict):
        raise EncoderError(f"{where}.function.arguments is JSON but not an object")
    return {"arguments": xtml.mapping_arguments(value)}


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

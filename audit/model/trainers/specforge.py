"""SpecForge 0.2.0's text preprocessing reimplemented: a conversation to `(input_ids, loss_mask)`.

What `specforge/data/parse.py` GeneralParser / ThinkingParser / GLMParser do (the rules, as data,
in `rules/trainers/specforge-0.2.0.toml`; docs/trainer-view.md walks through them):

1. `plan_conversation`: messages normalised (`role` or `from`, human/gpt mapped, `content` or
   `value` or ""), the data's first system message kept (role and content only), else the
   template's system prompt inserted; leading non-user messages dropped; the conversation cut
   at the first tool message that follows neither an assistant nor a tool message, or the first
   assistant message that follows neither a user nor a tool message; each kept message reduced
   to the parser's keys, tool calls sanitised (arguments json.loads'ed, `{}` when they fail).
2. `render_plans`: one `apply_chat_template(..., add_generation_prompt=False)` per
   conversation, with `enable_thinking` as the parser passes it; a ValueError or TypeError
   falls back to SpecForge's own header rendering, any other error stops SpecForge.
3. `masked_sequences`: the text encoded (no special tokens added) and cut at `max_length`; the
   mask set over every match of the template's assistant pattern, each bound being the length
   of the encoded text before it (so a token merged across a bound is left out), then cleared
   over each ignored text. The texts and every prefix are encoded in one batched call.

`tests/test_trainer_view.py` compares this with what the real wheel produced on the shipped
samples (`fixtures/trainer_references/`), array for array.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

import numpy as np

from audit.model.rendering.chat_rendering import chat_renderer
from audit.model.rendering.templating import CHAT_TEMPLATE, failure_reason, utf8_text
from audit.model.tokens.flat_ids import FlatIds
from audit.model.tokens.tokenizer import Tokenizer
from audit.model.trainers.trainer_rules import PatternRules, TemplateRules, Trainer


@dataclass(frozen=True)
class Refusal:
    """A conversation the trainer trains nothing of, and why; `stops` when the trainer raises
    (its whole preprocessing run fails there), not only skips it."""

    reason: str
    stops: bool = False


@dataclass
class SpecForgePlan:
    """The messages the parser hands to the chat template, and what it changed on the way.

    Indices are into the conversation as given.
    """

    messages: list[dict[str, Any]]
    tools: list[Any] | None
    system_inserted: bool = False
    dropped: list[tuple[int, str]] = field(default_factory=list)  # (index, why) by role order
    emptied_arguments: list[tuple[int, str]] = field(default_factory=list)  # (index, tool name)
    removed_tool_calls: list[int] = field(default_factory=list)  # tool_calls text that is not JSON
    dropped_keys: list[tuple[int, str]] = field(default_factory=list)  # (index, key) with a value


@dataclass
class TrainedSequence:
    """What a trainer trains on for one conversation: ids and mask (int64, 0/1), the text they
    encode, and how many ids the text had before the `max_length` cut."""

    input_ids: np.ndarray
    loss_mask: np.ndarray
    text: str
    full_length: int


def normalize_message(message: Any) -> dict[str, Any]:
    """`Parser._normalize_message`: role from `role` or `from`, content from `content` or
    `value` (else ""), human/user -> user, gpt/assistant -> assistant, other roles as they are."""
    role = message.get("role", message.get("from", ""))
    content = message.get("content") or message.get("value") or ""
    if role in ("human", "user"):
        role = "user"
    elif role in ("gpt", "assistant"):
        role = "assistant"
    normalized = {**message, "role": role, "content": content}
    normalized.pop("from", None)
    normalized.pop("value", None)
    return normalized


def plan_conversation(
    conversation: Any, tools: Any, trainer: Trainer, *, undone: bool = False
) -> SpecForgePlan | Refusal:
    """What the parser makes of `conversation` before rendering (see the module docs).

    `undone`: the same, with the changes SpecForge makes on purpose left out (no system prompt
    inserted, no message dropped by role order, reasoning_content kept, arguments that do not
    parse kept as written): what the trainer view compares ids and masks on, so that each of
    those changes is named by itself and only the rest counts as re-tokenisation.
    """
    try:
        return _plan(conversation, tools, trainer, undone=undone)
    except (ValueError, RecursionError) as exc:
        # json.loads past its limits (an integer of over 4,300 digits, arguments nested past the
        # recursion limit) raises what SpecForge catches not (it catches JSONDecodeError only).
        return Refusal(f"SpecForge's parser raises on it ({failure_reason(exc)})", stops=True)


def _plan(conversation: Any, tools: Any, trainer: Trainer, *, undone: bool) -> SpecForgePlan | Refusal:
    template, parser = trainer.template, trainer.parser
    assert template is not None and parser is not None
    if not conversation:
        return Refusal("SpecForge skips an empty conversation (preprocess_conversations: `if not source`)")
    try:
        normalized = [normalize_message(message) for message in conversation]
    except (AttributeError, TypeError) as exc:
        return Refusal(f"SpecForge's message normalisation raises on it ({failure_reason(exc)})", stops=True)
    plan = SpecForgePlan(messages=[], tools=_tools(tools))
    indices = list(range(len(normalized)))
    if normalized[0]["role"] == "system":
        plan.messages.append({"role": "system", "content": normalized[0]["content"]})
        indices = indices[1:]
    elif template.system_prompt and not undone:
        plan.messages.append({"role": "system", "content": template.system_prompt})
        plan.system_inserted = True
    keys = (*parser.keys, "reasoning_content") if undone else parser.keys
    if undone:
        plan.messages.extend(_sanitize(normalized[index], index, keys, plan, keep_unparsed=True) for index in indices)
        return plan
    while indices and normalized[indices[0]]["role"] != "user":
        plan.dropped.append((indices[0], f"a leading {normalized[indices[0]]['role']!r} message before the first user turn"))
        indices = indices[1:]
    for j, index in enumerate(indices):
        role = normalized[index]["role"]
        if j > 0:
            previous = normalized[indices[j - 1]]["role"]
            why = None
            if role == "tool" and previous not in ("assistant", "tool"):
                why = f"a 'tool' message must follow an 'assistant' or 'tool' message, not {previous!r}"
            elif role == "assistant" and previous not in ("user", "tool"):
                why = f"an 'assistant' message must follow a 'user' or 'tool' message, not {previous!r}"
            if why is not None:
                plan.dropped.extend((rest, why) for rest in indices[j:])
                break
        plan.messages.append(_sanitize(normalized[index], index, parser.keys, plan))
    return plan


def _tools(tools: Any) -> list[Any] | None:
    """`build_eagle3_dataset`'s tools column: a JSON string decoded, a list kept, else none."""
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError:
            return None
    return tools if isinstance(tools, list) and tools else None


def _sanitize(
    message: dict[str, Any], index: int, keys: tuple[str, ...], plan: SpecForgePlan, *, keep_unparsed: bool = False
) -> dict[str, Any]:
    """`Parser._sanitize_message`: the parser's keys only; tool calls decoded and reduced
    (`keep_unparsed`: arguments that do not parse are left as written, not made `{}`)."""
    cleaned = {key: value for key, value in message.items() if key in keys}
    plan.dropped_keys.extend((index, key) for key, value in message.items() if key not in keys and value)
    if "tool_calls" not in cleaned:
        return cleaned
    calls = cleaned["tool_calls"]
    if isinstance(calls, str):
        try:
            calls = json.loads(calls)
        except json.JSONDecodeError:
            cleaned.pop("tool_calls")
            plan.removed_tool_calls.append(index)
            return cleaned
    if isinstance(calls, list):
        sanitized = []
        for call in calls:
            if not isinstance(call, dict):
                continue
            clean: dict[str, Any] = {"id": call.get("id", ""), "type": call.get("type", "function")}
            function = call.get("function", {})
            if isinstance(function, dict):
                name = function.get("name", "")
                arguments = function.get("arguments", {})
                if isinstance(arguments, str):
                    try:
                        arguments = json.loads(arguments)
                    except json.JSONDecodeError:
                        arguments = arguments if keep_unparsed else {}
                        plan.emptied_arguments.append((index, str(name)))
                clean["function"] = {"name": name, "arguments": arguments}
            sanitized.append(clean)
        cleaned["tool_calls"] = sanitized
    return cleaned


def template_kwargs(trainer: Trainer) -> dict[str, Any]:
    """The template variables the parser passes: ThinkingParser's enable_thinking=True, GLMParser's
    default enable_thinking=False."""
    template, parser = trainer.template, trainer.parser
    assert template is not None and parser is not None
    kwargs: dict[str, Any] = {}
    if parser.pass_enable_thinking and template.enable_thinking:
        kwargs["enable_thinking"] = True
    if parser.enable_thinking_default is not None:
        kwargs.setdefault("enable_thinking", parser.enable_thinking_default)
    return kwargs


def render_plans(
    tokenizer: Tokenizer, plans: list[SpecForgePlan], trainer: Trainer, renderer: str = CHAT_TEMPLATE
) -> list[str | Refusal]:
    """Each plan's text, as `GeneralParser.apply_chat_template` (and its fallback) renders it;
    `renderer` is the profile's (Kimi-K3's tokenizer renders with its Python encoder:
    `audit.model.rendering.chat_rendering`)."""
    kwargs = template_kwargs(trainer)
    render_chat = chat_renderer(tokenizer, renderer)
    texts: list[str | Refusal] = []
    for plan in plans:
        try:
            text = render_chat(plan.messages, plan.tools, add_generation_prompt=False, **kwargs)
        except (ValueError, TypeError):
            texts.append(_encodable(_fallback_text(tokenizer, plan, trainer)))
        except Exception as exc:  # jinja's TemplateError and the like: SpecForge does not catch them
            texts.append(Refusal(f"the chat template raises on it ({failure_reason(exc)}): SpecForge stops", stops=True))
        else:
            texts.append(_encodable(text))
    return texts


def _encodable(text: str | Refusal) -> str | Refusal:
    """The text, unless its tokenizer cannot encode it (a lone surrogate, from arguments that
    json.loads decoded): SpecForge's tokenizer call raises then."""
    if isinstance(text, Refusal):
        return text
    try:
        return utf8_text(text)
    except ValueError as exc:
        return Refusal(f"its tokenizer raises on the rendering ({exc}): SpecForge stops", stops=True)


def _fallback_text(tokenizer: Tokenizer, plan: SpecForgePlan, trainer: Trainer) -> str | Refusal:
    """GeneralParser.parse's rendering for a tokenizer whose template raised ValueError/TypeError."""
    template = trainer.template
    assert template is not None
    bos = getattr(tokenizer.hf, "bos_token", None)
    parts = [bos] if bos else []
    try:
        for message in plan.messages:
            if message["role"] == "system":
                parts.append(message["content"])
            elif message["role"] == "user":
                parts.append(f"{template.user_header or ''}{message['content']}")
            elif message["role"] == "assistant":
                parts.append(f"{template.assistant_header or ''}{message['content']}{template.end_of_turn_token or ''}")
        return "".join(parts)
    except TypeError as exc:  # a content that is not text
        return Refusal(f"SpecForge's fallback rendering raises on it ({failure_reason(exc)})", stops=True)


@lru_cache(maxsize=32)
def _pattern(header: str, pattern: PatternRules, end_text: str | None) -> re.Pattern[str]:
    """`set_assistant_pattern`: the header, then a lazy group up to the turn's end or the text's."""
    ends = [re.escape(text) for text in pattern.ends]
    if end_text is not None:
        ends.insert(0, re.escape(end_text))
    if pattern.end_regex is not None:
        ends.append(pattern.end_regex)
    after = f"(?:{re.escape(pattern.optional_after_header)})?" if pattern.optional_after_header else ""
    return re.compile(re.escape(header) + after + r"([\s\S]*?(?:" + "|".join([*ends, "$"]) + "))", re.DOTALL)


def mask_bounds(text: str, template: TemplateRules, pattern: PatternRules) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Character spans the mask sets (each assistant match's group) and clears (each ignored
    text), in the order SpecForge applies them."""
    assert template.assistant_header is not None
    end_text = getattr(template, pattern.end) if pattern.end else None
    matches = _pattern(template.assistant_header, pattern, end_text).finditer(text)
    trained = [(m.start(1), m.end(1)) for m in matches]
    ignored = []
    for token in template.ignore_token or ():
        start = 0
        while (at := text.find(token, start)) != -1:
            ignored.append((at, at + len(token)))
            start = at + len(token)
    return trained, ignored


class Encoder(Protocol):
    """What encodes a trainer's texts: the run's tokenizer, or the one the trainer's own
    transformers builds from the folder (`audit.model.trainers.trainer_load.TrainerEncoder`)."""

    def encode_flat(self, texts: list[str]) -> FlatIds: ...


def masked_sequences(
    tokenizer: Encoder,
    texts: list[str],
    template: TemplateRules,
    pattern: PatternRules,
    max_length: int | None,
    *,
    last_turn_only: bool = False,
) -> list[TrainedSequence]:
    """Each text's ids (cut at `max_length`, None: not cut) and loss mask, as GeneralParser.parse
    sets it. One batched encode holds every text and every prefix a bound needs."""
    bounds = [mask_bounds(text, template, pattern) for text in texts]
    if last_turn_only:
        bounds = [(trained[-1:], ignored) for trained, ignored in bounds]
    wanted: list[str] = []
    slots: list[dict[int, int]] = []
    for text, (trained, ignored) in zip(texts, bounds, strict=True):
        ends = {0, len(text)} | {c for span in (*trained, *ignored) for c in span}
        slot = {}
        for end in sorted(ends):
            if 0 < end < len(text):
                slot[end] = len(wanted)
                wanted.append(text[:end])
        slots.append(slot)
    flat = tokenizer.encode_flat([*texts, *wanted]) if texts else None
    out: list[TrainedSequence] = []
    for i, (text, (trained, ignored)) in enumerate(zip(texts, bounds, strict=True)):
        assert flat is not None
        ids = flat.values[flat.offsets[i] : flat.offsets[i + 1]].astype(np.int64)
        full = len(ids)
        if max_length is not None:
            ids = ids[:max_length]
        # Tokens in the encoding of the text up to each bound (0 before it, all at its end).
        before = {0: 0, len(text): full}
        for end, at in slots[i].items():
            k = len(texts) + at
            before[end] = int(flat.offsets[k + 1] - flat.offsets[k])
        mask = np.zeros(len(ids), dtype=np.int64)
        for value, spans in ((1, trained), (0, ignored)):
            for start, end in spans:
                lo, hi = min(before[start], len(ids)), min(before[end], len(ids))
                if lo < hi:
                    mask[lo:hi] = value
        out.append(TrainedSequence(ids, mask, text, full))
    return out


def specforge_samples(
    tokenizer: Tokenizer, conversations: list[Any], tools: list[Any], trainer: Trainer, renderer: str = CHAT_TEMPLATE
) -> list[tuple[SpecForgePlan | None, TrainedSequence | Refusal]]:
    """What SpecForge trains for each conversation: its plan and sequence, or why nothing."""
    template, pattern = trainer.template, trainer.pattern
    assert template is not None and pattern is not None
    plans = [plan_conversation(c, t, trainer) for c, t in zip(conversations, tools, strict=True)]
    ready = [plan for plan in plans if isinstance(plan, SpecForgePlan)]
    texts = iter(render_plans(tokenizer, ready, trainer, renderer))
    rendered = [next(texts) if isinstance(plan, SpecForgePlan) else plan for plan in plans]
    good = [text for text in rendered if isinstance(text, str)]
    sequences = iter(masked_sequences(tokenizer, good, template, pattern, trainer.max_length))
    return [
        (plan if isinstance(plan, SpecForgePlan) else None, next(sequences) if isinstance(text, str) else text)
        for plan, text in zip(plans, rendered, strict=True)
    ]

"""Prompt rendering: chat messages to the prompt a model is sent, in one place.

The generator renders each prompt with these functions and sends the ids; TPL001 renders the
record's messages with the same functions and compares. Because both go through
`render_prompts` and `encode_prompts`, the prompt a run sends and the prompt the audit expects
cannot drift apart.

How a family renders is the profile's choice: `encoder = NAME` in its TOML names an entry of
`RENDERERS`; without it, `chat_template`, the tokenizer's own jinja template
(`apply_chat_template(..., add_generation_prompt=True, tokenize=False)`). Families that ship a
Python encoder instead of a template (DeepSeek-V3.2's `encoding_dsv32.py`, V4's
`encoding_dsv4.py`, reimplemented in `audit.model.encoders`) are the entries `deepseek-v3.2` and
`deepseek-v4`: a function from (tokenizer, messages, tools, thinking, template variables) to the
prompt text. Which template variables switch thinking is the profile's too (`[template]`, read
by `Profile.template_kwargs`): MiniMax-M3 reads `thinking_mode`, others `enable_thinking` or
`thinking`. A renderer may also know other real renderings of the same conversation
(`variants`: DeepSeek-V3.2's tools preamble exists in two real copies), which TPL001 accepts.

    texts = render_prompts(tokenizer, [messages], [tools], thinking=True,
                           template_kwargs=profile.template_kwargs)
    [ids] = encode_prompts(tokenizer, texts)          # or prompt_ids(...) for both steps
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from audit.base.errors import ConfigError
from audit.model.encoders import ENCODERS, SegmentedPrompt, deepseek_v32, kimi_k3
from audit.model.rendering.argument_forms import other_argument_form
from audit.model.rendering.segment_encoding import encoded_by_segments
from audit.model.tokens.flat_ids import FlatIds
from audit.model.tokens.tokenizer import Tokenizer

CHAT_TEMPLATE = "chat_template"

Messages = list[dict[str, Any]]
Tools = list[dict[str, Any]] | None
# (tokenizer, messages, tools, thinking, template variables) -> the prompt text
RenderFunction = Callable[[Tokenizer, Messages, Tools, bool, dict[str, Any]], str]


@dataclass(frozen=True)
class RenderFailure:
    """A prompt the renderer refused (a template that raises on these messages), and why."""

    reason: str


@dataclass(frozen=True)
class PromptRenderer:
    """One way of turning chat messages into prompt text, ending with the generation prompt."""

    name: str
    # (tokenizer, messages, tools, thinking, template variables) -> the prompt text. The variables
    # are the thinking switch (the profile's, or `thinking_kwargs`), then the record's own
    # `chat_template_kwargs`; an encoder reads the ones it knows.
    render: RenderFunction
    # Can it render with this tokenizer? (the jinja renderer needs a chat template)
    available: Callable[[Tokenizer], bool]
    requirement: str  # what `available` needs, for the error line when it is missing
    # Other real renderings of the same conversation, which TPL001 accepts as well: a prompt
    # rendered by any of them is what some real serving path sends.
    variants: tuple[RenderFunction, ...] = ()


def thinking_kwargs(thinking: bool) -> dict[str, Any]:
    """The thinking switch under both names templates read, for profiles that name no switch.

    Kimi and DeepSeek-V3.1 read `thinking`, Qwen3 and GLM `enable_thinking`; a template
    ignores the name it does not use. A template with a switch of its own (MiniMax-M3's
    `thinking_mode`) is given it by its profile's `[template]` table
    (`Profile.template_kwargs`).
    """
    return {"thinking": thinking, "enable_thinking": thinking}


def _render_chat_template(
    tokenizer: Tokenizer, messages: Messages, tools: Tools, thinking: bool, extra: dict[str, Any]
) -> str:
    return _render_any_argument_form(tokenizer, messages, tools, extra, add_generation_prompt=True)


# A chat template that tests a call's arguments for a mapping (`function['arguments'] is mapping`).
_MAPPING_TEST = re.compile(r"arguments['\"\]]*\s+is\s+mapping")


@lru_cache(maxsize=8)
def _tests_for_mapping(template_text: str) -> bool:
    """Whether a chat template's source tests a call's arguments for a mapping (searched once
    per template, not once per render)."""
    return _MAPPING_TEST.search(template_text) is not None


def _render_as_given(
    tokenizer: Tokenizer, messages: Messages, tools: Tools, thinking: bool, extra: dict[str, Any]
) -> str:
    return tokenizer.render_chat(messages, tools or None, add_generation_prompt=True, **extra)


def _render_any_argument_form(
    tokenizer: Tokenizer, messages: Messages, tools: Tools, extra: dict[str, Any], *, add_generation_prompt: bool
) -> str:
    def render(conversation: Messages) -> str:
        # As transformers' apply_chat_template(..., tokenize=False), without importing
        # transformers where the tokenizer can (see `Tokenizer.render_chat`).
        return tokenizer.render_chat(
            conversation, tools or None, add_generation_prompt=add_generation_prompt, **extra
        )

    if _tests_for_mapping(tokenizer.chat_template_text) and (objects := other_argument_form(messages, True)):
        # A template that tests for a mapping takes one as its own form and writes a string as
        # it is (Gemma-4 pastes a JSON string between its braces); serving stacks give it the
        # mapping (SGLang's normalize_assistant_tool_call_arguments parses string arguments).
        try:
            return render(objects)
        except Exception:  # noqa: BLE001, S110 (the messages as given are tried next)
            pass
    try:
        return render(messages)
    except Exception as refused:  # jinja raises many types; render_prompts reports the first
        # Templates take history tool-call arguments in one form: Qwen3.5/3.6, GLM and
        # MiniMax iterate a mapping (a JSON string raises), DeepSeek-R1/V3.1 concatenate a
        # string (a mapping raises). Serving stacks parse string arguments first (SGLang's
        # normalize_assistant_tool_call_arguments); render the form the template accepts.
        # A conversation may mix both forms: try every call as an object, then as a string.
        others = [other_argument_form(messages, to_objects=side) for side in (True, False)]
        forms = [form for form in others if form is not None and form != messages]
        if not forms:
            raise
        for form in forms:
            try:
                return render(form)
            except Exception:  # noqa: BLE001, S112 (the first refusal is the one to report)
                continue
        raise refused from None


def render_conversations(
    tokenizer: Tokenizer,
    messages_list: Sequence[Messages],
    tools_list: Sequence[Tools],
    template_kwargs: Sequence[dict[str, Any]],
) -> list[str | RenderFailure]:
    """Whole conversations through the tokenizer's chat template, with no generation prompt (as
    a trainer renders the turns it trains), tool-call arguments in the form the template takes;
    a conversation the template refuses is a `RenderFailure` in its place."""
    texts: list[str | RenderFailure] = []
    for messages, tools, kwargs in zip(messages_list, tools_list, template_kwargs, strict=True):
        try:
            texts.append(utf8_text(_render_any_argument_form(tokenizer, messages, tools, kwargs, add_generation_prompt=False)))
        except Exception as exc:  # jinja raises many types; each means "cannot render"
            texts.append(RenderFailure(failure_reason(exc)))
    return texts


def failure_reason(exc: BaseException) -> str:
    """`Type: first line` of why a renderer refused, for a finding's message."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def utf8_text(text: str) -> str:
    """`text`, when it can be encoded: a rendering that holds a lone surrogate (a `\\ud800` escape
    in a JSON string the renderer parsed, such as a call's arguments, which Python's json takes)
    is no UTF-8 text, and no tokenizer encodes it. Raises ValueError, a refusal to render."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as bad:
            code = ord(text[bad.start])
            raise ValueError(f"the rendering holds U+{code:04X}, a lone surrogate, which is not UTF-8") from None
    return text


def _encoder_options(name: str, thinking: bool, extra: dict[str, Any]) -> dict[str, Any]:
    """The encoder's keyword arguments: the run's thinking mode, unless the record's
    `chat_template_kwargs` say otherwise (`thinking` or `enable_thinking` as SGLang reads it,
    `thinking_mode` "thinking"/"chat" as the release encoders do); V4's `reasoning_effort`;
    Kimi-K3's `thinking_effort`, `tool_choice` and `response_format` (keywords its
    `apply_chat_template` takes)."""
    for key in ("thinking", "enable_thinking"):
        if isinstance(extra.get(key), bool):
            thinking = extra[key]
            break
    else:
        if extra.get("thinking_mode") in ("thinking", "chat"):
            thinking = extra["thinking_mode"] == "thinking"
    options: dict[str, Any] = {"thinking": thinking}
    if name == "deepseek-v4" and extra.get("reasoning_effort") is not None:
        options["reasoning_effort"] = extra["reasoning_effort"]
    if name == "kimi-k3":
        for key in ("thinking_effort", "tool_choice", "response_format"):
            if key in extra:
                options[key] = extra[key]
    return options


def _encoder_render(name: str, **fixed: Any) -> RenderFunction:
    """A built-in encoder (`audit.model.encoders`) as a render function. It ignores the tokenizer:
    the text is the prompt, special-token strings included, encoded by `encode_prompts`."""

    def render(
        tokenizer: Tokenizer,
        messages: Messages,
        tools: Tools,
        thinking: bool,
        extra: dict[str, Any],
    ) -> str:
        options = _encoder_options(name, thinking, extra)
        return ENCODERS[name](messages, tools, **options, **fixed)

    return render


RENDERERS: dict[str, PromptRenderer] = {
    # A template that takes history arguments in either form renders the form the messages give
    # too (`apply_chat_template` as called on OpenAI-style messages, JSON strings as they are).
    CHAT_TEMPLATE: PromptRenderer(
        name=CHAT_TEMPLATE,
        render=_render_chat_template,
        available=lambda tokenizer: tokenizer.has_chat_template,
        requirement="a chat template (chat_template.jinja, or chat_template in tokenizer_config.json)",
        variants=(_render_as_given,),
    ),
    # DeepSeek-V3.2 as SGLang serves it (`encoding_dsv32.py`); its tools preamble also exists
    # with blank lines between paragraphs, as DeepSeek's release file reads (deepseek_v32
    # RELEASE_TOOLS_PREAMBLE): a prompt rendered that way is accepted too, nothing else is.
    "deepseek-v3.2": PromptRenderer(
        name="deepseek-v3.2",
        render=_encoder_render("deepseek-v3.2"),
        available=lambda tokenizer: True,
        requirement="nothing (the encoder is built in)",
        variants=(
            _encoder_render("deepseek-v3.2", tools_preamble=deepseek_v32.RELEASE_TOOLS_PREAMBLE),
        ),
    ),
    # DeepSeek-V4 as its release encoder renders it; a request at reasoning effort "max" (an
    # option the messages do not carry) puts a fixed paragraph first: accepted too, unless the
    # record's chat_template_kwargs name its effort.
    "deepseek-v4": PromptRenderer(
        name="deepseek-v4",
        render=_encoder_render("deepseek-v4"),
        available=lambda tokenizer: True,
        requirement="nothing (the encoder is built in)",
        variants=(_encoder_render("deepseek-v4", reasoning_effort="max"),),
    ),
    # Kimi-K3 as its `apply_chat_template` renders it (`encoding_k3.py` at a590ce09): with
    # thinking on, the thinking-effort note at its default "max". A request may name another
    # effort ("low", "high") or none (`build_chat_segments` called directly), and the file's
    # earlier revision writes string arguments otherwise: accepted too (an effort unless the
    # record's chat_template_kwargs name it). So is a request's `tool_choice` ("required",
    # "none") or `response_format` json_object, options the messages do not carry either: the
    # renderer writes each as a system note after the messages. The text is a `SegmentedPrompt`.
    "kimi-k3": PromptRenderer(
        name="kimi-k3",
        render=_encoder_render("kimi-k3"),
        available=lambda tokenizer: True,
        requirement="nothing (the encoder is built in)",
        variants=(
            *(_encoder_render("kimi-k3", thinking_effort=effort) for effort in ("high", "low", None)),
            _encoder_render("kimi-k3", revision=kimi_k3.EARLIER),
            *(_encoder_render("kimi-k3", tool_choice=choice) for choice in ("required", "none")),
            _encoder_render("kimi-k3", response_format={"type": "json_object"}),
        ),
    ),
}


def get_renderer(name: str) -> PromptRenderer:
    """The renderer a profile names; ConfigError when there is none of that name."""
    try:
        return RENDERERS[name]
    except KeyError:
        raise ConfigError(
            f"unknown prompt renderer {name!r} (known: {', '.join(RENDERERS)})"
        ) from None


def render_variants(
    tokenizer: Tokenizer,
    messages: Messages,
    tools: Tools,
    *,
    thinking: bool,
    extra_kwargs: dict[str, Any] | None = None,
    renderer: str = CHAT_TEMPLATE,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[str]:
    """The other real renderings of one prompt (the renderer's `variants`), those that render;
    the arguments as `render_prompts` takes them."""
    switch = dict(template_kwargs) if template_kwargs is not None else thinking_kwargs(thinking)
    texts = []
    for render in get_renderer(renderer).variants:
        try:
            texts.append(utf8_text(render(tokenizer, messages, tools, thinking, {**switch, **(extra_kwargs or {})})))
        except Exception:  # noqa: BLE001, S112 (a variant that refuses is simply not one)
            continue
    return texts


def render_prompts(
    tokenizer: Tokenizer,
    messages_list: Sequence[Messages],
    tools_list: Sequence[Tools],
    *,
    thinking: bool,
    extra_kwargs: Sequence[dict[str, Any] | None] | None = None,
    renderer: str = CHAT_TEMPLATE,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[str | RenderFailure]:
    """Each prompt's text, generation prompt included, or why it cannot be rendered.

    `template_kwargs` are the template variables that set the thinking mode (a profile's
    `template_kwargs`, e.g. MiniMax-M3's `thinking_mode`); default `thinking_kwargs(thinking)`.
    `extra_kwargs` holds per-prompt keyword arguments for the renderer (a record's
    `chat_template_kwargs`); they override the thinking switch. A prompt the renderer refuses
    is a `RenderFailure` in its place, never an exception: one bad prompt does not stop a batch.
    """
    render = get_renderer(renderer).render
    switch = dict(template_kwargs) if template_kwargs is not None else thinking_kwargs(thinking)
    extras = extra_kwargs if extra_kwargs is not None else [None] * len(messages_list)
    texts: list[str | RenderFailure] = []
    for messages, tools, extra in zip(messages_list, tools_list, extras, strict=True):
        try:
            texts.append(utf8_text(render(tokenizer, messages, tools, thinking, {**switch, **(extra or {})})))
        except Exception as exc:  # jinja and encoders raise many types; each means "cannot render"
            texts.append(RenderFailure(failure_reason(exc)))
    return texts


def encode_prompts(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Rendered prompts to ids in one batched call: special-token strings recognised, nothing added.

    Nothing is added because the rendering already holds every special token (a BOS added
    here would be doubled).
    """
    flat = encode_prompts_flat(tokenizer, texts)
    return [flat.sequence(i) for i in range(len(flat))]


def encode_prompts_flat(tokenizer: Tokenizer, texts: Sequence[str]) -> FlatIds:
    """`encode_prompts` as one flat array (no Python list per prompt).

    A `SegmentedPrompt` (Kimi-K3's encoder) is encoded segment by segment, as its model's
    tokenizer encodes it: markers with special-token strings recognised, the rest with them not
    recognised, each segment on its own; the ids of its segments, joined.
    """
    if not any(isinstance(text, SegmentedPrompt) for text in texts):
        # The round trip's flat encoder: the same ids, from fastokens once a run has built it.
        return tokenizer.encode_flat(list(texts))
    return FlatIds.from_sequences(encoded_by_segments(tokenizer, texts))


def prompt_ids(
    tokenizer: Tokenizer,
    messages_list: Sequence[Messages],
    tools_list: Sequence[Tools],
    *,
    thinking: bool,
    extra_kwargs: Sequence[dict[str, Any] | None] | None = None,
    renderer: str = CHAT_TEMPLATE,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[list[int] | RenderFailure]:
    """`render_prompts` then `encode_prompts`: each prompt's ids, or why it cannot be rendered."""
    texts = render_prompts(
        tokenizer,
        messages_list,
        tools_list,
        thinking=thinking,
        extra_kwargs=extra_kwargs,
        renderer=renderer,
        template_kwargs=template_kwargs,
    )
    rendered = [text for text in texts if isinstance(text, str)]
    encoded = iter(encode_prompts(tokenizer, rendered) if rendered else [])
    return [next(encoded) if isinstance(text, str) else text for text in texts]

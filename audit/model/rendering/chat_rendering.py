"""What a trainer's call to the tokenizer's `apply_chat_template` renders, for a profile's family.

Trainers render a conversation with `tokenizer.apply_chat_template(..., tokenize=False)`. For
most families that is the chat template (`Tokenizer.render_chat`). Kimi-K3's tokenizer ships no
template: its `apply_chat_template` (`tokenization_kimi.py`, remote code) is `encoding_k3.py`'s
renderer, which audit carries as its `kimi-k3` encoder, so a trainer fed Kimi-K3 data renders
what that encoder renders: thinking on unless `thinking=False`, the thinking-effort note at
"max" unless `thinking_effort` names another (`kwargs.setdefault("thinking_effort", "max")`),
no generation prompt when the trainer asks for none; any other keyword (`enable_thinking`, which
SpecForge's ThinkingParser may pass) reaches `build_chat_segments` unread. The text is a
`SegmentedPrompt`: a trainer that tokenizes the text (SpecForge's `tokenizer(conversation)`)
encodes it whole, markers recognised anywhere; one that asks a server for the ids (speculators'
vLLM render endpoint) gets them segment by segment (`audit.model.rendering.templating.encode_prompts`).
DeepSeek-V3.2 and V4 tokenizers have neither a template nor a Python `apply_chat_template`:
their trainers meet the template's error, as `Tokenizer.render_chat` raises it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from audit.model.encoders import SegmentedPrompt, kimi_k3
from audit.model.tokens.tokenizer import Tokenizer

# (messages, tools, *, add_generation_prompt, **template keywords) -> the text
ChatRender = Callable[..., str]


def _kimi_k3(
    messages: list[Any], tools: list[Any] | None = None, *, add_generation_prompt: bool = True, **kwargs: Any
) -> str:
    """Kimi-K3's `TikTokenTokenizer.apply_chat_template(..., tokenize=False)`."""
    return SegmentedPrompt(
        kimi_k3.segments(
            messages,
            tools,
            thinking=bool(kwargs.get("thinking", True)),
            thinking_effort=kwargs.get("thinking_effort", kimi_k3.DEFAULT_THINKING_EFFORT),
            tool_choice=kwargs.get("tool_choice"),
            response_format=kwargs.get("response_format"),
            add_generation_prompt=add_generation_prompt,
        )
    )


# A profile's renderer -> its tokenizer's own `apply_chat_template`, where that is Python.
TOKENIZER_RENDERERS: dict[str, ChatRender] = {"kimi-k3": _kimi_k3}


def chat_renderer(tokenizer: Tokenizer, renderer: str) -> ChatRender:
    """What `apply_chat_template` renders for data of a profile whose renderer is `renderer`."""
    return TOKENIZER_RENDERERS.get(renderer, tokenizer.render_chat)

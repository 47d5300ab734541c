"""The prompt endings a tokenizer folder's own chat template renders, among those a profile lists
for several revisions of its family's template (`[generation_prompt] as_template_renders`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from audit.model.families.profile_tables import Continuation
from audit.model.rendering.templating import render_prompts
from audit.model.tokens.tokenizer import Tokenizer

# The prompts rendered to see how a template ends them: after a user turn, after a tool result.
_AFTER_USER: list[dict[str, Any]] = [{"role": "user", "content": "Hello"}]
_AFTER_TOOL: list[dict[str, Any]] = [
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "ok"},
]


def as_rendered(
    tokenizer: Tokenizer,
    template_kwargs: Callable[[bool], dict[str, Any]],
    suffixes: dict[str, tuple[str, ...]],
    continuations: tuple[Continuation, ...],
) -> tuple[dict[str, tuple[str, ...]], tuple[Continuation, ...]]:
    """Per mode, the generation prompts and the continuations the folder's template ends its
    prompts with (Gemma-4's E2B/E4B revision ends a thinking-off prompt otherwise than the
    larger checkpoints; its later revision opens the thought channel after a tool result); all
    of a mode's where the template renders none of them, or there is no template."""
    kept_suffixes = {}
    for mode, texts in suffixes.items():
        rendered = _render(tokenizer, template_kwargs, mode == "thinking", _AFTER_USER)
        fitting = tuple(text for text in texts if rendered is not None and rendered.endswith(text))
        kept_suffixes[mode] = fitting or texts
    kept: list[Continuation] = []
    for mode in ("thinking", "no_thinking"):
        mine = [c for c in continuations if mode in c.modes]
        rendered = _render(tokenizer, template_kwargs, mode == "thinking", _AFTER_TOOL)
        rendered_here = [c for c in mine if rendered is not None and rendered.endswith(c.suffix)]
        kept += [c for c in rendered_here or mine if c not in kept]
    return kept_suffixes, tuple(c for c in continuations if c in kept)


def _render(
    tokenizer: Tokenizer, template_kwargs: Callable[[bool], dict[str, Any]], thinking: bool,
    messages: list[dict[str, Any]],
) -> str | None:
    """A prompt as the folder's template renders it in one mode; None when the folder has no
    template or it cannot render."""
    if not tokenizer.has_chat_template:
        return None
    try:
        [rendered] = render_prompts(tokenizer, [messages], [None], thinking=thinking,
                                    template_kwargs=template_kwargs(thinking))
    except Exception:  # noqa: BLE001 (a template that cannot render keeps every ending)
        return None
    return rendered if isinstance(rendered, str) else None

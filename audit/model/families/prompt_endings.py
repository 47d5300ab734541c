"""How a prompt ends: the ids a generation-prompt suffix keeps whatever text precedes it, and
the reasoning state that ending leaves the model's output in."""

from __future__ import annotations

from typing import Literal

from audit.model.tokens.tokenizer import Tokenizer

# What the prompt leaves the output to do about reasoning:
#   prompt_opens  the prompt ends inside <think>: the output closes it exactly once
#   model_opens   the model writes <think> itself, first, then closes it exactly once
#   may_open      the output is reasoning from its start, with or without a <think> of its own
#                 first, and closes it exactly once (SGLang's DeepSeekR1Detector reads an
#                 output as `(<think>)*(.*)</think>`): DeepSeek-R1 after tool results
#   closed        no reasoning: thinking is off (the prompt holds <think></think>), or the
#                 family's turn after a tool result has none: no think tokens at all
#   none          the family has no think tokens (gpt-oss: segmented by harmony channels)
Reasoning = Literal["prompt_opens", "model_opens", "may_open", "closed", "none"]
REASONING_STATES: tuple[str, ...] = ("prompt_opens", "model_opens", "may_open", "closed", "none")
# The states in which an output holds reasoning that it closes with the response token.
THINKING_STATES: tuple[str, ...] = ("prompt_opens", "model_opens", "may_open")

# What may precede a suffix in a real prompt: a suffix's ids are those its text keeps after any
# of them (a BPE merge across the boundary changes the first ids of a suffix written as text).
_CONTEXTS = ("a", ".", " ", "\n", ">", "1", "\u3002", '"')


def suffix_ids(tokenizer: Tokenizer, text: str) -> tuple[int, ...]:
    """The ids a prompt ending with `text` ends with, whatever text precedes it.

    A suffix of single-id markers (`<｜Assistant｜><think>`) is its own encoding. A suffix
    written as plain text may merge with the text before it (`.<｜` is one piece in Qwen's
    BPE): its ids are the tail that every context leaves unchanged.
    """
    encodings = tokenizer.encode_remembered([text, *(context + text for context in _CONTEXTS)])
    bare = encodings[0]
    kept = 0
    while kept < len(bare) and all(
        len(other) > kept and other[-1 - kept] == bare[-1 - kept] for other in encodings[1:]
    ):
        kept += 1
    return tuple(bare[len(bare) - kept :])


def reasoning_left(
    suffix: tuple[int, ...], think_start: int | None, think_end: int | None, thinking: bool
) -> Reasoning:
    """The reasoning state a prompt ending with `suffix` leaves the output in."""
    if think_start is None or think_end is None:
        return "none"
    if think_end in suffix and (
        think_start not in suffix
        or _last_index(suffix, think_end) > _last_index(suffix, think_start)
    ):
        return "closed"
    if think_start in suffix:
        return "prompt_opens"
    return "model_opens" if thinking else "closed"


def _last_index(ids: tuple[int, ...], token_id: int) -> int:
    return len(ids) - 1 - ids[::-1].index(token_id)

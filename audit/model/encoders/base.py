"""What every built-in prompt encoder shares: its error type, its signature, its JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class EncoderError(ValueError):
    """A conversation the encoder cannot render, as the serving stack would refuse it.

    The message names the message index and what is wrong with it, in one line.
    """


class Encoder(Protocol):
    """A model's own prompt renderer: OpenAI-style `messages` and `tools` to the prompt text.

    The text ends with the generation prompt the serving stack appends, so encoding it with
    the model's tokenizer (special-token strings recognised, nothing added) gives the
    `input_ids` the server generates from.
    """

    def __call__(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        thinking: bool,
    ) -> str: ...


def to_json(value: Any) -> str:
    """JSON as DeepSeek's encoders write it: `json.dumps` defaults, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False)

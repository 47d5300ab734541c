"""What every built-in prompt encoder shares: its error type, its signature, its JSON, and the
segmented prompt of an encoder that keeps markers and content apart."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol


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


class Segment(NamedTuple):
    """A run of prompt text and how it is encoded: a `control` segment is markup (special-token
    strings in it are their ids); any other segment is text, in which the same strings are
    ordinary characters."""

    text: str
    control: bool = False


class SegmentedPrompt(str):
    """A prompt's text that remembers its segments, for an encoder whose model encodes each
    segment on its own (Kimi-K3's `encoding_k3.py`): content that spells a marker stays text,
    and a segment is never merged with its neighbours by the tokenizer.

    It is the joined text (so it prints, compares and is written as any prompt text);
    `audit.model.rendering.templating.encode_prompts` encodes it segment by segment. Anything that builds
    a new string from it (concatenation, slicing) gets plain text back, without the segments.
    """

    segments: tuple[Segment, ...]

    def __new__(cls, segments: Iterable[Segment]) -> SegmentedPrompt:
        kept = tuple(segment for segment in segments if segment.text)
        prompt = super().__new__(cls, "".join(segment.text for segment in kept))
        prompt.segments = kept
        return prompt

    def __reduce__(self) -> tuple[type[SegmentedPrompt], tuple[tuple[Segment, ...]]]:
        # Pickled and copied with its segments (str's own way would pass the text to __new__).
        return SegmentedPrompt, (self.segments,)

"""Prompts encoded segment by segment, as Kimi-K3's tokenizer encodes what its encoder renders.

`encoding_k3.py` hands its tokenizer a list of segments, not one text: markup segments are
encoded with special-token strings recognised, all others with them not recognised, and each
segment alone (never merged with its neighbours). A `SegmentedPrompt` carries its segments;
`audit.model.rendering.templating.encode_prompts` sends a batch holding one here.
"""

from __future__ import annotations

from collections.abc import Sequence

from audit.model.encoders import SegmentedPrompt
from audit.model.tokens.tokenizer import Tokenizer


def encoded_by_segments(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Each text's ids; a segmented prompt's from its segments, all encoded in two batches."""
    control: dict[str, int] = {}
    plain: dict[str, int] = {}
    for text in texts:
        for segment in text.segments if isinstance(text, SegmentedPrompt) else ():
            kind = control if segment.control else plain
            kind.setdefault(segment.text, len(kind))
    whole = [text for text in texts if not isinstance(text, SegmentedPrompt)]
    control_ids = tokenizer.encode_batch([*control, *whole]) if control or whole else []
    plain_ids = tokenizer.encode_batch_as_text(list(plain))
    whole_ids = iter(control_ids[len(control) :])
    encoded: list[list[int]] = []
    for text in texts:
        if not isinstance(text, SegmentedPrompt):
            encoded.append(next(whole_ids))
            continue
        ids: list[int] = []
        for segment in text.segments:
            ids += control_ids[control[segment.text]] if segment.control else plain_ids[plain[segment.text]]
        encoded.append(ids)
    return encoded

"""Built-in prompt encoders for models that ship Python instead of a chat template.

DeepSeek-V3.2 and V4 release an encoder script, not a Jinja template, so `apply_chat_template`
cannot render their prompts; Kimi-K3's `apply_chat_template` is Python of its own
(`encoding_k3.py`), which renders a prompt as segments encoded one by one (`SegmentedPrompt`). The project carries its own implementation of each (tested
token for token against the real one), so nothing from a model directory is executed. A
profile names one with `encoder = "deepseek-v3.2"`; `encoder(name)` returns its `render`.
"""

from __future__ import annotations

from audit.base.errors import ConfigError
from audit.model.encoders import deepseek_v4, deepseek_v32, kimi_k3
from audit.model.encoders.base import Encoder, EncoderError, Segment, SegmentedPrompt
from audit.model.encoders.sglang import sglang_request_messages

ENCODERS: dict[str, Encoder] = {
    "deepseek-v3.2": deepseek_v32.render,
    "deepseek-v4": deepseek_v4.render,
    "kimi-k3": kimi_k3.render,
}


def encoder(name: str) -> Encoder:
    """The built-in encoder called `name`; a `ConfigError` naming the known ones otherwise."""
    try:
        return ENCODERS[name]
    except KeyError:
        known = ", ".join(sorted(ENCODERS))
        raise ConfigError(f"no built-in prompt encoder {name!r} (known: {known})") from None


__all__ = [
    "ENCODERS",
    "Encoder",
    "EncoderError",
    "Segment",
    "SegmentedPrompt",
    "encoder",
    "sglang_request_messages",
]

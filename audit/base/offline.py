"""Nothing reaches a model hub at run time: tokenizers come from local directories only.

Set by every process that may load a tokenizer (the tokenizer module when it loads, and the
`--jobs` pool before it starts workers, so that both see the same environment); a setting the
user made is kept.
"""

from __future__ import annotations

import os

OFFLINE_SETTINGS = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}


def configure_offline() -> None:
    """The Hugging Face libraries stay offline (a setting the user made is kept)."""
    for name, value in OFFLINE_SETTINGS.items():
        os.environ.setdefault(name, value)

"""A Kimi-K3 stand-in tokenizer for the encoder and trainer tests.

`fixtures/tokenizers/kimi-k3-mini` when the folder is there; else Kimi-K2.5's fixture tokenizer
with `<|end_of_msg|>`, `<|open|>`, `<|close|>` and `<|sep|>` at Kimi-K3's ids (163586-163589), in
place of the K2.5 tokens there, written to a temporary folder.
"""

from __future__ import annotations

import json
from pathlib import Path

from audit.model.encoders import xtml
from audit.model.tokens.tokenizer import Tokenizer
from audit.model.tokens.tokenizer_loading import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def standin_tokenizer(folder: Path) -> Tokenizer:
    """The Kimi-K3 stand-in, written into the empty `folder` when the fixture is absent."""
    kimi_k3_mini = ROOT / "fixtures" / "tokenizers" / "kimi-k3-mini"
    if kimi_k3_mini.is_dir():
        return load_tokenizer(kimi_k3_mini)
    source = ROOT / "fixtures" / "tokenizers" / "kimi-k2.5-mini"
    names = {str(number): marker for marker, number in xtml.MARKER_IDS.items()}
    backend = json.loads((source / "tokenizer.json").read_text())
    for token in backend["added_tokens"]:
        token["content"] = names.get(str(token["id"]), token["content"])
    vocab = backend["model"]["vocab"]
    for text, number in list(vocab.items()):
        if str(number) in names:
            del vocab[text]
            vocab[names[str(number)]] = number
    (folder / "tokenizer.json").write_text(json.dumps(backend))
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    for number, token in config.get("added_tokens_decoder", {}).items():
        token["content"] = names.get(number, token["content"])
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return load_tokenizer(folder)

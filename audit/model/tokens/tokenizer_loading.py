"""Loading a tokenizer: from the state a first load cached, else through transformers."""

from __future__ import annotations

from pathlib import Path

from audit.model.tokens.fastcodec import fast_paths_enabled
from audit.model.tokens.tokenizer import Tokenizer
from audit.model.tokens.tokenizer_cache import (
    TokenizerState,
    load_state,
    state_key,
)
from audit.model.tokens.tokenizer_files import (
    checked_directory,
    fingerprint_directory,
    load_with_transformers,
)


def _restore(path: Path, sha256: str, trust_remote_code: bool, state: TokenizerState, key: str) -> Tokenizer | None:
    """The tokenizer from its cached state; None when this `tokenizers` cannot read it back."""
    try:
        hf = load_with_transformers(path, trust_remote_code) if state.kind != "backend" else None
        return Tokenizer(hf, path, sha256=sha256, trust_remote_code=trust_remote_code, state=state, cache_key=key)
    except Exception:  # any failure to restore means: load afresh, and store anew
        return None


def load_tokenizer(directory: str | Path, *, trust_remote_code: bool = False) -> Tokenizer:
    """Load a Hugging Face tokenizer from a local directory, or raise a ConfigError saying why.

    With the fast paths on, what a first load found is cached on disk per tokenizer
    (`audit.model.tokens.tokenizer_cache`): later loads read it back, without transformers when the
    tokenizer is a plain `tokenizer.json`. `AUDIT_TOKENIZER_BACKEND=tokenizers` always loads
    through transformers, the reference.
    """
    path = checked_directory(directory)
    sha256 = fingerprint_directory(path)
    if not fast_paths_enabled():
        return Tokenizer(load_with_transformers(path, trust_remote_code), path, sha256=sha256,
                         trust_remote_code=trust_remote_code)
    key = state_key(path, sha256, trust_remote_code=trust_remote_code)
    state = load_state(key)
    if state is not None and (restored := _restore(path, sha256, trust_remote_code, state, key)) is not None:
        return restored
    tokenizer = Tokenizer(load_with_transformers(path, trust_remote_code), path, sha256=sha256,
                          trust_remote_code=trust_remote_code, cache_key=key)
    tokenizer.installed_load  # noqa: B018 - decided while transformers' tokenizer is at hand, and kept
    tokenizer._keep_state()  # what a first load found; a large audit adds the rest
    return tokenizer

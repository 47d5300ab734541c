"""Loading a tokenizer: from the state a first load cached, else through transformers."""

from __future__ import annotations

from pathlib import Path

from audit.model.fastcodec import fast_paths_enabled
from audit.model.tokenizer import Tokenizer
from audit.model.tokenizer_cache import (
    StoredVocabulary,
    TokenizerState,
    compact_backend_json,
    load_state,
    state_key,
    store_state,
)
from audit.model.tokenizer_files import (
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
    (`audit.model.tokenizer_cache`): later loads read it back, without transformers when the
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
    store_state(key, state_of(tokenizer))
    return tokenizer


def state_of(tokenizer: Tokenizer) -> TokenizerState:
    """What `audit.model.tokenizer_cache` keeps of a tokenizer it loaded (the byte table built)."""
    decoder = tokenizer.byte_table
    template = tokenizer._verified_template
    backend_json = tokenizer._backend_json or (compact_backend_json(tokenizer._fast) if tokenizer._has_backend else None)
    skipped = None if backend_json is None else StoredVocabulary.skipped_in(backend_json)
    return TokenizerState(
        kind="backend" if tokenizer._has_backend else "remote",
        vocab_size=tokenizer.vocab_size,
        special_token_strings=tokenizer.special_token_strings,
        has_chat_template=tokenizer.has_chat_template,
        known=tokenizer._known,
        backend_json=backend_json,
        table=None if decoder is None else decoder.table,
        lengths=None if decoder is None else decoder.lengths,
        decoder_known=None if decoder is None else decoder.known,
        extra={
            "special_ids": sorted(tokenizer.special_ids),
            **({} if skipped is None else {"skipped_ids": skipped}),
            **({} if template is None else {"chat_template": template.to_dict()}),
        },
    )

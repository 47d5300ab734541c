"""The tokenizer's fast paths, and the cached state they grow.

The byte table (decoding by a numpy gather) and fastokens (encoding) are built only once the
work pays for them (`BYTE_TABLE_AFTER_IDS`, `FAST_ENCODER_AFTER_CHARS`, or the engine's
`expect_encoding` before a large file), and each time one is built the tokenizer's cached state
(`audit.model.tokens.tokenizer_cache`) is stored again with it: a small audit on a fresh machine never
pays for them, and the first large one leaves them for every later run. `Tokenizer` is the one
class built on this.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np

from audit.model.rendering.chat_template import ChatTemplate
from audit.model.tokens.fastcodec import (
    BYTE_TABLE_AFTER_IDS,
    FAST_ENCODER_AFTER_CHARS,
    ByteDecoder,
    FastEncoder,
    FlatIds,
    byte_decoder_for_backend,
    byte_decoder_for_tiktoken,
    fast_encoder_for_backend,
    fast_paths_enabled,
)
from audit.model.tokens.tokenizer_cache import (
    StoredVocabulary,
    TokenizerState,
    compact_backend_json,
    store_state,
)


class FastPaths:
    """The byte table, fastokens and the cached state, over what `Tokenizer` sets up."""

    # Set by `Tokenizer.__init__`.
    _state: TokenizerState | None
    _extra: dict[str, Any]
    _cache_key: str | None
    _backend_json: str | None
    _has_backend: bool
    _tiktoken: Any
    _known: np.ndarray
    _plain_encoded_chars: int
    _plain_decoded_ids: int
    vocab_size: int
    _fast: Any

    # Answered by `Tokenizer`.
    @property
    def _verified_template(self) -> ChatTemplate | None:
        raise NotImplementedError

    @property
    def special_ids(self) -> frozenset[int]:
        raise NotImplementedError

    @property
    def special_token_strings(self) -> tuple[str, ...]:
        raise NotImplementedError

    @property
    def has_chat_template(self) -> bool:
        raise NotImplementedError

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        raise NotImplementedError

    # -- flat, vectorised batches (the round trip's fast path) -----------------------------------
    @cached_property
    def byte_decoder(self) -> ByteDecoder | None:
        """The id -> bytes table, when the tokenizer is byte-level and fast paths are on (chosen
        on first use)."""
        return self.byte_table if fast_paths_enabled() else None

    def has_byte_table(self) -> bool:
        """Is the byte table at hand (built by this run, or stored by an earlier one)? Never
        builds it. A tokenizer has one only when it is byte-level: each id decodes to its own
        bytes, whatever surrounds it."""
        if "byte_decoder" in self.__dict__:
            return self.__dict__["byte_decoder"] is not None
        return fast_paths_enabled() and self._state is not None and self._state.table is not None

    def _table_for(self, ids: int) -> ByteDecoder | None:
        """The byte table to decode `ids` more ids with: once it exists, or once the ids decoded
        without it have cost about what building it does (a small audit never builds it)."""
        if "byte_decoder" not in self.__dict__ and (self._state is None or self._state.table is None):
            self._plain_decoded_ids += ids
            if self._plain_decoded_ids <= BYTE_TABLE_AFTER_IDS:
                return None
        return self.byte_decoder

    @cached_property
    def byte_table(self) -> ByteDecoder | None:
        """Built on first need (a large audit decodes with it) and kept in the cached state."""
        if self._state is not None:
            if (stored := self._state.byte_decoder()) is not None:
                return stored
            if self._extra.get("byte_table") == "none":
                return None  # built once, and refused: this tokenizer has none
        table: ByteDecoder | None = None
        if self._has_backend:
            table = byte_decoder_for_backend(self._fast, self.vocab_size)
        elif self._tiktoken is not None:
            table = byte_decoder_for_tiktoken(self._tiktoken)
        self.__dict__["byte_table"] = table
        self._keep_state()
        return table

    @cached_property
    def fast_encoder(self) -> FastEncoder | None:
        """fastokens over this tokenizer.json, when installed and fast paths are on (built on
        first use, or once `expect_encoding` foresaw enough text: it costs most of a second, so
        `encode_flat` asks for it only once the texts make it pay)."""
        if not fast_paths_enabled() or not self._has_backend:
            return None
        return fast_encoder_for_backend(self._compact_backend_json())

    def _compact_backend_json(self) -> str:
        """The backend serialised with its merges as strings, as fastokens loads it fastest (made
        once, by the first large audit, and kept in the cached state), else as it is."""
        text = self._backend_json or self._fast.to_str()
        if "compact" in self._extra:
            return text
        compact = compact_backend_json(text)
        if compact is not None and self._backend_json is not None:
            self._backend_json = compact
        self._keep_state(compact=compact is not None, backend_json=compact)
        return compact or text

    # -- the cached state ------------------------------------------------------------------------
    def state(self, backend_json: str | None = None) -> TokenizerState:
        """What the tokenizer cache keeps of this tokenizer: what is known of it now. The byte
        table, the compact backend and the skipped ids are in it once a run has built them."""
        template = self._verified_template
        decoder = self.__dict__.get("byte_table")
        if decoder is None and self._state is not None:
            decoder = self._state.byte_decoder()
        kept = dict(self._extra)
        kept["special_ids"] = sorted(self.special_ids)
        if template is not None:
            kept["chat_template"] = template.to_dict()
        if "byte_table" in self.__dict__ and decoder is None:
            kept["byte_table"] = "none"
        return TokenizerState(
            kind="backend" if self._has_backend else "remote",
            vocab_size=self.vocab_size,
            special_token_strings=self.special_token_strings,
            has_chat_template=self.has_chat_template,
            known=self._known,
            backend_json=backend_json or self._backend_json or (self._fast.to_str() if self._has_backend else None),
            table=None if decoder is None else decoder.table,
            lengths=None if decoder is None else decoder.lengths,
            decoder_known=None if decoder is None else decoder.known,
            extra=kept,
        )

    def _keep_state(self, *, backend_json: str | None = None, **extra: Any) -> None:
        """Note what this run built (`extra`), and store the state again with it (when the
        tokenizer has a place in the cache)."""
        self._extra.update(extra)
        if "skipped_ids" not in self._extra and self.__dict__.get("_fast") is not None:
            # Found from the backend at hand (a first load holds it), so that no run reads the
            # vocabulary JSON for them (`StoredVocabulary`).
            self._extra["skipped_ids"] = StoredVocabulary.skipped_of(self._fast)
        if self._cache_key is not None:
            store_state(self._cache_key, self.state(backend_json))

    def expect_encoding(self, characters: int) -> None:
        """Say that about `characters` of text are to be encoded by this process.

        More than the plain encoder handles in the time fastokens takes to build: fastokens is
        built now, before any block is held (its build peak is not added to a block's), and
        encodes from then on; the stored vocabulary answers look-ups, so a backend read from
        the cached state is let go (~45 MB live, ~65 MB once built; built again if needed). Less text: no change.
        """
        if characters > FAST_ENCODER_AFTER_CHARS:
            self.byte_decoder  # noqa: B018 - built (and kept) now, from the backend if need be
            if self._backend_json is not None:
                self.__dict__.pop("_fast", None)
            self.fast_encoder  # noqa: B018 - built (and kept) now

    @property
    def backend_name(self) -> str:
        """Which implementation decodes and encodes: for reports and the benchmark."""
        decode = "table" if self.byte_decoder is not None else "tokenizer"
        if self.fast_encoder is not None:
            encode = "fastokens"
        else:
            encode = "tiktoken" if self._tiktoken is not None else "tokenizers"
        return f"decode={decode} encode={encode}"

    def encode_flat(self, texts: list[str]) -> FlatIds:
        """`encode_batch` as one flat id array (special-token strings recognised)."""
        if self._wants_fast_encoder(texts) and (encoder := self.fast_encoder) is not None:
            return encoder.encode_flat(texts)
        encoded = self.encode_batch(texts)
        lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.concatenate([np.asarray(e, dtype=np.int64) for e in encoded]) if encoded else np.zeros(0, np.int64)
        return FlatIds(values.astype(np.int64, copy=False), offsets)

    def _wants_fast_encoder(self, texts: list[str]) -> bool:
        """Use fastokens once it is built, or once the plain encoder has cost about what building
        it would (rent until the rent paid equals the price: never more than twice the best)."""
        if "fast_encoder" in self.__dict__:
            return True
        if not self._has_backend:
            return False
        self._plain_encoded_chars += sum(map(len, texts))
        return self._plain_encoded_chars > FAST_ENCODER_AFTER_CHARS

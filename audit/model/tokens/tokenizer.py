"""The tokenizer in use: loaded from a local directory, used only through batched calls.

`Tokenizer` hides which backend does the work (the Rust `tokenizers` object behind a transformers
tokenizer, or the tiktoken encoding behind Kimi's remote-code one); every call takes a whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from audit.base.offline import configure_offline
from audit.model.rendering.chat_template import (
    ChatTemplate,
    UnsupportedInput,
    verified_chat_template,
)
from audit.model.tokens.fastcodec import REPLACEMENT, FlatIds, fast_paths_enabled, utf8_texts
from audit.model.tokens.tokenizer_cache import RememberedAnswers, StoredVocabulary, TokenizerState
from audit.model.tokens.tokenizer_fast_paths import FastPaths
from audit.model.tokens.tokenizer_files import (
    Fingerprint,
    encode_special_tokens,
    fingerprint_directory,
    load_with_transformers,
    tiktoken_encoding,
)

configure_offline()


class Tokenizer(FastPaths):
    """A loaded tokenizer with batched decode/encode and token look-ups, built from a transformers
    tokenizer (`Tokenizer(hf, directory)`) or from the state a previous run cached on disk
    (`tokenizer_cache`; transformers is then loaded only when something asks for `hf`)."""

    def __init__(
        self,
        hf_tokenizer: Any,
        directory: Path,
        *,
        sha256: str | None = None,
        trust_remote_code: bool = False,
        state: TokenizerState | None = None,
        cache_key: str | None = None,
    ):
        self.directory = directory
        self.trust_remote_code = trust_remote_code
        self._cache_key = cache_key
        # What the cached state records beyond the vocabulary (see `state`), added to as a run builds it.
        self._extra: dict[str, Any] = dict(state.extra) if state is not None else {}
        self._remembered = RememberedAnswers(cache_key) if cache_key is not None else None
        self._state = state
        if hf_tokenizer is not None:
            self.__dict__["hf"] = hf_tokenizer  # the cached_property below, already filled
        # From the cached state the `tokenizers` backend is built on first use (`_fast`, `_stored`).
        self._backend_json = state.backend_json if state is not None and state.kind == "backend" else None
        if self._backend_json is None:
            backend = getattr(hf_tokenizer, "backend_tokenizer", None)
            self.__dict__["_fast"] = None if backend is None else encode_special_tokens(backend)
        self._has_backend = self._backend_json is not None or self.__dict__["_fast"] is not None
        self._tiktoken = None if self._has_backend else tiktoken_encoding(hf_tokenizer)
        if state is not None:
            self._known = state.known
        else:
            known = set(self._vocab.values())
            if self._tiktoken is not None:
                known.update(range(self._tiktoken.n_vocab))
            self._known = np.zeros(max(known) + 1 if known else 0, dtype=bool)
            self._known[list(known)] = True
        self.vocab_size = len(self._known)
        # A vocabulary with holes (ids nobody can decode) needs a membership test, not a range.
        self.contiguous = bool(self._known.all())
        self.fingerprint = Fingerprint(
            path=str(directory),
            vocab_size=self.vocab_size,
            sha256=sha256 or fingerprint_directory(directory),
        )
        # Plain-`tokenizers` encoding done so far while fastokens is not built (see encode_flat).
        self._plain_encoded_chars = 0
        # Ids decoded by the tokenizer's own decoder while the byte table is not built (decode_flat).
        self._plain_decoded_ids = 0

    @cached_property
    def hf(self) -> Any:
        """The transformers tokenizer (loaded on first use when the state came from the cache)."""
        return load_with_transformers(self.directory, self.trust_remote_code)

    @cached_property
    def installed_load(self) -> dict[str, str] | None:
        """Where the installed transformers' AutoTokenizer encodes this folder otherwise than its
        tokenizer.json (`audit.model.trainers.trainer_load.installed_load`), else None. Decided once per
        folder and transformers release: the first load (which holds the transformers
        tokenizer) decides, and the cached state keeps the answer for every later run."""
        if "installed_load" in self._extra:
            return self._extra["installed_load"] or None
        backend = getattr(self.hf, "backend_tokenizer", None)
        decided = None
        if backend is not None:
            import transformers

            from audit.model.trainers.trainer_load import installed_load

            decided = installed_load(self.directory, backend, type(self.hf).__name__, transformers.__version__)
        if self._state is not None:  # a state stored before this was decided: kept with it now
            self._keep_state(installed_load=decided or {})
        else:  # a first load: stored with the rest it found
            self._extra["installed_load"] = decided or {}
        return decided

    @cached_property
    def _fast(self) -> Any:
        """The `tokenizers` backend, built from the cached state on first use."""
        import tokenizers

        assert self._backend_json is not None  # a tokenizer without its state built `_fast` itself
        return encode_special_tokens(tokenizers.Tokenizer.from_str(self._backend_json))

    @cached_property
    def _fast_as_text(self) -> Any:
        """A copy of the backend that encodes special-token strings as text (`encode_batch_as_text`),
        kept apart so that no other caller ever sees the switch turned."""
        import tokenizers

        backend = tokenizers.Tokenizer.from_str(self._backend_json or self._fast.to_str())
        backend.encode_special_tokens = True
        return backend

    @property
    def _stored(self) -> StoredVocabulary | None:
        """The stored backend's look-ups, once fastokens encodes (a large audit) and the backend
        is not built; else None: the backend answers (a small audit builds it to encode)."""
        if "_fast" in self.__dict__ or self.__dict__.get("fast_encoder") is None or not self._backend_json:
            return None
        if "_stored_vocabulary" not in self.__dict__:  # None when the vocabulary is a list
            if "skipped_ids" not in self._extra:  # found once, by the first large audit, and kept
                self._keep_state(skipped_ids=StoredVocabulary.skipped_in(self._backend_json))
            skipped = self._extra["skipped_ids"]
            stored = None if skipped is None else StoredVocabulary(self._backend_json, skipped)
            self.__dict__["_stored_vocabulary"] = stored
        return self.__dict__["_stored_vocabulary"]

    @cached_property
    def _vocab(self) -> dict[str, int]:
        return dict(self.hf.get_vocab())

    @cached_property
    def known_ids(self) -> frozenset[int]:
        """Every id the tokenizer can decode."""
        return frozenset(np.flatnonzero(self._known).tolist())

    @cached_property
    def special_token_strings(self) -> tuple[str, ...]:
        """Strings of the special and added tokens, longest first (for stripping them from text)."""
        if self._state is not None:
            return self._state.special_token_strings
        strings = set(getattr(self.hf, "all_special_tokens", []) or [])
        decoder = getattr(self.hf, "added_tokens_decoder", {}) or {}
        strings.update(getattr(token, "content", str(token)) for token in decoder.values())
        if self._tiktoken is not None:
            strings.update(self._tiktoken.special_tokens_set)
        return tuple(sorted((s for s in strings if s), key=len, reverse=True))

    @cached_property
    def special_ids(self) -> frozenset[int]:
        """Ids of the tokenizer's special tokens: those `skip_special_tokens` drops.

        An added token counts only when it is marked special (Qwen's `<think>` is added but not
        special: decoding keeps it). A tiktoken tokenizer behind remote code (Kimi's) keeps its
        specials in the encoding itself.
        """
        if self._state is not None and "special_ids" in self._state.extra:
            return frozenset(self._state.extra["special_ids"])
        ids: set[int] = set()
        for token_id, token in (getattr(self.hf, "added_tokens_decoder", None) or {}).items():
            if getattr(token, "special", False) is True:
                ids.add(int(token_id))
        ids.update(i for i in getattr(self.hf, "all_special_ids", None) or () if isinstance(i, int))
        if self._tiktoken is not None:
            for text in self._tiktoken.special_tokens_set:
                token_id = self.token_id(text)
                if token_id is not None:
                    ids.add(token_id)
        return frozenset(ids)

    @cached_property
    def _chat_template(self) -> ChatTemplate | None:
        """The transformers-free renderer, where it was shown to render as transformers does
        and fast paths are on (chosen on first use, like the byte table)."""
        return self._verified_template if fast_paths_enabled() else None

    @cached_property
    def _verified_template(self) -> ChatTemplate | None:
        if self._state is not None:
            stored = self._state.extra.get("chat_template")
            return None if stored is None else ChatTemplate.from_dict(stored)
        if not self.has_chat_template:
            return None
        return verified_chat_template(self.hf)

    def render_chat(
        self,
        messages: list[Any],
        tools: list[Any] | None = None,
        *,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """The chat template's rendering of a conversation, as text: what transformers'
        `apply_chat_template(..., tokenize=False)` gives; the generation prompt added unless
        `add_generation_prompt=False` (a whole conversation, as trainers render it)."""
        template = self._chat_template
        if template is not None:
            try:
                return template.render(
                    messages, tools or None, add_generation_prompt=add_generation_prompt, **template_kwargs
                )
            except UnsupportedInput:
                pass  # transformers renders it, or says why not in its own words
        return self.hf.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=add_generation_prompt, tokenize=False,
            **template_kwargs,
        )

    @cached_property
    def chat_template_text(self) -> str:
        """The source of the chat template(s), joined ("" when there is none)."""
        if not self.has_chat_template:
            return ""
        template = self._chat_template
        templates = template.templates if template is not None else getattr(self.hf, "chat_template", None)
        if isinstance(templates, dict):
            return "\n".join(str(text) for text in templates.values())
        return str(templates or "")

    @cached_property
    def has_chat_template(self) -> bool:
        """Whether the tokenizer ships a chat template (known without loading transformers)."""
        if self._state is not None:
            return self._state.has_chat_template
        return bool(getattr(self.hf, "chat_template", None))

    # -- look-ups -------------------------------------------------------------------------
    def token_id(self, token: str) -> int | None:
        """The id of a token given by its exact string, or None when the vocabulary lacks it."""
        if not self._has_backend:
            return self._vocab.get(token)
        if (stored := self._stored) is not None:
            return stored.token_ids.get(token)
        remembered = self._remembered
        if remembered is not None and (answer := remembered.token_id(token))[0]:
            return answer[1]
        # The backend's own look-up: added tokens first, as get_vocab(with_added_tokens) has them.
        token_id = self._fast.token_to_id(token)
        if remembered is not None:
            remembered.remember("token_id", {token: token_id})
        return token_id

    def encode_remembered(self, texts: list[str]) -> list[list[int]]:
        """`encode_batch` of a few short texts a profile asks for, remembered between runs."""
        remembered = self._remembered
        if remembered is not None and (known := remembered.encodings(texts)) is not None:
            return known
        encoded = self.encode_batch(texts)
        if remembered is not None:
            remembered.remember("encode", dict(zip(texts, encoded, strict=True)))
        return encoded

    def can_decode(self, ids: Sequence[int]) -> bool:
        """Is every id one this tokenizer has (the vocabulary check, for a handful of ids)?"""
        return all(i in self.known_ids for i in ids)

    def encode_text(self, text: str) -> list[int]:
        """Ids of `text`, special-token strings recognised, nothing added around it."""
        return self.encode_batch([text])[0]

    # -- batched work ---------------------------------------------------------------------
    def decode_batch(self, sequences: Sequence[Sequence[int]]) -> list[str]:
        """Decode many id lists, special tokens kept, no clean-up of spaces (see `decode_flat`)."""
        return self.decode_flat(FlatIds.from_sequences(sequences))

    def decode_batch_skipping_special(self, sequences: Sequence[Sequence[int]]) -> list[str]:
        """Decode as SGLang does by default (`skip_special_tokens=True`)."""
        return self.decode_flat_skipping_special(FlatIds.from_sequences(sequences))

    def decode_flat_skipping_special(self, flat: FlatIds) -> list[str]:
        """Decode as SGLang does by default (`skip_special_tokens=True`), vectorised when possible."""
        if (stored := self._stored) is not None and self._table_for(len(flat.values)) is not None:
            return self.decode_flat(flat.kept(~stored.skipped(flat.values)))
        return self._decode_by_tokenizer(flat, skip_special_tokens=True)

    def decode_flat(self, flat: FlatIds) -> list[str]:
        """Decode flat sequences, special tokens kept: the one way ids become text.

        Total over any ids: an id the tokenizer lacks (out of its range, or a hole in it: INT001
        names it) reads as U+FFFD on every path, never an error. The byte table decodes when
        there is one; bytes that are not UTF-8 are decoded by the tokenizer itself, whose lossy
        replacement is the reference.
        """
        return self.texts_of(flat, self.decode_flat_bytes(flat))

    def decode_flat_bytes(self, flat: FlatIds) -> tuple[np.ndarray, np.ndarray] | None:
        """The bytes the byte table decodes the sequences to (uint8, and per-sequence offsets;
        no text made), or None when the byte table does not decode them. Where a sequence's
        bytes are valid UTF-8 they are its text's very encoding; `texts_of` gives the texts."""
        decoder = self._table_for(len(flat.values))
        return None if decoder is None else decoder.decode_bytes(flat)

    def texts_of(self, flat: FlatIds, decoded: tuple[np.ndarray, np.ndarray] | None) -> list[str]:
        """The texts of `flat` from what `decode_flat_bytes` gave for it (no second decode, and
        no second count towards building the byte table): each sequence's bytes read as UTF-8,
        the tokenizer's own lossy decoding where they are not UTF-8, or of every sequence when
        there are no bytes (no byte table)."""
        if decoded is None:
            return self._decode_by_tokenizer(flat, skip_special_tokens=False)
        texts = utf8_texts(*decoded)
        invalid = [i for i, text in enumerate(texts) if text is None]
        if invalid:
            plain = self._decode_by_tokenizer(flat.take(np.array(invalid)), skip_special_tokens=False)
            for i, text in zip(invalid, plain, strict=True):
                texts[i] = text
        return texts  # type: ignore[return-value]

    def _decode_by_tokenizer(self, flat: FlatIds, *, skip_special_tokens: bool) -> list[str]:
        """The tokenizer's own decoder, which must never see an id it lacks (`tokenizers` drops
        one silently, tiktoken raises): each run of known ids is decoded apart, U+FFFD between."""
        known = self.knows(flat.values)
        runs: list[list[int]] = []
        shape: list[int] = []  # per sequence: how many runs it was cut into
        for i in range(len(flat)):
            lo, hi = int(flat.offsets[i]), int(flat.offsets[i + 1])
            if known[lo:hi].all():
                runs.append(flat.values[lo:hi].tolist())
                shape.append(1)
                continue
            bounds = [lo - 1, *(np.flatnonzero(~known[lo:hi]) + lo).tolist(), hi]
            pieces = [flat.values[a + 1 : b].tolist() for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
            runs.extend(pieces)
            shape.append(len(pieces))
        texts = self._decode_known(runs, skip_special_tokens)
        out, at = [], 0
        for count in shape:
            out.append(REPLACEMENT.decode().join(texts[at : at + count]))
            at += count
        return out

    def _decode_known(self, sequences: list[list[int]], skip_special_tokens: bool) -> list[str]:
        if self._has_backend:
            return self._fast.decode_batch(sequences, skip_special_tokens=skip_special_tokens)
        if self._tiktoken is not None and not skip_special_tokens:
            return self._tiktoken.decode_batch(sequences)
        return self.hf.batch_decode(
            sequences, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def knows(self, ids: np.ndarray) -> np.ndarray:
        """Per id: is it one the tokenizer has (in its range, not a hole)?"""
        inside = (ids >= 0) & (ids < len(self._known))
        inside[inside] = self._known[ids[inside]]
        return inside

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many texts, special-token strings recognised, no BOS/EOS added."""
        if (built := self.__dict__.get("fast_encoder")) is not None:
            flat = built.encode_flat(list(texts))  # the same ids, already built
            return [flat.sequence(i) for i in range(len(flat))]
        if self._has_backend:
            # `encode_batch_fast` gives the same ids without tracking offsets: ~1.7x faster and
            # lighter; the reference backend keeps the classic call.
            encode = self._fast.encode_batch
            if fast_paths_enabled() and hasattr(self._fast, "encode_batch_fast"):
                encode = self._fast.encode_batch_fast
            return [e.ids for e in encode(list(texts), add_special_tokens=False)]
        if self._tiktoken is not None:
            return self._tiktoken.encode_batch(list(texts), allowed_special="all")
        return [self.hf.encode(t, add_special_tokens=False) for t in texts]

    def encode_batch_as_text(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many texts with special-token strings NOT recognised (each is its characters'
        tokens), no BOS/EOS added: how Kimi-K3's encoder encodes content (`allow_special_tokens=False`),
        so a message that spells a marker never yields the marker's id. An added token that is
        not special (`"special": false`) is still matched by a `tokenizers` backend."""
        if not texts:
            return []
        if self._has_backend:
            return [e.ids for e in self._fast_as_text.encode_batch(list(texts), add_special_tokens=False)]
        if self._tiktoken is not None:
            return self._tiktoken.encode_batch(list(texts), allowed_special=set(), disallowed_special=())
        return [self.hf.encode(t, add_special_tokens=False, split_special_tokens=True) for t in texts]

"""The fast paths of the round trip: vectorised decode, and the fastest encoder available.

The round trip `encode(decode(output_ids)) == output_ids` is the one rule whose cost is the
tokenizer's, not the data's. Two things make it cheap:

* **Decode is a table look-up.** For a byte-level BPE (GPT-2 style `ByteLevel` decoder) or a
  tiktoken encoding, every id stands for a fixed byte string, and a sequence decodes to the
  concatenation of its ids' bytes. `ByteDecoder` builds that table once, verifies it against
  the tokenizer's own decoder for every id, and then decodes a whole batch with a handful of
  numpy gathers: no per-sequence decoder call, no per-token Python.
* **Encode uses `fastokens`** when the tokenizer is a `tokenizer.json` (byte-identical output
  to `tokenizers`, many times faster), built from the very backend transformers loaded, and
  returns one flat `uint32` buffer. Tiktoken encodings keep their own (fast) encoder.

Both are optional: `AUDIT_TOKENIZER_BACKEND=tokenizers` turns them off and every call goes
through the plain `tokenizers` / tiktoken / transformers objects, which the tests compare
against. A tokenizer the fast paths do not understand falls back on its own.
"""

from __future__ import annotations

import os
import tempfile
from functools import lru_cache
from typing import Any

import numpy as np

from audit.model.tokens.flat_ids import FlatIds

BACKEND_ENV = "AUDIT_TOKENIZER_BACKEND"

# What an id the tokenizer lacks decodes to, on every path: U+FFFD, the replacement character.
REPLACEMENT = "\ufffd".encode()

# Tokens decoded per numpy step: bounds the index arrays (4 bytes per decoded byte) to a few MB.
_DECODE_CHUNK_TOKENS = 1 << 16

# Building the fastokens encoder costs ~0.8 s on a 128k vocabulary, about what `tokenizers`
# takes to encode 4 million characters (~1M ids). A run encodes with `tokenizers` until it has
# encoded that much, then builds fastokens: a small partition never pays for it, a large one
# loses at most that much.
FAST_ENCODER_AFTER_CHARS = 4_000_000
# Building the byte table costs ~0.2 s on a 128k vocabulary, what the tokenizer's own decoder
# takes for ~1.5M ids: it is built once a run has decoded that many (a small audit never does).
BYTE_TABLE_AFTER_IDS = 1_000_000


def fast_paths_enabled() -> bool:
    """False when the user asked for the plain tokenizer backend (the reference)."""
    return os.environ.get(BACKEND_ENV, "fast").strip().lower() not in {"tokenizers", "plain", "reference"}


class ByteDecoder:
    """id -> bytes table of a byte-level tokenizer; decodes whole batches with numpy."""

    def __init__(self, pieces: list[bytes | None]):
        self._set(
            np.frombuffer(b"".join(p or b"" for p in pieces), dtype=np.uint8),
            np.array([len(p) if p is not None else 0 for p in pieces], dtype=np.int64),
            np.array([p is not None for p in pieces], dtype=bool),
        )

    @classmethod
    def from_arrays(cls, table: np.ndarray, lengths: np.ndarray, known: np.ndarray) -> ByteDecoder:
        """A table stored earlier: all pieces' bytes, each id's byte length, which ids exist."""
        decoder = cls.__new__(cls)
        decoder._set(table, lengths, known)
        return decoder

    def _set(self, table: np.ndarray, lengths: np.ndarray, known: np.ndarray) -> None:
        self.table = table
        self.lengths = lengths
        self.known = known
        self.starts = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=self.starts[1:])

    def covers(self, ids: np.ndarray) -> bool:
        """Are all these ids ones the table has a (verified) piece for?"""
        if len(ids) == 0:
            return True
        if int(ids.min()) < 0 or int(ids.max()) >= len(self.lengths):
            return False
        return bool(self.known[ids].all())

    def knows(self, ids: np.ndarray) -> np.ndarray:
        """Per id: does the table have a piece for it (in range and known)?"""
        inside = (ids >= 0) & (ids < len(self.known))
        inside[inside] = self.known[ids[inside]]
        return inside

    def _guarded(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Ids, table, lengths and starts where every id the table lacks reads as U+FFFD: a piece
        appended past the table (built on first need: such ids are INT001's, and rare)."""
        if "_replacing" not in self.__dict__:
            table = np.concatenate([self.table, np.frombuffer(REPLACEMENT, dtype=np.uint8)])
            lengths = np.append(self.lengths, len(REPLACEMENT))
            starts = np.append(self.starts, len(self.table))
            self.__dict__["_replacing"] = (table, lengths, starts)
        table, lengths, starts = self.__dict__["_replacing"]
        return np.where(self.knows(ids), ids, len(self.known)), table, lengths, starts

    def piece_bytes(self, token_id: int) -> bytes | None:
        """One id's bytes (None for an id the tokenizer lacks)."""
        if not 0 <= token_id < len(self.lengths) or not self.known[token_id]:
            return None
        start = int(self.starts[token_id])
        return self.table[start : start + int(self.lengths[token_id])].tobytes()

    def decode_bytes(self, flat: FlatIds) -> tuple[np.ndarray, np.ndarray]:
        """All sequences' bytes concatenated (uint8), and per-sequence byte offsets. Total: an id
        the table lacks (out of range, a hole) reads as U+FFFD."""
        if len(flat.offsets) and (flat.offsets[0] != 0 or flat.offsets[-1] != len(flat.values)):
            flat = FlatIds.slices(flat.values, flat.offsets[:-1], flat.offsets[1:])  # tiled from 0
        ids, table, lengths, starts = flat.values, self.table, self.lengths, self.starts
        if not self.covers(ids):
            ids, table, lengths, starts = self._guarded(ids)
        # 32-bit indexes when the table allows: half the memory traffic of the gathers, and of
        # what a block's decode holds at once (the per-id lengths; the running sums are kept
        # per sequence and per chunk, never per id).
        index_type = np.int32 if len(table) < 1 << 31 else np.int64
        token_lengths = lengths.astype(index_type, copy=False)[ids]
        byte_offsets = np.zeros(len(flat) + 1, dtype=np.int64)
        if len(ids):
            # The sequences tile the ids in order: each one's bytes, then their running sum.
            firsts = flat.offsets[:-1]
            nonempty = flat.offsets[1:] > firsts
            totals = np.zeros(len(flat), dtype=np.int64)
            totals[nonempty] = np.add.reduceat(token_lengths, firsts[nonempty], dtype=np.int64)
            np.cumsum(totals, out=byte_offsets[1:])
        out = np.empty(int(byte_offsets[-1]), dtype=np.uint8)
        starts = starts.astype(index_type, copy=False)
        base = 0
        for lo in range(0, len(ids), _DECODE_CHUNK_TOKENS):
            hi = min(lo + _DECODE_CHUNK_TOKENS, len(ids))
            lens = token_lengths[lo:hi]
            chunk_ends = np.cumsum(lens, dtype=np.int64)
            chunk_total = int(chunk_ends[-1])
            if chunk_total == 0:
                continue
            # Each output byte reads table[start of its token + its index inside the token].
            token_out_start = (chunk_ends - lens).astype(index_type)
            index = np.repeat(starts[ids[lo:hi]] - token_out_start, lens)
            index += np.arange(chunk_total, dtype=index_type)
            out[base : base + chunk_total] = table[index]
            base += chunk_total
        return out, byte_offsets


def utf8_texts(data: np.ndarray, offsets: np.ndarray) -> list[str | None]:
    """Each sequence's text from the bytes `ByteDecoder.decode_bytes` gave, None where its bytes
    are not valid UTF-8 (the caller decodes those with the tokenizer itself, whose lossy
    replacement is then authoritative)."""
    texts: list[str | None] = []
    view = memoryview(data.data)
    for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
        try:
            texts.append(str(view[a:b], "utf-8"))
        except UnicodeDecodeError:
            texts.append(None)
    return texts


# -- building the table ------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _byte_level_chars() -> dict[str, int]:
    """GPT-2's byte <-> printable-character map, reversed (character -> byte)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _is_byte_level(backend: Any) -> bool:
    import json

    decoder = json.loads(backend.decoder.__getstate__()) if backend.decoder is not None else {}
    kinds = [d.get("type") for d in decoder.get("decoders", [])] if decoder.get("type") == "Sequence" else [decoder.get("type")]
    return kinds == ["ByteLevel"]


def byte_decoder_for_backend(backend: Any, vocab_size: int) -> ByteDecoder | None:
    """The table of a `tokenizers` backend with a ByteLevel decoder, verified.

    A ByteLevel decoder maps each character of a vocabulary token back to its byte: the table
    holds exactly that. What it may decode otherwise is checked against the backend itself, id
    by id: every added token (whose content the decoder may or may not map, by version and
    kind: the table takes whichever the backend does), and every token with a character
    outside the byte map (as its UTF-8). Anything that disagrees: no table (stay exact, go slow).
    """
    if not _is_byte_level(backend):
        return None
    chars = _byte_level_chars()
    added = set(backend.get_added_tokens_decoder())
    pieces: list[bytes | None] = []
    checked: list[int] = []
    for i in range(vocab_size):
        token = backend.id_to_token(i)
        if token is None:
            pieces.append(None)
            continue
        try:
            pieces.append(bytes(chars[c] for c in token))
        except KeyError:  # a character outside the byte map: as its UTF-8, if the decoder agrees
            pieces.append(token.encode("utf-8"))
            checked.append(i)
            continue
        if i in added:
            checked.append(i)
    reference = backend.decode_batch([[i] for i in checked], skip_special_tokens=False)
    for i, text in zip(checked, reference, strict=True):
        piece = pieces[i]
        assert piece is not None
        if piece.decode("utf-8", "replace") == text:
            continue
        content = backend.id_to_token(i).encode("utf-8")
        if i in added and content.decode("utf-8", "replace") == text:
            pieces[i] = content  # an added token the decoder leaves as it is
            continue
        return None
    return ByteDecoder(pieces)


def byte_decoder_for_tiktoken(encoding: Any) -> ByteDecoder | None:
    """The table of a tiktoken encoding: its mergeable ranks and special tokens."""
    size = int(encoding.n_vocab)
    pieces: list[bytes | None] = [None] * size
    for i in range(size):
        try:
            pieces[i] = encoding.decode_single_token_bytes(i)
        except KeyError:
            continue
    return ByteDecoder(pieces)


class FastEncoder:
    """`fastokens` over the serialized state of the very backend transformers loaded."""

    def __init__(self, tokenizer_json: str):
        import fastokens

        # The same JSON read from a file: fastokens' file reader builds the encoder in ~70% of
        # the time and with ~40 MB less at its peak than its string reader (128k vocabulary).
        with tempfile.TemporaryDirectory(prefix="audit-fastokens-") as directory:
            path = os.path.join(directory, "tokenizer.json")
            with open(path, "w", encoding="utf-8") as out:
                out.write(tokenizer_json)
            self._tokenizer = fastokens.Tokenizer.from_file(path)

    def encode_flat(self, texts: list[str]) -> FlatIds:
        ids, offsets = self._tokenizer.encode_batch_flat(texts, add_special_tokens=False)
        # The ids as fastokens wrote them (uint32, no int64 copy: numpy compares them with int64).
        return FlatIds(
            np.frombuffer(ids, dtype=np.uint32),
            np.frombuffer(offsets, dtype=np.uint64).astype(np.int64),
        )


def fast_encoder_for_backend(tokenizer_json: str) -> FastEncoder | None:
    """A fastokens encoder of a serialized `tokenizers` backend, or None when fastokens is not
    installed or cannot read it.

    The form the tokenizer cache stores (BPE merges as "a b" strings, checked to be the same
    tokenizer) builds ~0.3 s sooner than the backend's own serialization (merges as pairs) on a
    128k vocabulary.
    """
    try:
        return FastEncoder(tokenizer_json)
    except Exception:  # an unsupported tokenizer.json feature: the plain backend stays exact
        return None

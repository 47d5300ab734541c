"""A token's text for people, and where a character of decoded text falls among the tokens.

`token_strings` names each id by its decoded piece (a byte that is not a whole character as
`<0xE4>`, as byte-fallback vocabularies name it); `tokens_at` maps character offsets of a
decoded sequence back to token indices (where a finding points).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

import numpy as np

from audit.model.tokens.fastcodec import FlatIds
from audit.model.tokens.tokenizer import Tokenizer

# A byte that is not a whole UTF-8 character, named as byte-fallback vocabularies name it: <0xE4>.
BYTE_NAMES = "audit-byte-names"


def _byte_names(error: UnicodeError) -> tuple[str, int]:
    assert isinstance(error, UnicodeDecodeError)  # registered for decoding only
    return "".join(f"<0x{b:02X}>" for b in error.object[error.start : error.end]), error.end


codecs.register_error(BYTE_NAMES, _byte_names)


def token_pieces(tokenizer: Tokenizer, ids: Sequence[int] | np.ndarray) -> list[str]:
    """The decoded piece of each id, "" for ids the tokenizer lacks (for display). Each
    distinct id is decoded once: a long list costs its vocabulary, not its length, in Python."""
    values = np.asarray(ids, dtype=np.int64)
    distinct, where = np.unique(values, return_inverse=True)
    known = tokenizer.knows(distinct)
    pieces = np.full(len(distinct), "", dtype=object)
    if known.any():
        pieces[known] = token_strings(tokenizer, distinct[known].tolist())
    return pieces[where.reshape(-1)].tolist()


def tokens_at(tokenizer: Tokenizer, ids: Sequence[int], chars: Sequence[int]) -> list[int]:
    """For each character offset of `decode(ids)`, the index of the token whose decoded
    text holds it (`len(ids)` past the end). With the byte table: the tokens' byte
    lengths summed once; else a few prefix decodes per offset, by halving."""
    decoder = tokenizer.byte_decoder
    values = np.asarray(ids, dtype=np.int64)
    known = decoder is not None and bool(
        ((values >= 0) & (values < len(decoder.lengths))).all() and decoder.known[values].all()
    )
    if decoder is not None and known:
        ends = np.cumsum(decoder.lengths[values])
        flat = FlatIds(values, np.array([0, len(values)], dtype=np.int64))
        data, _ = decoder.decode_bytes(flat)
        try:
            text = data.tobytes().decode("utf-8")
        except UnicodeDecodeError:
            text = None  # the tokenizer's own replacement decides: count by prefixes
        if text is not None:
            offsets = [len(text[:char].encode("utf-8")) for char in chars]
            return np.searchsorted(ends, offsets, side="right").tolist()
    return [_token_at(tokenizer, ids, char) for char in chars]


def _token_at(tokenizer: Tokenizer, ids: Sequence[int], char: int) -> int:
    low, high = 0, len(ids)
    while low < high:
        middle = (low + high) // 2
        if len(tokenizer.decode_batch([ids[: middle + 1]])[0]) > char:
            high = middle
        else:
            low = middle + 1
    return low


def token_strings(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    """The decoded piece of each id, one by one (for display).

    A byte-level piece that is part of a character (one byte of a CJK character, say)
    decodes to U+FFFD alone; it is shown by its bytes instead, `<0xE4>`, as the
    tokenizers of byte-fallback vocabularies name such tokens.
    """
    decoder = tokenizer.byte_decoder
    if decoder is not None:
        # The table's pieces are the decoder's (verified id by id when it was built).
        raw = [decoder.piece_bytes(int(token_id)) for token_id in ids]
        if all(piece is not None for piece in raw):
            return [piece.decode("utf-8", errors=BYTE_NAMES) for piece in raw]  # type: ignore[union-attr]
    pieces = tokenizer.decode_batch([[i] for i in ids])
    if any("\ufffd" in piece for piece in pieces) and (table := tokenizer.byte_table) is not None:
        for k, (token_id, piece) in enumerate(zip(ids, pieces, strict=True)):
            if "\ufffd" in piece and (own := table.piece_bytes(int(token_id))) is not None:
                pieces[k] = own.decode("utf-8", errors=BYTE_NAMES)
    return pieces

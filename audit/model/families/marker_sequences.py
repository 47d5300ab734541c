"""Markers written as sequences of ids (Kimi-K3's XTML tags), resolved to virtual ids.

A profile may write a marker as pieces, `["<|open|>", "think", "<|sep|>"]`: special tokens and
the text between them, each encoded on its own as the family's renderer encodes segment by
segment. Resolved on a tokenizer, each such marker gets a virtual id above the vocabulary,
standing for its ids in the batch's marker view (`audit.model.tokens.flat_ids.marker_view`), so that
everything that compares output ids with marker ids handles it as it handles one id.
"""

from __future__ import annotations

import numpy as np

from audit.base.errors import ConfigError
from audit.model.tokens.tokenizer import Tokenizer


class MarkerIds:
    """A profile's markers resolved on a tokenizer: `ids(text)` is a marker's id, one token's
    or a virtual one; `sequences` maps each virtual id to the marker's real ids."""

    def __init__(self, tokenizer: Tokenizer, pieces: dict[str, tuple[str, ...]], where: str):
        self.tokenizer = tokenizer
        self.pieces = pieces  # marker text -> its pieces, for the markers written as sequences
        self.where = where
        self.sequences: dict[int, tuple[int, ...]] = {}
        self._given: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        if text in self.pieces:
            return self._sequence(text)
        token_id = self.tokenizer.token_id(text)
        if token_id is None:
            raise ConfigError(
                f"{self.where}: token {text!r} is not in the tokenizer at {self.tokenizer.directory} "
                "as a single token: is this the right profile for this tokenizer?"
            )
        return token_id

    def check_pins(self, pinned: dict[str, int]) -> None:
        """ConfigError when the tokenizer has a pinned token at another id."""
        for text, expected in pinned.items():
            actual = self(text)
            if actual != expected:
                raise ConfigError(
                    f"{self.where}: pins {text!r} to id {expected}, but the tokenizer at "
                    f"{self.tokenizer.directory} has it at {actual}: wrong tokenizer or stale profile"
                )

    def _sequence(self, text: str) -> int:
        """A piece that is one token is its id, other pieces are text encoded alone; a sequence
        of one id is that id, else it gets the next virtual id."""
        if text not in self._given:
            ids: list[int] = []
            for piece in self.pieces[text]:
                single = self.tokenizer.token_id(piece)
                ids.extend([single] if single is not None else self.tokenizer.encode_remembered([piece])[0])
            if len(ids) == 1:
                self._given[text] = ids[0]
            else:
                self._given[text] = self.tokenizer.vocab_size + len(self.sequences)
                self.sequences[self._given[text]] = tuple(ids)
        return self._given[text]


def widths(sequences: dict[int, tuple[int, ...]], markers: np.ndarray) -> np.ndarray:
    """How many ids each of `markers` takes in an output (ones when no marker is a sequence)."""
    if not sequences:
        return np.ones(len(markers), dtype=np.int64)
    return np.array([len(sequences.get(m, (m,))) for m in markers.tolist()], dtype=np.int64)

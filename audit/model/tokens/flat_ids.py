"""Many id lists as one flat numpy array, and the scans the rules make over them.

A block holds a few hundred outputs of thousands of ids each, and the rules ask the same few
questions of every output: where is its first `</think>`, how many stop tokens end it, is there
a tool-result marker, does its tail repeat. Asked of a polars list column, each question is a
pass of list expressions over every id. Here the outputs are one flat int64 array with offsets
(`FlatIds`), and the ids any rule looks for (the profile's markers, a few dozen at most) are
found in a single table look-up over that array (`MarkerIndex`); every question about them is
then answered from those few hits, not from the ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import polars as pl


@dataclass(frozen=True)
class FlatIds:
    """Many id lists as one flat array: sequence i is `values[offsets[i]:offsets[i + 1]]`."""

    values: np.ndarray  # int64 (uint32 as an encoder wrote them)
    offsets: np.ndarray  # int64, len = sequences + 1

    @cached_property
    def lengths(self) -> np.ndarray:
        """Each sequence's length (worked out once: many rules ask for a batch's)."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @classmethod
    def from_series(cls, series: pl.Series) -> FlatIds:
        """A polars list column without going through Python lists (a null list is empty;
        the reader leaves no null element in an id list)."""
        counts = series.list.len()
        # (A Series' fill_null is a whole query: only where there is a null list.)
        lengths = (counts.fill_null(0) if counts.null_count() else counts).to_numpy().astype(np.int64, copy=False)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = series.explode(empty_as_null=False, keep_nulls=False).to_numpy()
        return cls(values.astype(np.int64, copy=False), offsets)

    @classmethod
    def from_sequences(cls, sequences: Sequence[Sequence[int]]) -> FlatIds:
        """A few id lists (Python's), as flat ids."""
        offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
        np.cumsum([len(ids) for ids in sequences], out=offsets[1:])
        values = np.fromiter((i for ids in sequences for i in ids), dtype=np.int64, count=int(offsets[-1]))
        return cls(values, offsets)

    def sequence(self, i: int) -> list[int]:
        return self.values[self.offsets[i] : self.offsets[i + 1]].tolist()

    def kept(self, keep: np.ndarray) -> FlatIds:
        """The ids where `keep` (a boolean per id) is true, each sequence's in its place."""
        counts = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(keep, out=counts[1:])
        return FlatIds(self.values[keep], counts[self.offsets])

    def take(self, indices: np.ndarray) -> FlatIds:
        """Sequences `indices`, in that order."""
        return FlatIds.slices(self.values, self.offsets[:-1][indices], self.offsets[1:][indices])

    def ends_with(self, ids: Iterable[int]) -> np.ndarray:
        """Per sequence: is its last id one of `ids`? (False for an empty sequence)"""
        last = self.values[np.maximum(self.offsets[1:] - 1, 0)] if len(self.values) else np.zeros(len(self), np.int64)
        return (self.lengths > 0) & is_in_few(last, ids)

    def without_last(self, drop: np.ndarray) -> FlatIds:
        """Each sequence without its last id where `drop` (a boolean per sequence) is true."""
        keep = np.ones(len(self.values), dtype=bool)
        keep[self.offsets[1:][drop & (self.lengths > 0)] - 1] = False
        return self.kept(keep)

    @classmethod
    def slices(cls, values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> FlatIds:
        """`values[starts[i]:ends[i]]` for every i, as flat ids, with numpy gathers only."""
        lengths = np.maximum(ends - starts, 0).astype(np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        index = np.repeat(starts.astype(np.int64) - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
        return cls(values[index], offsets)


def differing_sequences(left: FlatIds, right: FlatIds) -> np.ndarray:
    """Boolean per sequence: are the two flat id lists different there? (vectorised)"""
    differs = left.lengths != right.lengths
    same_length = ~differs
    if same_length.all():  # nearly always: the arrays line up whole, compared without copies
        unequal = left.values != right.values
        if unequal.any():
            differs[np.unique(np.searchsorted(left.offsets, np.flatnonzero(unequal), side="right") - 1)] = True
    elif same_length.any():
        # Over the sequences of equal length the two flat arrays line up element by element.
        left_keep = np.repeat(same_length, left.lengths)
        right_keep = np.repeat(same_length, right.lengths)
        unequal = left.values[left_keep] != right.values[right_keep]
        if unequal.any():
            rows = np.flatnonzero(same_length)
            lengths = left.lengths[rows]
            owner = np.repeat(rows, lengths)
            differs[np.unique(owner[unequal])] = True
    return differs


# What `MarkerIndex` answers when a sequence does not hold the id asked about.
ABSENT = -1

# What a marker view holds at the later positions of a marker written as a sequence of ids:
# beyond every vocabulary and every virtual id, so no look-up ever finds it.
FILLER = 1 << 40


def marker_view(flat: FlatIds, sequences: dict[int, tuple[int, ...]]) -> FlatIds:
    """`flat` with each occurrence of a marker written as a sequence of ids (Kimi-K3's
    `<|open|>think<|sep|>`: a special id, text, a special id) replaced by the marker's virtual
    id (`ResolvedProfile.sequences`) at its first position and `FILLER` at the others: the same
    positions, so every index found in the view is an index into the real ids. Longer markers
    are matched first; an occurrence never overlaps another, nor crosses from one sequence of
    `flat` into the next. Without sequences the view is `flat` itself."""
    if not sequences or not len(flat.values):
        return flat
    real = flat.values
    values = real.copy()
    taken = np.zeros(len(real), dtype=bool)
    ends = np.repeat(flat.offsets[1:], flat.lengths)
    for virtual, ids in sorted(sequences.items(), key=lambda item: -len(item[1])):
        width = len(ids)
        at = np.flatnonzero(real == ids[0])
        at = at[at + width <= ends[at]]
        for k in range(1, width):
            at = at[real[at + k] == ids[k]]
        if not len(at):
            continue
        span = at[:, None] + np.arange(width)
        at = at[~taken[span].any(axis=1)]
        if len(at) > 1:  # a marker overlapping its own previous occurrence is not another one
            at = at[np.r_[True, np.diff(at) >= width]]
        span = (at[:, None] + np.arange(width)).ravel()
        taken[span] = True
        values[span] = FILLER
        values[at] = virtual
    return FlatIds(values, flat.offsets)


def view_of(ids: Sequence[int], sequences: dict[int, tuple[int, ...]]) -> tuple[int, ...]:
    """One id list's marker view (`marker_view`), for a handful of ids (a prompt ending)."""
    if not sequences:
        return tuple(ids)
    return tuple(marker_view(FlatIds.from_sequences([ids]), sequences).values.tolist())


def is_in_few(values: np.ndarray, ids: Iterable[int | None]) -> np.ndarray:
    """`np.isin(values, ids)` for the handful of ids a profile names (markers, stop tokens): a
    comparison per id, without `np.isin`'s sort and its fixed cost (most calls here are on a
    block's few markers)."""
    wanted = [int(i) for i in ids if i is not None]
    if len(wanted) > 8:
        return np.isin(values, np.asarray(wanted, dtype=np.int64))
    found = np.zeros(len(values), dtype=bool)
    for token_id in wanted:
        found |= values == token_id
    return found


class MarkerIndex:
    """Every place where one of a few ids (a profile's markers) occurs in a `FlatIds`.

    Built with one boolean table look-up over all the ids; the hits are kept in sequence
    order, then position order. Answers are numpy arrays with one entry per sequence,
    `ABSENT` (-1) where there is no such occurrence.
    """

    def __init__(self, flat: FlatIds, ids: Iterable[int]):
        wanted = np.array(sorted({int(i) for i in ids if i is not None and i >= 0}), dtype=np.int64)
        self.sequences = len(flat)
        self.lengths = flat.lengths
        if len(wanted) and len(flat.values):
            # The table's last entry is False: every id beyond the largest wanted one lands there.
            table = np.zeros(int(wanted[-1]) + 2, dtype=bool)
            table[wanted] = True
            at = np.flatnonzero(table[np.minimum(flat.values, len(table) - 1)])
        else:
            at = np.zeros(0, dtype=np.int64)
        self.row = np.searchsorted(flat.offsets, at, side="right") - 1
        self.position = at - flat.offsets[self.row]
        self.id = flat.values[at]

    def _hits(self, ids: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
        """(row, position) of the hits of `ids`, in order."""
        keep = is_in_few(self.id, ids)
        return self.row[keep], self.position[keep]

    def first(self, ids: Iterable[int]) -> np.ndarray:
        """Per sequence: index of the first occurrence of any of `ids`, or ABSENT."""
        return self.nth(ids, 0)

    def nth(self, ids: Iterable[int], n: int) -> np.ndarray:
        """Per sequence: index of the n-th (0-based) occurrence of any of `ids`, or ABSENT."""
        rows, positions = self._hits(ids)
        found = np.full(self.sequences, ABSENT, dtype=np.int64)
        if len(rows):
            # Rank of each hit within its sequence: hits are sorted by sequence, then position.
            starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
            rank = np.arange(len(rows)) - np.repeat(starts, np.diff(np.r_[starts, len(rows)]))
            chosen = rank == n
            found[rows[chosen]] = positions[chosen]
        return found

    def count(self, ids: Iterable[int], since: np.ndarray | None = None) -> np.ndarray:
        """Per sequence: how many of its ids are any of `ids` (at index `since[i]` or later,
        when given)."""
        rows, positions = self._hits(ids)
        if since is not None:
            rows = rows[positions >= since[rows]]
        return np.bincount(rows, minlength=self.sequences).astype(np.int64)

    def trailing_run(self, ids: Iterable[int]) -> np.ndarray:
        """Per sequence: how many of its last ids are all `ids` (the stop tokens that end it)."""
        rows, positions = self._hits(ids)
        if not len(rows):
            return np.zeros(self.sequences, dtype=np.int64)
        counts = np.bincount(rows, minlength=self.sequences)
        starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        rank = np.arange(len(rows)) - np.repeat(starts, np.diff(np.r_[starts, len(rows)]))
        from_end = counts[rows] - 1 - rank
        # The k-th hit from the end sits at length-1-k exactly when it and every later hit are
        # the run that ends the sequence (positions strictly increase).
        at_end = positions == self.lengths[rows] - 1 - from_end
        return np.bincount(rows[at_end], minlength=self.sequences).astype(np.int64)


def absent_as_null(values: np.ndarray, name: str) -> pl.Series:
    """A `MarkerIndex` answer as an Int64 series, null where ABSENT."""
    absent = values == ABSENT
    if not absent.any():
        return pl.Series(name, values, dtype=pl.Int64)
    # Nulls from NaN in one constructor (exact: indexes and counts are far below 2**53).
    return pl.Series(name, np.where(absent, np.nan, values), nan_to_null=True).cast(pl.Int64)

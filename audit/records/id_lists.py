"""Token-id lists read straight from a line's bytes into int64 arrays, and handed to polars whole.

The id lists are nearly all of a record line's bytes. A JSON parser that hands them to Python
makes one `int` object per id, which is most of the time reading takes; here they never become
Python objects: simdjson reads each list into an int64 buffer (`IdLists`), and a block's lists
reach polars as one Arrow list array (`ids_column`). `audit.records.reader` does the rest of the
strict reading.
"""

from __future__ import annotations

import secrets
from itertools import pairwise
from typing import Any

import nanoarrow
import numpy as np
import orjson
import polars as pl
import simdjson

# The fields that hold token ids (`prompt_ids` is SGLang's older name for `input_ids`).
ID_LIST_FIELDS = ("input_ids", "prompt_ids", "output_ids")
NO_IDS = np.zeros(0, dtype=np.int64)
_IDS = pl.List(pl.Int64())

# What stands in a line for an id list cut out of it: one integer that no line holds by chance
# (a random 62-bit negative number drawn when the process starts).
_PLACEHOLDER_ID = -(secrets.randbits(62) + 1)
_PLACEHOLDER = b"[%d]" % _PLACEHOLDER_ID
_KEYS = tuple((name, b'"' + name.encode() + b'"') for name in ID_LIST_FIELDS)
_JSON_SPACE = frozenset(b" \t\r\n")


class IdLists:
    """Reads a line's id lists straight into int64 arrays, and the rest of it with orjson.

    Each id list is cut out of the line's text (from `"output_ids":` to the first `]`) and read
    by simdjson into an int64 buffer; the line with a placeholder list in each cut's place is
    read by orjson, as every line is otherwise. The cut is used only if orjson finds the
    placeholder as the value of that very key in the top-level object (so the cut was exactly
    that value), and simdjson read it as a flat array of 64-bit integers (a key written with
    escapes is not cut: orjson reads its list). Any other line (a list holding something else,
    a key given twice, a nested object with the same key first, bad JSON) is read whole by
    orjson, which says what is wrong with it: the values, and so the findings, are the same
    either way (`tests/test_reader.py` compares the two readings). One per block: simdjson's
    parser is reused from line to line, and is not shared between threads.
    """

    def __init__(self) -> None:
        self._parser = simdjson.Parser()

    def read(self, text: bytes) -> tuple[Any, bytes, dict[str, np.ndarray]] | None:
        """(value, the text orjson read, the id arrays), or None: read the line whole."""
        cuts = self._cuts(text)
        if not cuts:
            return None
        pieces: list[bytes] = []
        arrays: dict[str, np.ndarray] = {}
        at = 0
        for name, start, end in cuts:
            ids = self._ids(text[start:end])
            if ids is None:
                return None
            pieces += (text[at:start], _PLACEHOLDER)
            arrays[name] = ids
            at = end
        pieces.append(text[at:])
        rest = b"".join(pieces)
        try:
            value = orjson.loads(rest)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(value, dict) or any(value.get(name) != [_PLACEHOLDER_ID] for name in arrays):
            return None
        return value, rest, arrays

    @staticmethod
    def _cuts(text: bytes) -> list[tuple[str, int, int]]:
        """(name, start, end) of each id list's text, in line order; empty when one is not
        where a plain reading finds it."""
        cuts = []
        for name, key in _KEYS:
            at = text.find(key)
            if at < 0:
                continue
            at += len(key)
            while at < len(text) and text[at] in _JSON_SPACE:
                at += 1
            if text[at : at + 1] != b":":
                return []
            at += 1
            while at < len(text) and text[at] in _JSON_SPACE:
                at += 1
            end = text.find(b"]", at) + 1
            if text[at : at + 1] != b"[" or end == 0:
                return []
            cuts.append((name, at, end))
        cuts.sort(key=lambda cut: cut[1])
        if any(before[2] > after[1] for before, after in pairwise(cuts)):
            return []
        return cuts

    def _ids(self, array: bytes) -> np.ndarray | None:
        """A JSON array of 64-bit integers as an int64 array, or None (anything else)."""
        document = None
        try:
            document = self._parser.parse(array)
            if not isinstance(document, simdjson.Array):
                return None
            ids = np.frombuffer(document.as_buffer(of_type="i"), dtype=np.int64)
            # as_buffer flattens nested arrays: a list holding lists is not a list of ids.
            return ids if len(document) == len(ids) else None
        except (ValueError, TypeError, RuntimeError):
            return None
        finally:
            del document  # the parser is reused only once nothing refers to its last document


def ids_column(name: str, column: list[Any]) -> pl.Series:
    """An id-list column from what the reading gave each line: an int64 array (read natively),
    a list (read whole by orjson, built strictly: a float or a string raises) or None."""
    native = [isinstance(ids, np.ndarray) for ids in column]
    if not any(native):
        return pl.Series(name, column, dtype=_IDS, strict=True)
    arrays = _arrays_column(name, [ids if n else NO_IDS for ids, n in zip(column, native, strict=True)])
    if all(native):
        return arrays
    rest = pl.Series(name, [None if n else ids for ids, n in zip(column, native, strict=True)], dtype=_IDS, strict=True)
    return arrays.zip_with(pl.Series(native, dtype=pl.Boolean()), rest)


def _arrays_column(name: str, arrays: list[np.ndarray]) -> pl.Series:
    """int64 arrays as a List(Int64) column: one buffer of all their ids and one of offsets,
    handed to polars as an Arrow array (nanoarrow), not array by array (~25x faster)."""
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays)), out=offsets[1:])
    values = np.concatenate(arrays) if arrays else NO_IDS
    ids = nanoarrow.c_array_from_buffers(nanoarrow.int64(), len(values), [None, values])
    lists = nanoarrow.c_array_from_buffers(
        nanoarrow.large_list(nanoarrow.int64()), len(arrays), [None, offsets], children=[ids]
    )
    return pl.Series(lists).cast(_IDS).alias(name)

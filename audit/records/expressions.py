"""Polars expressions over id-list columns that rules and the record view share."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl


def first_index_of(column: str, token_id: int) -> pl.Expr:
    """Index of the first occurrence of `token_id` in a list column, null when absent."""
    return pl.col(column).list.eval(pl.arg_where(pl.element() == token_id).first()).list.first()


def nth_index_of(column: str, token_id: int, n: int) -> pl.Expr:
    """Index of the n-th (0-based) occurrence of `token_id`, null when there are fewer."""
    return pl.col(column).list.eval(pl.arg_where(pl.element() == token_id)).list.get(n, null_on_oob=True)


def id_set(token_ids: Sequence[int]) -> pl.Expr:
    """A set of ids to test membership against with `is_in`."""
    return pl.lit(pl.Series(list(token_ids), dtype=pl.Int64)).implode()


def first_index_in(column: str, token_ids: Sequence[int]) -> pl.Expr:
    """Index of the first element that is any of `token_ids`, null when none is."""
    wanted = id_set(token_ids)
    return pl.col(column).list.eval(pl.arg_where(pl.element().is_in(wanted)).first()).list.first()


def ends_with(column: str, suffix: Sequence[int]) -> pl.Expr:
    """Does the list column end with exactly these ids? (False for shorter lists.)"""
    width = len(suffix)
    matches = [
        pl.col(column).list.get(index - width, null_on_oob=True) == token
        for index, token in enumerate(suffix)
    ]
    return pl.all_horizontal(matches).fill_null(False)


def truncated() -> pl.Expr:
    """The server stopped the output early: length limit or abort (the termination rules speak)."""
    return pl.col("finish_type").is_in(["length", "abort"]).fill_null(False)

"""Which tokens of a record `audit inspect` shows: all of a short one, windows of a long one.

A record may hold millions of ids; a person reads a few hundred. An output of up to
`WHOLE_OUTPUT` ids is shown whole; of a longer one, the view keeps the first and last tokens
(how it starts, how it stops) and a window on each side of every token a finding points at.
Of the prompt it keeps the tail (its generation suffix) and a window from just before each
prompt token a finding points at. Everything else is left out and counted; ranges that touch,
or leave less than `SMALLEST_GAP` tokens between them, are joined. The whole record is shown
on request (`audit inspect --all-tokens`). Spans are half-open `(start, end)` index ranges of
one id list, sorted, disjoint.

The tokens shown become a `TokenRun` (`token_run`): only they are decoded; the output's
special tokens are found over the whole list in numpy (`special_tokens`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from audit.model.tokens.token_text import token_pieces
from audit.model.tokens.tokenizer import Tokenizer
from audit.records.segments import SEGMENT_PROMPT

# An output this long or shorter is shown whole.
WHOLE_OUTPUT = 1024
# Tokens shown on each side of a token a finding points at.
AROUND_FINDING = 256
# A longer output's first and last tokens, shown whatever else is left out.
OUTPUT_HEAD = 64
OUTPUT_END = 64
# Prompt tokens shown before a prompt token a finding points at (a little context; the window
# runs on after it, and the prompt's tail is shown anyway).
PROMPT_BEFORE_FINDING = 4
# A gap shorter than this is shown, not summarised in a line of its own.
SMALLEST_GAP = 8

Span = tuple[int, int]

ROLE_UNKNOWN = "out_of_vocabulary"

TOKEN_SCHEMA: dict[str, pl.DataType] = {
    "index": pl.Int64(),
    "id": pl.Int64(),
    "piece": pl.String(),
    "role": pl.String(),
    "segment": pl.String(),
    "rules": pl.String(),  # codes of the findings pointing at this token, comma-separated
}


def joined(total: int, wanted: Iterable[Span]) -> list[Span]:
    """`wanted` clipped to `[0, total)`, sorted, with overlapping or nearly touching spans joined."""
    spans = sorted((max(0, lo), min(total, hi)) for lo, hi in wanted)
    out: list[Span] = []
    for lo, hi in spans:
        if hi <= lo:
            continue
        if out and lo - out[-1][1] < SMALLEST_GAP:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def output_spans(total: int, positions: Iterable[int]) -> list[Span]:
    """What an output of `total` ids shows: all of it when short, else its head, its end and a
    window around each finding."""
    if total <= WHOLE_OUTPUT:
        return whole(total)
    around = [(p - AROUND_FINDING, p + AROUND_FINDING + 1) for p in positions]
    return joined(total, [(0, OUTPUT_HEAD), (total - OUTPUT_END, total), *around])


def prompt_spans(total: int, tail: int, positions: Iterable[int]) -> list[Span]:
    """What a prompt of `total` ids shows: its last `tail` ids, and each finding's window."""
    around = [(p - PROMPT_BEFORE_FINDING, p + AROUND_FINDING + 1) for p in positions]
    return joined(total, [(total - tail, total), *around])


def whole(total: int) -> list[Span]:
    """Every id of a list of `total`."""
    return [(0, total)] if total else []


def indices(spans: list[Span]) -> np.ndarray:
    """The indices the spans cover, in order (int64)."""
    if not spans:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in spans])


def left_out(shown: np.ndarray, total: int) -> list[Span]:
    """The ranges of `[0, total)` that the sorted indices `shown` skip."""
    if len(shown) == 0:
        return whole(total)
    jumps = np.flatnonzero(np.diff(shown) > 1)
    gaps = [(int(shown[j]) + 1, int(shown[j + 1])) for j in jumps]
    if shown[0] > 0:
        gaps.insert(0, (0, int(shown[0])))
    if shown[-1] < total - 1:
        gaps.append((int(shown[-1]) + 1, total))
    return gaps


@dataclass(frozen=True)
class TokenRun:
    """The tokens shown of one id list, in order: `tokens` rows are `field[index]` for each
    `index`, from `start` on; the ranges between them (`left_out`) are not shown."""

    field: str  # input_ids | output_ids
    start: int  # the first index shown (0 when none is)
    total: int  # length of the whole list
    tokens: pl.DataFrame  # TOKEN_SCHEMA

    @property
    def height(self) -> int:
        return self.tokens.height

    @property
    def omitted(self) -> int:
        """How many of the list's tokens are not shown."""
        return self.total - self.height

    @property
    def left_out(self) -> list[Span]:
        """The index ranges not shown, in order."""
        return left_out(self.tokens["index"].to_numpy(), self.total)

    def to_json(self) -> dict[str, Any]:
        return {
            "field": self.field,
            "start": self.start,
            "total": self.total,
            "omitted": self.omitted,
            "tokens": self.tokens.to_dicts(),
        }


def token_run(
    tokenizer: Tokenizer,
    roles: pl.DataFrame,
    field: str,
    at: np.ndarray,
    ids: np.ndarray,
    pointed: list[tuple[int, str]],
    segments: np.ndarray | None,
    marker_roles: np.ndarray | None = None,
) -> TokenRun:
    """The ids at indices `at` of the list `ids` (the record's `field`) as a run of tokens:
    decoded, with their role (`roles`: id, role; `marker_roles`: per index of `ids`, the role
    of a marker written as a sequence, which wins), their segment (the prompt's when None) and
    the codes of the findings `pointed` at them (index, rule)."""
    shown = ids[at]
    frame = pl.DataFrame(
        {
            "index": at,
            "id": shown,
            "piece": token_pieces(tokenizer, shown),
            "known": tokenizer.knows(shown),
            "segment": pl.Series(
                [SEGMENT_PROMPT] * len(shown) if segments is None else segments.tolist(), dtype=pl.String
            ),
        },
        schema={"index": pl.Int64, "id": pl.Int64, "piece": pl.String, "known": pl.Boolean, "segment": pl.String},
    ).join(roles, on="id", how="left", maintain_order="left")
    if marker_roles is not None:
        by_sequence = pl.Series("sequence_role", marker_roles[at].tolist(), dtype=pl.String)
        frame = frame.with_columns(pl.coalesce(by_sequence, pl.col("role")).alias("role"))
    frame = frame.with_columns(
        pl.when(~pl.col("known")).then(pl.lit(ROLE_UNKNOWN)).otherwise(pl.col("role")).alias("role")
    )
    rules = (
        pl.DataFrame(pointed, schema={"index": pl.Int64, "rule": pl.String}, orient="row")
        .group_by("index", maintain_order=True)
        .agg(pl.col("rule").unique(maintain_order=True).str.join(",").alias("rules"))
    )
    frame = frame.join(rules, on="index", how="left", maintain_order="left")
    start = int(at[0]) if len(at) else 0
    tokens = frame.select(list(TOKEN_SCHEMA)).cast(pl.Schema(TOKEN_SCHEMA))
    return TokenRun(field=field, start=start, total=len(ids), tokens=tokens)


def special_tokens(tokenizer: Tokenizer, roles: pl.DataFrame, ids: np.ndarray) -> pl.DataFrame:
    """The tokens of `ids` that have a role (index, id, piece, role), found in numpy."""
    known = tokenizer.knows(ids)
    at = np.flatnonzero(np.isin(ids, roles["id"].to_numpy()) | ~known)
    frame = pl.DataFrame(
        {"index": at, "id": ids[at], "piece": token_pieces(tokenizer, ids[at]), "known": known[at]},
        schema={"index": pl.Int64, "id": pl.Int64, "piece": pl.String, "known": pl.Boolean},
    ).join(roles, on="id", how="left", maintain_order="left")
    role = pl.when(~pl.col("known")).then(pl.lit(ROLE_UNKNOWN)).otherwise(pl.col("role")).alias("role")
    return frame.select("index", "id", "piece", role)

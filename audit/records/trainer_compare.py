"""A trainer's sequence beside the exact sample: where the ids part, which tokens each mask trains.

The exact sample is what the record holds: `input_ids + output_ids`, trained over the output
only (mask 0 over the prompt, 1 over the output). A trainer fed text trains on its own
rendering and re-encoding of the conversation, with its own mask. `compare` lines the two up:
the longest common prefix and suffix of the ids bound the window where they differ; outside
it every token is the same token, and the two masks are compared there, position by position.

A rendering that ends one template separator past the sample (Qwen's `<|im_end|>\\n` after the
model's `<|im_end|>`: the template writes a newline after every turn, the model stops at its
end of turn) has not changed the sequence the model produced: `trailing_separator` finds such
whitespace-only tokens after the sample's final stop token, and they are left out of both the
ids and the mask compared.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Comparison:
    """Where a trained sequence parts from the exact sample, and how the masks differ."""

    same_ids: bool
    first: int  # first differing index (the common prefix's length)
    exact_end: int  # end of the differing window on the exact side (exclusive)
    trained_end: int  # ... and on the trained side
    missing: np.ndarray  # exact indices of output tokens the trainer does not train (aligned)
    extra: np.ndarray  # exact indices of prompt tokens it trains (aligned)


def exact_mask(prompt_length: int, length: int) -> np.ndarray:
    """The exact sample's mask: 0 over the prompt, 1 over the output."""
    mask = np.zeros(length, dtype=np.int64)
    mask[prompt_length:] = 1
    return mask


def trailing_separator(exact: np.ndarray, trained: np.ndarray, stops: tuple[int, ...], blank: set[int]) -> int:
    """How many tokens the trained sequence has past the sample's end that are only the
    template's separator: whitespace tokens (`blank`) after the same final stop token."""
    if not len(exact) or int(exact[-1]) not in stops:
        return 0
    k = len(trained) - 1
    while k >= 0 and int(trained[k]) in blank:
        k -= 1
    if k < 0 or k == len(trained) - 1 or int(trained[k]) != int(exact[-1]):
        return 0
    return len(trained) - 1 - k


def compare(exact: np.ndarray, prompt_length: int, trained: np.ndarray, trained_mask: np.ndarray) -> Comparison:
    """The trained ids and mask (the separator already cut off) beside the exact sample."""
    n, m = len(exact), len(trained)
    shortest = min(n, m)
    differ = np.flatnonzero(exact[:shortest] != trained[:shortest])
    prefix = int(differ[0]) if len(differ) else shortest
    if prefix == n == m:
        mask = exact_mask(prompt_length, n)
        return Comparison(
            True, n, n, m,
            np.flatnonzero((mask == 1) & (trained_mask == 0)),
            np.flatnonzero((mask == 0) & (trained_mask == 1)),
        )
    room = shortest - prefix  # the common suffix may not overlap the common prefix
    tail_differ = np.flatnonzero(exact[n - room :][::-1] != trained[m - room :][::-1]) if room else np.array([0])
    suffix = int(tail_differ[0]) if len(tail_differ) else room
    mask = exact_mask(prompt_length, n)
    exact_at = np.concatenate([np.arange(prefix), np.arange(n - suffix, n)]).astype(np.int64)
    trained_at = np.concatenate([np.arange(prefix), np.arange(m - suffix, m)]).astype(np.int64)
    ours, theirs = mask[exact_at], trained_mask[trained_at]
    return Comparison(
        False, prefix, n - suffix, m - suffix,
        exact_at[(ours == 1) & (theirs == 0)],
        exact_at[(ours == 0) & (theirs == 1)],
    )


def boundary_mask(length: int, boundary: int) -> np.ndarray:
    """A loss mask of `length` ids trained from `boundary` on (a row's own turn)."""
    mask = np.zeros(length, dtype=np.int64)
    mask[boundary:] = 1
    return mask


def early_and_history(extra: np.ndarray, prompt_length: int) -> tuple[np.ndarray, np.ndarray]:
    """The prompt tokens a trainer trains (`extra`, ascending), split: those that run up to the
    output (the mask starts early: its assistant header ends before the generation prompt
    does), and the rest (earlier turns)."""
    run = 0
    while run < len(extra) and extra[len(extra) - 1 - run] == prompt_length - 1 - run:
        run += 1
    return extra[len(extra) - run :], extra[: len(extra) - run]

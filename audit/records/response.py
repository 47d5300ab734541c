"""Where each output's reasoning ends and its answer begins, for a whole batch at once.

The response token (`</think>`) splits an output of a thinking family in two. Where the
reasoning starts depends on the record's prompt: its ending, one the profile accepts, leaves
the output in a reasoning state (`prompt_reasoning`): the prompt opened `<think>`, the model
opens it, it may, or there is no reasoning at all (thinking off, or a family whose turn after a
tool result has none: an agentic continuation). Where the reasoning ends depends on the
output: at the first `</think>`, or, for families whose profile says a tool call may end the
reasoning (`may_end_reasoning`: Kimi, Qwen3.5/3.6), at a tool call
entered with no `</think>` before it, as SGLang's reasoning parsers split it. Everything after
is the answer, up to the trailing stop token(s).

`response_bounds(batch)` computes these bounds once per batch from the batch's marker index
(`audit.model.tokens.flat_ids`: one look-up over the flat output ids, no per-token Python); the tool-call
grammar, the segmentation and degenerate-output rules, the record statistics, `audit inspect`
and the HTML samples all read them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from audit.model.families.profiles import ResolvedProfile
from audit.model.families.prompt_endings import REASONING_STATES
from audit.model.tokens.flat_ids import ABSENT, FlatIds, MarkerIndex, absent_as_null
from audit.records.batch import Batch
from audit.records.expressions import ends_with

REASONING = pl.Enum(REASONING_STATES)

# One row per record, in batch order. Indexes are into `output_ids`; ends are exclusive.
BOUNDS_SCHEMA: dict[str, pl.DataType] = {
    "reasoning": REASONING,  # the state the prompt's ending leaves the output in
    "reasoning_start": pl.Int64(),  # null: no reasoning segment (thinking off, harmony, never opened)
    "reasoning_end": pl.Int64(),
    "response_at": pl.Int64(),  # the first response token (</think>), or null
    "tool_entry": pl.Int64(),  # the first id that opens a tool call (section or call begin), or null
    "answer_start": pl.Int64(),  # null: the reasoning never ended, there is no answer
    "answer_end": pl.Int64(),  # before the trailing stop token(s)
}


def tool_entry_ids(profile: ResolvedProfile) -> list[int]:
    """Ids that open a tool call: the section begin where the family has one, else call begin."""
    markers = profile.tool_markers
    return [markers[role] for role in ("section_begin", "call_begin") if role in markers][:1]


def prompt_reasoning(profile: ResolvedProfile) -> pl.Expr:
    """Per record, the reasoning state its prompt leaves the output in (`REASONING`): that of
    the longest accepted ending `input_ids` end with, else the generation prompt's."""
    default = pl.lit(profile.reasoning, dtype=REASONING)
    states = profile.suffix_reasoning
    if len(set(states)) <= 1:
        return default
    expression: Any = None  # polars' when/then chain, grown one ending at a time
    endings = sorted(zip(profile.prompt_suffixes, states, strict=True), key=lambda p: -len(p[0]))
    for suffix, state in endings:
        matched = ends_with("input_ids", suffix)
        value = pl.lit(state, dtype=REASONING)
        chain = pl.when(matched) if expression is None else expression.when(matched)
        expression = chain.then(value)
    return expression.otherwise(default)


def answer_text(profile: ResolvedProfile) -> pl.Expr:
    """The decoded answer of each record, over a frame of the records' `decoded` output
    (special tokens kept) beside their bounds: after the response token's text, from the
    entry of a call that ended the reasoning, the whole output when there is no reasoning;
    empty when the reasoning never ended."""
    decoded = pl.col("decoded")
    think_end = profile.profile.think_end
    after_response = decoded.str.split(think_end).list.last() if think_end else decoded
    spec = profile.tool_calls
    entry = next(iter(spec.markers.values()), None) if spec is not None else None
    from_entry = (
        decoded.str.slice(decoded.str.find(entry, literal=True).fill_null(0)) if entry else decoded
    )
    return (
        pl.when(pl.col("reasoning_start").is_null())
        .then(decoded)
        .when(pl.col("response_at").is_not_null())
        .then(after_response)
        .when(pl.col("answer_start").is_not_null())
        .then(from_entry)
        .otherwise(pl.lit(""))
        .fill_null("")
    )


def response_bounds(batch: Batch) -> pl.DataFrame:
    """Reasoning and answer bounds of every record of the batch (`BOUNDS_SCHEMA`), computed once."""
    return batch.shared(_bounds)


def bound(batch: Batch, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Per record: the bound `name` (a column of `response_bounds` but `reasoning`) and where it
    is known (null there), as the numpy the bounds are computed in."""
    return batch.shared(_bound_arrays)[1][name]


def bound_or(batch: Batch, name: str, default: np.ndarray | int) -> np.ndarray:
    """Per record: the bound `name` (a column of `response_bounds` but `reasoning`), or `default`
    where it is not known (null there); int64, read from the numpy the bounds are computed in
    (no polars query)."""
    values, known = bound(batch, name)
    return np.where(known, values, default).astype(np.int64, copy=False)


def _first(markers: MarkerIndex, token_ids: Sequence[int | None]) -> np.ndarray:
    wanted = [i for i in token_ids if i is not None]
    return markers.first(wanted) if wanted else np.full(markers.sequences, ABSENT, dtype=np.int64)


def stop_run(batch: Batch) -> np.ndarray:
    """Per record: how many stop tokens end its output (usually one; 0 for none or no output)."""
    return batch.markers.trailing_run(batch.profile.stop_ids)


def _bounds(batch: Batch) -> pl.DataFrame:
    state, columns = batch.shared(_bound_arrays)
    return pl.DataFrame(
        [
            pl.Series("reasoning", np.array(REASONING_STATES)[state], dtype=pl.String).cast(REASONING),
            *(_known(name, *columns[name]) for name in BOUNDS_SCHEMA if name != "reasoning"),
        ]
    )


def _bound_arrays(batch: Batch) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The bounds as numpy: the reasoning state's index in `REASONING_STATES` per record, and
    each Int64 column of `BOUNDS_SCHEMA` as (values, known)."""
    profile = batch.profile
    markers = batch.markers
    # The scans over every id come from the batch's marker index (one look-up over the flat
    # ids); what follows is arithmetic on a few numbers per record, in numpy: each value with a
    # mask of where it is known (null where it is not).
    present = batch.output_present
    length = batch.output_flat.lengths
    end = length - stop_run(batch)  # known where the output is present
    close = _first(markers, [profile.think_end])
    entry = _first(markers, tool_entry_ids(profile))
    has_close, has_entry = close != ABSENT, entry != ABSENT
    state = _reasoning_states(batch)

    # Where the reasoning starts; never known in a family without think tokens (all answer).
    start = np.zeros(batch.height, dtype=np.int64)
    has_start = np.zeros(batch.height, dtype=bool)
    if profile.think_start is not None:
        prompt_opens = state == REASONING_STATES.index("prompt_opens")
        has_start |= prompt_opens
        # A `<think>` lost but its `</think>` kept: the reasoning still ran from the start.
        opened = _first(markers, [profile.think_start])
        model_opens = state == REASONING_STATES.index("model_opens")
        start = np.where(model_opens & (opened != ABSENT), opened + profile.width(profile.think_start), start)
        has_start |= model_opens & ((opened != ABSENT) | has_close)
        may_open = state == REASONING_STATES.index("may_open")
        flat = batch.marker_flat
        own_think = np.zeros(batch.height, dtype=bool)
        nonempty = flat.lengths > 0
        own_think[nonempty] = flat.values[flat.offsets[:-1][nonempty]] == profile.think_start
        start = np.where(may_open, own_think.astype(np.int64) * profile.width(profile.think_start), start)
        has_start |= may_open

    spec = profile.tool_calls
    closed_by_call = ~has_close & has_entry if spec is not None and spec.may_end_reasoning else np.zeros_like(has_close)
    by_close, by_call = has_start & has_close, has_start & ~has_close & closed_by_call
    by_end = has_start & ~has_close & ~closed_by_call
    reasoning_end = np.select([by_close, by_call], [close, entry], end)
    has_reasoning_end = by_close | by_call | (by_end & present)
    # The answer starts after the whole response marker (one id, or a sequence's).
    close_width = profile.width(profile.think_end) if profile.think_end is not None else 1
    answer_start = np.select([~has_start, by_close, by_call], [0, close + close_width, entry], 0)
    has_answer_start = ~has_start | by_close | by_call
    # The greater of the two that are known (polars' max_horizontal).
    answer_end = np.where(present & has_answer_start, np.maximum(end, answer_start), np.where(present, end, answer_start))
    has_answer_end = present | has_answer_start
    return state, {
        "reasoning_start": (start, has_start),
        "reasoning_end": (reasoning_end, has_reasoning_end),
        "response_at": (close, has_close),
        "tool_entry": (entry, has_entry),
        "answer_start": (answer_start, has_answer_start),
        "answer_end": (answer_end, has_answer_end),
    }


def _known(name: str, values: np.ndarray, known: np.ndarray) -> pl.Series:
    """An Int64 column of `values` (indexes, never negative), null where not `known`."""
    return absent_as_null(np.where(known, values, ABSENT), name)


def record_reasoning(batch: Batch) -> pl.Series:
    """Per record, the reasoning state its prompt leaves the output in, by its ending (in a
    mixed run with a thinking token, the ending of the mode the token says)."""
    return pl.Series("reasoning", np.array(REASONING_STATES)[_reasoning_states(batch)], dtype=pl.String)


def _reasoning_states(batch: Batch) -> np.ndarray:
    """Per record, the index in `REASONING_STATES` of the state its prompt leaves the output in
    (`prompt_reasoning`, from the flat prompt ids)."""
    profile = batch.profile
    states = np.full(batch.height, REASONING_STATES.index(profile.reasoning), dtype=np.int64)
    if len(set(profile.suffix_reasoning)) <= 1:
        return states
    ending = prompt_endings(batch)
    matched = ending >= 0
    indexes = np.array([REASONING_STATES.index(state) for state in profile.suffix_reasoning], dtype=np.int64)
    states[matched] = indexes[ending[matched]]
    return states


def prompt_endings(batch: Batch) -> np.ndarray:
    """Per record, the index in `profile.prompt_suffixes` of the longest accepted ending its
    prompt ends with (the first listed of equal ones), -1 for none (PRM001's finding)."""
    return batch.shared(_prompt_endings)


def _prompt_endings(batch: Batch) -> np.ndarray:
    profile = batch.profile
    ending = np.full(batch.height, -1, dtype=np.int64)
    by_length = sorted(range(len(profile.prompt_suffixes)), key=lambda i: -len(profile.prompt_suffixes[i]))
    token_modes = _token_modes(batch)
    if token_modes is not None:  # first the endings of the mode the prompt's thinking token says
        for index in by_length:
            own = token_modes == profile.suffix_modes[index]
            matched = _ends_with(batch.input_flat, profile.prompt_suffixes[index]) & (ending < 0) & own
            ending[matched] = index
    for index in by_length:
        matched = _ends_with(batch.input_flat, profile.prompt_suffixes[index]) & (ending < 0)
        ending[matched] = index
    return ending


def _token_modes(batch: Batch) -> np.ndarray | None:
    """Per record of a mixed run, the mode its prompt's thinking token says (True: the prompt
    holds it); None where the profile has no such token or the run has one mode."""
    profile = batch.profile
    if profile.thinking_token is None or len(profile.modes) < 2:
        return None
    holds = batch.records.select(pl.col("input_ids").list.contains(profile.thinking_token).fill_null(False))
    return np.asarray(holds.to_series().to_numpy(), dtype=bool)


def record_modes(batch: Batch) -> np.ndarray:
    """Per record, the thinking mode it is judged in (True: thinking): the run's, or in a mixed
    run (or where an ending says it was rendered in the other mode) that of its prompt's thinking
    token where the family has one (`tokens.thinking_token`), else that of its prompt's ending; a
    prompt with no accepted ending is judged in the first."""
    profile = batch.profile
    modes = np.full(batch.height, profile.modes[0], dtype=bool)
    token_modes = _token_modes(batch)
    if token_modes is not None:
        return token_modes
    if len(set(profile.suffix_modes)) > 1:
        ending = prompt_endings(batch)
        matched = ending >= 0
        modes[matched] = np.asarray(profile.suffix_modes, dtype=bool)[ending[matched]]
    return modes


def _ends_with(flat: FlatIds, suffix: Sequence[int]) -> np.ndarray:
    """Per sequence: does it end with exactly these ids? (False for shorter ones.)"""
    width = len(suffix)
    matched = flat.lengths >= width
    rows = np.flatnonzero(matched)
    if width and len(rows):
        tails = flat.values[flat.offsets[1:][rows, None] - width + np.arange(width)]
        matched[rows] = (tails == np.asarray(suffix, dtype=np.int64)).all(axis=1)
    return matched

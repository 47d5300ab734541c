"""The record view: which segment every output token belongs to, computed once per batch.

An output is reasoning, answer and tool calls (harmony families: messages on the analysis,
final and commentary channels). The parts come from three core modules, each computed once per
batch and shared through `Batch.shared`:

* `audit.records.response`: where the reasoning ends and the answer begins (`response_bounds`);
* `audit.records.call_view`: the tool calls read from the answer (`tool_call_view`);
* `audit.records.channels`: harmony messages and their channels (`harmony_messages`).

This module joins them into spans (`segment_spans`) and labels every token of every output
with numpy over the flat ids (`token_segments`), for `audit inspect` and the HTML samples, and
summarises each record for the engine's statistics (`record_summary`). Rules read the parts
directly.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import numpy as np
import polars as pl

from audit.model.families.profiles import ResolvedProfile
from audit.model.tokens.flat_ids import FlatIds, marker_view
from audit.model.tokens.token_text import token_strings
from audit.model.tokens.tokenizer import Tokenizer
from audit.records.batch import Batch
from audit.records.call_view import tool_call_view
from audit.records.channels import harmony_messages
from audit.records.response import bound, bound_or, response_bounds

SEGMENT_PROMPT = "prompt"
SEGMENT_REASONING = "reasoning"
SEGMENT_ANSWER = "answer"
SEGMENT_TOOL_CALLS = "tool_calls"
# Painting order: a later segment wins where spans overlap; the answer is what is left.
SEGMENTS = (SEGMENT_ANSWER, SEGMENT_REASONING, SEGMENT_TOOL_CALLS)

# Roles of the tokens a profile names, and of the tokenizer's other special tokens.
ROLE_THINK = "think"
ROLE_RESPONSE = "response"
ROLE_END_OF_TURN = "end_of_turn"
ROLE_EOS = "eos"
ROLE_TOOL = "tool"  # prefixed: tool:section_begin, tool:call_begin, ...
ROLE_SPECIAL = "special"  # a special token of the tokenizer the profile gives no role
ROLE_IMAGE = "image"  # a vision placeholder's tokens, its pad shown as the image's chip (inspect, HTML)

SPANS_SCHEMA: dict[str, pl.DataType] = {
    "row": pl.UInt32(),
    "segment": pl.String(),
    "start": pl.Int64(),
    "end": pl.Int64(),  # exclusive
}


def token_roles(profile: ResolvedProfile, tokenizer: Tokenizer) -> dict[int, str]:
    """id -> role for every token the profile names and the tokenizer's other special tokens."""
    roles = dict.fromkeys(tokenizer.special_ids, ROLE_SPECIAL)
    roles.update(dict.fromkeys(profile.eos, ROLE_EOS))
    roles.update(dict.fromkeys(profile.end_of_turn, ROLE_END_OF_TURN))
    roles.update({token_id: f"{ROLE_TOOL}:{role}" for role, token_id in profile.tool_markers.items()})
    if profile.think_start is not None:
        roles[profile.think_start] = ROLE_THINK
    if profile.think_end is not None:
        roles[profile.think_end] = ROLE_RESPONSE
    return roles


def sequence_roles(profile: ResolvedProfile, roles: dict[int, str], ids: np.ndarray) -> np.ndarray | None:
    """Per position of `ids`, the role of the marker written as a sequence that covers it (every
    id of `<|open|>think<|sep|>` is the think marker's), None elsewhere; None for a family whose
    markers are all single ids (`roles` by id say it all)."""
    if not profile.sequences:
        return None
    view = marker_view(FlatIds.from_sequences([ids.tolist()]), profile.sequences).values
    found = np.full(len(ids), None, dtype=object)
    for at in np.flatnonzero(np.isin(view, list(profile.sequences))).tolist():
        if int(view[at]) in roles:
            found[at : at + profile.width(int(view[at]))] = roles[int(view[at])]
    return found


def segment_spans(batch: Batch) -> pl.DataFrame:
    """Reasoning and tool-call spans of every output (`SPANS_SCHEMA`); the rest is answer.

    The reasoning span holds the tokens that open and close it (`<think>`, `</think>`); a
    reasoning never closed runs to the end. A tool-call span runs from the marker that opens a
    section (or call) to the one that closes it, in the answer only; harmony messages are
    spans of their channel's segment, from the `<|start|>` that opens them to their end marker.
    """
    if batch.profile.channels is not None:
        return _harmony_spans(batch)
    parts = [_reasoning_spans(batch)]
    profile = batch.profile
    if profile.tool_calls is not None and (profile.tool_markers or profile.tool_text_markers):
        parts.append(_tool_spans(batch))
    return pl.concat([pl.DataFrame(schema=SPANS_SCHEMA), *parts], how="vertical")


def token_segments(batch: Batch) -> list[np.ndarray]:
    """Per record, the segment name of each output token (an array of strings), vectorised."""
    lengths = batch.records["output_ids"].list.len().fill_null(0).to_numpy().astype(np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    codes = np.zeros(int(offsets[-1]), dtype=np.int8)  # 0: answer
    spans = segment_spans(batch)
    for code, segment in enumerate(SEGMENTS[1:], start=1):
        mine = spans.filter(pl.col("segment") == segment).drop_nulls()
        if mine.is_empty():
            continue
        rows = mine["row"].to_numpy().astype(np.int64)
        starts = np.clip(mine["start"].to_numpy().astype(np.int64), 0, None) + offsets[rows]
        ends = np.minimum(mine["end"].to_numpy().astype(np.int64), lengths[rows]) + offsets[rows]
        # A difference array marks every covered position in one cumulative sum.
        marks = np.zeros(len(codes) + 1, dtype=np.int64)
        keep = ends > starts
        np.add.at(marks, starts[keep], 1)
        np.add.at(marks, ends[keep], -1)
        codes[np.cumsum(marks[:-1]) > 0] = code
    names = np.array(SEGMENTS, dtype=object)
    return [names[codes[offsets[i] : offsets[i + 1]]] for i in range(len(lengths))]


def record_summary(batch: Batch) -> pl.DataFrame:
    """Per record: where the response token is (`response_at`), how many tool calls it makes,
    and whether it thinks (`thinking`: the serving mode it shows).

    Calls are counted in the answer only: by their call-begin ids when the format has them (no
    decoding), else from the calls read (`tool_call_view`).
    """
    bounds = response_bounds(batch)
    markers = batch.profile.tool_markers
    spec = batch.profile.tool_calls
    if batch.profile.channel_markers:
        # Harmony: a call is a message its model ended with <|call|>.
        messages = harmony_messages(batch)
        made = messages.filter(pl.col("terminator") == "call").group_by("row").len()
        calls = (
            pl.DataFrame({"row": pl.arange(0, batch.height, eager=True, dtype=pl.UInt32)})
            .join(made.cast({"row": pl.UInt32}), on="row", how="left", maintain_order="left")["len"]
        )
    elif spec is None or not (markers or batch.profile.tool_text_markers):
        calls = pl.repeat(0, batch.height, dtype=pl.UInt32, eager=True)
    elif spec.format.unit == "call" and "call_begin" in markers:
        # The call begins in the answer, from the batch's marker index (a begin may be a sequence).
        start = bound_or(batch, "answer_start", batch.output_flat.lengths)
        calls = pl.Series("tool_calls", batch.markers.count([markers["call_begin"]], since=start))
    else:
        calls = tool_call_view(batch).per_record
    return pl.DataFrame(
        {
            "response_at": bounds["response_at"],
            "tool_calls": (calls.fill_null(0) if calls.null_count() else calls).cast(pl.UInt32),
            "thinking": _thinking(batch),
        }
    )


# Reasoning this many tokens long or longer holds more than whitespace without looking inside;
# shorter reasoning (`<think>\n\n</think>`, a model's own "thinking off") is decoded to tell.
_SURELY_THOUGHT = 16


def _thinking(batch: Batch) -> pl.Series:
    """Per record: True when its output reasons (a reasoning segment holding a token that is not
    whitespace), False when it does not (thinking off: the prompt closed the reasoning, the
    model closed it empty, or the turn has none); null for records without output, and for
    every record of a family without think tokens (harmony: its analysis channel is not a mode
    that can be switched off)."""
    if batch.profile.think_start is None and batch.profile.profile.think_end is None:
        return pl.repeat(None, batch.height, dtype=pl.Boolean, eager=True)
    start, has_start = bound(batch, "reasoning_start")
    end, has_end = bound(batch, "reasoning_end")
    start = np.where(has_start, start, 0)
    length = np.where(has_start & has_end, end - start, 0)
    thinking = length >= _SURELY_THOUGHT
    short = np.flatnonzero((length > 0) & (length < _SURELY_THOUGHT))
    if len(short):
        flat = batch.output_flat
        first = flat.offsets[:-1][short] + start[short]
        segments = [flat.values[a : a + n].tolist() for a, n in zip(first, length[short], strict=True)]
        thinking[short] = np.asarray(nonblank_counts(batch, segments)) > 0
    present = batch.output_present
    column = pl.Series("thinking", thinking, dtype=pl.Boolean)
    return column if present.all() else column.set(pl.Series(~present), None)


def nonblank_counts(batch: Batch, segments: Sequence[Sequence[int]]) -> list[int]:
    """Per segment of ids, how many are not whitespace only (one small batched decode of the
    ids not seen before; meant for short segments)."""
    known = batch.tokenizer.known_ids
    # Whether each id's piece is whitespace only, decoded once per tokenizer and kept.
    blank = _BLANK_PIECES.setdefault(batch.tokenizer, {})
    new = sorted({i for segment in segments for i in segment if i in known and i not in blank})
    if new:
        pieces = token_strings(batch.tokenizer, new)
        blank.update((i, not piece.strip()) for i, piece in zip(new, pieces, strict=True))
    return [sum(1 for i in segment if not blank.get(i, False)) for segment in segments]


# Per tokenizer: id -> is its piece whitespace only (at most one entry per id of its vocabulary).
_BLANK_PIECES: weakref.WeakKeyDictionary[Tokenizer, dict[int, bool]] = weakref.WeakKeyDictionary()


def _reasoning_spans(batch: Batch) -> pl.DataFrame:
    bounds = response_bounds(batch).with_row_index("row")
    # `<think>` written by the model belongs to its reasoning; so does the closing `</think>`.
    # The reasoning starts after the model's own `<think>` (the id before it), else at 0.
    length = batch.records["output_ids"].list.len().cast(pl.Int64).alias("length")
    profile = batch.profile
    opener = profile.width(profile.think_start) if profile.think_start is not None else 1
    closer = profile.width(profile.think_end) if profile.think_end is not None else 1
    start = (pl.col("reasoning_start") - opener).clip(lower_bound=0)
    end = (
        pl.when(pl.col("response_at").is_not_null())
        .then(pl.col("response_at") + closer)
        .when(pl.col("answer_start").is_not_null())
        .then(pl.col("answer_start"))
        .otherwise(pl.col("length"))
    )
    return (
        bounds.with_columns(length)
        .filter(pl.col("reasoning_start").is_not_null())
        .select("row", pl.lit(SEGMENT_REASONING).alias("segment"), start.alias("start"), end.alias("end"))
        .cast(pl.Schema(SPANS_SCHEMA))
    )


def _tool_spans(batch: Batch) -> pl.DataFrame:
    """From each opening marker to its closing one, counted in the answer (balanced or not)."""
    markers = batch.profile.tool_markers
    spec = batch.profile.tool_call_spec
    if spec.format.unit in ("answer", "text"):
        calls = tool_call_view(batch).calls
        return calls.group_by("row", maintain_order=True).agg(
            pl.col("start").min(), pl.col("end").max()
        ).select("row", pl.lit(SEGMENT_TOOL_CALLS).alias("segment"), "start", "end").cast(pl.Schema(SPANS_SCHEMA))
    opening = markers.get("section_begin", markers.get("call_begin"))
    closing = markers.get("section_end", markers.get("call_end"))
    # The marker view: an opening or closing marker written as a sequence is one id there.
    flat = batch.marker_flat
    lengths, offsets, values = flat.lengths, flat.offsets, flat.values
    owner = np.repeat(np.arange(len(lengths)), lengths)
    position = np.arange(len(values), dtype=np.int64) - offsets[owner]
    answer_from = bound_or(batch, "answer_start", lengths)
    in_answer = position >= answer_from[owner]
    opens = ((values == opening) & in_answer).astype(np.int64)
    closes = ((values == closing) & in_answer).astype(np.int64)
    # Depth after each token, restarted per record: inside a call while depth > 0, closer included.
    running = np.concatenate([[0], np.cumsum(opens - closes)])
    depth = running[1:] - running[offsets[owner]]
    inside = (depth > 0) | (closes > 0)
    closed_at = np.flatnonzero(closes)
    for k in range(1, batch.profile.width(closing) if closing is not None else 1):
        inside[closed_at + k] = True  # the rest of a closing sequence
    if not inside.any():
        return pl.DataFrame(schema=SPANS_SCHEMA)
    # Runs of covered positions become spans.
    edges = np.diff(np.concatenate([[0], inside.astype(np.int8), [0]]))
    run_starts, run_ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    rows = owner[run_starts]
    return pl.DataFrame(
        {
            "row": rows.astype(np.uint32),
            "segment": [SEGMENT_TOOL_CALLS] * len(rows),
            "start": run_starts - offsets[rows],
            "end": run_ends - offsets[rows],
        },
        schema=SPANS_SCHEMA,
    )


def _harmony_spans(batch: Batch) -> pl.DataFrame:
    spec = batch.profile.channel_spec
    messages = harmony_messages(batch)
    if messages.is_empty():
        return pl.DataFrame(schema=SPANS_SCHEMA)
    segment = (
        pl.when(pl.col("terminator") == "call")
        .then(pl.lit(SEGMENT_TOOL_CALLS))
        .when(pl.col("channel") == spec.reasoning)
        .then(pl.lit(SEGMENT_REASONING))
        .when(pl.col("channel") == spec.tools)
        .then(pl.lit(SEGMENT_TOOL_CALLS))
        .otherwise(pl.lit(SEGMENT_ANSWER))
    )
    # A message starts after the previous one's end marker (its `<|start|>ROLE` is its own).
    start = (pl.col("end_at").shift(1).over("row") + 1).fill_null(0)
    return messages.select(
        "row", segment.alias("segment"), start.alias("start"), (pl.col("end_at") + 1).alias("end")
    ).cast(pl.Schema(SPANS_SCHEMA))

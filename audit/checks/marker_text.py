"""Tool-call markers as plain text: a marker's string decoded where its id is gone, or a call's
text left without its markers."""

from __future__ import annotations

import os
import re
import weakref
from typing import TYPE_CHECKING

import polars as pl

from audit.checks.base import ToolCallRule
from audit.records.batch import Batch
from audit.records.response import answer_text, bound_or, response_bounds

if TYPE_CHECKING:
    from audit.model.tokens.tokenizer import Tokenizer


class ToolMarkerAsText(ToolCallRule):
    """A tool-call marker present only as plain text: its string decoded, its id gone.

    What it checks:
        The decoded output does not contain a marker's string more often than the output
        contains the marker's id. For formats whose calls hold text of their own
        (Qwen3.5/3.6's `<function=NAME>`, DSML's `invoke name="`), the answer holds that
        text no more often than it has calls: a call's text with its marker ids stripped is
        flagged too. Where the markers themselves are text in the vocabulary (DeepSeek's in
        R1-0528's tokenizer), a call's text with the markers removed (`functionNAME` then a
        fenced JSON block) is flagged.

    Why it matters:
        This is exactly what a pipeline that decodes with `skip_special_tokens` or through
        a tool-call parser, then re-tokenises, leaves behind: `<|tool_call_begin|>` spelled
        with ordinary BPE pieces, or a call's body left without its markers. The model never
        emits that sequence.

    Example:
        output_ids decode to "...<|tool_call_begin|>functions.f:0..." but contain no 163597.

    Fix:
        Generate with `/generate` and save `output_ids`; never re-encode decoded text.
    """

    code = "TCL004"
    name = "tool-marker-as-text"

    def frame(self, batch: Batch) -> pl.DataFrame:
        # How often each marker's id occurs, and the calls begun in the answer: from the batch's
        # marker index, not a scan of every id per marker.
        markers = batch.markers
        bounds = response_bounds(batch)
        answer_from = bound_or(batch, "answer_start", batch.output_flat.lengths)
        counts = [
            pl.Series(f"_ids_{role}", markers.count([token_id]), dtype=pl.Int64)
            for role, token_id in batch.profile.tool_markers.items()
        ]
        spec = batch.profile.tool_calls
        counted = batch.profile.tool_markers.get(spec.format.text_marker_role) if spec is not None else None
        if counted is not None:
            counts.append(pl.Series("_answer_calls", markers.count([counted], since=answer_from), dtype=pl.Int64))
        frame = pl.concat(
            [
                batch.records.with_columns(
                    batch.decoded_output.alias("decoded"),
                    *counts,
                ),
                bounds,
            ],
            how="horizontal",
        )
        # The text the markers' strings are counted in: only where one can be there as text.
        prefix = _screening_prefix(batch)
        if prefix is None:
            return frame.with_columns(pl.col("decoded").alias("_marker_text"))
        ids = pl.sum_horizontal(f"_ids_{role}" for role in batch.profile.tool_markers)
        unexplained = pl.col("decoded").str.count_matches(prefix, literal=True) > ids
        return frame.with_columns(pl.when(unexplained).then(pl.col("decoded")).alias("_marker_text"))

    def _excess(self, batch: Batch) -> list[tuple[str, pl.Expr]]:
        spec = batch.profile.tool_call_spec
        excess = [
            (
                spec.markers[role],
                pl.col("_marker_text").str.count_matches(spec.markers[role], literal=True) > pl.col(f"_ids_{role}"),
            )
            for role in batch.profile.tool_markers
        ]
        role = spec.format.text_marker_role
        counted = batch.profile.tool_markers.get(role)
        if spec.format.text_markers:
            answer = answer_text(batch.profile)
            for text in spec.format.text_markers:
                if counted is not None:
                    calls, marker = pl.col("_answer_calls"), spec.markers[role]
                else:  # calls delimited by text around one tag id (DSML): the tag right before it
                    tag = spec.markers["tag"]
                    calls, marker = answer.str.count_matches(tag + text, literal=True), tag
                excess.append((f"{text} without {marker}", answer.str.count_matches(text, literal=True) > calls))
        if spec.format.stripped_call:
            searched = answer_text(batch.profile)
            if quote := spec.format.string_delimiter:  # the strings' own text left out
                searched = searched.str.replace_all(f"(?s){re.escape(quote)}.*?{re.escape(quote)}", quote + quote)
            stripped = searched.str.contains(spec.format.stripped_call)
            excess.append(("a call's text with its markers removed", stripped.fill_null(False)))
        return excess

    def violation(self, batch: Batch) -> pl.Expr:
        return pl.any_horizontal([pl.lit(False), *[excess for _, excess in self._excess(batch)]])

    def message(self, batch: Batch) -> pl.Expr:
        names = [pl.lit(None, dtype=pl.String)]
        names += [pl.when(excess).then(pl.lit(text)) for text, excess in self._excess(batch)]
        return pl.format(
            "marker as plain text, not its token: {}",
            pl.concat_list(names).list.drop_nulls().list.join(", "),
        )


def _screening_prefix(batch: Batch) -> str | None:
    """A text every marker string starts with, when counting it first can tell the outputs in
    which no marker string is there as text; None when it cannot (then every output is counted).

    Each marker id decodes to its string, which starts with the prefix: an output whose text
    holds the prefix no more often than it holds marker ids has every occurrence of the prefix
    at one of those ids. A marker string found there is that id's own (no marker string starts
    another), so none is there more often than its id. That holds when the prefix cannot
    overlap itself (each occurrence is counted), no marker string is a prefix of another, and
    each id is its string in any output: a byte-level tokenizer's decoding concatenates each
    id's bytes, and the marker ids decode to their strings.
    """
    tokenizer = batch.tokenizer
    if not tokenizer.has_byte_table():  # (a small audit, or not byte-level: everything counted)
        return None
    markers = batch.profile.tool_markers
    strings = [batch.profile.tool_call_spec.markers[role] for role in markers]
    known = _PREFIXES.setdefault(tokenizer, {})
    key = (tuple(markers.items()), tuple(strings))
    if key not in known:
        prefix: str | None = os.path.commonprefix(strings)
        if (
            not prefix
            or len(set(strings)) != len(strings)
            or any(a != b and b.startswith(a) for a in strings for b in strings)
            or any(prefix[-k:] == prefix[:k] for k in range(1, len(prefix)))
            or tokenizer.decode_batch([[token_id] for token_id in markers.values()]) != strings
        ):
            prefix = None
        known[key] = prefix
    return known[key]


# Per tokenizer, the screening prefix of each set of markers: found once.
_PREFIXES: weakref.WeakKeyDictionary[Tokenizer, dict[tuple, str | None]] = weakref.WeakKeyDictionary()


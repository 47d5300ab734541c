"""Termination: a finished turn ends with its end-of-turn token; cut or empty ones are named."""

from __future__ import annotations

import numpy as np
import polars as pl

from audit.checks.base import RecordRule, empty_findings, findings_frame
from audit.model.tokens.flat_ids import ABSENT, absent_as_null
from audit.model.tokens.token_text import tokens_at
from audit.records.batch import Batch
from audit.records.call_view import tool_call_view
from audit.records.expressions import id_set
from audit.records.response import answer_text, response_bounds, stop_run


class Truncated(RecordRule):
    """An output cut at the token limit (`finish_reason.type == "length"`).

    What it checks:
        `meta_info.finish_reason.type` is not `length`.

    Why it matters:
        A truncated answer has no end of turn and often no `</think>`: the drafter learns
        sequences that stop mid-thought and never learns how the model ends a turn. A few
        are tolerable; many mean `max_new_tokens` is too small for a thinking model.

    Example:
        meta_info.finish_reason = {"type": "length", "length": 4096}

    Fix:
        Raise `max_new_tokens` (thinking models need tens of thousands), and gate on the
        rate with this rule's `fail_above`.
    """

    code = "TRM001"
    name = "truncated"

    def violation(self, batch: Batch) -> pl.Expr:
        return pl.col("finish_type") == "length"

    def position(self, batch: Batch) -> pl.Expr:
        return pl.col("output_ids").list.len() - 1

    def message(self, batch: Batch) -> pl.Expr:
        return pl.format(
            "finish_reason is length ({} tokens): the output was cut at the token limit",
            pl.coalesce(pl.col("finish_length"), pl.col("output_ids").list.len()),
        )


class EndOfTurnMissing(RecordRule):
    """A finished output whose last token is not the end of turn (or EOS) its turn ends with.

    What it checks:
        When the output was not cut (`finish_reason` is `stop`, or no finish reason was
        saved), its last id is the profile's end of turn or EOS, or the stop id SGLang
        reports as `matched`. SGLang's `output_ids` include the matched stop token. In
        families whose turn with tool calls ends on its own token (`[tool_calls] end_of_turn`:
        GLM's `<|observation|>`, which opens the tool results' turn), an output whose answer
        holds tool-call markers ends with that token, and an output without them never does.

    Why it matters:
        A drafter must learn where a turn ends. An output without its stop token was trimmed
        by a later step (a text round trip with `no_stop_trim` off), or, with no finish
        reason saved, was silently cut. GLM's templates write `<|observation|>` after every
        turn with tool calls and `<|user|>` after an answer: an answer that hands the turn to
        a tool has lost its call's marker ids (a parser kept only the text), and a call that
        stops on `<|user|>` or `<|endoftext|>` is not how the model ends one.

    Example:
        output_ids = [..., 13, 2034]  finish_reason = {"type": "stop", "matched": 163586}
        GLM: '...</think>get_weathercityParis<|observation|>'   (markers stripped)

    Fix:
        Pass the end-of-turn id in `stop_token_ids` and save `output_ids` untouched; save
        `meta_info` so truncation can be told from trimming.
    """

    code = "TRM002"
    name = "end-of-turn-missing"

    def frame(self, batch: Batch) -> pl.DataFrame:
        if not batch.profile.call_stops:
            return batch.records
        # One turn only: several joined (TRM005's finding) have no single kind to judge.
        body = batch.output_flat.lengths - stop_run(batch)
        stop_at = batch.markers.first(batch.profile.stop_ids)
        one_turn = (stop_at == ABSENT) | (stop_at >= body)
        # Does the answer hold tool-call markers? (markers in the reasoning are text)
        return batch.records.with_columns(
            (tool_call_view(batch).letters != "").alias("_calls"),
            pl.Series("_one_turn", one_turn, dtype=pl.Boolean),
        )

    def violation(self, batch: Batch) -> pl.Expr:
        last = pl.col("output_ids").list.last()
        matched = pl.col("finish_matched_id")
        stop_string = pl.col("finish_matched").is_not_null() & matched.is_null()
        finished = pl.col("finish_type").is_null() | (pl.col("finish_type") == "stop")
        ends_well = last.is_in(id_set(batch.profile.stop_ids)) | (last == matched)
        judged = finished & ~stop_string & (pl.col("output_ids").list.len() > 0)
        if not batch.profile.call_stops:
            return judged & ~ends_well.fill_null(False)
        return judged & (~ends_well.fill_null(False) | self._wrong_kind(batch).fill_null(False))

    def _wrong_kind(self, batch: Batch) -> pl.Expr:
        """A stop of the other kind of turn: a call's with no call, an answer's after a call."""
        last = pl.col("output_ids").list.last()
        call_stop = last.is_in(id_set(batch.profile.call_stops))
        answer_stop = last.is_in(id_set(batch.profile.stop_ids)) & ~call_stop
        return pl.col("_one_turn") & (
            (call_stop & ~pl.col("_calls")) | (answer_stop & pl.col("_calls"))
        )

    def position(self, batch: Batch) -> pl.Expr:
        return pl.col("output_ids").list.len() - 1

    def message(self, batch: Batch) -> pl.Expr:
        profile = batch.profile.profile
        expected = " or ".join(repr(t) for t in profile.end_of_turn + profile.eos)
        missing = (
            pl.when(pl.col("finish_type").is_null())
            .then(
                pl.format(
                    "output ends with id {}, not {}; no finish_reason saved: truncated or trimmed?",
                    pl.col("output_ids").list.last(),
                    pl.lit(expected),
                )
            )
            .otherwise(
                pl.format(
                    "finish_reason is stop but output ends with id {}, not {}",
                    pl.col("output_ids").list.last(),
                    pl.lit(expected),
                )
            )
        )
        if not batch.profile.call_stops:
            return missing
        call_stops = " or ".join(repr(t) for t in batch.profile.tool_call_spec.end_of_turn)
        resolved = batch.profile
        stop_ids = resolved.end_of_turn + resolved.eos
        names = dict(zip(stop_ids, profile.end_of_turn + profile.eos, strict=True))
        last = pl.col("output_ids").list.last()
        last_name = last.replace_strict(
            list(names), [repr(name) for name in names.values()], default=None,
            return_dtype=pl.String,
        )
        return (
            pl.when(last.is_in(id_set(batch.profile.call_stops)) & ~pl.col("_calls"))
            .then(
                pl.lit(
                    f"output ends with {call_stops}, which hands the turn to a tool, but its "
                    "answer holds no tool call: were the call's marker ids stripped?"
                )
            )
            .when(last.is_in(id_set(batch.profile.stop_ids)) & pl.col("_calls"))
            .then(
                pl.format(
                    "output makes a tool call but ends with {}, not {}: the model ends a turn with "
                    "calls by handing it to the tool",
                    last_name,
                    pl.lit(call_stops),
                )
            )
            .otherwise(missing)
        )


class Aborted(RecordRule):
    """A generation the server aborted (`finish_reason.type == "abort"`).

    What it checks:
        `meta_info.finish_reason.type` is not `abort`.

    Why it matters:
        An aborted request (client disconnect, server overload, a request error) stops at an
        arbitrary token; its output is not a turn the model finished.

    Example:
        meta_info.finish_reason = {"type": "abort", "message": "client disconnected"}

    Fix:
        Retry aborted requests; write a record only for a finished generation.
    """

    code = "TRM003"
    name = "aborted"

    def violation(self, batch: Batch) -> pl.Expr:
        return pl.col("finish_type") == "abort"

    def message(self, batch: Batch) -> pl.Expr:
        return pl.format(
            "generation aborted: {}", pl.coalesce(pl.col("finish_message"), pl.lit("no message"))
        )


class EmptyOutput(RecordRule):
    """An output with no tokens at all: nothing to supervise.

    What it checks:
        `output_ids` is not empty.

    Why it matters:
        A record with zero supervised tokens costs a forward pass and teaches nothing; many of
        them mean requests failed and were written anyway.

    Example:
        {"id": "glaive-31", "input_ids": [...], "output_ids": []}

    Fix:
        Write a record only when the server returned a finished generation; retry the rest.
    """

    code = "TRM004"
    name = "empty-output"

    def violation(self, batch: Batch) -> pl.Expr:
        return pl.col("output_ids").list.len() == 0

    def message(self, batch: Batch) -> pl.Expr:
        return pl.lit("output_ids is empty")


class TurnJoined(RecordRule):
    """More than one turn in one output: an end of turn with tokens after it, or a tool result.

    What it checks:
        The profile's end-of-turn and EOS ids appear only at the end of `output_ids` (the
        stop token SGLang includes), never with other tokens after them; and no tool-result
        marker the profile names (`tokens.tool_result`: `<tool_response>`, DeepSeek's
        `<｜tool▁outputs▁begin｜>`, ...) appears in the output at all; markers the vocabulary
        spells as text (DeepSeek-V3.2's `<function_results>`, V4's `<tool_result>`) are
        looked for in the decoded answer (the model may think about them). For every family.

    Why it matters:
        A model's turn ends at its first stop token; a tool result is written by the
        environment into the next prompt, never by the model. An output that goes on after its
        end of turn, or holds a tool result, is several turns of an agentic trajectory joined
        into one record (or a generation run with `ignore_eos`). The drafter would learn to
        predict the environment's text and the next turn's prompt as if the model wrote them.

    Example:
        ...<｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜tool▁outputs▁begin｜>SUNNY...
        (the tool call, its result and the next answer saved as one output)

    Fix:
        Save one record per `/generate` call: the prompt of each turn (history, tool results
        included) in `input_ids`, the model's own tokens up to its stop token in `output_ids`.
    """

    code = "TRM005"
    name = "turn-joined"

    def find(self, batch: Batch) -> pl.DataFrame:
        profile = batch.profile
        markers = batch.markers
        # The output's own trailing stop token(s) end it; any stop id before them does not.
        body = batch.output_flat.lengths - stop_run(batch)
        stop_at = markers.first(profile.stop_ids)
        stop_at = np.where(stop_at < body, stop_at, ABSENT)
        result_at = markers.first(profile.tool_result) if profile.tool_result else np.full_like(stop_at, ABSENT)
        text_results = self._text_results(batch)
        joined = (stop_at != ABSENT) | (result_at != ABSENT)
        joined[list(text_results)] = True
        rows = np.flatnonzero(joined)
        if not len(rows):
            return empty_findings()  # (nearly every block: no frame built)
        flagged = pl.DataFrame(
            [
                pl.Series("row", rows, dtype=pl.UInt32),
                absent_as_null(stop_at[rows], "stop_at"),
                absent_as_null(result_at[rows], "result_at"),
                pl.Series("length", batch.output_flat.lengths[rows], dtype=pl.Int64),
                batch.records["output_ids"].gather(rows),
            ]
        )
        stops = profile.profile.end_of_turn + profile.profile.eos
        names = dict(zip(profile.end_of_turn + profile.eos, stops, strict=True))
        for text in profile.profile.tool_result:
            token = batch.tokenizer.token_id(text)
            if token is not None:
                names[token] = text
        flagged_rows: list[int] = []
        positions: list[int | None] = []
        messages: list[str] = []
        for row, stop, result, length, ids in flagged.iter_rows():
            flagged_rows.append(row)
            marker = None
            if row in text_results and (result is None or text_results[row][1] < result):
                marker, result = text_results[row]
            if stop is not None and (result is None or stop < result):
                positions.append(stop)
                messages.append(
                    f"end of turn {names.get(ids[stop], ids[stop])!r} at output_ids[{stop}] with "
                    f"{length - stop - 1} tokens after it: two turns joined in one output"
                )
            else:
                positions.append(result)
                shown = marker if marker is not None else names.get(ids[result], ids[result])
                messages.append(
                    f"tool-result marker {shown!r} at output_ids[{result}]: "
                    "a tool result belongs to the next prompt, not to the model's output"
                )
        return findings_frame(flagged_rows, positions, messages)

    def _text_results(self, batch: Batch) -> dict[int, tuple[str, int]]:
        """Rows whose decoded answer holds a tool-result marker spelled as text: the first
        marker, and the index of the token where it starts."""
        markers = batch.profile.tool_result_text
        if not markers:
            return {}
        frame = pl.concat(
            [batch.records.select(batch.decoded_output.alias("decoded")), response_bounds(batch)],
            how="horizontal",
        ).with_row_index("row")
        answer = answer_text(batch.profile)
        holds = pl.any_horizontal([answer.str.contains(m, literal=True) for m in markers])
        found = frame.filter(holds.fill_null(False))
        results: dict[int, tuple[str, int]] = {}
        for row, text, answer_from in found.select("row", answer, "answer_start").iter_rows():
            marker = min((m for m in markers if m in text), key=text.index)
            ids = batch.records["output_ids"][row].to_list()
            start = answer_from or 0
            text = batch.tokenizer.decode_batch([ids[start:]])[0]
            [at] = tokens_at(batch.tokenizer, ids[start:], [text.index(marker)])
            results[row] = (marker, start + at)
        return results


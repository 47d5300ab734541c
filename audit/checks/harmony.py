"""Harmony channels (gpt-oss): messages well formed, reasoning before the answer, calls readable.

The message grammar and the messages of an output are read once per batch by `audit.records.channels`
(marker ids as letters against one vectorised regex); these rules judge what it found, and
decode only tool-call bodies, in one batch.
"""

from __future__ import annotations

import re

import orjson
import polars as pl

from audit.checks.base import RecordRule, empty_findings, findings_frame
from audit.records.batch import Batch
from audit.records.channels import (
    LETTERS,
    channel_letters,
    grammar_ok,
    harmony_messages,
    text_outside_messages,
)
from audit.records.expressions import first_index_in


class ChannelRule(RecordRule):
    """A rule over harmony channels: it applies when the profile has a `[channels]` section."""

    def applies(self, batch: Batch) -> bool:
        return bool(batch.profile.channel_markers)


class ChannelGrammar(ChannelRule):
    """Harmony message markers out of order, or an output that does not end its turn.

    What it checks:
        For harmony families (gpt-oss), the output's marker tokens follow the message
        grammar: `<|channel|>NAME [<|constrain|>json] <|message|>CONTENT <|end|>`, each
        further message opened by `<|start|>ROLE`, and the last one ended by `<|return|>`
        (the final answer) or `<|call|>` (a tool call). A cut output (finish `length` or
        `abort`) may stop anywhere, but what it has must be in order.

    Why it matters:
        The channel markers are how gpt-oss separates reasoning from the answer. A dropped
        or moved marker (a harmony parser that split `reasoning_content` off and re-joined
        the text, `skip_special_tokens`) leaves a token stream the model never emits.

    Example:
        <|channel|>analysis<|message|>Let me think.<|channel|>final<|message|>4<|return|>
        (no <|end|><|start|>assistant between the two messages)

    Fix:
        Send the rendered prompt ids to SGLang's `/generate` and save `output_ids` untouched;
        never rebuild the stream from parsed channels.
    """

    code = "CHN001"
    name = "channel-grammar"

    def violation(self, batch: Batch) -> pl.Expr:
        return (pl.col("output_ids").list.len() > 0) & ~pl.lit(grammar_ok(batch))

    def position(self, batch: Batch) -> pl.Expr:
        return first_index_in("output_ids", list(batch.profile.channel_markers.values()))

    def find(self, batch: Batch) -> pl.DataFrame:
        # The message names the markers as they stand: per flagged record, after the expressions.
        flagged = batch.records.with_row_index("row").filter(self.violation(batch).fill_null(False))
        if flagged.is_empty():
            return empty_findings()
        names = {letter: batch.profile.channel_spec.markers[role] for role, letter in LETTERS.items()}
        letters = flagged.select(channel_letters(batch)).to_series()
        messages = [
            "harmony markers out of order: "
            + (" ".join(names[letter] for letter in sequence[1:]) or "none")
            + "; expected <|channel|> [<|constrain|>] <|message|> <|end|> ..., ending <|return|> or <|call|>"
            for sequence in letters.to_list()
        ]
        return findings_frame(flagged["row"].to_list(), flagged.select(self.position(batch)).to_series().to_list(), messages)


class ChannelOrder(ChannelRule):
    """Harmony channels in the wrong roles: no reasoning before the answer, or a wrong ending.

    What it checks:
        Every message's channel is one of the profile's (`analysis`, `commentary`, `final`);
        the answer channel (`final`) comes after at least one reasoning (`analysis`) message,
        is the last message and ends with `<|return|>`; `<|return|>` ends only a `final`
        message; `<|call|>` ends only a message addressed to a tool (`to=...`), and a message
        addressed to a tool ends with `<|call|>`.

    Why it matters:
        gpt-oss always reasons on `analysis` before answering on `final`. An output whose
        analysis is gone, whose answer ends with `<|end|>`, or whose channels were renamed,
        was rewritten after generation (the `reasoning_content` split of a chat-completions
        server, an answer re-rendered as history) and is not what the model emits.

    Example:
        <|channel|>final<|message|>The answer is 4.<|return|>        (no analysis message)

    Fix:
        Save `output_ids` from `/generate`; render history turns only in prompts, never in
        outputs.
    """

    code = "CHN002"
    name = "channel-order"

    def find(self, batch: Batch) -> pl.DataFrame:
        spec = batch.profile.channel_spec
        messages = harmony_messages(batch)
        if messages.is_empty():
            return empty_findings()
        known = [spec.reasoning, spec.answer, spec.tools]
        last = pl.col("index") == pl.col("index").max().over("row")
        seen_reasoning = (
            (pl.col("channel") == spec.reasoning).cast(pl.Int32).cum_sum().over("row") > 0
        )
        to_tool = pl.col("recipient").is_not_null()
        problem = (
            pl.when(~pl.col("channel").is_in(known))
            .then(pl.format("unknown channel '{}'; expected one of " + ", ".join(known), pl.col("channel")))
            .when((pl.col("channel") == spec.answer) & ~seen_reasoning)
            .then(pl.lit(f"{spec.answer} message with no {spec.reasoning} message before it"))
            .when((pl.col("channel") == spec.answer) & ~last)
            .then(pl.lit(f"{spec.answer} message is not the last one"))
            .when((pl.col("channel") == spec.answer) & (pl.col("terminator") != "return"))
            .then(pl.format(f"{spec.answer} message ends with <|{{}}|>, expected <|return|>", pl.col("terminator")))
            .when((pl.col("terminator") == "return") & (pl.col("channel") != spec.answer))
            .then(pl.format("{} ends the {} message; only " + spec.answer + " ends the turn", pl.col("end_token"), pl.col("channel")))
            .when((pl.col("terminator") == "call") & ~to_tool)
            .then(pl.lit("<|call|> ends a message addressed to no tool (no to=...)"))
            .when(to_tool & (pl.col("terminator") != "call"))
            .then(pl.format("message to {} ends with <|{}|>, expected <|call|>", pl.col("recipient"), pl.col("terminator")))
        )
        bad = (
            messages.with_columns(problem.alias("problem"))
            .filter(pl.col("problem").is_not_null())
            .group_by("row", maintain_order=True)
            .first()
        )
        return findings_frame(bad["row"].to_list(), bad["channel_at"].to_list(), bad["problem"].to_list())


class ChannelToolCall(ChannelRule):
    """A harmony tool call to a malformed recipient, or with arguments that are not JSON.

    What it checks:
        Every message ended by `<|call|>` is addressed `to=` a recipient matching the
        profile's `recipient_pattern` (`functions.NAME`, or a built-in tool called on the
        analysis channel: `browser.*`, `python`), written with or without a space before
        `<|constrain|>`, and when it is a function call or its header says `<|constrain|>json`,
        its content parses as JSON (the python tool takes code).

    Why it matters:
        gpt-oss writes `commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`.
        A recipient without its namespace or arguments that do not parse were rewritten by a
        tool-call parser or cut, and teach the drafter calls the model never makes.

    Example:
        <|channel|>commentary to=get_weather <|constrain|>json<|message|>{"city": "Paris"<|call|>

    Fix:
        Save raw `output_ids`; a length stop inside a call is a truncation to drop, not to
        repair.
    """

    code = "CHN003"
    name = "channel-tool-call"

    def find(self, batch: Batch) -> pl.DataFrame:
        spec = batch.profile.channel_spec
        messages = harmony_messages(batch)
        calls = messages.filter(pl.col("terminator") == "call")
        if calls.is_empty():
            return empty_findings()
        pattern = re.compile(spec.recipient_pattern)
        bodies = batch.records.with_row_index("row").join(calls, on="row").select(
            pl.col("output_ids").list.slice(pl.col("message_at") + 1, pl.col("content_tokens"))
        ).to_series()
        texts = batch.tokenizer.decode_batch(bodies.to_list())
        rows: list[int] = []
        positions: list[int | None] = []
        problems: list[str] = []
        for (row, at, body_at, recipient, constrained), text in zip(
            calls.select("row", "channel_at", "message_at", "recipient", "constrained").iter_rows(),
            texts,
            strict=True,
        ):
            if rows and rows[-1] == row:
                continue  # one finding per record
            if recipient is None or not pattern.match(recipient):
                rows.append(row)
                positions.append(at)
                problems.append(f"tool call recipient {recipient!r} does not match {spec.recipient_pattern}")
                continue
            if constrained or recipient.startswith("functions."):
                try:
                    orjson.loads(text.strip())
                except orjson.JSONDecodeError as exc:
                    rows.append(row)
                    positions.append(body_at + 1)
                    problems.append(f"arguments of call {recipient} are not valid JSON ({exc}): {text[:80]!r}")
        return findings_frame(rows, positions, problems)


class ChannelStrayText(ChannelRule):
    """Text outside every harmony message: before the first `<|channel|>`, or between messages.

    What it checks:
        In an output whose harmony markers are in order (CHN001's), every token but
        whitespace belongs to a message: nothing before the first message's `<|channel|>`
        but its recipient (`to=functions.NAME`, which harmony lets the role header carry),
        and nothing between a message's `<|end|>` and the next `<|start|>`.

    Why it matters:
        The harmony format has no place for such text: gpt-oss opens every message with
        `<|channel|>` right after the role, and the prompt already holds
        `<|start|>assistant`. Text there is not in the model's grammar (the openai-harmony
        parser stops on it); it is the trace of a pipeline that joined a decoded
        `content` or a tool parser's normal text back into the stream, and the drafter
        would learn to write outside the messages.

    Example:
        Sure.<|channel|>analysis<|message|>Think.<|end|>
        <|start|>assistant<|channel|>final<|message|>4<|return|>   ("Sure." before any message)

    Fix:
        Save `output_ids` from `/generate` untouched; never splice parsed text back into the
        harmony stream.
    """

    code = "CHN004"
    name = "channel-stray-text"

    def find(self, batch: Batch) -> pl.DataFrame:
        stray = text_outside_messages(batch)
        return findings_frame(
            stray["row"].to_list(),
            stray["position"].to_list(),
            [f"text outside any harmony message: {text.strip()[:40]!r}" for text in stray["text"].to_list()],
        )

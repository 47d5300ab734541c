"""XTML turns (Kimi-K3): the channels of an output in the order the renderer writes them, and
no tag token written as text.

An output is the rest of the assistant message its generation prompt opened: with thinking on,
reasoning then `<|close|>think<|sep|>`, the response channel, the tools channel, then
`<|close|>message<|sep|>` and `<|end_of_msg|>`; the model may enter the tools channel straight
from its reasoning. With thinking off the prompt opened the response channel: the output closes
it. Every marker is a sequence of ids, found once per batch in the batch's marker view
(`audit.model.tokens.flat_ids.marker_view`); each becomes a letter and the letters of an output are
matched against the grammar of its reasoning state, as the tool-call and harmony grammars are.
The calls inside the tools channel are the tool-call rules' (TCL001, `kimi-k3` format).
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from audit.checks.base import RecordRule, Severity, empty_findings, findings_frame
from audit.model.calls.call_formats import prefix_pattern
from audit.records.batch import Batch
from audit.records.response import response_bounds

# The letter of each marker of a turn (the tool calls' own markers are TCL001's).
LETTERS = {
    "think_start": "t",
    "think_end": "T",
    "answer_open": "R",
    "answer_close": "r",
    "section_begin": "S",
    "section_end": "s",
    "message_close": "M",
    "open": "X",  # an <|open|> no marker accounts for: a channel K3 never writes
    "close": "X",
    "end_of_turn": "$",
}
# Per reasoning state: the channels a finished output holds (thinking on: the reasoning may run
# straight into the tools channel; off: the prompt opened the response channel). The renderer
# writes `<|end_of_msg|>` after every `<|close|>message<|sep|>` (encoding_k3.py): a finished
# turn ends with it, whatever stop SGLang reports as matched.
GRAMMARS = {
    "prompt_opens": r"(?:T(?:Rr)?(?:Ss)?|Ss)M\$",
    "closed": r"r(?:Ss)?M\$",
}
_NAMES = {
    "t": "think-open", "T": "think-close", "R": "response-open", "r": "response-close",
    "S": "tools-open", "s": "tools-close", "M": "message-close", "X": "unknown-tag", "$": "end-of-msg",
}
_EXPECTED = {
    "prompt_opens": "think-close [response-open response-close] [tools-open tools-close] message-close end-of-msg "
    "(or the tools channel straight from the reasoning)",
    "closed": "response-close [tools-open tools-close] message-close end-of-msg",
}


def _letter_ids(batch: Batch) -> dict[int, str]:
    profile = batch.profile
    ids: dict[int, str] = {}
    for role, token_id in profile.xtml_markers.items():
        if role in LETTERS:
            ids[token_id] = LETTERS[role]
    for role in ("section_begin", "section_end"):
        if role in profile.tool_markers:
            ids[profile.tool_markers[role]] = LETTERS[role]
    if profile.think_start is not None and profile.think_end is not None:
        ids[profile.think_start], ids[profile.think_end] = "t", "T"
    for token_id in profile.end_of_turn:
        ids[token_id] = "$"
    return ids


def channel_letters(batch: Batch) -> tuple[list[str], list[list[int]]]:
    """Per record: its channel markers as letters, and each letter's index in `output_ids`."""
    letter_of = _letter_ids(batch)
    index = batch.markers
    keep = np.isin(index.id, np.fromiter(letter_of, dtype=np.int64))
    rows, positions, ids = index.row[keep], index.position[keep], index.id[keep]
    letters = [""] * batch.height
    where: list[list[int]] = [[] for _ in range(batch.height)]
    for row, position, token_id in zip(rows.tolist(), positions.tolist(), ids.tolist(), strict=True):
        letters[row] += letter_of[token_id]
        where[row].append(position)
    return letters, where


class XtmlRule(RecordRule):
    """A rule over XTML turns: it applies when the profile has an `[xtml]` table."""

    def applies(self, batch: Batch) -> bool:
        return bool(batch.profile.xtml_markers)


class XtmlChannelOrder(XtmlRule):
    """XTML channels out of order: one reopened, left open, unknown, or the message not closed.

    What it checks:
        For XTML families (Kimi-K3), the output's channel markers (think close, response
        open and close, tools open and close, message close, end of message, and any
        `<|open|>` or `<|close|>` no marker accounts for) follow the turn the renderer
        writes: with thinking on, `<|close|>think<|sep|>`, then the response channel, then
        the tools channel, each at most once (the model may go from its reasoning straight
        into the tools channel), then `<|close|>message<|sep|>` and `<|end_of_msg|>` (a finished
        output ends with it even when SGLang reports another stop as matched: a stop string, an
        id passed in `stop_token_ids`); with thinking off the prompt opened the response
        channel, so the output closes it first.
        A cut output (finish `length` or `abort`) may stop anywhere, but what it has must be
        in order.

    Why it matters:
        SGLang's KimiK3Detector splits reasoning, reply and calls at these markers. A channel
        reopened (two outputs joined), a tools channel never closed, a message never closed,
        or a tag the model never writes (a marker half lost, a history turn rendered into the
        output) is a token stream the model does not emit: a drafter trained on it learns to
        predict it.

    Example:
        ...<|close|>think<|sep|><|open|>response<|sep|>4<|close|>response<|sep|>
        <|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|><|close|>call<|sep|>
        <|close|>message<|sep|><|end_of_msg|>              (the tools channel is never closed)

    Fix:
        Send the rendered prompt ids to SGLang's `/generate` and save `output_ids` untouched;
        save each response as its own record; never rebuild the stream from parsed channels.
    """

    code = "XTM001"
    name = "xtml-channel-order"

    def find(self, batch: Batch) -> pl.DataFrame:
        if batch.height == 0:
            return empty_findings()
        letters, where = channel_letters(batch)
        bounds = response_bounds(batch)
        states = bounds["reasoning"].cast(pl.String).to_list()
        finish = batch.records["finish_type"].to_list()
        lengths = batch.output_flat.lengths
        whole = {state: re.compile(f"(?:{g})") for state, g in GRAMMARS.items()}
        prefix = {state: re.compile(prefix_pattern(g)) for state, g in GRAMMARS.items()}
        rows, positions, messages = [], [], []
        for row, (sequence, state) in enumerate(zip(letters, states, strict=True)):
            if state not in GRAMMARS or lengths[row] == 0:
                continue
            cut = finish[row] in ("length", "abort")
            if (prefix if cut else whole)[state].fullmatch(sequence):
                continue
            # The first letter out of order: the end of the longest prefix the grammar admits.
            good = max((n for n in range(len(sequence) + 1) if prefix[state].fullmatch(sequence[:n])), default=0)
            at = where[row][good] if good < len(sequence) else None
            written = " ".join(_NAMES[letter] for letter in sequence) or "none"
            rows.append(row)
            positions.append(at)
            messages.append(f"XTML channels out of order: {written}; expected {_EXPECTED[state]}")
        return findings_frame(rows, positions, messages) if rows else empty_findings()


class XtmlMarkerAsText(XtmlRule):
    """An XTML tag token written as text in the output.

    What it checks:
        The decoded output holds the strings of the tag tokens (`<|open|>`, `<|close|>`,
        `<|sep|>`) and of the end of turn (`<|end_of_msg|>`) no more often than the output
        holds their ids.

    Why it matters:
        The checkpoint's renderer never yields a special id from text, and the model writes
        its tags as ids. A tag spelled with ordinary BPE pieces is what a pipeline that
        decoded the output and encoded the text again leaves behind. A warning: a reply may
        quote the tags as text (a tool result holding them, for instance).

    Example:
        output_ids decode to "...<|close|>think<|sep|>..." but hold one 163589 fewer.

    Fix:
        Save `output_ids` from `/generate`; never re-encode decoded text.
    """

    code = "XTM002"
    name = "xtml-marker-as-text"
    severity = Severity.WARNING

    def find(self, batch: Batch) -> pl.DataFrame:
        profile = batch.profile
        tags = [profile.profile.xtml.markers[role] for role in ("open", "close", "separator")] if profile.profile.xtml else []
        tags += list(profile.profile.end_of_turn)
        counted = [(text, batch.tokenizer.token_id(text)) for text in tags]
        # Tag ids in the real output ids (a sequence marker's ids are in its pieces, not the view).
        flat = batch.output_flat
        owner = np.repeat(np.arange(batch.height), flat.lengths)
        decoded = batch.decoded_output
        rows, messages = [], []
        excess: dict[int, list[str]] = {}
        for text, token_id in counted:
            if token_id is None:
                continue
            ids = np.bincount(owner[flat.values == token_id], minlength=batch.height)
            texts = decoded.str.count_matches(text, literal=True).fill_null(0).to_numpy()
            for row in np.flatnonzero(texts > ids).tolist():
                excess.setdefault(row, []).append(f"{text!r} {int(texts[row] - ids[row])}x")
        for row in sorted(excess):
            rows.append(row)
            messages.append("XTML tag written as text: " + ", ".join(excess[row]))
        return findings_frame(rows, [None] * len(rows), messages) if rows else empty_findings()

"""The tool calls of each output, read from its answer segment only, once per batch.

Tool-call markers the model writes inside its reasoning are text it thinks with, not calls
(SGLang's reasoning parsers split at `</think>` first), so the grammar is matched in the answer
(`audit.records.response`): from the response token, or from the tool call that ended the reasoning in
families whose profile allows it.

Two levels, as the family's format (`audit.model.calls.call_formats`) says:

1. **Ids.** The single-id markers of every answer become role letters matched against the
   format's grammar: one vectorised regex over the batch, no decoding.
2. **Text.** For answers whose markers are in order, only the calls' text is decoded (one
   batched decode of flat slices), and the format reads each call once: name, call id,
   arguments, and whether the text follows the format's own grammar (Qwen3.5/3.6's
   `<function=...>`, DSML's tags). Arguments written as JSON must parse; parameters written as
   text are judged by the types the record's `tools` declare (read only for records with
   calls: from the line, or `--prompts`; else, where the profile says how its template writes
   them, from the tool schemas in the record's prompt).

The tool-call rules, the record statistics, `audit inspect` and the HTML samples read
`tool_call_view(batch)`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import cache

import numpy as np
import polars as pl

from audit.model.calls.call_formats import ROLE_LETTERS
from audit.model.calls.call_readers import ToolCall
from audit.model.tokens.flat_ids import ABSENT, FlatIds, absent_as_null, is_in_few
from audit.model.tokens.token_text import tokens_at
from audit.records.batch import Batch
from audit.records.call_arguments import CALLS_SCHEMA, ReadCall, judge_calls
from audit.records.response import answer_text, bound_or, response_bounds

# Text found between two markers of a call block where the family's template writes nothing but
# whitespace (between calls, after a section begin, before a section end).
STRAY_SCHEMA: dict[str, pl.DataType] = {"row": pl.UInt32(), "position": pl.Int64(), "text": pl.String()}


# Frames are never changed in place: every batch without calls, or without stray text, shares these.
_NO_CALLS = pl.DataFrame(schema=CALLS_SCHEMA)
_NO_STRAY = pl.DataFrame(schema=STRAY_SCHEMA)


@dataclass(frozen=True)
class ToolCallView:
    """The tool calls of a batch: per record the answer's markers, and per call what it says."""

    letters: pl.Series  # per record: the answer's markers as role letters ("" when none)
    grammar_ok: pl.Series  # per record: do those markers follow the format's grammar?
    # per record: are they a prefix of the grammar? (what an output cut by length or abort may hold)
    prefix_ok: pl.Series
    empty_head: pl.Series  # per record: a call begin followed at once by another marker
    first_marker: pl.Series  # per record: index in output_ids of the answer's first marker, or null
    calls: pl.DataFrame  # CALLS_SCHEMA, calls of grammar-valid records only
    # STRAY_SCHEMA: text between two markers where the template writes none (grammar-valid records)
    stray: pl.DataFrame = field(default_factory=lambda: _NO_STRAY)

    @property
    def per_record(self) -> pl.Series:
        """Number of calls read in each record (0 for records with none or out of grammar)."""
        counts = self.calls.group_by("row").len()
        full = np.zeros(len(self.letters), dtype=np.uint32)
        full[counts["row"].to_numpy()] = counts["len"].to_numpy()
        return pl.Series("tool_calls", full, dtype=pl.UInt32)


def tool_call_view(batch: Batch) -> ToolCallView:
    """The batch's tool calls (see the module docs), computed once and shared by every reader."""
    return batch.shared(_view)


@dataclass(frozen=True)
class _AnswerMarkers:
    """The tool markers of every answer, in order: taken from the batch's marker index (one
    look-up over the flat output ids), with no list per record."""

    row: np.ndarray  # the record of each marker
    position: np.ndarray  # its index in the record's output_ids
    id: np.ndarray
    answer_from: np.ndarray  # per record: where its answer starts (its length when it has none)
    answer_length: np.ndarray  # per record: the answer's ids before the trailing stop token(s)

    def of(self, rows: np.ndarray) -> _AnswerMarkers:
        """Only the markers of `rows`."""
        keep = np.isin(self.row, rows)
        return replace(self, row=self.row[keep], position=self.position[keep], id=self.id[keep])

    def group_starts(self) -> np.ndarray:
        """Index of each record's first marker (markers are in record order)."""
        return np.flatnonzero(np.r_[True, self.row[1:] != self.row[:-1]]) if len(self.row) else self.row


def _answer_markers(batch: Batch) -> _AnswerMarkers:
    length = batch.output_flat.lengths
    answer_from = bound_or(batch, "answer_start", length)
    answer_end = bound_or(batch, "answer_end", length)
    index = batch.markers
    keep = is_in_few(index.id, batch.profile.tool_markers.values())
    keep[keep] = index.position[keep] >= answer_from[index.row[keep]]
    return _AnswerMarkers(
        row=index.row[keep],
        position=index.position[keep],
        id=index.id[keep],
        answer_from=answer_from,
        answer_length=np.clip(answer_end - answer_from, 0, None),
    )


def _role_letters(batch: Batch, found: _AnswerMarkers) -> list[str]:
    """The role letter of each marker found (`ROLE_LETTERS`)."""
    letter_of = {token_id: ROLE_LETTERS[role] for role, token_id in batch.profile.tool_markers.items()}
    return [letter_of[token_id] for token_id in found.id.tolist()]


def _view(batch: Batch) -> ToolCallView:
    profile = batch.profile
    fmt = profile.tool_call_spec.format
    if fmt.unit == "text":
        return _text_view(batch)
    markers = profile.tool_markers
    found = _answer_markers(batch)
    height = batch.height
    # Each answer's markers as role letters, one string per record ("" when none).
    spelled = "".join(_role_letters(batch, found))
    starts = found.group_starts()
    ends = np.append(starts[1:], len(found.row)) if len(starts) else starts
    letters = [""] * height
    for row, start, end in zip(found.row[starts].tolist(), starts.tolist(), ends.tolist(), strict=True):
        letters[row] = spelled[start:end]
    # A call begin followed at once by another marker: a call with no name (in formats that
    # write the name there).
    empty_head = np.zeros(height, dtype=bool)
    if fmt.name_after_begin and "call_begin" in markers and len(found.row) > 1:
        next_marker = (found.row[1:] == found.row[:-1]) & (
            found.position[1:] == found.position[:-1] + profile.widths(found.id[:-1])
        )
        empty_head[found.row[:-1][next_marker & (found.id[:-1] == markers["call_begin"])]] = True
    first_marker = np.full(height, ABSENT, dtype=np.int64)
    first_marker[found.row[starts]] = found.position[starts]
    letter_series = pl.Series("letters", letters, dtype=pl.String)
    # Each distinct string of letters matched once (most answers hold none: ""), by the
    # grammar compiled once a process.
    grammar_ok = _matching(letters, fmt.grammar) & ~empty_head
    prefix_ok = _matching(letters, fmt.cut_grammar) & ~empty_head
    view = ToolCallView(
        letters=letter_series,
        grammar_ok=pl.Series("grammar_ok", grammar_ok, dtype=pl.Boolean),
        prefix_ok=pl.Series("prefix_ok", prefix_ok, dtype=pl.Boolean),
        empty_head=pl.Series("empty_head", empty_head, dtype=pl.Boolean),
        first_marker=absent_as_null(first_marker, "first_marker"),
        calls=_NO_CALLS,
    )
    # A record holding an id the tokenizer lacks has no text to read (INT003 names the id); its
    # markers' order is judged above all the same.
    has_letters = np.fromiter(map(bool, letters), dtype=bool, count=height)
    with_calls = np.flatnonzero(grammar_ok & has_letters & batch.decodable.to_numpy())
    if not len(with_calls):
        return view
    read = _read_calls if fmt.unit == "call" else _read_answers
    called = found.of(with_calls)
    return replace(view, calls=judge_calls(batch, read(batch, called)), stray=_stray_text(batch, called))


@cache
def _grammar(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _matching(letters: list[str], pattern: str) -> np.ndarray:
    """Per record: do its role letters match `pattern` whole? (The grammars hold letters,
    groups, repeats and `|` only: Python's regex and polars' read them alike.)"""
    compiled = _grammar(pattern)
    matched = {text: compiled.fullmatch(text) is not None for text in set(letters)}
    return np.fromiter((matched[text] for text in letters), dtype=bool, count=len(letters))


def _stray_text(batch: Batch, found: _AnswerMarkers) -> pl.DataFrame:
    """Text between consecutive markers whose roles the format keeps apart by whitespace only
    (`ToolCallFormat.blank_between`): decoded in one batch, the gaps that hold more."""
    fmt = batch.profile.tool_call_spec.format
    if not fmt.blank_between or len(found.row) < 2:
        return _NO_STRAY
    roles = _role_letters(batch, found)
    pairs = np.array([a + b for a, b in zip(roles[:-1], roles[1:], strict=True)])
    gap = (
        (found.row[1:] == found.row[:-1])
        & (found.position[1:] - found.position[:-1] > 1)
        & np.isin(pairs, list(fmt.blank_between))
    )
    if not gap.any():
        return _NO_STRAY
    ends = found.position[:-1] + batch.profile.widths(found.id[:-1])  # after each marker, sequences whole
    gap &= found.position[1:] > ends
    rows, after, before = found.row[:-1][gap], ends[gap], found.position[1:][gap]
    base = batch.output_flat.offsets[rows]
    texts = batch.tokenizer.decode_flat(FlatIds.slices(batch.output_flat.values, base + after, base + before))
    gaps = pl.DataFrame(
        {"row": rows, "position": after, "text": texts},
        schema=STRAY_SCHEMA,
    )
    return gaps.filter(pl.col("text").str.strip_chars() != "").group_by("row", maintain_order=True).first()


def _problem_token(batch: Batch, call: ToolCall, pieces: list[tuple[str, np.ndarray, int]]) -> int | None:
    """The token index of `call.problem_at`, a character offset into the reader's text, which
    `pieces` make up in order: each piece's text, its ids, and the token index they start at."""
    if call.problem_at is None:
        return None
    char = call.problem_at
    for index, (text, ids, first) in enumerate(pieces):
        if char < len(text) or index == len(pieces) - 1:
            # Past the end of the text: the token after it (the marker that closes the piece).
            return first + tokens_at(batch.tokenizer, ids.tolist(), [min(char, len(text))])[0]
        char -= len(text)
    return None


def _read_calls(batch: Batch, found: _AnswerMarkers) -> list[ReadCall]:
    """Formats whose calls sit between call begin and call end ids: slice, decode, read."""
    markers = batch.profile.tool_markers
    fmt = batch.profile.tool_call_spec.format
    has_arguments = "argument_begin" in markers

    def at(role: str) -> tuple[np.ndarray, np.ndarray]:
        chosen = found.id == markers[role]
        return found.row[chosen], found.position[chosen]

    rows, call_begin = at("call_begin")
    end_rows, call_end = at("call_end")
    # The name ends at the argument begin, or at the call end in formats without one.
    head_rows, head_end = at("argument_begin") if has_arguments else (rows, call_end)
    # The grammar holds one of each per call: the k-th of each role in a record is one call's.
    if not (np.array_equal(rows, end_rows) and np.array_equal(rows, head_rows)):
        raise ValueError("a grammar-valid answer with unequal numbers of call begin, argument and call end markers")
    values = batch.output_flat.values
    base = batch.output_flat.offsets[rows]
    # How many ids each marker takes (more than one where the profile writes it as a sequence).
    width = batch.profile.width
    begin_width = width(markers["call_begin"])
    head_width = width(markers["argument_begin"]) if has_arguments else 1
    end_width = width(markers["call_end"])
    # Heads and bodies are slices of the flat output ids: nothing copied per record.
    heads = batch.tokenizer.decode_flat(FlatIds.slices(values, base + call_begin + begin_width, base + head_end))
    bodies = (
        batch.tokenizer.decode_flat(FlatIds.slices(values, base + head_end + head_width, base + call_end))
        if has_arguments
        else [""] * len(rows)
    )
    read: list[ReadCall] = []
    numbers: dict[int, int] = {}  # per record, the calls read so far (formats that number them)
    for i, (head, body) in enumerate(zip(heads, bodies, strict=True)):
        start = int(call_begin[i])
        spans = (int(rows[i]), start, int(call_end[i]) + end_width, start + begin_width, int(head_end[i]) + head_width)
        for call in fmt.read(head, body):
            if fmt.numbered_calls:
                numbers[spans[0]] = number = numbers.get(spans[0], 0) + 1
                if call.malformed is None and call.index is not None and call.index != str(number):
                    why = f"call index {call.index} where {number} belongs: the template numbers calls from 1 in order"
                    call = replace(call, malformed=why, problem_at=0)
            problem_token = None
            if call.problem_at is not None:
                pieces = [(head, values[base[i] + start + begin_width : base[i] + head_end[i]], spans[3])]
                if has_arguments:
                    pieces.append((body, values[base[i] + head_end[i] + head_width : base[i] + call_end[i]], spans[4]))
                problem_token = _problem_token(batch, call, pieces)
            read.append(ReadCall(*spans, call, problem_token))
    return read


def _read_answers(batch: Batch, found: _AnswerMarkers) -> list[ReadCall]:
    """Formats whose calls are delimited by text (DSML): decode each answer with markers, read it."""
    fmt = batch.profile.tool_call_spec.format
    starts = found.group_starts()
    rows = found.row[starts]
    first = found.position[starts]
    answer_from, lengths = found.answer_from[rows], found.answer_length[rows]
    # The answer without its trailing stop token(s): the end of turn is not the calls' text.
    base = batch.output_flat.offsets[rows] + answer_from
    flat = FlatIds.slices(batch.output_flat.values, base, base + lengths)
    texts = batch.tokenizer.decode_flat(flat)
    read: list[ReadCall] = []
    for i, (row, begin, start, length, text) in enumerate(zip(
        rows.tolist(), answer_from.tolist(), first.tolist(), lengths.tolist(), texts, strict=True
    )):
        ids = flat.values[flat.offsets[i] : flat.offsets[i + 1]]
        for call in fmt.read(text, ""):
            problem = _problem_token(batch, call, [(text, ids, begin)])
            read.append(ReadCall(row, start, begin + length, start, start, call, problem))
    return read


def _text_view(batch: Batch) -> ToolCallView:
    """Formats whose markers are all text in the vocabulary (DeepSeek's markers in R1-0528's
    Qwen3 tokenizer): the answers that hold a marker's text are decoded, their markers found in
    the text and matched against the same grammar, and the calls between them read."""
    profile = batch.profile
    fmt = profile.tool_call_spec.format
    markers = profile.tool_text_markers
    frame = pl.concat(
        [batch.records.select(batch.decoded_output.alias("decoded")), response_bounds(batch)],
        how="horizontal",
    ).with_row_index("row")
    answer = answer_text(profile)
    holds = pl.any_horizontal([answer.str.contains(t, literal=True) for t in markers.values()])
    found = frame.filter(holds.fill_null(False)).select(
        "row", answer.alias("answer"), "answer_start"
    )
    letters = [""] * batch.height
    first_marker: list[int | None] = [None] * batch.height
    longest_first = sorted(markers.values(), key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(text) for text in longest_first))
    role_of = {text: role for role, text in markers.items()}
    grammar = re.compile(f"^(?:{fmt.grammar})$")
    read: list[ReadCall] = []
    for row, text, answer_from in found.iter_rows():
        matches = list(pattern.finditer(text))
        letters[row] = "".join(ROLE_LETTERS[role_of[m.group()]] for m in matches)
        ids = batch.records["output_ids"][row].to_list()
        start = answer_from or 0
        # The decoded answer is the text of ids[start:]: each marker's characters are tokens there.
        offset = len(text) - len(batch.tokenizer.decode_batch([ids[start:]])[0])
        edges = sorted({edge for m in matches for edge in (m.start(), m.end(), m.end() - 1)})
        at = tokens_at(batch.tokenizer, ids[start:], [max(edge - offset, 0) for edge in edges])
        token_of = {edge: start + index for edge, index in zip(edges, at, strict=True)}

        def token(char: int, token_of: dict[int, int] = token_of) -> int:
            return token_of[char]

        first_marker[row] = token(matches[0].start())
        if not grammar.match(letters[row]):
            continue
        head_at = body_at = None
        for match in matches:
            role = role_of[match.group()]
            if role == "call_begin":
                head_at, body_at = match.end(), None
            elif role == "argument_begin" and head_at is not None:
                body_at = match.end()
            elif role == "call_end" and head_at is not None:
                head_end = match.start()
                if body_at is not None:
                    head_end = body_at - len(markers["argument_begin"])
                head = text[head_at:head_end]
                body = text[body_at : match.start()] if body_at is not None else ""
                begin = head_at - len(markers["call_begin"])
                spans = (
                    row,
                    token(begin),
                    token(match.end() - 1) + 1,
                    token(head_at),
                    token(body_at or head_at),
                )
                read.extend(ReadCall(*spans, call) for call in fmt.read(head, body))
                head_at = body_at = None
    return ToolCallView(
        letters=pl.Series("letters", letters, dtype=pl.String),
        grammar_ok=pl.Series("grammar_ok", _matching(letters, fmt.grammar), dtype=pl.Boolean),
        prefix_ok=pl.Series("prefix_ok", _matching(letters, fmt.cut_grammar), dtype=pl.Boolean),
        empty_head=pl.Series("empty_head", [False] * batch.height, dtype=pl.Boolean),
        first_marker=pl.Series("first_marker", first_marker, dtype=pl.Int64),
        calls=judge_calls(batch, read) if read else _NO_CALLS,
    )

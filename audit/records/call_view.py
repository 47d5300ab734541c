"""The tool calls of each output, read from its answer segment only, once per batch.

Tool-call markers the model writes inside its reasoning are text it thinks with, not calls
(SGLang's reasoning parsers split at `</think>` first), so the grammar is matched in the answer
(`audit.records.response`): from the response token, or from the tool call that ended the reasoning in
families whose profile allows it.

Two levels, as the family's format (`audit.model.call_formats`) says:

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

import numpy as np
import polars as pl

from audit.model.call_formats import ROLE_LETTERS
from audit.model.call_readers import ToolCall
from audit.model.flat_ids import FlatIds
from audit.model.token_text import tokens_at
from audit.records.batch import Batch
from audit.records.call_arguments import CALLS_SCHEMA, ReadCall, judge_calls
from audit.records.response import answer_text, response_bounds

# Text found between two markers of a call block where the family's template writes nothing but
# whitespace (between calls, after a section begin, before a section end).
STRAY_SCHEMA: dict[str, pl.DataType] = {"row": pl.UInt32(), "position": pl.Int64(), "text": pl.String()}


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
    stray: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=STRAY_SCHEMA))

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


def _answer_frame(batch: Batch) -> pl.DataFrame:
    """Per record: the answer's ids (empty when there is none) and where the answer starts."""
    bounds = response_bounds(batch)
    length = pl.col("output_ids").list.len().cast(pl.Int64)
    start = pl.col("answer_start").fill_null(length)
    return pl.concat(
        [batch.records.select("output_ids"), bounds.select("answer_start", "answer_end")], how="horizontal"
    ).select(
        start.alias("answer_from"),
        (pl.col("answer_end").fill_null(length) - start).clip(lower_bound=0).alias("answer_length"),
        pl.col("output_ids").list.slice(start, length - start).alias("answer"),
    )


def _view(batch: Batch) -> ToolCallView:
    profile = batch.profile
    fmt = profile.tool_call_spec.format
    if fmt.unit == "text":
        return _text_view(batch)
    markers = profile.tool_markers
    answers = _answer_frame(batch)
    element = pl.element()
    letters = (
        pl.col("answer")
        .list.eval(
            element.replace_strict(
                list(markers.values()), [ROLE_LETTERS[r] for r in markers], default=None, return_dtype=pl.String
            )
        )
        .list.drop_nulls()
        .list.join("")
        .fill_null("")
    )
    if "call_begin" in markers:
        others = pl.lit(pl.Series(list(markers.values()), dtype=pl.Int64)).implode()
        empty_head = (
            pl.col("answer")
            .list.eval(((element == markers["call_begin"]) & element.shift(-1).is_in(others)).any())
            .list.first()
            .fill_null(False)
        )
    else:
        empty_head = pl.lit(False)
    wanted = pl.lit(pl.Series(list(markers.values()), dtype=pl.Int64)).implode()
    first_marker = pl.col("answer_from") + pl.col("answer").list.eval(
        pl.arg_where(element.is_in(wanted)).first()
    ).list.first().cast(pl.Int64)
    judged = answers.select(
        letters.alias("letters"), empty_head.alias("empty_head"), first_marker.alias("first_marker")
    )
    grammar_ok = judged["letters"].str.contains(f"^(?:{fmt.grammar})$") & ~judged["empty_head"]
    prefix_ok = judged["letters"].str.contains(f"^(?:{fmt.cut_grammar})$") & ~judged["empty_head"]
    view = ToolCallView(
        letters=judged["letters"],
        grammar_ok=grammar_ok.alias("grammar_ok"),
        prefix_ok=prefix_ok.alias("prefix_ok"),
        empty_head=judged["empty_head"],
        first_marker=judged["first_marker"],
        calls=pl.DataFrame(schema=CALLS_SCHEMA),
    )
    # A record holding an id the tokenizer lacks has no text to read (INT003 names the id); its
    # markers' order is judged above all the same.
    with_calls = answers.with_row_index("row").filter(grammar_ok & (judged["letters"] != "") & batch.decodable)
    if with_calls.is_empty():
        return view
    read = _read_calls if fmt.unit == "call" else _read_answers
    calls = read(batch, with_calls)
    return replace(view, calls=judge_calls(batch, calls), stray=_stray_text(batch, with_calls))


def _stray_text(batch: Batch, frame: pl.DataFrame) -> pl.DataFrame:
    """Text between consecutive markers whose roles the format keeps apart by whitespace only
    (`ToolCallFormat.blank_between`): decoded in one batch, the gaps that hold more."""
    fmt = batch.profile.tool_call_spec.format
    if not fmt.blank_between:
        return pl.DataFrame(schema=STRAY_SCHEMA)
    markers = batch.profile.tool_markers
    wanted = pl.lit(pl.Series(list(markers.values()), dtype=pl.Int64)).implode()
    letter = pl.col("at_id").replace_strict(
        list(markers.values()), [ROLE_LETTERS[r] for r in markers], return_dtype=pl.String
    )
    positions = (
        frame.with_columns(
            pl.col("answer").list.eval(pl.arg_where(pl.element().is_in(wanted))).alias("at"),
            pl.int_range(pl.len(), dtype=pl.Int64).alias("sequence"),
        )
        .with_columns(pl.col("answer").list.gather(pl.col("at")).alias("at_id"))
        .select("row", "sequence", "answer_from", "at", "at_id")
        .explode("at", "at_id")
        .with_columns(letter.alias("role"))
    )
    gaps = positions.with_columns(
        pl.col("at").shift(-1).over("sequence").alias("next"),
        (pl.col("role") + pl.col("role").shift(-1).over("sequence")).alias("pair"),
    ).filter(pl.col("pair").is_in(list(fmt.blank_between)) & (pl.col("next") - pl.col("at") > 1))
    if gaps.is_empty():
        return pl.DataFrame(schema=STRAY_SCHEMA)
    flat = FlatIds.from_series(frame["answer"])
    base = flat.offsets[gaps["sequence"].to_numpy()]
    texts = batch.tokenizer.decode_flat(
        FlatIds.slices(flat.values, base + gaps["at"].to_numpy() + 1, base + gaps["next"].to_numpy())
    )
    found = gaps.select(
        pl.col("row").cast(pl.UInt32),
        (pl.col("answer_from") + pl.col("at") + 1).cast(pl.Int64).alias("position"),
    ).with_columns(pl.Series("text", texts, dtype=pl.String))
    return found.filter(pl.col("text").str.strip_chars() != "").group_by("row", maintain_order=True).first()


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


def _read_calls(batch: Batch, frame: pl.DataFrame) -> list[ReadCall]:
    """Formats whose calls sit between call begin and call end ids: slice, decode, read."""
    markers = batch.profile.tool_markers
    fmt = batch.profile.tool_call_spec.format
    has_arguments = "argument_begin" in markers

    def at(role: str) -> pl.Expr:
        return pl.col("answer").list.eval(pl.arg_where(pl.element() == markers[role]))

    positions = {"c": at("call_begin"), "e": at("call_end")}
    if has_arguments:
        positions["a"] = at("argument_begin")
    frame = frame.filter(pl.col("answer").list.count_matches(markers["call_begin"]) > 0)
    # One flat copy of these answers; heads and bodies are slices of it, so memory follows the
    # answers' length, not the outputs' (reasoning is never copied).
    flat = FlatIds.from_series(frame["answer"])
    calls = frame.select(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("sequence"), "row", "answer_from", **positions
    ).explode(list(positions))
    base = flat.offsets[calls["sequence"].to_numpy()]
    call_begin = calls["c"].to_numpy().astype(np.int64)
    call_end = calls["e"].to_numpy().astype(np.int64)
    head_end = calls["a"].to_numpy().astype(np.int64) if has_arguments else call_end
    heads = batch.tokenizer.decode_flat(FlatIds.slices(flat.values, base + call_begin + 1, base + head_end))
    bodies = (
        batch.tokenizer.decode_flat(FlatIds.slices(flat.values, base + head_end + 1, base + call_end))
        if has_arguments
        else [""] * calls.height
    )
    offset = calls["answer_from"].to_numpy().astype(np.int64)
    read: list[ReadCall] = []
    rows = calls["row"].to_list()
    for i, (head, body) in enumerate(zip(heads, bodies, strict=True)):
        start = int(offset[i] + call_begin[i])
        spans = (rows[i], start, int(offset[i] + call_end[i] + 1), start + 1, int(offset[i] + head_end[i] + 1))
        for call in fmt.read(head, body):
            problem_token = None
            if call.problem_at is not None:
                first = base[i] + call_begin[i] + 1
                pieces = [(head, flat.values[first : base[i] + head_end[i]], start + 1)]
                if has_arguments:
                    pieces.append((body, flat.values[base[i] + head_end[i] + 1 : base[i] + call_end[i]], spans[4]))
                problem_token = _problem_token(batch, call, pieces)
            read.append(ReadCall(*spans, call, problem_token))
    return read


def _read_answers(batch: Batch, frame: pl.DataFrame) -> list[ReadCall]:
    """Formats whose calls are delimited by text (DSML): decode each answer with markers, read it."""
    fmt = batch.profile.tool_call_spec.format
    wanted = pl.lit(pl.Series(list(batch.profile.tool_markers.values()), dtype=pl.Int64)).implode()
    first = frame.select(
        pl.col("answer").list.eval(pl.arg_where(pl.element().is_in(wanted)).first()).list.first()
    ).to_series()
    # The answer without its trailing stop token(s): the end of turn is not the calls' text.
    answers = frame.select(pl.col("answer").list.head(pl.col("answer_length"))).to_series()
    flat = FlatIds.from_series(answers)
    texts = batch.tokenizer.decode_flat(flat)
    read: list[ReadCall] = []
    lengths = frame["answer_length"].to_list()
    for i, (row, answer_from, at, length, text) in enumerate(zip(
        frame["row"].to_list(), frame["answer_from"].to_list(), first.to_list(), lengths, texts, strict=True
    )):
        start = answer_from + at
        ids = flat.values[flat.offsets[i] : flat.offsets[i + 1]]
        for call in fmt.read(text, ""):
            problem = _problem_token(batch, call, [(text, ids, answer_from)])
            read.append(ReadCall(row, start, answer_from + length, start, start, call, problem))
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
    letter_series = pl.Series("letters", letters, dtype=pl.String)
    return ToolCallView(
        letters=letter_series,
        grammar_ok=letter_series.str.contains(f"^(?:{fmt.grammar})$").alias("grammar_ok"),
        prefix_ok=letter_series.str.contains(f"^(?:{fmt.cut_grammar})$").alias("prefix_ok"),
        empty_head=pl.Series("empty_head", [False] * batch.height, dtype=pl.Boolean),
        first_marker=pl.Series("first_marker", first_marker, dtype=pl.Int64),
        calls=judge_calls(batch, read) if read else pl.DataFrame(schema=CALLS_SCHEMA),
    )

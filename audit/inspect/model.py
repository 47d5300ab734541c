"""The token-by-token view of a record with findings: what `audit inspect` shows, as data.

`Inspector` takes the findings of an audit run and, on demand, re-reads single records from the
data file by line number (byte offsets of every line are found once, with numpy, without
holding the file), then builds a `RecordView`: the tail of the prompt and the whole output as
a polars frame of tokens (index, id, decoded piece, special-token role, segment, the findings
pointing at it), plus side-by-side comparisons for the rules where a person needs them
(PRM001 expected vs actual generation suffix, RTR001/RTR002 decoded text beside the ids).

No terminal code here: rendering is in `audit.inspect.render` (rich) and `audit.inspect.app`
(textual).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl

from audit import inert
from audit.profiles import ResolvedProfile
from audit.tokenizer import Tokenizer

# How many prompt tokens to show before the output: the generation suffix and a little context.
DEFAULT_PROMPT_TAIL = 16
# Records whose views are kept built, so n/p back and forth costs nothing.
_CACHED_VIEWS = 16

SEVERITY_ORDER = {"error": 0, "warning": 1}

# Roles of the profile's special tokens, in the order the legend lists them.
ROLE_THINK = "think"
ROLE_RESPONSE = "response"
ROLE_END_OF_TURN = "end_of_turn"
ROLE_EOS = "eos"
ROLE_TOOL = "tool"  # prefixed: tool:section_begin, tool:call_begin, ...
ROLE_SPECIAL = "special"  # a special token of the tokenizer the profile gives no role
ROLE_UNKNOWN = "out_of_vocabulary"

SEGMENT_PROMPT = "prompt"
SEGMENT_REASONING = "reasoning"
SEGMENT_ANSWER = "answer"
SEGMENT_TOOL_CALLS = "tool_calls"

TOKEN_SCHEMA: dict[str, pl.DataType] = {
    "index": pl.Int64(),
    "id": pl.Int64(),
    "piece": pl.String(),
    "role": pl.String(),
    "segment": pl.String(),
    "rules": pl.String(),  # codes of the findings pointing at this token, comma-separated
}


@dataclass(frozen=True)
class RecordEntry:
    """One record with findings, as the list shows it."""

    line: int
    id: str | None
    rules: tuple[str, ...]
    severity: str  # the worst: error before warning

    def matches(self, query: str) -> bool:
        """Does a free-text filter (id, line or rule code, case-insensitive) pick this record?"""
        needle = query.strip().lower()
        if not needle:
            return True
        haystack = [str(self.line), (self.id or "").lower(), *(r.lower() for r in self.rules)]
        return any(needle in item for item in haystack)


@dataclass(frozen=True)
class FindingMark:
    """A finding of one record: the rule, where it points, and what it says."""

    rule: str
    severity: str
    field: str | None
    position: int | None
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "field": self.field,
            "position": self.position,
            "message": self.message,
        }


@dataclass(frozen=True)
class TokenRun:
    """Consecutive tokens of one id list: `tokens` rows are `field[start:start + height]`."""

    field: str  # input_ids | output_ids
    start: int
    total: int  # length of the whole list
    tokens: pl.DataFrame  # TOKEN_SCHEMA

    @property
    def height(self) -> int:
        return self.tokens.height

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "start": self.start, "total": self.total, "tokens": self.tokens.to_dicts()}


@dataclass(frozen=True)
class Comparison:
    """What a rule expected beside what the record holds, for a person to compare."""

    rule: str
    title: str
    rows: tuple[tuple[str, str], ...]  # (label, value), expected first

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "title": self.title, "rows": [{"label": k, "value": v} for k, v in self.rows]}


@dataclass
class RecordView:
    """Everything `audit inspect` shows about one record."""

    line: int
    id: str | None
    findings: list[FindingMark]
    prompt: TokenRun
    output: TokenRun
    comparisons: list[Comparison] = field(default_factory=list)
    finish_reason: str | None = None
    problem: str | None = None  # why the line could not be read as a record, if it could not
    raw_excerpt: str | None = None

    @property
    def special_tokens(self) -> pl.DataFrame:
        """The output's tokens that have a role (index, id, piece, role), in order."""
        return self.output.tokens.filter(pl.col("role").is_not_null()).select("index", "id", "piece", "role")

    def to_json(self) -> dict[str, Any]:
        return {
            "line": self.line,
            "id": self.id,
            "finish_reason": self.finish_reason,
            "problem": self.problem,
            "raw_excerpt": self.raw_excerpt,
            "findings": [f.to_json() for f in self.findings],
            "comparisons": [c.to_json() for c in self.comparisons],
            "prompt": self.prompt.to_json(),
            "output": self.output.to_json(),
        }


def record_entries(findings: pl.DataFrame) -> list[RecordEntry]:
    """One entry per line with findings, in line order, with its rules and worst severity."""
    if findings.is_empty():
        return []
    grouped = (
        findings.group_by("line", maintain_order=True)
        .agg(
            pl.col("id").drop_nulls().first(),
            pl.col("rule").unique(maintain_order=True),
            pl.col("severity").replace_strict(SEVERITY_ORDER, default=2).min().alias("worst"),
        )
        .sort("line")
    )
    names = {v: k for k, v in SEVERITY_ORDER.items()}
    return [
        RecordEntry(line=line, id=record_id, rules=tuple(rules), severity=names.get(worst, "warning"))
        for line, record_id, rules, worst in grouped.iter_rows()
    ]


class LineIndex:
    """Byte offsets of every line of a file, found in one streamed pass, to re-read any line."""

    def __init__(self, path: Path, chunk_bytes: int = 16 << 20):
        self.path = path
        starts = [np.zeros(1, dtype=np.int64)]
        offset = 0
        with path.open("rb") as handle:
            while chunk := handle.read(chunk_bytes):
                newlines = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 0x0A)
                starts.append(newlines.astype(np.int64) + offset + 1)
                offset += len(chunk)
        self.size = offset
        self._starts = np.concatenate(starts)
        # A trailing newline starts no line.
        if len(self._starts) > 1 and self._starts[-1] == self.size:
            self._starts = self._starts[:-1]

    @property
    def lines(self) -> int:
        return len(self._starts)

    def read(self, line: int) -> bytes:
        """The bytes of physical line `line` (1-based), without its newline."""
        if not 1 <= line <= self.lines:
            raise IndexError(line)
        start = int(self._starts[line - 1])
        end = int(self._starts[line]) - 1 if line < self.lines else self.size
        with self.path.open("rb") as handle:
            handle.seek(start)
            return handle.read(end - start)


class Inspector:
    """Records with findings, and the token-by-token view of any line of the data file."""

    def __init__(
        self,
        data_file: Path,
        findings: pl.DataFrame,
        profile: ResolvedProfile,
        tokenizer: Tokenizer,
        *,
        prompt_tail: int = DEFAULT_PROMPT_TAIL,
    ):
        self.data_file = data_file
        self.findings = findings
        self.profile = profile
        self.tokenizer = tokenizer
        self.prompt_tail = prompt_tail
        self.entries = record_entries(findings)
        self._index: LineIndex | None = None
        self._views: OrderedDict[int, RecordView] = OrderedDict()
        self._roles = _role_frame(profile, tokenizer)
        self._known_ids: pl.Series | None = None

    # -- the list -------------------------------------------------------------------------
    @property
    def rules(self) -> list[str]:
        """The codes with findings, sorted: what the rule filter cycles through."""
        return sorted({rule for entry in self.entries for rule in entry.rules})

    def select(self, rule: str | None = None, query: str = "") -> list[RecordEntry]:
        """Entries broken by `rule` (any rule when None) and matched by the free-text `query`."""
        return [e for e in self.entries if (rule is None or rule in e.rules) and e.matches(query)]

    def line_of_id(self, record_id: str) -> int | None:
        """The first line with findings whose record has this id."""
        return next((e.line for e in self.entries if e.id == record_id), None)

    @property
    def lines(self) -> int:
        return self.index.lines

    @property
    def index(self) -> LineIndex:
        if self._index is None:
            self._index = LineIndex(self.data_file)
        return self._index

    # -- one record -----------------------------------------------------------------------
    def view(self, line: int) -> RecordView:
        """The view of physical line `line` (1-based); IndexError when the file has no such line."""
        if line in self._views:
            self._views.move_to_end(line)
            return self._views[line]
        built = self._build(line, self.index.read(line))
        self._views[line] = built
        while len(self._views) > _CACHED_VIEWS:
            self._views.popitem(last=False)
        return built

    def _build(self, line: int, raw: bytes) -> RecordView:
        mine = self.findings.filter(pl.col("line") == line)
        marks = [
            FindingMark(r["rule"], r["severity"], r["field"], r["position"], r["message"])
            for r in mine.iter_rows(named=True)
        ]
        record_id = next((m for m in mine["id"].to_list() if m is not None), None)
        problem = None
        value: dict[str, Any] = {}
        if not raw.strip():
            problem = "a blank line: no record here"
        else:
            try:
                parsed = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                problem = f"not a JSON record: {exc}"
            else:
                if isinstance(parsed, dict):
                    value = parsed
                else:
                    problem = f"a JSON {type(parsed).__name__}, not an object"
        if record_id is None and value.get("id") is not None:
            record_id = str(value["id"])
        prompt_ids, prompt_note = _ids(value, "input_ids", "prompt_ids")
        output_ids, output_note = _ids(value, "output_ids")
        notes = [n for n in (prompt_note, output_note) if n]
        if value and notes:
            problem = "; ".join(notes)

        prompt_start = max(0, len(prompt_ids) - self.prompt_tail)
        prompt_positions = [m.position for m in marks if m.field == "input_ids" and m.position is not None]
        if prompt_positions:
            prompt_start = max(0, min(prompt_start, min(prompt_positions) - 4))
        shown_prompt = prompt_ids.slice(prompt_start)
        pieces = self._pieces(pl.concat([shown_prompt, output_ids]))

        prompt = self._run("input_ids", shown_prompt, prompt_start, len(prompt_ids), pieces.head(len(shown_prompt)), marks)
        output = self._run("output_ids", output_ids, 0, len(output_ids), pieces.slice(len(shown_prompt)), marks)
        meta = value.get("meta_info") if isinstance(value.get("meta_info"), dict) else {}
        finish = meta.get("finish_reason") if isinstance(meta, dict) else None
        view = RecordView(
            line=line,
            id=record_id,
            findings=marks,
            prompt=prompt,
            output=output,
            finish_reason=_finish_text(finish),
            problem=problem,
            raw_excerpt=_excerpt(raw) if problem else None,
        )
        view.comparisons = self._comparisons(
            view, value, prompt_ids.to_list(), output_ids.to_list(), bool(self._known(output_ids).all())
        )
        return view

    def _known(self, ids: pl.Series | list[int]) -> pl.Series:
        """Per id: can the tokenizer decode it?"""
        series = ids if isinstance(ids, pl.Series) else pl.Series("id", ids, dtype=pl.Int64)
        ok = (series >= 0) & (series < self.tokenizer.vocab_size)
        if not self.tokenizer.contiguous:
            if self._known_ids is None:
                self._known_ids = pl.Series(sorted(self.tokenizer.known_ids), dtype=pl.Int64)
            ok = ok & series.is_in(self._known_ids.implode())
        return ok

    def _pieces(self, ids: pl.Series) -> pl.Series:
        """The decoded piece of every id in one batched call; "" for ids the tokenizer lacks."""
        known = self._known(ids)
        pieces = pl.Series("piece", [""], dtype=pl.String).extend_constant("", len(ids) - 1) if len(ids) else pl.Series("piece", [], dtype=pl.String)
        where = known.arg_true()
        if len(where):
            decoded = self.tokenizer.token_strings(ids.filter(known).to_list())
            pieces = pieces.scatter(where, pl.Series(decoded, dtype=pl.String))
        return pieces

    def _run(
        self, field: str, shown: pl.Series, start: int, total: int, pieces: pl.Series, marks: list[FindingMark]
    ) -> TokenRun:
        frame = pl.DataFrame(
            {
                "index": pl.int_range(start, start + len(shown), eager=True, dtype=pl.Int64),
                "id": shown,
                "piece": pieces,
                "known": self._known(shown),
            },
            schema={"index": pl.Int64, "id": pl.Int64, "piece": pl.String, "known": pl.Boolean},
        ).join(self._roles, on="id", how="left", maintain_order="left")
        frame = frame.with_columns(
            pl.when(~pl.col("known")).then(pl.lit(ROLE_UNKNOWN)).otherwise(pl.col("role")).alias("role")
        )
        segment = pl.lit(SEGMENT_PROMPT) if field == "input_ids" else self._segments(shown)
        pointed = [(m.position, m.rule) for m in marks if m.field == field and m.position is not None]
        rules = (
            pl.DataFrame(pointed, schema={"index": pl.Int64, "rule": pl.String}, orient="row")
            .group_by("index", maintain_order=True)
            .agg(pl.col("rule").unique(maintain_order=True).str.join(",").alias("rules"))
        )
        frame = frame.with_columns(segment.alias("segment")).join(rules, on="index", how="left", maintain_order="left")
        return TokenRun(field=field, start=start, total=total, tokens=frame.select(list(TOKEN_SCHEMA)).cast(TOKEN_SCHEMA))

    def _segments(self, ids: pl.Series) -> pl.Expr:
        """Reasoning, answer or tool calls for each output token, as an expression over the run."""
        profile = self.profile
        index = pl.int_range(0, pl.len(), dtype=pl.Int64)
        n = len(ids)
        think_end_at = _first(ids, profile.think_end)
        if profile.reasoning == "prompt_opens":
            opens: int | None = 0
        elif profile.reasoning == "model_opens":
            opens = _first(ids, profile.think_start)
        else:
            opens = None
        closes = think_end_at if think_end_at is not None else n  # inclusive: </think> closes reasoning
        markers = profile.tool_markers
        begin = markers.get("section_begin", markers.get("call_begin"))
        end = markers.get("section_end", markers.get("call_end"))
        segment = pl.lit(SEGMENT_ANSWER)
        if opens is not None:
            segment = pl.when((index >= opens) & (index <= closes)).then(pl.lit(SEGMENT_REASONING)).otherwise(segment)
        if begin is not None and end is not None:
            column = pl.lit(ids)
            depth = (column == begin).cast(pl.Int64).cum_sum() - (column == end).cast(pl.Int64).cum_sum().shift(1, fill_value=0)
            segment = pl.when(depth > 0).then(pl.lit(SEGMENT_TOOL_CALLS)).otherwise(segment)
        return segment

    # -- what a rule expected, beside what the record holds -----------------------------------
    def _comparisons(
        self, view: RecordView, value: dict[str, Any], prompt_ids: list[int], output_ids: list[int], decodable: bool
    ) -> list[Comparison]:
        rules = {m.rule for m in view.findings}
        out: list[Comparison] = []
        tokenizer = self.tokenizer
        if "PRM001" in rules and prompt_ids:
            rows: list[tuple[str, str]] = []
            for text, ids in zip(self.profile.prompt_suffix_texts, self.profile.prompt_suffixes, strict=True):
                rows.append(("expected", f"{text!r}  {list(ids)}"))
            width = max(len(s) for s in self.profile.prompt_suffixes) + 2
            actual = prompt_ids[-width:]
            text = tokenizer.decode_batch([actual])[0] if self._known(actual).all() else "(ids outside the vocabulary)"
            rows.append(("actual", f"{text!r}  {actual}"))
            mode = "thinking" if self.profile.thinking else "no_thinking"
            out.append(Comparison("PRM001", f"generation suffix ({self.profile.name}, {mode})", tuple(rows)))
        if "RTR001" in rules and output_ids and decodable:
            decoded = tokenizer.decode_batch([output_ids])[0]
            again = tokenizer.encode_text(decoded)
            at = next(
                (m.position for m in view.findings if m.rule == "RTR001" and m.position is not None),
                _first_difference(output_ids, again),
            )
            window = slice(max(0, at - 4), at + 8)
            saved, fresh = output_ids[window], again[window]
            rows = (
                ("decoded", repr(tokenizer.decode_batch([output_ids[window]])[0])),
                ("saved ids", _ids_with_pieces(saved, self._pieces(pl.Series(saved, dtype=pl.Int64)))),
                ("re-encoded", _ids_with_pieces(fresh, self._pieces(pl.Series(fresh, dtype=pl.Int64)))),
            )
            out.append(Comparison("RTR001", f"decode then encode, output_ids[{window.start}:{window.stop}]", rows))
        if "RTR002" in rules and decodable and isinstance(value.get("text"), str):
            text = value["text"]
            decoded = tokenizer.decode_batch([output_ids])[0]
            at = _first_difference(text, decoded)
            start = max(0, at - 30)
            rows = (
                ("text field", repr(text[start : at + 50])),
                ("decoded ids", repr(decoded[start : at + 50])),
            )
            out.append(Comparison("RTR002", f"text vs decode(output_ids), from character {start}", rows))
        return out


def _role_frame(profile: ResolvedProfile, tokenizer: Tokenizer) -> pl.DataFrame:
    """id -> role for every token the profile names, and the tokenizer's other special tokens."""
    roles: dict[int, str] = {}
    for token_id in _special_ids(tokenizer):
        roles[token_id] = ROLE_SPECIAL
    for token_id in profile.eos:
        roles[token_id] = ROLE_EOS
    for token_id in profile.end_of_turn:
        roles[token_id] = ROLE_END_OF_TURN
    for role, token_id in profile.tool_markers.items():
        roles[token_id] = f"{ROLE_TOOL}:{role}"
    if profile.think_start is not None:
        roles[profile.think_start] = ROLE_THINK
    if profile.think_end is not None:
        roles[profile.think_end] = ROLE_RESPONSE
    return pl.DataFrame(
        {"id": list(roles), "role": list(roles.values())}, schema={"id": pl.Int64, "role": pl.String}
    )


def _special_ids(tokenizer: Tokenizer) -> list[int]:
    """Ids of the tokenizer's added special tokens (chat markers and the like)."""
    decoder = getattr(tokenizer.hf, "added_tokens_decoder", None) or {}
    try:
        ids = [int(i) for i, token in decoder.items() if getattr(token, "special", True)]
    except (TypeError, ValueError):
        ids = []
    ids.extend(int(i) for i in getattr(tokenizer.hf, "all_special_ids", []) or [] if isinstance(i, int))
    # A tiktoken tokenizer behind remote code (Kimi's) keeps its specials in the encoding itself.
    encoding = getattr(tokenizer.hf, "model", None)
    for text in getattr(encoding, "special_tokens_set", None) or ():
        token_id = tokenizer.token_id(text)
        if token_id is not None:
            ids.append(token_id)
    return ids


def _first(ids: pl.Series, token_id: int | None) -> int | None:
    if token_id is None or ids.is_empty():
        return None
    hits = (ids == token_id).arg_true()
    return int(hits[0]) if len(hits) else None


def _ids(value: dict[str, Any], *names: str) -> tuple[pl.Series, str | None]:
    """A token-id list field (first of `names` present), or an empty one and why it cannot be shown."""
    empty = pl.Series("id", [], dtype=pl.Int64)
    for name in names:
        ids = value.get(name)
        if ids is None:
            continue
        if not isinstance(ids, list):
            return empty, f"{name} is not a list of token ids"
        try:
            return pl.Series("id", ids, dtype=pl.Int64, strict=True), None
        except (TypeError, OverflowError, pl.exceptions.PolarsError):
            return empty, f"{name} holds values that are not token ids"
    return empty, f"{names[0]} is missing" if value else None


def _finish_text(finish: Any) -> str | None:
    if not isinstance(finish, dict):
        return None
    kind = finish.get("type")
    detail = next((finish[k] for k in ("matched", "length", "message") if finish.get(k) is not None), None)
    return f"{kind} ({detail})" if detail is not None else str(kind)


def _excerpt(raw: bytes, limit: int = 240) -> str:
    # Control characters from the data are shown as \xNN: an ESC in a damaged line must never
    # reach the terminal as an escape sequence.
    text = raw.decode("utf-8", errors="replace")
    return inert.terminal(text if len(text) <= limit else text[:limit]) + (
        f"… ({len(raw)} bytes)" if len(text) > limit else ""
    )


def _first_difference(a: Any, b: Any) -> int:
    common = os.path.commonprefix([a, b])
    return len(common)


def _ids_with_pieces(ids: list[int], pieces: pl.Series) -> str:
    return "  ".join(f"{i}:{piece!r}" for i, piece in zip(ids, pieces.to_list(), strict=True))

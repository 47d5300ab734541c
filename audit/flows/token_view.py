"""The token-by-token view of a record with findings: what `audit inspect` shows, as data.

`Inspector` takes the findings of an audit run and, on demand, re-reads single records from the
data file by line number (byte offsets of every line are found once, with numpy, without
holding the file), reads them with the audit's own reader (`audit.records.reader`), then builds a
`RecordView`: the tail of the prompt and the whole output as a polars frame of tokens (index,
id, decoded piece, special-token role, segment, the findings pointing at it), plus what each
flagged rule wants shown beside it (`Rule.explain`: PRM001 expected vs actual generation
suffix, RTR001/RTR002 decoded text beside the ids). Segments and roles come from the record
view (`audit.records.segments`), the same one the engine's statistics and the HTML samples read.

No terminal code here: it is drawn by `audit.tui.detail` (rich text) and `audit.tui.app`
(textual).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import polars as pl

from audit.base import inert
from audit.base.storage import AnyPath
from audit.checks import RULES
from audit.checks.base import Explanation, Rule
from audit.model.profiles import ResolvedProfile
from audit.model.token_text import token_pieces
from audit.model.tokenizer import Tokenizer
from audit.records.batch import AuditContext, Batch
from audit.records.contract import in_vocabulary
from audit.records.record_lines import LineIndex, read_record
from audit.records.segments import SEGMENT_PROMPT, token_roles, token_segments
from audit.records.sources import file_blocks

# How many prompt tokens to show before the output: the generation suffix and a little context.
DEFAULT_PROMPT_TAIL = 16
# Records whose views are kept built, so n/p back and forth costs nothing.
_CACHED_VIEWS = 16

SEVERITY_ORDER = {"error": 0, "warning": 1}

ROLE_UNKNOWN = "out_of_vocabulary"

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


# What a rule wants shown beside a record it flagged (`Rule.explain`).
Comparison = Explanation


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


class Inspector:
    """Records with findings, and the token-by-token view of any line of the data file."""

    def __init__(
        self,
        data_file: AnyPath,
        findings: pl.DataFrame,
        profile: ResolvedProfile,
        tokenizer: Tokenizer,
        *,
        prompt_tail: int = DEFAULT_PROMPT_TAIL,
        rules: dict[str, Rule] | None = None,
    ):
        self.data_file = data_file
        self.findings = findings
        self.profile = profile
        self.tokenizer = tokenizer
        self.prompt_tail = prompt_tail
        self.entries = record_entries(findings)
        # The rules that explain their findings: the run's own when given, else the defaults.
        self.explainers = rules if rules is not None else {code: rule() for code, rule in RULES.items()}
        self._context = AuditContext(profile, tokenizer)
        self._index: LineIndex | None = None
        self._views: OrderedDict[int, RecordView] = OrderedDict()
        roles = token_roles(profile, tokenizer)
        self._roles = pl.DataFrame(
            {"id": list(roles), "role": list(roles.values())}, schema={"id": pl.Int64, "role": pl.String}
        )

    # -- the list -------------------------------------------------------------------------
    @property
    def rules(self) -> list[str]:
        """The codes with findings, sorted: what the rule filter cycles through."""
        return sorted({rule for entry in self.entries for rule in entry.rules})

    def select(self, rule: str | None = None, query: str = "") -> list[RecordEntry]:
        """Entries broken by `rule` (any rule when None) and matched by the free-text `query`."""
        return [e for e in self.entries if (rule is None or rule in e.rules) and e.matches(query)]

    def line_of_id(self, record_id: str) -> int | None:
        """The first line whose record has this id: one with findings, else any, clean ones too
        (`1` and `"1"` are one id, as INT004 reads them)."""
        found = next((e.line for e in self.entries if e.id == record_id), None)
        if found is not None:
            return found
        wanted = record_id.encode("utf-8", "surrogatepass")
        for block in file_blocks(self.data_file):  # a line too long to read is never held
            for number, raw in block.record_lines():
                if wanted not in raw:  # a cheap test first: most lines do not mention it
                    continue
                try:
                    value = orjson.loads(raw).get("id")
                except (orjson.JSONDecodeError, AttributeError):
                    continue
                if value is not None and not isinstance(value, bool) and str(value) == record_id:
                    return number
        return None

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
        built = self._build(line, self.index.read(line), self.index.line_bytes(line))
        self._views[line] = built
        while len(self._views) > _CACHED_VIEWS:
            self._views.popitem(last=False)
        return built

    def _build(self, line: int, raw: bytes, size: int) -> RecordView:
        mine = self.findings.filter(pl.col("line") == line)
        marks = [
            FindingMark(r["rule"], r["severity"], r["field"], r["position"], r["message"])
            for r in mine.iter_rows(named=True)
        ]
        # The audit's own reader: the same normalisation (the `prompt_ids` alias, finish
        # reasons) as the rules saw; a line it refuses shows what can be salvaged, and why.
        records, problem = read_record(raw, line, size=size)  # `raw`: only the head of a line too long to read
        record_id = next((m for m in mine["id"].to_list() if m is not None), None)
        if records.is_empty():
            empty = pl.Series("id", [], dtype=pl.Int64)
            prompt = self._run("input_ids", empty, 0, 0, empty.cast(pl.String), [], None)
            output = self._run("output_ids", empty, 0, 0, empty.cast(pl.String), [], None)
            return RecordView(line, record_id, marks, prompt, output, problem=problem, raw_excerpt=_excerpt(raw, size=size))
        batch = Batch(records, self._context)
        record = records.row(0, named=True)
        record_id = record_id if record_id is not None else record["id"]
        prompt_ids = pl.Series("id", record["input_ids"] or [], dtype=pl.Int64)
        output_ids = pl.Series("id", record["output_ids"] or [], dtype=pl.Int64)

        prompt_start = max(0, len(prompt_ids) - self.prompt_tail)
        prompt_positions = [m.position for m in marks if m.field == "input_ids" and m.position is not None]
        if prompt_positions:
            prompt_start = max(0, min(prompt_start, min(prompt_positions) - 4))
        shown_prompt = prompt_ids.slice(prompt_start)
        pieces = pl.Series("piece", token_pieces(self.tokenizer, pl.concat([shown_prompt, output_ids]).to_list()))
        segments = token_segments(batch)[0] if len(output_ids) else np.array([], dtype=object)
        view = RecordView(
            line=line,
            id=record_id,
            findings=marks,
            prompt=self._run(
                "input_ids", shown_prompt, prompt_start, len(prompt_ids), pieces.head(len(shown_prompt)), marks, None
            ),
            output=self._run(
                "output_ids", output_ids, 0, len(output_ids), pieces.slice(len(shown_prompt)), marks, segments
            ),
            finish_reason=_finish_text(record),
            problem=problem,
            raw_excerpt=_excerpt(raw) if problem else None,
        )
        if problem is None:
            view.comparisons = self._explanations(batch, marks)
        return view

    def _explanations(self, batch: Batch, marks: list[FindingMark]) -> list[Explanation]:
        """What each rule with a finding here wants shown beside the record, in finding order."""
        out: list[Explanation] = []
        for code in dict.fromkeys(m.rule for m in marks):
            rule = self.explainers.get(code)
            if rule is None:
                continue
            position = next((m.position for m in marks if m.rule == code), None)
            explanation = rule.explain(batch, 0, position)
            if explanation is not None:
                out.append(explanation)
        return out

    def _run(
        self,
        field: str,
        shown: pl.Series,
        start: int,
        total: int,
        pieces: pl.Series,
        marks: list[FindingMark],
        segments: np.ndarray | None,
    ) -> TokenRun:
        known = shown.implode().list.eval(in_vocabulary(self.tokenizer)).explode().fill_null(False)
        frame = pl.DataFrame(
            {
                "index": pl.int_range(start, start + len(shown), eager=True, dtype=pl.Int64),
                "id": shown,
                "piece": pieces,
                "known": known,
                "segment": pl.Series(
                    [SEGMENT_PROMPT] * len(shown) if segments is None else segments.tolist(), dtype=pl.String
                ),
            },
            schema={"index": pl.Int64, "id": pl.Int64, "piece": pl.String, "known": pl.Boolean, "segment": pl.String},
        ).join(self._roles, on="id", how="left", maintain_order="left")
        frame = frame.with_columns(
            pl.when(~pl.col("known")).then(pl.lit(ROLE_UNKNOWN)).otherwise(pl.col("role")).alias("role")
        )
        pointed = [(m.position, m.rule) for m in marks if m.field == field and m.position is not None]
        rules = (
            pl.DataFrame(pointed, schema={"index": pl.Int64, "rule": pl.String}, orient="row")
            .group_by("index", maintain_order=True)
            .agg(pl.col("rule").unique(maintain_order=True).str.join(",").alias("rules"))
        )
        frame = frame.join(rules, on="index", how="left", maintain_order="left")
        return TokenRun(field=field, start=start, total=total, tokens=frame.select(list(TOKEN_SCHEMA)).cast(pl.Schema(TOKEN_SCHEMA)))


def _finish_text(record: dict[str, Any]) -> str | None:
    kind = record.get("finish_type")
    if kind is None:
        return None
    detail = next((record[k] for k in ("finish_matched", "finish_length", "finish_message") if record.get(k) is not None), None)
    return f"{kind} ({detail})" if detail is not None else str(kind)


def _excerpt(raw: bytes, limit: int = 240, *, size: int | None = None) -> str:
    # Control characters from the data are shown as \xNN: an ESC in a damaged line must never
    # reach the terminal as an escape sequence. `size`: the whole line's, when `raw` is its head.
    text = raw.decode("utf-8", errors="replace")
    size = len(raw) if size is None else size
    return inert.terminal(text if len(text) <= limit else text[:limit]) + (
        f"… ({size} bytes)" if len(text) > limit or size > len(raw) else ""
    )

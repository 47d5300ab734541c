"""The token-by-token view of a record with findings: what `audit inspect` shows, as data.

`Inspector` takes the findings of an audit run and, on demand, re-reads single records from the
data file by line number (byte offsets of every line are found once, with numpy, without
holding the file), reads them with the audit's own reader (`audit.records.reader`), then builds a
`RecordView`: the tokens shown of the prompt and of the output as polars frames (index, id,
decoded piece, special-token role, segment, the findings pointing at it), plus what each
flagged rule wants shown beside it (`Rule.explain`: PRM001 expected vs actual generation
suffix, RTR001/RTR002 decoded text beside the ids). Segments and roles come from the record
view (`audit.records.segments`), the same one the engine's statistics and the HTML samples read.

Which tokens are shown is `audit.flows.token_window`'s: the whole of a short record, windows
of a long one (every token with `all_tokens`). Only the tokens shown are decoded; the output's
special tokens are found over the whole output, in numpy.

No terminal code here: it is drawn by `audit.tui.detail` (rich text) and `audit.tui.app`
(textual).
"""

from __future__ import annotations

import dataclasses
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
from audit.flows import token_window
from audit.flows.token_window import TokenRun, special_tokens, token_run
from audit.model.families.profiles import ResolvedProfile
from audit.model.tokens.tokenizer import Tokenizer
from audit.records.batch import AuditContext, Batch
from audit.records.images import image_chips, image_source
from audit.records.record_lines import LineIndex, read_record
from audit.records.segments import ROLE_IMAGE, sequence_roles, token_roles, token_segments
from audit.records.sources import file_blocks

# How many prompt tokens to show before the output: the generation suffix and a little context.
DEFAULT_PROMPT_TAIL = 16
# Records whose views are kept built, so n/p back and forth costs nothing.
_CACHED_VIEWS = 16

SEVERITY_ORDER = {"error": 0, "warning": 1}


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
    # The output's tokens that have a role, shown or not (index, id, piece, role); None: the
    # shown ones are all there is.
    output_specials: pl.DataFrame | None = None
    all_tokens: bool = False  # built to show every token, whatever the record's length

    @property
    def special_tokens(self) -> pl.DataFrame:
        """The output's tokens that have a role (index, id, piece, role), in order: over the whole
        output, those left out of the view too."""
        if self.output_specials is not None:
            return self.output_specials
        return self.output.tokens.filter(pl.col("role").is_not_null()).select("index", "id", "piece", "role")

    @property
    def windowed(self) -> bool:
        """Are tokens left out beyond the prompt's head (which the prompt tail always leaves)?"""
        prompt_gaps = self.prompt.left_out
        return self.output.omitted > 0 or len(prompt_gaps) > (1 if self.prompt.start > 0 else 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "line": self.line,
            "id": self.id,
            "finish_reason": self.finish_reason,
            "problem": self.problem,
            "raw_excerpt": self.raw_excerpt,
            "all_tokens": self.all_tokens,
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
        all_tokens: bool = False,
    ):
        """`all_tokens`: every token of each record, not the windows of a long one
        (`audit.flows.token_window`)."""
        self.data_file = data_file
        self.findings = findings
        self.profile = profile
        self.tokenizer = tokenizer
        self.prompt_tail = prompt_tail
        self.all_tokens = all_tokens
        self.entries = record_entries(findings)
        # The rules that explain their findings: the run's own when given, else the defaults.
        self.explainers = rules if rules is not None else {code: rule() for code, rule in RULES.items()}
        self._context = AuditContext(profile, tokenizer)
        self._index: LineIndex | None = None
        self._views: OrderedDict[tuple[int, bool], RecordView] = OrderedDict()
        roles = token_roles(profile, tokenizer)
        self._role_of = roles
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
    def view(self, line: int, *, all_tokens: bool | None = None) -> RecordView:
        """The view of physical line `line` (1-based); IndexError when the file has no such line.

        `all_tokens`: every token (True), the windows of a long record (False), or the
        inspector's own choice (None)."""
        whole = self.all_tokens if all_tokens is None else all_tokens
        key = (line, whole)
        if key in self._views:
            self._views.move_to_end(key)
            return self._views[key]
        built = self._build(line, self.index.read(line), self.index.line_bytes(line), whole)
        self._views[key] = built
        while len(self._views) > _CACHED_VIEWS:
            self._views.popitem(last=False)
        return built

    def _build(self, line: int, raw: bytes, size: int, all_tokens: bool) -> RecordView:
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
            nothing = np.zeros(0, dtype=np.int64)
            prompt = token_run(self.tokenizer, self._roles, "input_ids", nothing, nothing, [], None)
            output = token_run(self.tokenizer, self._roles, "output_ids", nothing, nothing, [], None)
            return RecordView(
                line, record_id, marks, prompt, output, problem=problem, raw_excerpt=_excerpt(raw, size=size),
                all_tokens=all_tokens,
            )
        batch = Batch(records, self._context)
        # The record's fields but its id lists, which stay in polars and numpy (no Python list
        # of a million ints).
        record = records.drop("input_ids", "output_ids", strict=False).row(0, named=True)
        record_id = record_id if record_id is not None else record["id"]
        prompt_ids, output_ids = _ids(records, "input_ids"), _ids(records, "output_ids")

        def pointed(field: str) -> list[tuple[int, str]]:
            return [(m.position, m.rule) for m in marks if m.field == field and m.position is not None]

        if all_tokens:
            prompt_shown = token_window.whole(len(prompt_ids))
            output_shown = token_window.whole(len(output_ids))
        else:
            prompt_shown = token_window.prompt_spans(
                len(prompt_ids), self.prompt_tail, [p for p, _ in pointed("input_ids")]
            )
            output_shown = token_window.output_spans(len(output_ids), [p for p, _ in pointed("output_ids")])
        prompt_at, output_at = token_window.indices(prompt_shown), token_window.indices(output_shown)
        segments = token_segments(batch)[0][output_at] if len(output_ids) else np.array([], dtype=object)
        prompt = token_run(
            self.tokenizer, self._roles, "input_ids", prompt_at, prompt_ids, pointed("input_ids"), None,
            sequence_roles(self.profile, self._role_of, prompt_ids),
        )
        view = RecordView(
            line=line,
            id=record_id,
            findings=marks,
            prompt=self._image_chips(prompt, prompt_ids, record.get("image_data")),
            output=token_run(
                self.tokenizer, self._roles, "output_ids", output_at, output_ids, pointed("output_ids"), segments,
                sequence_roles(self.profile, self._role_of, output_ids),
            ),
            finish_reason=_finish_text(record),
            problem=problem,
            raw_excerpt=_excerpt(raw) if problem else None,
            output_specials=(
                special_tokens(self.tokenizer, self._roles, output_ids) if len(output_at) < len(output_ids) else None
            ),
            all_tokens=all_tokens,
        )
        if problem is None:
            view.comparisons = self._explanations(batch, marks)
        return view

    def _image_chips(self, run: TokenRun, ids: np.ndarray, image_data: list[str] | None) -> TokenRun:
        """The prompt's vision placeholders, each one's pad shown as one chip of the image it
        stands for (its size and N, `audit.records.images.image_chips`), in the image role."""
        vision = self.profile.vision
        if vision is None or not np.isin(run.tokens["id"].to_numpy(), vision.ids).any():
            return run
        chips = image_chips(ids, vision, image_data, image_source(self.data_file))
        chip = pl.col("index").is_in(list(chips))
        tokens = run.tokens.with_columns(
            pl.col("index").replace_strict(chips, default=pl.col("piece"), return_dtype=pl.String).alias("piece"),
            pl.when(chip).then(pl.lit(ROLE_IMAGE)).otherwise(pl.col("role")).alias("role"),
        )
        return dataclasses.replace(run, tokens=tokens)

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

def _ids(records: pl.DataFrame, field: str) -> np.ndarray:
    """The first record's id list `field` as int64 (empty when it is missing)."""
    if field not in records.columns:
        return np.zeros(0, dtype=np.int64)
    ids = records[field][0]
    return np.zeros(0, dtype=np.int64) if ids is None else ids.cast(pl.Int64).to_numpy()


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

"""The rule unit: a stable code, a name, a default severity, docs, and one check.

A rule author writes only the predicate. `RecordRule` subclasses return polars expressions
(which rows break the rule, at which token, with what message), or override `find` when the
last step is per flagged record; `check` alone decides whether a rule applies to a batch. The
engine does all the bookkeeping: line numbers, ids, severities, counts.

Each rule's docstring is its documentation, in four sections, printed by `audit explain`:

    <one-line summary>

    What it checks:
    Why it matters:
    Example:
    Fix:
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

import polars as pl

from audit.base.config import expect
from audit.base.errors import ConfigError
from audit.records.batch import Batch

DOC_SECTIONS = ("What it checks", "Why it matters", "Example", "Fix")

# What every rule's check returns: the rows it flags, where, and why.
FINDING_COLUMNS = {"row": pl.UInt32, "position": pl.Int64, "message": pl.String}


@dataclass(frozen=True)
class Explanation:
    """What a rule expected beside what a flagged record holds, for a person to compare."""

    rule: str
    title: str
    rows: tuple[tuple[str, str], ...]  # (label, value), expected first

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "title": self.title, "rows": [{"label": k, "value": v} for k, v in self.rows]}


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


@dataclass(frozen=True)
class Threshold:
    """A limit on records: a count, or a rate of all records (a rule set's `warn_above` and
    `fail_above`, and the least share of a serving mode in `[mix]`)."""

    count: int | None = None
    rate: float | None = None

    def exceeded(self, failing: int, records: int) -> bool:
        if self.count is not None:
            return failing > self.count
        return records > 0 and failing / records > (self.rate or 0.0)

    def __str__(self) -> str:
        return str(self.count) if self.count is not None else f"{(self.rate or 0) * 100:g}%"

    def to_json(self) -> int | str:
        return self.count if self.count is not None else str(self)

    @classmethod
    def parse(cls, value: Any, where: str) -> Threshold:
        """A count (`0`, `5`) or a rate (`"0.5%"`) from a rule set; ConfigError naming `where`."""
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return cls(count=value)
        if isinstance(value, str) and (match := _RATE.match(value)):
            rate = float(match.group(1)) / 100
            if rate > 1:
                # No rate of records can exceed 100%: the threshold would silently never trip.
                raise ConfigError(f"{where}: a rate is at most 100%, got {value!r}")
            return cls(rate=rate)
        raise ConfigError(f'{where}: expected a count (0, 5) or a rate ("0.5%"), got {value!r}')


# Counts of tokens above this make no sense for any model and overflow the list arithmetic.
MAX_TOKEN_COUNT = 2**31 - 1


@dataclass(frozen=True)
class Parameter:
    """A setting a rule set may override under `[rules.CODE]`: its default, type and valid range."""

    default: int
    minimum: int
    maximum: int
    help: str

    def validate(self, value: Any, where: str) -> int:
        """`value` if it is an integer in range, else a ConfigError naming `where` (file and key)."""
        expect(value, type(self.default), where)
        if not self.minimum <= value <= self.maximum:
            raise ConfigError(f"{where}: must be between {self.minimum} and {self.maximum} ({self.help}), got {value!r}")
        return value

    def describe(self) -> str:
        """`default, range: help` for `audit explain`."""
        return f"{self.default!r}  ({self.minimum}..{self.maximum}) {self.help}"


class Rule:
    """Base of every rule. Subclasses set the class attributes and implement `check`."""

    code: ClassVar[str]
    name: ClassVar[str]
    severity: ClassVar[Severity] = Severity.ERROR
    # Which id list a finding's `position` indexes.
    position_field: ClassVar[str] = "output_ids"
    # True for rules that judge the file as a whole (`check_file`), not one record.
    file_level: ClassVar[bool] = False
    # True for rules that judge the partition's statistics as a whole (`check_partition` of
    # `audit.checks.mix`), after every record: they flag no record.
    partition_level: ClassVar[bool] = False
    # True for rules that read a record's raw line (`source`); the reader keeps it only then.
    reads_source: ClassVar[bool] = False
    # The kind of problem the reader or the record contract finds that this rule reports
    # (`audit.records.reader.UNREADABLE`, `audit.records.contract.PROBLEMS`): the one map from those to codes.
    problem: ClassVar[str | None] = None
    # True for rules that encode text with the tokenizer (a cost that grows with the data: the
    # engine tells the tokenizer how much is coming, see `Tokenizer.expect_encoding`).
    encodes_text: ClassVar[bool] = False
    # Parameters a rule set may override under [rules.CODE]: default, type and valid range each.
    parameters: ClassVar[dict[str, Parameter]] = {}
    # True for the engine's own report (ERR001): in every rule set, never configured.
    always_on: ClassVar[bool] = False
    # A run option the rule needs ("trainer": `--trainer`): without it the rule set leaves the
    # rule out, so a run without the option reports exactly as before.
    requires: ClassVar[str | None] = None

    def __init__(self, **parameters: Any):
        self.options = self.validate_parameters(parameters, f"[rules.{self.code}]")

    @classmethod
    def validate_parameters(cls, given: Mapping[str, Any], where: str) -> dict[str, Any]:
        """Every parameter's value (given, else its default), each checked against its range."""
        for key in given:
            if key not in cls.parameters:
                raise ConfigError(f"{where}: unknown parameter {key!r} (known: {', '.join(cls.parameters) or 'none'})")
        return {
            key: spec.validate(given[key], f"{where}.{key}") if key in given else spec.default
            for key, spec in cls.parameters.items()
        }

    def check(self, batch: Batch) -> pl.DataFrame:
        """Findings for this batch: columns `row`, `position` (token index or null), `message`."""
        raise NotImplementedError

    def explain(self, batch: Batch, row: int, position: int | None) -> Explanation | None:
        """The comparison to show beside a record this rule flagged (`audit inspect`, HTML).

        `row` is the record in `batch`, `position` where the finding points. None (the default)
        when the finding's message says it all.
        """
        return None

    def check_file(self, identities: pl.DataFrame) -> pl.DataFrame:
        """For `file_level` rules: findings over the whole file's `line`, `id` columns
        (columns `line`, `position`, `message`)."""
        raise NotImplementedError

    def check_partition(self, counts: dict[str, int], mix: Any) -> list[str]:
        """For `partition_level` rules: one sentence per way the partition's counts
        (`audit.report.distributions.mode_counts`) fall short of the rule set's `mix`."""
        raise NotImplementedError

    # -- documentation --------------------------------------------------------------------
    @classmethod
    def summary(cls) -> str:
        """The docstring's first paragraph, on one line: what the rule flags, in one sentence."""
        return " ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split())

    @classmethod
    def docs(cls) -> dict[str, str]:
        """The docstring's sections, by heading."""
        text = inspect.getdoc(cls) or ""
        parts = re.split(rf"^({'|'.join(DOC_SECTIONS)}):\s*$", text, flags=re.MULTILINE)
        return {parts[i]: inspect.cleandoc(parts[i + 1]) for i in range(1, len(parts) - 1, 2)}


class RecordRule(Rule):
    """A rule over single records, written as polars expressions on the batch's columns."""

    def applies(self, batch: Batch) -> bool:
        """False when the profile has nothing for this rule to check (e.g. no tool calls)."""
        return True

    def violation(self, batch: Batch) -> pl.Expr:
        """Boolean per record: does it break the rule? Null counts as no."""
        raise NotImplementedError

    def position(self, batch: Batch) -> pl.Expr:
        """Token index the finding points at (into `output_ids` unless the message says)."""
        return pl.lit(None, dtype=pl.Int64)

    def message(self, batch: Batch) -> pl.Expr:
        """One line per flagged record, naming tokens by their strings."""
        raise NotImplementedError

    def frame(self, batch: Batch) -> pl.DataFrame:
        """The columns the expressions read; override to add shared derived columns."""
        return batch.records

    def check(self, batch: Batch) -> pl.DataFrame:
        """Findings for this batch; rules that do not apply, and empty batches, find nothing."""
        if not self.applies(batch) or batch.height == 0:
            return empty_findings()
        return self.find(batch)

    def find(self, batch: Batch) -> pl.DataFrame:
        """The flagged rows of a non-empty batch the rule applies to. By default the expressions
        `violation`, `position` and `message`; override for a last step per flagged record."""
        frame = self.frame(batch)
        # One query when nothing is flagged (nearly always); positions and messages are made
        # only for the flagged rows.
        flags = frame.select(self.violation(batch).fill_null(False)).to_series()
        if not flags.any():
            return empty_findings()
        rows = flags.arg_true()
        return frame[rows].select(
            pl.lit(rows).cast(pl.UInt32).alias("row"),
            self.position(batch).cast(pl.Int64).alias("position"),
            self.message(batch).cast(pl.String).alias("message"),
        )


# Frames are never changed in place: every rule that flags nothing can share one.
_NO_FINDINGS = pl.DataFrame(schema=FINDING_COLUMNS)


def empty_findings() -> pl.DataFrame:
    """A rule's answer when it flags nothing."""
    return _NO_FINDINGS


def findings_frame(
    rows: Sequence[int], positions: Sequence[int | None], messages: Sequence[str]
) -> pl.DataFrame:
    """Findings built from Python lists (for rules whose last step is per flagged record)."""
    if not len(rows):
        return _NO_FINDINGS  # most blocks, for most rules: no frame built
    return pl.DataFrame({"row": rows, "position": positions, "message": messages}, schema=FINDING_COLUMNS)


class ToolCallRule(RecordRule):
    """A rule over tool calls: it applies when the profile names tool-call markers."""

    # Parameters written as text are judged by the types the record's `tools` declare.
    reads_source = True

    def applies(self, batch: Batch) -> bool:
        profile = batch.profile
        markers = profile.tool_markers or profile.tool_text_markers
        return profile.tool_calls is not None and bool(markers)

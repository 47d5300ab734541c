"""Reports over time: read a saved report back, and compare two of them rule by rule.

A rule *regressed* from OLD to NEW when, in NEW, it is at the verdict that fails the gate
(`fail`; or `warn` too under `--fail-on warning`) and it is worse than it was in OLD: its
verdict rose (pass -> fail, warn -> fail, ...), or it failed both times and its failing rate
rose. A rule that only NEW runs counts as `pass` with no failing records in OLD; a rule only
OLD ran is listed as removed and never regresses. `audit diff` exits 1 when any rule
regressed, so a rule that merely moved within its thresholds, or improved, never fails CI.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from audit.base.errors import InputError
from audit.base.storage import ObjectPath
from audit.checks.verdict import VERDICT_RANK, failing_verdicts
from audit.report.report import SCHEMA_VERSION, Report, RuleResult
from audit.report.shape import check_report_shape

# Reports `audit check` names itself in a reports directory: <partition>-<UTC time>.json.
KEEP_REPORTS = 20


def dated_report_path(directory: Path | ObjectPath, partition: str, when: datetime | None = None) -> Path | ObjectPath:
    """Where `audit check` saves a partition's report by default: `<partition>-<UTC time>.json`."""
    stamp = (when or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return directory / f"{partition}-{stamp}.json"


def prune_reports(directory: Path, partition: str, keep: int = KEEP_REPORTS) -> list[Path]:
    """Delete all but the newest `keep` dated reports of `partition` in `directory` (0 keeps
    every one); return what was deleted. Only files named as `dated_report_path` names them
    are touched: a report saved under another name, or another partition's, never is."""
    if keep <= 0 or not directory.is_dir():
        return []
    pattern = re.compile(re.escape(partition) + r"-\d{8}T\d{6}Z\.json")
    dated = sorted(
        (p for p in directory.iterdir() if pattern.fullmatch(p.name) and p.is_file() and not p.is_symlink()),
        key=lambda p: p.name,
    )
    removed = dated[:-keep] if len(dated) > keep else []
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def load_report(path: Path | ObjectPath) -> Report:
    """Read a JSON report written by `audit check`; raise InputError saying why it cannot be."""
    try:
        # orjson, not json: it refuses lone surrogates (text no writer could print) and nests
        # only so deep, where json would take the one and raise RecursionError on the other.
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise InputError(f"{path}: no such report file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, expected a JSON report file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror})") from None
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc}); expected a report from `audit check`") from None
    if not isinstance(data, dict) or "results" not in data:
        raise InputError(f"{path}: not an audit report (no \"results\"); expected a report from `audit check`")
    version = data.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise InputError(
            f"{path}: report schema_version {version!r} is not one this audit reads "
            f"(up to {SCHEMA_VERSION}); upgrade audit"
        )
    check_report_shape(data, path)
    try:
        return Report.from_json(data)
    except (KeyError, TypeError, ValueError, pl.exceptions.PolarsError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise InputError(f"{path}: not a complete audit report ({type(exc).__name__}: {first})") from None


@dataclass(frozen=True)
class RuleMove:
    """One rule's failing rate and verdict in the old and the new report."""

    code: str
    name: str
    old: RuleResult | None
    new: RuleResult | None
    regressed: bool

    @property
    def change(self) -> str:
        """added | removed | worse | better | same: how the verdict, then the rate, moved."""
        if self.old is None:
            return "added"
        if self.new is None:
            return "removed"
        rank = VERDICT_RANK[self.new.verdict] - VERDICT_RANK[self.old.verdict]
        if rank == 0:
            rank = (self.new.rate > self.old.rate) - (self.new.rate < self.old.rate)
        return "worse" if rank > 0 else "better" if rank < 0 else "same"

    def to_json(self) -> dict[str, Any]:
        def side(result: RuleResult | None) -> dict[str, Any] | None:
            if result is None:
                return None
            return {"failing": result.failing, "rate": round(result.rate, 6), "verdict": result.verdict}

        return {
            "code": self.code,
            "name": self.name,
            "old": side(self.old),
            "new": side(self.new),
            "threshold": either.threshold if (either := self.new or self.old) is not None else "",
            "change": self.change,
            "regressed": self.regressed,
        }


@dataclass(frozen=True)
class ReportDiff:
    """Two reports compared rule by rule."""

    old: Report
    new: Report
    moves: list[RuleMove]

    @property
    def regressions(self) -> list[RuleMove]:
        return [m for m in self.moves if m.regressed]

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "old": {"target": self.old.target, "created_at": self.old.created_at,
                    "records": self.old.records, "verdict": self.old.verdict},
            "new": {"target": self.new.target, "created_at": self.new.created_at,
                    "records": self.new.records, "verdict": self.new.verdict},
            "rules": [m.to_json() for m in self.moves],
            "regressions": [m.code for m in self.regressions],
        }


def diff_reports(old: Report, new: Report, *, fail_on_warning: bool = False) -> ReportDiff:
    """Compare `old` and `new` rule by rule (new's rule order, then rules only old ran)."""
    failing = failing_verdicts(fail_on_warning)
    before = {r.code: r for r in old.results}
    after = {r.code: r for r in new.results}
    moves = []
    for code, result in after.items():
        previous = before.get(code)
        moves.append(
            RuleMove(code, result.name, previous, result, regressed=_regressed(previous, result, failing))
        )
    for code, previous in before.items():
        if code not in after:
            moves.append(RuleMove(code, previous.name, previous, None, regressed=False))
    return ReportDiff(old=old, new=new, moves=moves)


def _regressed(old: RuleResult | None, new: RuleResult, failing: frozenset[str]) -> bool:
    if new.verdict not in failing:
        return False
    if old is None:
        return True  # failing now, and did not run (so did not fail) before
    if VERDICT_RANK[new.verdict] != VERDICT_RANK[old.verdict]:
        return VERDICT_RANK[new.verdict] > VERDICT_RANK[old.verdict]
    return new.rate > old.rate

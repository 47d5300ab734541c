"""A live audit of a growing `raw_responses.jsonl`: only new whole lines are read each time.

`LiveAudit.poll()` reads what was appended since the last poll, up to the last newline (a
partial last line is left for the next poll), runs the rule set on those records with the
same rules as `audit check`, and adds to running counts. File-level rules (duplicate ids)
are re-judged over the (line, id) pairs seen so far, which stay small.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from audit.batch import Batch
from audit.check import Session
from audit.generate.manifest import read_manifest
from audit.records import LineBlock, parse_block
from audit.targets import DATA_FILE, Target, resolve_target

# Lines per minute are measured over this recent window, so the rate follows the run.
RATE_WINDOW_SECONDS = 60.0


@dataclass(frozen=True)
class RuleStanding:
    """One rule so far: failing records, pass rate and the verdict its thresholds give."""

    code: str
    name: str
    severity: str
    failing: int
    pass_rate: float
    verdict: str


@dataclass(frozen=True)
class WatchSnapshot:
    """The state of the file after a poll."""

    path: Path
    records: int
    bytes: int
    lines_per_minute: float
    pending_bytes: int  # a partial last line not yet complete
    seconds_since_growth: float
    rules: list[RuleStanding]

    @property
    def verdict(self) -> str:
        verdicts = {r.verdict for r in self.rules}
        return "fail" if "fail" in verdicts else "warn" if "warn" in verdicts else "pass"


def watch_target(spec: str, root: Path) -> Target:
    """Like `resolve_target`, but a file the generator has just created (still empty) is fine."""
    path = Path(spec)
    candidates = [path, path / DATA_FILE, root / spec / DATA_FILE]
    for candidate in candidates:
        if candidate.is_file() and candidate.stat().st_size == 0:
            directory = candidate.parent
            name = directory.name if candidate.name == DATA_FILE else candidate.stem
            return Target(
                partition=name,
                data_file=candidate,
                generation=read_manifest(directory),
                directory=directory,
            )
    return resolve_target(spec, root)


class LiveAudit:
    """Running counts of each rule over a file that grows by whole lines."""

    def __init__(self, session: Session):
        self.session = session
        self.path = session.target.data_file
        self._record_rules = [c for c in session.rule_set.rules if not c.rule.file_level]
        self._file_rules = [c for c in session.rule_set.rules if c.rule.file_level]
        self._keep_source = any(c.rule.reads_source for c in self._record_rules)
        self._reset()

    def _reset(self) -> None:
        session = self.session
        self._failing = {c.code: 0 for c in session.rule_set.rules}
        self._identities: list[pl.DataFrame] = []
        self._offset = 0
        self._lines = 0  # physical lines consumed
        self.records = 0
        self._pending = 0
        self._history: deque[tuple[float, int]] = deque()
        self._last_growth = time.monotonic()
        self._size = 0

    def poll(self) -> WatchSnapshot:
        """Audit the whole lines appended since the last poll and return the counts so far."""
        now = time.monotonic()
        size = self.path.stat().st_size if self.path.exists() else 0
        if size < self._offset:  # the file was replaced or cut below what we read: start over
            self._reset()
        if size != self._size:
            self._last_growth = now
            self._size = size
        if size > self._offset:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read(size - self._offset)
            cut = data.rfind(b"\n")
            if cut != -1:
                self._audit_lines(data[:cut].split(b"\n"))
                self._offset += cut + 1
            self._pending = len(data) - (cut + 1)
        else:
            self._pending = 0
        self._history.append((now, self.records))
        while len(self._history) > 1 and now - self._history[0][0] > RATE_WINDOW_SECONDS:
            self._history.popleft()
        return self.snapshot(now)

    def _audit_lines(self, lines: list[bytes]) -> None:
        parsed = parse_block(LineBlock(self._lines + 1, lines), keep_source=self._keep_source)
        self._lines += len(lines)
        self.records += parsed.records.height + len(parsed.unreadable)
        for item in parsed.unreadable:
            if item.rule in self._failing:
                self._failing[item.rule] += 1
        if parsed.records.height:
            batch = Batch(parsed.records, self.session.context)
            for configured in self._record_rules:
                found = configured.rule.check(batch)
                if found.height:
                    self._failing[configured.code] += found["row"].n_unique()
            self._identities.append(parsed.records.select("line", "id"))
        if self._file_rules and self._identities:
            everyone = pl.concat(self._identities)
            self._identities = [everyone]
            for configured in self._file_rules:
                self._failing[configured.code] = configured.rule.check_file(everyone)[
                    "line"
                ].n_unique()

    def snapshot(self, now: float | None = None) -> WatchSnapshot:
        """The counts as of the last poll."""
        now = time.monotonic() if now is None else now
        rate = 0.0
        if len(self._history) > 1:
            (t0, r0), (t1, r1) = self._history[0], self._history[-1]
            rate = (r1 - r0) / (t1 - t0) * 60.0 if t1 > t0 else 0.0
        rules = [
            RuleStanding(
                code=c.code,
                name=c.rule.name,
                severity=c.severity.value,
                failing=self._failing[c.code],
                pass_rate=1.0 - self._failing[c.code] / self.records if self.records else 1.0,
                verdict=c.verdict(self._failing[c.code], self.records),
            )
            for c in self.session.rule_set.rules
        ]
        return WatchSnapshot(
            path=self.path,
            records=self.records,
            bytes=self._offset,
            lines_per_minute=rate,
            pending_bytes=self._pending,
            seconds_since_growth=now - self._last_growth,
            rules=rules,
        )

"""A live audit of a growing `raw_responses.jsonl`: only new whole lines are read each time.

`LiveAudit.poll()` takes the whole lines appended since the last poll (`audit.records.sources.
GrowingFile`; a partial last line waits for the next poll), runs the engine over them with the
same rules as `audit check`, and adds to running counts. File-level rules (duplicate ids) are
re-judged over the (line, id) pairs seen so far, which stay small.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from audit.base.errors import InputError
from audit.base.storage import ObjectPath
from audit.checks.verdict import Verdict
from audit.engine.isolation import InternalError
from audit.engine.runner import IDENTITY_SCHEMA, audit_blocks, file_level_findings
from audit.flows.session import Session
from audit.flows.targets import DATA_FILE, Target, resolve_target
from audit.generate.manifest import read_manifest
from audit.records.sources import GrowingFile, LineBlock

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
    # Records a rule raised on so far (audit.engine.isolation): each an ERR001; `--once` exits 2.
    internal_errors: tuple[InternalError, ...] = ()

    @property
    def judgement(self) -> Verdict:
        """The verdict so far, with the rules behind it."""
        return Verdict.of(self.rules)

    @property
    def verdict(self) -> str:
        """pass, warn or fail so far."""
        return self.judgement.value


def watch_target(spec: str, root: Path | ObjectPath) -> Target:
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
        path = session.target.data_file
        if not isinstance(path, Path):
            raise InputError(
                f"{path}: audit watch follows a local file as it is written; audit an object in "
                "storage with audit check"
            )
        self.path = path
        self._file_rules = any(c.rule.file_level for c in session.rule_set.rules)
        self._source = GrowingFile(self.path, block_bytes=session.options.block_bytes)
        self._reset()

    def _reset(self) -> None:
        self._failing = {c.code: 0 for c in self.session.rule_set.rules}
        self._identities = pl.DataFrame(schema=IDENTITY_SCHEMA)
        self.records = 0
        self._internal_errors: list[InternalError] = []
        self._history: deque[tuple[float, int]] = deque()
        self._last_growth = time.monotonic()

    def poll(self) -> WatchSnapshot:
        """Audit the whole lines appended since the last poll and return the counts so far."""
        now = time.monotonic()
        size = self._source.size
        blocks = self._source.new_blocks()
        if self._source.restarted:  # the file was replaced or cut below what we read: start over
            self._reset()
        if self._source.size != size:
            self._last_growth = now
        self._audit(blocks)
        self._history.append((now, self.records))
        while len(self._history) > 1 and now - self._history[0][0] > RATE_WINDOW_SECONDS:
            self._history.popleft()
        return self.snapshot(now)

    def _audit(self, blocks: Iterable[LineBlock]) -> None:
        """The engine over the new lines, a block at a time: counts kept, findings dropped."""
        session = self.session
        for block in blocks:
            shard = audit_blocks([block], session.context, session.rule_set)
            self.records += shard.records
            self._internal_errors += shard.internal_errors
            for code, failing in shard.failing_by_rule().items():
                self._failing[code] += failing
            if self._file_rules:
                self._identities = pl.concat([self._identities, shard.identities])
        if self._file_rules:
            found = file_level_findings(self._identities, session.rule_set)
            for configured in session.rule_set.rules:
                if configured.rule.file_level:
                    flagged = found.filter(pl.col("rule") == configured.code)
                    self._failing[configured.code] = flagged["line"].n_unique()

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
            bytes=self._source.offset,
            lines_per_minute=rate,
            pending_bytes=self._source.pending,
            seconds_since_growth=now - self._last_growth,
            rules=rules,
            internal_errors=tuple(self._internal_errors),
        )

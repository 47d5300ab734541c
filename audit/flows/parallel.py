"""The local executor of `--jobs N`: shards of a file audited by this process and N-1 workers.

Each file is cut into byte ranges that start at line boundaries, knowing the physical line
number at each cut (`iter_shards`: each range is handed out as soon as the one read that hashes
the file has passed its end); each range is audited by the engine (`audit_range`) wherever it
runs. The workers are
started once per process (`audit.flows.workers.worker_pool`; the `audit` program starts them before
its own modules load), given the target as early as the command knows it (`start_workers`,
before this process prepares its own session), and kept: each prepares a
session once, loading its tokenizer and building the fast encoder once, and audits any number
of shards of any number of files. They are spawned, not forked: polars and the tokenizers keep
thread pools that a fork would copy in an unknown state.

Shards are small (`SHARD_BYTES`) and taken as the processes come free (`_Handout`): the
workers from the start of the file, each given its next shard only once it has finished the
last, this process from the end, so all finish within a shard of each other. The shards are
joined in file order (`join_shards`), which runs the file-level rules (duplicate ids) over the
whole file: the findings are exactly those of a single process. Another executor (a cluster's tasks) does the same with the same calls.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from pathlib import Path

from audit.base.storage import AnyPath
from audit.engine.findings import FindingsLog
from audit.engine.runner import (
    ENCODED_BYTES_PER_CHARACTER,
    FileAudit,
    ProgressCallback,
    ShardAudit,
    audit_blocks,
    audit_file,
    join_shards,
)
from audit.flows.session import CheckOptions, Session, worker_session
from audit.flows.targets import Target
from audit.flows.workers import ignore_outcome, worker_pool
from audit.records.sources import InputDigest, file_blocks

# Below this many bytes per shard, a shard's own costs (a worker's tokenizer, a block cut short)
# are more than sharing the file saves: such a file is audited in this process.
MIN_SHARD_BYTES = 8 << 20
# The shards a file is cut into: small enough that the processes finish within one shard of
# each other, large enough that each shard's overheads stay small.
SHARD_BYTES = 12 << 20
_READ_BYTES = 16 << 20


@dataclass(frozen=True)
class Shard:
    """Bytes [start, end) of a file, beginning at physical line `first_line`."""

    start: int
    end: int
    first_line: int


def plan_shards(
    path: Path, shards: int, *, min_shard_bytes: int | None = None
) -> tuple[list[Shard], str, int]:
    """Cut `path` into about `shards` ranges at line boundaries, none under `min_shard_bytes`
    (`MIN_SHARD_BYTES` unless given); also its sha256 and size (`iter_shards`, collected)."""
    digest = InputDigest()
    plan = list(iter_shards(path, shards, min_shard_bytes=min_shard_bytes, digest=digest))
    return plan, digest.sha256, digest.bytes


def iter_shards(
    path: AnyPath, shards: int, *, min_shard_bytes: int | None = None, digest: InputDigest
) -> Iterator[Shard]:
    """The ranges of `path` cut at line boundaries, each as soon as the read has passed its end.

    One sequential read: it updates `digest` (the input's sha256) and counts newlines, which
    number each shard's first line. A shard ends just after the first newline at or past its
    share of the file (`size * k // shards`), so an executor can start a shard's audit while the
    read goes on through the rest.
    """
    if min_shard_bytes is None:
        min_shard_bytes = MIN_SHARD_BYTES  # looked up now, not when the module was loaded
    size = path.stat().st_size
    shards = max(1, min(shards, size // max(1, min_shard_bytes)))
    start, first_line, newlines, offset = 0, 1, 0, 0
    k = 1
    with path.open("rb") as handle:
        while chunk := handle.read(_READ_BYTES):
            digest.update(chunk)
            while k < shards:
                at = max(size * k // shards, start)
                found = chunk.find(b"\n", max(0, at - offset)) if at < offset + len(chunk) else -1
                if found == -1:
                    break  # the cut is further on: look for it in the next chunk
                cut = offset + found + 1
                if not start < cut < size:
                    k = shards  # no line starts after this one: the rest is the last shard
                    break
                yield Shard(start, cut, first_line)
                start, first_line = cut, newlines + chunk.count(b"\n", 0, found + 1) + 1
                k += 1
            newlines += chunk.count(b"\n")
            offset += len(chunk)
    yield Shard(start, max(size, start), first_line)


# -- the workers ----------------------------------------------------------------------------------


def start_workers(jobs: int, target: Target | None = None, options: CheckOptions | None = None) -> None:
    """Start the workers `--jobs` will need, before this process prepares its own session.

    Their start-up (imports, and with `target` and `options` the session: the tokenizer, the
    fast encoder built in the background) then runs while this process prepares. A target they
    cannot prepare is left to this process to report; nothing is raised here.
    """
    if jobs < 2:
        return
    pool = worker_pool(jobs - 1)
    if target is None or options is None:
        return
    share = _size(target.data_file) // jobs
    for future in [pool.submit(_warm, target, options, share) for _ in range(jobs - 1)]:
        future.add_done_callback(ignore_outcome)


def _size(path: AnyPath) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _warm(target: Target, options: CheckOptions, expected_bytes: int) -> None:
    session = worker_session(target, options)
    if any(c.rule.encodes_text for c in session.rule_set.rules):
        session.tokenizer.expect_encoding(expected_bytes // ENCODED_BYTES_PER_CHARACTER)


def _audit_shard(target: Target, options: CheckOptions, shard: Shard, spill: Path) -> ShardAudit:
    return audit_range(worker_session(target, options), shard, spill)


def audit_range(
    session: Session, shard: Shard, spill: Path | None = None, progress: ProgressCallback | None = None
) -> ShardAudit:
    """The engine over one shard of the session's file, wherever it runs (this process, a
    `--jobs` worker, a Ray task); `spill`: where its findings' parts go (None: kept in memory)."""
    blocks = file_blocks(
        session.target.data_file,
        start=shard.start,
        end=shard.end,
        first_line=shard.first_line,
        block_bytes=session.options.block_bytes,
    )
    return audit_blocks(
        blocks, session.context, session.rule_set, spill=spill, progress=progress, expected_bytes=shard.end - shard.start
    )


# -- this process ----------------------------------------------------------------------------------


def audit_file_parallel(
    session: Session, jobs: int, progress: ProgressCallback | None = None
) -> FileAudit:
    """`audit_file` over shards in this process and `jobs - 1` workers; the same findings, in
    the same order."""
    started = time.perf_counter()
    path = session.target.data_file
    size = _size(path)
    if jobs < 2 or size < 2 * MIN_SHARD_BYTES:
        return audit_file(
            path, session.context, session.rule_set, block_bytes=session.options.block_bytes, progress=progress
        )
    pool = worker_pool(jobs - 1)
    wanted = max(2 * jobs, -(-size // SHARD_BYTES))
    spill = FindingsLog.spill_directory()  # every process writes its findings' parts here
    digest = InputDigest()
    plan: list[Shard] = []

    def submit(index: int) -> Future:
        return pool.submit(_audit_shard, session.target, session.options, plan[index], spill)

    handout = _Handout(submit, workers=jobs - 1)
    try:
        # Each shard is ready as soon as the read (which hashes the file and numbers the lines)
        # has passed its end: the workers start on the first while this process reads on.
        for shard in iter_shards(path, wanted, digest=digest):
            plan.append(shard)
            handout.add(len(plan) - 1)
        results = _run(session, handout, plan, spill, progress, expected_bytes=digest.bytes // jobs)
    except BaseException:
        handout.close()
        shutil.rmtree(spill, ignore_errors=True)
        raise
    shards = [results[i] for i in range(len(plan))]
    return join_shards(
        shards, session.rule_set, path=path, sha256=digest.sha256, size=digest.bytes, started=started, spill=spill
    )


class _Handout:
    """The shards no process has begun, handed out from both ends: to the workers from the
    start of the file, one each at a time as each comes free, to this process from the end.

    A worker is given its next shard only once it has finished the last (from the pool's
    result thread, `_came_free`): a shard waiting in a worker's queue could not be taken back,
    and at the end of the file this process would idle while the worker audited it (a whole
    shard, ~0.25 s on the benchmark, on one core of two).
    """

    def __init__(self, submit: Callable[[int], Future], *, workers: int):
        self._submit = submit
        self._free = workers  # workers without a shard
        self._waiting: deque[int] = deque()  # shard indexes, in file order
        self._closed = False
        # Re-entrant: a future that is done already runs its callback in the thread adding it.
        self._lock = threading.RLock()
        self._given: dict[Future, int] = {}  # a worker's shard: future -> index

    def add(self, index: int) -> None:
        """A shard is ready (in file order)."""
        with self._lock:
            self._waiting.append(index)
            self._give()

    def take_last(self) -> int | None:
        """The last shard no process has begun, for this process; None when none is left."""
        with self._lock:
            return self._waiting.pop() if self._waiting else None

    def given(self) -> dict[Future, int]:
        """The workers' shards so far (future -> index)."""
        with self._lock:
            return dict(self._given)

    def close(self) -> None:
        """Give the workers nothing more; cancel what they have not begun."""
        with self._lock:
            self._closed = True
            for future in self._given:
                future.cancel()

    def _give(self) -> None:
        while self._free and self._waiting and not self._closed:
            index = self._waiting.popleft()
            try:
                future = self._submit(index)
            except Exception:  # a pool that cannot take work (broken, shut down): this process audits the rest
                self._waiting.appendleft(index)
                self._closed = True
                return
            self._free -= 1
            self._given[future] = index
            future.add_done_callback(self._came_free)

    def _came_free(self, _future: Future) -> None:
        with self._lock:
            self._free += 1
            self._give()


def _run(
    session: Session,
    handout: _Handout,
    plan: list[Shard],
    spill: Path,
    progress: ProgressCallback | None,
    *,
    expected_bytes: int,
) -> dict[int, ShardAudit]:
    """Every shard of `plan`, audited by the workers (from the first, as `handout` gives them)
    and this process (from the last no worker has begun)."""
    # The workers have their first shards: this process now prepares its encoder for its own
    # share (the workers built theirs while it read and hashed the file).
    if any(c.rule.encodes_text for c in session.rule_set.rules):
        session.tokenizer.expect_encoding(expected_bytes // ENCODED_BYTES_PER_CHARACTER)
    results: dict[int, ShardAudit] = {}
    collected: set[Future] = set()
    done = _Done()

    def finished(index: int, shard: ShardAudit) -> None:
        results[index] = shard
        done.add(shard)
        if progress is not None:
            progress(done.records, done.tokens, done.bytes)

    while True:
        given = handout.given()
        for future, index in given.items():
            if future not in collected and future.done():
                collected.add(future)
                finished(index, future.result())
        mine = handout.take_last()
        if mine is not None:

            def shard_progress(records: int, tokens: int, read: int) -> None:
                if progress is not None:
                    progress(done.records + records, done.tokens + tokens, done.bytes + read)

            finished(mine, audit_range(session, plan[mine], spill, shard_progress))
            continue
        # Asked again: a worker that came free since may have been given a shard.
        running = [future for future in handout.given() if future not in collected]
        if not running:
            return results
        wait(running, return_when=FIRST_COMPLETED)


class _Done:
    """What the finished shards add up to, for the progress bar."""

    def __init__(self) -> None:
        self.records = self.tokens = self.bytes = 0

    def add(self, shard: ShardAudit) -> None:
        self.records += shard.records
        self.tokens += shard.output_tokens
        self.bytes += shard.bytes

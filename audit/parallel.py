"""The local executor of `--jobs N`: shards of a file audited in worker processes.

Each file is cut into byte ranges that start at line boundaries, knowing the physical line
number at each cut (`plan_shards`); each worker runs the engine over its range
(`audit_blocks(file_blocks(path, start=, end=, first_line=))`). Every worker prepares the
session itself (spawned, not forked: polars and the tokenizers keep thread pools that a fork
would copy in an unknown state). The parent joins the shards in file order (`join_shards`),
which runs the file-level rules (duplicate ids) over the whole file, so the findings are
exactly those of a single process. Another executor (a cluster's tasks) does the same with
the same three calls.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import shutil
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from audit.engine import (
    FileAudit,
    ProgressCallback,
    ShardAudit,
    audit_blocks,
    audit_file,
    join_shards,
)
from audit.findings import FindingsLog
from audit.session import CheckOptions, Session, prepare
from audit.sources import file_blocks
from audit.targets import Target

# Below this many bytes per shard, a worker's start-up (imports, tokenizer) costs more than it saves.
MIN_SHARD_BYTES = 16 << 20
_READ_BYTES = 16 << 20


@dataclass(frozen=True)
class Shard:
    """Bytes [start, end) of a file, beginning at physical line `first_line`."""

    start: int
    end: int
    first_line: int


def plan_shards(path: Path, shards: int) -> tuple[list[Shard], str, int]:
    """Cut `path` into about `shards` ranges at line boundaries; also its sha256 and size.

    One sequential read: the hash and the newline counts that number each shard's first line.
    """
    size = path.stat().st_size
    shards = max(1, min(shards, size // max(1, MIN_SHARD_BYTES)))
    with path.open("rb") as handle:
        cuts = [0]
        for k in range(1, shards):
            handle.seek(max(size * k // shards, cuts[-1]))
            handle.readline()  # to the start of the next line
            position = handle.tell()
            if cuts[-1] < position < size:
                cuts.append(position)
        cuts.append(size)
        digest = hashlib.sha256()
        lines_before = [1] * (len(cuts) - 1)
        handle.seek(0)
        offset, newlines, next_cut = 0, 0, 1
        while chunk := handle.read(_READ_BYTES):
            digest.update(chunk)
            while next_cut < len(cuts) - 1 and cuts[next_cut] <= offset + len(chunk):
                lines_before[next_cut] = newlines + chunk.count(b"\n", 0, cuts[next_cut] - offset) + 1
                next_cut += 1
            newlines += chunk.count(b"\n")
            offset += len(chunk)
    plan = [Shard(cuts[i], cuts[i + 1], lines_before[i]) for i in range(len(cuts) - 1)]
    return plan, digest.hexdigest(), size


# -- the worker side ----------------------------------------------------------------------------

_WORKER_SESSION: Session | None = None


def _start_worker(target: Target, options: CheckOptions) -> None:
    global _WORKER_SESSION
    _WORKER_SESSION = prepare(target, options)


def _audit_shard(shard: Shard, spill: Path) -> ShardAudit:
    session = _WORKER_SESSION
    assert session is not None, "worker used before its session was prepared"
    blocks = file_blocks(
        session.target.data_file,
        start=shard.start,
        end=shard.end,
        first_line=shard.first_line,
        block_bytes=session.options.block_bytes,
    )
    return audit_blocks(
        blocks, session.context, session.rule_set, spill=spill, expected_bytes=shard.end - shard.start
    )


def audit_file_parallel(
    session: Session, jobs: int, progress: ProgressCallback | None = None
) -> FileAudit:
    """`audit_file` over shards in `jobs` worker processes; the same findings, in the same order."""
    started = time.perf_counter()
    path = session.target.data_file
    plan, sha256, size = plan_shards(path, jobs * 2)
    if len(plan) < 2:
        return audit_file(
            path, session.context, session.rule_set, block_bytes=session.options.block_bytes, progress=progress
        )
    results: dict[int, ShardAudit] = {}
    spill = FindingsLog.spill_directory()  # the workers write their findings' parts here
    threads = str(max(1, (os.cpu_count() or 1) // jobs))
    # Each worker gets its share of the cores: N workers x all cores would only thrash.
    saved = {name: os.environ.get(name) for name in ("POLARS_MAX_THREADS", "RAYON_NUM_THREADS")}
    os.environ.update({name: threads for name in saved})
    try:
        with ProcessPoolExecutor(
            max_workers=min(jobs, len(plan)),
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_worker,
            initargs=(session.target, session.options),
        ) as pool:
            pending = {pool.submit(_audit_shard, shard, spill): index for index, shard in enumerate(plan)}
            done_bytes = records = tokens = 0
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    index = pending.pop(future)
                    results[index] = future.result()
                    done_bytes += plan[index].end - plan[index].start
                    records += results[index].records
                    tokens += results[index].output_tokens
                    if progress is not None:
                        progress(records, tokens, done_bytes)
    except BaseException:
        shutil.rmtree(spill, ignore_errors=True)
        raise
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    shards = [results[i] for i in range(len(plan))]
    return join_shards(shards, session.rule_set, path=path, sha256=sha256, size=size, started=started, spill=spill)

"""The Ray executor of `--engine ray`: shards of a file audited as tasks on a Ray cluster.

The driver (this process) cuts the file into byte ranges at line boundaries, knowing the
physical line number at each cut, in one sequential read that also hashes the input
(`audit.flows.parallel.iter_shards`, as `--jobs` does), and submits each range as soon as the read
has passed its end: the tasks run while the read goes on. Each range is a Ray task that runs the engine
where it lands (`audit_blocks(file_blocks(path, start=, end=, first_line=))`), reading only its
bytes, from a shared disk or straight from object storage. A task's process prepares the
session once (`audit.flows.session.worker_session`: the tokenizer is loaded by its first shard and
kept for the next ones) and returns its `ShardAudit` with the findings in memory (a worker's
disk is not the driver's). The driver keeps each shard's findings on its own disk as they
arrive, and `join_shards` puts them in file order and runs the file-level rules (duplicate ids)
over the whole file: findings, line numbers, reports and gate outputs are the local engine's.

The cluster is the one at `RAY_ADDRESS` (`ray start --head` prints it), or a local one started
for the run when it is unset. `ray` is optional: `pip install -e '.[ray]'` in this checkout.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import time
from typing import TYPE_CHECKING, Any

from audit.base.errors import AuditError, ConfigError, InputError
from audit.base.storage import ObjectPath
from audit.engine.findings import FindingsLog, spill_part
from audit.engine.runner import FileAudit, ProgressCallback, ShardAudit, join_shards
from audit.flows.parallel import Shard, audit_range, iter_shards
from audit.flows.session import CheckOptions, Session, worker_session
from audit.records.sources import InputDigest

if TYPE_CHECKING:
    from audit.flows.cache import AuditCache
    from audit.flows.targets import Target

# A task's byte range: large enough that a task's overhead (scheduling, its result's transfer)
# is a small part of it, small enough that every CPU of the cluster gets a few shards.
MAX_SHARD_BYTES = 32 << 20
MIN_SHARD_BYTES = 1 << 20
SHARDS_PER_CPU = 2
# Threads per task: the scheduler gives each task one CPU; polars and the tokenizers would
# otherwise each start a thread per core of the node and thrash.
_TASK_THREADS = {"POLARS_MAX_THREADS": "1", "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
# What names the store a URL points at: sent with each task, so a task reads the object the
# driver named. Credentials are not sent: each node reads its own (instance role, AWS_* as
# `ray start` saw them), so no secret is written into the cluster's task metadata.
_STORE_SETTINGS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION")


def ray_module() -> Any:
    """`ray`, or a ConfigError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--engine ray needs Ray: pip install -e '.[ray]' in the audit checkout (or pip install ray)"
        ) from None
    return ray


def connect() -> Any:
    """Join the cluster at `RAY_ADDRESS`, or start a local one (no dashboard); once per process."""
    ray = ray_module()
    if ray.is_initialized():
        return ray
    address = os.environ.get("RAY_ADDRESS") or None
    # Ray's start-up notices (token authentication of a local cluster) are not the audit's output.
    logging.getLogger("ray").setLevel(logging.ERROR)
    try:
        ray.init(
            address=address,
            include_dashboard=False if address is None else None,
            logging_level=logging.WARNING,
            log_to_driver=False,
            configure_logging=False,
        )
    except Exception as exc:  # noqa: BLE001 - Ray raises many kinds; each is one line here
        where = f"RAY_ADDRESS={address}" if address else "a local cluster"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise ConfigError(f"cannot start or reach the Ray cluster ({where}): {first}") from None
    return ray


def shard_size(size: int, cpus: int, options: CheckOptions) -> int:
    """How many bytes each task audits: `--shard-size`, else a few shards per CPU of the cluster."""
    if options.shard_bytes:
        return max(1, options.shard_bytes)
    wanted = size // max(1, cpus * SHARDS_PER_CPU)
    return max(MIN_SHARD_BYTES, min(MAX_SHARD_BYTES, wanted))


def audit_on_ray(
    session: Session, progress: ProgressCallback | None = None, cache: AuditCache | None = None
) -> FileAudit:
    """The session's file audited as Ray tasks; from `cache` when the same audit is stored.

    Each shard is submitted as soon as the driver's read has passed its end, so the tasks run
    while the read (which hashes the file and numbers the shards' lines) goes on. The cache is
    looked up once that read has the file's sha256: a stored result cancels the tasks started.
    """
    ray = connect()
    started = time.perf_counter()
    path = session.target.data_file
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    before = _identity(path)
    size = before[0]
    each = shard_size(size, cpus, session.options)
    task = _remote_task(ray).options(runtime_env={"env_vars": _task_environment(session.target)})
    spill = FindingsLog.spill_directory()
    digest = InputDigest()
    plan: list[Shard] = []
    pending: dict[Any, int] = {}
    results: dict[int, ShardAudit] = {}
    counts = [0, 0, 0]  # records, output tokens, bytes of the shards done
    expected = [-(-size // each)]  # shards: an estimate until the read has cut them all

    def collect(ready: list[Any]) -> None:
        for ref in ready:
            index = pending.pop(ref)
            shard = _result(ray, ref, path)
            results[index] = _keep_on_disk(shard, spill)
            counts[0] += shard.records
            counts[1] += shard.output_tokens
            counts[2] += plan[index].end - plan[index].start
            if progress is not None:
                progress(*counts)
                if hasattr(progress, "shards"):
                    progress.shards(len(results), max(len(plan), expected[0]))

    try:
        for shard in iter_shards(path, expected[0], min_shard_bytes=each, digest=digest):
            ref = task.remote(session.target, session.options, shard, session.tokenizer.fingerprint.sha256)
            pending[ref] = len(plan)
            plan.append(shard)
            collect(ray.wait(list(pending), num_returns=len(pending), timeout=0)[0])
        expected[0] = len(plan)
        key = None
        if cache is not None:
            from audit.flows.cache import AuditCache

            key = AuditCache.key_for(digest.sha256, session.context, session.rule_set)
            hit = cache.load(key, path)
            if hit is not None:
                _cancel(ray, pending)
                shutil.rmtree(spill, ignore_errors=True)
                return hit
        while pending:
            collect(ray.wait(list(pending), num_returns=1)[0])
    except BaseException:
        _cancel(ray, pending)
        shutil.rmtree(spill, ignore_errors=True)
        raise
    if _identity(path) != before:
        shutil.rmtree(spill, ignore_errors=True)
        raise InputError(
            f"{path} changed while it was being audited (is it still being written?): audit it "
            "again once it is complete"
        )
    audited = join_shards(
        [results[i] for i in range(len(plan))],
        session.rule_set,
        path=path,
        sha256=digest.sha256,
        size=digest.bytes,
        started=started,
        spill=spill,
    )
    if cache is not None and key is not None and not audited.internal_errors:
        cache.store(key, audited)
    return audited


def _cancel(ray: Any, pending: dict[Any, int]) -> None:
    for ref in pending:
        ray.cancel(ref, force=True)
    pending.clear()


def audit_shard_task(
    target: Target, options: CheckOptions, shard: Shard, tokenizer_sha256: str | None = None
) -> ShardAudit:
    """One Ray task: the engine over bytes [start, end) of the target's file, where it runs.

    `tokenizer_sha256` is the fingerprint of the driver's tokenizer: a node whose copy at the
    same path differs would judge other ids, so it refuses (a configuration error).
    """
    session = worker_session(target, options)
    found = session.tokenizer.fingerprint
    if tokenizer_sha256 is not None and found.sha256 != tokenizer_sha256:
        raise ConfigError(
            f"the tokenizer at {found.path} on {socket.gethostname()} differs from the driver's "
            f"(sha256 {found.sha256[:12]}…, the driver's {tokenizer_sha256[:12]}…): put the same "
            "tokenizer at that path on every node"
        )
    return audit_range(session, shard)


_REMOTE: dict[int, Any] = {}


def _remote_task(ray: Any) -> Any:
    # Registered once per process: Ray ships a remote function to the cluster when it is made.
    if id(ray) not in _REMOTE:
        _REMOTE[id(ray)] = ray.remote(num_cpus=1, max_retries=2)(audit_shard_task)
    return _REMOTE[id(ray)]


def _task_environment(target: Target) -> dict[str, str]:
    environment = dict(_TASK_THREADS)
    if isinstance(target.data_file, ObjectPath):
        environment.update({k: os.environ[k] for k in _STORE_SETTINGS if os.environ.get(k)})
    return environment


def _result(ray: Any, ref: Any, path: Any) -> ShardAudit:
    """A task's ShardAudit; its failure as the one-line error it raised on the worker."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, AuditError):
            raise type(cause)(f"on a Ray worker: {cause}") from None
        text = (str(cause or exc).strip().splitlines() or ["failed"])[-1][:300]
        raise InputError(f"{path}: a Ray task failed: {text}") from None
    except ray.exceptions.RayError as exc:
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise InputError(f"{path}: the Ray cluster lost a task ({text})") from None


def _keep_on_disk(shard: ShardAudit, spill: Any) -> ShardAudit:
    """The shard's findings parts written to the driver's spill directory (large ones)."""
    shard.parts = [spill_part(part.read(), part.last_line, spill) for part in shard.parts]
    return shard


def _identity(path: Any) -> tuple[int, object]:
    """What tells that the tasks read the bytes the plan hashed: size and modification time of
    a file, size and ETag of an object. (The gate hashes the input again as it splits it.)"""
    found = path.stat()
    return found.st_size, found.etag if isinstance(path, ObjectPath) else found.st_mtime_ns

"""The `--jobs` worker processes: started once per process, kept, and started early.

This module imports nothing heavy, so that the `audit` program can start the workers a command
line asks for before its own modules load (`start_for_command_line`): a worker's imports
(~0.4 s: polars, numpy, the engine) then run beside this process's instead of after them. What
the workers do is `audit.flows.parallel`'s; here is only how they are started and stopped.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from audit.base.memory import configure_allocators
from audit.base.offline import configure_offline

if TYPE_CHECKING:  # imported when a pool is started: a run without --jobs never needs them
    from concurrent.futures import Future, ProcessPoolExecutor

# Environment a worker needs the parent's value of (the cache and backend switches, thread limits).
_INHERITED = ("AUDIT_", "HF_", "POLARS_MAX_THREADS", "RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")
# Thread pools of the libraries a worker uses, sized to its share of the cores.
_THREAD_VARIABLES = ("POLARS_MAX_THREADS", "RAYON_NUM_THREADS")

_POOL: ProcessPoolExecutor | None = None
_POOL_KEY: tuple | None = None


def _environment_key() -> tuple:
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_INHERITED)))


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """The process's `workers` worker processes, started on first use and kept until it exits.

    Started again only when the number asked for or the environment they inherit changed.
    """
    global _POOL, _POOL_KEY
    configure_offline()  # as loading the tokenizer module will: the same environment either way
    key = (workers, _environment_key())
    if _POOL is not None and key == _POOL_KEY and not getattr(_POOL, "_broken", False):
        return _POOL
    stop_workers()
    threads = _share_of_cores(workers + 1)
    saved = {name: os.environ.get(name) for name in _THREAD_VARIABLES}
    # Each process gets its share of the cores: N processes x all cores would only thrash.
    os.environ.update({name: threads for name in _THREAD_VARIABLES})
    try:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # multiprocessing's exit handler joins the worker processes: it must run after ours
        # (which stops them first), and exit handlers run last registered first.
        atexit.unregister(stop_workers)
        atexit.register(stop_workers)
        pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_prepare_worker,
        )
        # Spawned now, with the limits above, rather than on the first shard.
        for future in [pool.submit(_started) for _ in range(workers)]:
            future.add_done_callback(ignore_outcome)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    _POOL, _POOL_KEY = pool, key
    return pool


def stop_workers() -> None:
    """Stop the workers, if any (at exit; or before starting others)."""
    global _POOL, _POOL_KEY
    if _POOL is not None:
        _POOL.shutdown(wait=True, cancel_futures=True)
    _POOL = _POOL_KEY = None


atexit.register(stop_workers)


def start_for_command_line(args: Sequence[str]) -> None:
    """Start the workers `audit check ... --jobs N` will use, before the command's modules load.

    Reads only what it needs of the command line (`check`, and `--jobs N`, `--jobs=N`, `-j N`
    or `-jN` before any `--`); anything else, or anything it cannot read, starts nothing and
    the command parses its line as always (a wrong value is the command's error to report).
    """
    if not args or args[0] != "check" or "--engine" in args or any(a.startswith("--engine=") for a in args):
        return
    jobs = _jobs_option(list(args[1:]))
    if jobs is not None and jobs > 1:
        take_share_of_cores(jobs)
        worker_pool(jobs - 1)


def take_share_of_cores(processes: int) -> None:
    """This process's thread pools sized to its share of the cores, as the workers' are.

    Only before polars loads (it sizes its pool then); a setting the user made is kept. With
    all the cores' threads, this process's parallel steps would contend with the workers, and
    their idle threads spin: ~0.3 s of CPU for nothing on the benchmark with `--jobs 2`.
    """
    if "polars" in sys.modules:
        return
    threads = _share_of_cores(processes)
    for name in _THREAD_VARIABLES:
        os.environ.setdefault(name, threads)


def _share_of_cores(processes: int) -> str:
    """Threads per process when `processes` share the cores (at least one)."""
    return str(max(1, (os.cpu_count() or 1) // processes))


def _jobs_option(args: list[str]) -> int | None:
    value = None
    for index, arg in enumerate(args):
        if arg == "--":
            break
        if arg in ("--jobs", "-j"):
            value = args[index + 1] if index + 1 < len(args) else None
        elif arg.startswith("--jobs="):
            value = arg.partition("=")[2]
        elif arg.startswith("-j") and not arg.startswith("--"):
            value = arg[2:]
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _prepare_worker() -> None:
    """A new worker: the allocator settings of the command, then the engine's imports (beside
    the parent's, which is still loading its own)."""
    configure_allocators()
    import audit.engine.runner
    import audit.flows.session  # noqa: F401


def _started() -> None:
    """A task that only makes the pool start a process (which imports the engine to run it)."""


def ignore_outcome(future: Future) -> None:
    future.exception()  # retrieved, so that an unused failure is not reported at exit

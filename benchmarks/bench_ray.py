"""How long does a large run take on a Ray cluster? Per-core throughput, measured, then scaled.

    python benchmarks/bench_ray.py                     # the 10,000-record DeepSeek-V3.1 set of bench_check.py
    python benchmarks/bench_ray.py --cpus 2 --samples 600000 --tokens 6e9

Three measurements on the benchmark set (built and cached by benchmarks/data.py, as for
bench_check.py):

  one core     `audit check` in a child process pinned to one core (`taskset -c 0`), one thread
               for polars and the tokenizers: its CPU time (user + system, from the kernel's
               rusage of the child) is what one core spends on the set, whatever else the
               machine runs at the time (wall time on a shared machine measures the neighbours)
  on Ray       the same file as shards on a local cluster of `--cpus` CPUs, each task timed by
               the CPU time of its own process (`time.process_time`): the first task of a
               worker includes its session's preparation (tokenizer load), so the sum over
               tasks, against one core, is the executor's overhead factor
  the plan     the driver's sequential pass that hashes the file and numbers the shards' first
               lines (`audit.flows.parallel.iter_shards`): the part that does not scale with cores

and prints the sizing table: for `--samples` records of `--tokens` token ids in all (prompt and
output, with the benchmark's mix and bytes per id), the time on 1, 8 and 64 cores. Shards are
submitted as the driver's read passes them, so the read and the tasks overlap:
max(read, core seconds x overhead / cores) + one worker's preparation + the last shard. The
read is timed on local disk here (CPU time: a dedicated core); from object storage it runs at
the store's single-stream speed (give it with --plan-mb-s).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))


def one_core(partition: Path) -> dict:
    """CPU seconds of a whole `audit check` pinned to one core, one thread; and the report."""
    env = {**os.environ, "POLARS_MAX_THREADS": "1", "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = ["taskset", "-c", "0", sys.executable, "-m", "audit", "check", str(partition), "--no-cache",
               "--format", "json", "--exit-zero"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, cwd=ROOT, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    report = json.loads(done.stdout)
    return {"cpu": cpu, "wall": wall, "report": report}


def on_ray(partition: Path, cpus: int, shard_bytes: int | None) -> dict:
    """Task CPU seconds, plan seconds and wall seconds of the file as shards on a local cluster."""
    import ray

    from audit.flows.cluster import _task_environment, audit_shard_task, shard_size
    from audit.flows.parallel import plan_shards
    from audit.flows.session import CheckOptions, prepare
    from audit.flows.targets import resolve_target

    logging.getLogger("ray").setLevel(logging.ERROR)
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR, configure_logging=False)
    try:
        options = CheckOptions(engine="ray", shard_bytes=shard_bytes, cache=False)
        target = resolve_target(str(partition), partition.parent)
        prepare(target, options)  # configuration errors here, not in the tasks
        path = target.data_file
        size = path.stat().st_size
        each = shard_size(size, cpus, options)
        started = time.process_time()
        plan, _, _ = plan_shards(path, max(1, -(-size // each)), min_shard_bytes=each)
        plan_seconds = time.process_time() - started  # CPU: what one dedicated core takes

        @ray.remote(num_cpus=1)
        def timed(target, options, shard):
            from audit.flows.session import worker_session

            begun = time.process_time()
            worker_session(target, options)  # a worker's first shard prepares its session
            prepared = time.process_time()
            audited = audit_shard_task(target, options, shard)
            return audited.records, time.process_time() - prepared, prepared - begun, os.getpid(), shard.end - shard.start

        task = timed.options(runtime_env={"env_vars": _task_environment(target)})
        started = time.perf_counter()
        results = ray.get([task.remote(target, options, shard) for shard in plan])
        wall = time.perf_counter() - started
    finally:
        ray.shutdown()
    # A worker's first shard also warms it up (the fast encoder is built on first use): the
    # later shards give the steady cost per byte, the first ones what a worker pays once.
    seen: set[int] = set()
    first, later = [], []
    for _, cpu, _, pid, nbytes in results:
        (later if pid in seen else first).append((cpu, nbytes))
        seen.add(pid)
    steady = sum(c for c, _ in later) / max(1, sum(b for _, b in later)) if later else None
    warmup = max((c - b * steady for c, b in first), default=0.0) if steady else 0.0
    return {
        "shards": len(plan),
        "workers": len(seen),
        "records": sum(r for r, *_ in results),
        "task_cpu": sum(c for _, c, *_ in results),
        "steady_cpu": steady * size if steady else sum(c for _, c, *_ in results),
        "warmup": max(0.0, warmup),
        "prepare": max(p for _, _, p, *_ in results),
        "plan": plan_seconds,
        "wall": wall,
        "bytes": size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000, help="records of the benchmark set")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray cluster")
    parser.add_argument("--shard-bytes", type=int, default=None, help="bytes per task (default: as --engine ray)")
    parser.add_argument("--samples", type=float, default=600_000, help="records of the run to size")
    parser.add_argument("--tokens", type=float, default=6e9, help="token ids (prompt + output) of the run to size")
    parser.add_argument("--plan-mb-s", type=float, default=None, help="driver read speed for the plan (MB/s)")
    args = parser.parse_args()

    import data as bench_data

    partition = bench_data.partition("deepseek-v3.1", args.records, (1100, 2100))
    core = one_core(partition)
    report = core["report"]
    records, size = report["input"]["records"], report["input"]["bytes"]
    output_ids = report["input"]["output_tokens"]
    ids = output_ids + round(report["distributions"]["prompt_tokens"]["mean"] * records)
    print(f"benchmark set: {records:,} records, {ids / 1e6:.1f} M token ids "
          f"({output_ids / 1e6:.1f} M output), {size / 1e6:.0f} MB")
    rate = ids / core["cpu"]
    print(f"one core: {core['cpu']:.1f} CPU s (wall {core['wall']:.1f} s on this shared machine): "
          f"{records / core['cpu']:,.0f} records/s, {rate / 1e6:.2f} M ids/s per core")

    ray_run = on_ray(partition, args.cpus, args.shard_bytes)
    # Steady cost per byte on Ray against the whole one-core run (its start-up included: an
    # upper bound on the steady single-core cost, so the factor errs high, not low).
    overhead = ray_run["steady_cpu"] / core["cpu"]
    once = ray_run["prepare"] + ray_run["warmup"]
    plan_rate = (args.plan_mb_s * 1e6) if args.plan_mb_s else ray_run["bytes"] / ray_run["plan"]
    print(f"on Ray ({args.cpus} CPUs): {ray_run['shards']} shards on {ray_run['workers']} worker processes; "
          f"tasks {ray_run['task_cpu']:.1f} CPU s, {ray_run['steady_cpu']:.1f} at the later shards' rate "
          f"(x{overhead:.2f} one core); per worker, once: session {ray_run['prepare']:.1f} + warm-up "
          f"{ray_run['warmup']:.1f} CPU s; wall {ray_run['wall']:.1f} s; plan "
          f"{ray_run['plan']:.2f} CPU s ({ray_run['bytes'] / ray_run['plan'] / 1e6:,.0f} MB/s)")

    target_bytes = args.tokens * size / ids
    core_seconds = args.tokens / rate * overhead
    plan_seconds = target_bytes / plan_rate
    shard_seconds = 32e6 * ids / size / rate  # the last shard, audited after the read has ended
    print(f"\nsizing: {args.samples:,.0f} samples, {args.tokens / 1e9:g} B token ids, ~{target_bytes / 1e9:.0f} GB "
          f"of JSONL: {core_seconds / 3600:.2f} core hours; the driver's read at {plan_rate / 1e6:,.0f} MB/s")
    print("total = max(the driver's read, audit / cores) + a worker's session and warm-up + the last 32 MB shard")
    print(f"{'cores':>6}  {'audit':>10}  {'read':>8}  {'total':>10}")
    for cores in (1, 8, 64):
        audit = core_seconds / cores
        total = max(audit, plan_seconds) + once + shard_seconds
        print(f"{cores:>6}  {_duration(audit):>10}  {_duration(plan_seconds):>8}  {_duration(total):>10}")


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


if __name__ == "__main__":
    main()

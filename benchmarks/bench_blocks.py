"""What a block costs: the engine's CPU and the process's peak RSS for each block size.

    python benchmarks/bench_blocks.py PARTITION --block-kb 4096 8192      # sizes to compare
    python benchmarks/bench_blocks.py PARTITION --block-kb 64 --records 1000   # the fixed cost

Each size runs in a fresh process pinned to one core (`taskset`, where there is one): the audit
is prepared once, then run `--repeat` times in that process, and the fewest CPU seconds of the
runs after the first are reported (the first builds the encoder); the peak RSS is the process's
own. With `--records N` only the partition's first N lines are audited (copied to a temporary
partition beside it): in blocks of a few records, the time is nearly all the per-block fixed
cost. No result cache. Every figure is for this machine and this moment: compare sizes, or code
before and after a change, within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def measure(partition: Path, block_bytes: int, repeat: int) -> dict:
    """In this process: the engine's CPU seconds (fewest after the first run) and blocks."""
    sys.path.insert(0, str(ROOT))
    from audit.flows.checking import check_session
    from audit.flows.session import CheckOptions, prepare
    from audit.flows.targets import resolve_target

    session = prepare(resolve_target(str(partition), partition.parent), CheckOptions(block_bytes=block_bytes, cache=False))
    seconds = []
    for _ in range(repeat):
        started = time.process_time()
        check_session(session)
        seconds.append(time.process_time() - started)
    size = (partition / "raw_responses.jsonl").stat().st_size
    return {
        "cpu": min(seconds[1:] or seconds),
        "blocks": -(-size // block_bytes),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("partition", type=Path)
    parser.add_argument("--block-kb", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--records", type=int, default=0, help="audit only the first N lines")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.partition, args.child, args.repeat)))
        return
    with tempfile.TemporaryDirectory(dir=args.partition.parent) as tmp:
        partition = args.partition.resolve()
        if args.records:
            partition = Path(tmp) / f"{args.partition.name}-head{args.records}"
            partition.mkdir()
            with (args.partition / "raw_responses.jsonl").open("rb") as lines, \
                    (partition / "raw_responses.jsonl").open("wb") as out:
                for _, line in zip(range(args.records), lines, strict=False):
                    out.write(line)
            generation = json.loads((args.partition / "generation.json").read_text())
            recorded = generation.get("tokenizer")
            path = recorded.get("path") if isinstance(recorded, dict) else None
            if isinstance(path, str) and not Path(path).is_absolute():  # relative to the partition
                recorded["path"] = str((args.partition / path).resolve())
            (partition / "generation.json").write_text(json.dumps(generation))
        pin = ["taskset", "-c", str(min(os.sched_getaffinity(0)))] if shutil.which("taskset") else []
        print(f"{'block':>8s} {'blocks':>7s} {'engine CPU s':>13s} {'per block ms':>13s} {'peak RSS':>9s}")
        for kb in args.block_kb:
            argv = [*pin, sys.executable, __file__, str(partition), "--repeat", str(args.repeat), "--child", str(kb << 10)]
            done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=ROOT)
            if done.returncode:
                raise SystemExit(f"the {kb} KB run failed:\n{done.stderr}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{kb:>6d}KB {row['blocks']:>7d} {row['cpu']:>13.2f} {1000 * row['cpu'] / row['blocks']:>13.1f} "
                  f"{row['peak_rss_mb']:>6.0f} MB", flush=True)


if __name__ == "__main__":
    main()

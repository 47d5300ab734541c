"""Time and peak memory of `audit check` and `audit gate` on a file of one long line of zeros.

    python benchmarks/bench_long_line.py                # one 1 GiB unterminated line
    python benchmarks/bench_long_line.py --gib 4

What a crash with preallocated space leaves at the end of a file: zero bytes and no newline. The
file is sparse (`truncate`), made in a temporary directory and removed after. Each command runs
in its own process (the installed `audit`, with the kimi-k2.5 fixture tokenizer and no cache);
printed: its exit code (1: the line is an INT001 finding), wall time, and peak resident memory
(the process's `ru_maxrss`). The reading skips such a line unread, so both should take seconds and
a few hundred MB whatever the line's length.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "fixtures" / "tokenizers" / "kimi-k2.5-mini"


# Runs the command and prints its peak RSS: a fresh parent per command, so the children's
# maximum is that command's own.
MEASURE = (
    "import resource, subprocess, sys; "
    "done = subprocess.run(sys.argv[1:], capture_output=True); "
    "sys.stderr.buffer.write(done.stderr); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(done.returncode)"
)


def run(args: list[str]) -> tuple[int, float, float]:
    """(exit code, seconds, peak RSS in MB) of one `audit` process."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, sys.executable, "-m", "audit", *args], capture_output=True, cwd=ROOT
    )
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):
        sys.exit(f"audit {' '.join(args)} failed ({done.returncode}): {done.stderr.decode()}")
    return done.returncode, seconds, int(done.stdout) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0, help="the line's length in GiB (default 1)")
    options = parser.parse_args()
    common = ["--profile", "kimi-k2.5", "--tokenizer", str(TOKENIZER), "--no-cache"]
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "raw_responses.jsonl"
        with data.open("wb") as handle:
            handle.truncate(int(options.gib * (1 << 30)))
        print(f"one unterminated line of {data.stat().st_size:,} zero bytes (sparse: {data.stat().st_blocks * 512:,} on disk)")
        runs = {
            "check": ["check", str(data), *common, "--report", os.path.join(folder, "report.json")],
            "gate": ["gate", str(data), *common, "--out", os.path.join(folder, "gated")],
        }
        for name, args in runs.items():
            code, seconds, peak = run(args)
            print(f"audit {name:5}  exit {code}  {seconds:6.1f} s  peak RSS {peak:7.0f} MB")


if __name__ == "__main__":
    main()

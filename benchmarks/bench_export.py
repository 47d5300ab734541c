"""How much `audit export` costs beside `audit check` on the same file, and whether memory stays flat.

    python benchmarks/bench_export.py                          # 10,000 long records, real DeepSeek-V3.1 tokenizer
    python benchmarks/bench_export.py --tokenizer deepseek-mini --records 2000 --formats jsonl

Uses the partition `bench_check.py` builds (cached under benchmarks/.data/, see data.py) and
measures, each in a fresh process (whole command, interpreter start-up included, no result
cache), the fastest of `--repeat` interleaved rounds:

  audit check                 the full rule set, as a user runs it
  audit export --format F     the same check, then the clean records written as samples in F
  audit export, 1/4 records   the first quarter of the file: peak RSS beside the whole file's
                              says whether memory follows the file (it must not)
  audit vocab                 the same check, then the trained tokens counted (no samples written)

and prints seconds, peak RSS and the judged ratio: export / check <= 1.5.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_check  # noqa: E402  (beside this script)
import data as bench_data  # noqa: E402


def run(name: str, argv: list[str], state: Path, expect: tuple[int, ...] = (0, 1)) -> dict:
    """One whole `python -m audit ...` process: wall seconds and its own peak RSS."""
    env = bench_check._env(AUDIT_CACHE_DIR=str(state))
    seconds, rss, result = bench_check._child([bench_check.PYTHON, "-m", "audit", *argv], env)
    if result.returncode not in expect:
        raise SystemExit(f"{name} exited {result.returncode}:\n{result.stderr}{result.stdout[-2000:]}")
    row = {"seconds": seconds, "rss_kib": rss}
    bench_check._log(name, row)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default="deepseek-v3.1", help="deepseek-v3.1 (real), deepseek-mini, kimi-mini")
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--words", type=int, nargs=2, default=(1100, 2100), help="reasoning words per record")
    parser.add_argument("--formats", nargs="+", default=["parquet", "jsonl", "datasets"])
    parser.add_argument("--repeat", type=int, default=1, help="interleaved rounds; the fastest run of each is kept")
    args = parser.parse_args()

    full = bench_data.partition(args.tokenizer, args.records, tuple(args.words))
    quarter = bench_data.head(full, args.records // 4)
    size = (full / "raw_responses.jsonl").stat().st_size
    print(f"data: {full} ({size / 1e6:.0f} MB, {args.records:,} records)", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        state = work / "state"  # the tokenizer's cached state, shared by every run (as a user's machine has it)
        run("warm-up: audit check of the quarter", ["check", str(quarter), "--no-cache"], state)

        def export(partition: Path, fmt: str) -> list[str]:
            out = work / "out"
            shutil.rmtree(out, ignore_errors=True)
            return ["export", str(partition), "--out", str(out), "--format", fmt, "--no-cache"]

        def vocab() -> list[str]:
            out = work / "vocab"
            shutil.rmtree(out, ignore_errors=True)
            return ["vocab", str(full), "--out", str(out), "--draft-vocab", "32000", "--no-cache"]

        plan = [("audit check", lambda: ["check", str(full), "--no-cache"])]
        plan += [(f"audit export --format {fmt}", lambda fmt=fmt: export(full, fmt)) for fmt in args.formats]
        plan += [
            (f"audit export --format {args.formats[0]}, 1/4 records", lambda: export(quarter, args.formats[0])),
            ("audit vocab --draft-vocab 32000", vocab),
        ]
        runs: dict[str, list[dict]] = {name: [] for name, _ in plan}
        for _ in range(args.repeat):
            for name, argv in plan:
                runs[name].append(run(name, argv(), state))
    rows = {name: bench_check._fastest(found) for name, found in runs.items()}

    print(f"\n{'what':44s} {'seconds':>8s} {'records/s':>10s} {'peak RSS':>9s}")
    for name, row in rows.items():
        records = args.records // 4 if "1/4" in name else args.records
        print(f"{name:44s} {row['seconds']:8.2f} {records / row['seconds']:10,.0f} {row['rss_kib'] / 1024:7.0f} MB")
    check = rows["audit check"]
    print("\nratios (judged: export / check <= 1.5)")
    for fmt in args.formats:
        export_row = rows[f"audit export --format {fmt}"]
        print(f"  export --format {fmt:8s} / check          {export_row['seconds'] / check['seconds']:6.2f}")
    whole, part = rows[f"audit export --format {args.formats[0]}"], rows[f"audit export --format {args.formats[0]}, 1/4 records"]
    print(f"  peak RSS export whole / export 1/4      {whole['rss_kib'] / part['rss_kib']:6.2f}   (flat: near 1)")
    print(f"  peak RSS export / check                 {whole['rss_kib'] / check['rss_kib']:6.2f}")
    print(f"  vocab / check                           {rows['audit vocab --draft-vocab 32000']['seconds'] / check['seconds']:6.2f}")


if __name__ == "__main__":
    main()

"""How fast is `audit check`, as ratios to the floor measured in the same run.

    python benchmarks/bench_check.py                          # 10,000 long records, real DeepSeek-V3.1 tokenizer
    python benchmarks/bench_check.py --tokenizer deepseek-mini --records 2000

Builds (once, cached under benchmarks/.data/) a partition of long thinking records with tool
calls, then measures, each in a fresh process so timings and peak memory do not leak between
them, the fastest of interleaved rounds:

  floor            benchmarks/bench_floor.py: the work no audit can skip (orjson parse, byte-table
                   decode, fastokens encode, compare), one process pinned to one core, timed as a
                   whole process like the tool (interpreter start and imports in), less its build
                   of the byte table (an audit reads it from its tokenizer cache)
  check --jobs 1   `audit check` with the full rule set as a user runs it (whole process: start-up,
                   tokenizer, report), pinned to the same core; judged against the floor
  RTR001 only      the same with the round trip as its only rule: the floor's work as the tool does
                   it; what the other rules add is the difference (not judged, where the time goes)
  check --jobs N   the same on N cores, unpinned; judged against the floor divided by N
  bare load        a whole Python process that loads the tokenizer.json with `tokenizers` and
                   parses the file's first 3 lines
  3 records, cold  `audit check` of those 3 lines with an empty tokenizer cache (a fresh CI runner)
  3 records, warm  the same once the cache holds the tokenizer's state

and prints the ratios the project is judged on: check --jobs 1 / floor (<= 1.25), check --jobs N /
(floor / N) (<= 1.35 on the --scale set), cold / bare load (<= 5), warm / bare load (<= 2.5),
peak RSS of the whole file / the warm 3-record run (<= 1.5). Machines are shared and noisy:
compare the ratios, not the seconds.

    python benchmarks/bench_check.py --scale 4               # --jobs N judged on 4x the records

also builds (once, cached) a partition of `--scale` times the records (the partition written that
many times over, each copy's ids made its own) and times the floor and `check --jobs N` on it
in the same rounds: the `--jobs N` ratio is then judged there, where a user adds cores. Child processes may write bytecode caches (PYTHONDONTWRITEBYTECODE is dropped for
them), as an installed package has them.

    python benchmarks/bench_check.py --bad-records 1000000      # memory under many findings

measures instead peak RSS and time of `audit check` and `audit gate` over N short records that
each break several rules (a million make ~54 MB and three million findings), and of a check of
their first 3 lines: memory must follow the input, not the findings; each peak is also given
as a ratio to the 3-line check's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PYTHON = sys.executable
# The core the floor and `--jobs 1` are pinned to (the first this process may run on).
PINNED_CORE = min(os.sched_getaffinity(0)) if shutil.which("taskset") and hasattr(os, "sched_getaffinity") else None


# A bare load, timed as a whole process: import tokenizers, load the tokenizer.json, parse the lines.
BARE_LOAD = """
import sys, orjson
from tokenizers import Tokenizer
tokenizer = Tokenizer.from_file(sys.argv[1] + "/tokenizer.json")
with open(sys.argv[2], "rb") as handle:
    records = [orjson.loads(line) for line in handle if line.strip()]
"""


# -- the driver ----------------------------------------------------------------------------------


# Runs the measured program as its own child and reports that child's wall time and peak RSS.
# Linux carries a process's peak RSS across exec from the process it was spawned from, so a
# program spawned straight from this (large) driver would report the driver's size; spawned
# from this small launcher it reports its own.
LAUNCHER = """
import json, os, sys, time
started = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
seconds = time.perf_counter() - started
with open(sys.argv[1], "w") as out:
    json.dump({"seconds": seconds, "rss_kib": usage.ru_maxrss, "cpu": usage.ru_utime + usage.ru_stime}, out)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, **extra}


def _child(argv: list[str], env: dict | None = None) -> tuple[float, int, subprocess.CompletedProcess]:
    """Run a process; its wall seconds, its own peak RSS (KiB) and its output (its CPU seconds,
    its own and its children's, in `_CPU[-1]`)."""
    env = _env() if env is None else env
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r", suffix=".json") as measured:
        process = subprocess.run([PYTHON, "-c", LAUNCHER, measured.name, *argv], stdout=out, stderr=err,
                                 env=env, cwd=ROOT, check=False)
        out.seek(0)
        err.seek(0)
        result = subprocess.CompletedProcess(argv, process.returncode, out.read().decode(), err.read().decode())
        usage = json.loads(measured.read() or '{"seconds": 0, "rss_kib": 0, "cpu": 0}')
    _CPU.append(usage["cpu"])
    return usage["seconds"], usage["rss_kib"], result


# The CPU seconds (user + system, the process and the children it waited for) of each `_child`.
_CPU: list[float] = []


def _log(name: str, row: dict) -> None:
    print(f"  measured {name}: {row['seconds']:.2f} s, peak RSS {row['rss_kib'] / 1024:.0f} MB", flush=True)


def bare_load(data: Path, tok: Path) -> dict:
    """The bare `tokenizers` load + parse of `data`, as a whole process."""
    seconds, rss, result = _child([PYTHON, "-c", BARE_LOAD, str(tok), str(data)])
    if result.returncode != 0:
        raise SystemExit(f"bare load failed:\n{result.stderr}")
    return {"seconds": seconds, "rss_kib": rss, "cpu": _CPU[-1]}


def pinned(argv: list[str]) -> list[str]:
    """`argv` pinned to one core (`taskset`), the floor's and `--jobs 1`'s setting."""
    return ["taskset", "-c", str(PINNED_CORE), *argv] if PINNED_CORE is not None else argv


def floor_run(data: Path, tok: Path) -> dict:
    """benchmarks/bench_floor.py pinned to one core: the process's seconds less its byte-table
    build, its loop's seconds (`loop_seconds`), the process's peak RSS."""
    seconds, rss, result = _child(pinned([PYTHON, str(HERE / "bench_floor.py"), str(data), str(tok)]))
    if result.returncode != 0:
        raise SystemExit(f"the floor failed:\n{result.stderr}")
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    return {**measured, "loop_seconds": measured["seconds"], "seconds": seconds - measured["table_seconds"],
            "rss_kib": rss, "cpu": _CPU[-1] - measured["table_cpu"]}


def scaled(partition: Path, times: int) -> Path:
    """A partition of `times` copies of `partition`'s lines (built once, cached beside it); each
    copy's ids get their own prefix, so no id repeats across copies."""
    out = partition.with_name(f"{partition.name}-x{times}")
    data = out / "raw_responses.jsonl"
    if data.is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    lines = (partition / "raw_responses.jsonl").read_bytes().splitlines(keepends=True)
    head = b'{"id":"'
    with open(data.with_suffix(".tmp"), "wb") as sink:
        for copy in range(times):
            prefix = b'{"id":"c%d-' % copy
            sink.writelines(prefix + line[len(head):] if copy and line.startswith(head) else line for line in lines)
    data.with_suffix(".tmp").rename(data)
    shutil.copy(partition / "generation.json", out / "generation.json")
    return out


def audit_check(partition: Path, *extra: str, cache_dir: Path | None = None, pin: bool = False) -> dict:
    """`audit check` as a user runs it (no result cache); the report says what it found.

    `cache_dir` holds the tokenizer's cached state between runs; unset, every run starts cold."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        argv = [PYTHON, "-m", "audit", "check", str(partition), "--no-cache", "--report", str(report),
                "--format", "json", *extra]
        env = _env(AUDIT_CACHE_DIR=str(cache_dir or Path(tmp) / "cache"))
        seconds, rss, result = _child(pinned(argv) if pin else argv, env)
        if result.returncode not in (0, 1):
            raise SystemExit(f"audit check failed ({result.returncode}):\n{result.stderr}")
        summary = json.loads(report.read_text())["summary"]
    return {"seconds": seconds, "rss_kib": rss, "cpu": _CPU[-1], **summary}


def bad_records(count: int) -> None:
    """Peak RSS of `check` and `gate` over `count` short records, every one with findings."""
    directory = HERE / ".data" / f"bad-{count}"
    data = directory / "raw_responses.jsonl"
    if not data.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        with data.open("w") as out:
            for n in range(count):  # no generation suffix, no </think>, no end of turn: 3 findings
                out.write(f'{{"id":"r{n}","input_ids":[1,2],"output_ids":[3,4]}}\n')
    tokenizer = ROOT / "fixtures" / "tokenizers" / "kimi-k2.5-mini"
    common = ["--profile", "kimi-k2.5", "--tokenizer", str(tokenizer), "--no-cache"]
    small = directory / "head3.jsonl"
    if not small.is_file():
        with data.open("rb") as lines:
            small.write_bytes(b"".join(next(lines) for _ in range(min(3, count))))
    print(f"{count:,} short bad records, {data.stat().st_size / 1e6:.0f} MB", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        env = _env(AUDIT_CACHE_DIR=str(Path(tmp) / "cache"))
        runs = {
            "check, 3 records": ["check", str(small), "--report", str(Path(tmp) / "small.json")],
            "audit check": ["check", str(data), "--report", str(Path(tmp) / "report.json")],
            "audit gate": ["gate", str(data), "--out", str(Path(tmp) / "gated")],
        }
        print(f"{'what':16s} {'seconds':>8s} {'peak RSS':>9s}  {'/ 3 records':>11s}")
        baseline = 0
        for name, argv in runs.items():
            seconds, rss, result = _child([PYTHON, "-m", "audit", *argv, *common], env)
            if result.returncode != 1:
                raise SystemExit(f"{name} exited {result.returncode}, expected 1:\n{result.stderr}")
            baseline = baseline or rss
            print(f"{name:16s} {seconds:8.1f} {rss / 1024:7.0f} MB  {rss / baseline:11.2f}", flush=True)


# The floor over the --scale partition (pinned, like the floor).
SCALED_FLOOR_ROW = "floor, scaled (1 core)"
# `audit check` with the round trip (RTR001) as its only rule, pinned like `--jobs 1`.
ROUND_TRIP_ROW = "check, RTR001 only (1 core)"


def _fastest(runs: list[dict]) -> dict:
    """The fastest of repeated runs (on a shared machine the others measure the neighbours)."""
    return min(runs, key=lambda row: row["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", default="deepseek-v3.1", help="deepseek-v3.1 (real), deepseek-mini, kimi-mini")
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--words", type=int, nargs=2, default=(1100, 2100), help="reasoning words per record")
    parser.add_argument("--jobs", type=int, default=2, help="time `audit check --jobs N` beside --jobs 1")
    parser.add_argument("--repeat", type=int, default=7, help="runs of each short measurement (3 records, bare load)")
    parser.add_argument("--repeat-long", type=int, default=3, help="runs of each measurement over the whole file")
    parser.add_argument("--scale", type=int, default=1,
                        help="judge --jobs N on a partition of this many times the records (built once)")
    parser.add_argument("--bad-records", type=int, default=0, help="measure memory over N short bad records")
    args = parser.parse_args()
    if args.bad_records:
        bad_records(args.bad_records)
        return

    sys.path.insert(0, str(HERE))
    import data as bench_data

    started = time.perf_counter()
    full = bench_data.partition(args.tokenizer, args.records, tuple(args.words))
    small = bench_data.head(full, 3)
    tok = bench_data.tokenizer_dir(args.tokenizer)
    print(f"data: {full} ({(full / 'raw_responses.jsonl').stat().st_size / 1e6:.0f} MB), "
          f"ready in {time.perf_counter() - started:.1f} s; pinned to core "
          f"{PINNED_CORE if PINNED_CORE is not None else '(none: no taskset here)'}, {os.cpu_count()} cores", flush=True)
    big = scaled(full, args.scale) if args.scale > 1 else full
    if big != full:
        print(f"scaled: {big} ({(big / 'raw_responses.jsonl').stat().st_size / 1e6:.0f} MB)", flush=True)
    data_file = full / "raw_responses.jsonl"
    small_file = small / "raw_responses.jsonl"
    jobs_row = f"check --jobs {args.jobs}"
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as state_dir:
        state = Path(state_dir)
        # The tokenizer's state as a first large audit leaves it (byte table, compact backend).
        audit_check(full, cache_dir=state)
        # The round trip alone: the floor's work as the tool does it, with its start-up, its
        # reading of every field and its report, and no other rule (where the time goes).
        round_trip_only = state / "round-trip-only.toml"
        round_trip_only.write_text('select = ["RTR001"]\n')
        plan = [
            ("floor (1 core)", args.repeat_long, lambda: floor_run(data_file, tok)),
            ("check --jobs 1 (1 core)", args.repeat_long, lambda: audit_check(full, "--jobs", "1", cache_dir=state, pin=True)),
            (ROUND_TRIP_ROW, args.repeat_long,
             lambda: audit_check(full, "--jobs", "1", "--rules", str(round_trip_only), cache_dir=state, pin=True)),
            (jobs_row, args.repeat_long, lambda: audit_check(full, "--jobs", str(args.jobs), cache_dir=state)),
            *([
                (SCALED_FLOOR_ROW, args.repeat_long, lambda: floor_run(big / "raw_responses.jsonl", tok)),
                (f"{jobs_row}, x{args.scale}", args.repeat_long,
                 lambda: audit_check(big, "--jobs", str(args.jobs), cache_dir=state)),
            ] if big != full else []),
            ("bare load + parse, 3 records", args.repeat, lambda: bare_load(small_file, tok)),
            ("3 records, cold (empty cache)", args.repeat, lambda: audit_check(small)),
            ("3 records, warm", args.repeat, lambda: audit_check(small, cache_dir=state)),
        ]
        runs: dict[str, list[dict]] = {name: [] for name, _, _ in plan}
        # Interleaved rounds: a burst of load on the machine hits every measurement alike.
        for round_ in range(max(args.repeat, args.repeat_long)):
            for name, times, run in plan:
                if round_ < times:
                    runs[name].append(run())
                    _log(name, runs[name][-1])
        rows.update({name: {**_fastest(found), "cpu": min(r["cpu"] for r in found)} for name, found in runs.items()})

    floor = rows["floor (1 core)"]
    print(f"\n{floor['records']:,} records, {floor['ids']:,} output ids; fastest of {args.repeat_long} run(s) "
          f"each, {args.repeat} for the 3-record rows\n")
    print(f"{'what':34s} {'seconds':>8s} {'peak RSS':>9s} {'CPU s':>7s}")
    for name, row in rows.items():
        print(f"{name:34s} {row['seconds']:8.2f} {row['rss_kib'] / 1024:7.0f} MB {row['cpu']:7.2f}")

    one, many = rows["check --jobs 1 (1 core)"], rows[jobs_row]
    bare = rows["bare load + parse, 3 records"]["seconds"]

    def ratio(label: str, value: float, target: str, cpu: float | None = None) -> None:
        cpu_text = f"{cpu:6.2f}" if cpu is not None else " " * 6
        print(f"  {label:44s} {value:6.2f} {cpu_text}   ({target})")

    def cpu(row: dict, against: dict) -> float:
        """The ratio in CPU seconds (the fewest of the runs; robust to a loaded machine). For N
        processes, the CPU of all of them against the floor's: what N idle cores could give at
        best for the wall ratio against the floor divided by N."""
        return row["cpu"] / against["cpu"]

    print(f"\nratios (judged){'':31s}  wall    CPU")
    ratio("check --jobs 1 / floor, one core", one["seconds"] / floor["seconds"], "<= 1.25", cpu(one, floor))
    if SCALED_FLOOR_ROW in rows:
        big_floor, big_many = rows[SCALED_FLOOR_ROW], rows[f"{jobs_row}, x{args.scale}"]
        ratio(f"check --jobs {args.jobs} / (floor / {args.jobs}), x{args.scale} records",
              big_many["seconds"] / (big_floor["seconds"] / args.jobs), "<= 1.35", cpu(big_many, big_floor))
        ratio(f"check --jobs {args.jobs} / (floor / {args.jobs}), x1 (not judged)",
              many["seconds"] / (floor["seconds"] / args.jobs), "start-up weighs more", cpu(many, floor))
    else:
        ratio(f"check --jobs {args.jobs} / (floor / {args.jobs})", many["seconds"] / (floor["seconds"] / args.jobs),
              "<= 1.35 judged with --scale 4")
    bare_row = rows["bare load + parse, 3 records"]
    cold, warm = rows["3 records, cold (empty cache)"], rows["3 records, warm"]
    ratio("3 records cold / bare load + parse", cold["seconds"] / bare, "<= 5", cpu(cold, bare_row))
    ratio("3 records warm / bare load + parse", warm["seconds"] / bare, "<= 2.5", cpu(warm, bare_row))
    ratio("peak RSS, whole file / 3 records warm", one["rss_kib"] / rows["3 records, warm"]["rss_kib"], "<= 1.5")
    alone = rows[ROUND_TRIP_ROW]["seconds"]
    print("\nwhere the time goes (not judged)")
    ratio("round trip only / floor, one core", alone / floor["seconds"], "start-up, every field read, report",
          cpu(rows[ROUND_TRIP_ROW], floor))
    ratio("the other rules / floor, one core", (one["seconds"] - alone) / floor["seconds"], "what the rules add")
    ratio("check --jobs 1 / the floor's loop alone", one["seconds"] / floor["loop_seconds"],
          "the floor without its start-up")
    print(f"\ncheck found {one['findings']} findings, {one['records_with_errors']} records with errors; "
          f"the floor found {floor['differ']} outputs whose round trip differs")


if __name__ == "__main__":
    main()

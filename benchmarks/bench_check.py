"""How fast is `audit check`, side by side with what it replaces, in one run.

    python benchmarks/bench_check.py                          # 10,000 long records, real DeepSeek-V3.1 tokenizer
    python benchmarks/bench_check.py --tokenizer deepseek-mini --records 2000

Builds (once, cached under benchmarks/.data/) a partition of long thinking records with tool
calls, then measures, each in a fresh subprocess so timings and peak memory do not leak
between them:

  parse floor     read the file and json-parse every line with orjson (the fastest parser here)
  naive audit     the script a team writes by hand: json.loads per line, Python list scans
                  for the same special-id rules (no decoding)
  round trip      `tokenizers` decode_batch then encode_batch over every output (the wall)
  check           `audit check` with the full rule set, as a user runs it (CLI, whole process)
  check -RTR001   the same without the round-trip rule
  memory          peak RSS of `audit check` on N/4 and N records

    python benchmarks/bench_check.py --bad-records 1000000      # memory under many findings

measures instead peak RSS and time of `audit check` and `audit gate` over N short records that
each break several rules (a million make ~54 MB and three million findings): memory must follow
the input, not the findings (judged: under 1.5 GB for a million).

It prints records/s, ids/s and the ratios the project is judged on. The check runs include
process start-up and tokenizer loading; the baselines time only their work loop.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PYTHON = sys.executable


# -- measurements, each run in its own process ---------------------------------------------------


def measure_parse_floor(data: Path, _tok: Path) -> dict:
    import orjson

    started = time.perf_counter()
    records = ids = 0
    with data.open("rb") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            records += 1
            for name in ("input_ids", "output_ids"):
                value = record.get(name)
                if isinstance(value, list):
                    ids += len(value)
    return {"seconds": time.perf_counter() - started, "records": records, "ids": ids}


def measure_naive(data: Path, tok: Path) -> dict:
    """The hand-written audit: json.loads and list scans, one record at a time."""
    import re

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tok / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)

    def tid(text: str) -> int:
        return tokenizer.token_to_id(text)

    think, think_end = tid("<think>"), tid("</think>")
    eos = tid("<｜end▁of▁sentence｜>")
    suffix = [tid("<｜Assistant｜>"), think]
    roles = {
        tid("<｜tool▁calls▁begin｜>"): "S", tid("<｜tool▁calls▁end｜>"): "s",
        tid("<｜tool▁call▁begin｜>"): "C", tid("<｜tool▁sep｜>"): "A", tid("<｜tool▁call▁end｜>"): "E",
    }
    grammar = re.compile(r"(?:S(?:CAE)+s)*")
    started = time.perf_counter()
    seen: dict[str, int] = {}
    failing = 0
    records = 0
    with data.open("rb") as handle:
        for n, line in enumerate(handle, 1):
            if not line.strip():
                continue
            records += 1
            try:
                record = json.loads(line)
            except ValueError:
                failing += 1
                continue
            prompt = record.get("input_ids") or record.get("prompt_ids")
            output = record.get("output_ids")
            if not isinstance(prompt, list) or not prompt or not isinstance(output, list):
                failing += 1
                continue
            bad = False
            if any(not isinstance(i, int) or i < 0 or i >= vocab for i in prompt):
                bad = True
            if any(not isinstance(i, int) or i < 0 or i >= vocab for i in output):
                bad = True
            sample = record.get("id")
            if sample is not None:
                if sample in seen:
                    bad = True
                seen.setdefault(sample, n)
            meta = record.get("meta_info") or {}
            if meta.get("prompt_tokens") not in (None, len(prompt)):
                bad = True
            if meta.get("completion_tokens") not in (None, len(output)):
                bad = True
            if prompt[-len(suffix):] != suffix:
                bad = True
            finish = (meta.get("finish_reason") or {}).get("type")
            closes = output.count(think_end)
            if think in output or closes > 1 or (finish == "stop" and closes == 0):
                bad = True
            letters = "".join(roles[i] for i in output if i in roles)
            if not grammar.fullmatch(letters):
                bad = True
            if finish in ("length", "abort") or not output or (finish == "stop" and output[-1] != eos):
                bad = True
            failing += bad
    return {"seconds": time.perf_counter() - started, "records": records, "failing": failing}


def measure_round_trip(data: Path, tok: Path) -> dict:
    """`tokenizers` decode_batch + encode_batch over every output, 1,000 records a batch."""
    import orjson
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tok / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    spent = 0.0
    ids = differ = 0

    def run(batch: list[list[int]]) -> None:
        nonlocal spent, ids, differ
        started = time.perf_counter()
        texts = tokenizer.decode_batch(batch, skip_special_tokens=False)
        again = tokenizer.encode_batch(texts, add_special_tokens=False)
        spent += time.perf_counter() - started
        ids += sum(map(len, batch))
        differ += sum(a != e.ids for a, e in zip(batch, again, strict=True))

    batch: list[list[int]] = []
    with data.open("rb") as handle:
        for line in handle:
            try:
                output = orjson.loads(line).get("output_ids")
            except (orjson.JSONDecodeError, AttributeError):
                continue
            if isinstance(output, list) and all(isinstance(i, int) and 0 <= i < vocab for i in output):
                batch.append(output)
            if len(batch) == 1000:
                run(batch)
                batch = []
    if batch:
        run(batch)
    return {"seconds": spent, "output_ids": ids, "differ": differ}


MEASURES = {"parse": measure_parse_floor, "naive": measure_naive, "roundtrip": measure_round_trip}


# -- the driver ----------------------------------------------------------------------------------


def _child(argv: list[str], env: dict | None = None) -> tuple[float, int, subprocess.CompletedProcess]:
    """Run a process; wall seconds, its own peak RSS (KiB, via wait4) and its output."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=ROOT)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        code = os.waitstatus_to_exitcode(status)
        result = subprocess.CompletedProcess(argv, code, out.read().decode(), err.read().decode())
    return seconds, usage.ru_maxrss, result


def _log(name: str, row: dict) -> None:
    print(f"  measured {name}: {row['seconds']:.2f} s, peak RSS {row['rss_kib'] / 1024:.0f} MB", flush=True)


def in_process(kind: str, data: Path, tok: Path) -> dict:
    seconds, rss, result = _child([PYTHON, __file__, "--measure", kind, str(data), str(tok)])
    if result.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{result.stderr}")
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    measured["rss_kib"] = rss
    return measured


def audit_check(partition: Path, *extra: str) -> dict:
    """`audit check` as a user runs it; the report says what it found."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        argv = [PYTHON, "-m", "audit", "check", str(partition), "--no-cache", "--report", str(report),
                "--format", "json", *extra]
        env = {**os.environ, "AUDIT_CACHE_DIR": str(Path(tmp) / "cache")}
        seconds, rss, result = _child(argv, env)
        if result.returncode not in (0, 1):
            raise SystemExit(f"audit check failed ({result.returncode}):\n{result.stderr}")
        summary = json.loads(report.read_text())["summary"]
    return {"seconds": seconds, "rss_kib": rss, **summary}


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
    print(f"{count:,} short bad records, {data.stat().st_size / 1e6:.0f} MB", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "AUDIT_CACHE_DIR": str(Path(tmp) / "cache")}
        runs = {
            "audit check": ["check", str(data), "--report", str(Path(tmp) / "report.json")],
            "audit gate": ["gate", str(data), "--out", str(Path(tmp) / "gated")],
        }
        print(f"{'what':14s} {'seconds':>8s} {'peak RSS':>9s}  (judged: < 1500 MB)")
        for name, argv in runs.items():
            seconds, rss, result = _child([PYTHON, "-m", "audit", *argv, *common], env)
            if result.returncode != 1:
                raise SystemExit(f"{name} exited {result.returncode}, expected 1:\n{result.stderr}")
            print(f"{name:14s} {seconds:8.1f} {rss / 1024:7.0f} MB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default="deepseek-v3.1", help="deepseek-v3.1 (real), deepseek-mini, kimi-mini")
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--words", type=int, nargs=2, default=(1100, 2100), help="reasoning words per record")
    parser.add_argument("--jobs", type=int, default=0, help="also time `audit check --jobs N`")
    parser.add_argument("--skip-round-trip", action="store_true", help="skip the slow tokenizers baseline")
    parser.add_argument("--bad-records", type=int, default=0, help="measure memory over N short bad records")
    parser.add_argument("--measure", nargs=3, metavar=("KIND", "FILE", "TOKENIZER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        kind, data, tok = args.measure
        print(json.dumps(MEASURES[kind](Path(data), Path(tok))))
        return
    if args.bad_records:
        bad_records(args.bad_records)
        return

    sys.path.insert(0, str(HERE))
    import data as bench_data

    started = time.perf_counter()
    full = bench_data.partition(args.tokenizer, args.records, tuple(args.words))
    quarter = bench_data.head(full, args.records // 4)
    tok = bench_data.tokenizer_dir(args.tokenizer)
    print(f"data: {full} ({(full / 'raw_responses.jsonl').stat().st_size / 1e6:.0f} MB), "
          f"ready in {time.perf_counter() - started:.1f} s", flush=True)
    rules = full.parent / "no-rtr001.toml"
    rules.write_text('select = ["ALL"]\nignore = ["RTR001"]\n')

    data_file = full / "raw_responses.jsonl"
    rows: dict[str, dict] = {}
    plan = [
        ("parse floor (orjson)", lambda: in_process("parse", data_file, tok)),
        ("naive audit (json + list scans)", lambda: in_process("naive", data_file, tok)),
    ]
    if not args.skip_round_trip:
        plan.append(("round trip (tokenizers)", lambda: in_process("roundtrip", data_file, tok)))
    plan += [
        ("audit check, all rules", lambda: audit_check(full)),
        ("audit check, without RTR001", lambda: audit_check(full, "--rules", str(rules))),
    ]
    if args.jobs:
        plan.append((f"audit check --jobs {args.jobs}", lambda: audit_check(full, "--jobs", str(args.jobs))))
    plan.append((f"audit check, {args.records // 4} records", lambda: audit_check(quarter)))
    for name, run in plan:
        rows[name] = run()
        _log(name, rows[name])
    records, ids = rows["parse floor (orjson)"]["records"], rows["parse floor (orjson)"]["ids"]

    print(f"\n{records:,} records, {ids:,} token ids (prompt + output)\n")
    print(f"{'what':40s} {'seconds':>8s} {'records/s':>10s} {'M ids/s':>8s} {'peak RSS':>9s}")
    for name, row in rows.items():
        n, m = (records, ids) if "records" not in name.split(",")[-1] else (records // 4, None)
        speed = f"{m / row['seconds'] / 1e6:8.2f}" if m else f"{'':8s}"
        print(f"{name:40s} {row['seconds']:8.2f} {n / row['seconds']:10,.0f} {speed} "
              f"{row['rss_kib'] / 1024:7.0f} MB")

    check = rows["audit check, all rules"]["seconds"]
    no_rtr = rows["audit check, without RTR001"]["seconds"]
    naive = rows["naive audit (json + list scans)"]["seconds"]
    floor = rows["parse floor (orjson)"]["seconds"]
    print("\nratios (judged: the first three)")
    if "round trip (tokenizers)" in rows:
        bare = rows["round trip (tokenizers)"]["seconds"]
        print(f"  full check / bare round trip            {check / bare:6.2f}   (<= 1.2)")
        print(f"  full check / (naive + bare round trip)  {check / (naive + bare):6.2f}   (<= 1.0)")
    small = rows[f"audit check, {args.records // 4} records"]["rss_kib"]
    print(f"  peak RSS {args.records} / {args.records // 4} records"
          f"{'':{max(1, 18 - 2 * len(str(args.records)))}s}{rows['audit check, all rules']['rss_kib'] / small:6.2f}   (< 2.0)")
    print(f"  naive audit / check without RTR001      {naive / no_rtr:6.2f}   (>= 5, target)")
    print(f"  check without RTR001 / parse floor      {no_rtr / floor:6.2f}   (<= 1.5, target)")
    found = rows["audit check, all rules"]
    print(f"\ncheck found {found['findings']} findings, {found['records_with_errors']} records with errors")


if __name__ == "__main__":
    main()

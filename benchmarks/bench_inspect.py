"""How long `audit inspect --print` takes on one very long record, and how much it prints.

    python benchmarks/bench_inspect.py                      # a 2,000,000-id output, 3 runs
    python benchmarks/bench_inspect.py --ids 500000 --runs 1 --all-tokens

Writes a partition of one record (the fixture Kimi-K2.5 tokenizer, a clean prompt from the
shipped samples) whose output repeats a short reasoning to `--ids` ids, a `</think>` a quarter of the
way and a second one in the middle (a SEG002 finding there), then runs `audit inspect PARTITION --print`
in a fresh process, with a cold audit cache so the audit itself is timed too. Prints the
fastest run's seconds, the lines printed, and, separately, the seconds of building the record's
view (`Inspector.view`) and of rendering its lines once the audit is done.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TOKENIZER = ROOT / "fixtures" / "tokenizers" / "kimi-k2.5-mini"
PREPARED = ROOT / "fixtures" / "prepared"


def write_partition(directory: Path, ids: int) -> Path:
    """A partition whose one record has an output of `ids` ids, a second </think> mid-way."""
    from audit.model.tokens.tokenizer_loading import load_tokenizer

    tokenizer = load_tokenizer(TOKENIZER)
    clean = json.loads((PREPARED / "B0_clean" / "raw_responses.jsonl").read_text().splitlines()[0])
    words = tokenizer.encode_text(" the user wants the weather")
    think_end, end_of_turn = tokenizer.token_id("</think>"), tokenizer.token_id("<|im_end|>")
    answer = tokenizer.encode_text("It is sunny.")
    body = ids - len(answer) - 3
    reasoning = (words * (body // len(words) + 1))[:body]
    quarter, half = body // 4, body // 2
    output = reasoning[:quarter] + [think_end] + reasoning[quarter:half] + [think_end] + reasoning[half:]
    output += answer + [end_of_turn]
    record = {
        "id": "long-0001",
        "input_ids": clean["input_ids"],
        "output_ids": output,
        "meta_info": {"finish_reason": {"type": "stop", "matched": end_of_turn}},
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "raw_responses.jsonl").write_text(json.dumps(record) + "\n")
    (directory / "generation.json").write_text(
        json.dumps({"profile": "kimi-k2.5", "tokenizer": {"path": str(TOKENIZER)}, "thinking": True})
    )
    return directory


def run_cli(partition: Path, extra: list[str]) -> tuple[float, int, int]:
    """(seconds, lines printed, exit code) of `audit inspect PARTITION --print` in a fresh process."""
    with tempfile.TemporaryDirectory() as cache:  # a cold cache: the audit is timed too
        env = {**os.environ, "PYTHONPATH": str(ROOT), "AUDIT_CACHE_DIR": cache, "COLUMNS": "200"}
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "audit", "inspect", str(partition), "--print", *extra],
            env=env, capture_output=True, check=False,
        )
        seconds = time.perf_counter() - started
    return seconds, done.stdout.count(b"\n"), done.returncode


def time_view(partition: Path, all_tokens: bool) -> tuple[float, float, int]:
    """(seconds to build the view, seconds to render every line, lines) in this process."""
    from audit.flows.checking import check_session
    from audit.flows.session import CheckOptions, prepare
    from audit.flows.targets import resolve_target
    from audit.flows.token_view import Inspector
    from audit.tui.detail import DetailLines

    session = prepare(resolve_target(str(partition), partition.parent), CheckOptions())
    report = check_session(session)
    inspector = Inspector(session.target.data_file, report.findings, session.profile, session.tokenizer,
                          all_tokens=all_tokens)
    started = time.perf_counter()
    view = inspector.view(1)
    built = time.perf_counter() - started
    started = time.perf_counter()
    lines = sum(1 for _ in DetailLines(view))
    return built, time.perf_counter() - started, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ids", type=int, default=2_000_000, help="output ids of the record")
    parser.add_argument("--runs", type=int, default=3, help="runs of the command; the fastest is kept")
    parser.add_argument("--all-tokens", action="store_true", help="time `--all-tokens` (every token printed)")
    args = parser.parse_args()
    extra = ["--all-tokens"] if args.all_tokens else []
    with tempfile.TemporaryDirectory() as directory:
        partition = write_partition(Path(directory) / "long", args.ids)
        size = (partition / "raw_responses.jsonl").stat().st_size
        print(f"record: {args.ids:,} output ids, {size / 1e6:.1f} MB line")
        runs = [run_cli(partition, extra) for _ in range(args.runs)]
        seconds, lines, code = min(runs)
        print(f"audit inspect --print{' --all-tokens' if extra else ''}: {seconds:.2f} s "
              f"(fastest of {args.runs}), {lines:,} lines printed, exit {code}")
        built, rendered, rows = time_view(partition, args.all_tokens)
        print(f"the view alone: built in {built:.2f} s, {rows:,} lines rendered in {rendered:.2f} s")


if __name__ == "__main__":
    main()

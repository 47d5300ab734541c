"""How long `audit generate` takes when one of its servers is dead, against the live one alone.

    python benchmarks/bench_generate.py                     # 200 prompts, 3 runs of each
    python benchmarks/bench_generate.py --prompts 400 --delay 0.02 --runs 5

Runs the generator's core (no CLI) against the stand-in SGLang server of the tests
(`tests/sglang_standin.py`) on loopback: once with the live server alone, once with a dead one
(a loopback port nobody listens on: connections are refused) named first beside it. Each
request takes `--delay` seconds on the live server, so the run time is set by the server, not
by start-up. Prints the median run time of each, the ratio, and the retries each run needed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from audit.generate import GenerateOptions, Generator, plan_generation  # noqa: E402
from tests.sglang_standin import SGLangStandin  # noqa: E402

TOKENIZER = ROOT / "fixtures" / "tokenizers" / "kimi-k2.5-mini"


def dead_url() -> str:
    """A loopback URL that refuses connections: a port bound, then released."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def write_prompts(path: Path, n: int) -> Path:
    with path.open("w") as out:
        for i in range(n):
            messages = [{"role": "user", "content": f"What is {i} times {i + 3}?"}]
            out.write(json.dumps({"id": i, "messages": messages}) + "\n")
    return path


def run_once(prompts: Path, servers: tuple[str, ...], concurrency: int) -> tuple[float, int, int]:
    """(seconds for the run, retries, prompts written), plan excluded."""
    with tempfile.TemporaryDirectory() as directory:
        options = GenerateOptions(
            prompts=prompts,
            out=Path(directory) / "raw_responses.jsonl",
            servers=servers,
            tokenizer=TOKENIZER,
            profile="kimi-k2.5",
            canary=0,
            concurrency=concurrency,
        )
        plan = plan_generation(options)
        started = time.perf_counter()
        result = asyncio.run(Generator(plan).run())
        return time.perf_counter() - started, result.stats.retries, result.stats.written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--delay", type=float, default=0.02, help="seconds per request")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory, SGLangStandin(
        TOKENIZER, delay=arguments.delay
    ) as live:
        prompts = write_prompts(Path(directory) / "prompts.jsonl", arguments.prompts)
        print(
            f"{arguments.prompts} prompts, {arguments.delay} s per request, "
            f"concurrency {arguments.concurrency}, median of {arguments.runs} runs"
        )
        medians = {}
        for label, servers in (("live only", (live.url,)), ("dead + live", (dead_url(), live.url))):
            runs = [run_once(prompts, servers, arguments.concurrency) for _ in range(arguments.runs)]
            seconds = statistics.median(r[0] for r in runs)
            medians[label] = seconds
            retries = [r[1] for r in runs]
            written = {r[2] for r in runs}
            print(f"{label:<12} {seconds:7.2f} s   retries {retries}   written {sorted(written)}")
        print(f"ratio dead+live / live only: {medians['dead + live'] / medians['live only']:.2f}")


if __name__ == "__main__":
    main()

"""Shards of a file for the executors (`--jobs`, `--engine ray`): cut at line boundaries, each
numbered by the physical line it starts at, covering the file exactly, hashed on the way."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.flows import parallel, workers
from audit.flows.parallel import iter_shards, plan_shards
from audit.records.sources import InputDigest
from tests.conftest import PREPARED, ROOT


@pytest.fixture
def monkeypatch_read():
    """Set the read size of the shard planner (restored after the test)."""
    saved = parallel._READ_BYTES

    def set_read(size: int) -> None:
        parallel._READ_BYTES = size

    yield set_read
    parallel._READ_BYTES = saved


# The fixture only sets a module value each example sets again: safe to share across examples.
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(st.binary(max_size=50).map(lambda b: b.replace(b"\n", b"")), max_size=60),
    last_newline=st.booleans(),
    shards=st.integers(1, 40),
    min_shard_bytes=st.integers(1, 300),
    read_bytes=st.sampled_from([1, 2, 7, 64, 1 << 20]),
)
def test_shards_cover_the_file_at_line_starts_with_their_line_numbers(
    tmp_path_factory, monkeypatch_read, lines, last_newline, shards, min_shard_bytes, read_bytes
):
    data = b"\n".join(lines) + (b"\n" if last_newline and lines else b"")
    path = tmp_path_factory.mktemp("shards") / "data.jsonl"
    path.write_bytes(data)
    monkeypatch_read(read_bytes)  # the cut found wherever the reads end
    plan, sha256, size = plan_shards(path, shards, min_shard_bytes=min_shard_bytes)

    assert (sha256, size) == (hashlib.sha256(data).hexdigest(), len(data))
    assert plan[0].start == 0 and plan[-1].end == len(data)
    assert all(a.end == b.start and a.start < a.end for a, b in zip(plan, plan[1:], strict=False))
    assert len(plan) <= max(1, min(shards, len(data) // min_shard_bytes))
    for shard in plan:
        assert shard.start == 0 or data[shard.start - 1 : shard.start] == b"\n"  # a line start
        assert shard.first_line == data[: shard.start].count(b"\n") + 1
    # the shard ends are where the streamed read yields them: the same plan, shard by shard
    assert list(iter_shards(path, shards, min_shard_bytes=min_shard_bytes, digest=InputDigest())) == plan


def test_shards_are_yielded_before_the_read_reaches_the_end(tmp_path, monkeypatch_read):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"".join(b'{"id": %d}\n' % i for i in range(10_000)))
    monkeypatch_read(4096)
    digest = InputDigest()
    shards = iter_shards(path, 10, min_shard_bytes=1, digest=digest)
    first = next(shards)
    assert first.start == 0 and digest.bytes < path.stat().st_size / 5  # the read has just begun
    assert len([first, *shards]) == 10 and digest.bytes == path.stat().st_size


@pytest.mark.parametrize(
    ("args", "started"),
    [
        (["check", "B1_glaive", "--jobs", "3"], 2),
        (["check", "--jobs=2", "B1_glaive"], 1),
        (["check", "-j", "2", "B1_glaive"], 1),
        (["check", "-j4", "B1_glaive"], 3),
        (["check", "B1_glaive", "--jobs", "1"], None),
        (["check", "B1_glaive"], None),
        (["check", "B1_glaive", "--jobs"], None),
        (["check", "B1_glaive", "--jobs", "many"], None),
        (["check", "--", "--jobs", "2"], None),
        (["check", "B1_glaive", "--jobs", "2", "--engine", "ray"], None),
        (["gate", "B1_glaive", "out", "--jobs", "2"], None),
        ([], None),
    ],
)
def test_the_program_starts_the_workers_a_check_line_asks_for_before_loading_the_command(
    monkeypatch, args, started
) -> None:
    """`audit check --jobs N` starts N-1 workers before the command's modules load; any other
    line starts none (and the command reads its own line as always)."""
    asked, shared = [], []
    monkeypatch.setattr(workers, "worker_pool", asked.append)
    monkeypatch.setattr(workers, "take_share_of_cores", shared.append)
    workers.start_for_command_line(args)
    assert asked == ([] if started is None else [started])
    assert shared == ([] if started is None else [started + 1])


def test_with_workers_this_process_takes_its_share_of_the_cores(monkeypatch) -> None:
    """Before polars loads, `--jobs N` sizes this process's thread pools as the workers' (a
    user's own setting kept); once polars is loaded nothing changes."""
    monkeypatch.setattr(workers.os, "cpu_count", lambda: 8)
    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")
    monkeypatch.delitem(sys.modules, "polars")
    workers.take_share_of_cores(4)
    assert os.environ["POLARS_MAX_THREADS"] == "2" and os.environ["RAYON_NUM_THREADS"] == "3"
    monkeypatch.undo()
    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    workers.take_share_of_cores(4)  # polars is loaded here
    assert "POLARS_MAX_THREADS" not in os.environ


_EARLY_THEN_COMMAND = """
import atexit, json, sys
import audit.flows.workers as workers
from audit.__main__ import main
pools = []
real = workers.worker_pool
workers.worker_pool = lambda n: pools.append(real(n)) or pools[-1]
# Registered after the pool's own exit handler: runs before it, when the command is done.
atexit.register(lambda: print(json.dumps({"pools": len({id(p) for p in pools}), "calls": len(pools)})))
main()
"""


def test_the_workers_started_early_are_the_ones_the_check_uses(tmp_path) -> None:
    """The pool the program starts before loading the command is the pool the command audits
    with (the same environment, so not started again), and the result is the usual one."""
    report = tmp_path / "report.json"
    args = ["check", str(PREPARED / "B1_glaive"), "--jobs", "2", "--report", str(report), "--format", "json"]
    # The environment a user has: none of the settings audit makes for itself.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_", "_RJEM"))}
    run = subprocess.run(
        [sys.executable, "-c", _EARLY_THEN_COMMAND, *args], capture_output=True, text=True, cwd=ROOT, env=env,
        timeout=300, check=False,
    )
    outcome = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 1, run.stderr
    assert outcome["pools"] == 1 and outcome["calls"] >= 2, run.stderr
    assert json.loads(report.read_text())["summary"]["records"] > 0


def test_a_worker_is_given_its_next_shard_only_once_it_has_finished_the_last() -> None:
    """The hand-out keeps every shard no process has begun where this process can still take
    it: a worker holds one shard at a time (a shard queued in a worker could not be taken back,
    and this process would idle at the end of the file while the worker audits it)."""
    from concurrent.futures import Future

    submitted: list[tuple[int, Future]] = []

    def submit(index: int) -> Future:
        future: Future = Future()
        future.set_running_or_notify_cancel()
        submitted.append((index, future))
        return future

    handout = parallel._Handout(submit, workers=1)
    for index in range(5):
        handout.add(index)
    assert [i for i, _ in submitted] == [0]  # the worker's first shard; the others wait
    assert handout.take_last() == 4  # this process takes from the end
    submitted[0][1].set_result("shard 0")  # the worker came free: it is given the next
    assert [i for i, _ in submitted] == [0, 1]
    assert handout.take_last() == 3 and handout.take_last() == 2
    submitted[1][1].set_result("shard 1")
    assert handout.take_last() is None and len(submitted) == 2  # nothing left to give
    assert set(handout.given().values()) == {0, 1}


def test_a_pool_that_cannot_take_a_shard_leaves_it_to_this_process() -> None:
    def broken(index: int):
        raise RuntimeError("the pool is broken")

    handout = parallel._Handout(broken, workers=2)
    handout.add(0)
    handout.add(1)
    assert handout.given() == {}
    assert [handout.take_last(), handout.take_last(), handout.take_last()] == [1, 0, None]

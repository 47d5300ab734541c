"""Shards of a file for the executors (`--jobs`, `--engine ray`): cut at line boundaries, each
numbered by the physical line it starts at, covering the file exactly, hashed on the way."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import audit.parallel as parallel
from audit.parallel import iter_shards, plan_shards
from audit.sources import InputDigest


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

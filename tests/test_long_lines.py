"""A line longer than a line may be is skipped unread: one finding with its size, the lines after it
numbered as before, and time and memory linear in the input, from every source."""

from __future__ import annotations

import hashlib
import json
import time
import tracemalloc
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.flows.checking import check_session
from audit.flows.gating import gate_session, iter_quarantine
from audit.flows.session import CheckOptions, prepare
from audit.flows.targets import resolve_target
from audit.flows.token_view import Inspector
from audit.records import sources
from audit.records.reader import parse_block
from audit.records.record_lines import LONG_LINE_HEAD
from audit.records.sources import (
    GrowingFile,
    InputDigest,
    LongLine,
    chunk_blocks,
    file_blocks,
    memory_blocks,
)
from tests.conftest import KIMI_TOKENIZER, PREPARED

LIMIT = 1 << 20  # the maximum the tests put in place of 64 MiB
GOOD = (PREPARED / "B0_clean" / "raw_responses.jsonl").read_bytes().splitlines()[:3]


@pytest.fixture
def small_limit(monkeypatch):
    monkeypatch.setattr(sources, "MAX_LINE_BYTES", LIMIT)


def lines_of(blocks) -> list[tuple[int, bytes | LongLine]]:
    """(line number, its bytes or its LongLine) of every line the blocks give."""
    return [
        (number, block.long_lines.get(number, raw))
        for block in blocks
        for number, raw in enumerate(block.lines, block.first_line)
    ]


def expected(data: bytes, limit: int, start: int = 0) -> list[tuple[int, bytes | LongLine]]:
    rows, offset = [], start
    pieces = data.split(b"\n")
    if pieces[-1] == b"":
        pieces.pop()
    for number, raw in enumerate(pieces, 1):
        rows.append((number, LongLine(offset, len(raw)) if len(raw) > limit else raw))
        offset += len(raw) + 1
    return rows


@settings(max_examples=200, deadline=None)
@given(
    data=st.lists(st.sampled_from([b"a", b"bb", b"\n", b"ccccccccc", b"\r"]), max_size=60).map(b"".join),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=10),
    limit=st.integers(min_value=1, max_value=12),
)
def test_any_chunking_skips_the_same_long_lines_and_numbers_the_rest(data, cuts, limit):
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in pairwise(points)]
    digest = InputDigest()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sources, "MAX_LINE_BYTES", limit)
        blocks = list(chunk_blocks(chunks, digest=digest, start=7))
    assert lines_of(blocks) == expected(data, limit, start=7)
    assert digest.sha256 == hashlib.sha256(data).hexdigest()  # every byte, skipped or not
    assert sum(block.nbytes for block in blocks) == len(data)


def test_a_long_line_is_one_finding_with_its_size_and_the_next_lines_keep_their_numbers(small_limit):
    long = b'{"id": "' + b"x" * (3 * LIMIT) + b'"}'
    data = b"\n".join([GOOD[0], long, GOOD[1], b"{not json", b"", GOOD[2], b"\0" * (2 * LIMIT)])
    [block] = memory_blocks(data.split(b"\n"))  # one chunk, over the limit: lines inside it too
    parsed = parse_block(block)
    assert parsed.records["line"].to_list() == [1, 3, 6]
    reasons = {item.line: item.reason for item in parsed.rejected}
    assert reasons[2].startswith(f"a line of {len(long):,} bytes, over the {LIMIT:,} bytes")
    assert "not valid JSON" in reasons[4]
    assert f"a line of {2 * LIMIT:,} bytes" in reasons[7]  # memory_blocks ends every line
    assert parsed.blank_lines == 1


def test_a_line_in_many_chunks_is_joined_once_in_linear_time():
    # 16 MiB in 16,384 chunks: joining the carried part again for every chunk copies ~128 GiB
    # (minutes); joined once at its newline, it is a few milliseconds.
    piece = b"7" * 1024
    chunks = [piece] * 16_384 + [b"\n"]
    started = time.perf_counter()
    [(line, raw)] = lines_of(chunk_blocks(chunks))
    assert time.perf_counter() - started < 3
    assert line == 1 and len(raw) == 16 << 20


def test_a_long_line_is_never_held(small_limit):
    chunk = bytes(LIMIT)

    def stream():  # 64 MiB of zeros with no newline, then a record on line 2
        for _ in range(64):
            yield chunk
        yield b"\n" + GOOD[0] + b"\n"

    tracemalloc.start()
    try:
        blocks = list(chunk_blocks(stream()))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * LIMIT  # a chunk, its split and the limit: never the line
    assert lines_of(blocks) == [(1, LongLine(0, 64 * LIMIT)), (2, GOOD[0])]


def test_a_growing_file_skips_a_long_line_once_its_newline_comes(tmp_path, small_limit):
    path = tmp_path / "raw.jsonl"
    path.write_bytes(GOOD[0] + b"\n")
    source = GrowingFile(path, block_bytes=LIMIT // 4)
    seen = lines_of(source.new_blocks())
    for _ in range(3):  # the long line arrives over several looks
        with path.open("ab") as out:
            out.write(b"z" * LIMIT)
        seen += lines_of(source.new_blocks())
        assert source.pending == path.stat().st_size - source.offset
    with path.open("ab") as out:
        out.write(b"\n" + GOOD[1] + b"\n")
    seen += lines_of(source.new_blocks())
    assert seen == [(1, GOOD[0]), (2, LongLine(len(GOOD[0]) + 1, 3 * LIMIT)), (3, GOOD[1])]


def test_a_file_range_gives_long_lines_their_offsets_in_the_file(tmp_path, small_limit):
    path = tmp_path / "raw.jsonl"
    head = GOOD[0] + b"\n"
    path.write_bytes(head + b"y" * (LIMIT + 1) + b"\n" + GOOD[1] + b"\n")
    blocks = file_blocks(path, start=len(head), first_line=2, block_bytes=4096)
    assert lines_of(blocks) == [(2, LongLine(len(head), LIMIT + 1)), (3, GOOD[1])]


@pytest.fixture
def long_partition(tmp_path) -> Path:
    """Records around a line over the limit, and a file ending in zeros with no newline."""
    path = tmp_path / "raw_responses.jsonl"
    path.write_bytes(
        b"\n".join([GOOD[0], b'{"id": "' + b"x" * (3 * LIMIT) + b'"}', GOOD[1], b"", GOOD[2]])
        + b"\n"
        + bytes(5 * LIMIT // 2)
    )
    return path


def options(**extra) -> CheckOptions:
    return CheckOptions(profile="kimi-k2.5", tokenizer=KIMI_TOKENIZER, cache=False, block_bytes=LIMIT // 8, **extra)


def test_check_and_gate_report_a_long_line_and_lose_no_record(long_partition, tmp_path, small_limit):
    session = prepare(resolve_target(str(long_partition), PREPARED), options())
    report = check_session(session)
    found = report.log.collect().filter(rule="INT001").sort("line")
    assert found["line"].to_list() == [2, 6]
    second, last = found["message"].to_list()
    assert second.startswith(f"a line of {3 * LIMIT + 10:,} bytes, over the {LIMIT:,} bytes a line may have")
    assert last.startswith(f"a line of {5 * LIMIT // 2:,} bytes with no newline")
    assert report.input["sha256"] == hashlib.sha256(long_partition.read_bytes()).hexdigest()

    out = tmp_path / "gated"
    gated = gate_session(prepare(resolve_target(str(long_partition), PREPARED), options()), out)
    assert (out / "clean.jsonl").read_bytes() == b"".join(line + b"\n" for line in GOOD)
    entries = list(iter_quarantine(out / "quarantine.jsonl"))
    assert [e["line"] for e in entries] == [2, 6]
    offset = len(GOOD[0]) + 1
    assert entries[0]["raw_omitted"] == {"offset": offset, "bytes": 3 * LIMIT + 10}
    assert entries[1]["raw_omitted"]["bytes"] == 5 * LIMIT // 2 and entries[1]["raw_bytes"] is None
    data = long_partition.read_bytes()
    assert data[offset : offset + 3 * LIMIT + 10].startswith(b'{"id": "xxx')  # where the entry says
    assert gated.manifest["counts"] == {"in": 5, "clean": 3, "quarantined": 2}
    assert gated.manifest["input"]["lines"] == 6 and gated.manifest["input"]["blank_lines"] == 1


def test_a_rule_set_that_keeps_unreadable_lines_gets_a_long_line_in_clean_whole(long_partition, tmp_path, small_limit):
    rules = tmp_path / "rules.toml"
    rules.write_text('[rules.INT001]\nseverity = "warning"\n')
    out = tmp_path / "gated"
    gated = gate_session(prepare(resolve_target(str(long_partition), PREPARED), options(rules=rules)), out)
    data = long_partition.read_bytes()
    expected_clean = b"".join(line + b"\n" for line in data.split(b"\n") if line.strip())
    assert gated.manifest["counts"]["quarantined"] == 0
    assert hashlib.sha256((out / "clean.jsonl").read_bytes()).digest() == hashlib.sha256(expected_clean).digest()
    assert json.loads((out / "manifest.json").read_text())["counts"]["clean"] == 5


def test_inspect_shows_a_long_line_by_its_head_and_size_and_finds_ids_past_it(long_partition, small_limit):
    session = prepare(resolve_target(str(long_partition), PREPARED), options())
    report = check_session(session)
    inspector = Inspector(session.target.data_file, report.findings, session.profile, session.tokenizer)
    assert len(inspector.index.read(2)) == LONG_LINE_HEAD  # never the line itself
    view = inspector.view(2)
    assert view.problem.startswith(f"a line of {3 * LIMIT + 10:,} bytes, over the {LIMIT:,} bytes")
    assert view.raw_excerpt.startswith('{"id": "xxx') and view.raw_excerpt.endswith(f"({3 * LIMIT + 10} bytes)")
    third = json.loads(GOOD[2])["id"]
    assert inspector.line_of_id(str(third)) == 5  # read past the long line, and numbered right


def test_a_sparse_file_of_zeros_past_the_real_limit_is_one_finding_for_check_and_gate(tmp_path):
    path = tmp_path / "preallocated.jsonl"
    path.write_bytes(GOOD[0] + b"\n")
    with path.open("r+b") as handle:  # what a crash with preallocated space leaves: zeros, no newline
        handle.truncate(len(GOOD[0]) + 1 + sources.MAX_LINE_BYTES + 1)
    session = prepare(resolve_target(str(path), PREPARED), CheckOptions(profile="kimi-k2.5", tokenizer=KIMI_TOKENIZER, cache=False))
    found = check_session(session).log.collect()
    assert found.select("line", "rule").rows() == [(2, "INT001")]
    assert f"a line of {sources.MAX_LINE_BYTES + 1:,} bytes with no newline" in found["message"][0]
    gated = gate_session(session, tmp_path / "gated")
    assert gated.manifest["counts"] == {"in": 2, "clean": 1, "quarantined": 1}

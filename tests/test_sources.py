"""Sources of line blocks: however the bytes arrive, every line comes once, with its number."""

from __future__ import annotations

import gc
import hashlib
import inspect
from itertools import pairwise
from pathlib import Path

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.engine.runner import audit_blocks, audit_file, audit_input, join_shards
from audit.records.reader import parse_block
from audit.records.sources import (
    MAX_BLOCK_LINES,
    GrowingFile,
    InputDigest,
    chunk_blocks,
    file_blocks,
    file_chunks,
    memory_blocks,
)
from tests.conftest import PREPARED

B1 = PREPARED / "B1_glaive" / "raw_responses.jsonl"


def numbered(blocks) -> list[tuple[int, bytes, bool]]:
    return [
        (block.first_line + i, line, block.last_unterminated and i == len(block.lines) - 1)
        for block in blocks
        for i, line in enumerate(block.lines)
    ]


def expected(data: bytes, first_line: int = 1) -> list[tuple[int, bytes, bool]]:
    lines = data.split(b"\n")
    last = lines.pop()  # after the last newline: a line only when not empty
    rows = [(first_line + i, line, False) for i, line in enumerate(lines)]
    if last:
        rows.append((first_line + len(lines), last, True))
    return rows


@settings(max_examples=200, deadline=None)
@given(
    data=st.binary(max_size=400),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
    first_line=st.integers(min_value=1, max_value=10**6),
)
def test_any_chunking_gives_the_same_numbered_lines(data: bytes, cuts: list[int], first_line: int):
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in pairwise(points)]
    digest = InputDigest()
    assert numbered(chunk_blocks(chunks, first_line=first_line, digest=digest)) == expected(
        data, first_line
    )
    assert digest.sha256 == hashlib.sha256(data).hexdigest() and digest.bytes == len(data)


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=300), block_bytes=st.integers(min_value=1, max_value=64))
def test_a_file_and_its_byte_blocks_account_for_every_byte(
    tmp_path_factory, data: bytes, block_bytes: int
):
    path = tmp_path_factory.mktemp("source") / "raw.jsonl"
    path.write_bytes(data)
    blocks = list(file_blocks(path, block_bytes=block_bytes))
    assert numbered(blocks) == expected(data)
    assert sum(block.nbytes for block in blocks) == len(data)


def test_blocks_are_cut_by_line_count_too() -> None:
    data = b"x\n" * (MAX_BLOCK_LINES + 3)
    blocks = list(chunk_blocks([data]))
    assert [len(b.lines) for b in blocks] == [MAX_BLOCK_LINES, 3]
    assert blocks[1].first_line == MAX_BLOCK_LINES + 1


def test_lines_in_memory_are_numbered_from_their_first_line() -> None:
    blocks = list(memory_blocks([b'{"a": 1}\n', b'{"b": 2}'], first_line=41))
    assert numbered(blocks) == [(41, b'{"a": 1}', False), (42, b'{"b": 2}', False)]
    assert list(memory_blocks([])) == []


def test_a_block_being_audited_holds_the_only_reference_to_its_bytes(tmp_path: Path) -> None:
    # The file reader kept each chunk while its block was audited and the next one read: a
    # block's worth of memory more at the peak.
    path = tmp_path / "raw.jsonl"
    path.write_bytes(b'{"id": "a"}\n' * 4000)
    chunks = file_chunks(path, chunk_bytes=1 << 14)
    chunk = next(chunks)
    assert not [holder for holder in gc.get_referrers(chunk) if inspect.isgenerator(holder)]
    blocks = file_blocks(path, block_bytes=1 << 14)
    block = next(blocks)
    for index in range(50):
        assert gc.get_referrers(block.lines[index]) == [block.lines]


def test_the_engine_reading_lets_each_line_go_once_it_is_parsed() -> None:
    (block,) = chunk_blocks([PREPARED.joinpath("B1_glaive", "raw_responses.jsonl").read_bytes()])
    count, size = len(block.lines), block.nbytes
    kept = parse_block(block)
    assert block.nbytes == size  # a plain reading leaves the block as it was
    consumed = parse_block(block, consume=True)
    assert consumed.records.equals(kept.records) and consumed.rejected == kept.rejected
    assert len(block.lines) == count and block.last_line == count  # the numbering stays
    assert all(not line.strip() for line in block.lines)  # read lines gone; blank ones were never records


def test_record_lines_skip_blank_lines_as_the_reader_does() -> None:
    (block,) = chunk_blocks([b"a\n \n\r\nb\n"], first_line=7)
    assert list(block.record_lines()) == [(7, b"a"), (10, b"b")]


def test_a_growing_file_gives_each_whole_line_once(tmp_path: Path) -> None:
    path = tmp_path / "raw.jsonl"
    path.write_bytes(b"")
    source = GrowingFile(path, block_bytes=4)
    seen: list[tuple[int, bytes, bool]] = []
    for piece in (b"one\ntw", b"o\n", b"", b"three\nfo", b"ur\n"):
        with path.open("ab") as out:
            out.write(piece)
        seen += numbered(source.new_blocks())
        assert source.pending == len(path.read_bytes()) - source.offset
    assert seen == [
        (1, b"one", False),
        (2, b"two", False),
        (3, b"three", False),
        (4, b"four", False),
    ]
    path.write_bytes(b"new\n")  # replaced by a shorter file: read again from its start
    assert numbered(source.new_blocks()) == [(1, b"new", False)] and source.restarted


def test_the_engine_finds_the_same_over_any_source(
    kimi_context, default_rules, tmp_path: Path
) -> None:
    """A file audited whole, in two byte ranges joined, and from memory: the same findings."""
    whole = audit_file(B1, kimi_context, default_rules)
    data = B1.read_bytes()
    middle = data.index(b"\n", len(data) // 2) + 1
    first_line_after = data[:middle].count(b"\n") + 1
    halves = [
        audit_blocks(file_blocks(B1, end=middle), kimi_context, default_rules),
        audit_blocks(
            file_blocks(B1, start=middle, first_line=first_line_after), kimi_context, default_rules
        ),
    ]
    joined = join_shards(
        halves, default_rules, path=B1, sha256=whole.sha256, size=whole.bytes, started=0.0
    )
    digest = InputDigest()
    lines = [line + b"\n" for line in data.split(b"\n")[:-1]]  # B1 ends with a newline
    in_memory = audit_input(
        memory_blocks(lines, digest=digest), digest, kimi_context, default_rules, path=B1
    )
    assert {"INT001", "INT004"} <= set(
        whole.findings["rule"]
    )  # a file-level rule across the halves
    for other in (joined, in_memory):
        assert other.findings.equals(whole.findings)
        assert other.records == whole.records and other.lines == whole.lines
        assert other.stats.equals(whole.stats)
    assert in_memory.sha256 == whole.sha256 == hashlib.sha256(data).hexdigest()
    assert isinstance(whole.findings, pl.DataFrame)

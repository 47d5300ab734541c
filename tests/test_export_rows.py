"""The export's pieces against plain Python: reading the judged lines again gives the strict
reader's values, and the samples and the length policy are what a list-by-list reading says."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.flows.export_rows import LengthTally, MaskOptions, apply_length_policy, build_samples
from audit.records.reader import parse_block
from audit.records.sample_reading import SAMPLE_FIELDS, NotAccepted, read_sample_fields
from audit.records.sources import memory_blocks

token_ids = st.lists(st.integers(0, 2**32 - 1), max_size=12)
finish = st.one_of(
    st.none(),
    st.fixed_dictionaries({"type": st.sampled_from(["stop", "length", "abort"])}),
)


@st.composite
def records(draw) -> dict:
    record: dict = {}
    if draw(st.booleans()):
        record["id"] = draw(st.one_of(st.text(max_size=8), st.integers(-(2**40), 2**40)))
    prompt = draw(token_ids)
    key = draw(st.sampled_from(["input_ids", "prompt_ids", "both"]))
    if key == "both":
        record["input_ids"] = record["prompt_ids"] = prompt
    else:
        record[key] = prompt
    record["output_ids"] = draw(token_ids)
    reason = draw(finish)
    if reason is not None:
        record["meta_info"] = {"finish_reason": reason, "completion_tokens": len(record["output_ids"])}
    if draw(st.booleans()):
        record["text"] = draw(st.text(max_size=10))
        record["messages"] = [{"role": "user", "content": draw(st.text(max_size=5))}]
    return record


def line(record: dict, spaced: bool) -> bytes:
    return json.dumps(record, separators=(", ", ": ") if spaced else (",", ":")).encode()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(records(), st.booleans()), min_size=1, max_size=6), st.data())
def test_sample_fields_read_again_are_the_strict_readers(drawn, data) -> None:
    lines = [line(record, spaced) for record, spaced in drawn]
    block = next(memory_blocks(lines))
    strict = parse_block(block, keep_source=False)
    assert strict.rejected == []
    skip = data.draw(st.sets(st.integers(1, len(lines))))
    expected = strict.records.filter(~pl.col("line").is_in(sorted(skip))).select(list(SAMPLE_FIELDS))
    assert read_sample_fields(block, skip).equals(expected)


@pytest.mark.parametrize(
    "text",
    [
        b'{"input_ids":[1,-2],"output_ids":[3]}',
        b'{"input_ids":[1,true],"output_ids":[3]}',
        b'{"input_ids":[1,2.5],"output_ids":[3]}',
        b'{"input_ids":[1],"output_ids":[4294967296]}',
        b'{"input_ids":"1,2","output_ids":[3]}',
        b'{"input_ids":[[1,2]],"output_ids":[3]}',
        b'[1,2]',
        b'{"id":1.5,"input_ids":[1],"output_ids":[3]}',
        b'{"id":null,"input_ids":[1],"output_ids":[3]}',
        b'{"input_ids":[1],"output_ids":[3],"meta_info":{"finish_reason":"stop"}}',
        b'{"input_ids":[1],"output_ids":[3],"meta_info":{"finish_reason":{"type":1}}}',
    ],
)
def test_a_line_the_strict_reader_refuses_is_not_read_again(text: bytes) -> None:
    block = next(memory_blocks([text]))
    assert parse_block(block).rejected
    with pytest.raises(NotAccepted):
        read_sample_fields(block)


def reference(rows: list[tuple[list[int], list[int]]], max_length: int | None, long: str) -> list[tuple[list[int], list[int]]]:
    """Samples and the length policy, one list at a time."""
    out = []
    for prompt, output in rows:
        ids, mask = prompt + output, [0] * len(prompt) + [1] * len(output)
        if max_length is not None and len(ids) > max_length:
            if long == "drop":
                continue
            if long == "truncate":
                ids, mask = ids[:max_length], mask[:max_length]
                if not sum(mask):  # the cut left no trained token
                    continue
        out.append((ids, mask))
    return out


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.lists(st.integers(0, 2**32 - 1), max_size=9), st.lists(st.integers(0, 2**32 - 1), max_size=9)), max_size=8),
    st.one_of(st.none(), st.integers(1, 20)),
    st.sampled_from(["keep", "drop", "truncate"]),
)
def test_samples_and_the_length_policy_match_a_list_by_list_reading(kimi_context, rows, max_length, long) -> None:
    frame = pl.DataFrame(
        {
            "line": pl.Series(range(1, len(rows) + 1), dtype=pl.UInt32),
            "id": pl.Series([f"r{i}" for i in range(len(rows))], dtype=pl.String),
            "input_ids": pl.Series([p for p, _ in rows], dtype=pl.List(pl.Int64)),
            "output_ids": pl.Series([o for _, o in rows], dtype=pl.List(pl.Int64)),
        }
    )
    block = build_samples(frame, kimi_context, MaskOptions())
    block = apply_length_policy(block, max_length, long if max_length else "keep", LengthTally())
    got = [
        (block.values[a:b].tolist(), block.mask[a:b].tolist())
        for a, b in zip(block.offsets[:-1], block.offsets[1:], strict=True)
    ]
    assert got == reference(rows, max_length, long if max_length else "keep")
    assert block.values.dtype == np.uint32 and block.mask.dtype == np.uint8
    assert block.frame().to_dicts() == [
        {"id": i, "line": n, "input_ids": ids, "loss_mask": mask}
        for i, n, (ids, mask) in zip(block.record_ids.to_list(), block.lines.tolist(), got, strict=True)
    ]

"""Kimi-K3, whose markers are sequences of ids: a holdout-like partition (single- and multi-turn
agentic records, thinking on and off, calls entered straight from the reasoning, tool results
quoting the tag strings; a quarter corrupted the ways pipelines break them) is judged exactly,
and the marker view keeps every position of the real ids."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from audit.api import check_target
from audit.model.families.thinking_modes import ThinkingMode
from audit.model.tokens.flat_ids import FILLER, FlatIds, marker_view
from fixtures.kimi_k3 import TOKENIZER_DIR, build


def test_a_marker_view_puts_each_sequence_at_its_first_position() -> None:
    flat = FlatIds.from_sequences([[7, 1, 2, 3, 9, 1, 2], [1, 2, 3], [], [2, 3, 1]])
    view = marker_view(flat, {100: (1, 2, 3), 101: (1, 2)})
    assert view.values.tolist() == [7, 100, FILLER, FILLER, 9, 101, FILLER, 100, FILLER, FILLER, 2, 3, 1]
    assert np.array_equal(view.offsets, flat.offsets)
    assert marker_view(flat, {}) is flat  # one-id families: the ids themselves


@pytest.mark.parametrize("thinking", [True, "mixed"])
def test_a_holdout_like_partition_is_judged_exactly(tmp_path: Path, thinking: ThinkingMode) -> None:
    records, labels = build(160, seed=11)
    data = tmp_path / "raw_responses.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    report = check_target(data, profile="kimi-k3", tokenizer=TOKENIZER_DIR, thinking=thinking, cache=False)
    errors = report.findings.filter(report.findings["severity"] == "error")
    assert "ERR001" not in set(report.findings["rule"].to_list())
    flagged = set(errors["line"].to_list())
    assert {line: kind for line, kind in labels.items() if line not in flagged} == {}
    assert errors.filter(~errors["line"].is_in(list(labels))).is_empty()

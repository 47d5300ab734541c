"""`audit vocab`: the draft vocabulary equals, array for array, what SpecForge's and speculators'
own functions make of the same counts; the counts are the trained tokens of the exported samples."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import audit
from audit.cli import app
from audit.flows.draft_vocab import (
    TokenCounts,
    coverage,
    safetensors_bytes,
    select_draft_ids,
    vocab_mappings,
)
from audit.flows.export_rows import SampleBlock
from audit.report.html.vocab import render_vocab_html
from tests.conftest import PREPARED

runner = CliRunner()


def process_token_dict_to_mappings(token_dict: Counter, draft_vocab_size: int, target_vocab_size: int):
    """SpecForge 0.2.0 `specforge/data/preprocessing.py::process_token_dict_to_mappings`, its body
    verbatim (the prints left out), `torch.tensor` of the same lists as numpy arrays (int64, bool)."""
    if len(token_dict) < draft_vocab_size:
        existing_tokens = set(token_dict.keys())
        missing_tokens = set(range(draft_vocab_size)) - existing_tokens
        for token in missing_tokens:
            token_dict[token] = 0
            if len(token_dict) >= draft_vocab_size:
                break
    total_frequency = sum(token_dict.values())
    top_N = token_dict.most_common(draft_vocab_size)
    top_N_frequency_sum = sum(freq for key, freq in top_N)

    if total_frequency == 0:  # noqa: SIM108  (verbatim)
        top_N_ratio = 0.0
    else:
        top_N_ratio = top_N_frequency_sum / total_frequency
    assert 0.0 <= top_N_ratio <= 1.0
    used_tokens = [key for key, freq in top_N]
    used_tokens.sort()

    d2t = [used_tokens[i] - i for i in range(len(used_tokens))]
    t2d = [i in used_tokens for i in range(target_vocab_size)]
    return np.array(d2t, dtype=np.int64), np.array(t2d, dtype=bool)


def build_vocab_mappings_from_distribution(token_freq_dict: dict[int, int], draft_vocab_size: int, target_vocab_size: int):
    """speculators 0.9.0 `speculators/train/vocab_mapping.py::build_vocab_mappings_from_distribution`
    (lines 74-106), as the research notes give it, numpy in place of torch."""
    sorted_tokens = sorted(token_freq_dict, key=lambda tid: (-token_freq_dict[tid], tid))
    selected = sorted_tokens[: min(draft_vocab_size, len(sorted_tokens))]
    if len(selected) < draft_vocab_size:
        have = set(selected)
        for tid in range(draft_vocab_size):
            if tid not in have:
                selected.append(tid)
            if len(selected) >= draft_vocab_size:
                break
    selected.sort()
    d2t = np.array(selected, dtype=np.int64) - np.arange(draft_vocab_size, dtype=np.int64)
    t2d = np.zeros(target_vocab_size, dtype=bool)
    t2d[selected] = True
    return d2t, t2d


def specforge_counter(rows: list[tuple[list[int], list[int]]]) -> Counter:
    """SpecForge's counts (`generate_vocab_mapping_file`): per row, the trained ids'
    `unique(return_counts=True)` (ascending ids) added to a Counter, rows in order."""
    counter: Counter = Counter()
    for ids, mask in rows:
        trained = np.array(ids, dtype=np.int64)[np.array(mask, dtype=bool)]
        unique, counts = np.unique(trained, return_counts=True)
        counter.update(dict(zip(unique.tolist(), counts.tolist(), strict=True)))
    return counter


def sample_block(rows: list[tuple[list[int], list[int]]]) -> SampleBlock:
    import polars as pl

    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(ids) for ids, _ in rows], out=offsets[1:])
    flat = [i for ids, _ in rows for i in ids]
    mask = [m for _, masks in rows for m in masks]
    return SampleBlock(
        pl.Series([None] * len(rows), dtype=pl.String), np.arange(len(rows), dtype=np.uint32),
        np.array(flat, dtype=np.uint32), np.array(mask, dtype=np.uint8), offsets,
    )


def random_rows(rng: np.random.Generator, vocab: int, count: int) -> list[tuple[list[int], list[int]]]:
    rows = []
    for _ in range(count):
        length = int(rng.integers(1, 30))
        # Few distinct ids, skewed: many ties at any cut-off.
        ids = (rng.zipf(1.6, size=length) % vocab).tolist() if rng.random() < 0.5 else rng.integers(0, vocab, size=length).tolist()
        mask = (rng.random(length) < 0.7).astype(int).tolist()
        rows.append((ids, mask))
    return rows


@pytest.mark.parametrize("seed", range(40))
def test_equal_to_both_trainers_functions_on_random_counts(seed: int) -> None:
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(8, 300))
    rows = random_rows(rng, vocab, int(rng.integers(1, 25)))
    counts = TokenCounts(vocab)
    # Counted in blocks, as the export streams them.
    cut = int(rng.integers(0, len(rows) + 1))
    for part in (rows[:cut], rows[cut:]):
        if part:
            counts.add(sample_block(part))
    counter = specforge_counter(rows)
    assert dict(enumerate(counts.counts.tolist())) == {i: counter.get(i, 0) for i in range(vocab)}
    for draft in {1, 2, int(rng.integers(1, vocab + 1)), len(counter), len(counter) + 3, vocab} - {0}:
        if draft > vocab:
            continue
        specforge = process_token_dict_to_mappings(Counter(counter), draft, vocab)
        ours = vocab_mappings(select_draft_ids(counts.counts, counts.first_row, draft, "specforge"), vocab)
        assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(ours, specforge, strict=True)), draft
        speculators = build_vocab_mappings_from_distribution(dict(counter), draft, vocab)
        ours = vocab_mappings(select_draft_ids(counts.counts, counts.first_row, draft, "speculators"), vocab)
        assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(ours, speculators, strict=True)), draft


def test_specforge_fills_in_its_sets_order_not_always_the_smallest_ids() -> None:
    # 113 distinct trained ids for a draft vocabulary of 116: SpecForge adds the first 3 ids of
    # set(range(116)) - seen as CPython iterates that set, here not the 3 smallest.
    rng = np.random.default_rng(9)
    vocab = int(rng.integers(8, 300))
    rows = random_rows(rng, vocab, int(rng.integers(1, 25)))
    counts = TokenCounts(vocab)
    counts.add(sample_block(rows))
    seen = set(np.flatnonzero(counts.counts).tolist())
    assert len(seen) == 113
    specforge = set(select_draft_ids(counts.counts, counts.first_row, 116, "specforge").tolist()) - seen
    speculators = set(select_draft_ids(counts.counts, counts.first_row, 116, "speculators").tolist()) - seen
    assert speculators == set(sorted(set(range(116)) - seen)[:3]) != specforge
    assert np.flatnonzero(process_token_dict_to_mappings(specforge_counter(rows), 116, vocab)[1]).tolist() == sorted(seen | specforge)


def test_the_tie_breaks_differ_where_the_trainers_differ() -> None:
    # 9 met in the first row, 5 in the second, each once: SpecForge keeps the first met (9),
    # speculators the smallest (5). Within one row ids are met in ascending order.
    rows = [([9, 7, 7], [1, 1, 1]), ([5, 3], [1, 0])]
    counts = TokenCounts(12)
    counts.add(sample_block(rows))
    assert select_draft_ids(counts.counts, counts.first_row, 2, "specforge").tolist() == [7, 9]
    assert select_draft_ids(counts.counts, counts.first_row, 2, "speculators").tolist() == [5, 7]


def exported_rows(path: Path) -> list[tuple[list[int], list[int]]]:
    return [(row["input_ids"], row["loss_mask"]) for row in map(json.loads, path.read_text().splitlines())]


@pytest.mark.parametrize(("partition", "max_length"), [("B1_glaive", 400), ("D1_deepseek", 590), ("H1_harmony", 300)])
def test_the_command_writes_what_specforge_makes_of_the_exported_samples(partition: str, max_length: int, tmp_path: Path) -> None:
    # A length near the median: some rows cut, some dropped, as the trainers would.
    options = ["--data-root", str(PREPARED), "--no-end-of-turn", "--max-length", str(max_length), "--long", "truncate"]
    result = runner.invoke(app, ["vocab", partition, "--out", str(tmp_path / "vocab"), "--draft-vocab", "64",
                                 "--html", str(tmp_path / "vocab.html"), *options])
    assert result.exit_code == 1, result.output  # these samples fail the gate; the clean records count
    assert "coverage" in result.output
    exported = runner.invoke(app, ["export", partition, "--out", str(tmp_path / "rows"), "--format", "jsonl", *options])
    assert exported.exit_code == 1, exported.output
    rows = exported_rows(tmp_path / "rows" / "samples.jsonl")
    counter = specforge_counter(rows)
    counts = np.load(tmp_path / "vocab" / "token_counts.npy")
    vocab = len(counts)
    assert {i: int(c) for i, c in enumerate(counts) if c} == dict(counter)
    d2t, t2d = process_token_dict_to_mappings(Counter(counter), 64, vocab)
    assert np.array_equal(np.load(tmp_path / "vocab" / "d2t.npy"), d2t)
    assert np.array_equal(np.load(tmp_path / "vocab" / "t2d.npy"), t2d)
    summary = json.loads((tmp_path / "vocab" / "vocab.json").read_text())
    chosen = next(row for row in summary["coverage"] if row["draft_size"] == 64)
    assert chosen["coverage"] == pytest.approx(sum(c for _, c in counter.most_common(64)) / sum(counter.values()))
    assert summary["counts"]["trained_tokens"] == sum(counter.values()) == sum(sum(m) for _, m in rows)
    safetensors = pytest.importorskip("safetensors.numpy", reason="needs safetensors: pip install -e '.[test]'")
    tensors = safetensors.load_file(str(tmp_path / "vocab" / "vocab_mapping.safetensors"))
    assert np.array_equal(tensors["d2t"], d2t) and np.array_equal(tensors["t2d"], t2d)
    assert tensors["d2t"].dtype == np.int64 and tensors["t2d"].dtype == np.bool_
    page = (tmp_path / "vocab.html").read_text()
    assert "<svg" in page and "<polyline" in page and "<script" not in page


def test_the_api_and_the_target_vocabulary(tmp_path: Path) -> None:
    result = audit.draft_vocab("B0_clean", tmp_path / "v", draft_vocab=100, target_vocab=200_000, data_root=PREPARED)
    assert result.t2d.shape == (200_000,) and result.d2t.shape == (100,) and int(result.t2d.sum()) == 100
    assert result.summary["target_vocab"] == {"size": 200_000, "from": "--target-vocab"}
    assert result.exit_code() == 0
    small = runner.invoke(app, ["vocab", "B0_clean", "--out", str(tmp_path / "w"), "--draft-vocab", "10",
                                "--target-vocab", "100", "--data-root", str(PREPARED)])
    assert small.exit_code == 2 and "outside the target vocabulary" in small.output, small.output
    # The same command again replaces its own earlier output (a whole one, nothing else there)...
    again = runner.invoke(app, ["vocab", "B0_clean", "--out", str(tmp_path / "v"), "--draft-vocab", "10", "--data-root", str(PREPARED)])
    assert again.exit_code == 0, again.output
    assert np.load(tmp_path / "v" / "d2t.npy").shape == (10,)
    # ...but not a directory that also holds someone else's file.
    (tmp_path / "v" / "notes.txt").write_text("mine")
    refused = runner.invoke(app, ["vocab", "B0_clean", "--out", str(tmp_path / "v"), "--draft-vocab", "10", "--data-root", str(PREPARED)])
    assert refused.exit_code == 2 and "not empty" in refused.output


def test_coverage_and_safetensors_by_hand() -> None:
    counts = np.array([0, 5, 3, 3, 1], dtype=np.int64)
    assert [row["coverage"] for row in coverage(counts, [1, 2, 3, 4, 9])] == pytest.approx([5 / 12, 8 / 12, 11 / 12, 1, 1])
    data = safetensors_bytes({"d2t": np.array([1, -2], dtype=np.int64), "t2d": np.array([True, False])}, {"k": "v"})
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    assert size % 8 == 0 and header["__metadata__"] == {"k": "v"}
    assert header["d2t"] == {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}
    assert header["t2d"] == {"dtype": "BOOL", "shape": [2], "data_offsets": [16, 18]}
    assert data[8 + size :] == np.array([1, -2], dtype="<i8").tobytes() + b"\x01\x00"


def test_the_page_escapes_what_comes_from_data() -> None:
    summary = {
        "source": {"target": "<script>alert(1)</script>", "path": "x\" onload=\"y", "sha256": "0"},
        "options": {"draft_vocab": 10, "tie_break": "specforge"},
        "coverage": [{"draft_size": 10, "coverage": 0.5, "covered_tokens": 3}],
        "coverage_curve": [[1, 0.1], [10, 0.5]],
        "profile": {"name": "<b>"}, "tokenizer": {"sha256": "<i>"},
    }
    page = render_vocab_html(summary)
    assert "<script" not in page and "&lt;script&gt;" in page and 'onload="y' not in page and "<b>" not in page

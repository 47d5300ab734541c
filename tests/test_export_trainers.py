"""What the trainers make of an export: the rows each one's default maximum length cuts and drops,
and the datasets directory `speculators train --data-path` reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import audit
from audit.cli import app
from audit.model.trainers.trainer_rules import load_trainer_rules
from tests.conftest import FIXTURES, PREPARED
from tests.test_export import (
    load_from_disk_as_torch,
    read_jsonl,
    specforge_prompt_tasks,
    speculators_passthrough,
)

runner = CliRunner()
KIMI = {"profile": "kimi-k2.5", "tokenizer": FIXTURES / "tokenizers" / "kimi-k2.5-mini"}
# Prompt lengths around both trainers' defaults (SpecForge 2048, speculators 8192): each record's
# own output follows. Past a limit by its prompt alone, a row keeps no trained token there.
PROMPT_LENGTHS = [120, 1900, 2047, 2100, 4000, 8000, 8190, 8300, 9000]


@pytest.fixture(scope="module")
def long_partition(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """B0_clean's records with their prompts' ids repeated to the lengths above, and a rule set
    of the record contract alone, so that every one of them is clean and exported."""
    workdir = tmp_path_factory.mktemp("long")
    records = [json.loads(line) for line in (PREPARED / "B0_clean" / "raw_responses.jsonl").read_text().splitlines()]
    lines = []
    for n, length in enumerate(PROMPT_LENGTHS):
        record = dict(records[n])
        prompt = record["input_ids"]
        record["input_ids"] = (prompt * (length // len(prompt) + 1))[:length]
        record["id"] = f"long-{n}"
        lines.append(json.dumps(record))
    data_file = workdir / "raw_responses.jsonl"
    data_file.write_text("\n".join(lines) + "\n")
    rules = workdir / "rules.toml"
    rules.write_text('select = ["INT001", "INT002"]\n')
    return data_file, rules


def test_the_defaults_are_the_trainers_own() -> None:
    # SpecForge 0.2.0 specforge/config/schema.py line 140 (data.max_length); speculators 0.9.0
    # cli/prepare_data.py lines 95-98 (--seq-length) and train/config/schema.py 210-212.
    specforge, speculators = load_trainer_rules("specforge"), load_trainer_rules("speculators")
    assert (specforge.max_length, speculators.max_length) == (2048, 8192)
    assert specforge.length_setting(4096) == "data.max_length=4096"
    assert speculators.length_setting(9000) == "--seq-length 9000 (prepare-data) and --total-seq-len 9000 (train)"


def test_the_export_says_which_rows_each_trainer_cuts_and_drops(long_partition, tmp_path: Path) -> None:
    data_file, rules = long_partition
    result = audit.export(data_file, tmp_path / "out", format="jsonl", rules=rules, **KIMI)
    samples = tmp_path / "out" / "samples.jsonl"
    rows = read_jsonl(samples)
    assert len(rows) == len(PROMPT_LENGTHS) and all(sum(row["loss_mask"]) for row in rows)
    longest = max(len(row["input_ids"]) for row in rows)
    # What each trainer's loader keeps of the file, at its default, against the whole file.
    kept = {
        "specforge": (specforge_prompt_tasks(samples, max_length=2048), specforge_prompt_tasks(samples)),
        "speculators": (speculators_passthrough(samples, max_length=8192), speculators_passthrough(samples)),
    }
    reported = {entry["name"]: entry for entry in result.summary["trainers"]}
    assert sorted(reported) == ["specforge", "speculators"]
    for name, limit, setting in (("specforge", 2048, f"data.max_length={longest}"),
                                 ("speculators", 8192, f"--seq-length {longest} (prepare-data) and --total-seq-len {longest} (train)")):
        at_default, whole = kept[name]
        cut = [task for task in at_default if len(task["input_ids"]) == limit]
        entry = reported[name]
        assert entry["max_length"] == limit and entry["longest_row"] == longest
        assert entry["rows_longer"] == sum(len(row["input_ids"]) > limit for row in rows)
        assert entry["rows_dropped"] == len(whole) - len(at_default) > 0
        assert entry["rows_longer"] == entry["rows_dropped"] + len(cut)
        assert entry["setting"] == setting and setting in entry["summary"]
    assert reported["specforge"]["summary"].startswith(
        f"SpecForge 0.2.0: {reported['specforge']['rows_longer']} of {len(rows)} rows are longer than its default maximum "
        f"length 2048: it cuts them there and drops the {reported['specforge']['rows_dropped']} whose trained tokens all lie past it"
    )
    saved = json.loads((tmp_path / "out" / "export.json").read_text())
    assert saved["trainers"] == result.summary["trainers"]

    # --long truncate at 2048 leaves SpecForge nothing to cut; speculators neither.
    cut_here = audit.export(data_file, tmp_path / "cut", format="jsonl", rules=rules, max_length=2048, long="truncate", **KIMI)
    assert [entry["rows_longer"] for entry in cut_here.summary["trainers"]] == [0, 0]
    assert cut_here.summary["trainers"][0]["summary"] == "SpecForge 0.2.0: no row is longer than its default maximum length 2048"
    assert cut_here.summary["trainers"][0]["setting"] is None


def test_the_command_prints_one_line_per_trainer(long_partition, tmp_path: Path) -> None:
    data_file, rules = long_partition
    done = runner.invoke(app, ["export", str(data_file), "--out", str(tmp_path / "out"), "--format", "jsonl",
                               "--rules", str(rules), "--profile", "kimi-k2.5", "--tokenizer", str(KIMI["tokenizer"])])
    assert done.exit_code == 0, done.output
    summary = json.loads((tmp_path / "out" / "export.json").read_text())
    printed = " ".join(done.output.split())  # the terminal wraps long lines
    for entry in summary["trainers"]:
        assert entry["rows_longer"] and entry["summary"] in printed


def speculators_train_rows(loaded: Any) -> list[dict[str, Any]]:
    """What speculators 0.9.0 `train/data.py` ArrowDataset reads of a `--data-path` directory: the
    packing lengths `list(data.with_format(None)["seq_len"])` (`_compute_approx_lengths`), and per
    row `data[i]["input_ids"]` (sent as `.tolist()` by `build_client_item`, compared with
    `torch.equal` to the hidden states' token ids) and `data[i]["loss_mask"]`, int64 tensors."""
    lengths = list(loaded.with_format(None)["seq_len"])
    assert all(type(length) is int for length in lengths)
    rows = []
    for index, length in enumerate(lengths):
        item = loaded[index]
        assert str(item["input_ids"].dtype).endswith("int64") and str(item["loss_mask"].dtype).endswith("int64")
        assert len(item["input_ids"]) == len(item["loss_mask"]) == length
        rows.append({"input_ids": item["input_ids"].tolist(), "loss_mask": item["loss_mask"].tolist()})
    return rows


def test_the_datasets_export_is_what_speculators_train_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    audit.export("B1_glaive", tmp_path / "jsonl", format="jsonl", data_root=PREPARED)
    result = audit.export("B1_glaive", tmp_path / "datasets", format="datasets", rows_per_shard=7, data_root=PREPARED)
    expected = [{"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]} for r in read_jsonl(tmp_path / "jsonl" / "samples.jsonl")]
    state = json.loads((tmp_path / "datasets" / "state.json").read_text())
    assert state["_format_type"] == "torch" and state["_format_columns"] is None  # set_format(type="torch")
    loaded = load_from_disk_as_torch(tmp_path / "datasets", monkeypatch)
    # prepare-data takes a directory with these columns as pre-tokenized, and writes seq_len beside them.
    assert {"input_ids", "loss_mask", "seq_len"} <= set(loaded.column_names)
    assert speculators_train_rows(loaded) == expected
    assert "seq_len" in result.summary["columns"]
    # Its train/validation split (train_data_ratio) selects rows; the lengths follow them.
    split = int(len(loaded) * 0.9)
    assert list(loaded.select(range(split, len(loaded))).with_format(None)["seq_len"]) == [
        len(row["input_ids"]) for row in expected[split:]
    ]

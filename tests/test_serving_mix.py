"""The serving mix: each record's mode (thinking on/off, tool calls) counted, and MIX001 failing
the gate when a rule set's `[mix]` asks for a mode the partition lacks or holds too little of."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
from typer.testing import CliRunner

from audit.cli import app
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
    assert result["verdict"] == "fail" and result["failing"] == 1
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

"""`audit inspect --print` / `--format json`: the detail as text or JSON for a bug report."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from audit.cli import app
from audit.flows import token_window
from tests.conftest import PREPARED
from tests.test_inspect_model import write_long_record

runner = CliRunner()


def inspect(*args: str):
    # CliRunner's stdout is not a terminal, so the detail is printed, never the viewer.
    return runner.invoke(app, ["inspect", *args, "--data-root", str(PREPARED)])


def test_print_shows_one_record_token_by_token_with_its_finding_marked() -> None:
    result = inspect("B1_glaive", "--line", "20")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "line 20  ·  id glaive-0019" in out
    assert "expected  '<|im_assistant|>assistant<|im_middle|><think>'  [163588, 2268, 163601, 163606]" in out
    assert "actual  '<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>'" in out
    (marked,) = [line for line in out.splitlines() if "◀  PRM001" in line]
    assert marked.split()[1:5] == ["470", "163607", "</think>", "response"]
    assert "── output · reasoning: output_ids[0:50] of 98" in out and "── output · answer: output_ids[50:61]" in out


def test_print_with_a_rule_prints_only_records_broken_by_it() -> None:
    result = inspect("B1_glaive", "--rule", "rtr001", "--print")
    assert result.exit_code == 0, result.output
    headings = [line for line in result.stdout.splitlines() if line.startswith("B1_glaive  line ")]
    assert [h.split()[2] for h in headings] == ["41", "54"]
    assert "saved ids" in result.stdout and "re-encoded" in result.stdout


def test_print_stops_at_the_limit_and_says_how_many_are_left() -> None:
    result = inspect("B1_glaive", "--limit", "2")
    assert result.exit_code == 0
    assert result.stdout.count("special tokens, output:") == 2
    assert "more records with findings: narrow with --rule/--id/--line or raise --limit" in result.stdout


def test_json_holds_findings_comparisons_and_every_token() -> None:
    result = inspect("B1_glaive", "--id", "glaive-0043", "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["schema_version"] == 1 and document["profile"]["name"] == "kimi-k2.5"
    (record,) = document["records"]
    assert record["line"] == 44 and "SEG004" in [f["rule"] for f in record["findings"]]
    tokens = record["output"]["tokens"]
    assert len(tokens) == record["output"]["total"]
    marked = [t for t in tokens if t["rules"] and "SEG004" in t["rules"]]
    assert marked == [
        {"index": 86, "id": 163595, "piece": "<|tool_calls_section_begin|>", "role": "tool:section_begin",
         "segment": "tool_calls", "rules": "SEG004"}
    ]


def test_a_clean_partition_says_so_and_exits_zero() -> None:
    result = inspect("B0_clean")
    assert result.exit_code == 0
    assert "no findings in B0_clean: all" in result.stdout and "records pass every rule" in result.stdout


def test_bad_choices_are_one_line_errors_with_exit_2() -> None:
    for args, message in (
        (("B1_glaive", "--rule", "XYZ999"), "no rule 'XYZ999'"),
        (("B1_glaive", "--id", "nobody"), "raw_responses.jsonl has id 'nobody'"),
        (("B1_glaive", "--line", "9999"), "line 9999 is past the end"),
        (("B1_glaive", "--id", "glaive-0019", "--line", "20"), "--id and --line both pick a record"),
        (("B0_clean", "--rule", "SEG001"), None),  # no findings at all: that is not an error
        (("nowhere",), "no partition 'nowhere'"),
    ):
        result = inspect(*args)
        if message is None:
            assert result.exit_code == 0
            continue
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr and "Traceback" not in result.output
        assert len(result.stderr.strip().splitlines()) <= 2  # the data-root note at most, then the error


def test_print_of_a_two_million_id_record_shows_a_window_around_its_finding(tmp_path: Path) -> None:
    length, first, second = 2_000_000, 500_000, 1_000_000
    partition = write_long_record(tmp_path / "long", length, (first, second), rules='select = ["SEG"]\n')
    result = runner.invoke(app, ["inspect", str(partition), "--print", "--rules", str(partition / "rules.toml")])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    around, head, end = token_window.AROUND_FINDING, token_window.OUTPUT_HEAD, token_window.OUTPUT_END
    assert len(lines) < head + end + (2 * around + 1) + 60  # not two million
    (note,) = [line for line in lines if line.startswith("left out: ")]
    omitted = length - head - end - (2 * around + 1)
    assert f"{omitted:,} of {length:,} output tokens" in note and "--all-tokens shows every token" in note
    (marked,) = [line for line in lines if "◀  SEG002" in line]
    assert marked.split()[1:4] == [str(second), "163607", "</think>"]
    gaps = [line.strip() for line in lines if "tokens left out:" in line]
    assert gaps == [
        f"··· {second - around - head:,} tokens left out: output_ids[{head}:{second - around}] ···",
        f"··· {length - end - second - around - 1:,} tokens left out: output_ids[{second + around + 1}:{length - end}] ···",
    ]
    # The summary of special tokens still names the first </think>, which the window leaves out.
    assert f"</think>@{first} </think>@{second} <|im_end|>@{length - 1}" in result.stdout


def test_all_tokens_prints_every_token_and_json_counts_what_a_window_leaves_out(tmp_path: Path) -> None:
    length, second = 5_000, 2_500
    partition = write_long_record(tmp_path / "long", length, (100, second), rules='select = ["SEG"]\n')
    rules = ["--rules", str(partition / "rules.toml")]
    every = runner.invoke(app, ["inspect", str(partition), "--print", "--all-tokens", *rules])
    assert every.exit_code == 0, every.output
    rows = [line for line in every.stdout.splitlines() if line.startswith("▌")]
    assert [int(row.split()[1]) for row in rows[-length:]] == list(range(length))
    assert "left out" not in every.stdout
    document = json.loads(runner.invoke(app, ["inspect", str(partition), "--format", "json", *rules]).stdout)
    (record,) = document["records"]
    output = record["output"]
    assert output["total"] == length and output["omitted"] == length - len(output["tokens"]) > 0
    assert second in [token["index"] for token in output["tokens"]] and record["all_tokens"] is False
    whole = json.loads(runner.invoke(app, ["inspect", str(partition), "--format", "json", "--all-tokens", *rules]).stdout)
    assert whole["records"][0]["output"]["omitted"] == 0 and len(whole["records"][0]["output"]["tokens"]) == length

"""The CLI contract a CI job relies on: exit codes, one-line errors, the JSON report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from audit.checks import RULES
from audit.cli import app
from tests.conftest import KIMI_TOKENIZER, PREPARED

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def test_bare_check_of_the_sample_by_partition_name_fails_the_gate_and_writes_a_report(tmp_path, monkeypatch):
    monkeypatch.chdir(PREPARED.parent.parent)  # the repository root, where README runs it
    monkeypatch.delenv("AUDIT_DATA_ROOT", raising=False)
    result = run("check", "B1_glaive", "--reports-dir", str(tmp_path))
    assert result.exit_code == 1, result.output
    assert "PRM001" in result.output and "FAIL" in result.output
    [report] = tmp_path.glob("B1_glaive-*.json")
    data = json.loads(report.read_text())
    assert data["schema_version"] == 1 and data["verdict"] == "fail"
    assert {"line", "rule"} <= set(data["findings"][0])


def test_clean_partition_exits_zero(tmp_path):
    result = run("check", "B0_clean", "--data-root", str(PREPARED), "--reports-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output


def test_exit_zero_and_fail_on_warning(tmp_path):
    base = ["check", "B1_glaive", "--data-root", str(PREPARED), "--reports-dir", str(tmp_path)]
    assert run(*base, "--exit-zero").exit_code == 0
    # A rule set where the only failing rule is a warning: passes, unless warnings fail.
    rules = tmp_path / "rules.toml"
    rules.write_text('select = ["SEG004"]\n')
    assert run(*base, "--rules", str(rules)).exit_code == 0
    assert run(*base, "--rules", str(rules), "--fail-on", "warning").exit_code == 1


def test_format_json_prints_the_report(tmp_path):
    result = runner.invoke(
        app, ["check", "B1_glaive", "--data-root", str(PREPARED), "--report", str(tmp_path / "r.json"), "--format", "json"]
    )
    data = json.loads(result.stdout)
    assert data["target"] == "B1_glaive" and data["summary"]["records"] == 74


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["check", "nope", "--data-root", str(PREPARED)], "no partition 'nope'"),
        (["check", "../B1_glaive", "--data-root", str(PREPARED)], "no such partition directory"),
        (["check", "B1_glaive", "--data-root", str(PREPARED), "--profile", "llama-9"], "unknown profile"),
        (["check", "B1_glaive", "--data-root", str(PREPARED), "--tokenizer", "/no/such/dir"], "does not exist"),
        (["check", "missing.jsonl"], "no such file"),
        (["check", "B1_glaive", "--data-root", "/no/such/root"], "data root"),
        (["explain", "XYZ999"], "no rule"),
    ],
)
def test_usage_and_configuration_errors_exit_2_with_one_line(args, says):
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert says in result.output
    assert "Traceback" not in result.output


def test_partition_name_escaping_the_data_root_is_refused(tmp_path):
    root = tmp_path / "prepared"
    root.mkdir()
    outside = tmp_path / "secret"
    shutil.copytree(PREPARED / "B0_clean", outside)
    (root / "escape").symlink_to(outside)
    result = run("check", "escape", "--data-root", str(root))
    assert result.exit_code == 2 and "outside the data root" in result.output


def test_empty_file_and_wrong_tokenizer_are_input_errors(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    result = run("check", str(empty), "--profile", "kimi-k2.5", "--tokenizer", str(KIMI_TOKENIZER))
    assert result.exit_code == 2 and "empty" in result.output
    empty.write_text("\n  \n")
    result = run("check", str(empty), "--profile", "kimi-k2.5", "--tokenizer", str(KIMI_TOKENIZER))
    assert result.exit_code == 2 and "no records" in result.output
    # The DeepSeek profile's tokens are not in the Kimi tokenizer: a configuration error.
    data = PREPARED / "B0_clean" / "raw_responses.jsonl"
    result = run("check", str(data), "--profile", "deepseek-v3.1", "--tokenizer", str(KIMI_TOKENIZER))
    assert result.exit_code == 2 and "right profile" in result.output


def test_pinned_id_disagreement_is_a_configuration_error(tmp_path):
    profile = tmp_path / "pinned.toml"
    profile.write_text(
        (Path(__file__).parent.parent / "rules" / "profiles" / "kimi-k2.5.toml")
        .read_text()
        .replace('"<think>" = 163606', '"<think>" = 151667')
    )
    data = PREPARED / "B0_clean" / "raw_responses.jsonl"
    result = run("check", str(data), "--profile", str(profile), "--tokenizer", str(KIMI_TOKENIZER))
    assert result.exit_code == 2 and "pins '<think>' to id 151667" in result.output


def test_rule_set_unknown_key_names_the_file_and_key(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text("[rules.TRM001]\nfail_abve = 3\n")
    result = run("check", "B0_clean", "--data-root", str(PREPARED), "--rules", str(rules))
    assert result.exit_code == 2
    assert str(rules) in result.output and "fail_abve" in result.output


def test_rate_threshold_lets_a_few_failures_through(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text('select = ["TRM001"]\n[rules.TRM001]\nfail_above = "5%"\n')
    base = ["check", "B1_glaive", "--data-root", str(PREPARED), "--rules", str(rules), "--reports-dir", str(tmp_path)]
    assert run(*base).exit_code == 0  # 1 truncated record of 74 is 1.4%
    rules.write_text('select = ["TRM001"]\n[rules.TRM001]\nfail_above = "1%"\n')
    assert run(*base).exit_code == 1


def test_rules_lists_every_rule_and_explain_prints_its_four_sections():
    listing = run("rules")
    assert listing.exit_code == 0
    for code, rule in RULES.items():
        assert code in listing.output
        assert set(rule.docs()) == {"What it checks", "Why it matters", "Example", "Fix"}, code
    explained = run("explain", "seg001")
    assert explained.exit_code == 0 and "Why it matters" in explained.output

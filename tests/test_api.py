"""The Python API (`audit.check_target`, `audit.gate`): what a notebook or a pipeline gets."""

from __future__ import annotations

import json
import re

import polars as pl
import pytest
from typer.testing import CliRunner

import audit
from audit.cli import app
from tests.conftest import KIMI_TOKENIZER, PREPARED, ROOT, write_jsonl


@pytest.mark.parametrize("partition", ["B0_clean", "B1_glaive"])
def test_the_api_finds_what_the_cli_json_report_says(partition: str) -> None:
    shown = CliRunner().invoke(
        app, ["check", partition, "--data-root", str(PREPARED), "--format", "json", "--no-cache"]
    )
    cli = json.loads(shown.stdout)
    report = audit.check_target(partition, data_root=PREPARED, cache=False)

    assert isinstance(report.findings, pl.DataFrame)
    if cli["findings"]:
        assert report.findings.columns == list(cli["findings"][0])
    assert report.findings.to_dicts() == cli["findings"]
    assert report.verdict == cli["verdict"] and shown.exit_code == report.exit_code()
    assert [r.to_json() for r in report.results] == cli["results"]
    ours = json.loads(json.dumps(report.to_json()))  # as JSON holds it (tuples as lists)
    assert {k: v for k, v in ours.items() if k not in ("created_at", "seconds")} == {
        k: v for k, v in cli.items() if k not in ("created_at", "seconds")
    }


def test_the_verdict_names_the_rules_behind_it() -> None:
    report = audit.check_target("B1_glaive", data_root=PREPARED)
    judgement = report.judgement
    assert isinstance(judgement, audit.Verdict) and judgement.value == report.verdict == "fail"
    assert judgement.failed == tuple(r.code for r in report.results if r.verdict == "fail")
    assert "PRM001" in judgement.failed and judgement.exit_code() == 1


def test_options_are_keywords_and_paths_or_strings(tmp_path) -> None:
    clean = (PREPARED / "B0_clean" / "raw_responses.jsonl").read_bytes().splitlines()
    data = write_jsonl(
        tmp_path / "raw.jsonl", [clean[0] + b"\n", clean[0] + b"\n"]
    )  # the same id twice
    report = audit.check_target(
        str(data), profile="kimi-k2.5", tokenizer=str(KIMI_TOKENIZER), rules=None
    )
    assert [(f["line"], f["rule"]) for f in report.findings.to_dicts()] == [(2, "INT004")]
    assert report.records == 2 and report.verdict == "fail"


def test_errors_are_the_projects_exceptions_never_system_exit(tmp_path) -> None:
    with pytest.raises(audit.InputError, match="no partition 'nowhere'"):
        audit.check_target("nowhere", data_root=PREPARED)
    with pytest.raises(audit.ConfigError, match="profile"):
        audit.check_target("B0_clean", data_root=PREPARED, profile="no-such-family")
    with pytest.raises(audit.AuditError):
        audit.gate("B0_clean", tmp_path / "g", data_root=PREPARED, quarantine_on="sometimes")
    assert issubclass(audit.ConfigError, audit.AuditError) and issubclass(
        audit.InputError, audit.AuditError
    )


def test_gate_splits_and_the_quarantine_reads_back(tmp_path) -> None:
    result = audit.gate("B1_glaive", tmp_path / "gated", data_root=PREPARED)
    assert isinstance(result, audit.GateResult) and result.report.verdict == "fail"
    assert result.clean + result.quarantined == result.report.records
    entries = list(audit.iter_quarantine(tmp_path / "gated" / "quarantine.jsonl"))
    assert len(entries) == result.quarantined and all(e["raw_bytes"] for e in entries)


def test_the_readme_example_runs(tmp_path, monkeypatch) -> None:
    """The README's Python API section, as written, in five lines."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Python API", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    assert len([line for line in code.splitlines() if line.strip()]) <= 5
    monkeypatch.chdir(tmp_path)  # where the example writes its gate
    monkeypatch.setenv("AUDIT_DATA_ROOT", str(PREPARED))
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 -- the project's own README
    assert namespace["report"].verdict == "fail" and namespace["errors"].height > 0
    assert (tmp_path / "gated" / "B1_glaive" / "manifest.json").is_file()

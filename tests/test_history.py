"""`audit report` renders a saved report again; `audit diff` fails CI only when a rule regressed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import audit
from audit.cli import app
from audit.report.history import diff_reports, load_report
from audit.report.report import Report
from tests.conftest import PREPARED

runner = CliRunner()


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """The JSON reports of the clean and the corrupted sample, as `audit check` writes them."""
    directory = tmp_path_factory.mktemp("reports")
    paths = {}
    for name in ("B0_clean", "B1_glaive"):
        report = audit.check_target(name, data_root=PREPARED)
        paths[name] = report.write_json(directory / f"{name}.json")
    return paths


def edited(path: Path, tmp_path: Path, change) -> Path:
    """A copy of a saved report with `change(data)` applied: the same data audited later."""
    data = json.loads(path.read_text())
    change(data)
    out = tmp_path / f"edited-{path.name}"
    out.write_text(json.dumps(data))
    return out


def rule(data: dict, code: str) -> dict:
    return next(r for r in data["results"] if r["code"] == code)


def test_report_renders_a_saved_report_as_check_did(saved):
    result = runner.invoke(app, ["report", str(saved["B1_glaive"])])
    assert result.exit_code == 0, result.output
    assert "PRM001" in result.output and "FAIL B1_glaive: 23 of 74 records have errors" in result.output


def test_report_renders_in_machine_formats(saved):
    result = runner.invoke(app, ["report", str(saved["B1_glaive"]), "--format", "sarif"])
    assert json.loads(result.stdout)["version"] == "2.1.0"
    result = runner.invoke(app, ["report", str(saved["B1_glaive"]), "--format", "github"])
    assert "::error file=" in result.stdout


def test_a_report_round_trips_through_its_json(saved):
    report = load_report(saved["B1_glaive"])
    again = Report.from_json(report.to_json())
    assert [(r.code, r.failing, r.verdict) for r in again.results] == [
        (r.code, r.failing, r.verdict) for r in report.results
    ]


def test_diff_of_a_partition_that_got_corrupted_exits_one_and_names_the_rules(saved):
    result = runner.invoke(app, ["diff", str(saved["B0_clean"]), str(saved["B1_glaive"]), "--format", "json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert "PRM001" in data["regressions"] and "SEG004" not in data["regressions"]  # a warning does not fail
    prm = next(r for r in data["rules"] if r["code"] == "PRM001")
    assert prm["old"]["verdict"] == "pass" and prm["new"]["verdict"] == "fail" and prm["change"] == "worse"


def test_diff_of_an_improvement_or_no_change_exits_zero(saved):
    assert runner.invoke(app, ["diff", str(saved["B1_glaive"]), str(saved["B0_clean"])]).exit_code == 0
    same = runner.invoke(app, ["diff", str(saved["B1_glaive"]), str(saved["B1_glaive"])])
    assert same.exit_code == 0 and "no rule regressed" in same.output


def test_a_rule_failing_before_and_after_regresses_only_when_its_rate_rises(saved, tmp_path):
    def more_prompt_failures(data):
        rule(data, "PRM001")["failing"] += 3

    def fewer(data):
        rule(data, "PRM001")["failing"] -= 1

    old = load_report(saved["B1_glaive"])
    worse = diff_reports(old, load_report(edited(saved["B1_glaive"], tmp_path, more_prompt_failures)))
    assert [m.code for m in worse.regressions] == ["PRM001"] and worse.exit_code == 1
    better = diff_reports(old, load_report(edited(saved["B1_glaive"], tmp_path, fewer)))
    assert better.regressions == [] and better.exit_code == 0


def test_a_new_warning_regresses_only_under_fail_on_warning(saved, tmp_path):
    def warn(data):
        seg = rule(data, "SEG004")
        seg["failing"], seg["verdict"] = 1, "warn"

    new = edited(saved["B0_clean"], tmp_path, warn)
    assert runner.invoke(app, ["diff", str(saved["B0_clean"]), str(new)]).exit_code == 0
    assert runner.invoke(app, ["diff", str(saved["B0_clean"]), str(new), "--fail-on", "warning"]).exit_code == 1


@pytest.mark.parametrize(
    ("content", "says"),
    [(None, "no such report file"), (b"{not json", "not valid JSON"), (b'{"a": 1}', "not an audit report")],
)
def test_unreadable_reports_exit_two_with_one_line(saved, tmp_path, content, says):
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_bytes(content)
    for args in (["report", str(bad)], ["diff", str(saved["B0_clean"]), str(bad)]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2
        assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1

"""CI output formats: junit is XML, sarif is SARIF 2.1.0, github has ::error annotations."""

from __future__ import annotations

import json
from xml.etree import ElementTree as ET

import pytest
from typer.testing import CliRunner

import audit
from audit.cli import app
from audit.report.formats import EXAMPLE_LOCATIONS, format_reports
from audit.report.report import Report
from tests.conftest import PREPARED

runner = CliRunner()


@pytest.fixture(scope="module")
def b1_report() -> Report:
    return audit.check_target("B1_glaive", data_root=PREPARED)


def failing_rules(report: Report, verdicts=("fail",)) -> list[str]:
    return [r.code for r in report.results if r.verdict in verdicts]


def test_junit_is_xml_with_one_testcase_per_rule_and_counts_in_the_failure(b1_report):
    root = ET.fromstring(format_reports([b1_report], "junit"))
    [suite] = root.findall("testsuite")
    cases = suite.findall("testcase")
    assert [c.get("name").split()[0] for c in cases] == [r.code for r in b1_report.results]
    failed = [c.get("name").split()[0] for c in cases if c.find("failure") is not None]
    assert failed == failing_rules(b1_report)
    assert int(suite.get("failures")) == len(failed) and int(suite.get("tests")) == len(cases)
    prm = next(c for c in cases if c.get("name").startswith("PRM001")).find("failure")
    assert "2 of 74 records" in prm.get("message") and "fail >0" in prm.get("message")
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert properties["schema_version"] == "1"


def test_junit_counts_warnings_as_failures_under_fail_on_warning(b1_report):
    root = ET.fromstring(format_reports([b1_report], "junit", fail_on_warning=True))
    failed = [c.get("name").split()[0] for c in root.iter("testcase") if c.find("failure") is not None]
    assert failed == failing_rules(b1_report, ("fail", "warn")) and "SEG004" in failed


def test_sarif_is_2_1_0_with_one_result_per_failing_rule_at_bounded_locations(b1_report):
    sarif = json.loads(format_reports([b1_report], "sarif"))
    assert sarif["version"] == "2.1.0" and "sarif-2.1.0" in sarif["$schema"]
    run = sarif["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == [r.code for r in b1_report.results]
    results = run["results"]
    assert [r["ruleId"] for r in results] == [r.code for r in b1_report.results if r.failing]
    by_code = {r.code: r for r in b1_report.results}
    for result in results:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["level"] in ("error", "warning", "note") and result["message"]["text"]
        assert 1 <= len(result["locations"]) <= EXAMPLE_LOCATIONS
        lines = [loc["physicalLocation"]["region"]["startLine"] for loc in result["locations"]]
        assert lines == by_code[result["ruleId"]].example_lines[:EXAMPLE_LOCATIONS]
        uri = result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        assert uri.endswith("B1_glaive/raw_responses.jsonl")
    levels = {r["ruleId"]: r["level"] for r in results}
    assert levels["PRM001"] == "error" and levels["SEG004"] == "warning"
    assert run["properties"]["schema_version"] == 1


def test_github_annotations_are_aggregated_one_per_rule(b1_report):
    lines = format_reports([b1_report], "github").splitlines()
    errors = [line for line in lines if line.startswith("::error file=")]
    assert len(errors) == len(failing_rules(b1_report))
    prm = next(line for line in errors if "PRM001" in line)
    assert prm.startswith("::error file=") and ",line=20,title=" in prm
    assert "2 of 74 records" in prm.split("::", 2)[2]
    # ":" and "," inside a property would end it early: they are escaped
    title = prm.split("title=", 1)[1].split("::", 1)[0]
    assert ":" not in title and "%3A" in title
    assert any(line.startswith("::warning file=") and "SEG004" in line for line in lines)


def test_jsonl_is_one_finding_per_line(b1_report):
    rows = [json.loads(line) for line in format_reports([b1_report], "jsonl").splitlines()]
    assert len(rows) == b1_report.findings.height
    assert all(row["schema_version"] == 1 and row["target"] == "B1_glaive" for row in rows)
    assert {"line", "rule", "severity", "message", "position", "file"} <= set(rows[0])


def test_github_format_appends_a_markdown_summary_when_the_step_summary_is_set(tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = runner.invoke(
        app,
        ["check", "B1_glaive", "--data-root", str(PREPARED), "--reports-dir", str(tmp_path), "--format", "github"],
    )
    assert result.exit_code == 1
    assert result.stdout.startswith("::error file=")
    text = summary.read_text()
    assert text.startswith("earlier step\n") and "| B1_glaive | 74 | 23 |" in text and "PRM001" in text


@pytest.mark.parametrize("fmt", ["junit", "sarif", "github", "jsonl"])
def test_every_format_is_available_on_gate(fmt, tmp_path):
    result = runner.invoke(
        app, ["gate", "B1_glaive", "--data-root", str(PREPARED), "--out", str(tmp_path), "--format", fmt]
    )
    assert result.exit_code == 1
    if fmt == "junit":
        ET.fromstring(result.stdout)
    elif fmt == "sarif":
        assert json.loads(result.stdout)["version"] == "2.1.0"
    elif fmt == "github":
        assert "::error file=" in result.stdout
    else:
        assert all(json.loads(line) for line in result.stdout.splitlines())

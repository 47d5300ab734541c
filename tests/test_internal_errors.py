"""A rule that raises on a record costs that record, not the run: on every path that audits.

A rule with a bug is injected (`tests/fault_injection`): it raises on the records whose id
contains "boom". Each path must then give those records an ERR001 finding (error severity:
quarantined by the gate), keep every other record's findings, write the report, and exit 2
with a last line that says how many records hit an internal error and how to see why
(`--debug`, `AUDIT_DEBUG=1`, which print the tracebacks).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import audit
from audit.base.errors import ConfigError
from audit.checks.ruleset import load_rule_set
from audit.cli import app
from audit.engine.isolation import INTERNAL_ERROR, isolated
from audit.records.batch import Batch
from audit.records.reader import parse_block
from audit.records.sources import memory_blocks
from tests.conftest import KIMI_TOKENIZER, PREPARED, ROOT
from tests.fault_injection.faults import inject_fault
from tests.generate_support import generate_args, make_prompts, read_samples, run_cli

FAULTY = "TCL002"
BAD_LINES = [4, 18]
KIMI = ["--profile", "kimi-k2.5", "--tokenizer", str(KIMI_TOKENIZER)]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """B0_clean, with the records on BAD_LINES renamed so that the faulty rule raises on them."""
    records = [json.loads(line) for line in (PREPARED / "B0_clean" / "raw_responses.jsonl").read_text().splitlines()]
    for line in BAD_LINES:
        records[line - 1]["id"] = f"boom-{line}"
    records[9]["output_ids"] = records[9]["output_ids"][:-1]  # and one record the rules flag for real
    path = tmp_path / "part" / "raw_responses.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def internal_lines(report: dict) -> list[int]:
    return sorted({f["line"] for f in report["findings"] if f["rule"] == INTERNAL_ERROR})


def last_line(output: str) -> str:
    return [line for line in output.splitlines() if line.strip()][-1]


def test_the_api_reports_the_records_a_rule_raised_on_and_keeps_every_other_finding(data, monkeypatch):
    healthy = audit.check_target(data, profile="kimi-k2.5", tokenizer=KIMI_TOKENIZER, cache=False)
    inject_fault(monkeypatch, FAULTY)
    report = audit.check_target(data, profile="kimi-k2.5", tokenizer=KIMI_TOKENIZER, cache=False)

    assert report.exit_code() == 2 and report.exit_code(fail_on_warning=True) == 2
    assert sorted(e.line for e in report.internal_errors) == BAD_LINES
    assert all(e.rule == FAULTY and "ZeroDivisionError" in e.error and "Traceback" in e.traceback
               for e in report.internal_errors)
    errors = report.findings.filter(pl.col("rule") == INTERNAL_ERROR)
    assert errors["line"].to_list() == BAD_LINES and set(errors["severity"]) == {"error"}
    assert all(FAULTY in message and "ZeroDivisionError" in message for message in errors["message"])
    # Every other record is judged as without the bug: the same findings, line for line.
    others = report.findings.filter(pl.col("rule") != INTERNAL_ERROR)
    assert others.equals(healthy.findings.filter(~(pl.col("line").is_in(BAD_LINES) & (pl.col("rule") == FAULTY))))
    assert healthy.findings.filter(pl.col("line") == 10).height > 0
    saved = report.to_json()
    assert saved["summary"]["internal_error_records"] == 2
    assert [e["line"] for e in saved["internal_errors"]] == BAD_LINES


def test_check_writes_the_report_and_exits_2_with_a_last_line_that_says_how_to_see_why(data, tmp_path, monkeypatch):
    inject_fault(monkeypatch, FAULTY)
    report = tmp_path / "report.json"
    result = CliRunner().invoke(app, ["check", str(data), *KIMI, "--report", str(report), "--no-cache"])

    assert result.exit_code == 2, result.output
    line = last_line(result.output)
    assert "2 records hit an internal error in TCL002" in line and "--debug" in line
    assert "Traceback" not in result.output
    assert internal_lines(json.loads(report.read_text())) == BAD_LINES


@pytest.mark.parametrize("how", [["--debug"], ["--debug-env"]])
def test_debug_prints_each_traceback(data, monkeypatch, how):
    inject_fault(monkeypatch, FAULTY)
    if how == ["--debug-env"]:
        monkeypatch.setenv("AUDIT_DEBUG", "1")
        how = []
    else:
        monkeypatch.setenv("AUDIT_DEBUG", "0")  # restored after the test: --debug sets it to 1
    from audit.cli.app import _take_debug_flag

    args = _take_debug_flag(["check", str(data), *KIMI, "--report", "none", "--no-cache", *how])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert result.output.count("Traceback (most recent call last)") == 2
    assert "ZeroDivisionError: injected fault in TCL002" in result.output
    assert "the tracebacks are above" in last_line(result.output)


def test_exit_zero_forgives_the_data_never_the_tool(data, monkeypatch):
    inject_fault(monkeypatch, FAULTY)
    result = CliRunner().invoke(app, ["check", str(data), *KIMI, "--report", "none", "--no-cache", "--exit-zero"])
    assert result.exit_code == 2


def test_gate_quarantines_the_records_a_rule_raised_on(data, tmp_path, monkeypatch):
    inject_fault(monkeypatch, FAULTY)
    out = tmp_path / "gated"
    result = CliRunner().invoke(app, ["gate", str(data), *KIMI, "--out", str(out), "--no-cache"])

    assert result.exit_code == 2, result.output
    assert "2 records hit an internal error" in last_line(result.output)
    quarantined = {entry["line"] for entry in audit.iter_quarantine(out / "quarantine.jsonl")}
    assert set(BAD_LINES) <= quarantined
    clean = [json.loads(line)["id"] for line in (out / "clean.jsonl").read_text().splitlines()]
    assert not any("boom" in str(sample_id) for sample_id in clean)
    assert len(clean) + len(quarantined) == 30  # nothing lost


def test_watch_once_counts_them_and_exits_2(data, monkeypatch):
    inject_fault(monkeypatch, FAULTY)
    result = CliRunner().invoke(app, ["watch", str(data), *KIMI, "--once"])
    assert result.exit_code == 2, result.output
    assert "ERR001" in result.output
    assert "2 records hit an internal error" in last_line(result.output)


def test_a_canary_that_hits_an_internal_error_stops_the_run_with_exit_2(servers, tmp_path, monkeypatch):
    inject_fault(monkeypatch, FAULTY, trigger="")  # the bug strikes every record
    server = servers()
    prompts = make_prompts(tmp_path / "prompts.jsonl")
    out = tmp_path / "raw_responses.jsonl"
    result = run_cli(generate_args(prompts, out, server.url, extra=("--canary", "4")))
    assert result.exit_code == 2, result.output
    assert "4 records hit an internal error in TCL002" in last_line(result.output)
    assert len(read_samples(out)) == 4 and server.generate_requests == 4  # nothing more was sent


def _in_fresh_processes(data: Path, *extra: str) -> subprocess.CompletedProcess:
    """`audit check` in a new process whose every worker has the faulty rule (sitecustomize)."""
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "fault_injection"), str(ROOT)]),
        "AUDIT_TEST_FAULT": FAULTY,
        "AUDIT_DEBUG": "0",
    }
    environment.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, "-m", "audit", "check", str(data), *KIMI, "--no-cache", "--format", "json",
         "--report", "none", *extra],
        capture_output=True, text=True, env=environment, timeout=300,
    )


@pytest.mark.parametrize("engine", [["--jobs", "2"], ["--engine", "ray", "--shard-size", "16K"]], ids=["jobs", "ray"])
def test_workers_report_the_records_a_rule_raised_on(data, engine):
    result = _in_fresh_processes(data, *engine)
    assert result.returncode == 2, result.stderr
    report = json.loads(result.stdout)
    assert internal_lines(report) == BAD_LINES
    assert [e["line"] for e in report["internal_errors"]] == BAD_LINES
    assert "2 records hit an internal error in TCL002" in last_line(result.stderr)


def test_the_internal_error_code_is_always_on_and_cannot_be_configured(tmp_path):
    only = tmp_path / "only.toml"
    only.write_text('select = ["TCL"]\n')
    assert INTERNAL_ERROR in load_rule_set(only)
    configured = tmp_path / "configured.toml"
    configured.write_text('[rules.ERR001]\nseverity = "warning"\n')
    with pytest.raises(ConfigError, match=r"\[rules.ERR001\] cannot be configured"):
        load_rule_set(configured)
    ignored = tmp_path / "ignored.toml"
    ignored.write_text('ignore = ["ALL"]\n')
    with pytest.raises(ConfigError, match="leave no rule to run"):
        load_rule_set(ignored)


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 40), data=st.data())
def test_halving_finds_exactly_the_records_that_raise(kimi_context, size, data):
    bad = set(data.draw(st.sets(st.integers(0, size - 1), max_size=size)))
    lines = [json.dumps({"id": f"r{i}", "input_ids": [1], "output_ids": [2]}).encode() for i in range(size)]
    batch = Batch(parse_block(next(memory_blocks(lines))).records, kimi_context)

    def compute(part: Batch) -> list[str]:
        ids = part.records["id"].to_list()
        if any(int(i[1:]) in bad for i in ids):
            raise ValueError("bad record")
        return ids

    done, failed = isolated(compute, batch)
    assert sorted(row for row, _, _ in failed) == sorted(bad)
    covered = [sample for start, ids in done for sample in ids]
    assert sorted(covered, key=lambda i: int(i[1:])) == [f"r{i}" for i in range(size) if i not in bad]
    assert all(batch.records["id"][start] == ids[0] for start, ids in done)


def test_a_rule_that_raises_on_everything_costs_a_bounded_number_of_runs(kimi_context, monkeypatch):
    from audit.engine import isolation

    monkeypatch.setattr(isolation, "ISOLATION_BUDGET", 20)
    lines = [json.dumps({"id": f"r{i}", "input_ids": [1], "output_ids": [2]}).encode() for i in range(500)]
    batch = Batch(parse_block(next(memory_blocks(lines))).records, kimi_context)
    runs = []

    def compute(part: Batch) -> None:
        runs.append(part.height)
        raise ValueError("always")

    done, failed = isolated(compute, batch)
    assert done == [] and sorted(row for row, _, _ in failed) == list(range(500))  # every record accounted for
    # the budget, then one run of each part left (one a level of the halving: log2(500) < 9)
    assert len(runs) <= 20 + 9


def test_a_line_the_reading_raises_on_is_an_internal_error_of_the_reader_and_the_rest_is_judged(
        data, tmp_path, monkeypatch):
    # Every line should read or be refused (INT001/INT002); one the reading still raises on (a
    # bug) costs that line: ERR001 naming the reader, quarantined, exit 2; every other line judged.
    import audit.records.reader as reader

    healthy = audit.check_target(data, profile="kimi-k2.5", tokenizer=KIMI_TOKENIZER, cache=False)
    strict = reader.read_strictly

    def faulty(line: int, text: bytes, **kwargs):
        if b"boom-" in text:
            raise RecursionError("maximum recursion depth exceeded")
        return strict(line, text, **kwargs)

    monkeypatch.setattr(reader, "read_strictly", faulty)
    report = audit.check_target(data, profile="kimi-k2.5", tokenizer=KIMI_TOKENIZER, cache=False)
    assert report.exit_code() == 2 and report.records == healthy.records
    assert [(e.line, e.rule) for e in report.internal_errors] == [(line, "reader") for line in BAD_LINES]
    assert "RecursionError" in report.internal_errors[0].error and "Traceback" in report.internal_errors[0].traceback
    errors = report.findings.filter(pl.col("rule") == INTERNAL_ERROR)
    assert errors["line"].to_list() == BAD_LINES and set(errors["severity"]) == {"error"}
    others = report.findings.filter(pl.col("rule") != INTERNAL_ERROR)
    assert others.equals(healthy.findings.filter(~pl.col("line").is_in(BAD_LINES)))
    gated = audit.gate(data, tmp_path / "gated", profile="kimi-k2.5", tokenizer=KIMI_TOKENIZER, cache=False)
    quarantined = {entry["line"] for entry in audit.iter_quarantine(tmp_path / "gated" / "quarantine.jsonl")}
    clean = (tmp_path / "gated" / "clean.jsonl").read_text().splitlines()
    assert gated.report.exit_code() == 2 and set(BAD_LINES) <= quarantined
    assert len(clean) + len(quarantined) == 30 and not any("boom-" in line for line in clean)  # nothing lost

"""`audit watch`: a growing file audited incrementally gives what `audit check` gives on the whole."""

from __future__ import annotations

import itertools
import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from audit.cli import app
from audit.flows.checking import check_session
from audit.flows.session import CheckOptions, prepare
from audit.flows.targets import resolve_target
from audit.flows.watching import LiveAudit, watch_target
from tests.conftest import KIMI_TOKENIZER, PREPARED, ROOT

B1 = PREPARED / "B1_glaive" / "raw_responses.jsonl"
OPTIONS = CheckOptions(tokenizer=KIMI_TOKENIZER, profile="kimi-k2.5")


def partition(tmp_path: Path, data: bytes = b"") -> Path:
    directory = tmp_path / "B1_live"
    directory.mkdir(exist_ok=True)
    (directory / "raw_responses.jsonl").write_bytes(data)
    generation = {
        "profile": "kimi-k2.5",
        "tokenizer": {"path": os.path.relpath(KIMI_TOKENIZER, directory)},
    }
    (directory / "generation.json").write_text(json.dumps(generation))
    return directory


def test_growing_file_audited_in_pieces_matches_audit_check_on_the_whole(tmp_path):
    data = B1.read_bytes()
    directory = partition(tmp_path)
    live = LiveAudit(prepare(watch_target(str(directory), tmp_path), OPTIONS))
    assert live.poll().records == 0

    # Append in uneven pieces that mostly end inside a line, as a writer's flushes may.
    cuts = list(range(0, len(data), 40009)) + [len(data)]
    with (directory / "raw_responses.jsonl").open("ab") as out:
        for start, end in itertools.pairwise(cuts):
            out.write(data[start:end])
            out.flush()
            snapshot = live.poll()
            complete = data[:end].count(b"\n")
            assert snapshot.records == sum(
                1 for line in data[:end].split(b"\n")[:complete] if line.strip()
            )
            assert snapshot.pending_bytes == end - (data[:end].rfind(b"\n") + 1)

    report = check_session(prepare(resolve_target(str(directory), tmp_path), OPTIONS))
    assert snapshot.records == report.records
    assert {r.code: r.failing for r in snapshot.rules} == {
        r.code: r.failing for r in report.results
    }
    assert {r.code: r.verdict for r in snapshot.rules} == {
        r.code: r.verdict for r in report.results
    }
    duplicate = next(r for r in snapshot.rules if r.code == "INT004")
    assert duplicate.failing > 0 and duplicate.pass_rate == pytest.approx(
        1 - duplicate.failing / report.records
    )


def test_lines_per_minute_and_a_replaced_file(tmp_path):
    lines = B1.read_bytes().splitlines(keepends=True)
    directory = partition(tmp_path, b"".join(lines[:3]))
    live = LiveAudit(prepare(watch_target(str(directory), tmp_path), OPTIONS))
    assert live.poll().records == 3
    time.sleep(0.05)
    with (directory / "raw_responses.jsonl").open("ab") as out:
        out.write(b"".join(lines[3:9]))
    snapshot = live.poll()
    assert snapshot.records == 9 and snapshot.lines_per_minute > 0
    # A file rewritten shorter (a new run) is audited from its start again.
    (directory / "raw_responses.jsonl").write_bytes(lines[0])
    assert live.poll().records == 1


def test_watch_once_prints_lines_and_each_rules_pass_rate():
    result = CliRunner().invoke(app, ["watch", str(PREPARED / "B1_glaive"), "--once"])
    assert result.exit_code == 1, result.output  # a one-shot watch exits as check: B1 fails
    assert "74 lines" in result.output
    assert "INT004" in result.output and "%" in result.output
    clean = CliRunner().invoke(app, ["watch", str(PREPARED / "B0_clean"), "--once"])
    assert clean.exit_code == 0, clean.output


def test_watch_once_ends_in_the_verdict_its_exit_code_gives_and_waits_for_no_key():
    failing = CliRunner().invoke(app, ["watch", str(PREPARED / "B1_glaive"), "--once"])
    verdict = " ".join(failing.output.split("raw_responses.jsonl")[-1].split())  # the line wraps
    assert verdict.startswith("FAIL so far, 74 lines; failed: INT001")
    assert "warnings: SEG004" in verdict
    assert "q or Ctrl-C" not in failing.output  # it has already quit
    clean = CliRunner().invoke(app, ["watch", str(PREPARED / "B0_clean"), "--once"])
    assert clean.output.strip().splitlines()[-1] == "PASS so far, 30 lines"


def test_watch_starts_on_the_empty_file_a_generator_just_created(tmp_path):
    directory = partition(tmp_path)
    result = CliRunner().invoke(app, ["watch", str(directory), "--once"])
    assert result.exit_code == 0, result.output
    assert "0 lines" in result.output


def test_watch_missing_target_is_one_error_line():
    result = CliRunner().invoke(app, ["watch", "no/such/partition", "--once"])
    assert result.exit_code == 2 and "no such partition directory" in result.output


def test_q_quits_the_live_view(tmp_path):
    directory = partition(tmp_path, b"".join(B1.read_bytes().splitlines(keepends=True)[:5]))
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "audit", "watch", str(directory), "--interval", "0.1"],
        cwd=ROOT,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env={**os.environ, "COLUMNS": "120"},
    )
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + 30
    try:
        while b"lines/min" not in seen and time.monotonic() < deadline:
            if select.select([leader], [], [], 0.1)[0]:
                seen += os.read(leader, 65536)
        assert b"5 lines" in seen
        os.write(leader, b"q")
        while process.poll() is None and time.monotonic() < deadline:
            if select.select([leader], [], [], 0.1)[0]:
                try:
                    os.read(leader, 65536)
                except OSError:
                    break
        assert process.wait(timeout=5) == 0
    finally:
        if process.poll() is None:
            process.kill()
        os.close(leader)

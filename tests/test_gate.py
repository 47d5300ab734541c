"""`audit gate`: clean.jsonl holds exactly the clean lines, byte for byte; nothing is lost."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import audit
from audit.checks import RULES, Severity
from audit.cli import app
from audit.flows import gating
from audit.flows.gating import gate_session
from audit.flows.session import CheckOptions, prepare
from audit.flows.targets import resolve_target
from tests.conftest import KIMI_TOKENIZER, PREPARED

runner = CliRunner()
B1 = PREPARED / "B1_glaive"


def gate_cli(*args: str):
    return runner.invoke(app, ["gate", *args, "--data-root", str(PREPARED)])


def input_lines(path: Path) -> list[bytes]:
    """The file's lines without their "\\n", as the gate numbers them (1-based)."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    return lines[:-1] if data.endswith(b"\n") else lines


def labels(partition: Path) -> dict[int, set[str]]:
    return {int(k): set(v) for k, v in json.loads((partition / "labels.json").read_text()).items()}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_manifest_describes(out: Path, data_file: Path) -> dict:
    manifest = json.loads((out / "manifest.json").read_text())
    counts = manifest["counts"]
    assert counts["clean"] + counts["quarantined"] == counts["in"] == manifest["input"]["records"]
    assert manifest["input"]["sha256"] == sha256(data_file)
    assert manifest["input"]["path"] == str(data_file.resolve())
    for name in ("clean.jsonl", "quarantine.jsonl"):
        assert manifest["outputs"][name]["sha256"] == sha256(out / name)
    assert len(manifest["rule_set"]["sha256"]) == 64 and manifest["rule_set"]["path"]
    assert manifest["profile"]["name"] and len(manifest["tokenizer"]["sha256"]) == 64
    assert manifest["tool"]["version"] and manifest["created_at"]
    return manifest


@pytest.mark.parametrize("quarantine_on", ["error", "warning"])
def test_labelled_partition_splits_exactly_into_clean_and_quarantined_lines(tmp_path, quarantine_on):
    out = tmp_path / "gated"
    result = gate_cli("B1_glaive", "--out", str(out), "--quarantine-on", quarantine_on)
    assert result.exit_code == 1, result.output  # the partition fails the gate; the split is written anyway
    lines = input_lines(B1 / "raw_responses.jsonl")
    expected = labels(B1)
    if quarantine_on == "error":  # warning rules' lines stay in training data: SEG004 (line 44),
        # TCL003 (lines 16 and 58: call ids real Kimi writes too)
        warnings = {code for code, rule in RULES.items() if rule.severity is Severity.WARNING}
        expected = {line: codes for line, codes in expected.items() if not codes <= warnings}
        assert not {16, 44, 58} & set(expected)

    clean = [line for number, line in enumerate(lines, 1) if number not in expected]
    assert (out / "clean.jsonl").read_bytes() == b"".join(line + b"\n" for line in clean)

    quarantined = list(audit.iter_quarantine(out / "quarantine.jsonl"))
    assert [entry["line"] for entry in quarantined] == sorted(expected)
    for entry in quarantined:
        assert entry["raw_bytes"] == lines[entry["line"] - 1]
        found = {f["rule"] for f in entry["findings"]}
        assert expected[entry["line"]] <= found
        assert all({"rule", "severity", "message", "position"} <= set(f) for f in entry["findings"])

    manifest = assert_manifest_describes(out, B1 / "raw_responses.jsonl")
    assert manifest["counts"] == {"in": 74, "clean": len(clean), "quarantined": len(expected)}
    assert manifest["quarantine_on"] == quarantine_on and manifest["verdict"] == "fail"


def test_clean_partition_passes_and_clean_jsonl_is_the_input(tmp_path):
    out = tmp_path / "gated"
    result = gate_cli("B0_clean", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "30 clean, 0 quarantined" in result.output
    assert (out / "clean.jsonl").read_bytes() == (PREPARED / "B0_clean" / "raw_responses.jsonl").read_bytes()
    assert (out / "quarantine.jsonl").read_bytes() == b""


@pytest.fixture
def odd_partition(tmp_path) -> Path:
    """Clean records with, around them: a CRLF line, blank lines, a non-UTF-8 line, a cut last line."""
    good = input_lines(PREPARED / "B0_clean" / "raw_responses.jsonl")[:6]
    directory = tmp_path / "odd"
    directory.mkdir()
    (directory / "generation.json").write_text(
        json.dumps({"profile": "kimi-k2.5", "tokenizer": {"path": str(KIMI_TOKENIZER)}, "thinking": True})
    )
    body = [
        good[0],
        good[1] + b"\r",  # a CRLF line: a record whose bytes include the \r
        b"",  # blank lines are not records
        good[2],
        b'{"id": "latin", "text": "caf\xe9"}',  # not UTF-8
        b"   ",
        good[3],
        good[4],
    ]
    cut = good[5][: len(good[5]) // 2]  # the file was still being written
    (directory / "raw_responses.jsonl").write_bytes(b"\n".join(body) + b"\n" + cut)
    return directory


def test_non_utf8_and_cut_lines_are_quarantined_byte_for_byte_and_blank_lines_counted(odd_partition, tmp_path):
    out = tmp_path / "gated"
    result = runner.invoke(app, ["gate", str(odd_partition), "--out", str(out)])
    assert result.exit_code == 1, result.output
    lines = input_lines(odd_partition / "raw_responses.jsonl")

    assert (out / "clean.jsonl").read_bytes() == b"".join(lines[i] + b"\n" for i in (0, 1, 3, 6, 7))
    assert b"\r\n" in (out / "clean.jsonl").read_bytes()

    entries = [json.loads(line) for line in (out / "quarantine.jsonl").read_bytes().splitlines()]
    assert [e["line"] for e in entries] == [5, 9]
    latin, cut = entries
    assert "raw" not in latin and base64.b64decode(latin["raw_base64"]) == lines[4]
    assert latin["findings"][0]["rule"] == "INT001" and "UTF-8" in latin["findings"][0]["message"]
    assert "raw_base64" not in cut and cut["raw"].encode() == lines[8]
    assert "cut short" in cut["findings"][0]["message"]

    manifest = assert_manifest_describes(out, odd_partition / "raw_responses.jsonl")
    assert manifest["counts"] == {"in": 7, "clean": 5, "quarantined": 2}
    assert manifest["input"]["blank_lines"] == 2 and manifest["input"]["lines"] == 9


def test_small_blocks_stream_to_the_same_split(odd_partition, tmp_path):
    target = resolve_target(str(odd_partition), PREPARED)
    whole = gate_session(prepare(target, CheckOptions()), tmp_path / "whole")
    streamed = gate_session(prepare(target, CheckOptions(block_bytes=4096)), tmp_path / "streamed")
    for name in ("clean.jsonl", "quarantine.jsonl"):
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "streamed" / name).read_bytes()
    assert whole.manifest["counts"] == streamed.manifest["counts"]


def test_gate_again_on_the_same_input_changes_no_byte(tmp_path):
    out = tmp_path / "gated"
    assert gate_cli("B1_glaive", "--out", str(out)).exit_code == 1
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    again = gate_cli("B1_glaive", "--out", str(out))
    assert again.exit_code == 1 and "unchanged" in again.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temporaries left either


def test_gate_output_of_another_input_is_kept_unless_forced(tmp_path):
    out = tmp_path / "gated"
    assert gate_cli("B1_glaive", "--out", str(out)).exit_code == 1
    kept = (out / "clean.jsonl").read_bytes()

    refused = gate_cli("B0_clean", "--out", str(out))
    assert refused.exit_code == 2
    assert "--force" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert (out / "clean.jsonl").read_bytes() == kept

    forced = gate_cli("B0_clean", "--out", str(out), "--force")
    assert forced.exit_code == 0, forced.output
    assert json.loads((out / "manifest.json").read_text())["target"] == "B0_clean"


def test_a_changed_input_at_the_same_path_is_another_input(odd_partition, tmp_path):
    out = tmp_path / "gated"
    runner.invoke(app, ["gate", str(odd_partition), "--out", str(out)])
    with (odd_partition / "raw_responses.jsonl").open("ab") as handle:
        handle.write(b"-tail\n")
    refused = runner.invoke(app, ["gate", str(odd_partition), "--out", str(out)])
    assert refused.exit_code == 2 and "earlier version" in refused.stderr


def test_outputs_without_a_manifest_are_not_overwritten(tmp_path):
    out = tmp_path / "gated"
    out.mkdir()
    (out / "clean.jsonl").write_bytes(b"somebody's data\n")
    result = gate_cli("B0_clean", "--out", str(out))
    assert result.exit_code == 2 and "no manifest.json" in result.stderr
    assert (out / "clean.jsonl").read_bytes() == b"somebody's data\n"


def test_an_output_that_would_overwrite_the_input_is_refused(tmp_path):
    data = tmp_path / "clean.jsonl"
    shutil.copy(PREPARED / "B0_clean" / "raw_responses.jsonl", data)
    original = data.read_bytes()
    result = runner.invoke(
        app, ["gate", str(data), "--out", str(tmp_path), "--profile", "kimi-k2.5", "--tokenizer", str(KIMI_TOKENIZER)]
    )
    assert result.exit_code == 2 and "overwrite the input" in result.stderr
    assert data.read_bytes() == original


def test_a_failure_midway_leaves_the_previous_gate_whole(tmp_path, monkeypatch):
    out = tmp_path / "gated"
    assert gate_cli("B1_glaive", "--out", str(out)).exit_code == 1
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gating, "_split", broken)
    result = gate_cli("B1_glaive", "--out", str(out))
    assert result.exit_code == 2 and "No space left" in result.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_an_input_that_changes_during_the_gate_writes_nothing(odd_partition, tmp_path, monkeypatch):
    data = odd_partition / "raw_responses.jsonl"
    audited = gating.check_session

    def audit_then_append(session, progress=None):
        report = audited(session, progress=progress)
        with data.open("ab") as handle:
            handle.write(b"\n")
        return report

    monkeypatch.setattr(gating, "check_session", audit_then_append)
    session = prepare(resolve_target(str(odd_partition), PREPARED), CheckOptions())
    with pytest.raises(audit.InputError, match="changed while it was being gated"):
        gate_session(session, tmp_path / "gated")
    assert not (tmp_path / "gated").exists()  # made by this gate, and removed again empty


def test_machine_format_on_stdout_and_the_gate_line_on_stderr(tmp_path):
    result = gate_cli("B1_glaive", "--out", str(tmp_path / "g"), "--format", "json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["target"] == "B1_glaive"
    # SEG004 and TCL003 are warnings: their three lines stay in clean.jsonl.
    assert "51 clean, 23 quarantined of 74 records" in result.stderr

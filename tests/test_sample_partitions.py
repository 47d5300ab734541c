"""The labelled sample partitions: every corrupted line is caught with its code, no clean line is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import audit
from fixtures.build_fixtures import CORRUPTIONS, SIDE_EFFECTS
from tests.conftest import PREPARED

# Secondary findings a corruption causes for real (see fixtures/build_fixtures.py SIDE_EFFECTS),
# by the primary code of the corruption.
ALLOWED_EXTRA = {
    CORRUPTIONS[kind].code: set(extra) for kind, extra in SIDE_EFFECTS.items()
}

LABELLED = sorted(p.name for p in PREPARED.iterdir() if (p / "labels.json").is_file())


def audit_partition(name: str) -> audit.Report:
    return audit.check_target(name, data_root=PREPARED)


@pytest.mark.parametrize("partition", LABELLED)
def test_every_labelled_line_is_flagged_with_its_code_and_no_clean_line_is(partition: str) -> None:
    labels = {int(k): set(v) for k, v in json.loads((PREPARED / partition / "labels.json").read_text()).items()}
    report = audit_partition(partition)
    found: dict[int, set[str]] = {}
    for finding in report.findings.iter_rows(named=True):
        found.setdefault(finding["line"], set()).add(finding["rule"])

    for line, codes in labels.items():
        assert codes <= found.get(line, set()), f"line {line}: expected {codes}, found {found.get(line)}"
        extra = found.get(line, set()) - codes
        allowed = set().union(*(ALLOWED_EXTRA.get(code, set()) for code in codes))
        assert extra <= allowed, f"line {line}: unexpected extra findings {extra}"
    clean_with_findings = {line: rules for line, rules in found.items() if line not in labels}
    assert clean_with_findings == {}


def test_clean_partition_passes_the_gate() -> None:
    report = audit_partition("B0_clean")
    assert report.findings.is_empty()
    assert report.verdict == "pass"
    assert report.exit_code() == 0


def test_corrupted_partition_fails_the_gate_with_error_findings() -> None:
    report = audit_partition("B1_glaive")
    assert report.verdict == "fail"
    assert report.exit_code() == 1
    severities = dict(report.findings.select("rule", "severity").unique().iter_rows())
    assert severities["SEG004"] == "warning"
    assert severities["PRM001"] == "error"


def test_report_json_carries_the_contract(tmp_path: Path) -> None:
    report = audit_partition("B1_glaive")
    data = json.loads(report.write_json(tmp_path / "r.json").read_text())
    assert data["schema_version"] == 1
    assert data["input"]["records"] == 74
    assert len(data["input"]["sha256"]) == 64
    assert data["tokenizer"]["vocab_size"] == 163608
    assert len(data["rule_set"]["sha256"]) == 64
    first = data["findings"][0]
    assert {"line", "id", "rule", "severity", "message", "position"} <= set(first)
    assert all(f["severity"] in ("error", "warning") for f in data["findings"])

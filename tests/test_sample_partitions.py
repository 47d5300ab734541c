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


def test_every_registered_rule_fires_on_a_shipped_sample() -> None:
    # The README promises the shipped samples show every rule catching its case: a rule added
    # without a sample that makes it fire fails here, naming it.
    from audit.checks import RULES

    fired = {
        partition: set(audit_partition(partition).findings["rule"].unique().to_list())
        for partition in LABELLED
    }
    # ERR001 reports a bug in a rule, which no data can show: tests/test_internal_errors.py
    # injects one on every path instead. The trainer view's rules run only with --trainer:
    # test_every_trainer_rule_fires_on_a_shipped_sample below makes them fire on these samples.
    # MIX001 judges a partition's serving mix against a rule set's [mix], never a record: it fires
    # on B0_clean under the shipped rules/serving-mix.toml (tests/test_serving_mix.py).
    judged = {
        code for code, rule in RULES.items()
        if not rule.always_on and rule.requires is None and not rule.partition_level
    }
    silent = judged - set().union(*fired.values())
    assert not silent, f"no shipped sample makes {sorted(silent)} fire: add a labelled case"
    labelled = {
        code
        for partition in LABELLED
        for codes in json.loads((PREPARED / partition / "labels.json").read_text()).values()
        for code in codes
    }
    assert judged <= labelled, f"no label names {sorted(judged - labelled)}"


TRAINER_LABELLED = sorted(p.name for p in PREPARED.iterdir() if (p / "trainer_labels.json").is_file())
# The shipped samples with the trainers their family's data is fed to.
TRAINER_RUNS = [
    ("B1_glaive", "specforge:kimi-k2-thinking"), ("B1_glaive", "speculators"),
    ("B2_sharegpt", "specforge:kimi-k2-thinking"), ("K2_thinking", "specforge:kimi-k2-thinking"),
]


def trainer_findings(partition: str, trainer: str) -> dict[int, set[str]]:
    found: dict[int, set[str]] = {}
    report = audit.check_target(partition, data_root=PREPARED, trainer=trainer, cache=False)
    for finding in report.findings.iter_rows(named=True):
        found.setdefault(finding["line"], set()).add(finding["rule"])
    return found


@pytest.mark.parametrize("partition", TRAINER_LABELLED)
def test_every_trainer_labelled_line_is_flagged_with_its_codes(partition: str) -> None:
    # Lines whose exact ids are clean (labels.json has none of them: the check flags nothing
    # there) and that the trainer named, fed their text, trains otherwise.
    labelled = json.loads((PREPARED / partition / "trainer_labels.json").read_text())
    labels = json.loads((PREPARED / partition / "labels.json").read_text())
    plain = audit_partition(partition).findings["line"].to_list()
    for trainer, lines in labelled.items():
        found = trainer_findings(partition, trainer)
        for line, codes in lines.items():
            assert line not in labels and int(line) not in plain, f"line {line} is meant to be clean"
            assert set(codes) <= found.get(int(line), set()), f"{trainer} line {line}: expected {codes}, found {found.get(int(line))}"


def test_every_trainer_rule_fires_on_a_shipped_sample() -> None:
    from audit.checks import RULES

    fired = set().union(*(set().union(*trainer_findings(p, t).values()) for p, t in TRAINER_RUNS))
    trainer_rules = {code for code, rule in RULES.items() if rule.requires == "trainer"}
    assert trainer_rules - fired == set(), f"no shipped sample makes {sorted(trainer_rules - fired)} fire with a trainer"
    labelled = {
        code
        for partition in TRAINER_LABELLED
        for lines in json.loads((PREPARED / partition / "trainer_labels.json").read_text()).values()
        for codes in lines.values()
        for code in codes
    }
    assert {"TRN005", "TRN006"} <= labelled


@pytest.mark.parametrize("partition", ["B2_sharegpt", "K2_thinking", "H1_harmony", "V1_images", "K3_xtml"])
def test_the_showcase_samples_are_labelled_with_exactly_what_the_audit_reports(partition: str) -> None:
    # These samples list, per corrupted line, every code the audit reports on it: nothing more,
    # nothing less, and a clean line has no finding at all.
    labels = {int(k): set(v) for k, v in json.loads((PREPARED / partition / "labels.json").read_text()).items()}
    found: dict[int, set[str]] = {}
    for finding in audit_partition(partition).findings.iter_rows(named=True):
        found.setdefault(finding["line"], set()).add(finding["rule"])
    assert found == labels


def test_the_fixture_script_rebuilds_every_shipped_file_byte_for_byte(tmp_path: Path) -> None:
    # The samples are made, not edited by hand: the script run again on a copy writes the same bytes.
    import shutil
    import subprocess
    import sys

    copy = tmp_path / "fixtures"
    shutil.copytree(PREPARED.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, str(copy / "build_fixtures.py"), "--no-verify"], check=True,
                   capture_output=True, cwd=tmp_path)
    shipped = {p.relative_to(PREPARED.parent): p.read_bytes() for p in PREPARED.parent.rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    rebuilt = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert rebuilt.keys() == shipped.keys()
    changed = sorted(str(p) for p in shipped if shipped[p] != rebuilt[p])
    assert not changed, f"the script no longer rebuilds {changed}"

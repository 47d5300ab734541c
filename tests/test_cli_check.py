"""`audit check` over many partitions: one report each, a summary, the worst exit code."""

from __future__ import annotations

from xml.etree import ElementTree as ET

from typer.testing import CliRunner

from audit.cli import app
from tests.conftest import PREPARED
from tests.permissions import audit_bound_by_permissions

runner = CliRunner()


def check(*args: str, reports=None):
    extra = ["--reports-dir", str(reports)] if reports else []
    return runner.invoke(app, ["check", *args, "--data-root", str(PREPARED), *extra])


def test_several_partitions_get_a_report_each_a_summary_and_the_worst_exit_code(tmp_path):
    result = check("B0_clean", "B1_glaive", reports=tmp_path)
    assert result.exit_code == 1, result.output
    assert "summary · 2 partitions" in result.output
    assert sorted(p.name.split("-")[0] for p in tmp_path.glob("*.json")) == ["B0_clean", "B1_glaive"]


def test_all_audits_every_partition_under_the_data_root(tmp_path):
    result = check("--all", "--format", "junit", reports=tmp_path)
    assert result.exit_code == 1
    suites = [s.get("name") for s in ET.fromstring(result.stdout).findall("testsuite")]
    expected = sorted(p.name for p in PREPARED.iterdir() if (p / "raw_responses.jsonl").is_file())
    assert suites == [f"audit {name}" for name in expected]


def test_passing_partitions_together_exit_zero(tmp_path):
    # the clean sample twice, by name and by directory: every target passes, so the run does
    result = check("B0_clean", str(PREPARED / "B0_clean"), reports=tmp_path)
    assert result.exit_code == 0, result.output


def test_a_bad_partition_stops_the_run_before_anything_is_audited(tmp_path):
    result = check("B0_clean", "no_such_partition", reports=tmp_path)
    assert result.exit_code == 2
    assert "no_such_partition" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # fail fast: B0_clean was not audited either


def test_targets_and_all_together_or_neither_are_usage_errors(tmp_path):
    assert check("B0_clean", "--all", reports=tmp_path).exit_code == 2
    result = check(reports=tmp_path)
    assert result.exit_code == 2 and "--all" in result.stderr


def test_all_with_an_empty_data_root_says_so(tmp_path):
    result = runner.invoke(app, ["check", "--all", "--data-root", str(tmp_path)])
    assert result.exit_code == 2 and "no partitions under" in result.stderr


def test_a_default_report_that_cannot_be_written_keeps_the_verdict_and_its_exit_code(tmp_path):
    """In a read-only directory the dated report under reports/ cannot be written: the table
    and the verdict are printed, one line says so and what to pass, and the exit code is the
    verdict's. A --report named on the command line that cannot be written stays an error."""
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    for partition, code, verdict in (("B0_clean", 0, "PASS"), ("B1_glaive", 1, "FAIL")):
        result = audit_bound_by_permissions("check", partition, "--data-root", str(PREPARED), cwd=read_only)
        assert result.returncode == code, result.stderr
        assert f"{verdict} {partition}" in result.stdout
        said = [line for line in result.stderr.splitlines() if "could not write the report" in line]
        assert len(said) == 1 and f"reports/{partition}-" in said[0] and "--report FILE" in said[0], result.stderr
        assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    named = audit_bound_by_permissions(
        "check", "B0_clean", "--data-root", str(PREPARED), "--report", str(read_only / "r.json"), cwd=read_only
    )
    assert named.returncode == 2 and "cannot write the report" in named.stderr, named.stderr
    assert list(read_only.iterdir()) == []

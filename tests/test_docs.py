"""The documentation site stays true: the rule pages are what the rules' docstrings say today,
every page is in the site's navigation and every entry of it is a page, the README is a front
door that links into them, and the site builds under `mkdocs build --strict` (when the docs
extra is installed: `pip install -e '.[docs]'`)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from audit.checks import RULES
from audit.cli import app
from audit.cli.catalog import RULE_DOCS_COMMAND
from tests.test_readme import README, ROOT, site_pages

DOCS = ROOT / "docs"
RULE_PAGES = DOCS / "rules"
runner = CliRunner()


def test_the_rule_pages_are_written_by_the_command_from_the_rules_of_today(tmp_path: Path) -> None:
    done = runner.invoke(app, ["rules", "--docs", str(tmp_path / "rules")])
    assert done.exit_code == 0, done.output
    fresh = {p.name: p.read_text(encoding="utf-8") for p in (tmp_path / "rules").iterdir()}
    committed = {p.name: p.read_text(encoding="utf-8") for p in RULE_PAGES.glob("*.md")}
    stale = sorted(name for name in fresh.keys() & committed.keys() if fresh[name] != committed[name])
    missing, extra = sorted(fresh.keys() - committed.keys()), sorted(committed.keys() - fresh.keys())
    assert not (stale or missing or extra), (
        f"docs/rules/ is stale: run `{RULE_DOCS_COMMAND}` and commit the result "
        f"(differ: {stale or 'none'}; missing: {missing or 'none'}; no such rule: {extra or 'none'})"
    )
    assert set(fresh) == {f"{code}.md" for code in RULES} | {"index.md"}


def test_a_rule_page_holds_its_docstring_severity_and_parameters() -> None:
    page = (RULE_PAGES / "DEG001.md").read_text(encoding="utf-8")
    rule = RULES["DEG001"]
    assert page.startswith(f"# DEG001 {rule.name}\n")
    assert "default severity **error**" in page
    for section in ("What it checks", "Why it matters", "Example", "Fix", "Parameters"):
        assert f"\n## {section}\n" in page, section
    assert f"```text\n{rule.docs()['Example']}\n```" in page  # examples verbatim
    for key, spec in rule.parameters.items():
        assert f"| `{key}` | {spec.default} | {spec.minimum} to {spec.maximum} |" in page
    index = (RULE_PAGES / "index.md").read_text(encoding="utf-8")
    for code, rule in RULES.items():
        assert f"| [{code}]({code}.md) | `{rule.name}` | {rule.severity.value} |" in index


def test_every_rule_summary_is_its_whole_first_sentence() -> None:
    # IMG003's was cut at its docstring's line break ("... an unbalanced span, or a pad").
    for code, rule in RULES.items():
        summary = rule.summary()
        assert summary.endswith((".", ")")) and "\n" not in summary and "  " not in summary, (code, summary)
        assert summary in " ".join((rule.__doc__ or "").split()), code
    assert RULES["IMG003"].summary().endswith("or a pad outside one.")


def test_prose_from_docstrings_is_escaped_outside_code_spans() -> None:
    from audit.cli.catalog import _markdown

    assert _markdown("ids below 2**32, kimik2_detector, `<|im_end|>` and <think>") == (
        r"ids below 2\*\*32, kimik2\_detector, `<|im_end|>` and &lt;think>"
    )
    assert _markdown("a | b") == r"a \| b"  # a summary in the index table stays one cell


def test_writing_the_pages_removes_only_pages_of_rules_that_are_gone(tmp_path: Path) -> None:
    (tmp_path / "XYZ999.md").write_text("# a rule that no longer exists\n")
    (tmp_path / "notes.md").write_text("kept\n")
    done = runner.invoke(app, ["rules", "--docs", str(tmp_path)])
    assert done.exit_code == 0, done.output
    assert not (tmp_path / "XYZ999.md").exists() and (tmp_path / "notes.md").read_text() == "kept\n"
    assert (tmp_path / "SEG001.md").is_file() and f"wrote {len(RULES) + 1} pages" in done.output


@pytest.mark.parametrize(
    ("argument", "says"),
    [("", "--docs needs a directory"), ("README.md", "not a directory"), ("README.md/rules", "cannot write")],
)
def test_a_bad_docs_directory_is_one_error_line(argument: str, says: str) -> None:
    done = runner.invoke(app, ["rules", "--docs", str(ROOT / argument) if argument else argument])
    assert done.exit_code == 2
    lines = done.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("audit: error:") and says in lines[0], done.output


def test_every_page_is_in_the_navigation_and_every_entry_is_a_page() -> None:
    listed = site_pages()
    assert len(listed) == len(set(listed)), "a page is listed twice in mkdocs.yml's nav"
    absent = [p.relative_to(ROOT).as_posix() for p in listed if not p.is_file()]
    assert not absent, f"mkdocs.yml's nav lists pages that do not exist: {absent}"
    unlisted = sorted(p.relative_to(ROOT).as_posix() for p in DOCS.rglob("*.md") if p not in set(listed))
    assert not unlisted, f"pages missing from mkdocs.yml's nav (add them): {unlisted}"


def test_the_readme_is_a_front_door_into_the_pages() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 300
    links = set(re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text))
    local = {link for link in links if "://" not in link}
    assert not [link for link in local if not (ROOT / link).exists()], "README links to files that do not exist"
    top_pages = {p.relative_to(ROOT).as_posix() for p in DOCS.glob("*.md")} - {"docs/index.md"}
    assert top_pages <= local, f"README has no line for {sorted(top_pages - local)}"
    assert "docs/rules/index.md" in local and "CONTRIBUTING.md" in local


def test_ci_builds_the_site_strictly() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "pip install -e '.[docs]' && mkdocs build --strict" in ci


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="the docs extra is not installed")
def test_the_site_builds_with_no_warning(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not re.search(r"^(WARNING|ERROR)\s+-", done.stderr, re.MULTILINE), done.stderr[-3000:]
    assert (tmp_path / "site" / "rules" / "SEG001" / "index.html").is_file()
    api = (tmp_path / "site" / "python-api" / "index.html").read_text(encoding="utf-8")
    assert 'id="audit.api.check_target"' in api  # mkdocstrings read the docstrings


def test_the_input_contract_page_types_every_meta_info_field_the_reader_checks() -> None:
    """The page's meta_info table names exactly the fields `audit/records/meta_info.py` types."""
    from audit.records.meta_info import FINISH_FIELDS, META_FIELDS

    page = (ROOT / "docs" / "input-contract.md").read_text(encoding="utf-8")
    table = page.split("## meta_info", 1)[1]
    named = set()
    for row in table.splitlines():
        if row.startswith("| `"):
            named |= set(re.findall(r"`([a-z_.0-9]+)`", row.split(" | ")[0]))
    typed = set(META_FIELDS) | {f"finish_reason.{name}" for name in FINISH_FIELDS}
    assert named - {"finish_reason", "finish_reason.type"} == typed

"""The documented commands run as written: every shell and Python example of the README and of
the documentation pages (docs/), with the exit code it states.

A command (or a whole block, by a comment on its first lines) marked `# needs your own ...`
needs the reader's model, tokenizer, servers or training script; one marked `until you press`
is a live view. Every other command runs here, from the root of a copy of the repository, in
order: the README's, then each page's in the site's order (mkdocs.yml's `nav`), so a page may
use what an earlier one made (a report, a gated output). Each must exit with the code its
comment states (`exit 1`), else 0. The two set-up commands at the top of the README are what
`.ci/run` runs; that they say the same is checked too, and a page that repeats them does not
run them again.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SITE = ROOT / "mkdocs.yml"
SKIP_MARKERS = ("needs your own", "until you press")
# What a copy of the repository leaves out: environments, caches and earlier runs' outputs.
NOT_COPIED = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", ".audit-cache", "reports", "gated", "tryout", ".data", ".pytest_cache",
    ".hypothesis", "*.html", "site",
)


@dataclass(frozen=True)
class Example:
    """One runnable example: a shell command or a Python block, where it is and its exit code."""

    source: str  # the file, relative to the repository root
    line: int
    language: str  # "bash" or "python"
    text: str
    exit_code: int


def code_blocks(text: str) -> list[tuple[int, str, str]]:
    """(first line number, language, body) of every fenced block."""
    blocks, lines, at = [], text.splitlines(), 0
    while at < len(lines):
        opening = re.match(r"^```(\w*)\s*$", lines[at])
        if opening is None:
            at += 1
            continue
        end = next(i for i in range(at + 1, len(lines)) if lines[i].startswith("```"))
        blocks.append((at + 2, opening.group(1), "\n".join(lines[at + 1 : end])))
        at = end + 1
    return blocks


def _comment(line: str) -> str:
    """The comment ending a shell line (after a `#` that follows whitespace), or ""."""
    found = re.search(r"(?:^|\s)#(?!!)\s?(.*)$", line)
    return found.group(1) if found else ""


def shell_commands(first: int, body: str, source: str = "README.md") -> list[Example]:
    """The commands of a shell block: continuation lines joined, comment lines dropped."""
    lines = body.splitlines()
    head = " ".join(_comment(line) for line in lines[:2] if line.lstrip().startswith("#"))
    if any(marker in head for marker in SKIP_MARKERS):
        return []
    commands: list[Example] = []
    pending, start = "", first
    for number, line in enumerate(lines, start=first):
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        command = pending + line
        pending = ""
        comment = _comment(command)
        if any(marker in comment for marker in SKIP_MARKERS):
            continue
        stated = re.search(r"\bexits? (\d+)", comment)
        commands.append(Example(source, start, "bash", command, int(stated.group(1)) if stated else 0))
    return commands


def file_examples(path: Path) -> list[Example]:
    """Every runnable example of one Markdown file, in order."""
    source = path.relative_to(ROOT).as_posix()
    examples: list[Example] = []
    for first, language, body in code_blocks(path.read_text(encoding="utf-8")):
        if language in ("bash", "sh", "shell"):
            examples.extend(shell_commands(first, body, source))
        elif language == "python" and not any(marker in body for marker in SKIP_MARKERS):
            examples.append(Example(source, first, "python", body, 0))
    return examples


def site_pages() -> list[Path]:
    """The documentation pages in the site's order: mkdocs.yml's `nav`, depth first."""
    def walk(entry: object) -> list[str]:
        if isinstance(entry, str):
            return [entry]
        if isinstance(entry, dict):
            return [page for value in entry.values() for page in walk(value)]
        if isinstance(entry, list):
            return [page for item in entry for page in walk(item)]
        return []

    config = yaml.safe_load(SITE.read_text(encoding="utf-8"))
    return [ROOT / config.get("docs_dir", "docs") / page for page in walk(config["nav"])]


def readme_examples() -> tuple[list[Example], list[Example]]:
    """The set-up commands (the README's first two shell blocks) and every other runnable
    example: the README's, then the documentation pages' in the site's order."""
    readme = file_examples(README)
    setup = [e for e in readme if e.language == "bash"][:2]
    examples = [e for e in readme if e not in setup]
    done = {e.text for e in setup}  # a page that repeats the set-up does not run it again
    for page in site_pages():
        examples.extend(e for e in file_examples(page) if e.text not in done)
    return setup, examples


def test_the_readme_examples_are_found_and_marked() -> None:
    # The extraction itself: a change of notation must not leave the test running nothing.
    setup, examples = readme_examples()
    assert [e.text for e in setup] == [
        "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && audit check B1_glaive",
        ". .venv/bin/activate && pip install --no-deps 'sglang==0.5.23' && pytest",
    ]
    texts = [e.text for e in examples]
    assert setup[0].line < setup[1].line < min(e.line for e in examples if e.source == "README.md")
    assert any(t.startswith("audit generate fixtures/prompts/sample.jsonl") for t in texts)
    assert not any("/models/" in t or "10.0.0." in t or "train_eagle3" in t for t in texts)
    assert not any(t.strip() == "audit watch B1_glaive" for t in texts)  # live: until q
    assert {e.exit_code for e in examples} == {0, 1, 2}  # 2: a page shows a refusal
    assert len(examples) >= 20
    # The pages' examples run too, after the README's, and none repeats the set-up.
    sources = [e.source for e in examples]
    assert sources.index("docs/getting-started.md") > max(i for i, s in enumerate(sources) if s == "README.md")
    for page in ("getting-started", "gating-and-ci", "object-storage-and-ray", "generating", "inspecting",
                 "reports-and-html", "profiles", "python-api"):
        assert f"docs/{page}.md" in sources, page
    assert not {e.text for e in examples} & {e.text for e in setup}


def test_ci_runs_the_readme_set_up_commands_as_written() -> None:
    setup, _ = readme_examples()
    install, check = setup[0].text.rsplit(" && ", 1)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert install in ci and check in ci, ".ci/run must install and audit as README command 1 says"
    assert setup[1].text in ci, ".ci/run must run README command 2 as written"


def _copy_of_the_repository(destination: Path) -> Path:
    """The repository as a fresh clone has it: git's files (tracked, or new and not ignored), so
    that what earlier runs of the examples wrote (`exported/`, `vocab/`, ...) is not there."""
    listed = None
    if (ROOT / ".git").exists() and shutil.which("git"):
        found = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                               cwd=ROOT, capture_output=True, check=False)
        listed = found.stdout.decode().split("\0") if found.returncode == 0 else None
    if listed is None:  # not a git checkout: everything but what runs and tools leave behind
        shutil.copytree(ROOT, destination, ignore=NOT_COPIED, symlinks=True)
        return destination
    for name in filter(None, listed):
        source = ROOT / name
        if not source.is_file() and not source.is_symlink():
            continue  # deleted in the working tree
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    return destination


def test_every_readme_example_runs_as_written(tmp_path: Path) -> None:
    _, examples = readme_examples()
    copy = _copy_of_the_repository(tmp_path / "repository")
    env = {k: v for k, v in os.environ.items() if k not in ("AUDIT_DATA_ROOT", "AUDIT_KEEP_REPORTS", "COLUMNS")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    try:
        for example in examples:
            argv = ["bash", "-c", example.text] if example.language == "bash" else [sys.executable, "-c", example.text]
            done = subprocess.run(argv, cwd=copy, env=env, capture_output=True, text=True, timeout=300, check=False,
                                  stdin=subprocess.DEVNULL)
            assert done.returncode == example.exit_code, (
                f"{example.source}:{example.line}: {example.text!r} exited {done.returncode}, the page says "
                f"{example.exit_code}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
            )
    finally:
        for standin in (copy / "tryout").glob("standin*.pid"):  # a failure between starting a stand-in and stopping it
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(standin.read_text()), 15)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("audit check B1_glaive   # a partition (exit 1)", ("audit check B1_glaive   # a partition (exit 1)", 1)),
        ("audit check B0_clean", ("audit check B0_clean", 0)),
        ("audit watch X  # the live table, until you press q", None),
        ("audit check run/x.jsonl --tokenizer /models/K  # needs your own model", None),
    ],
)
def test_a_command_states_its_exit_code_or_is_skipped_by_its_marker(line: str, expected) -> None:
    found = shell_commands(1, line)
    assert ([(e.text, e.exit_code) for e in found] or [None]) == [expected]

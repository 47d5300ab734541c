"""Trust under attack: hostile records, hostile reports, concurrent runs and killed runs.

Each test is an attack that worked before its fix (a crash, a command injected, an escape
sequence sent to the terminal, two runs writing one output, a leftover never removed).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

import audit.base.files
from audit.base import inert
from audit.base.errors import ConfigError, InputError
from audit.base.files import LOCK_FILE, lock_output, open_temporary, write_file
from audit.cli import app
from audit.cli.tables import first_findings, report_table, verdict_line
from audit.engine.runner import audit_file
from audit.flows.checking import check_session
from audit.flows.gating import gate_session, iter_quarantine
from audit.flows.session import CheckOptions, prepare
from audit.flows.targets import resolve_target
from audit.report.formats import format_reports, step_summary
from audit.report.history import diff_reports, load_report
from audit.report.html import render_html
from tests import tiktoken_remote_code
from tests.conftest import KIMI_TOKENIZER, PREPARED, ROOT
from tests.permissions import audit_bound_by_permissions

runner = CliRunner()
CLEAN_DATA = PREPARED / "B0_clean" / "raw_responses.jsonl"
KIMI = ("--profile", "kimi-k2.5", "--tokenizer", str(KIMI_TOKENIZER))


def cli(*args: str):
    return runner.invoke(app, list(args))


def audit_process(*args: str, **kwargs) -> subprocess.Popen:
    """`audit ARGS` as a separate process (the test's AUDIT_CACHE_DIR is inherited)."""
    return subprocess.Popen(
        [sys.executable, "-m", "audit", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def assert_one_line_error(result, says: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output and "internal error" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert says in result.output, result.output


# == Locks: one run writes an output at a time ====================================================

HOLD_LOCK = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from audit.base.files import lock_output
    lock = lock_output(Path(sys.argv[1]), command="audit gate held-by-test")
    print("locked", flush=True)
    time.sleep(120)
    """
)


def hold_lock(directory: Path) -> subprocess.Popen:
    """Another process that takes the output's lock and keeps it until killed."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(directory)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_second_gate_into_a_locked_output_refuses_at_once_naming_the_holder(tmp_path):
    out = tmp_path / "gated"
    holder = hold_lock(out)
    try:
        started = time.monotonic()
        second = audit_process("gate", "B0_clean", "--data-root", str(PREPARED), "--out", str(out))
        _, stderr = second.communicate(timeout=120)
        assert second.returncode == 2, stderr
        assert len(stderr.strip().splitlines()) == 1, stderr
        assert "in use by another audit run" in stderr
        assert f"pid {holder.pid}" in stderr and "audit gate held-by-test" in stderr
        assert time.monotonic() - started < 60  # refused, not waiting for the holder
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # nothing written
    finally:
        holder.kill()
        holder.wait()

    # The holder was killed (SIGKILL): its lock file is still there, and must not block.
    assert (out / LOCK_FILE).exists()
    third = cli("gate", "B0_clean", "--data-root", str(PREPARED), "--out", str(out))
    assert third.exit_code == 0, third.output
    assert sorted(p.name for p in out.iterdir()) == [
        "clean.jsonl",
        "manifest.json",
        "quarantine.jsonl",
    ]


def test_two_gates_of_different_inputs_into_one_output_never_mix(tmp_path):
    out = tmp_path / "gated"
    runs = [
        audit_process("gate", name, "--data-root", str(PREPARED), "--out", str(out))
        for name in ("B0_clean", "B1_glaive")
    ]
    outcomes = [(run.wait(timeout=300), run.stderr.read()) for run in runs]
    codes = sorted(code for code, _ in outcomes)
    # One gate wrote; the other was refused (the lock, or the first one's finished output).
    assert codes[1] == 2 and codes[0] in (0, 1), outcomes
    refused = next(stderr for code, stderr in outcomes if code == 2)
    assert "in use by another audit run" in refused or "holds the gate of" in refused
    manifest = json.loads((out / "manifest.json").read_text())
    clean = (out / "clean.jsonl").read_bytes()
    assert hashlib.sha256(clean).hexdigest() == manifest["outputs"]["clean.jsonl"]["sha256"]
    source = PREPARED / manifest["target"] / "raw_responses.jsonl"
    assert manifest["input"]["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()


def test_the_gate_api_takes_the_lock_too(tmp_path):
    import audit

    out = tmp_path / "gated"
    with (
        lock_output(out, command="someone else"),
        pytest.raises(audit.InputError, match="in use by another audit run"),
    ):
        audit.gate("B0_clean", out, data_root=PREPARED)
    assert audit.gate("B0_clean", out, data_root=PREPARED).clean == 30
    assert not (out / LOCK_FILE).exists()  # released and removed at the end of the run


def test_a_lock_file_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path):
    out = tmp_path / "gated"
    out.mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    (out / LOCK_FILE).symlink_to(precious)
    result = cli("gate", "B0_clean", "--data-root", str(PREPARED), "--out", str(out))
    assert_one_line_error(result, "symbolic link")
    assert precious.read_text() == "keep me\n"


def test_an_output_reached_through_a_symlink_is_locked_as_the_real_directory(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    holder = hold_lock(real)
    try:
        result = cli("gate", "B0_clean", "--data-root", str(PREPARED), "--out", str(link))
        assert_one_line_error(result, "in use by another audit run")
    finally:
        holder.kill()
        holder.wait()
    assert cli("gate", "B0_clean", "--data-root", str(PREPARED), "--out", str(link)).exit_code == 0
    assert (real / "clean.jsonl").read_bytes() == CLEAN_DATA.read_bytes()


def test_a_forged_holder_in_the_lock_file_prints_as_one_inert_line(tmp_path):
    out = tmp_path / "gated"
    out.mkdir()
    holder = hold_lock(out)
    try:
        forged = {
            "pid": "1\n::error::x",
            "host": "\x1b]0;owned\x07",
            "command": "[/][bold " + "x" * 5000,
        }
        (out / LOCK_FILE).write_text(json.dumps(forged))
        result = cli("gate", "B0_clean", "--data-root", str(PREPARED), "--out", str(out))
    finally:
        holder.kill()
        holder.wait()
    assert_one_line_error(result, "in use by another audit run")
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert "[/][bold" in result.output and len(result.output) < 2000


def generate_args(prompts: Path, out: Path, url: str, *extra: str) -> list[str]:
    return [
        "generate",
        str(prompts),
        *KIMI,
        "--out",
        str(out),
        "--server",
        url,
        "--retry-backoff",
        "0.01",
        "--canary",
        "0",
        *extra,
    ]


def write_prompts(path: Path, n: int) -> Path:
    lines = [
        {"id": f"p{i}", "messages": [{"role": "user", "content": f"What is {i} plus 2?"}]}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(p) + "\n" for p in lines))
    return path


@pytest.fixture
def slow_server():
    from tests.sglang_standin import SGLangStandin

    server = SGLangStandin(KIMI_TOKENIZER, delay=0.05).start()
    yield server
    server.stop()


def test_two_generate_runs_on_one_output_write_every_prompt_once(tmp_path, slow_server):
    prompts = write_prompts(tmp_path / "prompts.jsonl", 40)
    out = tmp_path / "part" / "raw_responses.jsonl"
    first = audit_process(*generate_args(prompts, out, slow_server.url, "--concurrency", "2"))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (out.exists() and out.read_bytes().count(b"\n") >= 2):
        assert first.poll() is None, first.communicate()
        time.sleep(0.05)

    slow_server.delay = 1.0  # the first run stays busy however long the second takes to start
    second = audit_process(*generate_args(prompts, out, slow_server.url, "--concurrency", "8"))
    _, stderr = second.communicate(timeout=120)
    slow_server.delay = 0.0
    assert second.returncode == 2, stderr
    assert len(stderr.strip().splitlines()) == 1 and "in use by another audit run" in stderr
    assert f"pid {first.pid}" in stderr

    _, first_err = first.communicate(timeout=300)
    assert first.returncode == 0, first_err
    ids = [json.loads(line)["id"] for line in out.read_bytes().splitlines()]
    assert sorted(ids) == sorted(f"p{i}" for i in range(40))  # each prompt exactly once
    assert not (out.parent / LOCK_FILE).exists()


def test_a_killed_generate_run_does_not_block_the_next(tmp_path, slow_server):
    prompts = write_prompts(tmp_path / "prompts.jsonl", 30)
    out = tmp_path / "part" / "raw_responses.jsonl"
    slow_server.delay = 0.3  # still running when it is killed
    first = audit_process(*generate_args(prompts, out, slow_server.url, "--concurrency", "2"))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (out.exists() and out.read_bytes().count(b"\n") >= 3):
        time.sleep(0.05)
    assert first.poll() is None
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    slow_server.delay = 0.0
    assert (out.parent / LOCK_FILE).exists()  # left behind by the killed run

    result = cli(*generate_args(prompts, out, slow_server.url, "--concurrency", "8"))
    assert result.exit_code == 0, result.output
    ids = [json.loads(line)["id"] for line in out.read_bytes().splitlines()]
    assert sorted(ids) == sorted(f"p{i}" for i in range(30))
    assert not (out.parent / LOCK_FILE).exists()


def test_watch_only_reads_and_takes_no_lock(tmp_path):
    holder = hold_lock(tmp_path)
    try:
        data = tmp_path / "raw_responses.jsonl"
        data.write_bytes(CLEAN_DATA.read_bytes())
        result = cli("watch", str(data), *KIMI, "--once")
    finally:
        holder.kill()
        holder.wait()
    assert result.exit_code == 0, result.output


# == Text from data and reports is inert ==========================================================

# Everything an id, a message or a name could carry to attack whoever reads the output.
HOSTILE_TEXT = (
    "[/][bold [link=file:///etc/passwd]click[/link] "
    "\x1b]0;title\x07 \x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\ \x1b[2J\x1b[31m "
    "a\rOVERWRITE \u202eevil\u2066 :: %0A,title=x \x00\x7f\x9b end"
)
RAW_CONTROLS = ("\x1b", "\x07", "\r", "\x00", "\x7f", "\x9b", "\u202e", "\u2066")


def assert_inert(text: str) -> None:
    for control in RAW_CONTROLS:
        assert control not in text, f"{control!r} reached the output raw"


def hostile_partition(tmp_path: Path, ids: list[str]) -> Path:
    """A data file whose records carry hostile ids and fail rules (an empty output)."""
    template = json.loads(CLEAN_DATA.read_bytes().splitlines()[0])
    data = tmp_path / "hostile.jsonl"
    with data.open("w") as out:
        for record_id in ids:
            out.write(json.dumps({**template, "id": record_id, "output_ids": []}) + "\n")
    return data


@pytest.fixture
def hostile_report(tmp_path) -> Path:
    """A saved report of hostile records, with hostile text in every field a person reads."""
    data = hostile_partition(tmp_path, [HOSTILE_TEXT, "x" * 100_000])
    path = tmp_path / "hostile-report.json"
    result = cli("check", str(data), *KIMI, "--report", str(path), "--format", "json")
    assert result.exit_code == 1, result.output
    report = json.loads(path.read_text())
    report["target"] = HOSTILE_TEXT
    report["profile"]["name"] = HOSTILE_TEXT
    report["input"]["path"] = HOSTILE_TEXT
    for result in report["results"][:3]:
        result["code"] = HOSTILE_TEXT[:40]
        result["name"] = HOSTILE_TEXT
        result["warn_above"] = HOSTILE_TEXT
    report["findings"][0]["message"] = HOSTILE_TEXT
    path.write_text(json.dumps(report))
    return path


def test_check_tables_show_hostile_ids_escaped_never_raw(tmp_path):
    data = hostile_partition(tmp_path, [HOSTILE_TEXT, "x" * 100_000])
    result = cli("check", str(data), *KIMI, "--reports-dir", str(tmp_path / "reports"))
    assert result.exit_code == 1, result.output
    assert_inert(result.output)
    assert "\\x1b" in result.output
    assert len(result.output) < 20_000  # a 100,000-character id is cut in the table


def test_report_and_diff_render_hostile_reports_as_text(hostile_report, tmp_path):
    for args in (
        ("report", str(hostile_report)),
        ("diff", str(hostile_report), str(hostile_report)),
        ("report", str(hostile_report), "--format", "jsonl"),
    ):
        result = cli(*args)
        assert result.exit_code == 0, (args, result.output)
        assert "internal error" not in result.output
        if args[-1] != "jsonl":
            assert_inert(result.output)


def test_rich_tables_print_markup_from_reports_literally(hostile_report):
    report = load_report(hostile_report)
    console = Console(record=True, width=4000, color_system="truecolor", force_terminal=True)
    for renderable in (report_table(report), first_findings(report), verdict_line(report)):
        console.print(renderable)
    styled = console.export_text(styles=True, clear=False)
    text = console.export_text()
    assert "[/][bold [link=file:///etc/passwd]click[/link]" in text
    assert "\x1b]8;" not in styled  # no hyperlink was made from the data
    assert "\\x1b]0;title\\x07" in text and "\\u202e" in text and "\\x0d" in text
    assert "x" * 1000 not in text


def test_inspect_and_watch_show_hostile_ids_escaped(tmp_path):
    data = hostile_partition(tmp_path, [HOSTILE_TEXT, "ok"])
    printed = cli("inspect", str(data), *KIMI, "--print")
    assert printed.exit_code == 0, printed.output
    assert_inert(printed.output)
    assert "[/][bold" in printed.output
    watched = cli("watch", str(tmp_path / "hostile.jsonl"), *KIMI, "--once")
    assert watched.exit_code == 1, watched.output
    assert_inert(watched.output)


def test_github_annotations_cannot_be_injected(hostile_report):
    result = cli("report", str(hostile_report), "--format", "github")
    assert result.exit_code == 0, result.output
    assert_inert(result.stdout)
    lines = result.stdout.splitlines()
    assert lines and all(line.startswith(("::error ", "::warning ", "::notice ")) for line in lines)
    for line in lines:
        # `::command props::message`: the data ends neither the properties nor the line.
        command, _, message = line.partition("::")[2].partition("::")
        properties = command.split(" ", 1)[1]
        for prop in properties.split(","):
            name, _, value = prop.partition("=")
            assert name in ("file", "line", "title"), line
            assert "::" not in value and "\n" not in value
        assert "%0A" not in message or "\n" not in message


def test_github_step_summary_cells_are_not_markdown(hostile_report, tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert cli("report", str(hostile_report), "--format", "github").exit_code == 0
    text = summary.read_text()
    assert_inert(text)
    unescaped = re.sub(r"\\\\", "", text)  # an escaped backslash escapes nothing after it
    assert not re.search(r"(?<!\\)[\[\]<`]", unescaped)  # no link, image, HTML or code from data
    for row in (line for line in text.splitlines() if line.startswith("| ")):
        cells = row.replace("\\|", "").count("|")
        assert cells in (6, 7), row  # the header's cell count: no cell was split or added


def test_junit_and_sarif_stay_valid_with_hostile_text(hostile_report):
    junit = cli("report", str(hostile_report), "--format", "junit")
    assert junit.exit_code == 0, junit.output
    root = ET.fromstring(junit.stdout.encode())  # XML-illegal control characters are escaped
    names = [case.get("name") for case in root.iter("testcase")]
    assert any("[/][bold" in name for name in names)
    sarif = cli("report", str(hostile_report), "--format", "sarif")
    assert sarif.exit_code == 0, sarif.output
    assert json.loads(sarif.stdout)["runs"][0]["properties"]["target"] == HOSTILE_TEXT


def test_html_escapes_hostile_reports(hostile_report, tmp_path):
    page = tmp_path / "page.html"
    result = cli("report", str(hostile_report), "--html", str(page))
    assert result.exit_code == 0, result.output
    html = page.read_text()
    assert "[link=file:///etc/passwd]" in html and "<link" not in html.lower().replace(
        "<link rel", ""
    )


def saved_report(tmp_path: Path) -> dict:
    path = tmp_path / "base.json"
    assert (
        cli("check", "B1_glaive", "--data-root", str(PREPARED), "--report", str(path)).exit_code
        == 1
    )
    return json.loads(path.read_text())


WRONG_TYPES = {
    "profile-null": (lambda d: d.update(profile=None), "profile must be an object"),
    "distributions-string": (
        lambda d: d.update(distributions="x"),
        "distributions must be an object",
    ),
    "distributions-histogram": (
        lambda d: d["distributions"]["prompt_tokens"].update(counts=[1, "2"]),
        "counts must be a list of counts",
    ),
    "distributions-edges": (
        lambda d: d["distributions"]["output_tokens"].update(edges=[0]),
        "edges must be one longer than counts",
    ),
    "distributions-huge": (
        lambda d: d["distributions"]["output_tokens"].update(edges=[0, 1e300]),
        "rising list of numbers",
    ),
    "findings-string": (lambda d: d.update(findings="x"), "findings must be a list"),
    "finding-not-object": (lambda d: d.update(findings=[5]), "findings[0] must be an object"),
    "finding-id-list": (
        lambda d: d["findings"][0].update(id=[1]),
        "findings[0].id must be a string",
    ),
    "finding-message-object": (
        lambda d: d["findings"][1].update(message={}),
        "findings[1].message",
    ),
    "rule-missing-name": (lambda d: d["results"][0].pop("name"), "results[0].name"),
    "rule-missing-verdict": (lambda d: d["results"][2].pop("verdict"), "results[2].verdict"),
    "rule-lines-strings": (
        lambda d: d["results"][0].update(example_lines=["1,title=x"]),
        "example_lines",
    ),
    "rule-threshold-list": (lambda d: d["results"][0].update(fail_above=[1]), "fail_above"),
    "results-object": (lambda d: d.update(results={}), "results must be a list"),
    "seconds-string": (lambda d: d.update(seconds="1"), "seconds must be a finite number"),
    "input-path-number": (lambda d: d["input"].update(path=5), "input.path must be a string"),
    "input-path-missing": (lambda d: d["input"].pop("path"), "input.path must be a string"),
    "tokenizer-path-null": (lambda d: d["tokenizer"].update(path=None), "tokenizer.path"),
    "tokenizer-vocab": (lambda d: d["tokenizer"].update(vocab_size="big"), "tokenizer.vocab_size"),
}


@pytest.fixture(scope="module")
def base_report(tmp_path_factory) -> dict:
    return saved_report(tmp_path_factory.mktemp("base"))


@pytest.mark.parametrize("case", sorted(WRONG_TYPES))
@pytest.mark.parametrize("command", ["report", "report-html", "report-junit", "diff"])
def test_hand_edited_reports_with_wrong_types_are_one_error_line(
    tmp_path, base_report, case, command
):
    edit, says = WRONG_TYPES[case]
    data = json.loads(json.dumps(base_report))
    edit(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(base_report))
    args = {
        "report": ["report", str(bad)],
        "report-html": ["report", str(bad), "--html", str(tmp_path / "page.html")],
        "report-junit": ["report", str(bad), "--format", "junit"],
        "diff": ["diff", str(good), str(bad)],
    }[command]
    assert_one_line_error(cli(*args), says)
    assert not (tmp_path / "page.html").exists()


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b'{"results": [], "schema_version": 1, "target": "\\ud800"}', "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
    ],
    ids=["lone-surrogate", "deep-nesting"],
)
def test_reports_no_writer_could_print_or_parse_are_refused(tmp_path, content, says):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    assert_one_line_error(cli("report", str(bad)), says)


@pytest.mark.parametrize("target", ["../../outside", "a/b", "x\x00y", "..", ""])
def test_a_report_target_never_names_a_page_outside_the_html_directory(
    tmp_path, base_report, target
):
    hostile = json.loads(json.dumps(base_report))
    hostile["target"] = target
    (tmp_path / "hostile.json").write_text(json.dumps(hostile))
    (tmp_path / "good.json").write_text(json.dumps(base_report))
    pages = tmp_path / "pages"
    pages.mkdir()
    result = cli(
        "report",
        str(tmp_path / "hostile.json"),
        str(tmp_path / "good.json"),
        "--html",
        str(pages / "audit.html"),
    )
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in tmp_path.rglob("*.html"))
    assert len(written) == 2 and all((pages / name).is_file() for name in written), written


def test_a_partition_name_cannot_inject_github_commands(tmp_path):
    partition = tmp_path / "p%0A\n::error title=injected::pwned,x:y"
    partition.mkdir()
    (partition / "raw_responses.jsonl").write_bytes(
        PREPARED.joinpath("B1_glaive", "raw_responses.jsonl").read_bytes()
    )
    result = cli(
        "check", str(partition), *KIMI, "--format", "github", "--reports-dir", str(tmp_path / "r")
    )
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert not any(line.startswith("::error title=injected") for line in lines)
    assert all(line.startswith(("::error ", "::warning ", "::notice ")) for line in lines)


@given(st.text())
def test_inert_text_never_carries_a_control_character_raw(text):
    shown = inert.terminal(text)
    assert not any(c in shown for c in RAW_CONTROLS) and "\n" not in shown
    assert not any(0xD800 <= ord(c) <= 0xDFFF for c in shown)
    shown.encode("utf-8")  # printable whatever the data held
    ET.fromstring(f"<a b={quoteattr(inert.xml(text))}>{escape(inert.xml(text))}</a>")
    data = inert.github_data(text)
    assert "\n" not in data and "\r" not in data
    assert "::" not in inert.github_property(text) and "," not in inert.github_property(text)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


def _paths(value, prefix=()):
    """Every (path, value) inside a JSON value, for replacing one of them."""
    yield prefix
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value[:3]):
            yield from _paths(inner, (*prefix, index))


@pytest.fixture(scope="module")
def fuzz_base(tmp_path_factory) -> tuple[dict, list[tuple]]:
    report = saved_report(tmp_path_factory.mktemp("fuzz"))
    report["findings"] = report["findings"][:5]
    return report, [path for path in _paths(report) if path]


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_value_anywhere_in_a_report_is_rendered_or_refused_in_one_line(
    fuzz_base, tmp_path, data
):
    base, paths = fuzz_base
    report = json.loads(json.dumps(base))
    path = data.draw(st.sampled_from(paths))
    parent = report
    for key in path[:-1]:
        parent = parent[key]
    if data.draw(st.booleans()) and isinstance(parent, dict):
        del parent[path[-1]]  # a key cut out
    else:
        parent[path[-1]] = data.draw(JSON_VALUES)
    saved = tmp_path / "fuzzed.json"
    saved.write_text(json.dumps(report))
    try:
        loaded = load_report(saved)
    except InputError as error:
        assert "\n" not in str(error)
        return
    # Loaded: then every renderer draws it.
    console = Console(record=True, width=200, file=io.StringIO())
    for renderable in (report_table(loaded), first_findings(loaded), verdict_line(loaded)):
        if renderable is not None:
            console.print(renderable)
    for fmt in ("json", "jsonl", "junit", "sarif", "github"):
        text = format_reports([loaded], fmt)
        if fmt == "junit":
            ET.fromstring(text.encode())
    step_summary([loaded])
    render_html(loaded)
    diff_reports(loaded, loaded)


# == Crash leftovers and durability ===============================================================


def killed_writer_leftover(directory: Path, name: str, size: int = 1 << 16) -> Path:
    """A temporary as a killed run leaves it: written, never renamed, held by nobody."""
    temporary = open_temporary(directory, name)
    temporary.file.write(b"x" * size)
    temporary.file.close()  # the process died: its lock went with it
    return temporary.path


def test_a_killed_gate_leaves_temporaries_the_next_gate_removes(tmp_path):
    out = tmp_path / "gated"
    out.mkdir()
    leftovers = [
        killed_writer_leftover(out, "clean.jsonl"),
        killed_writer_leftover(out, "quarantine.jsonl"),
        out / ".manifest.json.k2j3h4l5.tmp",  # named by an older version
    ]
    leftovers[-1].write_bytes(b"{}")
    others = [out / "notes.tmp", out / ".cache.tmp", out / ".clean.jsonl.not-ours.tmp"]
    for path in others:
        path.write_bytes(b"mine")

    result = cli("gate", "B0_clean", "--data-root", str(PREPARED), "--out", str(out), "--force")
    assert result.exit_code == 0, result.output
    assert not any(path.exists() for path in leftovers)
    assert all(path.read_bytes() == b"mine" for path in others)


def test_a_real_gate_killed_mid_write_is_cleaned_by_the_next_run(tmp_path):
    big = tmp_path / "big.jsonl"
    lines = CLEAN_DATA.read_bytes().splitlines(keepends=True)
    big.write_bytes(b"".join(lines * 200))  # large enough to kill while it writes (ids repeat)
    out = tmp_path / "gated"
    args = ("gate", str(big), *KIMI, "--out", str(out))
    for delay in (0.0, 0.1, 0.3):
        gate = audit_process(*args)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and gate.poll() is None:
            if out.exists() and any(p.name.endswith(".tmp") for p in out.iterdir()):
                time.sleep(delay)
                break
            time.sleep(0.005)
        gate.kill()
        gate.wait()
        if out.exists() and any(p.name.endswith(".tmp") for p in out.iterdir()):
            break
    else:
        pytest.skip("the gate finished before it could be killed mid-write")

    result = cli(*args, "--force")
    assert result.exit_code == 1, result.output  # INT004: the repeated ids
    assert sorted(p.name for p in out.iterdir()) == [
        "clean.jsonl",
        "manifest.json",
        "quarantine.jsonl",
    ]


def test_a_temporary_a_live_process_holds_is_never_removed(tmp_path):
    hold = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from audit.base.files import open_temporary
        temporary = open_temporary(Path(sys.argv[1]), "report.json")
        temporary.file.write(b"half")
        temporary.file.flush()
        print(temporary.path, flush=True)
        time.sleep(120)
        """
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", hold, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        live = Path(writer.stdout.readline().strip())
        stale = killed_writer_leftover(tmp_path, "report.json")
        write_file(tmp_path / "report.json", "{}\n")  # a write into the directory cleans it
        assert live.exists() and not stale.exists()
    finally:
        writer.kill()
        writer.wait()
    write_file(tmp_path / "report.json", "{}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_leftovers_that_are_links_or_directories_are_left_alone(tmp_path):
    target = tmp_path / "target.txt"
    target.write_text("keep")
    link = tmp_path / ".report.json.audit-abcdefgh.tmp"
    link.symlink_to(target)
    directory = tmp_path / ".report.json.audit-ijklmnop.tmp"
    directory.mkdir()
    write_file(tmp_path / "report.json", "{}\n")
    assert link.is_symlink() and directory.is_dir() and target.read_text() == "keep"


def test_reports_and_pages_clean_their_directory_too(tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    stale = killed_writer_leftover(reports, "B0_clean-20260101T000000Z.json")
    result = cli("check", "B0_clean", "--data-root", str(PREPARED), "--reports-dir", str(reports))
    assert result.exit_code == 0, result.output
    assert not stale.exists()


@pytest.fixture
def sync_log(monkeypatch) -> list[tuple[str, str]]:
    """Every fsync, rename and unlink the file module does, in order, by path."""
    log: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        log.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        log.append(("rename", str(Path(dst).resolve())))
        return real_replace(src, dst)

    monkeypatch.setattr(audit.base.files.os, "fsync", fsync)  # the same `os` module everywhere
    monkeypatch.setattr(audit.base.files.os, "replace", replace)
    return log


def assert_durable(log: list[tuple[str, str]], output: Path) -> None:
    """The file's data was synced before its rename, and its directory after it."""
    output = output.resolve()
    renamed = log.index(("rename", str(output)))
    synced = [
        i
        for i, (op, path) in enumerate(log[:renamed])
        if op == "fsync"
        and Path(path).parent == output.parent
        and Path(path).name.startswith(f".{output.name}.")
    ]
    assert synced, f"{output.name} was not fsync'd before its rename: {log}"
    assert ("fsync", str(output.parent)) in log[renamed + 1 :], (
        f"{output.parent} not synced after the rename"
    )


def test_atomic_writes_are_durable(tmp_path, sync_log):
    target = tmp_path / "report.json"
    write_file(target, "{}\n")
    assert_durable(sync_log, target)


def test_gate_outputs_are_durable_and_the_manifest_lands_last(tmp_path, sync_log):
    out = tmp_path / "gated"
    assert cli("gate", "B0_clean", "--data-root", str(PREPARED), "--out", str(out)).exit_code == 0
    for name in ("clean.jsonl", "quarantine.jsonl", "manifest.json"):
        assert_durable(sync_log, out / name)
    renames = [path for op, path in sync_log if op == "rename"]
    assert renames[-1] == str((out / "manifest.json").resolve())


def test_generation_json_is_durable(tmp_path, sync_log, slow_server):
    prompts = write_prompts(tmp_path / "prompts.jsonl", 2)
    out = tmp_path / "part" / "raw_responses.jsonl"
    assert cli(*generate_args(prompts, out, slow_server.url)).exit_code == 0
    assert_durable(sync_log, out.parent / "generation.json")
    # The append-only output: its lines synced, and its name in the directory once created.
    assert ("fsync", str(out.resolve())) in sync_log
    assert ("fsync", str(out.parent.resolve())) in sync_log


# == Files named as outputs: devices, FIFOs, links, the data itself ==============================


def device_node(path: Path) -> Path:
    """A character device with the null device's numbers, in the test's folder (never /dev)."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root (CAP_MKNOD)")
    return path


def copied_data(tmp_path: Path) -> Path:
    data = tmp_path / "data.jsonl"
    data.write_bytes(CLEAN_DATA.read_bytes())
    return data


def test_a_device_named_by_report_or_html_is_still_a_device_afterwards(tmp_path):
    null = device_node(tmp_path / "null")
    data = copied_data(tmp_path)
    checked = cli("check", str(data), *KIMI, "--report", str(null), "--html", str(null))
    assert checked.exit_code == 0, checked.output
    gated = cli("gate", str(data), *KIMI, "--out", str(tmp_path / "g"), "--report", str(null))
    assert gated.exit_code == 0, gated.output
    vocab = cli("vocab", str(data), *KIMI, "--out", str(tmp_path / "v"), "--draft-vocab", "10", "--html", str(null))
    assert vocab.exit_code == 0, vocab.output
    assert stat.S_ISCHR(os.lstat(null).st_mode) and os.lstat(null).st_rdev == os.makedev(1, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl", "g", "null", "v"]


def test_a_device_or_a_fifo_under_a_gate_outputs_name_is_written_through_and_kept(tmp_path):
    out = tmp_path / "g"
    out.mkdir()
    device_node(out / "manifest.json")  # the old manifest is removed before the new: not this
    os.mkfifo(out / "clean.jsonl")
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append((out / "clean.jsonl").read_bytes()), daemon=True)
    reader.start()
    result = cli("gate", str(copied_data(tmp_path)), *KIMI, "--out", str(out), "--force")
    reader.join(timeout=30)
    assert result.exit_code == 0, result.output
    assert received == [CLEAN_DATA.read_bytes()]
    assert stat.S_ISCHR(os.lstat(out / "manifest.json").st_mode) and stat.S_ISFIFO(os.lstat(out / "clean.jsonl").st_mode)


def test_a_fifo_named_by_report_gets_the_json_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = cli("check", str(copied_data(tmp_path)), *KIMI, "--report", str(fifo))
    reader.join(timeout=30)
    assert result.exit_code == 0, result.output
    assert json.loads(received[0])["verdict"] == "pass"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_report_through_a_symlink_lands_at_its_target_and_a_loop_is_one_line(tmp_path):
    (tmp_path / "kept").mkdir()
    link = tmp_path / "latest.json"
    link.symlink_to("kept/report.json")
    result = cli("check", str(copied_data(tmp_path)), *KIMI, "--report", str(link))
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and json.loads((tmp_path / "kept" / "report.json").read_text())["verdict"] == "pass"
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    assert_one_line_error(cli("check", str(tmp_path / "data.jsonl"), *KIMI, "--report", str(tmp_path / "a")),
                          "loop of symbolic links")
    assert (tmp_path / "a").is_symlink() and (tmp_path / "b").is_symlink()


@pytest.mark.parametrize("kind", ["directory", "socket"])
def test_a_report_that_names_a_directory_or_a_socket_is_refused_before_the_audit(tmp_path, kind):
    target = tmp_path / "out"
    if kind == "directory":
        target.mkdir()
    else:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(target))
        server.close()
    result = cli("gate", str(copied_data(tmp_path)), *KIMI, "--out", str(tmp_path / "g"), "--report", str(target))
    assert_one_line_error(result, f"it is a {kind}")
    assert not (tmp_path / "g").exists()


def test_report_or_html_naming_the_input_overwrites_nothing(tmp_path):
    data = copied_data(tmp_path)
    original = data.read_bytes()
    os.link(data, tmp_path / "hard.jsonl")
    for args in (
        ("check", str(data), *KIMI, "--report", str(data)),
        ("check", str(data), *KIMI, "--report", str(tmp_path / "hard.jsonl")),
        ("check", str(data), *KIMI, "--html", str(data)),
        ("gate", str(data), *KIMI, "--out", str(tmp_path / "g"), "--report", str(data)),
        ("trainer-view", str(data), *KIMI, "--trainer", "speculators", "--report", str(data)),
        ("vocab", str(data), *KIMI, "--out", str(tmp_path / "v"), "--draft-vocab", "10", "--html", str(data)),
    ):
        assert_one_line_error(cli(*args), f"would overwrite the input {data}")
        assert data.read_bytes() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl", "hard.jsonl"]


def test_report_naming_a_file_of_the_partition_overwrites_nothing(tmp_path):
    partition = tmp_path / "B0_clean"
    shutil.copytree(PREPARED / "B0_clean", partition)
    before = {p.name: p.read_bytes() for p in partition.iterdir()}
    result = cli("check", str(partition), *KIMI, "--report", str(partition / "generation.json"))
    assert_one_line_error(result, "would overwrite a file of the partition")
    assert {p.name: p.read_bytes() for p in partition.iterdir()} == before


def test_report_naming_the_gates_clean_jsonl_overwrites_nothing(tmp_path):
    data, out = copied_data(tmp_path), tmp_path / "g"
    assert cli("gate", str(data), *KIMI, "--out", str(out)).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    result = cli("gate", str(data), *KIMI, "--out", str(out), "--report", str(out / "clean.jsonl"))
    assert_one_line_error(result, f"and the gate output {out / 'clean.jsonl'} are one file")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # Two outputs of one run, and a vocabulary page over the vocabulary's own summary.
    assert_one_line_error(cli("check", str(data), *KIMI, "--report", str(tmp_path / "r"), "--html", str(tmp_path / "r")),
                          "are one file")
    vocab = cli("vocab", str(data), *KIMI, "--out", str(tmp_path / "v"), "--draft-vocab", "10",
                "--html", str(tmp_path / "v" / "vocab.json"))
    assert_one_line_error(vocab, "are one file")
    assert not (tmp_path / "r").exists() and not (tmp_path / "v").exists()


def test_a_page_drawn_from_a_saved_report_never_replaces_it(tmp_path):
    saved = tmp_path / "r.json"
    assert cli("check", str(copied_data(tmp_path)), *KIMI, "--report", str(saved)).exit_code == 0
    before = saved.read_bytes()
    assert_one_line_error(cli("report", str(saved), "--html", str(saved)), f"--html {saved} would overwrite the report")
    assert saved.read_bytes() == before


def test_the_api_refuses_a_report_or_a_gate_over_its_input(tmp_path):
    data = copied_data(tmp_path)
    original = data.read_bytes()
    report = check_session(prepare(resolve_target(str(data), PREPARED), CheckOptions(
        profile="kimi-k2.5", tokenizer=KIMI_TOKENIZER)))
    os.link(data, tmp_path / "hard.jsonl")
    for named in (data, tmp_path / "hard.jsonl"):
        with pytest.raises(InputError, match="would overwrite its input"):
            report.write_json(named)
    clean = tmp_path / "clean.jsonl"
    clean.write_bytes(original)
    session = prepare(resolve_target(str(clean), PREPARED), CheckOptions(profile="kimi-k2.5", tokenizer=KIMI_TOKENIZER))
    with pytest.raises(InputError, match="would overwrite the input"):
        gate_session(session, tmp_path)
    assert data.read_bytes() == original and clean.read_bytes() == original


@pytest.mark.parametrize("command", [
    ("gate", "--out"),
    ("export", "--format", "jsonl", "--out"),
    ("vocab", "--draft-vocab", "10", "--out"),
])
def test_an_unreadable_input_is_one_line_and_leaves_no_output_directory(tmp_path, command):
    data = copied_data(tmp_path)
    data.chmod(0)
    out = tmp_path / "out"
    result = audit_bound_by_permissions(*command[:1], str(data), *KIMI, *command[1:], str(out))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == f"audit: error: {data}: cannot read it (Permission denied)"
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()  # with the result cache on (inherited AUDIT_CACHE_DIR) too


# == Hostile records: what the audit reads, trusts and keeps ======================================
# Remote code, token ids, repeated keys, the cache, rule parameters and memory under millions of
# findings; then hypothesis fuzzing of the reader, the rules and the gate.

CLEAN = (PREPARED / "B0_clean" / "raw_responses.jsonl").read_bytes().splitlines()
TOKENIZER_ARGS = list(KIMI)


def record(index: int = 1) -> dict:
    """A clean record of the shipped sample, as a dict to break."""
    return json.loads(CLEAN[index])


def consistent(value: dict) -> dict:
    """The record with its meta_info counts following its id lists (so only the change under test
    is wrong)."""
    meta = value.get("meta_info")
    if isinstance(meta, dict):
        for count, name in (("prompt_tokens", "input_ids"), ("completion_tokens", "output_ids")):
            if isinstance(value.get(name), list):
                meta[count] = len(value[name])
    return value


def data_file(tmp_path: Path, middle: bytes | str | dict, name: str = "raw_responses.jsonl") -> Path:
    """A file of three lines: clean, `middle`, clean."""
    if isinstance(middle, dict):
        middle = json.dumps(middle)
    if isinstance(middle, str):
        middle = middle.encode()
    path = tmp_path / name
    path.write_bytes(CLEAN[0] + b"\n" + middle + b"\n" + CLEAN[2] + b"\n")
    return path


def findings_of(path: Path, *extra: str) -> list[tuple[int, str]]:
    result = cli("check", str(path), *TOKENIZER_ARGS, "--no-cache", "--format", "json", *extra)
    assert result.exit_code in (0, 1), result.output
    return [(f["line"], f["rule"]) for f in json.loads(result.stdout)["findings"]]


def gate_cli(path: Path, out: Path, *extra: str):
    return cli("gate", str(path), "--out", str(out), *TOKENIZER_ARGS, "--format", "json", *extra)


def clean_lines(out: Path) -> list[bytes]:
    return (out / "clean.jsonl").read_bytes().splitlines()


# == 1. Remote code runs only when the user says so ==============================================


@pytest.fixture(scope="module")
def marked_remote_code(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A remote-code tokenizer whose code, when it runs, leaves a marker file."""
    directory = tiktoken_remote_code.build(tmp_path_factory.mktemp("remote-code") / "tok")
    marker = directory.parent / "code-ran"
    module = directory / "tokenization_tiny.py"
    module.write_text(module.read_text() + f"\nimport pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    return directory, marker


def remote_partition(tmp_path: Path, tokenizer: Path) -> Path:
    partition = tmp_path / "P1"
    partition.mkdir()
    (partition / "raw_responses.jsonl").write_bytes(CLEAN[0] + b"\n")
    (partition / "generation.json").write_text(
        json.dumps({"profile": "kimi-k2.5", "tokenizer": {"path": str(tokenizer)}, "trust_remote_code": True})
    )
    return partition


@pytest.mark.parametrize(
    "command",
    [
        ["check"],
        ["gate", "--out", "{tmp}/gated"],
        ["inspect", "--print"],
        ["watch", "--once"],
    ],
    ids=["check", "gate", "inspect", "watch"],
)
def test_generation_json_never_turns_on_remote_code(tmp_path, marked_remote_code, command):
    tokenizer, marker = marked_remote_code
    marker.unlink(missing_ok=True)
    partition = remote_partition(tmp_path, tokenizer)
    args = [part.format(tmp=tmp_path) for part in command]
    result = cli(args[0], str(partition), *args[1:])
    assert_one_line_error(result, "records trust_remote_code: true")
    assert "--trust-remote-code" in result.output
    assert not marker.exists(), "the tokenizer's code ran without --trust-remote-code"
    assert not (tmp_path / "gated").exists()


def test_the_python_api_refuses_recorded_trust_too(tmp_path, marked_remote_code):
    tokenizer, marker = marked_remote_code
    marker.unlink(missing_ok=True)
    target = resolve_target(str(remote_partition(tmp_path, tokenizer)), PREPARED)
    with pytest.raises(ConfigError, match="trust_remote_code"):
        prepare(target, CheckOptions())
    assert not marker.exists()
    # The caller's own argument is what lets it run.
    session = prepare(target, CheckOptions(trust_remote_code=True))
    assert marker.exists() and check_session(session).records == 1


def test_an_explicit_tokenizer_without_the_flag_runs_no_code(tmp_path, marked_remote_code):
    tokenizer, marker = marked_remote_code
    marker.unlink(missing_ok=True)
    result = cli("check", str(data_file(tmp_path, CLEAN[1])), "--profile", "kimi-k2.5", "--tokenizer", str(tokenizer))
    assert_one_line_error(result, "--trust-remote-code")
    assert not marker.exists()


def test_a_saved_report_never_chooses_whose_code_runs(tmp_path):
    report = tmp_path / "r.json"
    cli("check", str(data_file(tmp_path, CLEAN[1])), *TOKENIZER_ARGS, "--report", str(report))
    result = cli("report", str(report), "--html", str(tmp_path / "r.html"), "--trust-remote-code")
    assert_one_line_error(result, "--tokenizer DIR")
    assert not (tmp_path / "r.html").exists()


# == 2. One policy for token ids ==================================================================

NOT_TOKEN_IDS = {
    "null": None,
    "negative": -1,
    "fraction": 1.5,
    "float-integer": 5.0,
    "boolean": True,
    "2**32": 2**32,
    "2**63": 2**63,
    "2**70": 2**70,
    "string": "12",
    "nested": [12],
    "object": {"id": 12},
}


@pytest.mark.parametrize("field", ["input_ids", "output_ids", "prompt_ids"])
@pytest.mark.parametrize("where", ["middle", "last"])
@pytest.mark.parametrize("value", list(NOT_TOKEN_IDS.values()), ids=list(NOT_TOKEN_IDS))
def test_a_value_that_is_not_a_token_id_is_int002_on_its_line(tmp_path, field, where, value):
    broken = record()
    if field == "prompt_ids":
        broken["prompt_ids"] = broken.pop("input_ids")
    ids = broken[field]
    ids.insert(3 if where == "middle" else len(ids), value)
    path = data_file(tmp_path, consistent(broken))
    assert findings_of(path) == [(2, "INT002")]
    result = gate_cli(path, tmp_path / "out")
    assert result.exit_code == 1, result.output
    assert clean_lines(tmp_path / "out") == [CLEAN[0], CLEAN[2]]


def test_nan_and_infinity_are_not_json(tmp_path):
    line = json.dumps(consistent(record())).replace('"output_ids": [', '"output_ids": [NaN, ')
    assert findings_of(data_file(tmp_path, line)) == [(2, "INT001")]
    line = json.dumps(record()).replace('"input_ids": [', '"input_ids": [Infinity, ')
    assert findings_of(data_file(tmp_path, line, "b.jsonl")) == [(2, "INT001")]


@pytest.mark.parametrize("sample_id", [1.5, True, None, [1], {"a": 1}, 2**70], ids=repr)
def test_a_sample_id_that_is_not_a_string_or_an_integer_is_int002(tmp_path, sample_id):
    path = data_file(tmp_path, dict(record(), id=sample_id))
    assert findings_of(path) == [(2, "INT002")]


def test_ids_of_different_json_types_that_print_alike_are_duplicates(tmp_path):
    first, second = dict(record(0), id=7), dict(record(1), id="7")
    path = tmp_path / "raw.jsonl"
    path.write_text(json.dumps(first) + "\n" + json.dumps(second) + "\n")
    assert findings_of(path) == [(2, "INT004")]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda r: r.__setitem__("text", 5), "text must be a string"),
        (lambda r: r.__setitem__("messages", "hi"), "messages must be a list"),
        (lambda r: r.__setitem__("tools", {"a": 1}), "tools must be a list"),
        (lambda r: r["meta_info"].__setitem__("prompt_tokens", "287"), "prompt_tokens must be an integer"),
        (lambda r: r["meta_info"]["finish_reason"].__setitem__("type", None), "has no type"),
        (lambda r: r["meta_info"]["finish_reason"].__setitem__("matched", [1]), "matched must be"),
        (lambda r: r.__setitem__("meta_info", [1]), "meta_info must be an object"),
        (lambda r: r.__setitem__("prompt_ids", [1, 2]), "input_ids and prompt_ids"),
        (lambda r: r["meta_info"]["finish_reason"].__setitem__("matched", -1), "matched must be a token id"),
        (lambda r: r["meta_info"]["finish_reason"].__setitem__("matched", 2**40), "matched must be a token id"),
        (lambda r: r["meta_info"]["finish_reason"].__setitem__("matched", 2**70), "matched must be a token id"),
        (lambda r: r["meta_info"].__setitem__("cached_tokens", [0]), "cached_tokens must be an integer"),
        (lambda r: r["meta_info"].__setitem__("cached_tokens", 10**6), "more than meta_info.prompt_tokens"),
        (lambda r: r["meta_info"].__setitem__("e2e_latency", -0.5), "e2e_latency must be a non-negative number"),
        (lambda r: r["meta_info"].__setitem__("id", 7), "meta_info.id must be a string"),
    ],
    ids=["text", "messages", "tools", "prompt_tokens", "finish-type", "matched", "meta_info", "both-prompts",
         "matched-negative", "matched-2**40", "matched-2**70", "cached-list", "cached-past-prompt", "latency", "rid"],
)
def test_wrong_json_types_that_polars_would_coerce_are_int002(tmp_path, change, says):
    broken = record()
    change(broken)
    result = cli("check", str(data_file(tmp_path, broken)), *TOKENIZER_ARGS, "--format", "json")
    [finding] = json.loads(result.stdout)["findings"]
    assert (finding["line"], finding["rule"]) == (2, "INT002") and says in finding["message"]


def test_a_matched_stop_id_past_the_vocabulary_is_int003_and_a_digit_stop_string_is_not(tmp_path):
    past = record()
    past["meta_info"]["finish_reason"]["matched"] = 10**6  # Kimi's mini vocabulary ends at 163607
    result = cli("check", str(data_file(tmp_path, past)), *TOKENIZER_ARGS, "--format", "json", "--no-cache")
    [finding] = json.loads(result.stdout)["findings"]
    assert (finding["line"], finding["rule"]) == (2, "INT003")
    assert "meta_info.finish_reason.matched = 1000000 is not in the tokenizer's vocabulary" in finding["message"]
    digits = record()
    digits["meta_info"]["finish_reason"]["matched"] = "1000000"  # a stop string, whatever it spells
    assert findings_of(data_file(tmp_path, digits)) == []


def test_every_command_reads_bad_ids_alike(tmp_path):
    # check, inspect and watch see the same finding; none of them crashes on the line.
    partition = tmp_path / "P"
    partition.mkdir()
    broken = consistent(record())
    broken["output_ids"].append(None)
    data_file(partition, broken)
    (partition / "generation.json").write_text(
        json.dumps({"profile": "kimi-k2.5", "tokenizer": {"path": str(KIMI_TOKENIZER)}})
    )
    assert findings_of(partition) == [(2, "INT002")]
    shown = cli("inspect", str(partition), "--print", "--format", "json")
    assert shown.exit_code == 0, shown.output
    assert [r["line"] for r in json.loads(shown.stdout)["records"]] == [2]
    printed = cli("inspect", str(partition), "--print")  # the token table: a null has no row
    assert printed.exit_code == 0 and "output_ids is empty or unreadable" in printed.output
    watched = cli("watch", str(partition), "--once")
    assert watched.exit_code == 1 and "INT002" in watched.output


def test_the_generator_canary_reads_bad_ids_alike(kimi_context, default_rules):
    from audit.generate import audit_lines

    broken = consistent(record())
    broken["input_ids"].insert(2, -7)
    lines = [CLEAN[0] + b"\n", json.dumps(broken).encode() + b"\n"]
    report = audit_lines(lines, kimi_context, default_rules, target="canary", first_line=11)
    assert [(f["line"], f["rule"]) for f in report.findings.to_dicts()] == [(12, "INT002")]


def test_jobs_read_bad_ids_alike(tmp_path, monkeypatch):
    import audit.flows.parallel

    monkeypatch.setattr(audit.flows.parallel, "MIN_SHARD_BYTES", 1)  # shard even a small file
    broken = consistent(record())
    broken["output_ids"][5] = None
    lines = [CLEAN[0], json.dumps(broken).encode(), *CLEAN[2:8]]
    path = tmp_path / "raw.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    target = resolve_target(str(path), PREPARED)
    options = {"profile": "kimi-k2.5", "tokenizer": KIMI_TOKENIZER, "cache": False}
    one = check_session(prepare(target, CheckOptions(**options)))
    two = check_session(prepare(target, CheckOptions(jobs=2, **options)))
    assert [(f["line"], f["rule"]) for f in two.findings.to_dicts()] == [(2, "INT002")]
    assert two.findings.equals(one.findings)


# == 3. A key given twice is unreadable ===========================================================


def _dup(line: str, key: str, value: str) -> str:
    return line[:-1] + f', "{key}": {value}' + "}"


@pytest.mark.parametrize(
    "line",
    [
        _dup(json.dumps(record()), "output_ids", "[1, 2, 3]"),
        _dup(json.dumps(record()), "input_ids", "[1, 2, 3]"),
        _dup(json.dumps(record()), "id", '"another"'),
        _dup(json.dumps(record()), "text", '"x"'),
        _dup(json.dumps(record()), "output\\u005fids", "[1]"),  # the same key, spelled with an escape
        json.dumps(record()).replace('"finish_reason": {', '"finish_reason": {"type": "abort", '),
        json.dumps(record()).replace('"meta_info": {', '"meta_info": {"finish_reason": null, '),
        json.dumps(record()).replace('"role": "user"', '"role": "user", "role": "system"'),
        # Inside an id list: the cheap test leaves the id lists out of its count, so this one
        # holding an object must still send the line to the careful parse.
        json.dumps(record()).replace('"output_ids": [', '"output_ids": [{"a": 1, "a": 2}, '),
    ],
    ids=["output_ids", "input_ids", "id", "text", "escaped", "finish_reason.type", "meta_info", "messages",
         "inside-ids"],
)
def test_an_object_with_a_repeated_key_is_int001_and_quarantined(tmp_path, line):
    path = data_file(tmp_path, line)
    result = cli("check", str(path), *TOKENIZER_ARGS, "--format", "json", "--no-cache")
    [finding] = json.loads(result.stdout)["findings"]
    assert (finding["line"], finding["rule"]) == (2, "INT001")
    assert "appears twice" in finding["message"]
    assert gate_cli(path, tmp_path / "out").exit_code == 1
    assert clean_lines(tmp_path / "out") == [CLEAN[0], CLEAN[2]]
    [quarantined] = iter_quarantine(tmp_path / "out" / "quarantine.jsonl")
    assert quarantined["raw_bytes"] == line.encode()


def test_escaped_colons_alone_are_not_a_repeated_key(tmp_path):
    # The cheap test counts ":"; a ":" written as an escape, or a literal "\\u003a" in a string
    # (which is not an escape), sends the line to the careful parse, which finds no repeat.
    line = CLEAN[1].decode()
    assert '\\": ' in line
    line = line.replace('\\": ', '\\"\\u003a ', 1)[:-1] + ', "note": "\\\\u003a"}'
    value = json.loads(line)
    assert value["messages"] == record()["messages"] and value["note"] == "\\u003a"
    assert findings_of(data_file(tmp_path, line)) == []


@pytest.mark.parametrize("depth", [300, 1000])
@pytest.mark.parametrize("field", ["tools", "note"])
def test_a_line_nested_deeper_than_orjson_writes_is_int001_not_an_internal_error(tmp_path, depth, field):
    # orjson reads 1,023 levels but writes 254: a line in between once stopped the run
    # (`TypeError: Recursion limit reached` from the repeated-key test).
    line = json.dumps(record())[:-1] + f', "{field}": [' + "[" * depth + "]" * depth + "]}"
    path = data_file(tmp_path, line)
    result = cli("check", str(path), *TOKENIZER_ARGS, "--format", "json", "--no-cache")
    assert result.exit_code == 1, result.output
    [finding] = json.loads(result.stdout)["findings"]
    assert (finding["line"], finding["rule"]) == (2, "INT001")
    assert "nested too deeply" in finding["message"]


# == 7. The cache cannot lie ======================================================================


def test_a_same_size_edit_with_its_mtime_restored_is_audited_again(tmp_path):
    path = data_file(tmp_path, CLEAN[1])
    assert findings_of(path, "--no-cache") == []
    first = cli("check", str(path), *TOKENIZER_ARGS, "--format", "json")  # stores the result
    assert first.exit_code == 0
    stat = path.stat()
    original = path.read_bytes()
    start = len(CLEAN[0]) + 1  # the second line
    at = original.index(b'163586],"text"', start)
    edited = original[:at] + b"163580" + original[at + 6 :]  # its end of turn is gone
    assert len(edited) == len(original)
    path.write_bytes(edited)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    again = cli("check", str(path), *TOKENIZER_ARGS, "--format", "json")
    assert again.exit_code == 1, "the cache returned the old verdict for new bytes"
    assert (2, "TRM002") in [(f["line"], f["rule"]) for f in json.loads(again.stdout)["findings"]]
    gated = gate_cli(path, tmp_path / "out")
    assert gated.exit_code == 1 and clean_lines(tmp_path / "out") == [CLEAN[0], CLEAN[2]]


def test_gate_takes_no_cache(tmp_path):
    result = gate_cli(data_file(tmp_path, CLEAN[1]), tmp_path / "out", "--no-cache")
    assert result.exit_code == 0, result.output
    assert len(clean_lines(tmp_path / "out")) == 3


# == 8. Rule parameters are range-checked when the rule set loads ================================


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ("[rules.DEG001]\nloop_max_period = 0", "loop_max_period"),
        ("[rules.DEG001]\nloop_max_period = 100000", "loop_max_period"),
        ("[rules.DEG001]\nloop_min_tokens = -5", "loop_min_tokens"),
        ("[rules.DEG001]\nloop_min_tokens = 0", "loop_min_tokens"),
        ("[rules.DEG001]\nloop_min_tokens = true", "loop_min_tokens"),
        ("[rules.DEG002]\nmin_answer_tokens = -1", "min_answer_tokens"),
        ("[rules.DEG002]\nmin_reasoning_tokens = 1.5", "min_reasoning_tokens"),
        ("[rules.DEG002]\nmin_reasoning_tokens = 9223372036854775807", "min_reasoning_tokens"),
    ],
)
def test_a_rule_parameter_out_of_range_is_one_line_naming_file_and_key(tmp_path, table, key):
    rules = tmp_path / "rules.toml"
    rules.write_text(table + "\n")
    result = cli("check", str(data_file(tmp_path, CLEAN[1])), *TOKENIZER_ARGS, "--rules", str(rules))
    assert_one_line_error(result, f"[rules.{table[7:13]}].{key}")
    assert str(rules.name) in result.output


def test_rules_declare_their_parameters_and_the_constructor_checks_them():
    from audit.checks import RULES
    from audit.checks.base import Parameter

    for rule in RULES.values():
        assert all(isinstance(spec, Parameter) and spec.help for spec in rule.parameters.values())
        rule()  # the defaults are valid
    with pytest.raises(ConfigError, match="loop_max_period"):
        RULES["DEG001"](loop_max_period=0)


# == 10. Memory follows the input, not the findings ==============================================


def test_findings_spilled_in_parts_read_back_in_line_order(tmp_path, monkeypatch, kimi_context, default_rules):
    # Tiny blocks and parts force the path a million findings take: parts on disk, duplicate ids
    # (found at the end) merged back by line; report, jsonl and gate all read the same order.
    import audit.engine.findings

    monkeypatch.setattr(audit.engine.findings, "SPILL_ROWS", 1)
    broken = consistent(record())
    broken["output_ids"] = broken["output_ids"][:-1]
    lines = [CLEAN[0], json.dumps(broken).encode(), CLEAN[0], CLEAN[2], json.dumps(broken).encode(), CLEAN[3]]
    path = tmp_path / "raw.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    spilled = audit_file(path, kimi_context, default_rules, block_bytes=64)
    assert any(isinstance(part.source, Path) for part in spilled.log.parts)
    monkeypatch.setattr(audit.engine.findings, "SPILL_ROWS", 10**9)
    kept = audit_file(path, kimi_context, default_rules)
    assert spilled.findings.equals(kept.findings)
    assert spilled.findings["line"].to_list() == sorted(spilled.findings["line"].to_list())
    assert {(f["line"], f["rule"]) for f in kept.findings.to_dicts()} >= {(3, "INT004"), (5, "INT004")}

    monkeypatch.setattr(audit.engine.findings, "SPILL_ROWS", 1)
    target = resolve_target(str(path), PREPARED)
    session = prepare(target, CheckOptions(profile="kimi-k2.5", tokenizer=KIMI_TOKENIZER, cache=False))
    result = gate_session(session, tmp_path / "out")
    written = json.loads(result.report.write_json(tmp_path / "r.json").read_text())
    assert written == json.loads(json.dumps(result.report.to_json()))
    assert [f["line"] for f in written["findings"]] == kept.findings["line"].to_list()
    quarantined = list(iter_quarantine(tmp_path / "out" / "quarantine.jsonl"))
    assert [q["line"] for q in quarantined] == [2, 3, 5]
    assert [q["raw_bytes"] for q in quarantined] == [lines[1], lines[2], lines[4]]


# == Fuzzing: the reader, the rules and the gate, with hypothesis ================================
# Random JSON in every field, random bytes, repeated keys, random token ids around the special
# ones, random line endings. Whatever comes: no crash, a finding at the line of every line known
# to be bad, and the gate's clean + quarantine give back the input byte for byte.

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=5,
)
FIELDS = ("id", "input_ids", "prompt_ids", "output_ids", "text", "meta_info", "messages", "tools")
# Ids the rules care about (Kimi's specials: think, response, end of turn, EOS, tool markers),
# ordinary ones, and ones outside the vocabulary.
TOKEN_IDS = st.sampled_from([163606, 163607, 163586, 163585, 163595, 163596, 163597, 163598, 163599]) | st.integers(
    0, 3000
) | st.sampled_from([163839, 170000, 2**32 - 1])
FINISH = st.none() | st.fixed_dictionaries(
    {"type": st.sampled_from(["stop", "length", "abort"])},
    optional={"matched": st.sampled_from([163586, "</s>"]), "length": st.integers(0, 9)},
)


def _is_token_list(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**32 for v in value
    )


def _known_bad(field: str, value, base: dict) -> bool:
    """True when setting `field` to `value` must give the line a finding (the contract says so)."""
    if field == "id":
        return not (isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**64))
    if field in ("input_ids", "output_ids"):
        return value is None or not _is_token_list(value) or (field == "input_ids" and not value)
    if field == "prompt_ids":
        return value is not None and (not _is_token_list(value) or value != base["input_ids"])
    if field == "text":
        return value is not None and not isinstance(value, str)
    if field == "meta_info":
        return value is not None and not isinstance(value, dict)
    return value is not None and not (isinstance(value, list) and all(isinstance(m, dict) for m in value))


@st.composite
def hostile_lines(draw) -> tuple[bytes, bool]:
    """One line (without its newline) and whether it is known to be bad."""
    base = record(draw(st.integers(0, 5)))
    kind = draw(st.sampled_from(["clean", "field", "ids", "bytes", "repeated-key"]))
    if kind == "clean":
        return json.dumps(base).encode(), False
    if kind == "field":
        field = draw(st.sampled_from(FIELDS))
        value = draw(JSON_VALUES)
        bad = _known_bad(field, value, base)
        base[field] = value
        return consistent(base) and json.dumps(base).encode(), bad
    if kind == "ids":
        base["output_ids"] = draw(st.lists(TOKEN_IDS, max_size=40))
        base["meta_info"] = {"finish_reason": draw(FINISH)}
        if draw(st.booleans()):
            base["meta_info"]["completion_tokens"] = draw(st.integers(0, 50))
        base["text"] = draw(st.none() | st.text(max_size=10))
        return json.dumps(base).encode(), False
    if kind == "bytes":
        raw = draw(st.binary(max_size=60)).replace(b"\n", b"")
        return raw, bool(raw.strip())
    key = draw(st.sampled_from(sorted(base)))
    return json.dumps(base).encode()[:-1] + b', "' + key.encode() + b'": ' + json.dumps(draw(JSON_VALUES)).encode() + b"}", True


@st.composite
def hostile_files(draw) -> tuple[bytes, dict[int, bool]]:
    """A file of hostile lines with random line endings; line number -> known bad."""
    lines = draw(st.lists(hostile_lines(), min_size=1, max_size=8))
    data, bad = b"", {}
    for number, (line, known_bad) in enumerate(lines, start=1):
        data += line + draw(st.sampled_from([b"\n", b"\r\n"]))
        bad[number] = known_bad
    if draw(st.booleans()):
        data = data.rstrip(b"\n")  # the last line may have no newline
    return data, bad


def _gate(data: bytes, directory: Path):
    path = directory / "raw_responses.jsonl"
    path.write_bytes(data)
    return path, audit.gate(path, directory / "out", profile="kimi-k2.5", tokenizer=KIMI_TOKENIZER, cache=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_files())
def test_fuzz_every_bad_line_has_a_finding_and_the_gate_loses_nothing(tmp_path_factory, case):
    data, known_bad = case
    directory = tmp_path_factory.mktemp("fuzz")
    lines = data.split(b"\n")
    records = {n: line for n, line in enumerate(lines, start=1) if line.strip()}
    if not records:  # nothing to audit: one error, nothing written
        with pytest.raises(InputError, match="nothing to audit"):
            _gate(data, directory)
        assert not any((directory / "out").glob("*.json*"))
        return
    _, result = _gate(data, directory)

    findings = result.report.findings
    flagged = set(findings["line"].to_list())
    assert flagged <= set(records), "a finding on a line that is not a record"
    for number, bad in known_bad.items():
        if bad and number in records:
            assert number in flagged, f"line {number} is bad and has no finding: {records[number][:200]!r}"

    # clean + quarantine are the input's records, byte for byte, each where it belongs.
    errors = set(findings.filter(findings["severity"] == "error")["line"].to_list())
    quarantined = {entry["line"]: entry["raw_bytes"] for entry in iter_quarantine(directory / "out" / "quarantine.jsonl")}
    assert set(quarantined) == errors
    assert all(quarantined[n] == records[n] for n in quarantined)
    assert clean_lines_kept(directory / "out") == [records[n] for n in sorted(records) if n not in errors]


def clean_lines_kept(out: Path) -> list[bytes]:
    data = (out / "clean.jsonl").read_bytes()
    assert data == b"" or data.endswith(b"\n")
    return data.split(b"\n")[:-1] if data else []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(hostile_lines(), min_size=1, max_size=6), st.sampled_from([64, 1 << 20]))
def test_fuzz_the_block_size_never_changes_the_findings(kimi_context, default_rules, tmp_path_factory, lines, block_bytes):
    path = tmp_path_factory.mktemp("fuzz") / "raw.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line, _ in lines))
    whole = audit_file(path, kimi_context, default_rules)
    blocks = audit_file(path, kimi_context, default_rules, block_bytes=block_bytes)
    assert blocks.findings.equals(whole.findings)
    assert whole.records == sum(1 for line, _ in lines if line.strip())

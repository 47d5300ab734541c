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
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

import audit.files
from audit import inert
from audit.cli import app
from audit.errors import InputError
from audit.files import LOCK_FILE, lock_output, open_temporary, write_atomically
from audit.formats import render as render_format
from audit.formats import step_summary
from audit.history import diff_reports, load_report
from audit.html import render_html
from audit.render import first_findings, report_table, verdict_line
from tests.conftest import KIMI_TOKENIZER, PREPARED, ROOT

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
    from audit.files import lock_output
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
    from audit.check import CheckOptions, prepare
    from audit.errors import InputError
    from audit.gate import gate_target
    from audit.targets import resolve_target

    out = tmp_path / "gated"
    session = prepare(resolve_target("B0_clean", PREPARED), CheckOptions())
    with (
        lock_output(out, command="someone else"),
        pytest.raises(InputError, match="in use by another audit run"),
    ):
        gate_target(session, out)
    assert gate_target(session, out).clean == 30
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
        text = render_format([loaded], fmt)
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
        from audit.files import open_temporary
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
        write_atomically(tmp_path / "report.json", "{}\n")  # a write into the directory cleans it
        assert live.exists() and not stale.exists()
    finally:
        writer.kill()
        writer.wait()
    write_atomically(tmp_path / "report.json", "{}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_leftovers_that_are_links_or_directories_are_left_alone(tmp_path):
    target = tmp_path / "target.txt"
    target.write_text("keep")
    link = tmp_path / ".report.json.audit-abcdefgh.tmp"
    link.symlink_to(target)
    directory = tmp_path / ".report.json.audit-ijklmnop.tmp"
    directory.mkdir()
    write_atomically(tmp_path / "report.json", "{}\n")
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

    monkeypatch.setattr(audit.files.os, "fsync", fsync)  # the same `os` module everywhere
    monkeypatch.setattr(audit.files.os, "replace", replace)
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
    write_atomically(target, "{}\n")
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

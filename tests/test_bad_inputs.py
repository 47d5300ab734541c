"""Hostile inputs: each gets one error line that says what to do (exit 2), never a traceback.

Every case here was found by feeding the CLI something a careless or hurried user would give it;
before its fix each one crashed ("internal error"), passed silently, or printed a message that
pointed the wrong way.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import KIMI_TOKENIZER, PREPARED, ROOT

runner = CliRunner()
DATA = PREPARED / "B0_clean" / "raw_responses.jsonl"
KIMI_PROFILE = ROOT / "rules" / "profiles" / "kimi-k2.5.toml"


def run(*args: str):
    from audit.cli import app

    return runner.invoke(app, list(args))


def assert_one_line_error(result, says: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output and "internal error" not in result.output
    assert says in result.output, result.output


def check_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "check", str(DATA), "--profile", "kimi-k2.5", "--tokenizer", str(KIMI_TOKENIZER),
        "--reports-dir", str(tmp_path / "reports"), *extra,
    ]


def test_a_toml_table_in_an_error_message_is_printed_not_swallowed_as_markup(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text('[rules.TRM001]\nfail_above = "5"\n')
    result = run(*check_args(tmp_path, "--rules", str(rules)))
    assert_one_line_error(result, "[rules.TRM001].fail_above")


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"\xff\xfe select", "not UTF-8 text"),
        (b'[rules.TRM001]\nfail_above = "150%"\n', "a rate is at most 100%"),
        (b"select = []\n", "leave no rule to run"),
        (b'select = ["TRM"]\nignore = ["TRM"]\n', "leave no rule to run"),
    ],
    ids=["binary", "rate-over-100", "select-nothing", "ignore-everything"],
)
def test_bad_rule_sets(tmp_path, content, says):
    rules = tmp_path / "rules.toml"
    rules.write_bytes(content)
    assert_one_line_error(run(*check_args(tmp_path, "--rules", str(rules))), says)


def test_rule_set_that_is_a_directory(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.mkdir()
    assert_one_line_error(run(*check_args(tmp_path, "--rules", str(rules))), "is a directory")


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        # A list is a marker written as a sequence of pieces; an empty piece is no marker.
        ('think_start = "<think>"', 'think_start = ["<think>", ""]', "tokens.think_start: a marker sequence needs pieces"),
        ('think_start = "<think>"', 'think_start = ""', "tokens.think_start: expected a token string"),
        ('end_of_turn = ["<|im_end|>"]', "end_of_turn = []", "tokens.end_of_turn is empty"),
        ('eos = ["[EOS]"]', 'eos = ["[EOS]"]\nthink_open_window = -5', "think_open_window: expected 0 or more"),
        (
            'thinking = ["<|im_assistant|>assistant<|im_middle|><think>"]',
            'thinking = [""]',
            "generation_prompt.thinking has an empty suffix",
        ),
        (
            "[tool_calls]",
            (
                '[[generation_prompt.continuation]]\nsuffix = "<|im_end|>"\nreasoning = "open"\n'
                "\n[tool_calls]"
            ),
            "continuation]] #1.reasoning: 'open' is not one of",
        ),
        (
            "[tool_calls]",
            (
                '[[generation_prompt.continuation]]\nsuffix = "<|im_end|>"\nmodes = ["thinkng"]\n'
                'reasoning = "closed"\n\n[tool_calls]'
            ),
            "continuation]] #1.modes: 'thinkng' is not a mode of the profile",
        ),
        (
            "[tool_calls]",
            '[[generation_prompt.continuation]]\nreasoning = "closed"\n\n[tool_calls]',
            "continuation]] #1: needs `suffix`",
        ),
        (
            "[tool_calls]",
            (
                '[[generation_prompt.continuation]]\nsuffix = "<|im_middle|></think>"\n'
                'modes = ["thinking"]\nreasoning = "prompt_opens"\n\n[tool_calls]'
            ),
            "cannot leave reasoning 'prompt_opens' (thinking; its think tokens say 'closed')",
        ),
        (
            "may_end_reasoning = true",
            'may_end_reasoning = true\nend_of_turn = ["<|im_start|>"]',
            "tool_calls.end_of_turn '<|im_start|>' is not in tokens.end_of_turn or tokens.eos",
        ),
        (
            "may_end_reasoning = true",
            'may_end_reasoning = true\nend_of_turn = ["<|im_end|>", "[EOS]"]',
            "tool_calls.end_of_turn names every stop token",
        ),
        (
            "may_end_reasoning = true",
            'may_end_reasoning = true\nprompt_tools = ["<tools>"]',
            "prompt_tools: expected the two texts around the tool schemas",
        ),
    ],
    ids=[
        "think-start-empty-piece",
        "think-start-empty",
        "no-end-of-turn",
        "negative-window",
        "empty-suffix",
        "continuation-state",
        "continuation-mode",
        "continuation-suffix",
        "continuation-contradicts",
        "call-stop-not-a-stop",
        "call-stops-leave-no-answer-stop",
        "prompt-tools-one-text",
    ],
)
def test_bad_profiles(tmp_path, old, new, says):
    text = KIMI_PROFILE.read_text()
    assert old in text
    profile = tmp_path / "bad.toml"
    profile.write_text(text.replace(old, new))
    args = check_args(tmp_path)
    args[args.index("kimi-k2.5")] = str(profile)
    assert_one_line_error(run(*args), says)


def test_profile_that_is_a_directory(tmp_path):
    (tmp_path / "p.toml").mkdir()
    args = check_args(tmp_path)
    args[args.index("kimi-k2.5")] = str(tmp_path / "p.toml")
    assert_one_line_error(run(*args), "is a directory")


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda d: d.mkdir(), "holds no tokenizer files"),
        (lambda d: d.write_text("{}"), "is a file"),
    ],
    ids=["empty-directory", "a-file"],
)
def test_bad_tokenizer_paths(tmp_path, make, says):
    tokenizer = tmp_path / "tok"
    make(tokenizer)
    args = check_args(tmp_path)
    args[args.index(str(KIMI_TOKENIZER))] = str(tokenizer)
    assert_one_line_error(run(*args), says)
    assert_one_line_error(run("profiles", "--tokenizer", str(tokenizer)), says)


def test_a_directory_named_like_a_data_file(tmp_path):
    fake = tmp_path / "x.jsonl"
    fake.mkdir()
    assert_one_line_error(run(*check_args(tmp_path)[:1], str(fake), *check_args(tmp_path)[2:]), "is a directory")
    # A partition directory whose name ends in .jsonl is still a partition.
    shutil.copy(DATA, fake / "raw_responses.jsonl")
    result = run(*check_args(tmp_path)[:1], str(fake), *check_args(tmp_path)[2:])
    assert result.exit_code == 0, result.output


def test_data_root_that_is_a_file():
    assert_one_line_error(run("check", "B0_clean", "--data-root", str(DATA)), "is a file, not a directory")


def test_report_path_that_is_a_directory_leaves_no_temporary_file(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert_one_line_error(run(*check_args(tmp_path, "--report", str(out))), f"pass --reports-dir {out}")
    assert list(tmp_path.glob(".*.tmp")) == []


@pytest.mark.parametrize(
    ("generation", "says"),
    [
        ({"thinking": "no"}, 'thinking must be true, false or "mixed"'),
        ({"trust_remote_code": "false"}, "trust_remote_code must be true or false"),
        ({"profile": 5}, "profile must be a string"),
        ({"tokenizer": 5}, "tokenizer must be a path"),
        ({"tokenizer": {"path": "../no-such-tokenizer"}}, "records tokenizer"),
    ],
    ids=["thinking-string", "trust-string", "profile-int", "tokenizer-int", "tokenizer-missing"],
)
def test_wrong_generation_json_is_a_configuration_error(tmp_path, generation, says):
    partition = tmp_path / "part"
    partition.mkdir()
    shutil.copy(DATA, partition / "raw_responses.jsonl")
    recorded = {"profile": "kimi-k2.5", "tokenizer": {"path": str(KIMI_TOKENIZER)}, **generation}
    (partition / "generation.json").write_text(json.dumps(recorded))
    result = run("check", str(partition), "--reports-dir", str(tmp_path / "reports"))
    assert_one_line_error(result, says)
    assert "generation.json" in result.output


def test_inspect_never_sends_control_bytes_from_the_data_to_the_terminal(tmp_path):
    data = tmp_path / "esc.jsonl"
    data.write_bytes(DATA.read_bytes().splitlines(keepends=True)[0] + b"\x1b]0;title\x07\x1b[31m not json\n")
    result = run(
        "inspect", str(data), "--print", "--profile", "kimi-k2.5", "--tokenizer", str(KIMI_TOKENIZER), "--line", "2"
    )
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert "\\x1b]0;title\\x07" in result.output


@pytest.fixture(scope="module")
def saved_report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("saved") / "report.json"
    result = run("check", "B0_clean", "--data-root", str(PREPARED), "--report", str(out))
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda d: d["results"][0].update(verdict="maybe"), "is malformed"),
        (lambda d: d["results"][0].update(failing="x"), "is malformed"),
        (lambda d: d.update(findings=[{"line": "x"}]), "not a complete audit report"),
        (lambda d: d.update(target=None), "target must be a string"),
        (lambda d: d["input"].update(records="30"), "input.records must be a count"),
    ],
    ids=["verdict", "failing", "finding-line", "target", "records"],
)
@pytest.mark.parametrize("command", ["report-rich", "report-github", "report-junit", "report-html", "diff"])
def test_hand_edited_reports_are_input_errors_in_every_renderer(tmp_path, saved_report, edit, says, command):
    data = json.loads(json.dumps(saved_report))
    edit(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(saved_report))
    if command == "diff":
        args = ["diff", str(good), str(bad)]
    elif command == "report-html":
        args = ["report", str(bad), "--html", str(tmp_path / "page.html")]
    else:
        args = ["report", str(bad), "--format", command.removeprefix("report-")]
    assert_one_line_error(run(*args), says)


def test_html_path_that_is_a_directory_leaves_no_temporary_file(tmp_path, saved_report):
    report = tmp_path / "report.json"
    report.write_text(json.dumps(saved_report))
    pages = tmp_path / "pages"
    pages.mkdir()
    assert_one_line_error(run("report", str(report), "--html", str(pages)), "is a directory")
    assert list(tmp_path.glob(".*.tmp")) == []


def _generate(prompts: Path, out: Path, *extra: str):
    return run(
        "generate", str(prompts), "--server", "http://127.0.0.1:9", "--tokenizer", str(KIMI_TOKENIZER),
        "--profile", "kimi-k2.5", "--out", str(out), "--canary", "0", *extra,
    )


@pytest.fixture
def prompts(tmp_path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"id": "p1", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    return path


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (("--temperature", "nan"), "--temperature must be 0 or more"),
        (("--top-p", "0"), "--top-p must be in (0, 1]"),
        (("--timeout", "-1"), "--timeout must be more than 0"),
    ],
    ids=["temperature-nan", "top-p-zero", "timeout-negative"],
)
def test_generate_refuses_sampling_and_timing_it_cannot_send(tmp_path, prompts, extra, says):
    assert_one_line_error(_generate(prompts, tmp_path / "out.jsonl", *extra), says)


def test_generate_out_that_is_a_directory_or_the_prompts_file(tmp_path, prompts):
    assert_one_line_error(_generate(prompts, tmp_path), "is a directory")
    before = prompts.read_bytes()
    assert_one_line_error(_generate(prompts, prompts), "is the prompts file itself")
    os.link(prompts, tmp_path / "hard.jsonl")  # the same file under another name
    assert_one_line_error(_generate(prompts, tmp_path / "hard.jsonl"), "is the prompts file itself")
    assert prompts.read_bytes() == before


def test_generate_never_cuts_a_file_it_did_not_write(tmp_path, prompts):
    foreign = tmp_path / "notes.jsonl"
    foreign.write_bytes(b"some notes\nmore notes without a newline")
    assert_one_line_error(_generate(prompts, foreign), "not a sample this generator wrote")
    assert foreign.read_bytes() == b"some notes\nmore notes without a newline"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("check", "B1_glaive", "--jobs", "x"), "'x' is not a whole number"),
        (("inspect", "B1_glaive", "--line", "1.5"), "'1.5' is not a whole number"),
        (("watch", "B1_glaive", "--interval", "soon"), "'soon' is not a number"),
    ],
)
def test_a_value_of_the_wrong_kind_is_named_in_plain_words(args, says):
    result = run(*args, "--data-root", str(PREPARED))
    assert_one_line_error(result, says)
    assert " int" not in result.output and "float" not in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("interval", ["-1", "0", "nan", "inf"])
def test_watch_interval_must_be_a_positive_number(interval):
    # -1 crashed in time.sleep; 0 re-audited the file in a busy loop.
    result = run("watch", "B1_glaive", "--data-root", str(PREPARED), "--interval", interval)
    assert result.exit_code == 2 and "--interval" in result.output


@pytest.mark.parametrize("finish_type", ["eos", 3, "Stop"])
def test_an_unknown_finish_reason_type_is_a_finding_on_its_line(tmp_path, finish_type):
    # It used to pass silently: every termination rule tests for stop, length or abort only.
    first, second = DATA.read_text().splitlines()[:2]
    record = json.loads(second)
    record["meta_info"]["finish_reason"]["type"] = finish_type
    data = tmp_path / "part.jsonl"
    data.write_text(first + "\n" + json.dumps(record) + "\n")
    result = run(*check_args(tmp_path)[:1], str(data), *check_args(tmp_path)[2:], "--format", "json")
    assert result.exit_code == 1, result.output
    [finding] = json.loads(result.stdout)["findings"]
    assert finding["line"] == 2 and finding["rule"] == "INT002"
    assert f"finish_reason.type is '{finish_type}'" in finding["message"]


# == Paths that are not data files, and files audit cannot read ==================================


def unreadable_by_this_user() -> list[str]:
    """A command prefix under which a file of mode 000 cannot be read: nothing for another user,
    and as root (CI containers), `setpriv` dropping the permission override from the process."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv is missing: as root, a file of mode 000 would still be read")
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search"]


@pytest.mark.parametrize("command", ["inspect", "check", "gate"])
def test_a_file_that_cannot_be_read_is_one_line_saying_so(tmp_path, command):
    data = tmp_path / "locked.jsonl"
    shutil.copyfile(DATA, data)
    data.chmod(0)
    prefix = unreadable_by_this_user()
    if subprocess.run([*prefix, "head", "-c1", str(data)], capture_output=True).returncode == 0:
        pytest.skip("this user reads a file of mode 000 even so")
    extra = {"inspect": ["--print"], "check": [], "gate": ["--out", str(tmp_path / "gated")]}[command]
    done = subprocess.run(
        [*prefix, sys.executable, "-m", "audit", command, str(data), "--profile", "kimi-k2.5",
         "--tokenizer", str(KIMI_TOKENIZER), *extra],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={**os.environ, "AUDIT_CACHE_DIR": str(tmp_path / "cache")},  # the cache key is looked up first
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"audit: error: {data}: cannot read it (Permission denied)"


def special_files(folder: Path) -> dict[str, Path]:
    """One of each kind of path that is no data file, made in `folder` (never the system's /dev)."""
    made = {}
    for name in ("empty", "no-data"):
        made[name] = folder / name
        made[name].mkdir()
    (made["no-data"] / "notes.txt").write_text("no records here\n")
    made["fifo"] = folder / "pipe.jsonl"
    os.mkfifo(made["fifo"])
    made["device"] = folder / "device"
    os.mknod(made["device"], stat.S_IFCHR | 0o600, os.makedev(1, 3))
    made["loop"] = folder / "loop"
    made["loop"].symlink_to("loop")
    made["fifo-in-partition"] = folder / "partition"
    made["fifo-in-partition"].mkdir()
    os.mkfifo(made["fifo-in-partition"] / "raw_responses.jsonl")
    return made


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("empty", "directory {path} holds no raw_responses.jsonl: give a partition directory"),
        ("no-data", "directory {path} holds no raw_responses.jsonl: give a partition directory"),
        ("fifo", "{path} is a FIFO (a named pipe), not a data file: audit reads regular files"),
        ("device", "{path} is a character device, not a data file: audit reads regular files"),
        ("loop", "{path} is a symlink loop"),
        ("fifo-in-partition", "{path}/raw_responses.jsonl is a FIFO (a named pipe), not a data file"),
    ],
)
@pytest.mark.parametrize("given_as", ["path", "bare name"])
def test_a_target_that_is_no_data_file_says_what_it_is(tmp_path, monkeypatch, kind, says, given_as):
    if kind == "device" and os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    path = special_files(tmp_path)[kind]
    monkeypatch.chdir(tmp_path)  # a bare name: no data root here, so the name is what is meant
    spec = str(path) if given_as == "path" else path.name
    shown = path if given_as == "path" else Path(path.name)
    started = time.monotonic()
    result = run("check", spec, "--profile", "kimi-k2.5", "--tokenizer", str(KIMI_TOKENIZER))
    assert time.monotonic() - started < 30  # a FIFO is never opened: nothing waits for a writer
    assert_one_line_error(result, says.format(path=shown))
    assert "data root" not in result.output and "no such" not in result.output
    assert len(result.output.strip().splitlines()) == 1

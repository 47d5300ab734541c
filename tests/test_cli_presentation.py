"""What a newcomer reads: nothing cut at any width, help that takes -h and names values as
command lines do, profiles with their escapes, a first run that explains itself, reports that
do not pile up, verdict lines that agree with the exit code."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console
from typer.testing import CliRunner

import audit
from audit.cli import app
from audit.cli.tables import first_findings, report_table, verdict_line
from audit.tui.app import DetailView, InspectApp
from audit.tui.detail import DetailLines
from tests.conftest import KIMI_TOKENIZER, PREPARED
from tests.test_inspect_app import screen_text
from tests.test_inspect_model import inspector_for

runner = CliRunner()
COMMANDS = ["check", "gate", "export", "vocab", "rules", "explain", "profiles", "report", "diff", "inspect", "generate", "watch", "trainer-view"]
WIDTHS = (80, 100, 120, 140)


@pytest.fixture(scope="module")
def glaive() -> audit.Report:
    return audit.check_target("B1_glaive", data_root=PREPARED, cache=False)


def rendered(width: int, *renderables) -> str:
    console = Console(width=width, file=io.StringIO(), color_system=None, record=True)
    for renderable in renderables:
        console.print(renderable)
    return console.export_text()


@pytest.mark.parametrize("width", WIDTHS)
def test_the_check_tables_cut_nothing_at_any_width(glaive: audit.Report, width: int) -> None:
    text = rendered(
        width,
        report_table(glaive, width),
        first_findings(glaive, report_path=Path("reports/B1_glaive.json")),
        verdict_line(glaive),
    )
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= width
    for result in glaive.results:  # every rule name whole, on one line, beside its code
        assert re.search(rf"{result.code}\s+{re.escape(result.name)}\b", text), (width, result.name)
    more = glaive.log.height - 8
    assert f"and {more} more: see audit report reports/B1_glaive.json, or audit inspect B1_glaive" in text
    # Every message whole: its column's cells, read top to bottom, hold it (wrapped, not cut).
    cells = "".join(row.split("│")[-2].strip() for row in text.splitlines() if row.count("│") == 6)
    for message in glaive.log.head(8)["message"]:
        assert message.replace(" ", "") in cells.replace(" ", ""), (width, message)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_passing_check_keeps_every_header_whole_at_any_width(width: int) -> None:
    # Nothing fails, so no column has content as wide as its header: the headers set the width.
    clean = audit.check_target("B0_clean", data_root=PREPARED, cache=False)
    text = rendered(width, report_table(clean, width))
    assert max(len(line) for line in text.splitlines()) <= width
    header = next(line for line in text.splitlines() if line.startswith("code"))
    assert header.split() == ["code", "rule", "severity", "failing", "threshold", "verdict", "lines"]


def test_the_rule_table_keeps_thresholds_on_one_line_when_there_is_room(glaive: audit.Report) -> None:
    assert "warn >0, fail >10%" in rendered(100, report_table(glaive, 100))
    narrow = rendered(80, report_table(glaive, 80))
    assert re.search(r"warn >0\s+warn", narrow) and "fail >10%" in narrow


def test_the_inspect_detail_wraps_finding_messages_to_the_pane() -> None:
    view = inspector_for("B1_glaive").view(10)  # a TCL001 finding with a long message
    message = next(m.message for m in view.findings if m.rule == "TCL001")
    assert len(message) > 100
    for width in (60, 100):
        lines = [line.plain for line in DetailLines(view, width=width)]
        first = next(i for i, line in enumerate(lines) if line.startswith(" TCL001 "))
        finding = [lines[first]]
        finding += [line for line in lines[first + 1 :] if line.startswith("    ")][: len(message)]
        assert len(finding) > 1 and all(len(line) <= width for line in finding)
        assert " ".join(message.split()) in " ".join(" ".join(finding).split())


def test_the_inspect_detail_wraps_its_heading_special_tokens_and_legend_to_the_pane() -> None:
    view = inspector_for("B1_glaive").view(10)  # nine special tokens in its output
    wide = [line.plain for line in DetailLines(view)]
    summaries = [line for line in wide if line.startswith(("line 10", "special tokens", "roles: "))]
    assert len(summaries) == 4 and max(map(cell_len, summaries)) > 100
    for width in (42, 60, 100):
        narrow = [line.plain for line in DetailLines(view, width=width)]
        header = narrow[: next(i for i, line in enumerate(narrow) if line.startswith("── "))]
        # the token rows below scroll sideways
        assert all(cell_len(line) <= width for line in header), width
        for whole in summaries:  # every word of it on the pane, in order, wrapped not cut
            assert " ".join(whole.split()) in " ".join(" ".join(narrow).split()), (width, whole)


@pytest.mark.parametrize("size", [(80, 40), (140, 40)])
def test_the_viewer_footer_names_every_key_at_80_and_140_columns(size: tuple[int, int]) -> None:
    async def drive() -> str:
        app = InspectApp(inspector_for("B1_glaive"), title="B1_glaive", start_line=10)
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            return screen_text(app).splitlines()[-1]

    footer = " ".join(asyncio.run(drive()).split())
    assert footer.endswith("? help q quit"), footer


@pytest.mark.parametrize("size", [(120, 40), (140, 40)])
def test_the_viewer_shows_a_long_finding_message_whole(size: tuple[int, int]) -> None:
    inspector = inspector_for("B1_glaive")
    message = next(m.message for m in inspector.view(10).findings if m.rule == "TCL001")

    async def drive() -> str:
        app = InspectApp(inspector, title="B1_glaive", start_line=10)
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            text = app.query_one(DetailView).scrollable_content_region  # not its scroll bar
            return "\n".join(row[text.x : text.right] for row in screen_text(app).splitlines())

    screen = asyncio.run(drive())
    assert " ".join(message.split()) in " ".join(screen.split())


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_takes_dash_h_and_names_values_plainly(command: str) -> None:
    short, long = runner.invoke(app, [command, "-h"]), runner.invoke(app, [command, "--help"])
    assert short.exit_code == 0 and short.output == long.output
    assert "Usage: audit " + command in short.output
    assert not re.search(r"<(str|int|float|path|list\[[^>]*)>|\{[a-z_]+\}", short.output), short.output
    # click's names for what the option means: a range, a TEXT that is a file, a size or a code
    clicks = r"\b(INT|FLOAT) RANGE\b|--(html|shard-size|rule|id) TEXT"
    assert not re.search(clicks, short.output), short.output


def test_the_top_level_takes_dash_h() -> None:
    result = runner.invoke(app, ["-h"])
    assert result.exit_code == 0 and "check" in result.output
    # Each command's summary whole at 80 columns (click cuts a longer one with "...").
    listed = result.output.split("Commands:")[1].splitlines()[1:]
    assert len(listed) == len(COMMANDS) and not any(line.endswith("...") for line in listed), listed


def test_profiles_show_newlines_as_escapes_and_a_token_to_id_table() -> None:
    result = runner.invoke(app, ["profiles", "--tokenizer", str(KIMI_TOKENIZER)], env={"COLUMNS": "140"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "<|assistant|>\\n" in out  # GLM's second suffix, its newline seen
    assert "<|im_start|>assistant\\n<think>\\n" in out  # Qwen's
    assert "\\x0a" not in out and "{'" not in out  # no raw escapes, no Python dicts
    assert re.search(r"kimi-k2\.5: token -> id in .*kimi-k2\.5-mini", out)
    assert re.search(r"think start\s+<think>\s+163606", out)
    assert re.search(r"end of turn\s+<\|im_end\|>\s+163586", out)


@pytest.mark.parametrize("width", [100, 120, 140])
@pytest.mark.parametrize("with_tokenizer", [False, True])
def test_profiles_keep_each_prompt_ending_on_one_line_from_100_columns(
    width: int, with_tokenizer: bool
) -> None:
    from audit.cli.tables import escaped, profiles_table
    from audit.model.families.profiles import builtin_profiles, load_profile
    from audit.model.tokens.tokenizer_loading import load_tokenizer

    profiles = [load_profile(name) for name in builtin_profiles()]
    tokenizer = load_tokenizer(KIMI_TOKENIZER) if with_tokenizer else None
    lines = rendered(width, profiles_table(profiles, tokenizer, True, width=width)).splitlines()
    assert all(cell_len(line) <= width for line in lines)
    rows = [line for line in lines if line.startswith("│")]
    assert rows and all(line.rstrip().endswith("│") for line in rows)  # the table is not cropped
    endings = {e for p in profiles for e in p.prompt_suffixes["thinking"]}
    endings |= {c.suffix for p in profiles for c in p.continuations if "thinking" in c.modes}
    for ending in endings:  # `<|im_middle|>` or `\n` broken across lines would read as another text
        assert any(escaped(ending).plain in line for line in rows), (width, ending)


def test_the_first_run_of_the_corrupted_sample_explains_itself(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(PREPARED.parent.parent)  # the repository root: the shipped samples stand in
    failing = runner.invoke(app, ["check", "B1_glaive", "--reports-dir", str(tmp_path)])
    assert failing.exit_code == 1
    note = " ".join(failing.stderr.split())  # wrapped to the terminal
    assert "B1_glaive is a sample corrupted on purpose" in note
    assert "`audit check B0_clean` shows a pass" in note
    # Wrapped at words, within the width: no line runs past the edge, the command stays whole.
    assert all(cell_len(line) <= 80 for line in failing.stderr.splitlines())
    assert any("`audit check B0_clean`" in line for line in failing.stderr.splitlines())
    gated = runner.invoke(app, ["gate", "B1_glaive", "--out", str(tmp_path / "gated")])
    assert gated.exit_code == 1 and "corrupted on purpose" in gated.stderr  # the gate says it too
    passing = runner.invoke(app, ["check", "B0_clean", "--reports-dir", str(tmp_path)])
    assert passing.exit_code == 0 and "corrupted on purpose" not in passing.stderr
    elsewhere = runner.invoke(app, ["check", "B1_glaive", "--data-root", str(PREPARED), "--format", "json",
                                    "--report", "none"])
    assert "corrupted on purpose" not in elsewhere.stdout  # machine output stays clean


def test_reports_keep_the_newest_per_partition_and_none_writes_nothing(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    for stamp in ("20250101T000000Z", "20250102T000000Z", "20250103T000000Z"):
        (reports / f"B0_clean-{stamp}.json").write_text("{}")
    (reports / "B0_clean-mine.json").write_text("{}")  # named by hand: never touched
    (reports / "B1_glaive-20250101T000000Z.json").write_text("{}")  # another partition's
    args = ["check", "B0_clean", "--data-root", str(PREPARED), "--reports-dir", str(reports)]
    assert runner.invoke(app, [*args, "--keep-reports", "2"]).exit_code == 0
    left = sorted(p.name for p in reports.iterdir())
    dated = [n for n in left if re.fullmatch(r"B0_clean-\d{8}T\d{6}Z\.json", n)]
    assert len(dated) == 2 and "B0_clean-20250103T000000Z.json" in dated
    assert "B0_clean-mine.json" in left and "B1_glaive-20250101T000000Z.json" in left
    assert runner.invoke(app, args, env={"AUDIT_KEEP_REPORTS": "1"}).exit_code == 0
    assert len([n for n in reports.iterdir() if re.fullmatch(r"B0_clean-\d{8}T\d{6}Z\.json", n.name)]) == 1
    before = sorted(reports.iterdir())
    result = runner.invoke(app, [*args, "--report", "none", "--format", "json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["verdict"] == "pass"
    assert sorted(reports.iterdir()) == before
    assert not (Path.cwd() / "none").exists()


def test_a_verdict_line_under_fail_on_warning_says_fail(tmp_path: Path) -> None:
    rules = tmp_path / "warn.toml"
    rules.write_text('select = ["ALL"]\n[rules.TRM004]\nseverity = "warning"\n')
    data = tmp_path / "one.jsonl"
    line = (PREPARED / "B1_glaive" / "raw_responses.jsonl").read_text().splitlines()[6]  # TRM004's line
    data.write_text(line + "\n")
    args = ["check", str(data), "--profile", "kimi-k2.5", "--tokenizer", str(KIMI_TOKENIZER), "--rules",
            str(rules), "--report", "none"]
    plain = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert plain.exit_code == 0 and "WARN one:" in plain.output
    strict = runner.invoke(app, [*args, "--fail-on", "warning"], env={"COLUMNS": "200"})
    assert strict.exit_code == 1
    assert "FAIL one:" in strict.output and "WARN one" not in strict.output
    assert "failed: TRM004" in strict.output and "(--fail-on warning)" in strict.output


def test_a_cache_hit_says_cached_and_shows_this_runs_time(tmp_path: Path) -> None:
    args = ["check", "B0_clean", "--data-root", str(PREPARED), "--report", "none"]
    first = runner.invoke(app, args, env={"COLUMNS": "200"})
    second = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert "cached" not in first.output
    assert "(cached: an identical earlier audit; --no-cache audits again" in second.output


def test_sarif_names_no_placeholder_page(tmp_path: Path) -> None:
    result = runner.invoke(app, ["check", "B1_glaive", "--data-root", str(PREPARED), "--format", "sarif",
                                 "--report", "none"])
    driver = json.loads(result.stdout)["runs"][0]["tool"]["driver"]
    assert "informationUri" not in driver and "example" not in result.stdout
    assert driver["rules"][0]["help"]["text"] == "audit explain INT001"


def test_inspect_finds_a_clean_record_by_id_as_by_line() -> None:
    by_id = runner.invoke(app, ["inspect", "B0_clean", "--data-root", str(PREPARED), "--id", "clean-0003", "--print"])
    by_line = runner.invoke(app, ["inspect", "B0_clean", "--data-root", str(PREPARED), "--line", "4", "--print"])
    assert by_id.exit_code == 0 and by_id.output == by_line.output
    assert "id clean-0003" in by_id.output and "no findings on this line" in by_id.output


def test_report_html_says_where_the_page_went(tmp_path: Path) -> None:
    saved = tmp_path / "r.json"
    runner.invoke(app, ["check", "B0_clean", "--data-root", str(PREPARED), "--report", str(saved)])
    page = tmp_path / "page.html"
    result = runner.invoke(app, ["report", str(saved), "--html", str(page)], env={"COLUMNS": "300"})
    assert result.exit_code == 0 and page.is_file()
    assert f"html: {page}" in result.output


@pytest.mark.parametrize(("partition", "code"), [("B0_clean", 0), ("B1_glaive", 1)])
def test_a_reader_that_stops_early_leaves_the_exit_code_the_gates(
    partition: str, code: int
) -> None:
    # `audit check X | head -1` under `set -o pipefail`: the code is the gate's, with no traceback,
    # not click's 1 for a closed pipe (which would fail a gate that passed).
    command = (
        f"{sys.executable} -m audit check {partition} --data-root {PREPARED}"
        " --report none --no-cache"
    )
    piped = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command} | head -1"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert piped.returncode == code, piped.stderr
    assert piped.stdout.startswith(f"audit check {partition}")
    assert "Traceback" not in piped.stderr and "Broken pipe" not in piped.stderr


def test_diff_wraps_its_regressed_rules_at_the_terminal_width(tmp_path: Path) -> None:
    for partition in ("B0_clean", "B1_glaive"):
        report = str(tmp_path / partition)
        runner.invoke(app, ["check", partition, "--data-root", str(PREPARED), "--report", report])
    diffed = runner.invoke(app, ["diff", str(tmp_path / "B0_clean"), str(tmp_path / "B1_glaive")])
    assert diffed.exit_code == 1, diffed.output
    assert all(cell_len(line) <= 80 for line in diffed.stdout.splitlines()), diffed.stdout
    regressed = " ".join(diffed.stdout.split("REGRESSED ")[1].split())
    assert regressed.startswith("INT001, INT002, INT003") and regressed.endswith("TRM004, DEG002")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["check", "--bogus"], "No such option: --bogus"),
        (["chek"], "No such command 'chek'"),
        (["check", "B0_clean", "--jobs", "x"], "Invalid value for '--jobs'"),
    ],
)
def test_a_usage_error_is_one_line_saying_what_to_do(args: list[str], said: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("audit: error: ") and said in lines[0], result.stderr
    assert lines[0].endswith(" -h'")  # where the help is


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["check", "B0_clean", "--thinking"], "Option '--thinking' requires an argument; see 'audit check -h'"),
        (["check", "B0_clean", "--thinking", "yes"],
         "Invalid value for '--thinking': 'yes' is not one of 'on', 'off', 'mixed'; see 'audit check -h'"),
        (["export", "B0_clean", "--format", "csv"], "Invalid value for '--format': 'csv' is not one of"),
    ],
)
def test_a_usage_error_in_a_subcommand_points_to_its_help_in_plain_words(args: list[str], said: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert said in result.stderr and "Value error" not in result.stderr, result.stderr


def test_an_output_sent_to_a_device_is_not_named_as_a_file_kept(tmp_path: Path) -> None:
    base = ["check", "B0_clean", "--data-root", str(PREPARED), "--no-cache"]
    into_device = runner.invoke(app, [*base, "--report", os.devnull, "--html", os.devnull])
    assert into_device.exit_code == 0, into_device.output
    assert "report: " not in into_device.output and "html: " not in into_device.output
    kept = runner.invoke(app, [*base, "--report", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html")])
    assert f"report: {tmp_path / 'r.json'}" in kept.output and f"html: {tmp_path / 'r.html'}" in kept.output

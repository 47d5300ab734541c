"""`audit check --html` and `audit report --html`: one self-contained page, plots, escaped samples."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from audit.cli import app
from audit.engine.runner import STATS_SCHEMA
from audit.model.tokens.tokenizer_loading import load_tokenizer
from audit.report.distributions import SCATTER_POINTS, summarize
from audit.report.html import FINDINGS_SHOWN, render_html
from audit.report.html.samples import SAMPLES_PER_RULE, WINDOW
from audit.report.report import Report
from tests.conftest import KIMI_TOKENIZER, PREPARED

SCRIPT_ID = "<script>alert(1)</script>"
PLOT_TITLES = (
    "Failing records per rule",
    "Prompt length",
    "Output length",
    "Reasoning vs answer length",
    "Where the response token falls",
    "Finish reasons",
    "Tool calls per record",
    "Serving mix",
)
runner = CliRunner()


def hostile_record() -> str:
    """A record whose id and output text are markup: a finished output with no </think> (SEG001)."""
    tokenizer = load_tokenizer(KIMI_TOKENIZER)
    base = json.loads((PREPARED / "B0_clean" / "raw_responses.jsonl").read_text().splitlines()[0])
    end = tokenizer.token_id("<|im_end|>")
    output = tokenizer.encode_text(f"{SCRIPT_ID} and <b>bold</b> & <img src=x onerror=alert(2)>") + [end]
    base.pop("text", None)
    base["id"] = SCRIPT_ID
    base["output_ids"] = output
    base["meta_info"]["completion_tokens"] = len(output)
    base["meta_info"]["finish_reason"] = {"type": "stop", "matched": end}
    return json.dumps(base)


def write_partition(directory: Path, lines: list[str]) -> Path:
    directory.mkdir(parents=True)
    (directory / "raw_responses.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    generation = {"profile": "kimi-k2.5", "tokenizer": {"path": str(KIMI_TOKENIZER)}, "thinking": True}
    (directory / "generation.json").write_text(json.dumps(generation), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The B1 sample plus one hostile record, audited once with --html."""
    root = tmp_path_factory.mktemp("html")
    sample = (PREPARED / "B1_glaive" / "raw_responses.jsonl").read_text(encoding="utf-8").splitlines()
    partition = write_partition(root / "B9_hostile", [*sample, hostile_record()])
    page, report = root / "page.html", root / "report.json"
    result = runner.invoke(app, ["check", str(partition), "--html", str(page), "--report", str(report)])
    assert result.exit_code == 1, result.output
    return {"root": root, "partition": partition, "page": page, "report": report}


def test_check_writes_one_page_that_loads_nothing(checked: dict[str, Path]) -> None:
    html = checked["page"].read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>")
    assert "<script" not in html.lower() and "<link" not in html.lower()
    assert not re.search(r"\b(src|href)\s*=", html, re.IGNORECASE)
    assert "url(" not in html and "@import" not in html
    # The only http:// is the SVG namespace, which browsers never fetch.
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) == {"http://www.w3.org/2000/svg"}
    assert "Content-Security-Policy" in html and "default-src 'none'" in html


def test_page_has_the_verdict_inputs_and_rule_table(checked: dict[str, Path]) -> None:
    html = checked["page"].read_text(encoding="utf-8")
    report = json.loads(checked["report"].read_text(encoding="utf-8"))
    assert '<div class="verdict fail">FAIL</div>' in html
    assert report["input"]["sha256"] in html and report["tokenizer"]["sha256"] in html
    assert f"{report['input']['records']:,} (" in html
    rules = html.split('<table class="rules">')[1].split("</table>")[0]
    for result in report["results"]:
        row = rules.split(f"<code>{result['code']}</code>")[1].split("</tr>")[0]
        assert f">{result['failing']:,}<" in row and f">{result['verdict']}<" in row


def test_plots_are_inline_svg(checked: dict[str, Path]) -> None:
    html = checked["page"].read_text(encoding="utf-8")
    plots = re.findall(r'<svg class="plot"[^>]*aria-label="([^"]*)"', html)
    assert plots == list(PLOT_TITLES)
    report = json.loads(checked["report"].read_text(encoding="utf-8"))
    failing = html.split('aria-label="Failing records per rule"')[1].split("</svg>")[0]
    assert failing.count('<rect class="bar') == sum(1 for r in report["results"] if r["failing"])


def test_record_text_is_escaped_everywhere(checked: dict[str, Path]) -> None:
    html = checked["page"].read_text(encoding="utf-8")
    assert SCRIPT_ID not in html and "<b>bold" not in html and "<img" not in html
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    samples = html.split('<section id="samples">')[1].split("</section>")[0]
    head = f'id <span class="rid">{escaped}</span>'
    assert head in samples  # the id, in the SEG001 sample
    tokens = samples.split(head)[1].split('<div class="tokens">')[1].split("</div>")[0]
    shown = re.sub(r"<[^>]+>", "", tokens)  # the decoded token pieces, as the page shows them
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; &lt;img src=x onerror=alert(2)&gt;&lt;|im_end|&gt;" in shown
    findings = html.split('<section id="findings">')[1]
    assert escaped in findings


def test_samples_mark_the_offending_token_in_a_window(checked: dict[str, Path]) -> None:
    html = checked["page"].read_text(encoding="utf-8")
    # B1 line 42 carries a second </think> at output_ids[128] (SEG002).
    seg002 = html.split("<code>SEG002</code> response-token-repeated")[1].split('<div class="rule-samples">')[0]
    assert re.search(r'<span class="tok special hit" title="output_ids\[128\] = 163607">&lt;/think&gt;</span>', seg002)
    for sample in re.findall(r'<div class="tokens">(.*?)</div>', html):
        assert sample.count('<span class="tok ') <= 2 * WINDOW + 1
    # The out-of-vocabulary id is shown by number, not decoded.
    assert '<span class="tok unknown hit" title="output_ids[94] = 100000">⟨100000⟩</span>' in html


def test_samples_show_segments_and_what_the_rule_explains(checked: dict[str, Path]) -> None:
    html = checked["page"].read_text(encoding="utf-8")
    samples = html.split('<section id="samples">')[1].split("</section>")[0]
    # B1 line 42: a second </think> (SEG002) inside the answer; its window spans both segments.
    seg002 = samples.split("<code>SEG002</code> response-token-repeated")[1].split('<div class="rule-samples">')[0]
    assert '<span class="seg reasoning">' in seg002 and '<span class="seg answer">' in seg002
    # The first </think> closes the reasoning: it is the reasoning group's last token.
    reasoning = seg002.split('<span class="seg reasoning">')[1].split('<span class="seg ')[0]
    assert re.findall(r">([^<]*)</span>", reasoning)[-1] == "&lt;/think&gt;"
    # PRM001's sample carries the rule's own comparison: expected suffix beside the prompt's end.
    prm001 = samples.split("<code>PRM001</code> prompt-suffix")[1].split('<div class="rule-samples">')[0]
    assert '<table class="explain"><caption>generation suffix (kimi-k2.5, thinking)</caption>' in prm001
    assert "<th>expected</th>" in prm001 and "<th>actual</th>" in prm001
    # Prompt windows are one prompt group; tool-call segments show where a call is.
    assert '<span class="seg prompt">' in prm001
    assert '<span class="seg tool_calls">' in samples


def test_report_json_carries_the_distributions(checked: dict[str, Path]) -> None:
    report = json.loads(checked["report"].read_text(encoding="utf-8"))
    shape = report["distributions"]
    readable = shape["records"]
    assert readable == report["input"]["records"] - 2  # B1's two lines that are not records
    assert sum(shape["output_tokens"]["counts"]) == readable
    assert sum(shape["prompt_tokens"]["counts"]) == readable
    assert sum(shape["finish_reasons"].values()) == readable
    assert sum(shape["tool_calls"].values()) == readable
    position = shape["response_position"]
    assert sum(position["counts"]) + position["missing"] == readable
    assert len(shape["reasoning_answer"]["points"]) == readable - position["missing"]


def test_audit_report_redraws_the_same_page(checked: dict[str, Path], tmp_path: Path) -> None:
    again = tmp_path / "again.html"
    result = runner.invoke(app, ["report", str(checked["report"]), "--html", str(again), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert again.read_text(encoding="utf-8") == checked["page"].read_text(encoding="utf-8")


def test_audit_report_without_the_data_leaves_samples_out(checked: dict[str, Path], tmp_path: Path) -> None:
    moved = shutil.copytree(checked["partition"], tmp_path / "B9_hostile")
    report = json.loads(checked["report"].read_text(encoding="utf-8"))
    report["input"]["path"] = str(moved / "raw_responses.jsonl")
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps(report), encoding="utf-8")
    (moved / "raw_responses.jsonl").write_text("{}\n", encoding="utf-8")  # changed since the audit
    page = tmp_path / "page.html"
    result = runner.invoke(app, ["report", str(saved), "--html", str(page), "--format", "json"])
    assert result.exit_code == 0, result.output
    html = page.read_text(encoding="utf-8")
    assert "changed since the audit (sha256 differs)" in html
    assert '<div class="tokens">' not in html
    assert html.count('<svg class="plot"') == len(PLOT_TITLES)


def test_several_targets_get_one_page_each(tmp_path: Path) -> None:
    page = tmp_path / "audit.html"
    result = runner.invoke(
        app,
        ["check", "B0_clean", "D1_deepseek", "--data-root", str(PREPARED), "--html", str(page),
         "--reports-dir", str(tmp_path / "reports"), "--format", "json"],
    )
    assert result.exit_code == 1, result.output
    assert sorted(p.name for p in tmp_path.glob("*.html")) == ["audit-B0_clean.html", "audit-D1_deepseek.html"]
    assert '<div class="verdict pass">PASS</div>' in (tmp_path / "audit-B0_clean.html").read_text()


def test_page_size_stays_bounded_with_many_findings(tmp_path: Path) -> None:
    """A finding on every record: the page shows the first ones and counts the rest."""
    sample = (PREPARED / "B0_clean" / "raw_responses.jsonl").read_text(encoding="utf-8").splitlines()
    partition = write_partition(tmp_path / "P40", sample * 40)  # 1,170 duplicate ids (INT004)
    page = tmp_path / "P40.html"
    result = runner.invoke(
        app, ["check", str(partition), "--html", str(page), "--report", str(tmp_path / "P40.json"), "--format", "json"]
    )
    assert result.exit_code == 1, result.output
    assert json.loads((tmp_path / "P40.json").read_text())["summary"]["findings"] == 1170
    html = page.read_text(encoding="utf-8")
    findings = html.split('<section id="findings">')[1]
    assert findings.count("<tr><td") == FINDINGS_SHOWN and "… and 1,120 more findings" in findings
    assert html.count('<div class="sample">') == SAMPLES_PER_RULE
    # Fixed-size parts only: a 100,000-record partition gives a page of the same order.
    assert page.stat().st_size < 150_000


def test_distributions_are_fixed_size_for_any_partition() -> None:
    n = 20_000
    stats = pl.DataFrame(
        {
            "line": range(1, n + 1),
            "prompt_tokens": [100 + i % 900 for i in range(n)],
            "output_tokens": [1000 + i for i in range(n)],
            "response_at": [None if i % 10 == 0 else i % 1000 for i in range(n)],
            "finish_type": ["length" if i % 7 == 0 else "stop" for i in range(n)],
            "tool_calls": [i % 12 for i in range(n)],
            "thinking": [None if i % 10 == 0 else i % 3 > 0 for i in range(n)],
        },
        schema=STATS_SCHEMA,
    )
    shape = summarize(stats)
    assert len(shape["reasoning_answer"]["points"]) == SCATTER_POINTS
    assert shape["reasoning_answer"]["records"] == n - n // 10
    assert len(shape["output_tokens"]["counts"]) <= 41 and sum(shape["output_tokens"]["counts"]) == n
    assert shape["output_tokens"]["edges"][0] <= 1000 and shape["output_tokens"]["edges"][-1] > n + 999
    assert list(shape["tool_calls"]) == ["0", "1", "2", "3", "4", "5", "6", "7", "8+"]
    assert shape["tool_calls"]["8+"] == sum(1 for i in range(n) if i % 12 >= 8)
    assert shape["serving_mix"] == {
        "records": n,
        "thinking_known": n - n // 10,
        "thinking_on": sum(1 for i in range(n) if i % 10 and i % 3),
        "thinking_off": sum(1 for i in range(n) if i % 10 and not i % 3),
        "tool_calls": sum(1 for i in range(n) if i % 12),
    }
    assert len(json.dumps(shape)) < 40_000


def test_a_report_without_distributions_still_renders(checked: dict[str, Path]) -> None:
    data = json.loads(checked["report"].read_text(encoding="utf-8"))
    del data["distributions"]  # a report written before distributions existed
    html = render_html(Report.from_json(data))
    assert "carries no distributions" in html
    assert html.count('<svg class="plot"') == 1


# -- in a real browser ---------------------------------------------------------------------------
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium); .ci/run installs it"
)
# Injected ahead of the page's own policy: proves scripts could run, and records any alert or error.
PROBE = (
    "<script>document.documentElement.dataset.probe='ran';"
    "window.alert=function(m){document.documentElement.dataset.alert=String(m)};"
    "window.onerror=function(m){document.documentElement.dataset.error=String(m)};</script>"
)


def open_in_chromium(html: str, tmp_path: Path) -> tuple[str, list[str], Path]:
    """Load `html` headless with the probe: the DOM after load, console lines, and a screenshot."""
    page = tmp_path / "probed.html"
    page.write_text(html.replace('<meta charset="utf-8">', '<meta charset="utf-8">' + PROBE, 1), encoding="utf-8")
    screenshot = tmp_path / "page.png"
    done = subprocess.run(
        [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
            "--window-size=1280,2400", f"--screenshot={screenshot}", "--dump-dom", page.as_uri(),
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.stdout, console, screenshot


@needs_chromium
def test_page_loads_cleanly_in_chromium(checked: dict[str, Path], tmp_path: Path) -> None:
    dom, console, screenshot = open_in_chromium(checked["page"].read_text(encoding="utf-8"), tmp_path)
    assert 'data-probe="ran"' in dom  # scripts could run, so a silent page means none misbehaved
    assert console == []  # no error, no policy violation, no blocked fetch
    assert "data-alert" not in dom and "data-error" not in dom
    assert dom.count("<script") == 1  # the probe only: the hostile id stayed text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
    assert re.findall(r'<svg class="plot"[^>]*aria-label="([^"]*)"', dom) == list(PLOT_TITLES)
    assert dom.count("<rect") > 40 and dom.count("<circle") > 40  # bars and dots were drawn
    # A screenshot of a blank page is a few KB; this one holds the verdict, tables and plots.
    assert screenshot.stat().st_size > 100_000


@needs_chromium
def test_the_browser_probe_catches_an_unescaped_script(checked: dict[str, Path], tmp_path: Path) -> None:
    """The check above can fail: the same page with the id left raw and no policy runs the alert."""
    html = checked["page"].read_text(encoding="utf-8")
    html = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html)
    html = html.replace("&lt;script&gt;alert(1)&lt;/script&gt;", SCRIPT_ID, 1)
    dom, _, _ = open_in_chromium(html, tmp_path)
    assert 'data-alert="1"' in dom

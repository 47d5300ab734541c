"""The report as one self-contained HTML page: verdict, inputs, rule table, plots, samples.

`render_html(report, samples)` returns the page; `write_html` writes it atomically. The page
loads nothing: styles are inline, plots are inline SVG drawn by `audit.report.html.svg`, there is no
script, and a Content-Security-Policy forbids any remote asset or script should one ever slip
in. Every piece of record text (ids, messages, decoded tokens, raw lines) goes through
`html.escape`, since a sample may contain anything, `<script>` included.

Size stays bounded whatever the partition: the distributions are fixed-size summaries, the
findings table shows the first `FINDINGS_SHOWN`, and samples are a few token windows per rule.
"""

from __future__ import annotations

import re
from html import escape
from itertools import groupby
from pathlib import Path
from typing import Any

from audit import __version__
from audit.base.destinations import refuse_overlap
from audit.base.errors import InputError
from audit.base.storage import ObjectPath, write_output
from audit.checks.base import Explanation
from audit.model.families.thinking_modes import mode_label
from audit.records.segments import (
    SEGMENT_ANSWER,
    SEGMENT_PROMPT,
    SEGMENT_REASONING,
    SEGMENT_TOOL_CALLS,
)
from audit.report.html import svg
from audit.report.html.samples import Sample, Samples, collect_samples, samples_for_saved_report
from audit.report.report import Report, RuleResult

__all__ = ["Samples", "collect_samples", "html_path", "render_html", "samples_for_saved_report", "write_html"]

FINDINGS_SHOWN = 50
# An id up to this long stays on one line in the findings table; a longer one may break anywhere.
ID_KEPT_WHOLE = 40
# Blocks remote fetches and scripts even if escaping ever failed: the page needs neither.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

SEGMENT_CLASSES = (SEGMENT_PROMPT, SEGMENT_REASONING, SEGMENT_ANSWER, SEGMENT_TOOL_CALLS)
VISIBLE = str.maketrans({"\n": "↵", "\r": "␍", "\t": "⇥"})


def html_path(path: Path | ObjectPath, target: str, *, several: bool) -> Path | ObjectPath:
    """Where one target's page goes: `path` itself, or `<stem>-<target><suffix>` beside it for several."""
    if not several:
        return path
    # The target comes from a report (hand-edited, perhaps): only its safe characters name a
    # file, so a "../x" or "a/b" target stays beside `path`.
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", target).strip(".") or "target"
    return path.with_name(f"{path.stem}-{safe}{path.suffix or '.html'}")


def write_html(report: Report, path: Path | ObjectPath, samples: Samples | None = None) -> Path | ObjectPath:
    """Write the page atomically (temporary file then rename, or one upload)."""
    if path.is_dir():
        raise InputError(f"--html {path} is a directory; name a file, e.g. {path / 'report.html'}")
    refuse_overlap([("--html", path)], [("the report's input", report.input_location())])
    return write_output(path, render_html(report, samples))


def render_html(report: Report, samples: Samples | None = None) -> str:
    """The whole page as a string."""
    title = f"audit {report.target}: {report.verdict.upper()}"
    body = [
        _header(report),
        _section("Inputs", _inputs(report)),
        _section("Rules", _rules_table(report.results)),
        _section("Distributions", _plots(report)),
        _section("Samples", _samples(report, samples)),
        _section("Findings", _findings(report)),
        f'<footer>audit {escape(__version__)} · schema_version 1 · written {escape(report.created_at)}</footer>',
    ]
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


# -- sections ------------------------------------------------------------------------------
def _header(report: Report) -> str:
    judgement = report.judgement
    detail = f"{report.failing_records:,} of {report.records:,} records have errors"
    if judgement.failed:
        detail += f"; failed: {', '.join(judgement.failed)}"
    if judgement.warned:
        detail += f"; warnings: {', '.join(judgement.warned)}"
    return (
        f'<header><div class="verdict {escape(report.verdict)}">{escape(report.verdict.upper())}</div>'
        f"<div><h1>audit check {escape(report.target)}</h1>"
        f'<p class="detail">{escape(detail)}</p></div></header>'
    )


def _section(title: str, content: str) -> str:
    anchor = title.lower()
    return f'<section id="{anchor}"><h2>{escape(title)}</h2>\n{content}\n</section>'


def _inputs(report: Report) -> str:
    data, profile, tokenizer = report.input, report.profile, report.tokenizer
    rows: list[tuple[str, Any]] = [
        ("data file", data.get("path")),
        ("sha256", data.get("sha256")),
        ("size", f"{data.get('bytes', 0):,} bytes, {data.get('lines', 0):,} lines"),
        ("records", f"{report.records:,} ({data.get('output_tokens', 0):,} output tokens)"),
        (
            "profile",
            f"{profile.get('name')} · thinking {mode_label(profile.get('thinking', True))}"
            f" · reasoning {profile.get('reasoning')} · {profile.get('source')}",
        ),
        ("tokenizer", f"{tokenizer.get('path')} · {tokenizer.get('vocab_size', 0):,} ids"),
        ("tokenizer sha256", tokenizer.get("sha256")),
        ("rule set", f"{report.rule_set.get('path')} · sha256 {report.rule_set.get('sha256')}"),
        ("audited", f"{report.created_at} in {round(report.seconds, 3):.2f}s"),  # as the JSON keeps it
    ]
    cells = "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in rows)
    return f'<table class="facts">{cells}</table>'


def _rules_table(results: list[RuleResult]) -> str:
    head = "".join(
        f"<th>{h}</th>"
        for h in ("code", "rule", "severity", "failing", "rate", "threshold", "verdict", "first lines")
    )
    rows = []
    for r in results:
        quiet = ' class="quiet"' if r.failing == 0 else ""
        rows.append(
            f"<tr{quiet}><td><code>{escape(r.code)}</code></td>"
            f'<td title="{escape(r.summary)}">{escape(r.name)}</td>'
            f'<td><span class="sev {escape(r.severity)}">{escape(r.severity)}</span></td>'
            # A partition-level rule counts modes, not records: its detail stands for the lines.
            f'<td class="num">{r.failing:,}</td>'
            f'<td class="num">{"" if r.detail is not None else f"{r.rate:.2%}"}</td>'
            f"<td>{escape(r.threshold)}</td>"
            f'<td><span class="badge {escape(r.verdict)}">{escape(r.verdict)}</span></td>'
            f"<td>{escape(r.detail if r.detail is not None else ', '.join(map(str, r.example_lines)))}</td></tr>"
        )
    return f'<table class="rules"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _plots(report: Report) -> str:
    failing = sorted((r for r in report.results if r.failing), key=lambda r: -r.failing)
    charts = [
        svg.bar_chart(
            "Failing records per rule",
            [(f"{r.code} {r.name}", r.failing, r.verdict) for r in failing],
        )
        if failing
        else svg.empty("Failing records per rule", "no rule flagged any record")
    ]
    shape = report.distributions
    if shape is None:
        return _grid(charts) + '<p class="note">This report carries no distributions (written by an older audit).</p>'
    prompt, output = shape["prompt_tokens"], shape["output_tokens"]
    position, pairs = shape["response_position"], shape["reasoning_answer"]
    shown = len(pairs["points"])
    charts += [
        svg.histogram(
            "Prompt length", prompt["edges"], prompt["counts"], x_label="input_ids per record",
            note=_summary_note(prompt),
        ),
        svg.histogram(
            "Output length", output["edges"], output["counts"], x_label="output_ids per record",
            note=_summary_note(output),
        ),
        svg.scatter(
            "Reasoning vs answer length",
            pairs["points"],
            x_label="tokens before the response token",
            y_label="tokens after it",
            note=f"{shown:,} of {pairs['records']:,} records" if shown < pairs["records"] else "",
        ),
        svg.histogram(
            "Where the response token falls",
            position["edges"],
            position["counts"],
            x_label="position in the output (0 = first token, 1 = last)",
            note=f"{position['missing']:,} records have none" if position.get("missing") else "",
        ),
        svg.bar_chart(
            "Finish reasons",
            [(k, v, "stop" if k == "stop" else "other") for k, v in shape["finish_reasons"].items()],
        ),
        svg.bar_chart("Tool calls per record", [(k, v, "calls") for k, v in shape["tool_calls"].items()]),
    ]
    if (mix := shape.get("serving_mix")) and mix["records"]:
        modes = [("thinking on", mix["thinking_on"], "stop"), ("thinking off", mix["thinking_off"], "other")]
        charts.append(
            svg.bar_chart(
                "Serving mix",
                [*(modes if mix["thinking_known"] else []), ("tool calls", mix["tool_calls"], "calls")],
            )
        )
    return _grid(charts)


def _summary_note(summary: dict[str, Any]) -> str:
    if summary.get("p50") is None:
        return ""
    return f"median {summary['p50']:,} · p99 {summary['p99']:,} · max {summary['max']:,}"


def _grid(charts: list[str]) -> str:
    return '<div class="plots">' + "".join(f"<figure>{c}</figure>" for c in charts) + "</div>"


def _samples(report: Report, samples: Samples | None) -> str:
    failing = [r for r in report.results if r.failing]
    if not failing:
        return '<p class="note">No rule flagged any record.</p>'
    if samples is None:
        return '<p class="note">Samples need the data file and tokenizer; this page was rendered without them.</p>'
    if samples.unavailable:
        return f'<p class="note">{escape(samples.unavailable)}</p>'
    legend = (
        '<p class="legend"><span class="tok">text</span> <span class="tok special">special token</span> '
        '<span class="tok unknown">not in vocabulary</span> <span class="tok hit">offending position</span> '
        "· underlined by segment: "
        + " ".join(f'<span class="seg {seg}">{seg.replace("_", " ")}</span>' for seg in SEGMENT_CLASSES)
        + " · ↵ newline, ⇥ tab · hover a token for its index and id</p>"
    )
    parts = [legend]
    for result in failing:
        mine = samples.by_rule.get(result.code, [])
        parts.append(
            f'<div class="rule-samples"><h3><code>{escape(result.code)}</code> {escape(result.name)} '
            f'<span class="sev {escape(result.severity)}">{escape(result.severity)}</span> '
            f'<span class="count">{_count(result.failing, "record")}, first {len(mine)} shown</span></h3>'
            + "".join(_sample(s) for s in mine)
            + "</div>"
        )
    return "".join(parts)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _sample(sample: Sample) -> str:
    where = f"{sample.field}[{sample.position}]" if sample.position is not None else (sample.field or "line")
    named = "" if sample.id is None else f' · id <span class="rid">{escape(sample.id)}</span>'
    head = (
        f'<div class="sample-head">line {sample.line}{named}'
        f" · {escape(where)} · {escape(sample.message)}</div>"
    )
    if sample.explanation is not None:
        head += _explanation(sample.explanation)
    if sample.note:
        return f'<div class="sample">{head}<p class="note">{escape(sample.note)}</p></div>'
    if sample.raw is not None:
        return f'<div class="sample">{head}<pre class="raw">{escape(sample.raw)}</pre></div>'
    if not sample.tokens:
        return f'<div class="sample">{head}<p class="note">{escape(str(sample.field))} is empty</p></div>'
    first, last = sample.tokens[0].index, sample.tokens[-1].index
    spans = []
    if first > 0:
        spans.append(f'<span class="gap">… {_count(first, "token")} before</span>')
    # Consecutive tokens of one segment share an underlined group.
    for segment, group in groupby(sample.tokens, key=lambda token: token.segment):  # a window of ~40 tokens
        inner = []
        for token in group:
            css = token.kind + (" hit" if token.index == sample.position else "")
            text = token.text.translate(VISIBLE) or "∅"
            if token.kind == "unknown":
                text = f"⟨{token.id}⟩"
            inner.append(
                f'<span class="tok {css}" title="{escape(str(sample.field))}[{token.index}] = {token.id}">'
                f"{escape(text)}</span>"
            )
        css = segment if segment in SEGMENT_CLASSES else "prompt"
        spans.append(f'<span class="seg {css}">{"".join(inner)}</span>')
    if last < sample.length - 1:
        spans.append(f'<span class="gap">… {_count(sample.length - 1 - last, "token")} after</span>')
    return f'<div class="sample">{head}<div class="tokens">{"".join(spans)}</div></div>'


def _explanation(explanation: Explanation) -> str:
    """What the rule expected beside what the record holds: a small table, every cell escaped."""
    rows = "".join(
        f'<tr><th>{escape(label)}</th><td><code>{escape(value.translate(VISIBLE))}</code></td></tr>'
        for label, value in explanation.rows
    )
    return f'<table class="explain"><caption>{escape(explanation.title)}</caption>{rows}</table>'


def _findings(report: Report) -> str:
    if report.log.is_empty():
        return '<p class="note">No findings.</p>'
    shown = report.log.head(FINDINGS_SHOWN)
    rows = []
    for f in shown.iter_rows(named=True):
        where = "" if f["position"] is None else f"{f['field']}[{f['position']}]"
        sample_id = f["id"] or ""
        id_class = "keep" if len(sample_id) <= ID_KEPT_WHOLE else "long"
        rows.append(
            f"<tr><td class=\"num keep\">{f['line']}</td><td class=\"{id_class}\">{escape(sample_id)}</td>"
            f"<td class=\"keep\"><code>{escape(f['rule'])}</code></td><td class=\"keep\">{escape(where)}</td>"
            f"<td class=\"message\">{escape(f['message'] or '')}</td></tr>"
        )
    more = report.log.height - shown.height
    tail = f'<p class="note">… and {more:,} more findings in the JSON report.</p>' if more > 0 else ""
    return (
        '<table class="findings"><thead><tr><th>line</th><th>id</th><th>rule</th><th>where</th>'
        f"<th>message</th></tr></thead><tbody>{''.join(rows)}</tbody></table>{tail}"
    )


STYLE = """
:root { --fail: #c62828; --warn: #b26a00; --pass: #2e7d32; --ink: #1d232b; --dim: #6b7480;
  --line: #dde2e8; --bg: #f6f7f9; --accent: #3b6fb6;
  /* Latin fonts first, then fonts with CJK and full-width forms (DeepSeek's ｜ and ▁, Chinese,
     Japanese and Korean data) on Linux, macOS and Windows, before the generic family. */
  --cjk: "Noto Sans CJK SC", "Noto Sans CJK JP", "Source Han Sans SC", "PingFang SC", "Hiragino Sans",
    "Microsoft YaHei", "Yu Gothic", "Malgun Gothic", "WenQuanYi Micro Hei";
  --sans: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, var(--cjk), sans-serif;
  --mono: ui-monospace, "SFMono-Regular", Menlo, Consolas, "DejaVu Sans Mono", "Noto Sans Mono CJK SC",
    var(--cjk), monospace; }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1200px; padding: 24px 28px 48px; color: var(--ink); background: #fff;
  font: 14px/1.45 var(--sans); }
header { display: flex; gap: 20px; align-items: center; padding-bottom: 16px; border-bottom: 1px solid var(--line); }
h1 { font-size: 22px; margin: 0; word-break: break-all; }
h2 { font-size: 17px; margin: 28px 0 10px; }
h3 { font-size: 14px; margin: 18px 0 6px; }
.detail { margin: 4px 0 0; color: var(--dim); }
.verdict { font-size: 26px; font-weight: 700; color: #fff; padding: 10px 22px; border-radius: 8px; letter-spacing: 1px; }
.verdict.fail, .badge.fail { background: var(--fail); }
.verdict.warn, .badge.warn { background: var(--warn); }
.verdict.pass, .badge.pass { background: var(--pass); }
.badge { color: #fff; border-radius: 4px; padding: 1px 7px; font-size: 12px; font-weight: 600; }
.sev { font-size: 12px; font-weight: 600; }
.sev.error { color: var(--fail); } .sev.warning { color: var(--warn); }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
thead th { background: var(--bg); font-weight: 600; }
table.facts th { width: 150px; color: var(--dim); font-weight: 500; }
table.facts td { font-family: var(--mono); font-size: 12.5px; word-break: break-all; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.quiet td, tr.quiet .sev { color: #9aa2ac; font-weight: 400; }
table.findings td { font-size: 12.5px; }
/* Lines, codes, positions and short ids never break inside; the message takes the room left. */
table.findings td.keep { white-space: nowrap; }
table.findings td.long { word-break: break-all; }
table.findings td.message { width: 100%; overflow-wrap: anywhere; }
code { font-family: var(--mono); }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 14px; }
figure { margin: 0; padding: 8px; border: 1px solid var(--line); border-radius: 6px; background: #fff; }
svg.plot { display: block; max-width: 100%; height: auto; font-family: inherit; }
svg .plot-title { font-size: 13px; font-weight: 600; fill: var(--ink); }
svg .note { font-size: 11px; font-weight: 400; fill: var(--dim); }
svg .tick, svg .value { font-size: 10.5px; fill: var(--dim); }
svg .label { font-size: 11px; fill: var(--ink); }
svg .axis-label { font-size: 11px; fill: var(--dim); }
svg .axis { stroke: #8a939e; stroke-width: 1; }
svg .grid { stroke: #eceff3; stroke-width: 1; }
svg .bar { fill: var(--accent); }
svg .bar.fail { fill: var(--fail); } svg .bar.warn { fill: var(--warn); } svg .bar.pass { fill: #9aa2ac; }
svg .bar.stop { fill: var(--pass); } svg .bar.other { fill: var(--warn); }
svg .dots circle { fill: var(--accent); fill-opacity: 0.55; }
.note { color: var(--dim); }
.legend { color: var(--dim); font-size: 12.5px; }
.rule-samples { border-top: 1px solid var(--line); }
.count { color: var(--dim); font-weight: 400; font-size: 12.5px; }
.sample { margin: 8px 0 12px; }
.sample-head { font-size: 12.5px; color: var(--dim); margin-bottom: 4px; word-break: break-word; }
.rid { color: var(--ink); font-family: var(--mono); }
.tokens { display: flex; flex-wrap: wrap; gap: 4px 2px; font-family: var(--mono);
  font-size: 12.5px; line-height: 1.5; background: var(--bg); border: 1px solid var(--line); border-radius: 6px;
  padding: 6px 8px; }
.tok { white-space: pre; border: 1px solid #d5dae1; border-radius: 3px; padding: 0 2px; background: #fff; }
.tok.special { background: #e7efff; border-color: #7a9ad6; color: #1d3f7a; font-weight: 600; }
.tok.image { background: #e0f7f4; border-color: #2a9d8f; color: #14514a; font-weight: 600; }
.tok.unknown { background: #fde7e7; border-color: var(--fail); color: var(--fail); }
.tok.hit { outline: 2px solid var(--fail); outline-offset: 1px; background: #fff1c2; }
.seg { display: inline-flex; flex-wrap: wrap; gap: 4px 2px; padding-bottom: 2px; border-bottom: 3px solid #c7ccd3; }
.seg.reasoning { border-bottom-color: #b07ad6; } .seg.answer { border-bottom-color: #5aa469; }
.seg.tool_calls { border-bottom-color: #d6a23a; } .seg.prompt { border-bottom-color: #c7ccd3; }
.legend .seg { padding: 0 2px; }
table.explain { font-size: 12px; margin: 4px 0 6px; border-collapse: collapse; }
table.explain caption { text-align: left; color: var(--dim); }
table.explain th { text-align: right; font-weight: 400; color: var(--dim); padding: 1px 8px 1px 0; vertical-align: top; }
table.explain td code { white-space: pre-wrap; word-break: break-all; }
.gap { color: var(--dim); font-style: italic; margin: 0 6px; white-space: nowrap; font-family: var(--sans); }
pre.raw { white-space: pre-wrap; word-break: break-all; background: var(--bg); border: 1px solid var(--line);
  border-radius: 6px; padding: 6px 8px; font-size: 12px; margin: 0; }
footer { margin-top: 32px; color: var(--dim); font-size: 12px; }
"""

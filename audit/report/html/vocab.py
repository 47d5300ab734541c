"""A draft vocabulary's page: how much of the trained tokens the N most frequent ids cover.

`render_vocab_html(summary)` takes the summary `audit vocab` writes (vocab.json) and returns one
self-contained page (the report page's style, an inline SVG curve, no script); every value
from it goes through `html.escape`: targets, paths and ids come from data files.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from audit import __version__
from audit.base.errors import InputError
from audit.base.storage import ObjectPath, write_output
from audit.report.html import CSP, STYLE, svg


def render_vocab_html(summary: dict[str, Any]) -> str:
    source, options = summary.get("source", {}), summary.get("options", {})
    target = str(source.get("target"))
    chosen = options.get("draft_vocab")
    rows = "".join(
        "<tr>" + "".join(f'<td class="num">{escape(cell)}</td>' for cell in _cells(row)) + "</tr>"
        for row in summary.get("coverage", [])
    )
    facts = [
        ("source", source.get("path")),
        ("sha256", source.get("sha256")),
        ("profile", summary.get("profile", {}).get("name")),
        ("tokenizer sha256", summary.get("tokenizer", {}).get("sha256")),
        ("target vocabulary", f"{summary.get('target_vocab', {}).get('size')} (from {summary.get('target_vocab', {}).get('from')})"),
        ("draft vocabulary", f"{chosen} (ties: {options.get('tie_break')})"),
        ("samples", f"{summary.get('counts', {}).get('rows')} rows, {summary.get('counts', {}).get('trained_tokens')} trained tokens"),
    ]
    chart = svg.curve(
        "coverage of the trained tokens by the N most frequent ids",
        [tuple(point) for point in summary.get("coverage_curve", [])],
        x_label="draft vocabulary size N (log scale)",
        y_label="trained tokens covered",
        marks=[chosen] if isinstance(chosen, int) else [],
    )
    body = (
        f"<header><div><h1>draft vocabulary of {escape(target)}</h1>"
        f'<p class="detail">{escape(f"top {chosen} ids")}</p></div></header>'
        '<section id="coverage"><h2>Coverage</h2><div class="plots"><figure>' + chart + "</figure></div>"
        '<table><thead><tr><th>N</th><th>coverage</th><th>trained tokens covered</th></tr></thead>'
        f"<tbody>{rows}</tbody></table></section>"
        '<section id="inputs"><h2>Inputs</h2><table class="facts">'
        + "".join(f"<tr><th>{escape(name)}</th><td>{escape(str(value))}</td></tr>" for name, value in facts)
        + "</table></section>"
        f"<footer>audit {escape(__version__)}</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>{escape(f'draft vocabulary of {target}')}</title><style>{STYLE}</style></head>\n<body>\n"
        + body
        + "\n</body></html>\n"
    )


def _cells(row: dict[str, Any]) -> tuple[str, str, str]:
    return f"{int(row['draft_size']):,}", f"{float(row['coverage']):.2%}", f"{int(row['covered_tokens']):,}"


def write_vocab_html(summary: dict[str, Any], path: Path | ObjectPath) -> Path | ObjectPath:
    """Write the page atomically (temporary file then rename, or one upload)."""
    if path.is_dir():
        raise InputError(f"--html {path} is a directory; name a file, e.g. {path / 'vocab.html'}")
    return write_output(path, render_vocab_html(summary))

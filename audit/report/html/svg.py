"""Small inline-SVG charts: horizontal bars, histograms, a scatter plot and a curve.

Hand-written rather than a plotting library: the report needs four chart shapes, and a page
that must open offline is simplest when every plot is a few hundred bytes of markup styled by
the page's own CSS (classes `bar`, `axis`, `grid`, ...). Every label passes through
`html.escape`, so a rule name or finish reason cannot inject markup.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

WIDTH = 560
FONT = 11


def bar_chart(
    title: str, bars: Sequence[tuple[str, float, str]], *, value_label: str = "records"
) -> str:
    """Horizontal bars: (label, value, css class) each, largest scale first, values printed."""
    if not bars:
        return empty(title, "nothing to show")
    row = 20
    left = min(220, 12 + FONT * 0.62 * max(len(label) for label, _, _ in bars))
    right = 70
    top, bottom = 30, 30
    height = top + row * len(bars) + bottom
    high = max(value for _, value, _ in bars) or 1
    span = WIDTH - left - right
    parts = [_open(title, height), _title(title)]
    for tick in _ticks(0, high):
        x = left + span * tick / high
        parts.append(f'<line class="grid" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{height - bottom}"/>')
        parts.append(f'<text class="tick" x="{x:.1f}" y="{height - bottom + 14}" text-anchor="middle">{_fmt(tick)}</text>')
    for i, (label, value, css) in enumerate(bars):
        y = top + i * row
        w = span * value / high
        parts.append(
            f'<text class="label" x="{left - 6:.1f}" y="{y + row * 0.68:.1f}" text-anchor="end">{escape(label)}</text>'
            f'<rect class="bar {escape(css)}" x="{left}" y="{y + 3}" width="{max(w, 1 if value else 0):.1f}" height="{row - 6}">'
            f"<title>{escape(label)}: {_exact(value)} {escape(value_label)}</title></rect>"
            f'<text class="value" x="{left + w + 4:.1f}" y="{y + row * 0.68:.1f}">{_exact(value)}</text>'
        )
    parts.append(f'<text class="axis-label" x="{left + span / 2:.1f}" y="{height - 4}" text-anchor="middle">{escape(value_label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def histogram(
    title: str,
    edges: Sequence[float],
    counts: Sequence[int],
    *,
    x_label: str,
    y_label: str = "records",
    note: str = "",
) -> str:
    """Vertical bars over contiguous bins given by `edges` (one more than `counts`)."""
    if not counts or not any(counts):
        return empty(title, "no records")
    height = 240
    left, right, top, bottom = 52, 16, 30, 44
    span_x, span_y = WIDTH - left - right, height - top - bottom
    low, high = edges[0], edges[-1]
    peak = max(counts)
    parts = [_open(title, height), _title(title, note)]
    for tick in _ticks(0, peak):
        y = top + span_y * (1 - tick / peak)
        parts.append(f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{WIDTH - right}" y2="{y:.1f}"/>')
        parts.append(f'<text class="tick" x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{_fmt(tick)}</text>')
    scale = span_x / ((high - low) or 1)
    for i, n in enumerate(counts):
        if not n:
            continue
        x0 = left + (edges[i] - low) * scale
        x1 = left + (edges[i + 1] - low) * scale
        h = span_y * n / peak
        parts.append(
            f'<rect class="bar" x="{x0 + 0.5:.1f}" y="{top + span_y - h:.1f}" width="{max(x1 - x0 - 1, 1):.1f}" height="{h:.1f}">'
            f"<title>{_exact(edges[i])}–{_exact(edges[i + 1])}: {n:,} {escape(y_label)}</title></rect>"
        )
    for tick in _ticks(low, high):
        x = left + (tick - low) * scale
        parts.append(f'<text class="tick" x="{x:.1f}" y="{top + span_y + 14}" text-anchor="middle">{_fmt(tick)}</text>')
    parts.append(_axes(left, top, span_x, span_y, x_label, y_label, height))
    parts.append("</svg>")
    return "".join(parts)


def scatter(
    title: str,
    points: Sequence[Sequence[float]],
    *,
    x_label: str,
    y_label: str,
    note: str = "",
) -> str:
    """One dot per (x, y) point; axes start at zero."""
    if not points:
        return empty(title, "no records with a response token")
    height = 300
    left, right, top, bottom = 52, 16, 30, 44
    span_x, span_y = WIDTH - left - right, height - top - bottom
    high_x = max(p[0] for p in points) or 1
    high_y = max(p[1] for p in points) or 1
    low_y = min(0, min(p[1] for p in points))  # an answer length of -1: </think> was the last token
    parts = [_open(title, height), _title(title, note)]
    for tick in _ticks(low_y, high_y):
        y = top + span_y * (1 - (tick - low_y) / (high_y - low_y))
        parts.append(f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{WIDTH - right}" y2="{y:.1f}"/>')
        parts.append(f'<text class="tick" x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{_fmt(tick)}</text>')
    for tick in _ticks(0, high_x):
        x = left + span_x * tick / high_x
        parts.append(f'<text class="tick" x="{x:.1f}" y="{top + span_y + 14}" text-anchor="middle">{_fmt(tick)}</text>')
    dots = "".join(
        f'<circle cx="{left + span_x * x / high_x:.1f}" cy="{top + span_y * (1 - (y - low_y) / (high_y - low_y)):.1f}" r="2.2"/>'
        for x, y in points
    )
    parts.append(f'<g class="dots">{dots}</g>')
    parts.append(_axes(left, top, span_x, span_y, x_label, y_label, height))
    parts.append("</svg>")
    return "".join(parts)


def curve(
    title: str, points: Sequence[tuple[float, float]], *, x_label: str, y_label: str, marks: Sequence[float] = ()
) -> str:
    """A line through (x, y) points, x on a log scale (x >= 1), y from 0 to 1 shown as percent;
    a dashed vertical line at each x in `marks`."""
    if not points:
        return empty(title, "nothing to plot")
    height = 300
    left, right, top, bottom = 52, 16, 30, 44
    span_x, span_y = WIDTH - left - right, height - top - bottom
    high = math.log10(max(max(x for x, _ in points), *marks, 10))

    def at(x: float, y: float) -> tuple[float, float]:
        return left + span_x * math.log10(max(x, 1)) / high, top + span_y * (1 - y)

    parts = [_open(title, height), _title(title)]
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = at(1, tick)[1]
        parts.append(f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{WIDTH - right}" y2="{y:.1f}"/>')
        parts.append(f'<text class="tick" x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{tick:.0%}</text>')
    for power in range(int(high) + 1):
        x = at(10**power, 0)[0]
        parts.append(f'<text class="tick" x="{x:.1f}" y="{top + span_y + 14}" text-anchor="middle">{_fmt(10**power)}</text>')
    for mark in marks:
        x = at(mark, 0)[0]
        parts.append(f'<line class="axis" stroke-dasharray="4 3" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + span_y}">'
                     f"<title>{escape(_exact(mark))}</title></line>")
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in (at(px, py) for px, py in points))
    parts.append(f'<polyline class="curve" fill="none" stroke="currentColor" stroke-width="1.6" points="{path}"/>')
    parts.append(_axes(left, top, span_x, span_y, x_label, y_label, height))
    parts.append("</svg>")
    return "".join(parts)


def _open(title: str, height: int) -> str:
    return (
        f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{escape(title)}" '
        f'viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}">'
    )


def _title(title: str, note: str = "") -> str:
    extra = f'<tspan class="note"> {escape(note)}</tspan>' if note else ""
    return f'<text class="plot-title" x="8" y="16">{escape(title)}{extra}</text>'


def _axes(left: float, top: float, span_x: float, span_y: float, x_label: str, y_label: str, height: int) -> str:
    bottom_y = top + span_y
    return (
        f'<line class="axis" x1="{left}" y1="{bottom_y}" x2="{left + span_x}" y2="{bottom_y}"/>'
        f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{bottom_y}"/>'
        f'<text class="axis-label" x="{left + span_x / 2:.1f}" y="{height - 6}" text-anchor="middle">{escape(x_label)}</text>'
        f'<text class="axis-label" transform="translate(12 {top + span_y / 2:.1f}) rotate(-90)" text-anchor="middle">{escape(y_label)}</text>'
    )


def empty(title: str, message: str) -> str:
    """A titled chart with only a note in it, for data with nothing to plot."""
    return (
        f"{_open(title, 60)}{_title(title)}"
        f'<text class="note" x="8" y="40">{escape(message)}</text></svg>'
    )


def _ticks(low: float, high: float, target: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [low, high]."""
    raw = (high - low) / target
    if not (raw > 0 and math.isfinite(raw)):
        return [low]
    power = 10.0 ** math.floor(math.log10(raw))
    if power == 0:  # a span too small for a float step: one tick
        return [low]
    step = next(s * power for s in (1, 2, 5, 10) if s * power >= raw)
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _exact(value: float) -> str:
    """A count as printed beside its bar: every digit, thousands separated."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def _fmt(value: float) -> str:
    """A tick label: short (5k, 20k) where that loses nothing."""
    if abs(value) >= 1000 and value % 1000 == 0:
        return f"{value / 1000:.0f}k"
    if abs(value) >= 10_000:
        return f"{value / 1000:.1f}k"
    if float(value).is_integer():
        return f"{int(value)}"
    return f"{value:.2f}".rstrip("0").rstrip(".")

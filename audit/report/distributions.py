"""The shape of a partition, summarised small enough to travel in the JSON report.

`summarize(stats)` turns the engine's per-record stats (`STATS_SCHEMA`: one row per readable
record) into histograms, counts and a bounded sample of points, so a report can be drawn
again later (`audit report FILE.json --html`) without the data file. Everything is computed
with polars expressions over the whole column; the output size does not grow with the file.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import polars as pl

# At most this many bars per length histogram: enough to see a shape, small in JSON.
HISTOGRAM_BINS = 40
# Bins over the response token's relative position in the output (0 = first token, 1 = last).
POSITION_BINS = 20
# Reasoning/answer pairs kept for the scatter plot: a seeded sample, not every record.
SCATTER_POINTS = 1000
# Tool calls per record beyond this are counted together ("8+").
TOOL_CALLS_CAP = 8


def summarize(stats: pl.DataFrame) -> dict[str, Any]:
    """Histograms and counts of prompt/output lengths, reasoning vs answer, finish, tool calls."""
    reasoning = stats.filter(pl.col("response_at").is_not_null()).select(
        pl.col("response_at").alias("reasoning"),
        # The response token itself belongs to neither side.
        (pl.col("output_tokens").cast(pl.Int64) - pl.col("response_at") - 1).alias("answer"),
        (pl.col("response_at") / pl.col("output_tokens").cast(pl.Int64).clip(lower_bound=1)).alias(
            "relative"
        ),
    )
    pairs = reasoning.sample(SCATTER_POINTS, seed=0) if reasoning.height > SCATTER_POINTS else reasoning
    return {
        "records": stats.height,
        "prompt_tokens": histogram(stats["prompt_tokens"]),
        "output_tokens": histogram(stats["output_tokens"]),
        "response_position": {
            **fixed_histogram(reasoning["relative"], 0.0, 1.0, POSITION_BINS),
            "missing": stats.height - reasoning.height,
        },
        "reasoning_answer": {
            "records": reasoning.height,
            "points": pairs.select("reasoning", "answer").rows(),
        },
        # Counted as they are, then labelled: a label per record (a string column as long as
        # the file) is ~20 MB at a million records, at the end of the run.
        "finish_reasons": _counts(stats["finish_type"], label=lambda k: "none" if k is None else str(k)),
        "tool_calls": _counts(stats["tool_calls"], label=_tool_calls_label, numeric=True),
        # The serving modes the records show (thinking on/off, tool calls): MIX001 judges them.
        "serving_mix": mode_counts(stats),
    }


def mode_counts(stats: pl.DataFrame) -> dict[str, int]:
    """How many records show each mode, and over how many records the thinking mode is known
    (`thinking_known`: a family without think tokens has none), from the engine's statistics."""
    thinking = stats["thinking"]
    return {
        "records": stats.height,
        "thinking_known": int(thinking.is_not_null().sum()),
        "thinking_on": int(thinking.sum() or 0),
        "thinking_off": int((~thinking).sum() or 0),
        "tool_calls": int((stats["tool_calls"] > 0).sum()),
    }


def _tool_calls_label(calls: int | None) -> str:
    return str(calls) if calls is None or calls < TOOL_CALLS_CAP else f"{TOOL_CALLS_CAP}+"


def histogram(values: pl.Series, bins: int = HISTOGRAM_BINS) -> dict[str, Any]:
    """Counts over round-width bins spanning the values, with min, max, mean and percentiles."""
    values = values.drop_nulls().cast(pl.Float64)
    if values.is_empty():
        return {"edges": [], "counts": [], "min": None, "max": None, "mean": None, "p50": None, "p99": None}
    low, high = float(values.min()), float(values.max())  # type: ignore[arg-type]  # numbers, not empty
    width = _nice_width((high - low) / bins) if high > low else 1.0
    start = math.floor(low / width) * width
    count = max(1, math.floor((high - start) / width) + 1)
    summary = {
        "min": _number(low),
        "max": _number(high),
        "mean": round(float(values.mean()), 2),  # type: ignore[arg-type]
        "p50": _number(float(values.quantile(0.5, "nearest"))),  # type: ignore[arg-type]
        "p99": _number(float(values.quantile(0.99, "nearest"))),  # type: ignore[arg-type]
    }
    return {**fixed_histogram(values, start, start + count * width, count), **summary}


def fixed_histogram(values: pl.Series, low: float, high: float, bins: int) -> dict[str, Any]:
    """Counts over `bins` equal bins from `low` to `high` (the last bin includes `high`)."""
    width = (high - low) / bins
    index = ((values.drop_nulls().cast(pl.Float64) - low) / width).floor().cast(pl.Int64).clip(0, bins - 1)
    counted = index.value_counts()
    counts = [0] * bins
    for bin_index, n in counted.iter_rows():  # at most `bins` rows
        counts[bin_index] = n
    return {"edges": [_number(low + i * width) for i in range(bins + 1)], "counts": counts}


def _counts(values: pl.Series, *, label: Callable[[Any], str] = str, numeric: bool = False) -> dict[str, int]:
    """How many values have each label (`label` of the value)."""
    rows: dict[str, int] = {}
    for value, n in values.value_counts().iter_rows():
        name = label(value)
        rows[name] = rows.get(name, 0) + int(n)
    if numeric:  # 0, 1, 2, ... 8+ in order, not by frequency
        return dict(sorted(rows.items(), key=lambda kv: int(kv[0].rstrip("+"))))
    return dict(sorted(rows.items(), key=lambda kv: (-kv[1], kv[0])))


def _nice_width(raw: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten that is at least `raw` (and at least 1)."""
    if raw <= 1:
        return 1.0
    power = 10 ** math.floor(math.log10(raw))
    for step in (1, 2, 5, 10):
        if step * power >= raw:
            return float(step * power)
    return float(10 * power)


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else round(value, 6)

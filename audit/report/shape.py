"""The shape a saved JSON report must have before anything renders it.

A report on disk is untrusted: it may have been edited by hand, cut short or written by
something else. `check_report_shape` walks the parsed JSON once and raises `InputError`
naming the first value of the wrong type (`profile must be an object`, `distributions.
prompt_tokens.counts must be a list of counts`), so `audit report`, `audit diff` and
`audit report --html` fail with one line instead of deep inside a renderer. Keys a renderer
does not need may be missing; a key that is present must have the type the writer gives it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import pairwise
from typing import Any

from audit.base.errors import InputError
from audit.base.storage import AnyPath

VERDICTS = ("pass", "warn", "fail")
# Lengths, counts and positions in a report are token counts: far below this. A larger value
# (1e308, say) would overflow the plots' arithmetic.
LARGEST_NUMBER = 1e15

ADVICE = "expected a report from `audit check`"
# A length histogram's summary: all numbers, or all null when no record was measured.
SUMMARY_KEYS = ("min", "max", "mean", "p50", "p99")


class _Wrong(Exception):
    """The first value of the wrong shape: `where` it is, and what it must be."""

    def __init__(self, where: str, expected: str | None = None, *, message: str | None = None):
        super().__init__(message or f"{where} must be {expected}")
        self.where = where


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= LARGEST_NUMBER


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) <= LARGEST_NUMBER
    )


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _optional(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or test(value)


_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "count": (_is_count, "a count (an integer, 0 or more)"),
    "number": (_is_number, "a finite number"),
    "text": (_is_text, "a string"),
    "text?": (_optional(_is_text), "a string or null"),
    "count?": (_optional(_is_count), "a count or null"),
    "number?": (_optional(_is_number), "a number or null"),
    "bool?": (_optional(lambda v: isinstance(v, bool)), "true, false or null"),
    "thinking?": (_optional(lambda v: isinstance(v, bool) or v == "mixed"), 'true, false, "mixed" or null'),
    "threshold": (
        _optional(lambda v: _is_count(v) or isinstance(v, str)),
        'a count, a rate such as "2%", or null',
    ),
}


def _check(value: Any, kind: str, where: str) -> Any:
    test, expected = _TYPES[kind]
    if not test(value):
        raise _Wrong(where, expected)
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Wrong(where, "an object")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _Wrong(where, "a list")
    return value


def _fields(
    data: dict[str, Any], where: str, kinds: dict[str, str], *, required: tuple[str, ...] = ()
) -> None:
    for key, kind in kinds.items():
        if key in data:
            _check(data[key], kind, f"{where}.{key}" if where else key)
        elif key in required:
            raise _Wrong(f"{where}.{key}" if where else key, _TYPES[kind][1] + " (it is missing)")


def check_report_shape(data: Any, path: AnyPath) -> None:
    """Raise InputError (one line, naming `path` and the key) unless `data` has a report's shape."""
    try:
        _report(data)
    except _Wrong as wrong:
        if wrong.where.startswith("findings"):
            raise InputError(f"{path}: not a complete audit report ({wrong}); {ADVICE}") from None
        raise InputError(f"{path}: {wrong}; {ADVICE}") from None


def _report(data: Any) -> None:
    report = _object(data, "the report")
    _fields(
        report,
        "",
        {"target": "text", "created_at": "text", "seconds": "number"},
        required=("target", "created_at"),
    )
    for key in ("input", "profile", "tokenizer", "rule_set"):
        if key not in report:
            raise _Wrong(key, "an object (it is missing)")
        _object(report[key], key)
    _fields(
        report["input"],
        "input",
        {
            "records": "count",
            "path": "text",
            "sha256": "text?",
            "bytes": "count",
            "lines": "count",
            "output_tokens": "count",
        },
        required=("records", "path"),
    )
    _fields(
        report["profile"],
        "profile",
        {"name": "text?", "thinking": "thinking?", "reasoning": "text?", "source": "text?"},
    )
    _fields(
        report["tokenizer"],
        "tokenizer",
        {"path": "text", "vocab_size": "count", "sha256": "text?"},
        required=("path",),
    )
    _fields(report["rule_set"], "rule_set", {"path": "text?", "sha256": "text?"})
    for index, result in enumerate(_list(report.get("results"), "results")):
        _result(result, index)
    for index, finding in enumerate(_list(report.get("findings", []), "findings")):
        _finding(finding, f"findings[{index}]")
    for index, error in enumerate(_list(report.get("internal_errors", []), "internal_errors")):
        where = f"internal_errors[{index}]"
        kinds = {"line": "count", "id": "text?", "rule": "text", "error": "text", "traceback": "text"}
        _fields(_object(error, where), where, kinds, required=("line", "rule", "error", "traceback"))
    if report.get("distributions") is not None:
        _distributions(_object(report["distributions"], "distributions"))


def _result(result: Any, index: int) -> None:
    where = f"results[{index}]"
    result = _object(result, where)
    code = result.get("code")
    try:
        _fields(
            result,
            where,
            {
                "code": "text",
                "name": "text",
                "severity": "text",
                "summary": "text",
                "failing": "count",
                "detail": "text?",
                "warn_above": "threshold",
                "fail_above": "threshold",
            },
            required=("code", "name", "severity", "failing"),
        )
        if result.get("verdict") not in VERDICTS:
            raise _Wrong(f"{where}.verdict", "pass, warn or fail")
        for line in _list(result.get("example_lines", []), f"{where}.example_lines"):
            if not _is_count(line) or line < 1:
                raise _Wrong(f"{where}.example_lines", "a list of line numbers")
    except _Wrong as wrong:
        # The rule's code, when it has one, says which row of the table is broken.
        named = code if isinstance(code, str) else index
        raise _Wrong(
            where, message=f"the result of rule {named!r} is malformed ({wrong})"
        ) from None


def _finding(finding: Any, where: str) -> None:
    _fields(
        _object(finding, where),
        where,
        {
            "line": "count",
            "id": "text?",
            "rule": "text",
            "severity": "text",
            "message": "text?",
            "position": "count?",
            "field": "text?",
        },
        required=("line", "rule", "severity"),
    )


def _histogram(value: Any, where: str) -> dict[str, Any]:
    histogram = _object(value, where)
    edges = _list(histogram.get("edges"), f"{where}.edges")
    counts = _list(histogram.get("counts"), f"{where}.counts")
    if not all(_is_number(edge) for edge in edges) or any(a > b for a, b in pairwise(edges)):
        raise _Wrong(f"{where}.edges", "a rising list of numbers")
    if not all(_is_count(count) for count in counts):
        raise _Wrong(f"{where}.counts", "a list of counts")
    if counts and len(edges) != len(counts) + 1:
        raise _Wrong(f"{where}.edges", "one longer than counts")
    _fields(
        histogram,
        where,
        {
            "min": "number?",
            "max": "number?",
            "mean": "number?",
            "p50": "number?",
            "p99": "number?",
            "missing": "count",
        },
    )
    summary = [histogram.get(key) is not None for key in SUMMARY_KEYS]
    if any(summary) and not all(summary):
        # The writer gives all of them (some records) or none (no records).
        raise _Wrong(where, f"either all numbers or all null in {', '.join(SUMMARY_KEYS)}")
    return histogram


def _distributions(shape: dict[str, Any]) -> None:
    for key in ("prompt_tokens", "output_tokens", "response_position"):
        _histogram(shape.get(key), f"distributions.{key}")
    pairs = _object(shape.get("reasoning_answer"), "distributions.reasoning_answer")
    _check(pairs.get("records"), "count", "distributions.reasoning_answer.records")
    for point in _list(pairs.get("points"), "distributions.reasoning_answer.points"):
        if not (isinstance(point, list) and len(point) == 2 and all(_is_number(v) for v in point)):
            raise _Wrong(
                "distributions.reasoning_answer.points",
                "a list of [reasoning, answer] number pairs",
            )
    for key in ("finish_reasons", "tool_calls"):
        counts = _object(shape.get(key), f"distributions.{key}")
        if not all(_is_count(n) for n in counts.values()):
            raise _Wrong(f"distributions.{key}", "an object of counts")
    if "serving_mix" in shape:  # reports before the serving mix have none
        where = "distributions.serving_mix"
        mix = _object(shape["serving_mix"], where)
        keys = ("records", "thinking_known", "thinking_on", "thinking_off", "tool_calls")
        _fields(mix, where, dict.fromkeys(keys, "count"), required=keys)
        if mix["thinking_on"] + mix["thinking_off"] > mix["thinking_known"] or max(
            mix["thinking_known"], mix["tool_calls"]
        ) > mix["records"]:
            raise _Wrong(where, "counts of modes within the records counted")

"""A few failing records per rule, cut to a window of tokens around the finding.

The report's findings say line, field and position; this module streams the data file once,
keeps only the lines it needs, and decodes the window ids in one batched tokenizer call. A
30,000-token output becomes ~40 tokens around the offending position, so the page stays small
however long the records or however many findings there are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import orjson
import polars as pl

from audit.records import InputDigest, iter_line_blocks
from audit.report import Report
from audit.tokenizer import Tokenizer

SAMPLES_PER_RULE = 3
# Tokens shown on each side of the offending position.
WINDOW = 20
# Characters of a raw line shown when the line is not a readable record.
RAW_EXCERPT = 300


@dataclass(frozen=True)
class Token:
    """One token of a sample window, as the page shows it."""

    index: int  # position in the field's id list
    id: int
    text: str
    kind: str  # "text" | "special" | "unknown" (not in the vocabulary)


@dataclass
class Sample:
    """One failing record of one rule, reduced to what a person needs to see."""

    rule: str
    line: int
    id: str | None
    field: str | None
    position: int | None
    message: str
    length: int = 0  # ids in the field
    tokens: list[Token] = field(default_factory=list)
    raw: str | None = None  # the line's start, when it is not a readable record
    note: str = ""


@dataclass
class Samples:
    """Samples by rule code, and why there are none when the data could not be read."""

    by_rule: dict[str, list[Sample]] = field(default_factory=dict)
    unavailable: str = ""


def collect_samples(
    report: Report,
    tokenizer: Tokenizer,
    *,
    data_file: Path | None = None,
    verify_sha256: bool = False,
    per_rule: int = SAMPLES_PER_RULE,
    window: int = WINDOW,
) -> Samples:
    """The first `per_rule` failing records of each rule that failed any, token windows decoded.

    `verify_sha256` re-hashes the whole file and drops the samples if it changed since the
    audit (for re-rendering an old report; a fresh check needs no second hash).
    """
    path = Path(data_file or report.input["path"])
    chosen = _choose(report.findings, per_rule)
    if chosen.is_empty():
        return Samples()
    if not path.is_file():
        return Samples(unavailable=f"samples omitted: {path} is no longer there")
    wanted = set(chosen["line"].to_list())
    lines, digest = _read_lines(path, wanted, full_pass=verify_sha256)
    if verify_sha256 and digest != report.input.get("sha256"):
        return Samples(unavailable=f"samples omitted: {path} changed since the audit (sha256 differs)")

    specials = _special_ids(report, tokenizer)
    samples: list[Sample] = []
    for row in chosen.iter_rows(named=True):  # a handful of rows: rules x per_rule
        samples.append(_cut(row, lines.get(row["line"]), window))
    _decode(samples, tokenizer, specials)
    by_rule: dict[str, list[Sample]] = {}
    for sample in samples:
        by_rule.setdefault(sample.rule, []).append(sample)
    return Samples(by_rule=by_rule)


def _choose(findings: pl.DataFrame, per_rule: int) -> pl.DataFrame:
    """The first findings (by line) of each rule, one per record."""
    return (
        findings.unique(subset=["rule", "line"], keep="first", maintain_order=True)
        .group_by("rule", maintain_order=True)
        .head(per_rule)
    )


def _read_lines(path: Path, wanted: set[int], *, full_pass: bool) -> tuple[dict[int, bytes], str]:
    """The raw bytes of the wanted physical lines, in one streamed pass."""
    digest = InputDigest() if full_pass else None
    found: dict[int, bytes] = {}
    remaining = sorted(wanted)
    for block in iter_line_blocks(path, digest):
        end = block.first_line + len(block.lines)
        while remaining and remaining[0] < end:
            number = remaining.pop(0)
            if number >= block.first_line:
                found[number] = block.lines[number - block.first_line].rstrip(b"\r")
        if not remaining and digest is None:
            break  # every wanted line is in hand; no need to read the rest
    return found, digest.sha256 if digest is not None else ""


def _cut(row: dict, raw: bytes | None, window: int) -> Sample:
    sample = Sample(
        rule=row["rule"],
        line=row["line"],
        id=row["id"],
        field=row["field"],
        position=row["position"],
        message=row["message"],
    )
    if raw is None:
        sample.note = "line not found in the data file"
        return sample
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        record = None
    name = row["field"] or "output_ids"
    ids = record.get(name) if isinstance(record, dict) else None
    if ids is None and name == "input_ids" and isinstance(record, dict):
        ids = record.get("prompt_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        sample.raw = raw[: RAW_EXCERPT * 4].decode("utf-8", errors="replace")[:RAW_EXCERPT]
        return sample
    if sample.id is None and isinstance(record, dict) and record.get("id") is not None:
        sample.id = str(record["id"])
    sample.field = name
    sample.length = len(ids)
    position = row["position"]
    if position is not None and 0 <= position < len(ids):
        start, stop = max(0, position - window), min(len(ids), position + window + 1)
    else:
        # No position (truncation, a count mismatch, a duplicate...): the end tells most.
        start, stop = max(0, len(ids) - 2 * window), len(ids)
    sample.tokens = [Token(index, ids[index], "", "text") for index in range(start, stop)]
    return sample


def _decode(samples: list[Sample], tokenizer: Tokenizer, specials: frozenset[int]) -> None:
    """Decode every window id in one batch call; ids the tokenizer lacks are marked, not decoded."""
    known = tokenizer.known_ids
    ids = sorted({t.id for s in samples for t in s.tokens if t.id in known})
    pieces = dict(zip(ids, tokenizer.token_strings(ids), strict=True)) if ids else {}
    for sample in samples:
        sample.tokens = [
            Token(
                t.index,
                t.id,
                pieces.get(t.id, ""),
                "unknown" if t.id not in known else "special" if t.id in specials else "text",
            )
            for t in sample.tokens
        ]


def _special_ids(report: Report, tokenizer: Tokenizer) -> frozenset[int]:
    """The tokenizer's special tokens plus the profile's (Qwen's </think> is not special)."""
    ids: set[int] = set(getattr(tokenizer.hf, "all_special_ids", []) or [])
    for token_id, added in (getattr(tokenizer.hf, "added_tokens_decoder", {}) or {}).items():
        if getattr(added, "special", False):
            ids.add(int(token_id))
    profile = report.profile
    for key in ("think_start", "think_end"):
        if isinstance(profile.get(key), int):
            ids.add(profile[key])
    for key in ("end_of_turn", "eos"):
        ids.update(i for i in profile.get(key) or [] if isinstance(i, int))
    ids.update(i for i in (profile.get("tool_markers") or {}).values() if isinstance(i, int))
    return frozenset(ids)


def samples_for_saved_report(report: Report, *, trust_remote_code: bool = False) -> Samples:
    """Samples for a report read back from JSON: only if its data file and tokenizer are unchanged."""
    from audit.errors import ConfigError
    from audit.tokenizer import load_tokenizer

    if _choose(report.findings, 1).is_empty():
        return Samples()
    recorded = report.tokenizer
    try:
        tokenizer = load_tokenizer(recorded["path"], trust_remote_code=trust_remote_code)
    except (ConfigError, KeyError) as exc:
        return Samples(unavailable=f"samples omitted: {exc}")
    if recorded.get("sha256") and tokenizer.fingerprint.sha256 != recorded["sha256"]:
        return Samples(unavailable=f"samples omitted: the tokenizer in {recorded['path']} changed since the audit")
    return collect_samples(report, tokenizer, verify_sha256=True)

"""A few failing records per rule, cut to a window of tokens around the finding.

The report's findings say line, field and position; this module streams the data file once,
keeps only the lines it needs, reads them with the audit's own reader, and decodes the window
ids in one batched tokenizer call. A 30,000-token output becomes ~40 tokens around the
offending position, so the page stays small however long the records or however many findings
there are. Each output token carries its segment from the record view (`audit.records.segments`), and
each sample what its rule wants shown beside it (`Rule.explain`), as `audit inspect` shows them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from audit.base.errors import ConfigError
from audit.base.storage import AnyPath, ObjectPath, is_url
from audit.checks import RULES
from audit.checks.base import Explanation
from audit.engine.findings import FindingsLog, empty_findings_frame
from audit.model.families.profiles import ResolvedProfile, load_profile
from audit.model.families.thinking_modes import MIXED
from audit.model.tokens.token_text import token_strings
from audit.model.tokens.tokenizer import Tokenizer
from audit.records.batch import AuditContext, Batch
from audit.records.images import ImageSource, image_chips, image_source
from audit.records.record_lines import read_record
from audit.records.segments import SEGMENT_PROMPT, sequence_roles, token_roles, token_segments
from audit.records.sources import InputDigest, file_blocks
from audit.report.report import Report

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
    kind: str  # "text" | "special" | "unknown" (not in the vocabulary) | "image" (a vision pad's chip)
    segment: str = SEGMENT_PROMPT  # prompt, reasoning, answer, tool_calls


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
    tokens: list[Token] = dataclasses.field(default_factory=list)
    raw: str | None = None  # the line's start, when it is not a readable record
    note: str = ""
    explanation: Explanation | None = None  # what the rule wants shown beside the record


@dataclass
class Samples:
    """Samples by rule code, and why there are none when the data could not be read."""

    by_rule: dict[str, list[Sample]] = dataclasses.field(default_factory=dict)
    unavailable: str = ""


def collect_samples(
    report: Report,
    tokenizer: Tokenizer,
    *,
    profile: ResolvedProfile | None = None,
    data_file: Path | ObjectPath | None = None,
    verify_sha256: bool = False,
    per_rule: int = SAMPLES_PER_RULE,
    window: int = WINDOW,
) -> Samples:
    """The first `per_rule` failing records of each rule that failed any, token windows decoded.

    `profile` is the run's resolved profile (segments, roles, explanations); None resolves the
    one the report names. `verify_sha256` re-hashes the whole file and drops the samples if it
    changed since the audit (for re-rendering an old report; a fresh check needs no second hash).
    """
    chosen = _choose(report.log, per_rule)
    if chosen.is_empty():
        return Samples()
    recorded = str(report.input["path"])
    if data_file is None and is_url(recorded):
        # A saved report is data: the URL it records never makes the audit reach the network.
        return Samples(unavailable=f"samples omitted: the audited data is in object storage ({recorded})")
    path = data_file if data_file is not None else Path(recorded)
    if not path.is_file():
        return Samples(unavailable=f"samples omitted: {path} is no longer there")
    wanted = set(chosen["line"].to_list())
    lines, digest = _read_lines(path, wanted, full_pass=verify_sha256)
    if verify_sha256 and digest != report.input.get("sha256"):
        return Samples(unavailable=f"samples omitted: {path} changed since the audit (sha256 differs)")

    profile = profile or _report_profile(report, tokenizer)
    records = _records(lines, profile, tokenizer)
    roles = token_roles(profile, tokenizer) if profile is not None else dict.fromkeys(tokenizer.special_ids, "")
    samples: list[Sample] = []
    images = image_source(path)
    for row in chosen.iter_rows(named=True):  # a handful of rows: rules x per_rule
        samples.append(_cut(row, lines.get(row["line"]), records, window, images))
    _decode(samples, tokenizer, frozenset(roles))
    by_rule: dict[str, list[Sample]] = {}
    for sample in samples:
        by_rule.setdefault(sample.rule, []).append(sample)
    return Samples(by_rule=by_rule)


@dataclass
class _Records:
    """The sample lines read as records: one batch, its rows by line, each output's segments."""

    batch: Batch | None
    row_of: dict[int, int]
    segments: list
    readable: set[int]


def _records(lines: dict[int, bytes], profile: ResolvedProfile | None, tokenizer: Tokenizer) -> _Records:
    """The wanted lines through the audit's reader (salvaging what a broken line still holds)."""
    frames, readable = [], set()
    for number, raw in sorted(lines.items()):
        frame, problem = read_record(raw, number)
        frames.append(frame)
        if problem is None:
            readable.add(number)
    present = [f for f in frames if f.height]
    if not present or profile is None:
        return _Records(None, {}, [], readable)
    frame = pl.concat(present, how="vertical")
    batch = Batch(frame, AuditContext(profile, tokenizer))
    return _Records(batch, {line: i for i, line in enumerate(frame["line"].to_list())}, token_segments(batch), readable)


def _report_profile(report: Report, tokenizer: Tokenizer) -> ResolvedProfile | None:
    """The profile a saved report was audited with, resolved again (None when it cannot be)."""
    recorded = report.profile or {}
    source = recorded.get("source")
    try:
        named = source if source and Path(source).is_file() else recorded.get("name")
        if not named:
            return None
        thinking = recorded.get("thinking", True)
        return load_profile(named).resolve(tokenizer, thinking=MIXED if thinking == MIXED else bool(thinking))
    except ConfigError:
        return None


def _choose(log: FindingsLog, per_rule: int) -> pl.DataFrame:
    """The first findings (by line) of each rule, one per record; the log is read a part at a time."""
    chosen = empty_findings_frame()
    for batch in log.batches():
        chosen = _first_per_rule(pl.concat([chosen, _first_per_rule(batch, per_rule)]), per_rule)
    return chosen


def _first_per_rule(findings: pl.DataFrame, per_rule: int) -> pl.DataFrame:
    return (
        findings.unique(subset=["rule", "line"], keep="first", maintain_order=True)
        .group_by("rule", maintain_order=True)
        .head(per_rule)
        .select(list(findings.columns))
    )


def _read_lines(path: AnyPath, wanted: set[int], *, full_pass: bool) -> tuple[dict[int, bytes], str]:
    """The raw bytes of the wanted physical lines, in one streamed pass."""
    digest = InputDigest() if full_pass else None
    found: dict[int, bytes] = {}
    remaining = sorted(wanted)
    for block in file_blocks(path, digest=digest):
        end = block.first_line + len(block.lines)
        while remaining and remaining[0] < end:
            number = remaining.pop(0)
            if number >= block.first_line and number not in block.long_lines:
                found[number] = block.lines[number - block.first_line].rstrip(b"\r")
        if not remaining and digest is None:
            break  # every wanted line is in hand; no need to read the rest
    return found, digest.sha256 if digest is not None else ""


def _cut(row: dict, raw: bytes | None, records: _Records, window: int, images: ImageSource) -> Sample:
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
    name = row["field"] or "output_ids"
    batch, at = records.batch, records.row_of.get(row["line"])
    ids = None if batch is None or at is None else batch.records[name][at]
    if ids is None or batch is None or at is None:
        sample.raw = raw[: RAW_EXCERPT * 4].decode("utf-8", errors="replace")[:RAW_EXCERPT]
        return sample
    ids = ids.to_list()
    record_id = batch.records["id"][at]
    if sample.id is None and record_id is not None:
        sample.id = record_id
    sample.field = name
    sample.length = len(ids)
    position = row["position"]
    if position is not None and 0 <= position < len(ids):
        start, stop = max(0, position - window), min(len(ids), position + window + 1)
    else:
        # No position (truncation, a count mismatch, a duplicate...): the end tells most.
        start, stop = max(0, len(ids) - 2 * window), len(ids)
    segments = records.segments[at] if name == "output_ids" else None
    # The pieces of a marker written as a sequence (Kimi-K3's `think` in `<|open|>think<|sep|>`)
    # are coloured as the marker's special tokens are.
    in_marker = sequence_roles(batch.profile, {i: "marker" for i in batch.profile.sequences}, np.asarray(ids))
    sample.tokens = [
        Token(
            index, ids[index], "", "special" if in_marker is not None and in_marker[index] else "text",
            SEGMENT_PROMPT if segments is None else str(segments[index]),
        )
        for index in range(start, stop)
    ]
    vision = batch.profile.vision
    if name == "input_ids" and vision is not None:
        entries = batch.records["image_data"][at]
        chips = image_chips(np.asarray(ids, dtype=np.int64), vision, entries.to_list() if entries is not None else None,
                            images)
        sample.tokens = [dataclasses.replace(t, text=chips[t.index], kind="image") if t.index in chips else t
                         for t in sample.tokens]
    rule = RULES.get(sample.rule)
    if rule is not None and row["line"] in records.readable:
        sample.explanation = rule().explain(batch, at, position)
    return sample


def _decode(samples: list[Sample], tokenizer: Tokenizer, specials: frozenset[int]) -> None:
    """Decode every window id in one batch call; ids the tokenizer lacks are marked, not decoded."""
    known = tokenizer.known_ids
    ids = sorted({t.id for s in samples for t in s.tokens if t.id in known})
    pieces = dict(zip(ids, token_strings(tokenizer, ids), strict=True)) if ids else {}
    for sample in samples:
        sample.tokens = [
            t if t.kind == "image" else Token(  # an image's chip (`_cut`) is shown as it is
                t.index,
                t.id,
                pieces.get(t.id, ""),
                "unknown" if t.id not in known else "special" if t.id in specials or t.kind == "special" else "text",
                t.segment,
            )
            for t in sample.tokens
        ]


def samples_for_saved_report(
    report: Report, *, tokenizer: Path | None = None, trust_remote_code: bool = False
) -> Samples:
    """Samples for a report read back from JSON: only if its data file and tokenizer are unchanged.

    The tokenizer is `tokenizer` when given, else the directory the report records. A report is
    data: its recorded directory is never loaded with remote code, whatever `trust_remote_code`.
    """
    from audit.model.tokens.tokenizer_loading import load_tokenizer

    if _choose(report.log, 1).is_empty():
        return Samples()
    recorded = report.tokenizer
    try:
        directory = tokenizer if tokenizer is not None else recorded["path"]
        loaded = load_tokenizer(directory, trust_remote_code=trust_remote_code and tokenizer is not None)
    except (ConfigError, KeyError, TypeError) as exc:
        return Samples(unavailable=f"samples omitted: {exc}")
    if recorded.get("sha256") and loaded.fingerprint.sha256 != recorded["sha256"]:
        return Samples(unavailable=f"samples omitted: the tokenizer in {directory} differs from the audit's")
    return collect_samples(report, loaded, verify_sha256=True)

"""The engine: stream a file through the rules and collect findings with their line numbers.

Rules only say which rows break them; the engine numbers lines, attaches ids and
severities, runs file-level rules at the end, and counts. Memory holds one block of records
at a time plus the (line, id) pairs the duplicate check needs and one small stats row per
record; the findings go to disk block by block (`audit.findings`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from audit.batch import AuditContext, Batch
from audit.findings import FINDINGS_SCHEMA, FindingsLog, FindingsPart, spill_part
from audit.records import (
    DEFAULT_BLOCK_BYTES,
    InputDigest,
    UnreadableLine,
    iter_line_blocks,
    parse_block,
)
from audit.ruleset import RuleSet
from audit.segments import record_summary

# One row per readable record: the shape of the data, for summaries and plots.
STATS_SCHEMA: dict[str, pl.DataType] = {
    "line": pl.UInt32(),
    "prompt_tokens": pl.UInt32(),
    "output_tokens": pl.UInt32(),
    "response_at": pl.Int64(),  # index of the response token (</think>) in output_ids, or null
    "finish_type": pl.String(),
    "tool_calls": pl.UInt32(),
}

# Called after each block with (records so far, output tokens so far, bytes read so far).
ProgressCallback = Callable[[int, int, int], None]


@dataclass
class FileAudit:
    """What one pass over one file found."""

    path: Path
    sha256: str
    bytes: int
    lines: int  # physical lines, blank ones included
    records: int  # non-blank lines, readable or not: the denominator of every rate
    output_tokens: int
    log: FindingsLog  # every finding, in line order then rule, mostly on disk
    seconds: float
    stats: pl.DataFrame  # STATS_SCHEMA, one row per readable record

    @property
    def findings(self) -> pl.DataFrame:
        """Every finding in one frame (FINDINGS_SCHEMA, by line then rule); memory grows with them."""
        return self.log.collect()

    @findings.setter
    def findings(self, frame: pl.DataFrame) -> None:
        self.log = FindingsLog.from_frame(frame)


@dataclass
class ShardAudit:
    """What one pass over a byte range of a file found: everything but the file-level rules."""

    lines: int  # the last physical line number seen (0 when the range is empty)
    records: int
    output_tokens: int
    parts: list[FindingsPart]  # one per block with findings, each sorted by line then rule
    identities: pl.DataFrame  # `line`, `id` of every readable record, for file-level rules
    stats: pl.DataFrame  # STATS_SCHEMA


def audit_file(
    path: Path,
    context: AuditContext,
    rule_set: RuleSet,
    *,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    progress: ProgressCallback | None = None,
) -> FileAudit:
    """Run every rule of `rule_set` over `path` and return the findings."""
    started = time.perf_counter()
    digest = InputDigest()
    spill = FindingsLog.spill_directory()
    try:
        shard = audit_shard(
            path, context, rule_set, digest=digest, block_bytes=block_bytes, progress=progress, spill=spill
        )
    except BaseException:
        shutil.rmtree(spill, ignore_errors=True)
        raise
    return finish_file(path, digest.sha256, digest.bytes, [shard], rule_set, started, spill=spill)


def audit_shard(
    path: Path,
    context: AuditContext,
    rule_set: RuleSet,
    *,
    start: int = 0,
    end: int | None = None,
    first_line: int = 1,
    digest: InputDigest | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    progress: ProgressCallback | None = None,
    spill: Path | None = None,
) -> ShardAudit:
    """Run the record-level rules over the lines in bytes [start, end) of `path`.

    `first_line` is the physical line number at `start`, so findings carry file line numbers
    whichever process audits the shard. Each block's findings are written to `spill` (a
    directory) as one part; with no directory they stay in memory.
    """
    if digest is None:
        digest = InputDigest()
    record_rules = [c for c in rule_set.rules if not c.rule.file_level]
    keep_source = any(c.rule.reads_source for c in record_rules)
    parts: list[FindingsPart] = []
    identities: list[pl.DataFrame] = []
    stats: list[pl.DataFrame] = []
    lines = records = output_tokens = 0

    for block in iter_line_blocks(path, digest, block_bytes, start=start, end=end, first_line=first_line):
        parsed = parse_block(block, keep_source=keep_source)
        lines = block.first_line + len(block.lines) - 1
        records += parsed.records.height + len(parsed.unreadable)
        found_here = [_unreadable_findings(parsed.unreadable, rule_set)]
        batch = Batch(parsed.records, context)
        for configured in record_rules:
            found = configured.rule.check(batch)
            if found.height:
                found_here.append(
                    _locate(found, batch, configured.code, configured.severity.value, configured.rule.position_field)
                )
        block_findings = pl.concat(found_here, how="vertical").sort("line", "rule", maintain_order=True)
        if block_findings.height:
            parts.append(spill_part(block_findings, lines, spill))
        del found_here, block_findings
        identities.append(parsed.records.select("line", "id"))
        stats.append(record_stats(batch))
        output_tokens += int(parsed.records["output_ids"].list.len().sum() or 0)
        del batch, parsed  # free the block before the next one is read: memory stays flat
        if progress is not None:
            progress(records, output_tokens, digest.bytes)

    return ShardAudit(
        lines=lines,
        records=records,
        output_tokens=output_tokens,
        parts=parts,
        identities=pl.concat([pl.DataFrame(schema=IDENTITY_SCHEMA), *identities], how="vertical"),
        stats=pl.concat([pl.DataFrame(schema=STATS_SCHEMA), *stats], how="vertical"),
    )


IDENTITY_SCHEMA: dict[str, pl.DataType] = {"line": pl.UInt32(), "id": pl.String()}


def finish_file(
    path: Path,
    sha256: str,
    size: int,
    shards: list[ShardAudit],
    rule_set: RuleSet,
    started: float,
    *,
    spill: Path | None = None,
) -> FileAudit:
    """Join the shards of a file (in file order) and run the file-level rules.

    `spill` is the directory the shards wrote their parts to: the log owns it from here on.
    """
    file_level: list[pl.DataFrame] = []
    file_rules = [c for c in rule_set.rules if c.rule.file_level]
    if file_rules:
        everyone = pl.concat([s.identities for s in shards], how="vertical")
        for configured in file_rules:
            found = configured.rule.check_file(everyone)
            file_level.append(
                found.join(everyone, on="line", how="left").select(
                    pl.col("line").cast(pl.UInt32),
                    "id",
                    pl.lit(configured.code).alias("rule"),
                    pl.lit(configured.severity.value).alias("severity"),
                    pl.col("position").cast(pl.Int64),
                    pl.lit(configured.rule.position_field).alias("field"),
                    pl.col("message").cast(pl.String),
                )
            )

    log = FindingsLog(
        [part for shard in shards for part in shard.parts],
        pl.concat([pl.DataFrame(schema=FINDINGS_SCHEMA), *file_level], how="vertical"),
        directory=spill,
    )
    return FileAudit(
        path=path,
        sha256=sha256,
        bytes=size,
        lines=max((s.lines for s in shards), default=0),
        records=sum(s.records for s in shards),
        output_tokens=sum(s.output_tokens for s in shards),
        log=log,
        seconds=time.perf_counter() - started,
        stats=pl.concat([pl.DataFrame(schema=STATS_SCHEMA), *(s.stats for s in shards)], how="vertical"),
    )


def record_stats(batch: Batch) -> pl.DataFrame:
    """Lengths, where the response token falls, finish reason and tool calls of each record."""
    summary = record_summary(batch)
    return batch.records.select(
        pl.col("line"),
        pl.col("input_ids").list.len().fill_null(0).cast(pl.UInt32).alias("prompt_tokens"),
        pl.col("output_ids").list.len().fill_null(0).cast(pl.UInt32).alias("output_tokens"),
        summary["response_at"].cast(pl.Int64).alias("response_at"),
        pl.col("finish_type"),
        summary["tool_calls"].cast(pl.UInt32).alias("tool_calls"),
    )


def _locate(found: pl.DataFrame, batch: Batch, code: str, severity: str, field: str) -> pl.DataFrame:
    """Attach line numbers and ids to a rule's row-indexed findings."""
    located = batch.records.select(pl.col("line", "id").gather(found["row"]))
    return pl.DataFrame(
        {
            "line": located["line"],
            "id": located["id"],
            "rule": pl.Series([code] * found.height, dtype=pl.String),
            "severity": pl.Series([severity] * found.height, dtype=pl.String),
            "position": found["position"],
            "field": pl.Series([field] * found.height, dtype=pl.String),
            "message": found["message"],
        },
        schema=FINDINGS_SCHEMA,
    )


def _unreadable_findings(unreadable: list[UnreadableLine], rule_set: RuleSet) -> pl.DataFrame:
    """Lines the reader could not turn into records, as INT001 (not JSON) or INT002 findings."""
    rows = []
    for item in unreadable:
        if item.rule in rule_set:
            rows.append(
                (item.line, None, item.rule, rule_set[item.rule].severity.value, item.position, item.field, item.reason)
            )
    return pl.DataFrame(rows, schema=FINDINGS_SCHEMA, orient="row")

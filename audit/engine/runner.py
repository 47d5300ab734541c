"""The engine: run a rule set over blocks of lines, whatever their source, and collect findings.

One entry point does the work of every command that audits (`check`, `gate`, `inspect`,
`watch`, the generator's canary, the `--jobs` workers):

    audit_blocks(blocks, context, rule_set) -> ShardAudit

`blocks` are `audit.records.sources.LineBlock`s, each numbered by the physical line its first line has
in the input, from any source: a file or a byte range of it, the lines appended to a growing
file, lines in memory, a stream of chunks from object storage. The engine never knows which.
Rules only say which rows break them; the engine parses each block, numbers findings by line,
attaches ids and severities, reports the lines the reader rejected under the rule for their
kind of problem, and counts. Memory holds one block of records at a time, plus the (line, id)
pairs the duplicate check needs and one small stats row per record; each block's findings go to
disk as it is done (`audit.engine.findings`) when a spill directory is given.

Inputs audited in pieces (shards of a file in worker processes, later tasks on a cluster) are
joined in input order by `join_shards`, which runs the file-level rules (duplicate ids) over
all of them: a piece is audited alike wherever it runs.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from audit.base.storage import AnyPath
from audit.checks.ruleset import ConfiguredRule, RuleSet
from audit.engine.findings import FINDINGS_SCHEMA, FindingsLog, FindingsPart, spill_part
from audit.engine.isolation import INTERNAL_ERROR, InternalError, isolated
from audit.records.batch import AuditContext, Batch
from audit.records.line_reading import RejectedLine
from audit.records.reader import parse_block
from audit.records.segments import record_summary
from audit.records.sources import DEFAULT_BLOCK_BYTES, InputDigest, LineBlock, file_blocks

# One row per readable record: the shape of the data, for summaries and plots.
STATS_SCHEMA: dict[str, pl.DataType] = {
    "line": pl.UInt32(),
    "prompt_tokens": pl.UInt32(),
    "output_tokens": pl.UInt32(),
    "response_at": pl.Int64(),  # index of the response token (</think>) in output_ids, or null
    "finish_type": pl.String(),
    "tool_calls": pl.UInt32(),
    "thinking": pl.Boolean(),  # the output reasons (thinking on), or not; null where it cannot show
}

IDENTITY_SCHEMA: dict[str, pl.DataType] = {"line": pl.UInt32(), "id": pl.String()}

# A JSONL line holds about one character of decoded text for every three bytes (ids written as
# numbers, the `text` field): enough to tell an input worth building the fast encoder for.
ENCODED_BYTES_PER_CHARACTER = 3

# Called after each block with (records so far, output tokens so far, input bytes so far).
ProgressCallback = Callable[[int, int, int], None]


@dataclass
class ShardAudit:
    """What the engine found over consecutive blocks of an input: all but the file-level rules.

    Plain data (frames, paths): it crosses process boundaries as it is, for `join_shards`.
    """

    lines: int  # the last physical line number seen (0 when there were no lines)
    records: int  # non-blank lines, readable or not
    output_tokens: int
    bytes: int  # input bytes the blocks stood for
    parts: list[FindingsPart]  # one per block with findings, each sorted by line then rule
    identities: pl.DataFrame  # IDENTITY_SCHEMA: `line`, `id` of every readable record
    stats: pl.DataFrame  # STATS_SCHEMA
    # Records a rule raised on (each also an INTERNAL_ERROR finding), with their tracebacks.
    internal_errors: list[InternalError] = field(default_factory=list)

    def failing_by_rule(self) -> dict[str, int]:
        """Records each rule flagged in these blocks (the file-level rules are not run here)."""
        counts: dict[str, int] = {}
        for part in self.parts:
            for code, failing in (
                part.read().group_by("rule").agg(pl.col("line").n_unique()).iter_rows()
            ):
                counts[code] = counts.get(code, 0) + failing
        return counts


@dataclass
class FileAudit:
    """What a whole input gave: every finding, the counts, and the input's identity."""

    path: AnyPath
    sha256: str
    bytes: int
    lines: int  # physical lines, blank ones included
    records: int  # non-blank lines, readable or not: the denominator of every rate
    output_tokens: int
    log: FindingsLog  # every finding, in line order then rule, mostly on disk
    seconds: float
    stats: pl.DataFrame  # STATS_SCHEMA, one row per readable record
    cached: bool = False  # the stored result of an identical earlier audit (audit.flows.cache)
    internal_errors: list[InternalError] = field(default_factory=list)  # see audit.engine.isolation

    @property
    def findings(self) -> pl.DataFrame:
        """Every finding in one frame (FINDINGS_SCHEMA, by line then rule); memory grows with
        them."""
        return self.log.collect()


def audit_blocks(
    blocks: Iterable[LineBlock],
    context: AuditContext,
    rule_set: RuleSet,
    *,
    spill: Path | None = None,
    progress: ProgressCallback | None = None,
    expected_bytes: int | None = None,
) -> ShardAudit:
    """Run the record-level rules of `rule_set` over `blocks`, in order; see the module docstring.

    Findings carry each block's own line numbers. Each block's findings become one part, written
    to the directory `spill` (kept in memory without one, or when small). `expected_bytes`, when
    the source knows it (a file, a byte range), is how much input the blocks will hold: the
    tokenizer then prepares for the text there is to encode (`Tokenizer.expect_encoding`).
    """
    record_rules = [c for c in rule_set.rules if not (c.rule.file_level or c.rule.partition_level)]
    keep_source = any(c.rule.reads_source for c in record_rules)
    if expected_bytes is not None and any(c.rule.encodes_text for c in record_rules):
        context.tokenizer.expect_encoding(expected_bytes // ENCODED_BYTES_PER_CHARACTER)
    parts: list[FindingsPart] = []
    identities: list[pl.DataFrame] = []
    stats: list[pl.DataFrame] = []
    internal_errors: list[InternalError] = []
    lines = records = output_tokens = read = 0

    for block in blocks:
        lines = block.last_line
        read += block.nbytes
        parsed = parse_block(block, keep_source=keep_source, consume=True)  # (lets each line go once read)
        del block
        records += parsed.records.height + len(parsed.rejected) + len(parsed.raised)
        found_here = [_rejected_findings(parsed.rejected, rule_set)]
        batch = Batch(parsed.records, context, parsed.source_prompts)
        # Lines the reading raised on (a bug): internal errors of the reader's, as a rule's are.
        raised = [InternalError(line, None, "reader", error, trace) for line, error, trace in parsed.raised]
        for configured in record_rules:
            # A rule that raises costs the records it raises on, not the block (audit.engine.isolation).
            done, failed = isolated(configured.rule.check, batch)
            for start, found in done:
                if found.height:
                    found = found.with_columns(pl.col("row") + start) if start else found
                    found_here.append(_locate(found, batch, configured))
            raised += _internal_errors(batch, configured.code, failed)
        done_stats, failed = isolated(record_stats, batch)
        raised += _internal_errors(batch, "statistics", failed)
        stats.append(_joined_stats(batch, done_stats, failed))
        if raised:
            found_here.append(_internal_findings(raised))
            internal_errors += raised
        found_here = [found for found in found_here if found.height]
        if found_here:  # (most blocks find nothing: no frame joined or sorted)
            block_findings = pl.concat(found_here, how="vertical").sort("line", "rule", maintain_order=True)
            parts.append(spill_part(block_findings, lines, spill))
            del block_findings
        del found_here
        identities.append(parsed.records.select("line", "id"))
        output_tokens += int(batch.output_flat.lengths.sum())
        del batch, parsed  # free the block before the next one is read: memory stays flat
        if progress is not None:
            progress(records, output_tokens, read)

    return ShardAudit(
        lines=lines,
        records=records,
        output_tokens=output_tokens,
        bytes=read,
        parts=parts,
        identities=pl.concat([pl.DataFrame(schema=IDENTITY_SCHEMA), *identities], how="vertical"),
        stats=pl.concat([pl.DataFrame(schema=STATS_SCHEMA), *stats], how="vertical"),
        internal_errors=internal_errors,
    )


def file_level_findings(identities: pl.DataFrame, rule_set: RuleSet) -> pl.DataFrame:
    """The findings of the file-level rules (duplicate ids) over an input's (line, id) pairs."""
    found: list[pl.DataFrame] = [pl.DataFrame(schema=FINDINGS_SCHEMA)]
    for configured in rule_set.rules:
        if not configured.rule.file_level:
            continue
        flagged = configured.rule.check_file(identities)
        if not flagged.height:
            continue  # (a join with the whole file's ids for nothing: ~30 MB at a million records)
        found.append(
            flagged.join(identities, on="line", how="left").select(
                pl.col("line").cast(pl.UInt32),
                "id",
                pl.lit(configured.code).alias("rule"),
                pl.lit(configured.severity.value).alias("severity"),
                pl.col("position").cast(pl.Int64),
                pl.lit(configured.rule.position_field).alias("field"),
                pl.col("message").cast(pl.String),
            )
        )
    return pl.concat(found, how="vertical")


def join_shards(
    shards: Sequence[ShardAudit],
    rule_set: RuleSet,
    *,
    path: AnyPath,
    sha256: str,
    size: int,
    started: float,
    spill: Path | None = None,
) -> FileAudit:
    """Join the audits of an input's pieces (in input order) and run the file-level rules.

    `path`, `sha256` and `size` name the whole input; `started` is when its audit began
    (`time.perf_counter()`). `spill` is the directory the shards wrote their parts to: the log
    owns it from here on.
    """
    file_level = pl.DataFrame(schema=FINDINGS_SCHEMA)
    if any(c.rule.file_level for c in rule_set.rules):
        everyone = pl.concat([s.identities for s in shards], how="vertical")
        file_level = file_level_findings(everyone, rule_set)
    log = FindingsLog(
        [part for shard in shards for part in shard.parts], file_level, directory=spill
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
        stats=pl.concat(
            [pl.DataFrame(schema=STATS_SCHEMA), *(s.stats for s in shards)], how="vertical"
        ),
        internal_errors=[error for shard in shards for error in shard.internal_errors],
    )


def audit_input(
    blocks: Iterable[LineBlock],
    digest: InputDigest,
    context: AuditContext,
    rule_set: RuleSet,
    *,
    path: AnyPath,
    progress: ProgressCallback | None = None,
    expected_bytes: int | None = None,
) -> FileAudit:
    """A whole input in this process: its blocks audited, findings spilled to disk, joined.

    `digest` is the one the source updates as it reads (its sha256 and size name the input);
    `expected_bytes` its size when known (see `audit_blocks`).
    """
    started = time.perf_counter()
    spill = FindingsLog.spill_directory()
    try:
        shard = audit_blocks(
            blocks, context, rule_set, spill=spill, progress=progress, expected_bytes=expected_bytes
        )
    except BaseException:
        shutil.rmtree(spill, ignore_errors=True)
        raise
    return join_shards(
        [shard],
        rule_set,
        path=path,
        sha256=digest.sha256,
        size=digest.bytes,
        started=started,
        spill=spill,
    )


def audit_file(
    path: AnyPath,
    context: AuditContext,
    rule_set: RuleSet,
    *,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    progress: ProgressCallback | None = None,
) -> FileAudit:
    """Run every rule of `rule_set` over the file `path`, in this process."""
    digest = InputDigest()
    blocks = file_blocks(path, digest=digest, block_bytes=block_bytes)
    return audit_input(
        blocks, digest, context, rule_set, path=path, progress=progress, expected_bytes=_size(path)
    )


def _size(path: AnyPath) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None  # the source says why it cannot read the file


def record_stats(batch: Batch) -> pl.DataFrame:
    """Lengths, where the response token falls, finish reason, tool calls and thinking mode of
    each record."""
    summary = record_summary(batch)
    return batch.records.select(
        pl.col("line"),
        pl.col("input_ids").list.len().fill_null(0).cast(pl.UInt32).alias("prompt_tokens"),
        pl.col("output_ids").list.len().fill_null(0).cast(pl.UInt32).alias("output_tokens"),
        summary["response_at"].cast(pl.Int64).alias("response_at"),
        pl.col("finish_type"),
        summary["tool_calls"].cast(pl.UInt32).alias("tool_calls"),
        summary["thinking"].alias("thinking"),
    )


def _locate(found: pl.DataFrame, batch: Batch, configured: ConfiguredRule) -> pl.DataFrame:
    """A rule's row-indexed findings as findings: line, id, code, severity, field attached."""
    located = batch.records.select(pl.col("line", "id").gather(found["row"]))
    return located.select(
        pl.col("line"),
        pl.col("id"),
        pl.lit(configured.code, dtype=pl.String).alias("rule"),
        pl.lit(configured.severity.value, dtype=pl.String).alias("severity"),
        pl.lit(found["position"]).alias("position"),
        pl.lit(configured.rule.position_field, dtype=pl.String).alias("field"),
        pl.lit(found["message"]).alias("message"),
    ).cast(pl.Schema(FINDINGS_SCHEMA))


# Frames are never changed in place: every block with no rejected line shares this one.
_NO_REJECTED = pl.DataFrame(schema=FINDINGS_SCHEMA)


def _rejected_findings(rejected: list[RejectedLine], rule_set: RuleSet) -> pl.DataFrame:
    """Lines the reader did not turn into records, each under the rule that reports its problem."""
    if not rejected:
        return _NO_REJECTED
    reporters = {c.rule.problem: c for c in rule_set.rules if c.rule.problem is not None}
    rows = []
    for item in rejected:
        configured = reporters.get(item.problem)
        if configured is not None:
            rows.append(
                (
                    item.line,
                    item.id,
                    configured.code,
                    configured.severity.value,
                    item.position,
                    item.field,
                    item.reason,
                )
            )
    return pl.DataFrame(rows, schema=FINDINGS_SCHEMA, orient="row")


def _internal_errors(batch: Batch, rule: str, failed: list[tuple[int, str, str]]) -> list[InternalError]:
    """The records `rule` raised on, by line and id."""
    if not failed:
        return []
    located = batch.records.select(pl.col("line", "id").gather([row for row, _, _ in failed]))
    return [
        InternalError(int(line), sample_id, rule, error, trace)
        for (line, sample_id), (_, error, trace) in zip(located.iter_rows(), failed, strict=True)
    ]


def _internal_findings(raised: list[InternalError]) -> pl.DataFrame:
    """One INTERNAL_ERROR finding per record and rule that raised."""
    rows = [(e.line, e.id, INTERNAL_ERROR, "error", None, None, e.message) for e in raised]
    return pl.DataFrame(rows, schema=FINDINGS_SCHEMA, orient="row")


def _joined_stats(batch: Batch, done: list[tuple[int, pl.DataFrame]], failed: list[tuple[int, str, str]]) -> pl.DataFrame:
    """The statistics of a block whose records the statistics raised on: what was computed, and
    for those records the lengths and finish reason alone."""
    if not failed:
        return done[0][1]
    rows = [row for row, _, _ in failed]
    bare = batch.records[rows].select(
        pl.col("line"),
        pl.col("input_ids").list.len().fill_null(0).cast(pl.UInt32).alias("prompt_tokens"),
        pl.col("output_ids").list.len().fill_null(0).cast(pl.UInt32).alias("output_tokens"),
        pl.lit(None, dtype=pl.Int64).alias("response_at"),
        pl.col("finish_type"),
        pl.lit(0, dtype=pl.UInt32).alias("tool_calls"),
        pl.lit(None, dtype=pl.Boolean).alias("thinking"),
    )
    return pl.concat([*(frame for _, frame in done), bare], how="vertical").sort("line")

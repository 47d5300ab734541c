"""Where training samples come from: a partition's clean records, or a finished gate's clean.jsonl.

    source = open_source("B1_glaive", root, CheckOptions(profile="kimi-k2.5"))
    judge(source)                          # a partition: the check, as `audit gate` runs it
    for records in clean_records(source, tally):   # record frames, block by block
        ...

A partition (name, directory or .jsonl file) is checked first; its clean records are exactly
those `audit gate` puts in clean.jsonl: every record without a finding of severity `error`.
A gate output directory (clean.jsonl + manifest.json) is taken as the gate left it: its
clean.jsonl must still hash as its manifest says, and it is read with the tokenizer and profile
the gate judged it with (a different one is a configuration error). Either way each record
keeps the line it has in the source file: a gate's clean records are numbered back through
its quarantine.jsonl (and, when the source had blank lines, the source itself).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl

from audit.base.errors import ConfigError, InputError
from audit.base.storage import ObjectPath, is_url, location
from audit.checks.ruleset import RuleSet
from audit.engine.findings import FindingsLog
from audit.flows.checking import check_session
from audit.flows.gate_outputs import CLEAN_FILE, MANIFEST_FILE, QUARANTINE_FILE
from audit.flows.gating import read_manifest
from audit.flows.session import CheckOptions, Session, prepare
from audit.flows.targets import Target, resolve_target
from audit.generate.manifest import GenerationManifest
from audit.model.families.thinking_modes import MIXED
from audit.records.reader import parse_block
from audit.records.sample_reading import STRICTLY_REFUSED, NotAccepted, read_sample_fields
from audit.records.sources import InputDigest, file_blocks
from audit.report.report import Report

# A record is left out of training on a finding of this severity: the gate's default.
QUARANTINED_ON = ("error",)


@dataclass
class SampleSource:
    """What samples are made from, with the session that reads it (profile, tokenizer)."""

    session: Session
    gate_dir: Path | ObjectPath | None = None  # a gate output, exported as it is
    gate_manifest: dict[str, Any] | None = None
    report: Report | None = None  # a partition's check, once `judge` ran it

    @property
    def is_gate(self) -> bool:
        return self.gate_dir is not None

    @property
    def input_directory(self) -> Path | ObjectPath | None:
        return self.gate_dir if self.gate_dir is not None else self.session.target.directory

    def verdict(self) -> str:
        if self.gate_manifest is not None:
            return str(self.gate_manifest.get("verdict"))
        assert self.report is not None
        return self.report.verdict

    def exit_code(self) -> int:
        """As `audit gate` exits: 0 the gate passed, 1 it failed, 2 a rule raised on a record."""
        if self.report is not None:
            return self.report.exit_code()
        return 1 if self.verdict() == "fail" else 0

    def provenance(self) -> dict[str, Any]:
        """The input, profile and tokenizer the samples come from."""
        session = self.session
        if self.gate_manifest is not None:
            recorded = self.gate_manifest["input"]
            source: dict[str, Any] = {
                "kind": "gate",
                "target": self.gate_manifest.get("target"),
                "path": recorded.get("path"),
                "sha256": recorded.get("sha256"),
                "gate": str(self.gate_dir),
                "clean_sha256": self.gate_manifest["outputs"][CLEAN_FILE]["sha256"],
            }
        else:
            assert self.report is not None
            source = {
                "kind": "partition",
                "target": self.report.target,
                "path": str(session.target.data_file),
                "sha256": self.report.input["sha256"],
            }
        return {
            "source": source,
            "verdict": self.verdict(),
            "profile": {"name": session.profile.name, "thinking": session.profile.thinking},
            "tokenizer": session.tokenizer.fingerprint.to_dict(),
        }


@dataclass
class SourceTally:
    """What reading the clean records met: records the reader could not turn into samples."""

    clean: int = 0  # clean records read (readable or not)
    unreadable: int = 0  # clean by the gate's rule set, yet not a record the reader can read
    unreadable_lines: list[int] = field(default_factory=list)  # the first few


def open_source(target: str, root: Path | ObjectPath, options: CheckOptions) -> SampleSource:
    """A partition (checked later, by `judge`) or a gate output directory; raise on any problem."""
    path = location(target) if is_url(target) or Path(target).is_dir() else None
    if path is not None and (path / MANIFEST_FILE).is_file() and (path / CLEAN_FILE).is_file():
        return _gate_source(path, options)
    return SampleSource(prepare(resolve_target(target, root), options))


def _gate_source(gate_dir: Path | ObjectPath, options: CheckOptions) -> SampleSource:
    try:
        manifest = read_manifest(gate_dir)
    except InputError:
        manifest = None
    if manifest is None:
        raise InputError(f"{gate_dir / MANIFEST_FILE} is not a gate manifest: export the partition itself, or gate it again")
    try:
        profile, tokenizer = manifest["profile"], manifest["tokenizer"]
        clean_sha256 = manifest["outputs"][CLEAN_FILE]["sha256"]
        counts = manifest["counts"]
    except (KeyError, TypeError):
        raise InputError(f"{gate_dir / MANIFEST_FILE} is not a gate manifest (no profile, tokenizer, outputs or counts)") from None
    if manifest.get("quarantine_on") not in (None, "error"):
        raise InputError(
            f"{gate_dir} was gated with quarantine_on {manifest.get('quarantine_on')!r}; export takes the records "
            "a default gate keeps (no error finding): export the partition itself, or gate it again"
        )
    if not isinstance(clean_sha256, str) or not isinstance(counts.get("clean"), int):
        raise InputError(f"{gate_dir / MANIFEST_FILE} is not a gate manifest (its outputs have no sha256 or count)")
    recorded_tokenizer = tokenizer.get("path") if isinstance(tokenizer, dict) else None
    if options.tokenizer is None and isinstance(recorded_tokenizer, str) and Path(recorded_tokenizer).is_dir():
        options = _with(options, tokenizer=Path(recorded_tokenizer))
    if options.profile is None and isinstance(profile, dict) and isinstance(profile.get("name"), str):
        options = _with(options, profile=profile["name"])
    if options.thinking is None and isinstance(profile, dict) and (
        isinstance(profile.get("thinking"), bool) or profile.get("thinking") == MIXED
    ):
        options = _with(options, thinking=profile["thinking"])
    target = Target(
        partition=str(manifest.get("target") or getattr(gate_dir, "name", "gate")),
        data_file=gate_dir / CLEAN_FILE,
        generation=GenerationManifest(),
        directory=gate_dir,
    )
    session = prepare(target, options)
    if isinstance(tokenizer, dict) and tokenizer.get("sha256") not in (None, session.tokenizer.fingerprint.sha256):
        raise ConfigError(
            f"{gate_dir} was gated with tokenizer sha256 {str(tokenizer.get('sha256'))[:12]}…, but "
            f"{session.tokenizer.fingerprint.path} hashes to {session.tokenizer.fingerprint.sha256[:12]}…: "
            "export with the tokenizer the gate judged the records with"
        )
    if isinstance(profile, dict) and profile.get("name") not in (None, session.profile.name):
        raise ConfigError(
            f"{gate_dir} was gated with profile {profile.get('name')!r}, not {session.profile.name!r}: "
            "export with the profile the gate judged the records with"
        )
    return SampleSource(session, gate_dir=gate_dir, gate_manifest=manifest)


def _with(options: CheckOptions, **changes: Any) -> CheckOptions:
    from dataclasses import replace

    return replace(options, **changes)


def judge(source: SampleSource) -> None:
    """A partition's check (from the result cache when nothing changed); a gate is judged already."""
    if not source.is_gate and source.report is None:
        source.report = check_session(source.session)


def clean_records(source: SampleSource, tally: SourceTally, *, whole: bool = False) -> Iterator[pl.DataFrame]:
    """The clean records, block by block, as record frames whose `line` is the source line;
    `whole`: every column of the strict reading, the source prompt too (the image rows need
    their messages and images), else the sample fields may be all that is read.

    Raises InputError at the end when what was read is not what was judged (the partition
    changed since its check, the gate's clean.jsonl since its manifest): nothing read may then
    be published.
    """
    if source.gate_dir is not None:
        yield from _gate_records(source, tally, whole)
    else:
        yield from _partition_records(source, tally, whole)


def _partition_records(source: SampleSource, tally: SourceTally, whole: bool) -> Iterator[pl.DataFrame]:
    assert source.report is not None
    data_file = source.session.target.data_file
    quarantined = quarantined_lines(source.report.log)
    digest = InputDigest()
    fast = not whole and refuses_strictly(source.session.rule_set)
    for block in file_blocks(data_file, digest=digest, block_bytes=source.session.options.block_bytes):
        here = quarantined[np.searchsorted(quarantined, block.first_line) : np.searchsorted(quarantined, block.last_line, side="right")]
        held = set(here.tolist())
        if fast:
            try:
                records = read_sample_fields(block, held)
            except NotAccepted:
                pass
            else:
                _count(tally, records.height, [])
                yield records
                continue
        parsed = parse_block(block, keep_source=whole)
        rejected = [item.line for item in parsed.rejected if item.line not in held]
        keep = ~np.isin(parsed.records["line"].to_numpy(), here)
        _count(tally, int(keep.sum()), rejected)
        yield parsed.records.filter(pl.Series(keep))
    if digest.sha256 != source.report.input["sha256"]:
        raise InputError(
            f"{data_file} changed while it was being exported (is it still being written?); nothing "
            "was written: export it again once it is complete"
        )


def refuses_strictly(rule_set: RuleSet) -> bool:
    """Does the rule set quarantine every line the strict reader refuses? Then every line a
    gate keeps was read strictly and accepted, and a second reading may take only the sample
    fields (`audit.records.sample_reading`)."""
    severities = {c.rule.problem: c.severity.value for c in rule_set.rules if c.rule.problem is not None}
    return all(severities.get(problem) in QUARANTINED_ON for problem in STRICTLY_REFUSED)


def quarantined_lines(log: FindingsLog) -> np.ndarray:
    """The lines a default gate quarantines (a finding of severity error), sorted, unique."""
    found = [
        batch.filter(pl.col("severity").is_in(QUARANTINED_ON))["line"].unique().to_numpy().astype(np.int64)
        for batch in log.batches()
    ]
    return np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)


def _count(tally: SourceTally, readable: int, rejected: list[int]) -> None:
    tally.clean += readable + len(rejected)
    tally.unreadable += len(rejected)
    tally.unreadable_lines.extend(rejected[: max(0, 5 - len(tally.unreadable_lines))])


def _gate_records(source: SampleSource, tally: SourceTally, whole: bool) -> Iterator[pl.DataFrame]:
    """clean.jsonl's records, each numbered by its line in the gated file."""
    gate_dir, manifest = source.gate_dir, source.gate_manifest
    assert gate_dir is not None and manifest is not None
    # The clean record k (1-based) is the k-th line of the source that is neither quarantined
    # nor blank: with c_i = e_i - 1 - i over the sorted excluded lines e, it is k + #(c_i < k).
    excluded = np.union1d(_quarantine_lines(gate_dir), _blank_lines(manifest))
    before = excluded - 1 - np.arange(len(excluded))
    digest = InputDigest()
    clean_file = gate_dir / CLEAN_FILE
    for block in file_blocks(clean_file, digest=digest, block_bytes=source.session.options.block_bytes):
        parsed = parse_block(block, keep_source=whole)
        order = parsed.records["line"].to_numpy().astype(np.int64)
        lines = order + np.searchsorted(before, order, side="left")
        _count(tally, parsed.records.height, [int(k + np.searchsorted(before, k)) for k in (r.line for r in parsed.rejected)])
        yield parsed.records.with_columns(pl.Series("line", lines, dtype=pl.UInt32))
    if digest.sha256 != manifest["outputs"][CLEAN_FILE]["sha256"]:
        raise InputError(
            f"{clean_file} does not hash as {gate_dir / MANIFEST_FILE} says (changed since the gate wrote it); "
            "nothing was written: gate the partition again"
        )
    if tally.clean != manifest["counts"]["clean"]:
        raise InputError(f"{clean_file} holds {tally.clean} records, its manifest {manifest['counts']['clean']}: gate the partition again")


def _quarantine_lines(gate_dir: Path | ObjectPath) -> np.ndarray:
    path = gate_dir / QUARANTINE_FILE
    if not path.is_file():
        raise InputError(f"{gate_dir}: no {QUARANTINE_FILE} beside {CLEAN_FILE}; not a whole gate output")
    lines = []
    with path.open("rb") as handle:
        for raw in handle:
            try:
                line = orjson.loads(raw).get("line")
            except (orjson.JSONDecodeError, AttributeError):
                line = None
            if not isinstance(line, int) or isinstance(line, bool) or line < 1:
                raise InputError(f"{path}: an entry without a line number; not a gate's quarantine")
            lines.append(line)
    return np.unique(np.array(lines, dtype=np.int64))


def _blank_lines(manifest: dict[str, Any]) -> np.ndarray:
    """The source's blank lines, when it had any: read from the source, if it is still the one gated."""
    recorded = manifest["input"]
    if not recorded.get("blank_lines"):
        return np.zeros(0, dtype=np.int64)
    source = location(str(recorded.get("path")))
    digest = InputDigest()
    blank: list[int] = []
    try:
        for block in file_blocks(source, digest=digest):
            blank.extend(block.blank_lines())
    except InputError:
        digest = InputDigest()
    if digest.sha256 != recorded.get("sha256"):
        raise InputError(
            f"the gated file {source} had blank lines and is gone or changed since the gate: its records' "
            "line numbers cannot be recovered; export the partition itself"
        )
    return np.array(blank, dtype=np.int64)

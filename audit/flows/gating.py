"""The gate: split a partition into the records training may use and the ones it must not.

    result = gate_session(prepare(target, CheckOptions()), Path("gated/B1_glaive"))

(`audit.gate(target, out)` from the Python API, `audit gate` from the command line)

writes three files into the output directory:

    clean.jsonl       every record that passed, its original bytes, in input order, each
                      followed by "\\n" (a last line that had no newline gets one; a "\\r"
                      before the newline is part of the record's bytes and is kept)
    quarantine.jsonl  one JSON object per rejected record, in input order:
                      {"line", "id", "findings": [{rule, severity, message, position, field}],
                       "raw": the line as text}  -- or, when its bytes are not UTF-8,
                      "raw_base64" instead of "raw". Either way the original line is
                      `raw.encode("utf-8")` (or `b64decode(raw_base64)`) without its "\\n".
                      A line over `MAX_LINE_BYTES` was never read, so it is not copied:
                      "raw_omitted": {"offset", "bytes"} says where it is in the input.
    manifest.json     what was gated, with what, and the sha256 of everything (written last)

A record is a non-blank line, readable or not (the denominator of every rate in the report;
`audit.records.sources.LineBlock.record_lines`, as the engine reads them). Blank lines are not records: they go to neither output and are counted in the manifest as
`blank_lines`. So `clean + quarantined == records`, always.

A record is quarantined when it has a finding of severity `error` (or any finding with
`quarantine_on="warning"`); all its findings travel with it, warnings included.

The split is a second streamed pass over the file, one block of lines at a time; memory holds
the findings and one block, never the file. If the file changes between the audit and the
split, nothing is written.

Each output is written to a temporary file in the output directory, fsync'd, and renamed into
place; the old manifest is removed before the first rename and the new one renamed in last
(the directory synced between the steps), so a directory with a manifest always holds the
outputs that manifest describes (check its hashes), even after a power cut. One gate at a time
writes an output directory: a run holds `<out>/.audit.lock` from start to end, and a second
one refuses at once. Temporaries a killed gate left behind are removed by the next one.

`out_dir` may be a prefix in object storage (`s3://bucket/gated/B1`, `audit.base.storage`). The same
order holds there, with the store's own atomic step in place of the rename: each output is a
multipart upload that becomes visible only when it is completed, so the uploads run during the
split, the old manifest is deleted, the two outputs are completed, and the manifest is written
last. A run that dies before that leaves the old gate as it was (its unfinished uploads are
aborted by the next run); one that dies in between leaves outputs without a manifest, which is
not a finished gate and which the next run writes again. The lock is `<out>/.audit.lock`
created by a conditional write (see `audit.base.object_locks.lock_prefix` for what it can and cannot do).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import orjson
import polars as pl

from audit import __version__
from audit.base.errors import InputError
from audit.base.storage import ObjectPath, location
from audit.engine.findings import FindingsLog
from audit.engine.runner import ProgressCallback
from audit.flows.checking import check_session
from audit.flows.gate_outputs import (
    CLEAN_FILE,
    MANIFEST_FILE,
    OUTPUT_FILES,
    QUARANTINE_FILE,
    DirectoryOutputs,
    PrefixOutputs,
    Staged,
)
from audit.flows.output_paths import (
    refuse_destructive_outputs,
    removed_if_left_empty,
    require_readable,
)
from audit.flows.session import Session
from audit.records.sources import InputDigest, LongLine, file_blocks, file_chunks
from audit.report.report import Report

MANIFEST_SCHEMA_VERSION = 1

QUARANTINE_SEVERITIES = {"error": ("error",), "warning": ("error", "warning")}

# Fields of a finding that travel with a quarantined record (line and id are on the record).
_FINDING_FIELDS = ("rule", "severity", "message", "position", "field")


@dataclass
class GateResult:
    """A gated target: the report of its audit, the manifest written, and where."""

    report: Report
    manifest: dict[str, Any]
    out_dir: Path | ObjectPath
    unchanged: bool = False  # the output already held this exact gate: no byte changed

    @property
    def clean(self) -> int:
        return int(self.manifest["counts"]["clean"])

    @property
    def quarantined(self) -> int:
        return int(self.manifest["counts"]["quarantined"])


def gate_session(
    session: Session,
    out_dir: Path | ObjectPath | str | os.PathLike[str],
    *,
    quarantine_on: str = "error",
    force: bool = False,
    progress: ProgressCallback | None = None,
) -> GateResult:
    """Audit the session's target and split its records into clean.jsonl and quarantine.jsonl.

    `out_dir` is a directory, or a prefix in object storage (a URL). Raises InputError (nothing
    written) when `out_dir` holds the gate of a different input and `force` is false, when an
    output would overwrite the input or a file of its partition, when the input cannot be read
    (no `out_dir` is created then), or when the input changes while it is being gated.
    """
    if quarantine_on not in QUARANTINE_SEVERITIES:
        raise InputError(f"--quarantine-on must be error or warning, got {quarantine_on!r}")
    out_dir = location(out_dir)
    data_file = session.target.data_file
    input_path = data_file.resolve()
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"--out {out_dir}: exists and is not a directory")
    refuse_destructive_outputs(session.target, directories=[("the gate output", out_dir, OUTPUT_FILES)])
    require_readable(data_file)  # before --out is made: an unreadable input leaves nothing behind
    outputs = PrefixOutputs(out_dir) if isinstance(out_dir, ObjectPath) else DirectoryOutputs(out_dir)
    # One gate at a time per output: two runs into one --out would leave a manifest of one
    # input beside the clean.jsonl of the other.
    with removed_if_left_empty(out_dir), outputs.lock():
        outputs.remove_leftovers()  # what a killed gate left: up to the input's size
        previous = read_manifest(out_dir)
        if not force:
            _refuse_foreign_output(out_dir, previous, input_path, redo_unfinished=outputs.redo_unfinished)
        report = check_session(session, progress=progress)
        manifest, unchanged = _write_split(session, report, outputs, input_path, quarantine_on, previous)
    return GateResult(report=report, manifest=manifest, out_dir=out_dir, unchanged=unchanged)


def _write_split(
    session: Session,
    report: Report,
    outputs: DirectoryOutputs | PrefixOutputs,
    input_path: Path | ObjectPath,
    quarantine_on: str,
    previous: dict[str, Any] | None,
) -> tuple[dict[str, Any], bool]:
    """Write clean.jsonl, quarantine.jsonl and manifest.json: durably, the manifest last."""
    data_file = session.target.data_file
    severities = QUARANTINE_SEVERITIES[quarantine_on]

    staged: list[Staged] = []
    try:
        clean = outputs.stage(CLEAN_FILE, staged)
        quarantine = outputs.stage(QUARANTINE_FILE, staged)
        counts, digest = _split(
            data_file,
            _quarantined(report.log, severities),
            clean,
            quarantine,
            session.options.block_bytes,
        )
        if digest.sha256 != report.input["sha256"]:
            raise InputError(
                f"{data_file} changed while it was being gated (is it still being written?); "
                "nothing was written: gate it again once it is complete"
            )
        manifest = _manifest(
            session, report, input_path, counts, quarantine_on,
            clean=clean.summary(counts["clean"]),
            quarantine=quarantine.summary(counts["quarantined"]),
        )
        unchanged = previous is not None and _same_gate(previous, manifest)
        if unchanged and previous is not None:
            # Idempotent: the same gate again leaves every byte as it was, the time included.
            manifest["created_at"] = previous["created_at"]
        outputs.publish(staged, json.dumps(manifest, ensure_ascii=False, indent=1).encode() + b"\n")
        staged.clear()
    finally:
        for leftover in staged:
            leftover.discard()
    return manifest, unchanged


def read_manifest(out_dir: Path | ObjectPath) -> dict[str, Any] | None:
    """The manifest of an earlier gate in `out_dir`, or None when there is none."""
    path = out_dir / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InputError(
            f"{path} is not a gate manifest (not valid JSON): pass --force to overwrite the gate output"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("input"), dict):
        raise InputError(f"{path} is not a gate manifest: pass --force to overwrite the gate output")
    return data


def _refuse_foreign_output(
    out_dir: Path | ObjectPath,
    previous: dict[str, Any] | None,
    input_path: Path | ObjectPath,
    *,
    redo_unfinished: bool = False,
) -> None:
    """An existing gate output of another input is somebody's training data: keep it.

    `redo_unfinished`: outputs without a manifest are an unfinished gate to write again (object
    storage, where the lock says nobody else is writing) rather than someone's files to keep.
    """
    if previous is None:
        present = [name for name in (CLEAN_FILE, QUARANTINE_FILE) if (out_dir / name).exists()]
        if present and not redo_unfinished:
            raise InputError(
                f"--out {out_dir} holds {' and '.join(present)} but no {MANIFEST_FILE} (an interrupted "
                "gate, or not a gate output): pass --force to overwrite, or choose another --out"
            )
        return
    recorded = previous["input"]
    if recorded.get("path") != str(input_path):
        raise InputError(
            f"--out {out_dir} holds the gate of {recorded.get('path')}, not of {input_path}: "
            "pass --force to overwrite it, or choose another --out"
        )
    with input_path.open("rb") as handle:
        sha256 = hashlib.file_digest(handle, "sha256").hexdigest()
    if recorded.get("sha256") != sha256:
        raise InputError(
            f"--out {out_dir} holds the gate of an earlier version of {input_path} "
            f"(sha256 {str(recorded.get('sha256'))[:12]}…, now {sha256[:12]}…): pass --force to "
            "overwrite it, or choose another --out"
        )


def _quarantined(log: FindingsLog, severities: tuple[str, ...]) -> Iterator[tuple[int, bytes]]:
    """(line, quarantine entry without its raw bytes) of each quarantined record, in line order.

    Streamed from the findings log a part at a time; each entry's findings are encoded by polars
    (`struct.json_encode`), so memory holds one part of findings, never a dict per finding.
    """
    for batch in log.batches():
        entries = (
            batch.group_by("line", maintain_order=True)
            .agg(
                pl.col("severity").is_in(severities).any().alias("quarantined"),
                pl.col("id").drop_nulls().first().alias("id"),
                pl.struct(*_FINDING_FIELDS).struct.json_encode().str.join(",").alias("findings"),
            )
            .filter("quarantined")
        )
        for line, record_id, findings in entries.select("line", "id", "findings").iter_rows():
            head = b'{"line":%d,"id":%b,"findings":[%b],' % (line, orjson.dumps(record_id), findings.encode())
            yield line, head


def _split(
    data_file: Path | ObjectPath,
    quarantined: Iterator[tuple[int, bytes]],
    clean_out: Staged | IO[bytes],
    quarantine_out: Staged | IO[bytes],
    block_bytes: int,
) -> tuple[dict[str, int], InputDigest]:
    """Stream the file once more and send each record to clean or quarantine, bytes untouched.

    `quarantined` comes in line order, so the two streams are walked in step.
    """
    digest = InputDigest()
    counts = {"records": 0, "clean": 0, "quarantined": 0, "blank_lines": 0, "lines": 0}
    pending = next(quarantined, None)
    for block in file_blocks(data_file, digest=digest, block_bytes=block_bytes):
        clean: list[bytes] = []
        records = 0
        for line, raw in block.record_lines():
            records += 1
            while pending is not None and pending[0] < line:
                pending = next(quarantined, None)  # only if the file changed: caught by its hash
            long = block.long_lines.get(line) if block.long_lines else None
            if pending is None or pending[0] != line:
                if long is None:
                    clean.append(raw)
                    continue
                # A long line a rule set keeps (its rule turned off) goes to clean as it is, streamed.
                _write_lines(clean_out, clean)
                counts["clean"] += len(clean) + 1
                clean = []
                for chunk in file_chunks(data_file, start=long.offset, end=long.offset + long.size, chunk_bytes=block_bytes):
                    clean_out.write(chunk)
                clean_out.write(b"\n")
                continue
            quarantine_out.write(pending[1] + (_raw_field(raw) if long is None else _omitted_field(long)) + b"}\n")
            counts["quarantined"] += 1
            pending = next(quarantined, None)
        _write_lines(clean_out, clean)
        counts["clean"] += len(clean)
        counts["blank_lines"] += len(block.lines) - records
        counts["lines"] = block.last_line
    counts["records"] = counts["clean"] + counts["quarantined"]
    return counts, digest


def _write_lines(out: Staged | IO[bytes], lines: list[bytes]) -> None:
    if lines:
        out.write(b"\n".join(lines) + b"\n")


def _omitted_field(long: LongLine) -> bytes:
    """Where a line too long to read is in the input (never held, so never copied)."""
    return b'"raw_omitted":{"offset":%d,"bytes":%d}' % (long.offset, long.size)


def _raw_field(raw: bytes) -> bytes:
    """The original line as `"raw": text`, or `"raw_base64": ...` when its bytes are not UTF-8."""
    try:
        return b'"raw":' + orjson.dumps(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return b'"raw_base64":' + orjson.dumps(base64.b64encode(raw).decode("ascii"))


def _manifest(
    session: Session,
    report: Report,
    input_path: Path | ObjectPath,
    counts: dict[str, int],
    quarantine_on: str,
    *,
    clean: dict[str, Any],
    quarantine: dict[str, Any],
) -> dict[str, Any]:
    return {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "tool": {"name": "audit", "version": __version__},
        "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "target": report.target,
        "input": {
            "path": str(input_path),
            "sha256": report.input["sha256"],
            "bytes": report.input["bytes"],
            "lines": counts["lines"],
            "records": counts["records"],
            "blank_lines": counts["blank_lines"],
        },
        "counts": {
            "in": counts["records"],
            "clean": counts["clean"],
            "quarantined": counts["quarantined"],
        },
        "outputs": {
            CLEAN_FILE: {"path": CLEAN_FILE, **clean},
            QUARANTINE_FILE: {"path": QUARANTINE_FILE, **quarantine},
        },
        "quarantine_on": quarantine_on,
        "verdict": report.verdict,
        "failed_rules": list(report.judgement.failed),
        "warned_rules": list(report.judgement.warned),
        "rule_set": report.rule_set,
        "profile": {"name": session.profile.name, "thinking": session.profile.thinking,
                    "source": report.profile.get("source")},
        "tokenizer": report.tokenizer,
    }


def _same_gate(previous: dict[str, Any], manifest: dict[str, Any]) -> bool:
    def comparable(m: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in m.items() if k != "created_at"}

    # Compare as JSON sees them: the previous manifest went through a round trip.
    return comparable(previous) == comparable(json.loads(json.dumps(manifest)))


def iter_quarantine(path: Path | ObjectPath) -> Iterable[dict[str, Any]]:
    """The entries of a quarantine.jsonl, each with `raw_bytes`: the original line, restored;
    None for a line too long to read, whose entry gives its place in the input (`raw_omitted`)."""
    with path.open("rb") as handle:
        for line in handle:
            entry = orjson.loads(line)
            if "raw" in entry:
                entry["raw_bytes"] = entry["raw"].encode("utf-8")
            elif "raw_base64" in entry:
                entry["raw_bytes"] = base64.b64decode(entry["raw_base64"])
            else:
                entry["raw_bytes"] = None
            yield entry

"""`export`: a partition's clean records as exact training samples; the flow behind `audit export`.

    source = open_source("B1_glaive", root, CheckOptions(profile="kimi-k2.5"))
    result = export_samples(source, "train/B1", ExportOptions(format="jsonl"))

One row per clean record (`audit.flows.export_sources`: the records `audit gate` keeps, or a
gate's clean.jsonl): `id`, `line` (in the source file), `input_ids` (the prompt ids then the
output ids, unchanged) and `loss_mask` (0 over the prompt, 1 over the output, unshifted; see
`audit.flows.export_rows` for what `end_of_turn=False` and `reasoning=False` take out of it).
With a vision profile, a `messages` column too: a row that sends images has each image pad
expanded and its conversation there, as speculators sends it to vLLM (`audit.flows.export_images`).
The samples stream: a block of records is read, turned into samples with numpy over its flat
ids, passed through the length policy and written (`audit.flows.export_writers`) before the
next is read. `export.json`, written last, says what the directory holds: the files with their
rows and sha256, the counts, the options, and the provenance (the partition's sha256, the
profile, the tokenizer's sha256).

`sample_blocks` is the same stream for other consumers: `audit.flows.draft_vocab` counts the
trained tokens of exactly these samples.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from audit import __version__
from audit.base.destinations import same_file
from audit.base.errors import InputError
from audit.base.storage import ObjectPath, location
from audit.flows.export_images import ImageTally, with_images
from audit.flows.export_rows import (
    LONG_POLICIES,
    LengthTally,
    MaskOptions,
    SampleBlock,
    TrainerLengths,
    apply_length_policy,
    build_samples,
)
from audit.flows.export_sources import SampleSource, SourceTally, clean_records, judge
from audit.flows.export_writers import (
    FORMATS,
    JSONL_FILE,
    ExportDirectory,
    WrittenFile,
    datasets_metadata,
    write_samples,
)
from audit.flows.output_paths import (
    refuse_destructive_outputs,
    removed_if_left_empty,
    require_readable,
)
from audit.model.trainers.trainer_rules import all_trainer_rules

EXPORT_SCHEMA_VERSION = 1
EXPORT_FILE = "export.json"
# What an export writes into its directory (with --force, stale ones of these names go).
EXPORT_OUTPUTS = re.compile(
    r"^(part-\d{5}\.parquet|data-\d{5}(-of-\d{5})?\.arrow|samples\.jsonl|dataset_info\.json|state\.json"
    r"|export\.json)(\.partial)?$"
)
DEFAULT_ROWS_PER_SHARD = 100_000


@dataclass(frozen=True)
class SampleOptions:
    """How clean records become samples: the mask, and what a maximum length does."""

    mask: MaskOptions = field(default_factory=MaskOptions)
    max_length: int | None = None  # rows longer than this are counted, and handled by `long`
    long: str = "keep"  # keep | drop | truncate

    def __post_init__(self) -> None:
        if self.long not in LONG_POLICIES:
            raise InputError(f"--long {self.long!r}: choose {', '.join(LONG_POLICIES)}")
        if self.max_length is not None and self.max_length < 1:
            raise InputError(f"--max-length {self.max_length}: give a positive number of tokens")
        if self.long != "keep" and self.max_length is None:
            raise InputError(f"--long {self.long} needs --max-length N: the length it applies to")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self.mask), "max_length": self.max_length, "long": self.long}


@dataclass(frozen=True)
class ExportOptions:
    """Where and how the samples are written."""

    format: str = "parquet"  # parquet | datasets | jsonl
    rows_per_shard: int = DEFAULT_ROWS_PER_SHARD  # parquet and datasets
    force: bool = False  # write into a directory that is not empty

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise InputError(f"--format {self.format!r}: choose {', '.join(FORMATS)}")
        if self.rows_per_shard < 1:
            raise InputError(f"--rows-per-shard {self.rows_per_shard}: give a positive number of rows")


@dataclass
class SampleTally:
    """What the samples added up to."""

    source: SourceTally = field(default_factory=SourceTally)
    length: LengthTally = field(default_factory=LengthTally)
    rows: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    untrained_rows: int = 0  # rows with no trained token (both trainers drop such rows)
    image_rows: int = 0  # rows whose prompt holds an image placeholder (`image_notes`)
    images: ImageTally = field(default_factory=ImageTally)
    # per trainer, the rows its default max_length cuts and drops
    trainers: list[TrainerLengths] = field(default_factory=lambda: [TrainerLengths(t) for t in all_trainer_rules()])

    def to_dict(self) -> dict[str, Any]:
        return {
            "clean_records": self.source.clean,
            "rows": self.rows,
            "tokens": self.tokens,
            "trained_tokens": self.trained_tokens,
            "untrained_rows": self.untrained_rows,
            "image_rows": self.image_rows,
            "image_rows_expanded": self.images.expanded,
            "image_rows_unexpanded": self.images.unexpanded,
            "image_rows_closed": self.images.closed,
            "image_rows_rerendered": self.images.rerendered,
            "image_rows_first_rerendered_line": self.images.first_rerendered,
            "unreadable_clean_records": self.source.unreadable,
            "unreadable_lines": self.source.unreadable_lines,
            **{f"max_length_{name}": value for name, value in asdict(self.length).items()},
        }


def sample_blocks(source: SampleSource, options: SampleOptions, tally: SampleTally) -> Iterator[SampleBlock]:
    """The samples of the source's clean records, block by block, the length policy applied."""
    judge(source)
    context = source.session.context
    vision = context.profile.vision
    for records in clean_records(source, tally.source, whole=vision is not None):
        block = build_samples(records, context, options.mask)
        if vision is not None:
            block = with_images(block, records, context, tally.images)
        block = apply_length_policy(block, options.max_length, options.long, tally.length)
        trained = block.trained()
        tally.rows += block.rows
        tally.tokens += len(block.values)
        tally.trained_tokens += int(trained.sum())
        tally.untrained_rows += int((trained == 0).sum())
        if vision is not None and block.rows:  # a row holding a vision placeholder sends images
            hits = np.flatnonzero(np.isin(block.values, vision.ids))
            tally.image_rows += len(np.unique(np.searchsorted(block.offsets, hits, side="right")))
        for trainer in tally.trainers:
            trainer.add(block)
        yield block


def image_notes(counts: dict[str, Any]) -> list[str]:
    """What each trainer does with the rows whose prompt holds an image placeholder, one line
    each (none when no row does), from an export's counts. Such a row carries its prompt with
    each image pad expanded as the server expanded it (loss mask 0 over it, as over the whole
    prompt), and `messages`: the conversation with its images, which speculators sends to vLLM
    (`audit.flows.export_images`)."""
    rows = counts["image_rows"]
    if not rows:
        return []
    unexpanded, rerendered = counts["image_rows_unexpanded"], counts["image_rows_rerendered"]
    left = (
        f"; {unexpanded} whose images could not be counted are left as sent, with no messages, "
        "and it sends them as ids alone (no image reaches the hidden states)"
        if unexpanded else ""
    )
    dropped = (
        f"; it will drop {rerendered} of them: the chat template renders their messages to other ids than "
        f"the record's (the first on line {counts['image_rows_first_rerendered_line']})"
        if rerendered else ""
    )
    return [
        # specforge==0.2.0, specforge/inference/media.py: "The current runtime does not support
        # VLM training or media rollout inputs."
        f"SpecForge 0.2.0: cannot train on the {rows} rows whose prompt holds an image placeholder: its runtime does not "
        "support VLM training (specforge/inference/media.py)",
        # speculators==0.9.0, train/data.py::build_client_item: a row whose `messages` hold
        # content parts is sent as messages (vLLM renders them, the reply's turn closed, and
        # expands the images); data_generation/vllm_client.py::extract_output drops a row whose
        # returned ids differ from the row's.
        f"speculators 0.9.0: {counts['image_rows_expanded']} of the {rows} rows whose prompt holds an image placeholder "
        "carry their ids with each image expanded and messages naming their images, which it sends to vLLM to render "
        "(it drops a row whose rendering differs from its ids)" + dropped + left,
    ]


class NothingToExport(InputError):
    """No sample is left to write: every record was quarantined, or every clean one dropped.

    Not a broken run: `audit export` and `audit vocab` exit 1 on it (as a failed gate does),
    after the check's report; `source` holds it.
    """

    def __init__(self, message: str, source: SampleSource):
        super().__init__(message)
        self.source = source


def no_samples(source: SampleSource, tally: SampleTally) -> NothingToExport:
    """The error for a source that gave no sample at all."""
    target = source.provenance()["source"]["target"]
    if tally.source.clean == 0:
        return NothingToExport(
            f"{target}: no clean record to export (every record was quarantined); nothing was written", source
        )
    return NothingToExport(
        f"{target}: none of its {tally.source.clean} clean records is left as a sample "
        f"({tally.length.dropped} dropped by --long, {tally.source.unreadable} unreadable); nothing was written",
        source,
    )


@dataclass
class ExportResult:
    """A finished export: what export.json says, where it is, and the exit code of the run."""

    summary: dict[str, Any]
    out_dir: Path | ObjectPath
    source: SampleSource

    @property
    def rows(self) -> int:
        return int(self.summary["counts"]["rows"])

    @property
    def files(self) -> list[str]:
        return [entry["path"] for entry in self.summary["files"]]

    def exit_code(self) -> int:
        """As `audit gate`: 0 the gate passed, 1 it failed (the export is written either way)."""
        return self.source.exit_code()


def check_output(out: Path | ObjectPath, source: SampleSource, what: str, names: tuple[str, ...]) -> None:
    """An output directory that cannot be one (a file, the input's own directory), one whose
    files `names` would replace an input (`audit.flows.output_paths`), or an input that cannot
    be read: refused before the directory is made."""
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    own = source.input_directory
    if own is not None and same_file(out, own):
        raise InputError(f"--out {out} is the input's own directory; choose another directory")
    refuse_destructive_outputs(source.session.target, directories=[(what, out, names)])
    require_readable(source.session.target.data_file)


def export_samples(source: SampleSource, out: str | os.PathLike[str] | ObjectPath, options: ExportOptions,
                   samples: SampleOptions | None = None) -> ExportResult:
    """Write the source's clean records as samples into `out` (a directory or an object storage
    prefix), export.json last. Raises InputError (nothing published) when `out` is not empty and
    `force` is not set, when no sample is left, or when the input changed while being read."""
    samples = samples or SampleOptions()
    out = location(out)
    check_output(out, source, "the export", (JSONL_FILE, "dataset_info.json", "state.json", EXPORT_FILE))
    directory = ExportDirectory(out, EXPORT_FILE, EXPORT_OUTPUTS)
    with removed_if_left_empty(out), directory:
        directory.refuse_unless(options.force, "export")
        judge(source)
        provenance = {**source.provenance(), "options": {**samples.to_dict(), "format": options.format}}
        tally = SampleTally()
        messages = source.session.context.profile.vision is not None
        files = write_samples(
            options.format, sample_blocks(source, samples, tally), directory.stage,
            rows_per_shard=options.rows_per_shard, provenance=provenance, messages=messages,
        )
        if tally.rows == 0:
            raise no_samples(source, tally)
        if options.format == "datasets":
            files += datasets_metadata(files, directory.stage, messages)
        summary = _summary(provenance, options, tally, files, messages)
        directory.publish(files, json.dumps(summary, ensure_ascii=False, indent=1).encode() + b"\n")
    return ExportResult(summary=summary, out_dir=out, source=source)


def _summary(provenance: dict[str, Any], options: ExportOptions, tally: SampleTally, files: list[WrittenFile],
             messages: bool) -> dict[str, Any]:
    return {
        "schema_version": EXPORT_SCHEMA_VERSION,
        "tool": {"name": "audit", "version": __version__},
        "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **provenance,
        "options": {**provenance["options"], "rows_per_shard": options.rows_per_shard},
        "columns": {
            "id": "string (null when the record has none)",
            "line": "uint32: the record's line in the source file",
            "input_ids": "list<uint32>: the prompt ids (each image pad expanded), then the output ids (an image row "
                         "ends as its chat template ends the turn: ids the record lacks are untrained)",
            "loss_mask": "list<uint8>: 1 where input_ids[i] is trained, unshifted",
            **({"seq_len": "int64: the row's length (speculators reads it)"} if options.format == "datasets" else {}),
            **({"messages": "list<{role, content: list<{type, text, image_url: {url}}>, reasoning_content, "
                "tool_calls: list<{id, type, function: {name, arguments}}>, tool_call_id}>: an image row's "
                "conversation and reply, as speculators sends it to vLLM; empty for the other rows"} if messages else {}),
        },
        "counts": tally.to_dict(),
        "trainers": [trainer.to_dict() for trainer in tally.trainers],
        "files": [{"path": f.name, **f.staged.summary(f.rows)} for f in files],
    }

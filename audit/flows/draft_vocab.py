"""`vocab`: the draft vocabulary of an EAGLE-3 drafter, from the trained tokens of the exact samples.

    result = draft_vocab(open_source("B1_glaive", root, options), "vocab/B1", VocabOptions(32_000))

Counts every id whose loss mask is 1 over the samples `audit export` would write (the same
records, the same options: `audit.flows.export.sample_blocks`), one numpy `bincount` per block,
and keeps the `draft_size` most frequent. Both trainers define the maps alike
(SpecForge 0.2.0 `specforge/data/preprocessing.py::process_token_dict_to_mappings`, speculators
0.9.0 `speculators/train/vocab_mapping.py::build_vocab_mappings_from_distribution`):

    used   the selected target ids, sorted ascending (with fewer distinct trained ids than
           `draft_size`, ids not seen fill it up: see `_filler`)
    d2t    int64 [draft_size]: d2t[i] = used[i] - i  (draft id i is target id i + d2t[i])
    t2d    bool [target vocabulary]: t2d[t] = t is in used

and differ only at the cut-off among ids of equal count: SpecForge keeps the one its Counter met
first (rows in order, ids ascending within a row: `Counter.most_common` is a stable sort over
insertion order), speculators the smallest id (`tie_break="speculators"`).

Writes into the output directory (an object storage prefix too): d2t.npy, t2d.npy (what
speculators' `--d2t-path`/`--t2d-path` take), vocab_mapping.safetensors (both, for any
framework: `safetensors.numpy.load_file`), token_counts.npy (int64 [target vocabulary]: the
trained count of every id) and vocab.json (the coverage of the top N for several N, the
options, the provenance) last.
"""

from __future__ import annotations

import io
import json
import os
import re
import struct
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from audit import __version__
from audit.base.errors import ConfigError, InputError
from audit.base.storage import ObjectPath, location
from audit.flows.export import SampleOptions, SampleTally, check_output, no_samples, sample_blocks
from audit.flows.export_rows import SampleBlock
from audit.flows.export_sources import SampleSource, judge
from audit.flows.export_writers import ExportDirectory, WrittenFile
from audit.flows.output_paths import removed_if_left_empty

VOCAB_FILE = "vocab.json"
VOCAB_NAMES = ("d2t.npy", "t2d.npy", "vocab_mapping.safetensors", "token_counts.npy", VOCAB_FILE)
VOCAB_OUTPUTS = re.compile(r"^(d2t\.npy|t2d\.npy|vocab_mapping\.safetensors|token_counts\.npy|vocab\.json)(\.partial)?$")
TIE_BREAKS = ("specforge", "speculators")
COVERAGE_SIZES = (8_000, 16_000, 32_000, 64_000)
_UNSEEN = np.iinfo(np.int64).max


@dataclass(frozen=True)
class VocabOptions:
    """The draft vocabulary asked for."""

    draft_size: int
    tie_break: str = "specforge"  # specforge | speculators
    target_size: int | None = None  # the target model's vocabulary (default: see `target_vocab_size`)
    force: bool = False

    def __post_init__(self) -> None:
        if self.tie_break not in TIE_BREAKS:
            raise InputError(f"--tie-break {self.tie_break!r}: choose {', '.join(TIE_BREAKS)}")
        if self.draft_size < 1:
            raise InputError(f"--draft-vocab {self.draft_size}: give a positive number of tokens")
        if self.target_size is not None and self.target_size < 1:
            raise InputError(f"--target-vocab {self.target_size}: give a positive number of tokens")


class TokenCounts:
    """Trained tokens counted per id, and the row each id was first trained in (SpecForge's ties)."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.counts = np.zeros(vocab_size, dtype=np.int64)
        self.first_row = np.full(vocab_size, _UNSEEN, dtype=np.int64)
        self.rows = 0

    def add(self, block: SampleBlock) -> None:
        trained = block.mask.astype(bool)
        ids = block.values[trained].astype(np.int64)
        if len(ids) and int(ids.max()) >= self.vocab_size:
            raise ConfigError(
                f"a trained token id {int(ids.max())} is outside the target vocabulary of {self.vocab_size}: "
                "pass --target-vocab N, the target model's vocabulary size"
            )
        self.counts += np.bincount(ids, minlength=self.vocab_size)
        fresh = np.flatnonzero(self.first_row[ids] == _UNSEEN)  # after the first blocks, few
        if len(fresh):
            rows = np.repeat(np.arange(block.rows, dtype=np.int64) + self.rows, block.lengths)[trained]
            seen, first = np.unique(ids[fresh], return_index=True)  # first: the earliest position, so row
            self.first_row[seen] = rows[fresh[first]]
        self.rows += block.rows


def select_draft_ids(counts: np.ndarray, first_row: np.ndarray | None, draft_size: int, tie_break: str) -> np.ndarray:
    """The target ids of the draft vocabulary, sorted ascending (`used` in both trainers)."""
    if draft_size > len(counts):
        raise ConfigError(f"a draft vocabulary of {draft_size} is larger than the target vocabulary of {len(counts)}")
    seen = np.flatnonzero(counts)
    if tie_break == "specforge":
        assert first_row is not None
        order = np.lexsort((seen, first_row[seen], -counts[seen]))
    else:
        order = np.lexsort((seen, -counts[seen]))
    chosen = seen[order[:draft_size]]
    if len(chosen) < draft_size:
        chosen = np.concatenate([chosen, _filler(chosen, draft_size, tie_break)])
    return np.sort(chosen)


def _filler(seen: np.ndarray, draft_size: int, tie_break: str) -> np.ndarray:
    """The ids that fill a draft vocabulary larger than the distinct trained ids.

    speculators takes the smallest ids not seen. SpecForge iterates `set(range(N)) - seen`
    and takes ids in the order CPython iterates that set, which is not always ascending (a set
    smaller than its largest id wraps its table): the same expression is run here, so the
    same ids come out.
    """
    wanted = draft_size - len(seen)
    if tie_break == "specforge":
        missing = set(range(draft_size)) - set(seen.tolist())
        return np.fromiter(islice(missing, wanted), dtype=np.int64, count=wanted)
    return np.setdiff1d(np.arange(draft_size), seen)[:wanted]


def vocab_mappings(used: np.ndarray, target_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(d2t, t2d) of a draft vocabulary: int64 offsets and a bool mask over the target ids."""
    d2t = used.astype(np.int64) - np.arange(len(used), dtype=np.int64)
    t2d = np.zeros(target_size, dtype=bool)
    t2d[used] = True
    return d2t, t2d


def coverage(counts: np.ndarray, sizes: list[int]) -> list[dict[str, Any]]:
    """For each size N: the share of trained tokens the N most frequent ids cover (ties do not
    change it: a tie is between equal counts)."""
    total = int(counts.sum())
    ranked = np.sort(counts[counts > 0])[::-1]
    running = np.cumsum(ranked)
    rows = []
    for size in sizes:
        covered = int(running[min(size, len(running)) - 1]) if len(running) and size > 0 else 0
        rows.append({"draft_size": size, "covered_tokens": covered, "coverage": covered / total if total else 0.0})
    return rows


def coverage_curve(counts: np.ndarray, points: int = 64) -> list[tuple[int, float]]:
    """(N, coverage) at sizes spread evenly on a log scale, up to every distinct trained id."""
    distinct = int((counts > 0).sum())
    if distinct == 0:
        return []
    sizes = sorted({int(round(x)) for x in np.geomspace(1, distinct, num=min(points, distinct))} | {distinct})
    return [(row["draft_size"], row["coverage"]) for row in coverage(counts, sizes)]


def target_vocab_size(source: SampleSource, asked: int | None) -> tuple[int, str]:
    """The target model's vocabulary size, and where it came from: asked for, the model's
    config.json beside the tokenizer (`vocab_size`), else the tokenizer's (its highest id + 1)."""
    if asked is not None:
        return asked, "--target-vocab"
    tokenizer = source.session.tokenizer
    config = Path(tokenizer.directory) / "config.json"
    try:
        recorded = json.loads(config.read_text(encoding="utf-8")).get("vocab_size") if config.is_file() else None
    except (OSError, ValueError, AttributeError):
        recorded = None
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded >= tokenizer.vocab_size:
        return recorded, str(config)
    return tokenizer.vocab_size, "the tokenizer"


def safetensors_bytes(tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> bytes:
    """The safetensors format: an 8-byte little-endian header length, a JSON header naming each
    tensor's dtype, shape and byte range, then the raw little-endian bytes in that order."""
    kinds = {np.dtype(np.int64): "I64", np.dtype(np.bool_): "BOOL", np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8"}
    header: dict[str, Any] = {"__metadata__": metadata}
    body, at = [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": kinds[array.dtype], "shape": list(array.shape), "data_offsets": [at, at + len(data)]}
        body.append(data)
        at += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(body)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


@dataclass
class VocabResult:
    """A written draft vocabulary: what vocab.json says, the arrays, where they are."""

    summary: dict[str, Any]
    d2t: np.ndarray
    t2d: np.ndarray
    counts: np.ndarray
    out_dir: Path | ObjectPath
    source: SampleSource

    def exit_code(self) -> int:
        return self.source.exit_code()


def draft_vocab(source: SampleSource, out: str | os.PathLike[str] | ObjectPath, options: VocabOptions,
                samples: SampleOptions | None = None) -> VocabResult:
    """Count the trained tokens of the source's samples and write the draft vocabulary into `out`."""
    samples = samples or SampleOptions()
    out = location(out)
    check_output(out, source, "the draft vocabulary", VOCAB_NAMES)
    directory = ExportDirectory(out, VOCAB_FILE, VOCAB_OUTPUTS)
    with removed_if_left_empty(out), directory:
        directory.refuse_unless(options.force, "draft vocabulary")
        judge(source)
        size, size_from = target_vocab_size(source, options.target_size)
        counter = TokenCounts(size)
        tally = SampleTally()
        for block in sample_blocks(source, samples, tally):
            counter.add(block)
        if tally.rows == 0:
            raise no_samples(source, tally)
        used = select_draft_ids(counter.counts, counter.first_row, options.draft_size, options.tie_break)
        d2t, t2d = vocab_mappings(used, size)
        provenance = source.provenance()
        sizes = sorted({*(s for s in COVERAGE_SIZES if s <= size), options.draft_size})
        summary = {
            "schema_version": 1,
            "tool": {"name": "audit", "version": __version__},
            **provenance,
            "options": {**samples.to_dict(), "draft_vocab": options.draft_size, "tie_break": options.tie_break},
            "target_vocab": {"size": size, "from": size_from},
            "counts": {**tally.to_dict(), "distinct_trained_ids": int((counter.counts > 0).sum())},
            "coverage": coverage(counter.counts, sizes),
            "coverage_curve": coverage_curve(counter.counts),
        }
        metadata = {"draft_vocab": str(options.draft_size), "target_vocab": str(size), "tie_break": options.tie_break,
                    "source_sha256": str(provenance["source"]["sha256"]), "tokenizer_sha256": provenance["tokenizer"]["sha256"]}
        files = []
        for name, content in (
            ("d2t.npy", _npy(d2t)),
            ("t2d.npy", _npy(t2d)),
            ("vocab_mapping.safetensors", safetensors_bytes({"d2t": d2t, "t2d": t2d}, metadata)),
            ("token_counts.npy", _npy(counter.counts)),
        ):
            staged = directory.stage(name)
            staged.write(content)
            files.append(WrittenFile(staged, name, 0))
        summary["files"] = [{"path": f.name, **{k: v for k, v in f.staged.summary(0).items() if k != "records"}} for f in files]
        directory.publish(files, json.dumps(summary, indent=1).encode() + b"\n")
    return VocabResult(summary=summary, d2t=d2t, t2d=t2d, counts=counter.counts, out_dir=out, source=source)

"""What `audit check TARGET` points at: a partition name, a partition directory, or a file.

A partition is a directory `<data root>/<name>/` holding `raw_responses.jsonl`, and
optionally `generation.json`, written by the generator, which records how the data was
made (profile, tokenizer path and fingerprint, thinking mode) so that a bare
`audit check NAME` knows what to audit it with (`audit.generate.manifest` reads it).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from audit.errors import InputError
from audit.generate.manifest import GenerationManifest, read_manifest

DATA_FILE = "raw_responses.jsonl"
DEFAULT_DATA_ROOT = Path("prepared")
# The sample shipped with the project, used when run from a checkout with no data root.
SAMPLE_DATA_ROOT = Path("fixtures") / "prepared"

_PARTITION_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class Target:
    """A resolved audit target."""

    partition: str  # a short name for reports: the partition, or the file's stem
    data_file: Path
    generation: GenerationManifest = field(default_factory=GenerationManifest)
    directory: Path | None = None  # the directory holding the data file (and generation.json)


def data_root(explicit: str | Path | None) -> tuple[Path, str | None]:
    """The data root and, when the shipped sample stands in for it, a note saying so."""
    if explicit is not None:
        return Path(explicit), None
    if env := os.environ.get("AUDIT_DATA_ROOT"):
        return Path(env), None
    if not DEFAULT_DATA_ROOT.exists() and SAMPLE_DATA_ROOT.is_dir():
        return SAMPLE_DATA_ROOT, f"no {DEFAULT_DATA_ROOT}/ here: auditing the shipped sample in {SAMPLE_DATA_ROOT}/"
    return DEFAULT_DATA_ROOT, None


def names_a_path(spec: str) -> bool:
    """Is `spec` a file or directory path, rather than a partition name under the data root?"""
    return (
        spec.endswith(".jsonl")
        or Path(spec).is_file()
        or os.sep in spec
        or bool(os.altsep and os.altsep in spec)
        or spec.startswith(".")
    )


def resolve_target(spec: str, root: Path) -> Target:
    """Turn what the user typed into the file to audit, or raise an InputError saying why not."""
    path = Path(spec)
    if spec.endswith(".jsonl") or path.is_file():
        return _file_target(path)
    if names_a_path(spec):
        if path.is_dir():
            return _directory_target(path, path.name)
        raise InputError(f"{spec}: no such partition directory")
    if not _PARTITION_NAME.match(spec):
        raise InputError(f"{spec!r} is not a partition name (letters, digits, _ . -)")
    if root.exists() and not root.is_dir():
        raise InputError(f"data root {root} is a file, not a directory: pass --data-root DIR (the directory of partitions)")
    if not root.is_dir():
        raise InputError(
            f"data root {root}/ does not exist: pass --data-root DIR, set AUDIT_DATA_ROOT, "
            f"or give a partition directory or .jsonl path"
        )
    candidate = (root / spec).resolve()
    if not candidate.is_relative_to(root.resolve()):
        raise InputError(f"partition {spec!r} resolves outside the data root {root}/")
    if not candidate.is_dir():
        known = sorted(p.name for p in root.iterdir() if (p / DATA_FILE).is_file())
        hint = f" (partitions here: {', '.join(known)})" if known else ""
        raise InputError(f"no partition {spec!r} under {root}/{hint}")
    return _directory_target(candidate, spec)


def _directory_target(directory: Path, name: str) -> Target:
    data_file = directory / DATA_FILE
    if not data_file.is_file():
        raise InputError(f"{directory}: no {DATA_FILE} in this partition directory")
    _require_content(data_file)
    return Target(
        partition=name,
        data_file=data_file,
        generation=read_manifest(directory),
        directory=directory,
    )


def _file_target(path: Path) -> Target:
    if path.is_dir():
        if (path / DATA_FILE).is_file():
            return _directory_target(path, path.name)  # a partition directory that happens to end in .jsonl
        raise InputError(f"{path}: is a directory, not a .jsonl file, and holds no {DATA_FILE}")
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    _require_content(path)
    partition = path.parent.name if path.name == DATA_FILE else path.stem
    return Target(
        partition=partition or path.stem,
        data_file=path,
        generation=read_manifest(path.parent),
        directory=path.parent,
    )


def _require_content(path: Path) -> None:
    if path.stat().st_size == 0:
        raise InputError(f"{path}: the file is empty; there is nothing to audit")


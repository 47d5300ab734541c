"""What `audit check TARGET` points at: a partition name, a partition directory, or a file.

A partition is a directory `<data root>/<name>/` holding `raw_responses.jsonl`, and
optionally `generation.json`, written by the generator, which records how the data was
made (profile, tokenizer path and fingerprint, thinking mode) so that a bare
`audit check NAME` knows what to audit it with (`audit.generate.manifest` reads it).

Targets and the data root may be URLs in object storage (`s3://bucket/prepared/B1`, see
`audit.base.storage`): a partition name under `--data-root s3://bucket/prepared` is found as under a
local root, and can no more escape it.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from audit.base.errors import InputError
from audit.base.storage import ObjectPath, is_url, location
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
    data_file: Path | ObjectPath  # a local file, or an object in object storage
    generation: GenerationManifest = field(default_factory=GenerationManifest)
    # The directory (or object storage prefix) holding the data file and generation.json.
    directory: Path | ObjectPath | None = None

    @property
    def remote(self) -> bool:
        """Is the data in object storage?"""
        return isinstance(self.data_file, ObjectPath)


def data_root(explicit: str | os.PathLike[str] | None) -> tuple[Path | ObjectPath, str | None]:
    """The data root (a directory, or a URL prefix) and, when the shipped sample stands in for
    it, a note saying so."""
    if explicit is not None:
        return location(explicit), None
    if env := os.environ.get("AUDIT_DATA_ROOT"):
        return location(env), None
    if not DEFAULT_DATA_ROOT.exists() and SAMPLE_DATA_ROOT.is_dir():
        return SAMPLE_DATA_ROOT, f"no {DEFAULT_DATA_ROOT}/ here: auditing the shipped sample in {SAMPLE_DATA_ROOT}/"
    return DEFAULT_DATA_ROOT, None


def shipped_sample_note(target: Target) -> str | None:
    """For a shipped sample corrupted on purpose (its labels.json names cases), a line saying so.

    A newcomer's first `audit check B1_glaive` ends in FAIL; that is the sample's point, and
    the clean sample shows a pass.
    """
    if target.directory is None or target.directory.resolve().parent != SAMPLE_DATA_ROOT.resolve():
        return None
    labels = target.directory / "labels.json"
    try:
        corrupted = labels.is_file() and labels.read_text(encoding="utf-8").strip() not in ("", "{}")
    except (OSError, UnicodeDecodeError):
        return None
    if not corrupted:
        return None
    return (
        f"{target.partition} is a sample corrupted on purpose "
        f"({SAMPLE_DATA_ROOT / target.directory.name / labels.name} names each case): "
        "`audit check B0_clean` shows a pass"
    )


def names_a_path(spec: str) -> bool:
    """Is `spec` a file or directory path, rather than a partition name under the data root?"""
    return (
        is_url(spec)
        or spec.endswith(".jsonl")
        or Path(spec).is_file()
        or os.sep in spec
        or bool(os.altsep and os.altsep in spec)
        or spec.startswith(".")
    )


def resolve_target(spec: str, root: Path | ObjectPath) -> Target:
    """Turn what the user typed into the file to audit, or raise an InputError saying why not."""
    if is_url(spec):
        return _object_target(ObjectPath(spec))
    path = Path(spec)
    if spec.endswith(".jsonl") or path.is_file():
        return _file_target(path)
    if names_a_path(spec):
        return _path_target(path)
    if not _PARTITION_NAME.match(spec):
        raise InputError(f"{spec!r} is not a partition name (letters, digits, _ . -)")
    if isinstance(root, ObjectPath):
        return _object_partition(spec, root)
    if os.path.lexists(spec) and not os.path.lexists(root / spec):
        # Something of that name is here (a directory, a FIFO, a symlink...) and not under the
        # data root: the user named it, so say what it is rather than what the root lacks.
        return _path_target(path)
    if root.exists() and not root.is_dir():
        raise InputError(f"data root {root} is a file, not a directory: pass --data-root DIR (the directory of partitions)")
    if not root.is_dir():
        raise InputError(
            f"data root {root}/ does not exist: pass --data-root DIR, set AUDIT_DATA_ROOT, "
            f"or give a partition directory or .jsonl path"
        )
    try:
        candidate = (root / spec).resolve()
    except (OSError, RuntimeError):  # a symlink loop (RuntimeError before Python 3.13)
        raise _not_a_data_file(root / spec) or InputError(f"{root / spec}: cannot resolve it") from None
    if not candidate.is_relative_to(root.resolve()):
        raise InputError(f"partition {spec!r} resolves outside the data root {root}/")
    if not candidate.is_dir():
        known = partition_names(root)
        hint = f" (partitions here: {', '.join(known)})" if known else ""
        raise InputError(f"no partition {spec!r} under {root}/{hint}")
    return _directory_target(candidate, spec)


def _object_partition(name: str, root: ObjectPath) -> Target:
    """A partition name under a data root in object storage.

    The name is one plain segment (the pattern above: no `/`, no `%`, no leading `.`), so the
    prefix it names is a child of the root's; checked once more on the joined URL.
    """
    candidate = root / name
    if not candidate.is_relative_to(root) or candidate.parent != root:
        raise InputError(f"partition {name!r} resolves outside the data root {root}/")
    if not candidate.is_dir():
        if not root.is_dir():
            raise InputError(
                f"data root {root}/ holds nothing: pass --data-root URL (the prefix of partitions), "
                "or give a partition URL"
            )
        known = partition_names(root)
        hint = f" (partitions here: {', '.join(known)})" if known else ""
        raise InputError(f"no partition {name!r} under {root}/{hint}")
    return _directory_target(candidate, name)


def _object_target(path: ObjectPath) -> Target:
    """A URL: an object (`.../raw_responses.jsonl`, `.../part.jsonl`) or a partition prefix."""
    if path.is_file():
        return _file_target(path)
    if path.is_dir():
        return _directory_target(path, path.name)
    raise InputError(f"{path}: no such object or prefix")


def partition_names(root: Path | ObjectPath) -> list[str]:
    """The names of the partitions directly under `root`: children holding raw_responses.jsonl.

    A listed name that is not a partition name is still listed: resolving it says why it is not
    one, rather than skipping it unseen.
    """
    found = []
    for child in root.iterdir():
        try:
            holds_data = (child / DATA_FILE).is_file()
        except InputError:  # a stored name that cannot be joined: left to resolve_target's message
            holds_data = True
        if holds_data:
            found.append(child.name)
    return sorted(found)


def _path_target(path: Path) -> Target:
    """A local path that is not a `.jsonl` name: a partition directory, or why it is none."""
    if path.is_dir():
        return _directory_target(path, path.name)
    if not os.path.lexists(path):
        raise InputError(f"{path}: no such partition directory")
    raise _not_a_data_file(path) or InputError(f"{path}: not a partition directory")


def _directory_target(directory: Path | ObjectPath, name: str) -> Target:
    data_file = directory / DATA_FILE
    if not data_file.is_file():
        if isinstance(data_file, Path) and (problem := _not_a_data_file(data_file)) is not None:
            raise problem
        raise InputError(
            f"directory {directory} holds no {DATA_FILE}: give a partition directory (one holding "
            f"{DATA_FILE}) or a .jsonl file"
        )
    _require_content(data_file)
    return Target(
        partition=name,
        data_file=data_file,
        generation=read_manifest(directory),
        directory=directory,
    )


def _file_target(path: Path | ObjectPath) -> Target:
    if path.is_dir():
        if (path / DATA_FILE).is_file():
            return _directory_target(path, path.name)  # a partition directory that happens to end in .jsonl
        raise InputError(f"{path}: is a directory, not a .jsonl file, and holds no {DATA_FILE}")
    if not path.is_file():
        problem = _not_a_data_file(path) if isinstance(path, Path) else None
        raise problem or InputError(f"{path}: no such file")
    _require_content(path)
    partition = path.parent.name if path.name == DATA_FILE else path.stem
    return Target(
        partition=partition or path.stem,
        data_file=path,
        generation=read_manifest(path.parent),
        directory=path.parent,
    )


_KINDS = (
    (stat.S_ISFIFO, "a FIFO (a named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_a_data_file(path: Path) -> InputError | None:
    """Why `path` is no file to audit, or None when it is a regular file, a directory or absent.

    Found from its type alone (`stat`): a FIFO is never opened, so nothing waits on a writer.
    """
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if path.is_symlink():
            return InputError(f"{path} is a symlink to {os.readlink(path)}, which does not exist: point it at the data")
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return InputError(
                f"{path} is a symlink loop (following it leads back to it): point it at a data file "
                "or a partition directory"
            )
        return InputError(f"{path}: cannot look at it ({exc.strerror or exc})")
    for test, kind in _KINDS:
        if test(mode):
            return InputError(
                f"{path} is {kind}, not a data file: audit reads regular files (it reads the data "
                "more than once: to audit it, then to split or check it unchanged); write the data "
                "to a .jsonl file and give that"
            )
    return None


def _require_content(path: Path | ObjectPath) -> None:
    if path.stat().st_size == 0:
        raise InputError(f"{path}: the file is empty; there is nothing to audit")


"""What a command may write to: never its input, a file of the partition it reads, or another of
its own outputs; and no output directory before the input is known to be readable.

    refuse_destructive_outputs(target, files=[("--report", report)], directories=[("the gate output", out, OUTPUT_FILES)])
    require_readable(target.data_file)
    with removed_if_left_empty(out):
        ...                                   # the run that creates `out`

Every command with an output path calls the first before any work (`check`, `gate`,
`trainer-view`, `export`, `vocab`), and so do the flows behind the Python API with their own
outputs (`gate_session`, `export_samples`, `draft_vocab`) and `Report.write_json`. Paths are
compared as `audit.base.destinations.same_file` does: links followed, hard links by inode.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from audit.base.destinations import destination, files_in, refuse_overlap
from audit.base.errors import InputError
from audit.base.storage import AnyPath, ObjectPath
from audit.flows.gate_outputs import CLEAN_FILE
from audit.flows.targets import DATA_FILE, Target

# A directory whose data file has one of these names is a partition (or a gate output): every
# file in it belongs to the data, and no output may replace one.
_DATA_DIRECTORY_FILES = (DATA_FILE, CLEAN_FILE)
_GENERATION_FILE = "generation.json"


def protected_inputs(target: Target, extra: Iterable[tuple[str, AnyPath | None]] = ()) -> list[tuple[str, AnyPath]]:
    """What a run on `target` reads and no output may replace: the data file, every file of its
    partition directory (or, for a loose .jsonl file, the generation.json beside it), and the
    `extra` inputs given (a rule set, a prompts file)."""
    inputs: list[tuple[str, AnyPath]] = [("the input", target.data_file)]
    directory = target.directory
    if isinstance(directory, Path):
        if target.data_file.name in _DATA_DIRECTORY_FILES:
            inputs += [("a file of the partition", path) for path in files_in(directory)]
        else:
            inputs.append(("the input's", directory / _GENERATION_FILE))
    inputs += [(what, path) for what, path in extra if path is not None]
    return inputs


def refuse_destructive_outputs(
    target: Target,
    *,
    files: Iterable[tuple[str, AnyPath | None]] = (),
    directories: Iterable[tuple[str, AnyPath, Iterable[str]]] = (),
    inputs: Iterable[tuple[str, AnyPath | None]] = (),
) -> None:
    """Raise InputError, one line naming both paths, when an output would replace an input of
    the run (`protected_inputs`) or another of its outputs; or naming it, when it is a
    destination no output may have (`audit.base.destinations.destination`).

    `files`: (the option, its path or None); `directories`: (what it is, the directory, the
    names the run writes into it).
    """
    outputs: list[tuple[str, AnyPath]] = []
    for what, directory, names in directories:
        if isinstance(directory, Path) and directory.exists() and not directory.is_dir():
            raise InputError(f"--out {directory}: exists and is not a directory")
        outputs += [(what, directory / name) for name in names]
    outputs += [(what, path) for what, path in files if path is not None]
    refuse_overlap(outputs, protected_inputs(target, inputs))
    for _, path in outputs:
        if isinstance(path, Path):
            destination(path)  # a directory, a block device, a socket, a loop: refused now


def require_readable(path: AnyPath) -> None:
    """InputError, one line, when the input cannot be opened for reading: before any output
    directory is made for it."""
    if isinstance(path, ObjectPath):
        return  # read in ranges as the run goes; the store's own errors say what is wrong
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return  # a FIFO is opened once, by the reading itself (which says what it is)
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror or exc})") from None


@contextlib.contextmanager
def removed_if_left_empty(directory: AnyPath) -> Iterator[None]:
    """Around a run that creates the output `directory`: when the run fails, a directory it
    created is removed again if nothing is left in it (a directory that was there stays)."""
    existed = not isinstance(directory, Path) or directory.exists()
    try:
        yield
    except BaseException:
        if not existed and isinstance(directory, Path):
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise

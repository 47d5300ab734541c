"""Writing outputs so that a crash leaves the old file or the new one, never half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def open_temporary(directory: Path, name: str) -> tuple[Path, IO[bytes]]:
    """A new temporary file in `directory` for the output `name`, open for binary writing.

    It sits beside its destination so `os.replace` is an atomic rename; its permissions follow
    the umask (mkstemp would make it private), since outputs are data for others to read.
    """
    directory.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    os.fchmod(handle, 0o666 & ~_umask())
    return Path(temporary), os.fdopen(handle, "wb")


def write_atomically(path: Path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` through a temporary file and a rename; no stray file on failure."""
    temporary, out = open_temporary(path.parent, path.name)
    try:
        with out:
            out.write(text.encode("utf-8"))
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path

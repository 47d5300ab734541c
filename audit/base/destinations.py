"""Where an output may go: the rule every file the tool writes follows, and the paths it may not name.

What a destination is decides how it is written (`audit.base.files.write_file` and
`Temporary.commit` apply it; `docs/security.md` states it for users):

- **absent, or a regular file**: written atomically, a temporary beside it renamed into place.
- **a character device or a FIFO** (`/dev/null`, a named pipe): written *through*: opened and
  written in place, never renamed over, never removed. `--report /dev/null` writes no report.
- **a directory, a block device, a socket**: refused, in one line, before anything is written.
- **a symbolic link**: followed, and the rule applied to what it leads to; the link itself is
  never replaced. A link to a regular file gets the new file at its target's path (the link
  still leads to it); a link to nothing, a new file there; a loop is refused. A link to one of
  this process's open files (`/dev/stdout`, `/dev/fd/N`: links into `/proc/<pid>/fd/`) is
  written through that open file, as a shell's redirection does, whatever it is.

`refuse_overlap` is the other half: an output that is one of the inputs, or another output of
the same run, is refused before any work, compared by path (links followed) and, where both
exist, by device and inode (a hard link is the same file under another name). An output
written through (a device, a FIFO, an open file) replaces nothing and is never refused so.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from audit.base.errors import InputError

# A link into /proc naming an open file of a process: `/proc/self/fd/1`, `/proc/<pid>/fd/1`,
# `/proc/<pid>/task/<tid>/fd/1`. /dev/stdout and /dev/fd/N lead there.
_OPEN_FILE = re.compile(r"^/proc/(?P<pid>\d+|self|thread-self)(?:/task/\d+)?/fd/(?P<fd>\d+)$")
_MAX_LINKS = 40  # as the kernel's own limit on links followed in one lookup
_REFUSED = {stat.S_IFDIR: "a directory", stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


@dataclass(frozen=True)
class Destination:
    """Where an output's bytes go: `path` (a link's target), and how: atomically, or through
    an existing device, FIFO or open file (`through`)."""

    named: Path  # what the caller named
    path: Path  # what it leads to (itself unless a symbolic link)
    through: bool = False
    open_file: int | None = None  # the descriptor of this process's that `named` leads to

    def open(self) -> IO[bytes]:
        """The destination opened for writing in place (a written-through destination only)."""
        if self.open_file is not None:
            return os.fdopen(os.dup(self.open_file), "wb")
        # O_NOFOLLOW: what was checked is what is opened; a FIFO's open waits for its reader.
        handle = os.open(self.path, os.O_WRONLY | os.O_NOCTTY | os.O_NOFOLLOW | os.O_CLOEXEC)
        kind = stat.S_IFMT(os.fstat(handle).st_mode)
        if kind not in (stat.S_IFCHR, stat.S_IFIFO):
            os.close(handle)
            raise InputError(f"{self.named} changed while it was being opened: write the output again")
        return os.fdopen(handle, "wb")


def destination(path: Path) -> Destination:
    """How `path` is written, by the rule above; InputError (one line) when it may not be."""
    followed, open_file = _follow(path)
    if open_file is not None:
        return Destination(path, followed, through=True, open_file=open_file)
    try:
        info = os.stat(followed)
    except FileNotFoundError:
        return Destination(path, followed)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
    kind = stat.S_IFMT(info.st_mode)
    if kind == stat.S_IFREG:
        return Destination(path, followed)
    if kind in (stat.S_IFCHR, stat.S_IFIFO):
        return Destination(path, followed, through=True)
    what = _REFUSED.get(kind, "not a regular file")
    shown = path if followed == Path(os.path.abspath(path)) else f"{path} (a link to {followed})"
    raise InputError(
        f"cannot write {shown}: it is {what}; name a file (or /dev/null to write nothing)"
    )


def _follow(path: Path) -> tuple[Path, int | None]:
    """The path `path` leads to once every link is followed, and the descriptor of this
    process's when it leads into `/proc/<pid>/fd/`."""
    current = Path(os.path.abspath(path))
    for _ in range(_MAX_LINKS):
        real = Path(os.path.realpath(current.parent)) / current.name
        if (own := _own_open_file(real)) is not None:
            return real, own
        try:
            info = os.lstat(real)
        except FileNotFoundError:
            return real, None
        except OSError as exc:
            raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
        if not stat.S_ISLNK(info.st_mode):
            return real, None
        current = real.parent / os.readlink(real)
    raise InputError(f"cannot write {path}: {os.strerror(errno.ELOOP)} (a loop of symbolic links)")


def _own_open_file(path: Path) -> int | None:
    match = _OPEN_FILE.match(str(path))
    if match is None or match["pid"] not in ("self", "thread-self", str(os.getpid())):
        return None
    return int(match["fd"])


# -- outputs that would destroy inputs -----------------------------------------------------------


def same_file(a: object, b: object) -> bool:
    """Do `a` and `b` name one file: the same path once links are followed, or (both existing)
    the same device and inode, as two hard links to one file do. Anything but a local path (a
    URL in object storage) is the same only as the same URL."""
    if not isinstance(a, Path) or not isinstance(b, Path):
        return str(a) == str(b)
    try:
        if Path(os.path.realpath(a)) == Path(os.path.realpath(b)):
            return True
        first, second = os.stat(a), os.stat(b)
    except (OSError, ValueError):  # ValueError: a NUL in a path read from a report
        return False
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


def refuse_overlap(outputs: Iterable[tuple[str, object]], inputs: Iterable[tuple[str, object]]) -> None:
    """Raise InputError (one line naming both) when an output is one of the `inputs` or one
    of the other `outputs`. Each is (what it is, its path): `("--report", Path("r.json"))`."""
    protected = list(inputs)
    seen: list[tuple[str, object]] = []
    for what, path in outputs:
        if isinstance(path, Path) and _written_through(path):
            continue  # /dev/null, a pipe, stdout: nothing there is replaced, by one output or two
        for other_what, other in protected:
            if same_file(path, other):
                raise InputError(f"{what} {path} would overwrite {other_what} {other}; choose another path")
        for other_what, other in seen:
            if same_file(path, other):
                raise InputError(
                    f"{what} {path} and {other_what} {other} are one file: one would overwrite the other; "
                    "choose another path"
                )
        seen.append((what, path))


def _written_through(path: Path) -> bool:
    try:
        return destination(path).through
    except InputError:
        return False  # refused on its own when it is written


def files_in(directory: Path) -> list[Path]:
    """The files directly in `directory` (none when it cannot be listed)."""
    try:
        return [Path(entry.path) for entry in os.scandir(directory) if not entry.is_dir()]
    except OSError:
        return []

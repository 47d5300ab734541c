"""Writing outputs: atomically, durably, and one run at a time.

- **Guarded.** Every output goes by the rule of `audit.base.destinations`: a device or a FIFO
  is written through, never replaced; a directory, a block device or a socket is refused; a
  symbolic link is followed, never replaced. `write_file` and `Temporary.commit` apply it.
- **Atomic.** An output is written to a temporary file beside it and renamed into place, so a
  crash leaves the old file or the new one, never half of one (`write_file`, or
  `open_temporary` + `Temporary.commit` for writers that stream). A directory of files that
  belong together (a cache entry) is filled beside its place and renamed in whole
  (`write_directory_atomically`).
- **Durable.** The temporary file is fsync'd before the rename and its directory after it, as
  databases do: once a run says it wrote a file, a power cut does not take it back.
- **No leftovers.** A temporary is named `.<output>.audit-XXXXXXXX.tmp` and is locked (flock)
  by its writer for as long as it exists. A run killed mid-write leaves it behind (as big as
  the output); the next write into that directory removes every such file that no live
  process holds (`remove_leftover_temporaries`), and nothing else.
- **One writer.** `lock_output(directory)` takes an exclusive lock on `<directory>/.audit.lock`
  for a whole run (`gate`, `generate`); a second run on the same output refuses at once with
  one line naming the holder. The lock is the kernel's (flock): it is released when its
  process dies, however it dies, so a lock file left by a killed run never blocks.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any, Self

from audit.base.destinations import destination
from audit.base.errors import InputError
from audit.base.holders import describe_holder, holder_record

LOCK_FILE = ".audit.lock"
TEMPORARY_MARK = ".audit-"
# Ours: `.<output>.audit-<mkstemp's 8 characters>.tmp`; and, from versions before the mark,
# the temporaries of the outputs `gate` and `generate` write.
_TEMPORARY_NAME = re.compile(
    r"^\..+\.audit-[a-z0-9_]{8}\.tmp$"
    r"|^\.(clean\.jsonl|quarantine\.jsonl|manifest\.json|generation\.json)\.[a-z0-9_]{8}\.tmp$"
)


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


# -- durability ----------------------------------------------------------------------------------


def fsync_directory(directory: Path) -> None:
    """Make the names in `directory` (a rename, a new or removed file) survive a power cut."""
    try:
        handle = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # a directory we cannot open for reading: the data itself was still synced
    try:
        os.fsync(handle)
    except OSError as exc:
        # Some file systems (and platforms) cannot sync a directory; the file was synced.
        if exc.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(handle)


# -- temporary files -----------------------------------------------------------------------------


class Temporary:
    """A temporary file beside its destination, held (flock) by this process until it is gone.

    Write to `file`; `commit(destination)` syncs it and renames it into place; `discard()`
    removes it. Either also closes it.
    """

    def __init__(self, path: Path, file: IO[bytes]):
        self.path = path
        self.file = file

    def sync(self) -> None:
        """Flush and fsync the data (the file stays open and held)."""
        if not self.file.closed:
            self.file.flush()
            os.fsync(self.file.fileno())

    def commit(self, destination_path: Path, *, sync_directory: bool = True) -> None:
        """fsync and rename onto `destination_path` (a link's target), then (unless told not to)
        fsync the directory; or copy through to a device or FIFO (`audit.base.destinations`).
        InputError, the temporary kept for `discard()`, when it may not be written."""
        target = destination(destination_path)
        self.sync()
        if target.through or target.path.parent != self.path.parent:
            # Through to a device or FIFO; or, for a link into another directory, a temporary
            # beside its target (a rename stays within one directory).
            self.file.close()
            with self.path.open("rb") as content:
                if target.through:
                    with target.open() as out:
                        shutil.copyfileobj(content, out, 1 << 20)
                else:
                    write_file(target.path, iter(lambda: content.read(1 << 20), b""))
            self.path.unlink(missing_ok=True)
            return
        os.replace(self.path, target.path)
        self.file.close()
        if sync_directory:
            fsync_directory(target.path.parent)

    def discard(self) -> None:
        """Close and remove the temporary file (nothing is renamed)."""
        self.file.close()
        self.path.unlink(missing_ok=True)


def open_temporary(directory: Path, name: str) -> Temporary:
    """A new temporary file in `directory` for the output `name`, open for binary writing.

    It sits beside its destination so `os.replace` is an atomic rename; its permissions follow
    the umask (mkstemp would make it private), since outputs are data for others to read.
    Leftovers of killed runs in `directory` are removed first.
    """
    directory.mkdir(parents=True, exist_ok=True)
    remove_leftover_temporaries(directory)
    while True:
        handle, temporary = tempfile.mkstemp(
            dir=directory, prefix=f".{name}{TEMPORARY_MARK}", suffix=".tmp"
        )
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX)
            except OSError:
                break  # a file system without locks: no cleaner can lock (and remove) it either
            # A cleaner in another process may have taken it for a leftover between mkstemp and
            # flock (it was not locked yet) and removed it: then make another one.
            if _same_file(handle, Path(temporary)):
                break
        except BaseException:
            os.close(handle)
            Path(temporary).unlink(missing_ok=True)
            raise
        os.close(handle)
    os.fchmod(handle, 0o666 & ~_umask())
    return Temporary(Path(temporary), os.fdopen(handle, "wb"))


def write_file(path: Path, text: str | Iterable[bytes]) -> Path:
    """Write `text` (a str as UTF-8, or bytes pieces as they come) to `path` by the rule of
    `audit.base.destinations`: durably through a temporary file and a rename, or through to a
    device or FIFO; InputError, before anything is written, when it may not be written. On any
    failure the old file is left as it was and no temporary file remains."""
    target = destination(path)
    pieces = [text.encode("utf-8")] if isinstance(text, str) else text
    if target.through:
        with target.open() as out:
            for piece in pieces:
                out.write(piece)
        return path
    temporary = open_temporary(target.path.parent, target.path.name)
    try:
        for piece in pieces:
            temporary.file.write(piece)
        temporary.commit(target.path)
    except BaseException:
        temporary.discard()
        raise
    return path


def remove_output(path: Path, *, follow: bool = True) -> None:
    """Remove the output at `path` before it is written again: a regular file only (a link
    followed to it, as writing would; `follow=False`: left alone), never a device or FIFO."""
    try:
        target = destination(path).path if follow else path
        if stat.S_ISREG(os.lstat(target).st_mode):
            target.unlink()
    except (FileNotFoundError, InputError):
        pass  # nothing there, or nothing an output may replace: writing it will say so


def write_directory_atomically(
    destination: Path, fill: Callable[[Path], object], *, complete: str | None = None
) -> bool:
    """Write a directory whole: `fill(staging)` writes its files into a new directory beside
    `destination`, which is then renamed into place, so readers see all of it or none.

    `complete` names the file a finished directory holds: when `destination` already has it
    (another run wrote the same thing, and may be reading it), it is kept and False returned.
    Anything else at `destination` (a broken leftover) is replaced. On failure nothing of this
    call is left behind. The files are not fsync'd one by one: for stores that can be rebuilt.
    """
    destination.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(destination) and not stat.S_ISDIR(os.lstat(destination).st_mode):
        # Not a leftover of ours (a link, a device, a file): left as it is, nothing written.
        raise NotADirectoryError(errno.ENOTDIR, "not a directory, left as it is", str(destination))
    staging = Path(
        tempfile.mkdtemp(dir=destination.parent, prefix=f".{destination.name}{TEMPORARY_MARK}", suffix=".tmp")
    )
    try:
        fill(staging)
        if complete is not None and (destination / complete).is_file():
            shutil.rmtree(staging, ignore_errors=True)
            return False
        if destination.exists():
            shutil.rmtree(destination, ignore_errors=True)
        os.rename(staging, destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    fsync_directory(destination.parent)
    return True


def remove_leftover_temporaries(directory: Path) -> list[Path]:
    """Remove the temporary files killed runs left in `directory`; return what was removed.

    Only regular files named as this module names temporaries, and only those no live process
    holds: each is locked before it is removed, and a writer holds its own for as long as it
    exists. Anything else (another tool's `.tmp`, a directory, a symlink) is left alone.
    """
    removed: list[Path] = []
    try:
        names = [entry.name for entry in os.scandir(directory) if _TEMPORARY_NAME.match(entry.name)]
    except OSError:
        return removed
    for name in names:
        path = directory / name
        try:
            handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue  # gone already, a symlink, or not ours to open
        try:
            if not _is_regular(handle):
                continue
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live writer holds it
            if _same_file(handle, path):
                path.unlink()
                removed.append(path)
        except OSError:
            continue
        finally:
            os.close(handle)
    return removed


def _is_regular(handle: int) -> bool:
    return stat.S_ISREG(os.fstat(handle).st_mode)


def _same_file(handle: int, path: Path) -> bool:
    """Whether `path` still names the file open as `handle` (not removed, not replaced)."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    opened = os.fstat(handle)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


# -- one run at a time ---------------------------------------------------------------------------


class OutputInUse(InputError):
    """Another live run holds the output's lock."""


class OutputLock:
    """An exclusive lock on an output directory, held until `release()` (or the process ends).

    Use as a context manager. Releasing removes the lock file.
    """

    def __init__(self, directory: Path, path: Path, handle: int):
        self.directory = directory
        self.path = path
        self._handle: int | None = handle

    @property
    def held(self) -> bool:
        return self._handle is not None

    def release(self) -> None:
        """Give the lock up; idempotent."""
        handle, self._handle = self._handle, None
        if handle is None:
            return
        try:
            # Removed while still held, so no other run can lock this file and then lose it.
            if _same_file(handle, self.path):
                self.path.unlink(missing_ok=True)
        finally:
            os.close(handle)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __del__(self) -> None:
        if self._handle is not None:
            os.close(self._handle)


def lock_output(directory: Path, command: str | None = None) -> OutputLock:
    """Take the exclusive lock on the output `directory` (created if missing) for one run.

    Raises `OutputInUse` at once, naming the holder (pid, host, command, start time), when
    another live process holds it; raises InputError when the lock file cannot be used (a
    symlink in its place, a read-only directory). `command` is what the holder line shows;
    by default this process's command line.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InputError(f"{directory} exists and is not a directory") from None
    except OSError as exc:
        raise InputError(f"cannot create {directory}: {exc.strerror}") from None
    path = directory / LOCK_FILE
    while True:
        handle = _open_lock_file(path)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder_of(handle)
            os.close(handle)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise OutputInUse(
                    f"{directory} is in use by another audit run ({holder}); wait for it to finish "
                    "or stop it, or choose another output"
                ) from None
            raise InputError(f"cannot lock {path}: {exc.strerror}") from None
        # The previous holder removes the lock file as it releases it; if it did so between
        # our open and our flock, we hold a file nobody else can see: open the new one.
        if _same_file(handle, path):
            break
        os.close(handle)
    _record_holder(handle, command)
    return OutputLock(directory, path, handle)


def _open_lock_file(path: Path) -> int:
    # O_NONBLOCK: a FIFO planted under the name must not hang the run (it is refused below).
    flags = os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        handle = os.open(path, os.O_RDWR | flags, 0o666 & ~_umask())
    except PermissionError:
        # Somebody else's stale lock file we may not write: a lock needs no write access.
        try:
            handle = os.open(path, os.O_RDONLY | flags)
        except OSError as exc:
            raise InputError(f"cannot open the lock file {path}: {exc.strerror}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(
                f"{path} is a symbolic link, not a lock file audit wrote: remove it and run again"
            ) from None
        raise InputError(f"cannot create the lock file {path}: {exc.strerror}") from None
    if not _is_regular(handle):
        os.close(handle)
        raise InputError(f"{path} is not a regular file: remove it and run again")
    return handle


def _record_holder(handle: int, command: str | None) -> None:
    """Say who holds the lock, for a run that finds it taken (best effort: read-only stays)."""
    holder = holder_record(command)
    try:
        os.ftruncate(handle, 0)
        os.pwrite(handle, json.dumps(holder).encode() + b"\n", 0)
    except OSError:
        pass


def _holder_of(handle: int) -> str:
    """The holder a lock file names, as one line of text (its content is not trusted)."""
    # The holder writes its line right after taking the lock: give it a moment.
    for _ in range(20):
        try:
            data: Any = json.loads(os.pread(handle, 1 << 16, 0) or b"null")
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict):
            break
        time.sleep(0.01)
    return describe_holder(data)

"""Where a gate's outputs go: staged beside their final names in a directory, or uploaded under
a prefix in object storage, each counted and hashed on the way, and published together."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import IO, Any

from audit.base.files import (
    Temporary,
    fsync_directory,
    lock_output,
    open_temporary,
    remove_leftover_temporaries,
    remove_output,
)
from audit.base.object_locks import abort_unfinished_writes, lock_prefix
from audit.base.storage import ObjectPath

# The gate's outputs, in a directory or under a prefix: the manifest is written last.
CLEAN_FILE = "clean.jsonl"
QUARANTINE_FILE = "quarantine.jsonl"
MANIFEST_FILE = "manifest.json"
OUTPUT_FILES = (CLEAN_FILE, QUARANTINE_FILE, MANIFEST_FILE)


class Staged:
    """An output being written, not yet in place: its bytes counted and hashed on the way."""

    def __init__(self, name: str, file: Any):
        self.name = name
        self.file = file  # a Temporary (a directory) or an unfinished upload (object storage)
        self._writer: IO[bytes] = file.file if isinstance(file, Temporary) else file
        self._hash = hashlib.sha256()
        self.bytes = 0

    def write(self, data: bytes) -> int:
        self._hash.update(data)
        self.bytes += len(data)
        return self._writer.write(data)

    def summary(self, records: int) -> dict[str, Any]:
        return {"sha256": self._hash.hexdigest(), "bytes": self.bytes, "records": records}

    def discard(self) -> None:
        self.file.discard()


class DirectoryOutputs:
    """Outputs in a local directory: temporary files renamed in, the directory fsync'd."""

    redo_unfinished = False  # clean.jsonl without a manifest may be someone's: --force

    def __init__(self, directory: Path):
        self.directory = directory

    def lock(self) -> Any:
        return lock_output(self.directory)

    def remove_leftovers(self) -> None:
        remove_leftover_temporaries(self.directory)

    def stage(self, name: str, staged: list[Staged]) -> Staged:
        output = Staged(name, open_temporary(self.directory, name))
        staged.append(output)
        return output

    def publish(self, staged: list[Staged], manifest: bytes) -> None:
        directory = self.directory
        for output in staged:
            output.file.sync()
        written = open_temporary(directory, MANIFEST_FILE)
        try:
            written.file.write(manifest)
            # The old manifest goes first and the new one comes last: a crash in between leaves a
            # directory without a manifest, which no consumer may take for a finished gate. Each
            # step is synced before the next, so a power cut cannot reorder them either.
            remove_output(directory / MANIFEST_FILE)
            fsync_directory(directory)
            for index, output in enumerate(staged):
                output.file.commit(directory / output.name, sync_directory=index == len(staged) - 1)
            written.commit(directory / MANIFEST_FILE)
        except BaseException:
            written.discard()
            raise


class PrefixOutputs:
    """Outputs under a prefix in object storage: uploads completed in order, the manifest last."""

    redo_unfinished = True  # outputs without a manifest: a gate that died between its steps

    def __init__(self, prefix: ObjectPath):
        self.prefix = prefix

    def lock(self) -> Any:
        return lock_prefix(self.prefix)

    def remove_leftovers(self) -> None:
        abort_unfinished_writes(self.prefix, OUTPUT_FILES)

    def stage(self, name: str, staged: list[Staged]) -> Staged:
        # The upload runs while the split streams; nothing is visible until it is completed.
        output = Staged(name, (self.prefix / name).open("wb"))
        staged.append(output)
        return output

    def publish(self, staged: list[Staged], manifest: bytes) -> None:
        (self.prefix / MANIFEST_FILE).unlink(missing_ok=True)
        for index, output in enumerate(staged):
            output.file.close()  # completes the upload: the object is replaced whole
            staged[index] = Completed(output.name)
        (self.prefix / MANIFEST_FILE).write_bytes(manifest)


class Completed(Staged):
    """An upload already completed: nothing is left to discard."""

    def __init__(self, name: str):
        self.name = name

    def discard(self) -> None:
        pass

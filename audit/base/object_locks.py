"""One gate at a time on an object storage prefix: a lock object written with S3's conditional
write, its holder named, a lock left by a dead process on this host taken over, and the
multipart uploads a killed run left behind aborted."""

from __future__ import annotations

import json
import os
import socket
from typing import Any, Self

from audit.base.errors import InputError
from audit.base.storage import LOCK_FILE, ObjectPath, store_errors


class PrefixLock:
    """One run's lock on an output prefix in object storage: the object `<prefix>/.audit.lock`,
    created only if absent, deleted on release."""

    def __init__(self, path: ObjectPath, token: str):
        self.path = path
        self.token = token
        self.held = True

    def release(self) -> None:
        """Delete the lock object, unless it is no longer this run's (someone removed it and
        another run took it); idempotent."""
        if not self.held:
            return
        self.held = False
        try:
            if _read_holder(self.path).get("token") == self.token:
                self.path.unlink(missing_ok=True)
        except InputError:
            pass  # the store is gone: the lock object says who left it

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def lock_prefix(prefix: ObjectPath, command: str | None = None) -> PrefixLock:
    """Take the lock on the output `prefix` for one run, or raise `OutputInUse` naming the holder.

    The lock is a conditional write (`xb`: S3's `If-None-Match: *`), so of two runs only one
    creates it. Unlike a kernel lock it outlives a killed run: a lock left by a process of this
    host that is gone is taken over; one from another host stays until someone deletes it (the
    error says which object), since nothing here can tell whether that run still lives.
    """
    from audit.base.files import OutputInUse
    from audit.base.holders import holder_record

    path = prefix / LOCK_FILE
    token = os.urandom(16).hex()
    body = json.dumps({**holder_record(command), "token": token}).encode() + b"\n"
    for attempt in range(2):
        try:
            with path.open("xb") as handle:
                handle.write(body)
            return PrefixLock(path, token)
        except FileExistsError:
            holder = _read_holder(path)
            if attempt == 0 and _gone_from_this_host(holder):
                path.unlink(missing_ok=True)
                continue
            raise OutputInUse(_in_use(prefix, path, holder)) from None
    raise OutputInUse(_in_use(prefix, path, _read_holder(path)))


def _in_use(prefix: ObjectPath, path: ObjectPath, holder: dict[str, Any]) -> str:
    from audit.base.holders import describe_holder

    return (
        f"{prefix} is in use by another audit run ({describe_holder(holder or None)}); wait for it "
        f"to finish or stop it; if it is gone, delete {path}"
    )


def _read_holder(path: ObjectPath) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            data = json.loads(handle.read(1 << 16))
    except (InputError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _gone_from_this_host(holder: dict[str, Any]) -> bool:
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def abort_unfinished_writes(prefix: ObjectPath, names: tuple[str, ...]) -> int:
    """Abort the multipart uploads a killed run left for `prefix/NAME` (S3 only; they are not
    visible as objects, but the store keeps and bills their parts). Returns how many."""
    filesystem = prefix.filesystem
    if not hasattr(filesystem, "call_s3"):
        return 0
    wanted = {(prefix / name).key for name in names}
    aborted = 0
    with store_errors(prefix):
        under = f"{prefix.key}/" if prefix.key else ""
        listed = filesystem.call_s3("list_multipart_uploads", Bucket=prefix.bucket, Prefix=under)
        for upload in listed.get("Uploads", []) or []:
            if upload.get("Key") in wanted:
                filesystem.call_s3(
                    "abort_multipart_upload", Bucket=prefix.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                )
                aborted += 1
    return aborted

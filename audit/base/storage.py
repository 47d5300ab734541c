"""Where inputs and outputs live: a local path, or a URL in object storage.

A target, the data root, `gate --out`, a saved report may be a URL (`s3://bucket/prepared/B1`,
`gs://bucket/...`, any protocol fsspec knows): storage is a parameter, not a code path.
`location(spec)` turns what the user typed into a `pathlib.Path` or an `ObjectPath`, and an
`ObjectPath` offers the part of `Path`'s interface the audit uses (`open`, `is_file`, `is_dir`,
`exists`, `stat`, `/`, `name`, `parent`, `iterdir`, `read_bytes`), so the reader, the gate and
the viewers take either without knowing which.

Reads stream: `open("rb")` fetches ranges of the object (8 MB blocks, the next one fetched in
the background while the audit works on the current one), so a file is never downloaded whole
and a shard reads only its byte range. The reader hashes what streams by (sha256).

Nothing here reaches the network unless a URL was named: fsspec and the protocol's package
(`s3fs` for `s3://`, `pip install -e '.[s3]'` in the audit checkout) are imported only for a URL. Credentials and
endpoint come from the protocol's standard environment (for S3: `AWS_ENDPOINT_URL`,
`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_PROFILE`, `AWS_REGION`, ...). Every failure
of the store (no such object, access denied, no credentials, an endpoint that does not answer)
is one `InputError` line naming the URL.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any, Self

from audit.base.errors import ConfigError, InputError

LOCK_FILE = ".audit.lock"  # as a local output's (audit.base.files)
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://(.*)$", re.DOTALL)
# Ranged reads of this size; one more is fetched in the background while the reader works.
READ_BLOCK_BYTES = 8 << 20
# The package each common protocol needs, for the message when it is missing.
# Parts of a write: S3 allows 10,000 parts, so an output may reach 160 GB; memory holds one part.
WRITE_PART_BYTES = 16 << 20
# Variables the protocols' packages read endpoint and credentials from.
_ENVIRONMENT = ("AWS_", "GOOGLE_", "GCS", "AZURE_", "FSSPEC_")
_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}


def is_url(spec: str | os.PathLike[str]) -> bool:
    """Does `spec` name a location in object storage (`PROTOCOL://...`), rather than a local path?

    `file://` URLs are local paths.
    """
    match = _URL.match(str(spec)) if isinstance(spec, str) else None
    return match is not None and match.group(1).lower() != "file"


def location(spec: str | os.PathLike[str] | ObjectPath) -> Path | ObjectPath:
    """What the user typed, as a local `Path` or an `ObjectPath` for a URL."""
    if isinstance(spec, ObjectPath | Path):
        return spec
    text = os.fspath(spec)
    if is_url(text):
        return ObjectPath(text)
    if text.lower().startswith("file://"):
        return Path(text[len("file://") :])
    return Path(text)


@dataclass(frozen=True)
class ObjectStat:
    """What `ObjectPath.stat()` knows: the size, and the store's version tag when it has one."""

    st_size: int
    etag: str | None = None


class ObjectPath:
    """A file or prefix in object storage, named by its URL, with `Path`'s reading interface.

    The key part is kept as given, with no normalisation: a store's key may contain `..` or
    `%2F` as plain characters, so a name joined with `/` is checked to be one plain segment.
    """

    def __init__(self, url: str):
        match = _URL.match(url)
        if not match or match.group(1).lower() == "file":
            raise InputError(f"{url!r} is not an object storage URL (PROTOCOL://BUCKET/KEY)")
        self.protocol = match.group(1).lower()
        self._rest = match.group(2).rstrip("/")
        if not self._rest:
            raise InputError(f"{url!r} names no bucket: give PROTOCOL://BUCKET/KEY")

    # -- naming ---------------------------------------------------------------------------------
    def __str__(self) -> str:
        return f"{self.protocol}://{self._rest}"

    def __repr__(self) -> str:
        return f"ObjectPath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectPath) and str(other) == str(self)

    def __hash__(self) -> int:
        return hash(str(self))

    def __truediv__(self, name: str) -> ObjectPath:
        segments = str(name).split("/")
        for segment in segments:
            if segment in ("", ".", "..") or "\\" in segment:
                raise InputError(f"{name!r} is not a plain name under {self}")
        return ObjectPath(f"{self}/{name}")

    @property
    def name(self) -> str:
        return PurePosixPath(self._rest).name if "/" in self._rest else ""

    @property
    def stem(self) -> str:
        return PurePosixPath(self.name).stem

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    @property
    def parent(self) -> ObjectPath:
        if "/" not in self._rest:
            return self  # the bucket is its own parent, as `/` is
        return ObjectPath(f"{self.protocol}://{self._rest.rsplit('/', 1)[0]}")

    def with_name(self, name: str) -> ObjectPath:
        return self.parent / name

    @property
    def bucket(self) -> str:
        return self._rest.split("/", 1)[0]

    @property
    def key(self) -> str:
        """The object's key within its bucket ('' for the bucket itself)."""
        return self._rest.split("/", 1)[1] if "/" in self._rest else ""

    def resolve(self) -> ObjectPath:
        """A URL is already absolute."""
        return self

    def is_relative_to(self, other: ObjectPath | Path) -> bool:
        """Is this object at or under the prefix `other` (segment by segment)?"""
        return isinstance(other, ObjectPath) and (
            self == other or str(self).startswith(str(other) + "/")
        )

    # -- the store ------------------------------------------------------------------------------
    @property
    def filesystem(self) -> Any:
        """The fsspec filesystem for this URL's protocol (imported on first use)."""
        return _filesystem(self.protocol)

    @property
    def _path(self) -> str:
        # What fsspec calls the path: the URL without its protocol.
        return self._rest

    def _info(self) -> dict[str, Any] | None:
        with store_errors(self):
            try:
                return self.filesystem.info(self._path)
            except FileNotFoundError:
                return None

    def exists(self) -> bool:
        return self._info() is not None

    def is_file(self) -> bool:
        info = self._info()
        return info is not None and info.get("type") == "file"

    def is_dir(self) -> bool:
        info = self._info()
        return info is not None and info.get("type") == "directory"

    def stat(self) -> ObjectStat:
        info = self._info()
        if info is None:
            raise InputError(f"{self}: no such object")
        if info.get("type") != "file":
            raise InputError(f"{self}: a prefix (a directory), not an object")
        etag = info.get("ETag") or info.get("etag") or info.get("generation")
        return ObjectStat(st_size=int(info.get("size") or 0), etag=None if etag is None else str(etag))

    def iterdir(self) -> Iterator[ObjectPath]:
        """The objects and prefixes directly under this prefix."""
        with store_errors(self):
            names = self.filesystem.ls(self._path, detail=False, refresh=True)
        for name in sorted(names):
            child = str(name).rstrip("/").rsplit("/", 1)[-1]
            if child and child not in (".", ".."):
                yield ObjectPath(f"{self}/{child}")

    def open(self, mode: str = "rb") -> _StoreFile:
        """The object as a binary file: `rb` reads ranges as they are asked for; `wb` stores it
        whole when closed (a multipart upload: readers see the old object or the new one, and
        `discard()` stores nothing); `xb` stores it only if no object has this key (a
        conditional write: `FileExistsError` when one has)."""
        if mode not in ("rb", "wb", "xb"):
            raise ValueError(f"ObjectPath.open: mode {mode!r} (rb, wb or xb)")
        with store_errors(self):
            if mode == "rb":
                handle = self.filesystem.open(
                    self._path,
                    "rb",
                    block_size=READ_BLOCK_BYTES,
                    cache_type="background",
                    cache_options={"maxblocks": 2},
                )
            else:
                handle = self.filesystem.open(self._path, mode, block_size=WRITE_PART_BYTES)
        return _StoreFile(handle, self)

    def read_bytes(self) -> bytes:
        with self.open("rb") as handle:
            return handle.read()

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> int:
        with self.open("wb") as handle:
            handle.write(data)
        return len(data)

    def unlink(self, missing_ok: bool = False) -> None:
        with store_errors(self):
            try:
                self.filesystem.rm_file(self._path)
            except FileNotFoundError:
                if not missing_ok:
                    raise


AnyPath = Path | ObjectPath  # a path the tool reads or writes: local, or in object storage


def write_output(path: Path | ObjectPath, content: str | Iterable[bytes]) -> Path | ObjectPath:
    """Write an output whole: on disk atomically (`audit.base.files.write_file`), in object
    storage as one upload that readers see only once it is complete."""
    if not isinstance(path, ObjectPath):
        from audit.base.files import write_file

        return write_file(path, content)
    with path.open("wb") as handle:
        for chunk in [content.encode()] if isinstance(content, str) else content:
            handle.write(chunk)
    return path


def _filesystem(protocol: str) -> Any:
    # The environment decides endpoint and credentials: a changed one gets a new instance.
    settings = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENVIRONMENT)))
    return _filesystem_for(protocol, settings)


@lru_cache(maxsize=8)
def _filesystem_for(protocol: str, settings: tuple[tuple[str, str], ...]) -> Any:
    try:
        import fsspec
    except ImportError:
        raise ConfigError(
            f"{protocol}:// URLs need fsspec and {_PACKAGES.get(protocol, 'its protocol package')}: "
            "pip install -e '.[s3]' in the audit checkout (or pip install fsspec s3fs)"
        ) from None
    try:
        # One instance per protocol and environment: its connections are reused. No listing
        # cache: another writer (or this run's gate) may change a prefix between two looks.
        try:
            return fsspec.filesystem(protocol, skip_instance_cache=True, use_listings_cache=False)
        except TypeError:  # a protocol without a listings cache to turn off
            return fsspec.filesystem(protocol, skip_instance_cache=True)
    except ImportError:
        package = _PACKAGES.get(protocol, f"the fsspec package for {protocol}://")
        extra = " (or pip install -e '.[s3]' in the audit checkout)" if package == "s3fs" else ""
        raise ConfigError(f"{protocol}:// URLs need {package}: pip install {package}{extra}") from None
    except ValueError:
        raise ConfigError(f"{protocol}:// is not a storage protocol fsspec knows") from None


class _StoreFile:
    """A file of the store whose errors are `InputError`s naming the URL, as the open's are."""

    def __init__(self, handle: Any, path: ObjectPath):
        self._handle = handle
        self._path = path

    def read(self, size: int = -1) -> bytes:
        with store_errors(self._path):
            return self._handle.read(size)

    def readinto(self, buffer: Any) -> int:
        with store_errors(self._path):
            return self._handle.readinto(buffer)

    def readable(self) -> bool:
        return self._handle.mode == "rb"

    def readline(self) -> bytes:
        with store_errors(self._path):
            return self._handle.readline()

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line

    def seek(self, offset: int, whence: int = 0) -> int:
        with store_errors(self._path):
            return self._handle.seek(offset, whence)

    def tell(self) -> int:
        return self._handle.tell()

    @property
    def closed(self) -> bool:
        return bool(self._handle.closed)

    def write(self, data: bytes) -> int:
        with store_errors(self._path):
            return self._handle.write(data)

    def flush(self) -> None:
        with store_errors(self._path):
            self._handle.flush()

    def close(self) -> None:
        with store_errors(self._path):
            self._handle.close()

    def discard(self) -> None:
        """Give up a write: nothing is stored (the multipart upload is aborted)."""
        with suppress(Exception):  # best effort: the object was never completed anyway
            self._handle.discard()
        self._handle.closed = True  # so that nothing completes the upload when it is collected

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        if error is not None and self._handle.mode != "rb":
            self.discard()  # a write that failed midway stores nothing
            return
        self.close()


@contextmanager
def store_errors(path: ObjectPath) -> Iterator[None]:
    """Turn a store's failure into one line naming the URL and what to do (`InputError`)."""
    try:
        yield
    except (InputError, ConfigError):
        raise
    except FileExistsError:
        raise
    except FileNotFoundError as exc:
        raise InputError(f"{path}: {_not_found(exc)}") from None
    except IsADirectoryError:
        raise InputError(f"{path}: a prefix (a directory), not an object") from None
    except PermissionError as exc:
        raise InputError(
            f"{path}: access denied ({_first_line(exc)}): check the credentials in the environment "
            f"({_credential_hint(path.protocol)})"
        ) from None
    except Exception as exc:  # noqa: BLE001 - every store error becomes one line, never a traceback
        raise InputError(f"{path}: {_describe(exc, path)}") from None


def _not_found(exc: FileNotFoundError) -> str:
    text = _first_line(exc)
    if "bucket" in text.lower():
        return f"{text.rstrip('.')} (check the bucket name and AWS_ENDPOINT_URL)"
    return "no such object"


def _describe(exc: BaseException, path: ObjectPath) -> str:
    kind = type(exc).__name__
    if kind in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
        return f"no credentials for {path.protocol}://: set {_credential_hint(path.protocol)}"
    if kind in ("EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError", "ConnectionError"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or "the default endpoint"
        return f"cannot reach the object store ({endpoint}): {_first_line(exc)}"
    return f"{kind}: {_first_line(exc)}"


def _credential_hint(protocol: str) -> str:
    if protocol in ("s3", "s3a"):
        return "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
    if protocol in ("gs", "gcs"):
        return "GOOGLE_APPLICATION_CREDENTIALS"
    return f"the credentials {protocol}:// reads from the environment"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]

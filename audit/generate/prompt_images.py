"""The images a prompt sends: read where the dataset names them, checked, hashed, and stored
beside the output so that the written partition holds every image its records name.

A dataset names each image by a path relative to the dataset file's folder (a `datasets`
folder: that folder), an http(s) URL or a data: URI (or bare base64, which SGLang decodes as
one). Reading a row's images (`ImageIntake.read`) refuses the row, with one line, when one of
them is not usable: a path that leads out of the folder, a missing, unreadable or oversized
file, anything Pillow does not read as an image; a profile without `[vision]` refuses every
row with images. A URL is never fetched unless the user asks (`--fetch-images`), then fetched
once a process, checked and hashed; else it goes to the server as given, with no hash.

Sending (`PartitionImages.entries`): a file goes to the server inline, as a data: URI (the
server may be another machine), and is copied into the partition as `images/<sha256><suffix>`,
the `image_data` entry the record keeps (relative to the output's folder, as `audit check`
reads it; one copy per distinct image). URLs and data: URIs are sent and kept as given.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from audit.generate.conversations import Refused
from audit.records.image_paths import path_inside
from audit.records.images import FETCH_MAX_BYTES, ImageRead, fetch_image, image_bytes
from audit.records.inline_images import RAW_BASE64, data_uri, inline_bytes

IMAGES_FOLDER = "images"
_SUFFIX = re.compile(r"\.[a-z0-9]{1,8}")


@dataclass(frozen=True)
class PromptImage:
    """One image of a prompt: as the dataset names it, and what it holds."""

    reference: str  # the dataset's path, URL or data: URI
    kind: str  # "file", "url" or "inline" (a data: URI or bare base64)
    sha256: str | None  # of the image's bytes; None for a URL not fetched
    path: Path | None = None  # a file's resolved path


@dataclass(frozen=True)
class ImageIntake:
    """How a prompts file's images are read: the folder its paths are relative to, whether
    URLs are fetched (`--fetch-images`), and whether the profile takes images at all."""

    folder: Path
    fetch: bool = False
    vision: bool = True

    def read(self, references: tuple[str, ...]) -> tuple[PromptImage, ...] | Refused:
        """Each image read and hashed, or the row's refusal (one line, the first bad image)."""
        if not self.vision:
            return Refused(
                "images_without_vision",
                f"{len(references)} image(s), and the profile has no [vision] table: it cannot send images",
            )
        images = []
        for n, reference in enumerate(references):
            image = self._image(reference)
            if isinstance(image, str):
                return Refused("image_unreadable", f"image {n + 1} {_excerpt(reference)!r}: {image}")
            images.append(image)
        return tuple(images)

    def _image(self, reference: str) -> PromptImage | str:
        lowered = reference[:8].lower()
        if lowered.startswith(("http://", "https://")):
            if not self.fetch:
                return PromptImage(reference, "url", None)
            digest, problem = _fetched_digest(reference)
            return problem if problem is not None else PromptImage(reference, "url", digest)
        if lowered.startswith("data:"):
            return _inline(reference)
        if "://" in reference[:16] or lowered.startswith("file:"):
            return "a URL of a kind not sent: give a path relative to the dataset's folder, an http(s) URL or a data: URI"
        if RAW_BASE64.fullmatch(reference) and not (self.folder / reference).is_file():
            return _inline(reference)
        if reference.startswith("\\") or (len(reference) > 1 and reference[1] == ":"):
            return "an absolute Windows path: give a path relative to the dataset's folder"
        return _file(self.folder, reference)


def _inline(reference: str) -> PromptImage | str:
    data = inline_bytes(reference)
    if isinstance(data, str):
        return data
    problem = image_bytes(data).problem
    return problem if problem else PromptImage(reference, "inline", hashlib.sha256(data).hexdigest())


def _file(folder: Path, reference: str) -> PromptImage | str:
    resolved = path_inside(folder, reference, f"the dataset's folder {folder}", os.path.isabs(reference))
    if isinstance(resolved, str):
        return resolved
    try:
        status = resolved.stat()
    except OSError:
        status = None  # `_bytes` says why
    digest, problem = _file_digest(str(resolved), *((status.st_size, status.st_mtime_ns) if status else (-1, -1)))
    return problem if problem is not None else PromptImage(reference, "file", digest, resolved)


@lru_cache(maxsize=4096)
def _file_digest(path: str, size: int, mtime_ns: int) -> tuple[str | None, str | None]:
    """(the sha256 of the image file, None) or (None, why it is none). Cached by path, size and
    time of change, as the audit's reader is: an image many prompts send, and the same prompts
    read again by the run after its summary, are read and hashed once."""
    data = _bytes(Path(path))
    if isinstance(data, str):
        return None, data
    problem = image_bytes(data).problem
    return (None, problem) if problem else (hashlib.sha256(data).hexdigest(), None)


def _bytes(path: Path) -> bytes | str:
    try:
        if not path.is_file():
            return "not a regular file" if path.exists() else "no such file in the dataset's folder"
        if path.stat().st_size > FETCH_MAX_BYTES:
            return f"a file over {FETCH_MAX_BYTES >> 20} MiB"
        return path.read_bytes()
    except OSError as exc:
        return f"cannot be read ({exc.strerror or type(exc).__name__})"


@lru_cache(maxsize=4096)
def _fetched_digest(url: str) -> tuple[str | None, str | None]:
    """(the sha256 of the image at `url`, None) fetched once a process, or (None, why not)."""
    fetched = fetch_image(url)
    if isinstance(fetched, ImageRead):
        return None, fetched.problem or fetched.unchecked or "could not be fetched"
    problem = image_bytes(fetched).problem
    return (None, problem) if problem else (hashlib.sha256(fetched).hexdigest(), None)


def _excerpt(reference: str) -> str:
    if reference[:5].lower() == "data:":
        return reference.partition(",")[0] + ",..."
    return reference if len(reference) <= 80 else reference[:77] + "..."


class ImageChanged(Exception):
    """An image file changed or went between reading the prompts and sending the prompt."""


class PartitionImages:
    """The images folder of an output: each distinct image file copied in once."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def entries(self, images: tuple[PromptImage, ...]) -> tuple[list[str], list[str]]:
        """(`image_data` of the request, `image_data` of the record), in placeholder order.
        Raises ImageChanged when a file no longer holds the image that was checked."""
        sent: list[str] = []
        kept: list[str] = []
        for image in images:
            if image.kind != "file":
                sent.append(image.reference)
                kept.append(image.reference)
                continue
            assert image.path is not None and image.sha256 is not None
            data = _bytes(image.path)
            if isinstance(data, str) or hashlib.sha256(data).hexdigest() != image.sha256:
                raise ImageChanged(
                    f"image {image.reference!r} changed since the prompts were read"
                    + (f" ({data})" if isinstance(data, str) else "")
                )
            suffix = image.path.suffix.lower()
            name = f"{IMAGES_FOLDER}/{image.sha256}{suffix if _SUFFIX.fullmatch(suffix) else ''}"
            self._store(name, data)
            sent.append(data_uri(data))
            kept.append(name)
        return sent, kept

    def _store(self, name: str, data: bytes) -> None:
        target = self.directory / name
        if target.is_file() and target.stat().st_size == len(data):
            return  # named by its content: already there
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        partial.write_bytes(data)
        os.replace(partial, target)

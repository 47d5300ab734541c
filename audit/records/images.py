"""The images a record sends (`image_data`) and the vision placeholders of its prompt, read once
per batch for the image rules (`audit.checks.images`) and the prompt count (INT005).

Every `image_data` entry is untrusted. A path is read only inside the data file's folder (an
absolute path too, when it leads there): one that leads out of it (absolute, a `..` that climbs
out, or a symlink) is a finding, never opened. An `http(s)` URL is fetched only when the user
asks (`--fetch-images`); else its image is "not checked", and says so. A `data:` URI is decoded
in memory, and so is a bare base64 string, and a `file://` URL is read as the path it names
(both as SGLang reads them). An image is read with Pillow, which tells a real image from an
empty file, an HTML error page saved under an image's name or a truncated PNG.
"""

from __future__ import annotations

import io
import os
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np

from audit.model.families.vision import ResolvedVision, image_tokens, server_counts
from audit.records.image_paths import path_inside
from audit.records.inline_images import RAW_BASE64, inline_bytes
from audit.records.png_size import png_pixels_short

# `--fetch-images`: how long a URL may take to answer, and the most bytes read from it.
FETCH_TIMEOUT = 20
FETCH_MAX_BYTES = 64 << 20

# A PNG's last chunk, IEND, with its checksum: a file cut inside it still verifies.
_PNG_END = b"IEND\xaeB`\x82"


# Images of other formats than PNG are decoded to find one cut short, up to this many pixels.
_DECODED_PIXELS = 50_000_000

# The image parts of a message the Qwen-VL chat templates render as a placeholder
# (`render_content`): a part with an `image` or `image_url` key, or of type "image".
_IMAGE_PART_TYPES = ("image", "image_url")


@dataclass(frozen=True)
class ImageSource:
    """Where a run reads the images its records name: the data file's folder (None when the
    data is in object storage: relative paths are then not checked), and whether `http(s)`
    URLs are fetched (only when the user asks: `--fetch-images`)."""

    folder: Path | None = None
    fetch: bool = False


def image_source(data_file: object, fetch: bool = False) -> ImageSource:
    """Where the images of `data_file` are read: its folder, when it is a local file."""
    folder = data_file.parent if isinstance(data_file, Path) else None
    return ImageSource(folder=folder, fetch=fetch)


@dataclass(frozen=True)
class ImageRead:
    """One `image_data` entry, read: its size, or why it is no usable image, or why it was not
    read at all."""

    size: tuple[int, int] | None = None  # (width, height)
    problem: str | None = None  # not an image the server can take: a finding
    unchecked: str | None = None  # not read (a remote URL): said, never passed silently


def read_image(entry: str, source: ImageSource) -> ImageRead:
    """The image `entry` names, read (see the module docstring for what is refused)."""
    lowered = entry[:8].lower()
    if lowered.startswith(("http://", "https://")):
        if source.fetch:
            return _fetched(entry)
        return ImageRead(unchecked="a remote URL: not fetched (--fetch-images fetches it), so its size and content were not checked")
    if lowered.startswith("data:"):
        return _inline(entry)
    if lowered.startswith("file://"):  # SGLang reads it as the absolute path it names
        entry = unquote(urlparse(entry).path)
        if not entry.startswith("/"):
            return ImageRead(problem="a file: URL with no absolute path")
    elif RAW_BASE64.fullmatch(entry) and not (source.folder is not None and (source.folder / entry).is_file()):
        return _inline(entry)  # SGLang decodes any other string as base64
    elif "://" in entry[:16] or lowered.startswith("file:"):
        return ImageRead(problem="a URL of a kind the audit does not read: give a path relative to the data file's folder, an http(s) URL or a data: URI")
    if source.folder is None:
        return ImageRead(unchecked="a path, and the data file is not in a local folder: not checked")
    if not entry or "\0" in entry:
        return ImageRead(problem="an empty path" if not entry else "a path holding a NUL byte")
    if entry.startswith("\\") or (len(entry) > 1 and entry[1] == ":"):
        return ImageRead(problem="an absolute Windows path: images are read only inside the data file's folder; give a relative path")
    return _from_file(str(source.folder), entry, absolute=os.path.isabs(entry))


def _from_file(folder: str, entry: str, absolute: bool = False) -> ImageRead:
    resolved = path_inside(Path(folder), entry, "the data file's folder", absolute)
    if isinstance(resolved, str):
        return ImageRead(problem=resolved)
    try:
        status = resolved.stat()
    except FileNotFoundError:
        return ImageRead(problem="no such file beside the data file")
    except OSError as exc:
        return ImageRead(problem=f"cannot be read ({exc.strerror or type(exc).__name__})")
    if not resolved.is_file():
        return ImageRead(problem="not a regular file")
    return _read_file(str(resolved), status.st_size, status.st_mtime_ns)


@lru_cache(maxsize=4096)
def _read_file(path: str, size: int, mtime_ns: int) -> ImageRead:
    # Cached by path, size and time of change: an image repeated in many records is read once
    # a process, and one replaced between two audits is read again.
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return ImageRead(problem=f"cannot be read ({exc.strerror or type(exc).__name__})")
    return image_bytes(data)


@lru_cache(maxsize=1024)
def _fetched(url: str) -> ImageRead:
    """The image at `url`, fetched once a process (`--fetch-images`)."""
    fetched = fetch_image(url)
    return fetched if isinstance(fetched, ImageRead) else image_bytes(fetched)


def fetch_image(url: str) -> bytes | ImageRead:
    """The bytes at `url` (`--fetch-images`), or why there are none: only over http(s), its
    redirects too, at most FETCH_MAX_BYTES, within FETCH_TIMEOUT seconds. An HTTP error is a
    problem of the record (it cannot be replayed); a network that does not answer leaves the
    image unchecked, and says why."""
    import urllib.error
    import urllib.request

    opener = urllib.request.OpenerDirector()
    for handler in (urllib.request.HTTPHandler, urllib.request.HTTPSHandler, urllib.request.HTTPRedirectHandler,
                    urllib.request.HTTPErrorProcessor, urllib.request.HTTPDefaultErrorHandler):
        opener.add_handler(handler())
    request = urllib.request.Request(url, headers={"User-Agent": "audit (--fetch-images)"})
    try:
        with opener.open(request, timeout=FETCH_TIMEOUT) as response:
            data = response.read(FETCH_MAX_BYTES + 1)
    except urllib.error.HTTPError as exc:
        return ImageRead(problem=f"the URL answered HTTP {exc.code} ({exc.reason}): no image to train on")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return ImageRead(unchecked=f"a remote URL that could not be fetched ({reason}): not checked")
    if len(data) > FETCH_MAX_BYTES:
        return ImageRead(unchecked=f"a remote image over {FETCH_MAX_BYTES >> 20} MiB: not fetched whole, not checked")
    return data


def _inline(entry: str) -> ImageRead:
    data = inline_bytes(entry)
    return ImageRead(problem=data) if isinstance(data, str) else image_bytes(data)


def image_bytes(data: bytes) -> ImageRead:
    """The size of the image `data` holds, or why it is none: empty, not an image format
    (an HTML page), or cut short."""
    if not data:
        return ImageRead(problem="an empty file, not an image")
    from PIL import Image, UnidentifiedImageError  # imported only when a record sends images

    if data.lstrip()[:1] == b"<":
        return ImageRead(problem="markup (an HTML or XML page), not an image: a failed download?")
    limit = Image.MAX_IMAGE_PIXELS
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # A huge image is a real one (the processor scales it down): its size is read from
            # the header, and its pixels are never decoded when the format lets them be checked
            # otherwise, so Pillow's decompression-bomb guard has nothing to guard here.
            Image.MAX_IMAGE_PIXELS = None
            with Image.open(io.BytesIO(data)) as image:
                size = image.size
                if image.format == "PNG":
                    image.verify()  # every chunk and its checksum, without decoding the pixels
                    if data.rfind(_PNG_END) == -1:
                        return ImageRead(problem="a PNG with no end chunk (IEND): cut short?")
                    if (short := png_pixels_short(data, size)) is not None:
                        return ImageRead(problem=short)
                elif size[0] * size[1] <= _DECODED_PIXELS:
                    image.load()  # other formats: decoded whole, which finds a cut-short file
    except UnidentifiedImageError:
        return ImageRead(problem="not an image format Pillow (and so the server) can read")
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        return ImageRead(problem=f"a damaged image ({str(exc) or type(exc).__name__}): cut short?")
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    if size[0] <= 0 or size[1] <= 0:
        return ImageRead(problem=f"an image of size {size[0]}x{size[1]}")
    return ImageRead(size=size)


@dataclass(frozen=True)
class VisionLayout:
    """A prompt's vision tokens: its placeholders and what is wrong with their shape."""

    placeholders: int  # spans start, pad(s), end
    pads_in_spans: int
    expanded_at: int | None  # the second pad of the first span holding more than one
    unbalanced: tuple[int, str] | None  # where the spans first stop making sense, and how
    stray_pad_at: int | None  # the first pad outside any span
    pads: int = 0  # every pad, inside a span or not


def vision_layout(ids: np.ndarray, vision: ResolvedVision) -> VisionLayout:
    """Walk the vision ids of one prompt (only those positions: a prompt holds few)."""
    pads = vision.pads
    at = np.flatnonzero(np.isin(ids, vision.ids))
    placeholders = pads_in_spans = 0
    expanded_at = stray_at = None
    unbalanced: tuple[int, str] | None = None
    open_at: int | None = None
    inside = 0
    for position in at.tolist():
        token = int(ids[position])
        if token == vision.start:
            if open_at is not None and unbalanced is None:
                unbalanced = (position, "a vision start inside an open vision span")
            open_at, inside = position, 0
        elif token == vision.end:
            if open_at is None:
                if unbalanced is None:
                    unbalanced = (position, "a vision end with no vision start before it")
                continue
            if inside == 0 and unbalanced is None:
                unbalanced = (position, "a vision span with no image pad")
            elif position - open_at - 1 != inside and unbalanced is None:
                unbalanced = (open_at, "a vision span holding ids other than its pads")
            placeholders += inside > 0
            open_at = None
        elif token in pads:
            if open_at is None:
                stray_at = position if stray_at is None else stray_at
                continue
            inside += 1
            pads_in_spans += 1
            if inside == 2 and expanded_at is None:
                expanded_at = position
    if open_at is not None and unbalanced is None:
        unbalanced = (open_at, "a vision start never closed")
    pad_count = int(np.isin(ids[at], pads).sum()) if len(at) else 0
    return VisionLayout(placeholders, pads_in_spans, expanded_at, unbalanced, stray_at, pad_count)


def message_images(prompt: dict[str, Any] | None) -> list[Any] | None:
    """The image parts of a record's `messages` in order (each the part), or None when the
    record has no messages."""
    if prompt is None or not isinstance(prompt.get("messages"), list):
        return None
    parts = []
    for message in prompt["messages"]:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if isinstance(part, dict) and (
                any(key in part for key in _IMAGE_PART_TYPES) or part.get("type") == "image"
            ):
                parts.append(part)
    return parts


def typed_count(prompt: dict[str, Any] | None, text: str) -> int | None:
    """How often `text` (a placeholder token's string) is typed in the record's messages, as
    text content or text parts; None when the record has no messages."""
    if prompt is None or not isinstance(prompt.get("messages"), list):
        return None
    count = 0
    for message in prompt["messages"]:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            count += content.count(text)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    count += part["text"].count(text)
    return count


def part_reference(part: dict[str, Any]) -> str | None:
    """The image a message part names (`image`, or `image_url` as a string or `{url}`), if any."""
    value = part.get("image")
    if isinstance(value, str):
        return value
    url = part.get("image_url")
    if isinstance(url, dict):
        url = url.get("url")
    return url if isinstance(url, str) else None


def expanded_counts(layout: VisionLayout, prompt_length: int, reads: list[ImageRead],
                    vision: ResolvedVision) -> frozenset[int] | None:
    """The prompt lengths a server may count once each placeholder is expanded to its image's
    tokens (on the file's size, or after SGLang's own pre-resize), or None when they cannot be
    known: an image not read, placeholders that do not match the images, or one refused."""
    if layout.placeholders != len(reads) or layout.expanded_at is not None or layout.unbalanced is not None:
        return None
    sizes = [read.size for read in reads if read.size is not None]
    if len(sizes) != len(reads):
        return None
    direct: list[int] = []
    pre: list[int | None] = []
    for width, height in sizes:
        counts = server_counts(width, height, vision.settings)
        if counts is None:
            return None
        direct.append(counts[0])
        pre.append(counts[1])
    base = prompt_length - layout.pads_in_spans
    # A server counts every image of a request the same way: each on its file's size, or each
    # after its own pre-resize (where that refuses an image, the request has no such count).
    lengths = {base + sum(direct)}
    if all(n is not None for n in pre):
        lengths.add(base + sum(n for n in pre if n is not None))
    return frozenset(lengths)


def excerpt(entry: str) -> str:
    """An `image_data` entry for a message: a data: URI by its header, anything long cut."""
    if entry[:5].lower() == "data:":
        return entry.partition(",")[0] + ",…"
    return entry if len(entry) <= 80 else entry[:79] + "…"


def image_chips(ids: np.ndarray, vision: ResolvedVision, entries: list[str] | None,
                source: ImageSource) -> dict[int, str]:
    """What `audit inspect` and the HTML show for each vision span of a prompt, in one chip at
    its first pad: the image it stands for (the `image_data` entry of its place), the image's
    size and N, the tokens the server expands it to; or why they are not known."""
    entries = entries or []
    chips: dict[int, str] = {}
    at = np.flatnonzero(np.isin(ids, vision.ids)).tolist()
    number = 0
    open_at: int | None = None
    pads: list[int] = []
    for position in at:
        token = int(ids[position])
        if token == vision.start:
            open_at, pads = position, []
        elif token in vision.pads and open_at is not None:
            pads.append(position)
        elif token == vision.end and open_at is not None and pads:
            chips[pads[0]] = _chip(number, entries, source, vision, len(pads))
            number += 1
            open_at = None
    return chips


def _chip(number: int, entries: list[str], source: ImageSource, vision: ResolvedVision, pads: int) -> str:
    return f"[{_chip_text(number, entries, source, vision, pads)}]"


def _chip_text(number: int, entries: list[str], source: ImageSource, vision: ResolvedVision, pads: int) -> str:
    head = f"image {number + 1}"
    if pads > 1:
        head += f" ({pads} pads: expanded already)"
    if number >= len(entries):
        return f"{head} · no image_data entry"
    entry = entries[number]
    read = read_image(entry, source)
    if read.size is None:
        return f"{head} · {excerpt(entry)} · {read.problem or read.unchecked}"
    width, height = read.size
    tokens = image_tokens(width, height, vision.settings)
    count = "refused by the processor" if tokens is None else f"N={tokens} tokens"
    return f"{head} · {excerpt(entry)} · {width}x{height} · {count}"

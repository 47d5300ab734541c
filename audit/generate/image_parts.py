"""The images of a dataset row: where its conversation places them, and which image each is.

Two shapes of multimodal rows are read (no file is opened here: `audit.generate.prompt_images`
reads what these name):

- ShareGPT-4V / LLaVA: an `image` (one) or `images` (a list) column beside ShareGPT
  `conversations`, and an `<image>` tag in a turn's text where each image goes, one tag an
  image, in order. The tags are only placeholders when the row has an image column.
- OpenAI: `messages` whose content is a list of parts: `{"type": "text", "text": ...}`,
  `{"type": "image_url", "image_url": {"url": ...}}` (or the URL as a string),
  `{"type": "image", "image": ...}`, or a bare `{"type": "image"}` that takes the next image
  of the row's `images` (or `image`) column.

An image is named by a string (a path, an http(s) URL, a data: URI) or given as a `datasets`
Image (`{"bytes": ..., "path": ...}`, as a Parquet or Arrow table holds one, in the image column
or in an image part): its bytes become a data: URI, or, with none, its path names the file.

Each image becomes a `{"type": "image"}` part of the message, the part the Qwen-VL chat
templates render as one placeholder, so the rendered prompt holds one placeholder per image,
in the order of `Normalised.images`. What cannot be read so is an `ImagePartError`, which the
row's normalisation turns into a refusal; nothing here raises anything else on a row's content.
"""

from __future__ import annotations

from typing import Any

from audit.records.inline_images import data_uri

IMAGE_COLUMNS = ("images", "image")
IMAGE_TAG = "<image>"
# The key an image part carries its reference under until `take_images` strips it.
_REFERENCE = "image"
_SHOWN = 60


class ImagePartError(Exception):
    """A row's images cannot be read as placed images: the kind (a REFUSALS key) and why."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, dict | list) else f"a {type(value).__name__}"
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


class ImageColumn:
    """The row's image column, handed out in order to the places that take one."""

    def __init__(self, row: dict[str, Any]) -> None:
        given = [c for c in IMAGE_COLUMNS if row.get(c) is not None]
        if len(given) > 1:
            raise ImagePartError("bad_image", "both `images` and `image` are given: keep one image column")
        self.column = given[0] if given else None
        value = row.get(self.column) if self.column else None
        entries = [value] if isinstance(value, str | dict) else value
        if entries is not None and not isinstance(entries, list):
            raise ImagePartError(
                "bad_image", f"`{self.column}` must be an image reference or a list of them, got {_shown(value)}"
            )
        # Read now, before the row's values are measured: a `datasets` Image's bytes, which JSON
        # cannot hold, become a data: URI.
        self.entries: list[Any] = [image_value(entry, f"`{self.column}`[{n}]") for n, entry in enumerate(entries or [])]
        self.taken = 0

    @property
    def tags(self) -> bool:
        """Do `<image>` tags in text place images? (Only when the row has an image column.)"""
        return self.column is not None

    def take(self, where: str) -> str:
        if self.taken >= len(self.entries):
            raise ImagePartError(
                "image_mismatch",
                f"{where} places image {self.taken + 1} but `{self.column or 'images'}` holds "
                f"{len(self.entries)}",
            )
        entry = self.entries[self.taken]
        self.taken += 1
        return reference(entry, f"`{self.column}`[{self.taken - 1}]")

    def finish(self) -> None:
        """Every image of the column must have its place."""
        if self.taken < len(self.entries):
            raise ImagePartError(
                "image_mismatch",
                f"`{self.column}` holds {len(self.entries)} images but the conversation places "
                f"{self.taken} (one `<image>` tag or image part each)",
            )


def reference(value: Any, where: str) -> str:
    """An image reference as the row gives it: a path, an http(s) URL or a data: URI."""
    if isinstance(value, str) and value.strip() and "\0" not in value:
        return value
    if isinstance(value, dict):
        return reference(value.get("url"), f"{where}.url") if set(value) <= {"url", "detail"} else _refuse(value, where)
    return _refuse(value, where)


# A `datasets` Image as a Parquet or Arrow table holds it: `{"bytes": the image file's bytes,
# "path": its file name}`, or `{"bytes": null, "path": a file beside the dataset}`.
_IMAGE_FEATURE = frozenset({"bytes", "path"})


def image_value(value: Any, where: str) -> Any:
    """What an image place holds, with a `datasets` Image read: its bytes as a data: URI (sent
    and kept inline, as a dataset's own data: URI is), or, with no bytes, its path. Anything
    else is left for `reference` to judge."""
    if not (isinstance(value, dict) and value and set(value) <= _IMAGE_FEATURE):
        return value
    data = value.get("bytes")
    if data is None:
        if value.get("path") is None:
            raise ImagePartError("bad_image", f"{where} is a `datasets` Image with no bytes and no path")
        return reference(value.get("path"), f"{where}.path")
    if not isinstance(data, bytes | bytearray) or not data:
        raise ImagePartError(
            "bad_image", f"{where}.bytes must hold the image file's bytes (a `datasets` Image), got {_shown(data)}"
        )
    return data_uri(bytes(data))


def read_image_features(column: str, turns: list[Any]) -> None:
    """Each `datasets` Image an image part of the turns holds (`{"type": "image", "image":
    {"bytes", "path"}}`), read in place as the column's are (`image_value`), before the row's
    values are measured."""
    for n, turn in enumerate(turns):
        content = turn.get("content") if isinstance(turn, dict) else None
        for k, part in enumerate(content if isinstance(content, list) else []):
            for key in ("image", "image_url") if isinstance(part, dict) else ():
                if key in part:
                    part[key] = image_value(part[key], f"{column}[{n}].content[{k}].{key}")


def _refuse(value: Any, where: str) -> str:
    raise ImagePartError(
        "bad_image",
        f"{where} must name an image (a path, an http(s) URL or a data: URI), got {_shown(value)}",
    )


def tagged_text(where: str, text: str, images: ImageColumn) -> str | list[dict[str, Any]]:
    """A turn's text with `<image>` tags as parts (the text when it has none, or when the row
    has no image column: a tag is text then)."""
    if not images.tags or IMAGE_TAG not in text:
        return text
    pieces = text.split(IMAGE_TAG)
    parts: list[dict[str, Any]] = []
    for n, piece in enumerate(pieces):
        if n:
            parts.append({"type": "image", _REFERENCE: images.take(where)})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def content_parts(where: str, content: list[Any], images: ImageColumn) -> list[dict[str, Any]]:
    """A list of OpenAI content parts: text parts as they are, image parts placed."""
    parts: list[dict[str, Any]] = []
    for n, part in enumerate(content):
        at = f"{where}.content[{n}]"
        if not isinstance(part, dict):
            raise ImagePartError("bad_content", f"{at} must be a content part (an object), got {_shown(part)}")
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append(part)
        elif kind == "image_url" or (kind is None and "image_url" in part):
            parts.append({"type": "image", _REFERENCE: reference(part.get("image_url"), f"{at}.image_url")})
        elif kind == "image" or (kind is None and "image" in part):
            given = part.get("image")
            ref = images.take(at) if given is None else reference(given, f"{at}.image")
            parts.append({"type": "image", _REFERENCE: ref})
        else:
            raise ImagePartError(
                "bad_content",
                f"{at} is neither text nor an image ({_shown(part)}); only text and images are sent",
            )
    return parts


def take_images(messages: list[dict[str, Any]]) -> tuple[str, ...]:
    """The images the messages place, in order; each image part left as `{"type": "image"}`,
    the part the chat template renders as a placeholder."""
    found: list[str] = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for n, part in enumerate(content):
            if part.get("type") == "image" and _REFERENCE in part:
                found.append(part[_REFERENCE])
                content[n] = {"type": "image"}
    return tuple(found)

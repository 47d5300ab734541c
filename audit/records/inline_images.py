"""An image inline in the data: a `data:` URI, or bare base64 (which SGLang decodes as one),
read into its bytes and written from them."""

from __future__ import annotations

import base64
import binascii
import re

# An image_data string SGLang 0.5.23 decodes as base64 (`srt/utils/common.py::get_image_bytes`:
# any string that is no URL, data: URI or absolute path): of the base64 alphabet only (no
# file suffix) and long, and no file of that name beside the data.
RAW_BASE64 = re.compile(r"[A-Za-z0-9+/]{64,}={0,2}")


def inline_bytes(entry: str) -> bytes | str:
    """The bytes an inline image holds (a `data:` URI, or bare base64, which SGLang decodes as
    one), or why there are none."""
    payload, problem = entry, "base64 that does not decode"
    if entry[:5].lower() == "data:":
        header, comma, payload = entry.partition(",")
        if not comma:
            return "a data: URI with no ',' before its data"
        if not header.lower().endswith(";base64"):
            return "a data: URI that is not base64 (SGLang decodes base64 images only)"
        problem = "a data: URI holding base64 that does not decode"
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return problem


# The media type a data: URI names, by the image's first bytes (SGLang decodes the base64 whatever
# the URI names; the audit reads the bytes themselves).
_MEDIA_TYPES = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif"),
                (b"BM", "image/bmp"))


def data_uri(data: bytes) -> str:
    """`data` as a base64 data: URI (what `inline_bytes` reads back), named by its format."""
    media = next((kind for magic, kind in _MEDIA_TYPES if data.startswith(magic)), None)
    if media is None:
        media = "image/webp" if data[:4] == b"RIFF" and data[8:12] == b"WEBP" else "application/octet-stream"
    return f"data:{media};base64,{base64.b64encode(data).decode('ascii')}"

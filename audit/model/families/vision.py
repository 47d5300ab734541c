"""Images in a prompt: a family's vision tokens (the profile's `[vision]` table), the image
processor's settings (the checkpoint's `preprocessor_config.json`), and how many tokens one
image becomes on the server.

A token-in/token-out record carries one unexpanded placeholder per image in `input_ids`
(Qwen: `<|vision_start|><|image_pad|><|vision_end|>`) and the images in `image_data`. SGLang
(`multimodal/processors/base_processor.py`, `qwen_vl.py`) decodes the ids, runs the model's
processor on the text and the images, and expands each pad to N tokens:
`grid_h * grid_w / merge_size**2`, the grid being the image's size after the processor's
`smart_resize` divided by `patch_size`. `meta_info.prompt_tokens` counts the expanded prompt.

The arithmetic is transformers' (5.25, `models/qwen2_vl/image_processing_pil_qwen2_vl.py`:
`smart_resize`, `get_number_of_image_patches`; the image processor of Qwen2-VL, Qwen3-VL and
Qwen3.5, `models/auto/image_processing_auto.py`), re-done here so that no processor, torch or
model weights are needed; `tests/test_vision.py` compares it with transformers' own. GLM-4.xV
(`resize = "glm4v"`) resizes its own way (`models/glm4v/image_processing_pil_glm4v.py` and
`models/glm46v/`, the same `smart_resize`): a side under one factor is first scaled up to it,
and the pixel clamps bound the area of `temporal_patch_size` frames (an image is one frame
repeated), not of one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from audit.base.config import expect, reject_unknown
from audit.base.errors import ConfigError

PROCESSOR_CONFIG = "preprocessor_config.json"

# transformers' smart_resize refuses an image whose long side is over 200 times its short one.
MAX_ASPECT_RATIO = 200

# Earlier SGLang releases' Qwen-VL processor resized each image before the model's processor
# saw it (`multimodal/processors/qwen_vl.py`: `resize_image` with IMAGE_FACTOR 28, MIN_PIXELS
# 4*28*28 and MAX_PIXELS `SGLANG_IMAGE_MAX_PIXELS`, default 16384*28*28, in `environ.py`), so
# such a server counts an image from that size rather than the file's; SGLang 0.5.23 keeps that
# `smart_resize` for videos only and counts images on the file's size. Both counts are a server's.
SGLANG_QWEN_FACTOR = 28
SGLANG_QWEN_MIN_PIXELS = 4 * 28 * 28
SGLANG_QWEN_MAX_PIXELS = 16384 * 28 * 28

_VISION_KEYS = {"start", "end", "image_pad", "video_pad", "processor"}
_PROCESSOR_KEYS = {"patch_size", "merge_size", "min_pixels", "max_pixels"}
_OPTIONAL_PROCESSOR_KEYS = {"resize", "temporal_patch_size"}
# How the processor resizes an image: transformers' Qwen2-VL `smart_resize` (Qwen2-VL, Qwen3-VL,
# Qwen3.5/3.6), or GLM-4.xV's (`Glm4vImageProcessor`, `Glm46VImageProcessor`).
RESIZES = ("qwen2-vl", "glm4v")


@dataclass(frozen=True)
class ProcessorSettings:
    """What decides an image's token count: patch and merge size, and the pixel clamps."""

    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    source: str  # where they were read: the folder's preprocessor_config.json, or the profile
    resize: str = "qwen2-vl"  # one of RESIZES: the family's processor, never a file's
    temporal_patch_size: int = 2  # frames an image is repeated to (the glm4v clamps count them)

    @property
    def factor(self) -> int:
        """Both sides of a resized image are multiples of this (`patch_size * merge_size`)."""
        return self.patch_size * self.merge_size


@dataclass(frozen=True)
class VisionSpec:
    """A family's vision tokens by string, and its processor's settings when the tokenizer
    folder has no `preprocessor_config.json`."""

    start: str
    end: str
    image_pad: str
    video_pad: str | None
    defaults: ProcessorSettings

    def resolve(self, token: Callable[[str], int], directory: Path | None) -> ResolvedVision:
        """The ids in the tokenizer in use (`token` raises ConfigError for a missing one) and
        the processor settings of its folder."""
        return ResolvedVision(
            spec=self,
            start=token(self.start),
            end=token(self.end),
            image_pad=token(self.image_pad),
            video_pad=token(self.video_pad) if self.video_pad else None,
            settings=processor_settings(directory, self.defaults),
        )


@dataclass(frozen=True)
class ResolvedVision:
    """The vision tokens as ids in the tokenizer in use, and the processor's settings."""

    spec: VisionSpec
    start: int
    end: int
    image_pad: int
    video_pad: int | None
    settings: ProcessorSettings

    @property
    def ids(self) -> tuple[int, ...]:
        """Every vision id: none of them is ever a model's output."""
        return tuple(i for i in (self.start, self.end, self.image_pad, self.video_pad) if i is not None)

    @property
    def pads(self) -> tuple[int, ...]:
        """The ids the server expands (image and video pads)."""
        return tuple(i for i in (self.image_pad, self.video_pad) if i is not None)


def parse_vision(table: Any, where: str) -> VisionSpec | None:
    """The profile's `[vision]` table, or None when the family has no vision tokens."""
    if table is None:
        return None
    where = f"{where}: [vision]"
    expect(table, dict, where)
    reject_unknown(table, _VISION_KEYS, where)
    for key in ("start", "end", "image_pad"):
        if not isinstance(table.get(key), str) or not table[key]:
            raise ConfigError(f"{where}: `{key}` must name the token, as a string")
    video = table.get("video_pad")
    if video is not None:
        expect(video, str, f"{where}: video_pad")
    processor = expect(table.get("processor"), dict, f"{where}.processor")
    return VisionSpec(
        start=table["start"],
        end=table["end"],
        image_pad=table["image_pad"],
        video_pad=video,
        defaults=_settings(processor, f"{where}.processor", source=where),
    )


def _positive(value: Any, where: str) -> int:
    expect(value, int, where)
    if value <= 0:
        raise ConfigError(f"{where}: must be a positive integer, got {value}")
    return int(value)


def _settings(table: dict[str, Any], where: str, *, source: str) -> ProcessorSettings:
    reject_unknown(table, _PROCESSOR_KEYS | _OPTIONAL_PROCESSOR_KEYS, where)
    missing = sorted(_PROCESSOR_KEYS - set(table))
    if missing:
        raise ConfigError(f"{where}: needs {', '.join(missing)}")
    values = {key: _positive(table[key], f"{where}.{key}") for key in _PROCESSOR_KEYS}
    resize = table.get("resize", "qwen2-vl")
    if resize not in RESIZES:
        raise ConfigError(f"{where}.resize: must be one of {', '.join(RESIZES)}, got {resize!r}")
    temporal = _positive(table.get("temporal_patch_size", 2), f"{where}.temporal_patch_size")
    return _checked(ProcessorSettings(**values, source=source, resize=resize, temporal_patch_size=temporal), where)


def _checked(settings: ProcessorSettings, where: str) -> ProcessorSettings:
    if settings.min_pixels > settings.max_pixels:
        raise ConfigError(
            f"{where}: min_pixels {settings.min_pixels} is above max_pixels {settings.max_pixels}"
        )
    return settings


def processor_settings(directory: Path | None, defaults: ProcessorSettings) -> ProcessorSettings:
    """The settings of `directory/preprocessor_config.json` where the checkpoint ships one,
    each missing key taken from `defaults`; else `defaults`.

    As transformers reads them (`Qwen2VLImageProcessor.__init__`): `size.shortest_edge` and
    `size.longest_edge` are the pixel clamps, and top-level `min_pixels` / `max_pixels`, the
    older spelling, override them.
    """
    path = directory / PROCESSOR_CONFIG if directory is not None else None
    if path is None or not path.is_file():
        return defaults
    where = str(path)
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ConfigError(f"{where}: cannot be read as JSON ({exc}): fix or remove it") from None
    expect(data, dict, where)
    size = data.get("size") or {}
    expect(size, dict, f"{where}: size")
    values = {
        "patch_size": _first(data.get("patch_size"), defaults.patch_size),
        "merge_size": _first(data.get("merge_size"), defaults.merge_size),
        "min_pixels": _first(data.get("min_pixels"), size.get("shortest_edge"), defaults.min_pixels),
        "max_pixels": _first(data.get("max_pixels"), size.get("longest_edge"), defaults.max_pixels),
        "temporal_patch_size": _first(data.get("temporal_patch_size"), defaults.temporal_patch_size),
    }
    checked = {key: _positive(value, f"{where}: {key}") for key, value in values.items()}
    return _checked(ProcessorSettings(**checked, source=where, resize=defaults.resize), where)


def _first(*values: Any) -> Any:
    """The first value that is set (a JSON null counts as not set, as transformers reads it)."""
    return next(value for value in values if value is not None)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int] | None:
    """(height, width) after the processor's resize: sides rounded to multiples of `factor`,
    the area clamped to [min_pixels, max_pixels], the aspect ratio kept as near as may be.
    None when the processor refuses the image (aspect ratio over 200, or a side of 0)."""
    if height <= 0 or width <= 0 or max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        return None
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def glm4v_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int,
                 frames: int) -> tuple[int, int] | None:
    """(height, width) after GLM-4.xV's resize (transformers' `glm4v` `smart_resize`, an image
    being `frames` = `temporal_patch_size` copies of itself): a side under `factor` is scaled up
    to it first (truncated to an integer), then the sides are rounded to multiples of `factor`
    with `frames` times the area clamped to [min_pixels, max_pixels]. None when refused."""
    if height <= 0 or width <= 0:
        return None
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if min(height, width) <= 0 or max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        return None
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if frames * h_bar * w_bar > max_pixels:
        beta = math.sqrt((frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif frames * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def image_tokens(width: int, height: int, settings: ProcessorSettings) -> int | None:
    """N, the tokens one image of this size expands to: `grid_h * grid_w / merge_size**2`.
    None when the processor refuses the image."""
    if settings.resize == "glm4v":
        resized = glm4v_resize(height, width, settings.factor, settings.min_pixels, settings.max_pixels,
                               settings.temporal_patch_size)
    else:
        resized = smart_resize(height, width, settings.factor, settings.min_pixels, settings.max_pixels)
    if resized is None:
        return None
    grid_h, grid_w = resized[0] // settings.patch_size, resized[1] // settings.patch_size
    return grid_h * grid_w // settings.merge_size**2


def sglang_qwen_size(width: int, height: int) -> tuple[int, int] | None:
    """(width, height) after SGLang's own resize in its Qwen-VL processor, which runs before the
    model's processor (its `smart_resize` first rounds each side up to at least one factor)."""
    if height <= 0 or width <= 0 or max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        return None
    factor = SGLANG_QWEN_FACTOR
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > SGLANG_QWEN_MAX_PIXELS:
        beta = math.sqrt((height * width) / SGLANG_QWEN_MAX_PIXELS)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < SGLANG_QWEN_MIN_PIXELS:
        beta = math.sqrt(SGLANG_QWEN_MIN_PIXELS / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return w_bar, h_bar


def server_counts(width: int, height: int, settings: ProcessorSettings) -> tuple[int, int | None] | None:
    """The N a server gives this image: (on the file's size, after SGLang's own Qwen-VL
    pre-resize, None when that resize refuses it); None when the model's processor refuses
    the file's size. A server counts every image of a request the same one of the two ways.
    SGLang's GLM-4.xV processor (`multimodal/processors/glm4v.py`) resizes no image itself:
    the file's size is the only count."""
    direct = image_tokens(width, height, settings)
    if direct is None:
        return None
    if settings.resize == "glm4v":
        return direct, None
    pre = sglang_qwen_size(width, height)
    return direct, (image_tokens(pre[0], pre[1], settings) if pre is not None else None)

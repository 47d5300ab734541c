"""`generation.json`: how a partition's data was made, written and read here only.

`audit generate` writes it beside the output; `audit check`, `gate`, `inspect` and `watch`
read it (through `audit.flows.targets`), so a bare `audit check NAME` knows how to audit the data.
Its fields (JSON object; a reader needs none of them):

| key | type | |
|---|---|---|
| `profile` | string | a built-in profile name, or the absolute path of a profile file |
| `tokenizer` | object or string | `{path, vocab_size, sha256}` (`path` relative to the partition), or a path |
| `trust_remote_code` | bool | whether the generator loaded the tokenizer with remote code |
| `thinking` | bool or `"mixed"` | the thinking mode prompts were rendered with; `"mixed"`: both, each record's shown by its prompt's ending |
| `sampling_params` | object | exactly what was sent with every request |
| `prompts` | string | the prompts file |
| `servers` | list | per server: `url`, `model_path`, `tokenizer_path` as it reported them |
| `image_processor` | object | when prompts send images: `patch_size`, `merge_size`, `min_pixels`, `max_pixels` the server's processor counts each image's tokens with, and `source` (the tokenizer folder's `preprocessor_config.json`, relative to the partition, or the profile's `[vision.processor]`) |
| `skipped_prompt_lines` | object | with `--skip-bad-lines`: `count`, and `lines` (`line`, `reason`) of the first 100 |
| `generator`, `tool` | | what wrote the file |
| `started_at`, `updated_at` | string | UTC times of the first and the latest run into the partition |

A value of the wrong type is a configuration error naming the file and key, never coerced
(`bool("false")` is True).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from audit.base.errors import ConfigError, InputError
from audit.base.files import write_file
from audit.base.storage import AnyPath, ObjectPath
from audit.model.families.thinking_modes import MIXED, ThinkingMode
from audit.model.families.vision import ProcessorSettings

GENERATION_FILE = "generation.json"
# Settings that must match between a run and the run it resumes: mixing two configurations in
# one partition is silent corruption.
_RESUME_KEYS = ("profile", "thinking", "sampling_params")
# The processor settings that decide an image's tokens: a resumed run must count the same.
_PROCESSOR_KEYS = ("patch_size", "merge_size", "min_pixels", "max_pixels")
# What the audit reads, by key: accepted types and how to say them in an error line.
_READ_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "profile": ((str,), "a string"),
    "thinking": ((bool, str), 'true, false or "mixed"'),
    "trust_remote_code": ((bool,), "true or false"),
    "tokenizer": ((str, dict), 'a path or {"path": ...}'),
}


@dataclass(frozen=True)
class GenerationManifest:
    """A partition's generation.json as the audit reads it; every field None when not recorded."""

    path: AnyPath | None = None  # None: the partition has no generation.json
    profile: str | None = None
    thinking: ThinkingMode | None = None
    trust_remote_code: bool | None = None
    tokenizer_path: Path | None = None  # resolved against the partition directory
    tokenizer_fingerprint: dict[str, Any] | None = None  # sha256, vocab_size when recorded
    data: dict[str, Any] = field(default_factory=dict)  # the whole object as written


def read_manifest(directory: Path | ObjectPath) -> GenerationManifest:
    """The generation.json in `directory`, checked; an empty manifest when there is none.

    Raises InputError when the file is not a JSON object, ConfigError when a field the audit
    reads has the wrong type.
    """
    path = directory / GENERATION_FILE
    if not path.is_file():
        return GenerationManifest()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc}); fix or remove it") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    for key, (types, shown) in _READ_TYPES.items():
        value = data.get(key)
        if value is not None and not isinstance(value, types):
            raise ConfigError(f"{path}: {key} must be {shown}, got {value!r}; fix or remove it")
    if isinstance(data.get("thinking"), str) and data["thinking"] != MIXED:
        raise ConfigError(f'{path}: thinking must be true, false or "mixed", got {data["thinking"]!r}; fix or remove it')
    tokenizer = data.get("tokenizer")
    recorded_path = tokenizer.get("path") if isinstance(tokenizer, dict) else tokenizer
    return GenerationManifest(
        path=path,
        profile=data.get("profile"),
        thinking=data.get("thinking"),
        trust_remote_code=data.get("trust_remote_code"),
        tokenizer_path=_tokenizer_path(directory, recorded_path),
        tokenizer_fingerprint=tokenizer if isinstance(tokenizer, dict) else None,
        data=data,
    )


def _tokenizer_path(directory: AnyPath, recorded: object) -> Path | None:
    """The recorded tokenizer directory, resolved against the partition's directory.

    A tokenizer is loaded from a local directory: for a partition in object storage only an
    absolute recorded path means one (a relative one would point into the store).
    """
    if not isinstance(recorded, str):
        return None
    if not isinstance(directory, Path):
        return Path(recorded) if Path(recorded).is_absolute() else None
    return (directory / recorded).resolve()


def build_manifest(
    *,
    directory: Path,
    profile: str,
    tokenizer_fingerprint: dict[str, Any],
    tokenizer_directory: Path,
    trust_remote_code: bool,
    thinking: bool,
    sampling_params: dict[str, Any],
    prompts: Path,
    servers: list[dict[str, Any]],
    version: str,
) -> dict[str, Any]:
    """The generation.json of a run writing into `directory` (times are added when written)."""
    tokenizer_path = str(tokenizer_directory.resolve())
    with contextlib.suppress(ValueError):  # another drive: keep it absolute
        tokenizer_path = os.path.relpath(tokenizer_path, directory.resolve())
    return {
        "profile": profile,
        "tokenizer": {**tokenizer_fingerprint, "path": tokenizer_path},
        "trust_remote_code": trust_remote_code,
        "thinking": thinking,
        "sampling_params": sampling_params,
        "prompts": str(prompts),
        "servers": servers,
        "generator": "audit generate",
        "tool": {"name": "audit", "version": version},
    }


def processor_record(settings: ProcessorSettings, directory: Path) -> dict[str, Any]:
    """The image processor's settings as generation.json records them (`source` a path relative
    to the partition when they were read from a file)."""
    source = settings.source
    if Path(source).is_file():
        with contextlib.suppress(ValueError):
            source = os.path.relpath(Path(source).resolve(), directory.resolve())
    return {**{key: getattr(settings, key) for key in _PROCESSOR_KEYS}, "source": source}


def check_resumable(directory: Path, manifest: dict[str, Any]) -> None:
    """Refuse to append to data made with other settings (profile, thinking, sampling, tokenizer)."""
    previous = read_manifest(directory)
    if previous.path is None:
        return
    differences = [
        f"{key} {previous.data[key]!r} -> {manifest[key]!r}"
        for key in _RESUME_KEYS
        if key in previous.data and previous.data[key] != manifest[key]
    ]
    old, new = previous.data.get("image_processor"), manifest.get("image_processor")
    if isinstance(old, dict) and isinstance(new, dict) and any(old.get(k) != new[k] for k in _PROCESSOR_KEYS):
        differences.append("image_processor " + ", ".join(f"{k} {old.get(k)!r} -> {new[k]!r}" for k in _PROCESSOR_KEYS if old.get(k) != new[k]))
    old_hash = (previous.tokenizer_fingerprint or {}).get("sha256")
    if old_hash and old_hash != manifest["tokenizer"]["sha256"]:
        differences.append(
            f"tokenizer sha256 {str(old_hash)[:12]}… -> {manifest['tokenizer']['sha256'][:12]}…"
        )
    if differences:
        raise ConfigError(
            f"{previous.path} records other settings than this run ({'; '.join(differences)}): "
            "resuming would mix two configurations in one partition; use the same settings or "
            "another --out"
        )


def write_manifest(directory: Path, manifest: dict[str, Any]) -> Path:
    """Write generation.json atomically, keeping the first run's start time."""
    path = directory / GENERATION_FILE
    try:
        started = read_manifest(directory).data.get("started_at")
    except (InputError, ConfigError):
        started = None  # a broken file from elsewhere is replaced by this run's
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    data = {
        **manifest,
        "started_at": started if isinstance(started, str) else now,
        "updated_at": now,
    }
    write_file(path, json.dumps(data, ensure_ascii=False, indent=2) + "\n")
    return path

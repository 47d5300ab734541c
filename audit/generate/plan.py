"""What a run is asked to do, and everything about it checked before the first request.

`plan_generation(GenerateOptions(...))` validates the options, the prompts file (every row:
`plan.prompt_summary` says what was read, normalised, dropped and refused), the rule set, tokenizer and profile, recovers the output of an earlier run and refuses to
resume one made with other settings. Any problem is an AuditError (exit 2) here, before a
server is contacted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from audit import __version__
from audit.base.destinations import same_file
from audit.base.errors import ConfigError, InputError
from audit.base.files import OutputLock, lock_output
from audit.checks.ruleset import RuleSet, load_rule_set
from audit.generate.datasets_in import BadLine
from audit.generate.manifest import (
    GENERATION_FILE,
    build_manifest,
    check_resumable,
    processor_record,
)
from audit.generate.output import ERRORS_FILE, Resumed, recover_output
from audit.generate.prompt_images import ImageIntake
from audit.generate.prompts import PromptSummary, image_intake, summarise_prompts
from audit.model.families.profiles import ResolvedProfile, load_profile
from audit.model.rendering.templating import get_renderer
from audit.model.tokens.tokenizer import Tokenizer
from audit.model.tokens.tokenizer_loading import load_tokenizer


@dataclass(frozen=True)
class GenerateOptions:
    """What the user asked for. Unset `temperature`/`top_p` are not sent: the model's defaults apply."""

    prompts: Path
    out: Path
    servers: tuple[str, ...]
    tokenizer: Path
    profile: str
    trust_remote_code: bool = False
    thinking: bool = True
    concurrency: int = 64
    long_concurrency: int = 8
    long_threshold: int = 8192
    max_new_tokens: int = 16384
    temperature: float | None = None
    top_p: float | None = None
    limit: int | None = None
    canary: int = 16
    rules: Path | None = None
    timeout: float = 3600.0
    max_attempts: int = 10
    retry_backoff: float = 0.5
    retry_backoff_cap: float = 30.0
    fsync_interval: float = 2.0
    split: str | None = None  # the split of a DatasetDict folder of prompts (default train)
    skip_bad_lines: bool = False  # skip (count, report) JSONL lines that are not JSON objects
    fetch_images: bool = False  # fetch the images prompts name by URL, to check and hash them


@dataclass
class GenerationPlan:
    """A run ready to start: configuration loaded, prompts validated, output recovered."""

    options: GenerateOptions
    tokenizer: Tokenizer
    profile: ResolvedProfile
    rule_set: RuleSet
    prompt_keys: list[str]
    resumed: Resumed
    sampling_params: dict[str, Any]
    manifest: dict[str, Any]
    # Held from planning (which may cut a crash's partial line) to the end of the run.
    lock: OutputLock | None = field(default=None, repr=False)
    # What reading the prompts found: rows, normalisations, refusals (printed before the run).
    prompt_summary: PromptSummary | None = None
    # How the prompts' images are read (the run reads them again as it sends them).
    images: ImageIntake | None = None

    @property
    def pending(self) -> int:
        return sum(1 for key in self.prompt_keys if key not in self.resumed.keys)

    @property
    def errors_path(self) -> Path:
        return self.options.out.parent / ERRORS_FILE

    @property
    def manifest_path(self) -> Path:
        return self.options.out.parent / GENERATION_FILE


def sampling_params(options: GenerateOptions, profile: ResolvedProfile) -> dict[str, Any]:
    """The `sampling_params` sent with every request: only keys SGLang documents.

    `skip_special_tokens: false` and `no_stop_trim: true` keep `text` equal to the decoding of
    `output_ids` (the ids themselves are never affected); the end-of-turn ids are passed
    explicitly, because a server's config may not list them among its EOS ids.
    """
    params: dict[str, Any] = {
        "max_new_tokens": options.max_new_tokens,
        "stop_token_ids": list(profile.end_of_turn),
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "no_stop_trim": True,
    }
    if options.temperature is not None:
        params["temperature"] = options.temperature
    if options.top_p is not None:
        params["top_p"] = options.top_p
    return params


def _server_url(url: str) -> bool:
    """Is `url` an http(s) URL with a host and a valid port?"""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return False
    return (
        parsed.scheme in ("http", "https")
        and bool(parsed.host)
        and (parsed.port is None or 0 < parsed.port < 65536)
    )


def plan_generation(options: GenerateOptions) -> GenerationPlan:
    """Check everything that can be checked offline; raise an AuditError (exit 2) on any problem."""
    for url in options.servers:
        if not _server_url(url):
            raise ConfigError(f"--server {url}: expected a URL such as http://127.0.0.1:30000")
    if not options.servers:
        raise ConfigError("no --server given: name at least one SGLang server URL")
    for name in ("concurrency", "long_concurrency", "max_new_tokens", "max_attempts"):
        if getattr(options, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
    if options.canary < 0 or (options.limit is not None and options.limit < 1):
        raise ConfigError("--canary must be 0 or more and --limit at least 1")
    if not (options.timeout > 0 and options.retry_backoff >= 0):  # also refuses nan
        raise ConfigError("--timeout must be more than 0 seconds and --retry-backoff 0 or more")
    if options.temperature is not None and not (0 <= options.temperature < math.inf):
        raise ConfigError(f"--temperature must be 0 or more, got {options.temperature}")
    if options.top_p is not None and not (0 < options.top_p <= 1):
        raise ConfigError(f"--top-p must be in (0, 1], got {options.top_p}")
    if options.out.is_dir():
        raise ConfigError(
            f"--out {options.out} is a directory; name the output file, e.g. {options.out / 'raw_responses.jsonl'}"
        )
    if options.out.exists() and same_file(options.out, options.prompts):
        # Resuming would read the prompts as samples, and appending would write into them (a
        # hard link to the prompts is the prompts too).
        raise ConfigError(
            f"--out {options.out} is the prompts file itself; name another output file"
        )
    # Image rows are refused for a profile without [vision]: known before any tokenizer loads.
    images = image_intake(options.prompts, options.fetch_images, load_profile(options.profile).vision is not None)
    try:
        prompt_summary = summarise_prompts(
            options.prompts, options.limit, options.split, options.skip_bad_lines, images
        )
    except BadLine as bad:
        raise InputError(f"{bad}; --skip-bad-lines skips such lines, reporting each") from None
    rule_set = load_rule_set(options.rules)
    tokenizer = load_tokenizer(options.tokenizer, trust_remote_code=options.trust_remote_code)
    profile = load_profile(options.profile).resolve(tokenizer, thinking=options.thinking)
    renderer = get_renderer(profile.prompt_renderer)
    if not renderer.available(tokenizer):
        raise ConfigError(
            f"the tokenizer at {tokenizer.directory} has no {renderer.requirement}: prompts "
            f"cannot be rendered for profile {profile.name}; pass the served model's tokenizer directory"
        )
    params = sampling_params(options, profile)
    # One run per output directory: two would send and write every prompt twice.
    lock = lock_output(options.out.resolve().parent)
    try:
        extra: dict[str, Any] = {}
        if prompt_summary.images and profile.vision is not None:
            extra["image_processor"] = processor_record(profile.vision.settings, options.out.parent)
        resumed, manifest = _recover(options, tokenizer, profile, params, extra)
        if options.skip_bad_lines:
            manifest["skipped_prompt_lines"] = prompt_summary.skipped_record()
    except BaseException:
        lock.release()
        raise
    return GenerationPlan(
        options,
        tokenizer,
        profile,
        rule_set,
        prompt_summary.keys,
        resumed,
        params,
        manifest,
        lock,
        prompt_summary,
        images,
    )


def _recover(
    options: GenerateOptions,
    tokenizer: Tokenizer,
    profile: ResolvedProfile,
    params: dict[str, Any],
    extra: dict[str, Any],
) -> tuple[Resumed, dict[str, Any]]:
    """The earlier run's output, recovered, and this run's manifest, checked against its own."""
    resumed = recover_output(options.out)
    manifest = build_manifest(
        directory=options.out.parent,
        profile=profile.name
        if str(options.profile) == profile.name
        else str(Path(options.profile).resolve()),
        tokenizer_fingerprint=tokenizer.fingerprint.to_dict(),
        tokenizer_directory=tokenizer.directory,
        trust_remote_code=options.trust_remote_code,
        thinking=options.thinking,
        sampling_params=params,
        prompts=options.prompts,
        servers=[{"url": url} for url in options.servers],
        version=__version__,
    )
    manifest.update(extra)  # the image processor's settings, when prompts send images
    if resumed.keys:
        check_resumable(options.out.parent, manifest)
    return resumed, manifest

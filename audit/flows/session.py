"""What to audit with: a target's rule set, tokenizer and profile, every configuration error
raised before anything is audited.

    session = prepare(resolve_target("B1_glaive", root), CheckOptions(profile="kimi-k2.5"))

A `Session` is what every command that audits starts from (`audit.flows.checking.check_session`,
`audit.flows.gating.gate_session`, `audit.flows.watching.LiveAudit`); the worker processes of `--jobs` each
prepare their own from the same target and options.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import orjson

from audit.base.errors import ConfigError
from audit.checks.ruleset import RuleSet, load_rule_set
from audit.flows.targets import Target
from audit.generate.prompts import PromptSummary, load_prompts
from audit.model.families.profiles import Profile, ResolvedProfile, load_profile
from audit.model.families.thinking_modes import MIXED, ThinkingMode, parse_thinking
from audit.model.tokens.tokenizer import Tokenizer
from audit.model.tokens.tokenizer_loading import load_tokenizer
from audit.model.trainers.installed_trainer import TrainerJob, installed_trainer, trainer_job
from audit.model.trainers.trainer_rules import resolve_trainer
from audit.records.batch import AuditContext
from audit.records.images import image_source
from audit.records.sources import DEFAULT_BLOCK_BYTES, first_line


@dataclass(frozen=True)
class CheckOptions:
    """What the user chose; unset values come from the partition's generation.json."""

    profile: str | None = None
    tokenizer: Path | None = None
    trust_remote_code: bool = False
    thinking: ThinkingMode | None = None  # True, False, or MIXED: each record in its prompt's mode
    rules: Path | None = None
    block_bytes: int = DEFAULT_BLOCK_BYTES
    jobs: int = 1  # worker processes over shards of each file (audit.flows.parallel)
    engine: str = "local"  # "local" (this process, or --jobs processes) or "ray" (audit.flows.cluster)
    shard_bytes: int | None = None  # Ray: the size of a task's byte range (None: sized to the cluster)
    cache: bool = True  # reuse the result of an identical earlier audit (audit.flows.cache)
    cache_dir: Path | None = None  # default: $AUDIT_CACHE_DIR or .audit-cache/
    prompts: Path | None = None  # the source of each prompt: a prompts file (audit.generate.prompts)
    # The trainer view (`--trainer NAME[:TEMPLATE]`): the trainer whose preprocessing to model,
    # the max_length it cuts at (None: the trainer's default), and whether to run its rules only.
    trainer: str | None = None
    trainer_max_length: int | None = None
    trainer_only: bool = False
    # The trainer's own Python (`--trainer-python`): its own code runs there, beside the model.
    trainer_python: Path | None = None
    trainer_timeout: float | None = None  # seconds over one answer of it (None: PYTHON_TIMEOUT)
    # The server whose reply shape the conversations follow where vLLM's and SGLang's differ
    # (audit.model.trainers.trainer_rules.REPLY_SHAPES; None: vLLM's).
    trainer_reply_shape: str | None = None
    # Fetch the images records name by http(s) URL (`--fetch-images`); never otherwise.
    fetch_images: bool = False


@dataclass
class Session:
    """A target with everything needed to audit it, all configuration errors already raised."""

    target: Target
    context: AuditContext
    rule_set: RuleSet
    options: CheckOptions
    # What reading `--prompts` found (rows refused or normalised), when it was given.
    prompt_summary: PromptSummary | None = None

    @property
    def profile(self) -> ResolvedProfile:
        return self.context.profile

    @property
    def tokenizer(self) -> Tokenizer:
        return self.context.tokenizer


_TOKENIZERS: dict[tuple[Path, bool], Tokenizer] = {}


def shared_tokenizer(path: Path, trust_remote_code: bool) -> Tokenizer:
    """The tokenizer in `path`, loaded once per process: the partitions of one run share it."""
    key = (path.resolve(), trust_remote_code)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = load_tokenizer(path, trust_remote_code=trust_remote_code)
    return _TOKENIZERS[key]


_SESSIONS: dict[tuple[str, str, CheckOptions], Session] = {}
_SESSIONS_KEPT = 8


def worker_session(target: Target, options: CheckOptions) -> Session:
    """The session of `target` and `options`, prepared once per process and kept.

    What a worker that audits shard after shard starts from (a Ray task's process, a `--jobs`
    process): its tokenizer, profile and rule set are loaded by its first shard only. The last
    few sessions are kept, for the partitions of one `--all` run.
    """
    key = (target.partition, str(target.data_file), options)
    session = _SESSIONS.get(key)
    if session is None:
        if len(_SESSIONS) >= _SESSIONS_KEPT:
            _SESSIONS.pop(next(iter(_SESSIONS)))
        session = _SESSIONS[key] = prepare(target, options)
    return session


def prepare(target: Target, options: CheckOptions) -> Session:
    """Load the rule set, tokenizer and profile for `target`; raise ConfigError on any problem."""
    if options.trainer is None and (
        options.trainer_only
        or options.trainer_max_length is not None
        or options.trainer_python is not None
        or options.trainer_reply_shape is not None
    ):
        raise ConfigError("the trainer view needs a trainer: pass --trainer specforge[:TEMPLATE] or --trainer speculators")
    if options.trainer_timeout is not None and options.trainer_python is None:
        raise ConfigError("--trainer-timeout is the time-out of --trainer-python's process: pass both, or neither")
    rule_set = load_rule_set(
        options.rules,
        options=frozenset({"trainer"}) if options.trainer else frozenset(),
        only="trainer" if options.trainer_only else None,
    )
    generation = target.generation

    tokenizer_dir = options.tokenizer or generation.tokenizer_path
    recorded = generation.data.get("tokenizer")
    recorded = recorded.get("path") if isinstance(recorded, dict) else recorded
    if tokenizer_dir is None and target.remote and isinstance(recorded, str):
        raise ConfigError(
            f"{generation.path} records the tokenizer as a path relative to the partition, which is "
            "in object storage; a tokenizer is loaded from a local directory: pass --tokenizer DIR"
        )
    if tokenizer_dir is None:
        raise ConfigError(
            f"no tokenizer for {target.data_file}: pass --tokenizer DIR (a local Hugging Face "
            "tokenizer directory), or record it in the partition's generation.json"
        )
    _refuse_recorded_trust(target, options, tokenizer_dir)
    if options.tokenizer is None and not tokenizer_dir.exists():
        raise ConfigError(
            f"{generation.path} records tokenizer {tokenizer_dir}, which does not exist: "
            "pass --tokenizer DIR, or fix the path in generation.json"
        )
    tokenizer = shared_tokenizer(tokenizer_dir, options.trust_remote_code)
    _check_fingerprint(target, tokenizer)

    profile_name = options.profile or generation.profile
    if not profile_name:
        raise ConfigError(
            f"no profile for {target.data_file}: pass --profile NAME (see `audit profiles`) "
            "or record it in the partition's generation.json"
        )
    thinking = parse_thinking(options.thinking, "the thinking option")
    family = load_profile(str(profile_name))
    if thinking is None:
        thinking = generation.thinking if generation.thinking is not None else default_thinking(family)
    profile = family.resolve(tokenizer, thinking=thinking)
    prompts, prompt_summary = None, None
    if options.prompts is not None:
        prompt_summary = PromptSummary(options.prompts)
        prompts = load_prompts(options.prompts, summary=prompt_summary)
    trainer = None
    if options.trainer is not None:
        trainer = resolve_trainer(
            options.trainer, profile=profile.name, thinking=thinking, max_length=options.trainer_max_length,
            reply_shape=options.trainer_reply_shape or "vllm",
        )
        if options.trainer_python is not None:
            trainer = dataclasses.replace(trainer, python=options.trainer_python.absolute())
            if options.trainer_timeout is not None:
                trainer = dataclasses.replace(trainer, python_timeout=options.trainer_timeout)
            # Started now: a Python without the trainer is a configuration error before any reading.
            installed_trainer(cast(TrainerJob, trainer_job(trainer, tokenizer)))
    return Session(
        target=target,
        context=AuditContext(
            profile, tokenizer, prompts=prompts, trainer=trainer, images=image_source(target.data_file, fetch=options.fetch_images)
        ),
        rule_set=rule_set,
        options=options,
        prompt_summary=prompt_summary,
    )


def _refuse_recorded_trust(target: Target, options: CheckOptions, tokenizer_dir: Path) -> None:
    """Remote code runs only when the user asks for it, never because a data file says so.

    generation.json is part of the data: it may record that the tokenizer needed its own code
    when the data was generated, but only `--trust-remote-code` (`CheckOptions.trust_remote_code`)
    lets that code run here. Recorded and not asked for: a configuration error, before any load.
    """
    if target.generation.trust_remote_code is True and not options.trust_remote_code:
        raise ConfigError(
            f"{target.generation.path} records trust_remote_code: true, but the tokenizer's own code "
            f"runs only when you ask: pass --trust-remote-code if you trust {tokenizer_dir}, or set it "
            "to false in generation.json if that tokenizer needs no code"
        )


def _check_fingerprint(target: Target, tokenizer: Tokenizer) -> None:
    """A tokenizer other than the one the data records is a configuration error, not findings.

    The fingerprint may be recorded in the partition's generation.json (`tokenizer`) or in the
    data itself: a `tokenizer` object on the first record, as some generators write it.
    """
    actual = tokenizer.fingerprint
    for where, recorded in _recorded_fingerprints(target):
        expected_hash = recorded.get("sha256")
        expected_size = recorded.get("vocab_size")
        if expected_hash and expected_hash != actual.sha256:
            raise ConfigError(
                f"tokenizer mismatch: {where} records tokenizer "
                f"sha256 {str(expected_hash)[:12]}…, but {actual.path} hashes to {actual.sha256[:12]}…; "
                "audit with the tokenizer the data was generated with"
            )
        if isinstance(expected_size, int) and expected_size and expected_size != actual.vocab_size:
            raise ConfigError(
                f"tokenizer mismatch: {where} records a vocabulary of {expected_size} ids, "
                f"but {actual.path} has {actual.vocab_size}; audit with the tokenizer the data was "
                "generated with"
            )


def _recorded_fingerprints(target: Target) -> list[tuple[str, dict]]:
    """(where, fingerprint) pairs the partition records: generation.json, then the first record."""
    found = []
    recorded = target.generation.tokenizer_fingerprint
    if recorded is not None:
        found.append((str(target.generation.path), recorded))
    try:
        first = orjson.loads(first_line(target.data_file) or b"")
    except (OSError, orjson.JSONDecodeError):
        return found  # an unreadable first line is the reader's finding, not a fingerprint
    if isinstance(first, dict) and isinstance(first.get("tokenizer"), dict):
        found.append((f"line 1 of {target.data_file}", first["tokenizer"]))
    return found


def default_thinking(profile: Profile) -> ThinkingMode:
    """The mode a run audits when neither `--thinking` nor generation.json says: on, or both
    at once for a family whose prompt itself says its mode (`tokens.thinking_token`, Gemma-4's
    `<|think|>`): each record is then judged in the mode its own prompt was rendered in."""
    both = {"thinking", "no_thinking"} <= set(profile.prompt_suffixes)
    return MIXED if profile.thinking_token is not None and both else True

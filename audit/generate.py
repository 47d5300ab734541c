"""The generator: prompts to SGLang's native `/generate` as raw ids, every prompt exactly once.

Faithful by construction: each prompt is rendered with the tokenizer's own chat template into
ids, the ids are sent verbatim as `input_ids` (never text, never the OpenAI chat endpoint,
never a parser), and `input_ids`, `output_ids`, `text` and `meta_info` are saved exactly as
the server returned them, one JSON object per line, beside the source `messages`/`tools`.

Exactly once: the output is append-only, one flushed line per finished sample. A run that
starts on an existing output resumes it: a partial last line left by a crash is cut off and
ids already written are skipped. Stopping (Ctrl-C) cancels the requests in flight between two
writes, so no line is ever half-written.

The canary: the first N prompts of a run are sent alone; their responses are audited with
the profile's rule set (the same engine as `audit check`) before the rest are sent, so a
broken pipeline stops in its first minute instead of after the GPU hours are spent.

The core knows nothing of terminals: it reports through a `GenerationEvents` object.

    plan = plan_generation(GenerateOptions(...))
    result = asyncio.run(Generator(plan, events).run())
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import random
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import polars as pl

from audit import __version__
from audit.batch import AuditContext
from audit.engine import audit_file
from audit.errors import AuditError, ConfigError, InputError
from audit.files import write_atomically
from audit.profiles import ResolvedProfile, load_profile
from audit.report import Report, build_report
from audit.ruleset import RuleSet, load_rule_set
from audit.targets import GENERATION_FILE
from audit.tokenizer import Tokenizer, load_tokenizer

ERRORS_FILE = "errors.jsonl"
# Status codes that say "try again later" although they are 4xx.
_TRANSIENT_4XX = frozenset({408, 425, 429})
# Prompts rendered per batched tokenizer call.
_RENDER_CHUNK = 64
# Settings that must match between a run and the run it resumes: mixing two configurations in
# one partition is silent corruption.
_RESUME_KEYS = ("profile", "thinking", "sampling_params")


class ServerError(AuditError):
    """No server can be used (none answers /health)."""


# -- options and prompts ------------------------------------------------------------------


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


@dataclass(frozen=True)
class Prompt:
    """One line of the prompts file."""

    line: int
    id: str | int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None

    @property
    def key(self) -> str:
        return str(self.id)


def _parse_prompt(path: Path, line: int, raw: bytes) -> Prompt:
    where = f"{path}:{line}"
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(
            f"{where}: not valid JSON ({exc}); each line must be one JSON object"
        ) from None
    if not isinstance(value, dict):
        raise InputError(
            f"{where}: expected a JSON object with id and messages, got a {type(value).__name__}"
        )
    prompt_id = value.get("id")
    if isinstance(prompt_id, bool) or not isinstance(prompt_id, str | int) or prompt_id == "":
        raise InputError(
            f"{where}: needs an `id` (a non-empty string or an integer), got {prompt_id!r}"
        )
    messages = value.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InputError(f"{where}: needs `messages`, a non-empty list of chat messages")
    for n, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InputError(f"{where}: messages[{n}] must be an object with a `role` string")
    tools = value.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise InputError(
            f"{where}: `tools` must be a list of tool definitions, got {type(tools).__name__}"
        )
    return Prompt(line=line, id=prompt_id, messages=messages, tools=tools or None)


def _prompt_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if raw.strip():
                yield number, raw


def iter_prompts(path: Path, limit: int | None = None) -> Iterator[Prompt]:
    """The prompts of a JSONL file in order, validated, at most `limit` of them."""
    for count, (number, raw) in enumerate(_prompt_lines(path)):
        if limit is not None and count >= limit:
            return
        yield _parse_prompt(path, number, raw)


def scan_prompts(path: Path, limit: int | None = None) -> list[str]:
    """Validate the prompts file before any request; return the prompt keys in order.

    Raises an InputError naming the line of the first bad line or repeated id.
    """
    if not path.is_file():
        raise InputError(
            f"{path}: no such prompts file (JSONL with id, messages and optional tools)"
        )
    first_seen: dict[str, int] = {}
    for prompt in iter_prompts(path, limit):
        if prompt.key in first_seen:
            raise InputError(
                f"{path}:{prompt.line}: id {prompt.id!r} repeats line {first_seen[prompt.key]}; "
                "every prompt needs its own id"
            )
        first_seen[prompt.key] = prompt.line
    if not first_seen:
        raise InputError(f"{path}: no prompts in the file")
    return list(first_seen)


# -- the output file ----------------------------------------------------------------------


@dataclass(frozen=True)
class Resumed:
    """What an existing output already holds."""

    keys: frozenset[str]
    lines: int
    truncated_bytes: int  # a partial last line cut off


def recover_output(path: Path) -> Resumed:
    """Make `path` end on a whole line (cutting a crash's partial line) and list the ids in it."""
    if not path.exists():
        return Resumed(frozenset(), 0, 0)
    if path.is_dir():
        raise InputError(f"--out {path} is a directory; name the output file")
    size = path.stat().st_size
    not_ours = "not a sample this generator wrote (no JSON object with an id); pass another --out, or move the file away"
    with path.open("rb") as handle:
        # Find the end of the last whole line by reading backwards from the end.
        end = size
        while end > 0:
            start = max(0, end - (1 << 16))
            handle.seek(start)
            chunk = handle.read(end - start)
            cut = chunk.rfind(b"\n")
            if cut != -1:
                end = start + cut + 1
                break
            end = start
        if end < size:
            handle.seek(end)
            if not handle.read(1) == b"{":
                raise InputError(f"{path}:{_line_count(path, end) + 1}: {not_ours}")
    keys: set[str] = set()
    lines = 0
    # Every whole line is checked before the partial one is cut: a file that is not ours is left intact.
    with path.open("rb") as handle:
        read = 0
        for number, raw in enumerate(handle, start=1):
            read += len(raw)
            if read > end:
                break
            lines = number
            if not raw.strip():
                continue
            try:
                value = orjson.loads(raw)
                key = str(value["id"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                raise InputError(f"{path}:{number}: {not_ours}") from None
            keys.add(key)
    truncated = size - end
    if truncated:
        with path.open("rb+") as handle:
            handle.truncate(end)
            handle.flush()
            os.fsync(handle.fileno())
    return Resumed(frozenset(keys), lines, truncated)


def _line_count(path: Path, end: int) -> int:
    with path.open("rb") as handle:
        return handle.read(end).count(b"\n")


class ResponseLog:
    """The append-only output: one line per sample, flushed at once, fsync'd every few seconds."""

    def __init__(self, path: Path, fsync_interval: float):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._handle = path.open("ab")
        self._fsync_interval = fsync_interval
        self._synced = time.monotonic()

    def append(self, line: bytes) -> None:
        """Write one whole line. Synchronous on purpose: no task switch can happen mid-line."""
        self._handle.write(line)
        self._handle.flush()
        if time.monotonic() - self._synced >= self._fsync_interval:
            self.sync()

    def sync(self) -> None:
        os.fsync(self._handle.fileno())
        self._synced = time.monotonic()

    def close(self) -> None:
        if not self._handle.closed:
            self._handle.flush()
            self.sync()
            self._handle.close()


# -- the plan: everything checked before the first request --------------------------------


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


def plan_generation(options: GenerateOptions) -> GenerationPlan:
    """Check everything that can be checked offline; raise an AuditError (exit 2) on any problem."""
    for url in options.servers:
        if not url.startswith(("http://", "https://")):
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
    if options.out.exists() and options.out.resolve() == options.prompts.resolve():
        # Resuming would read the prompts as samples, and appending would write into them.
        raise ConfigError(f"--out {options.out} is the prompts file itself; name another output file")
    prompt_keys = scan_prompts(options.prompts, options.limit)
    rule_set = load_rule_set(options.rules)
    tokenizer = load_tokenizer(options.tokenizer, trust_remote_code=options.trust_remote_code)
    profile = load_profile(options.profile).resolve(tokenizer, thinking=options.thinking)
    params = sampling_params(options, profile)
    resumed = recover_output(options.out)
    manifest = _manifest(options, tokenizer, profile, params)
    if resumed.keys:
        _check_resumable(options.out.parent / GENERATION_FILE, manifest)
    return GenerationPlan(
        options, tokenizer, profile, rule_set, prompt_keys, resumed, params, manifest
    )


def _manifest(
    options: GenerateOptions, tokenizer: Tokenizer, profile: ResolvedProfile, params: dict[str, Any]
) -> dict[str, Any]:
    """generation.json: how the data was made, so `audit check <partition>` knows how to audit it."""
    directory = options.out.parent.resolve()
    tokenizer_path = str(tokenizer.directory.resolve())
    try:
        tokenizer_path = os.path.relpath(tokenizer_path, directory)
    except ValueError:  # another drive: keep it absolute
        pass
    fingerprint = tokenizer.fingerprint.to_dict()
    fingerprint["path"] = tokenizer_path
    return {
        "profile": profile.name
        if str(options.profile) == profile.name
        else str(Path(options.profile).resolve()),
        "tokenizer": fingerprint,
        "trust_remote_code": options.trust_remote_code,
        "thinking": options.thinking,
        "sampling_params": params,
        "prompts": str(options.prompts),
        "servers": [{"url": url} for url in options.servers],
        "generator": "audit generate",
        "tool": {"name": "audit", "version": __version__},
    }


def _check_resumable(path: Path, manifest: dict[str, Any]) -> None:
    """Refuse to append to data made with other settings (profile, thinking, sampling, tokenizer)."""
    if not path.is_file():
        return
    try:
        previous = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        return
    if not isinstance(previous, dict):
        return
    differences = [
        f"{key} {previous[key]!r} -> {manifest[key]!r}"
        for key in _RESUME_KEYS
        if key in previous and previous[key] != manifest[key]
    ]
    old_hash = (
        previous.get("tokenizer", {}).get("sha256")
        if isinstance(previous.get("tokenizer"), dict)
        else None
    )
    if old_hash and old_hash != manifest["tokenizer"]["sha256"]:
        differences.append(
            f"tokenizer sha256 {old_hash[:12]}… -> {manifest['tokenizer']['sha256'][:12]}…"
        )
    if differences:
        raise ConfigError(
            f"{path} records other settings than this run ({'; '.join(differences)}): resuming would "
            "mix two configurations in one partition; use the same settings or another --out"
        )


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Write generation.json atomically, keeping the first run's start time."""
    previous: dict[str, Any] = {}
    if path.is_file():
        try:
            previous = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            previous = {}
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    data = {
        **manifest,
        "started_at": previous.get("started_at", now) if isinstance(previous, dict) else now,
    }
    data["updated_at"] = now
    write_atomically(path, json.dumps(data, ensure_ascii=False, indent=2) + "\n")


def render_prompts(
    tokenizer: Tokenizer, prompts: list[Prompt], *, thinking: bool
) -> list[list[int]]:
    """The chat template's rendering of each prompt as ids, with the generation prompt.

    Same as `Tokenizer.render_prompt` (render to text, then encode with special-token strings
    recognised and nothing added), with one batched encode for many prompts. The thinking
    switch is passed under both names templates use: `thinking` (Kimi, DeepSeek-V3.1) and
    `enable_thinking` (Qwen3); a template ignores the one it does not read.
    """
    texts = [
        tokenizer.hf.apply_chat_template(
            prompt.messages,
            tools=prompt.tools,
            add_generation_prompt=True,
            tokenize=False,
            thinking=thinking,
            enable_thinking=thinking,
        )
        for prompt in prompts
    ]
    return tokenizer.encode_batch(texts)


# -- talking to servers ---------------------------------------------------------------------


@dataclass
class ServerProbe:
    """What a server said about itself at start."""

    url: str
    healthy: bool
    problem: str | None = None
    model_path: str | None = None
    tokenizer_path: str | None = None
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "model_path": self.model_path,
            "tokenizer_path": self.tokenizer_path,
        }


def _path_name(path: str) -> str:
    return Path(path.rstrip("/")).name.lower()


# Probe requests get a few tries: a server under load (or still loading) may answer 503 once.
_PROBE_ATTEMPTS = 4


async def _probe_get(client: httpx.AsyncClient, url: str, backoff: float) -> httpx.Response | str:
    """GET with a few quick retries on 5xx and connection errors; the response, or why none came."""
    problem = ""
    for attempt in range(_PROBE_ATTEMPTS):
        if attempt:
            await asyncio.sleep(backoff * 2 ** (attempt - 1))
        try:
            response = await client.get(url, timeout=30.0)
        except httpx.HTTPError as exc:
            problem = f"{url}: {_describe(exc)}"
            continue
        if response.status_code < 500:
            return response
        problem = f"{url} answered HTTP {response.status_code}"
    return problem


async def probe_server(
    client: httpx.AsyncClient, url: str, tokenizer: Tokenizer, *, backoff: float = 0.5
) -> ServerProbe:
    """`GET /health`, then `/model_info` (older servers: `/get_model_info`); compare tokenizers."""
    probe = ServerProbe(url=url, healthy=False)
    health = await _probe_get(client, f"{url}/health", backoff)
    if isinstance(health, str) or health.status_code != 200:
        probe.problem = (
            health
            if isinstance(health, str)
            else f"{url}/health answered HTTP {health.status_code}"
        )
        return probe
    probe.healthy = True
    info: Any = None
    for endpoint in ("/model_info", "/get_model_info"):
        answer = await _probe_get(client, f"{url}{endpoint}", backoff)
        if isinstance(answer, httpx.Response) and answer.status_code == 200:
            try:
                info = answer.json()
            except ValueError:
                info = None
            break
    if isinstance(info, dict):
        probe.model_path = (
            info.get("model_path") if isinstance(info.get("model_path"), str) else None
        )
        probe.tokenizer_path = (
            info.get("tokenizer_path") if isinstance(info.get("tokenizer_path"), str) else None
        )
    served = probe.tokenizer_path or probe.model_path
    local = tokenizer.directory.resolve().name.lower()
    if served and _path_name(served) != local:
        probe.warnings.append(
            f"{url} serves tokenizer {served!r}, but prompts are rendered with {str(tokenizer.directory)!r}: "
            "if these differ, every sample's ids are wrong; pass --tokenizer with the server's tokenizer"
        )
    elif not served:
        probe.warnings.append(
            f"{url} does not report its tokenizer: make sure it matches {tokenizer.directory}"
        )
    return probe


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass
class _Server:
    url: str
    in_flight: int = 0
    cooling_until: float = 0.0


class ServerPool:
    """Spreads requests over servers: the one with the fewest in flight, skipping one that just failed."""

    def __init__(self, urls: tuple[str, ...]):
        self.servers = [_Server(url.rstrip("/")) for url in urls]
        self._turn = 0

    def acquire(self) -> _Server:
        now = time.monotonic()
        ready = [s for s in self.servers if s.cooling_until <= now] or self.servers
        self._turn += 1
        # Rotate the start so ties are broken round robin.
        order = ready[self._turn % len(ready) :] + ready[: self._turn % len(ready)]
        server = min(order, key=lambda s: s.in_flight)
        server.in_flight += 1
        return server

    @staticmethod
    def release(server: _Server, *, failed_for: float = 0.0) -> None:
        server.in_flight -= 1
        if failed_for:
            server.cooling_until = time.monotonic() + failed_for


# -- the run ------------------------------------------------------------------------------


@dataclass
class RunStats:
    """Counters of a run, as the progress display shows them."""

    total: int  # prompts in the partition (after --limit)
    resumed: int  # already in the output at start
    written: int = 0
    errors: int = 0
    retries: int = 0
    in_flight: int = 0
    output_tokens: int = 0
    canary: str = "off"  # off | pending | auditing | passed | failed
    started: float = field(default_factory=time.monotonic)

    @property
    def done(self) -> int:
        return self.resumed + self.written

    @property
    def elapsed(self) -> float:
        return max(time.monotonic() - self.started, 1e-9)

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / self.elapsed

    @property
    def eta_seconds(self) -> float | None:
        """Seconds left at this run's pace so far, or None before the first sample."""
        finished = self.written + self.errors
        left = self.total - self.done - self.errors
        if finished == 0:
            return None
        return left * self.elapsed / finished


class GenerationEvents:
    """What the core tells whoever shows the run. Override what you need; all default to nothing."""

    def warning(self, message: str) -> None:
        """A problem worth a person's attention that does not stop the run."""

    def progress(self, stats: RunStats) -> None:
        """Called after every change of the counters (cheap: throttle rendering yourself)."""

    def canary(self, report: Report) -> None:
        """The canary's audit, passed or failed."""


@dataclass
class GenerationResult:
    """How a run ended."""

    stats: RunStats
    stopped: str | None = None  # None (ran to the end) | "interrupted" | "canary"
    canary_report: Report | None = None
    canary_message: str | None = None
    probes: list[ServerProbe] = field(default_factory=list)


@dataclass
class _Job:
    prompt: Prompt
    input_ids: list[int]


class _Transient(Exception):
    def __init__(self, reason: str, status: int | None = None, retry_after: float | None = None):
        super().__init__(reason)
        self.status = status
        self.retry_after = retry_after


class _Rejected(Exception):
    def __init__(self, reason: str, status: int):
        super().__init__(reason)
        self.status = status


class Generator:
    """The asynchronous engine behind `audit generate`."""

    def __init__(self, plan: GenerationPlan, events: GenerationEvents | None = None):
        self.plan = plan
        self.options = plan.options
        self.events = events or GenerationEvents()
        self.stats = RunStats(
            total=len(plan.prompt_keys), resumed=len(set(plan.prompt_keys) & plan.resumed.keys)
        )
        self.pool = ServerPool(plan.options.servers)
        self._halt: asyncio.Event | None = None
        self._stopped: str | None = None
        self._canary_size = 0
        self._canary_lines: list[bytes] = []
        self._canary_resolved = 0
        self._canary_gate: asyncio.Event | None = None
        self._canary_task: asyncio.Task | None = None
        self._result = GenerationResult(stats=self.stats)
        self._log: ResponseLog | None = None
        self._errors_handle: Any = None

    def request_stop(self) -> None:
        """Stop cleanly: cancel the requests in flight; samples already written stay."""
        self._halt_with("interrupted")

    def _halt_with(self, reason: str) -> None:
        if self._stopped is None:
            self._stopped = reason
        if self._halt is not None:
            self._halt.set()

    async def run(self) -> GenerationResult:
        """Probe the servers, write generation.json, then generate every pending prompt once."""
        self._halt = asyncio.Event()
        if self._stopped:
            self._halt.set()
        limits = httpx.Limits(
            max_connections=None,
            max_keepalive_connections=self.options.concurrency + self.options.long_concurrency,
        )
        timeout = httpx.Timeout(self.options.timeout, connect=30.0)
        async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
            probes = await asyncio.gather(
                *(
                    probe_server(
                        client, s.url, self.plan.tokenizer, backoff=self.options.retry_backoff
                    )
                    for s in self.pool.servers
                )
            )
            self._result.probes = list(probes)
            for probe in probes:
                for message in probe.warnings:
                    self.events.warning(message)
                if not probe.healthy:
                    self.events.warning(
                        f"server not healthy at start, used anyway: {probe.problem}"
                    )
            if not any(p.healthy for p in probes):
                raise ServerError(
                    "no server answered /health: " + "; ".join(p.problem or p.url for p in probes)
                )
            manifest = dict(self.plan.manifest, servers=[p.to_dict() for p in probes])
            write_manifest(self.plan.manifest_path, manifest)

            pending = self.plan.pending
            self._canary_size = min(self.options.canary, pending)
            self._canary_gate = asyncio.Event()
            if self._canary_size:
                self.stats.canary = "pending"
            else:
                self._canary_gate.set()
            self._log = ResponseLog(self.options.out, self.options.fsync_interval)
            try:
                await self._generate(client)
            finally:
                self._log.close()
                if self._errors_handle is not None:
                    self._errors_handle.close()
        self._result.stopped = self._stopped
        self.events.progress(self.stats)
        return self._result

    async def _generate(self, client: httpx.AsyncClient) -> None:
        assert self._halt is not None
        short: asyncio.Queue[_Job | None] = asyncio.Queue(maxsize=self.options.concurrency * 2)
        long: asyncio.Queue[_Job | None] = asyncio.Queue(maxsize=self.options.long_concurrency * 2)
        workers = [
            asyncio.create_task(self._worker(client, short))
            for _ in range(self.options.concurrency)
        ]
        workers += [
            asyncio.create_task(self._worker(client, long))
            for _ in range(self.options.long_concurrency)
        ]
        feeder = asyncio.create_task(self._feed(short, long))
        tasks = [feeder, *workers]
        everything = asyncio.gather(*tasks)
        halted = asyncio.create_task(self._halt.wait())
        try:
            await asyncio.wait({everything, halted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            halted.cancel()
            for task in tasks:
                task.cancel()  # cancels in-flight requests; a write is never interrupted (no await in it)
            await asyncio.gather(*tasks, halted, return_exceptions=True)
            if everything.done() and not everything.cancelled():
                everything.exception()  # retrieved here; raised below when it is a real failure
            if self._canary_task is not None and not self._canary_task.done():
                self._canary_task.cancel()
                await asyncio.gather(self._canary_task, return_exceptions=True)
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def _feed(self, short: asyncio.Queue, long: asyncio.Queue) -> None:
        """Render pending prompts in batches and queue them, short and long apart."""
        assert self._canary_gate is not None
        done = self.plan.resumed.keys
        fed = 0
        batch: list[Prompt] = []

        async def flush() -> None:
            nonlocal fed
            rendered = await asyncio.to_thread(
                render_prompts, self.plan.tokenizer, batch, thinking=self.options.thinking
            )
            for prompt, ids in zip(batch, rendered, strict=True):
                if fed == self._canary_size and not self._canary_gate.is_set():
                    await self._canary_gate.wait()  # the rest waits for the canary's verdict
                queue = long if len(ids) > self.options.long_threshold else short
                await queue.put(_Job(prompt, ids))
                fed += 1
            batch.clear()

        for prompt in iter_prompts(self.options.prompts, self.options.limit):
            if prompt.key in done:
                continue
            batch.append(prompt)
            # The canary's prompts go out as soon as they are rendered.
            if len(batch) >= _RENDER_CHUNK or fed + len(batch) == self._canary_size:
                await flush()
        if batch:
            await flush()
        for _ in range(self.options.concurrency):
            await short.put(None)
        for _ in range(self.options.long_concurrency):
            await long.put(None)

    async def _worker(self, client: httpx.AsyncClient, queue: asyncio.Queue) -> None:
        while (job := await queue.get()) is not None:
            await self._complete(client, job)

    async def _complete(self, client: httpx.AsyncClient, job: _Job) -> None:
        """Send one prompt until it is answered, rejected, or out of attempts; record the outcome."""
        payload = orjson.dumps(
            {"input_ids": job.input_ids, "sampling_params": self.plan.sampling_params}
        )
        last: _Transient | None = None
        server_url = ""
        for attempt in range(1, self.options.max_attempts + 1):
            server = self.pool.acquire()
            server_url = server.url
            self.stats.in_flight += 1
            self.events.progress(self.stats)
            failed_for = 0.0
            try:
                body = await self._post(client, server.url, payload)
            except _Rejected as rejected:
                self._record_error(job, server.url, str(rejected), rejected.status, attempt)
                return
            except _Transient as transient:
                last = transient
                failed_for = self._backoff(attempt, transient.retry_after)
            else:
                self._record_sample(job, body)
                return
            finally:
                self.stats.in_flight -= 1
                ServerPool.release(server, failed_for=failed_for)
            if attempt < self.options.max_attempts:
                self.stats.retries += 1
                self.events.progress(self.stats)
                await asyncio.sleep(failed_for)
        assert last is not None
        self._record_error(
            job,
            server_url,
            f"gave up after {self.options.max_attempts} attempts: {last}",
            last.status,
            self.options.max_attempts,
        )

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Capped exponential backoff with jitter, at least what the server asked for."""
        ceiling = min(
            self.options.retry_backoff_cap, self.options.retry_backoff * 2 ** (attempt - 1)
        )
        delay = random.uniform(ceiling / 2, ceiling)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.options.retry_backoff_cap))
        return delay

    async def _post(self, client: httpx.AsyncClient, url: str, payload: bytes) -> dict[str, Any]:
        try:
            response = await client.post(
                f"{url}/generate", content=payload, headers={"Content-Type": "application/json"}
            )
        except httpx.TransportError as exc:  # connection refused or dropped, timeouts
            raise _Transient(f"{url}: {_describe(exc)}") from None
        status = response.status_code
        if status == 200:
            try:
                body = orjson.loads(response.content)
            except orjson.JSONDecodeError:
                raise _Transient(f"{url}: HTTP 200 with a body that is not JSON", status) from None
            problem = _response_problem(body)
            if problem:
                raise _Transient(f"{url}: HTTP 200 but {problem}", status)
            return body
        reason = _error_reason(response)
        if status >= 500 or status in _TRANSIENT_4XX:
            raise _Transient(f"{url}: HTTP {status}: {reason}", status, _retry_after(response))
        raise _Rejected(f"HTTP {status}: {reason}", status)

    def _record_sample(self, job: _Job, body: dict[str, Any]) -> None:
        record: dict[str, Any] = {"id": job.prompt.id, "messages": job.prompt.messages}
        if job.prompt.tools is not None:
            record["tools"] = job.prompt.tools
        record["input_ids"] = job.input_ids
        record["output_ids"] = body["output_ids"]
        record["text"] = body.get("text")
        record["meta_info"] = body.get("meta_info")
        line = orjson.dumps(record) + b"\n"
        assert self._log is not None
        self._log.append(line)
        self.stats.written += 1
        self.stats.output_tokens += len(body["output_ids"])
        if self.stats.canary == "pending" and len(self._canary_lines) < self._canary_size:
            self._canary_lines.append(line)
        self._canary_progress()
        self.events.progress(self.stats)

    def _record_error(
        self, job: _Job, server: str, reason: str, status: int | None, attempts: int
    ) -> None:
        if self._errors_handle is None:
            self._errors_handle = self.plan.errors_path.open("ab")
        entry = {
            "id": job.prompt.id,
            "server": server,
            "status": status,
            "reason": reason,
            "attempts": attempts,
            "prompt_tokens": len(job.input_ids),
            "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        self._errors_handle.write(orjson.dumps(entry) + b"\n")
        self._errors_handle.flush()
        self.stats.errors += 1
        self._canary_progress()
        self.events.progress(self.stats)

    # -- the canary ---------------------------------------------------------------------
    def _canary_progress(self) -> None:
        if self.stats.canary != "pending":
            return
        self._canary_resolved += 1
        if self._canary_resolved >= self._canary_size:
            self.stats.canary = "auditing"
            self._canary_task = asyncio.get_running_loop().create_task(self._audit_canary())

    async def _audit_canary(self) -> None:
        assert self._canary_gate is not None
        if not self._canary_lines:
            self.stats.canary = "failed"
            self._result.canary_message = (
                f"every one of the first {self._canary_size} requests failed: "
                f"see {self.plan.errors_path}"
            )
            self._halt_with("canary")
            return
        first_line = self.plan.resumed.lines + 1
        try:
            report = await asyncio.to_thread(
                self._canary_report, list(self._canary_lines), first_line
            )
        except Exception as exc:  # a canary that cannot judge must not let the run go on unjudged
            self.stats.canary = "failed"
            self._result.canary_message = f"the canary audit itself failed: {_describe(exc)}"
            self._halt_with("canary")
            return
        self._result.canary_report = report
        self.events.canary(report)
        if report.verdict == "fail":
            self.stats.canary = "failed"
            self._halt_with("canary")
        else:
            self.stats.canary = "passed"
            self._canary_gate.set()
        self.events.progress(self.stats)

    def _canary_report(self, lines: list[bytes], first_line: int) -> Report:
        """Audit the canary's lines with the same engine as `audit check`, numbered as in the output."""
        return audit_lines(
            lines,
            AuditContext(self.plan.profile, self.plan.tokenizer),
            self.plan.rule_set,
            target=f"{self.options.out} (canary)",
            first_line=first_line,
        )


def audit_lines(
    lines: list[bytes],
    context: AuditContext,
    rule_set: RuleSet,
    *,
    target: str,
    first_line: int = 1,
) -> Report:
    """Audit some JSONL lines (e.g. a run's first samples) and report lines from `first_line` on."""
    with tempfile.TemporaryDirectory(prefix="audit-canary-") as directory:
        path = Path(directory) / "canary.jsonl"
        path.write_bytes(b"".join(lines))
        audited = audit_file(path, context, rule_set)
    shift = first_line - 1
    if shift:
        audited.findings = audited.findings.with_columns((pl.col("line") + shift).cast(pl.UInt32))
        audited.stats = audited.stats.with_columns((pl.col("line") + shift).cast(pl.UInt32))
    report = build_report(
        target,
        audited,
        rule_set,
        profile=context.profile.to_dict(),
        tokenizer=context.tokenizer.fingerprint.to_dict(),
    )
    report.input["first_line"] = first_line
    report.results = [
        dataclasses.replace(r, example_lines=[n + shift for n in r.example_lines])
        for r in report.results
    ]
    return report


# -- small helpers --------------------------------------------------------------------------


def _response_problem(body: Any) -> str | None:
    """Why a 200 answer is not a /generate result, or None when it is one."""
    if not isinstance(body, dict):
        return f"the body is a JSON {type(body).__name__}, not a /generate result"
    ids = body.get("output_ids")
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids
    ):
        return "the body has no output_ids list of ints"
    if "meta_info" in body and not isinstance(body["meta_info"], dict):
        return "meta_info is not an object"
    return None


def _error_reason(response: httpx.Response) -> str:
    """SGLang's error message from `{"error": {"message": ...}}` (or FastAPI's `detail`), else the body."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
        if "detail" in body:
            return str(body["detail"])[:500]
        if isinstance(body.get("message"), str):
            return body["message"]
    return json.dumps(body)[:500]


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None

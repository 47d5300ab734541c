"""Talking to SGLang servers: probes at start, the pool that spreads requests, one `/generate` call.

Only SGLang's native endpoints are used: `GET /health`, `/model_info` (older servers:
`/get_model_info`) and `POST /generate` with `input_ids`. What an answer means for the run is
decided here and nowhere else: a result (`/generate`'s JSON object), `Transient` (worth another
attempt: connection errors, timeouts, 5xx, 408/425/429, a body that is not a result) or
`Rejected` (the server refused this prompt: other 4xx, written to errors.jsonl once).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from audit.errors import AuditError
from audit.tokenizer import Tokenizer

# Status codes that say "try again later" although they are 4xx.
_TRANSIENT_4XX = frozenset({408, 425, 429})
# Probe requests get a few tries: a server under load (or still loading) may answer 503 once.
_PROBE_ATTEMPTS = 4


class ServerError(AuditError):
    """No server can be used (none answers /health)."""


class Transient(Exception):
    """A failed attempt worth retrying, with the status and the delay the server asked for."""

    def __init__(self, reason: str, status: int | None = None, retry_after: float | None = None):
        super().__init__(reason)
        self.status = status
        self.retry_after = retry_after


class Rejected(Exception):
    """The server refused this prompt (a 4xx that retrying will not change)."""

    def __init__(self, reason: str, status: int):
        super().__init__(reason)
        self.status = status


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
async def _probe_get(client: httpx.AsyncClient, url: str, backoff: float) -> httpx.Response | str:
    """GET with a few quick retries on 5xx and connection errors; the response, or why none came."""
    problem = ""
    for attempt in range(_PROBE_ATTEMPTS):
        if attempt:
            await asyncio.sleep(backoff * 2 ** (attempt - 1))
        try:
            response = await client.get(url, timeout=30.0)
        except httpx.HTTPError as exc:
            problem = f"{url}: {describe(exc)}"
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


def describe(exc: BaseException) -> str:
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


def backoff_delay(attempt: int, retry_after: float | None, *, base: float, cap: float) -> float:
    """Capped exponential backoff with jitter, at least what the server asked for."""
    ceiling = min(cap, base * 2 ** (attempt - 1))
    delay = random.uniform(ceiling / 2, ceiling)
    if retry_after is not None:
        delay = max(delay, min(retry_after, cap))
    return delay


async def post_generate(client: httpx.AsyncClient, url: str, payload: bytes) -> dict[str, Any]:
    """One `POST /generate`: the result, or `Transient` / `Rejected` saying why not."""
    try:
        response = await client.post(
            f"{url}/generate", content=payload, headers={"Content-Type": "application/json"}
        )
    except httpx.TransportError as exc:  # connection refused or dropped, timeouts
        raise Transient(f"{url}: {describe(exc)}") from None
    status = response.status_code
    if status == 200:
        try:
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise Transient(f"{url}: HTTP 200 with a body that is not JSON", status) from None
        problem = _response_problem(body)
        if problem:
            raise Transient(f"{url}: HTTP 200 but {problem}", status)
        return body
    reason = _error_reason(response)
    if status >= 500 or status in _TRANSIENT_4XX:
        raise Transient(f"{url}: HTTP {status}: {reason}", status, _retry_after(response))
    raise Rejected(f"HTTP {status}: {reason}", status)


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

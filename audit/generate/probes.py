"""What a server says of itself before a run: `/health`, then `/model_info` (older servers:
`/get_model_info`), each request with one deadline for the whole of it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from audit.generate.server_errors import describe
from audit.model.tokens.tokenizer import Tokenizer

# The first probe of a server gets a few quick tries: one under load (or still loading) may
# answer 503 once; a refused connection is not tried again at once. Re-probes of a server out
# of the rotation are one try each, spaced by backoff.
FIRST_PROBE_ATTEMPTS = 4
# Deadline of one probe request, whole (a trickling /health must not hang the start).
_PROBE_TIMEOUT = 30.0

@dataclass
class ServerProbe:
    """What a server said about itself when probed."""

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


async def _probe_get(
    client: httpx.AsyncClient, url: str, backoff: float, attempts: int
) -> httpx.Response | str:
    """GET with quick retries on 5xx and dropped connections; the response, or why none came."""
    problem = ""
    for attempt in range(attempts):
        if attempt:
            await asyncio.sleep(backoff * 2 ** (attempt - 1))
        try:
            async with asyncio.timeout(_PROBE_TIMEOUT):
                response = await client.get(url, timeout=_PROBE_TIMEOUT)
        except TimeoutError:
            problem = f"{url}: Timeout: no whole answer within {_PROBE_TIMEOUT:g} s"
            continue
        except httpx.ConnectError as exc:  # nobody listens: no quick retry will change that
            return f"{url}: {describe(exc)}"
        except httpx.HTTPError as exc:
            problem = f"{url}: {describe(exc)}"
            continue
        if response.status_code < 500:
            return response
        problem = f"{url} answered HTTP {response.status_code}"
    return problem


async def probe_server(
    client: httpx.AsyncClient,
    url: str,
    tokenizer: Tokenizer,
    *,
    backoff: float = 0.5,
    attempts: int = FIRST_PROBE_ATTEMPTS,
) -> ServerProbe:
    """`GET /health`, then `/model_info` (older servers: `/get_model_info`); compare tokenizers."""
    probe = ServerProbe(url=url, healthy=False)
    health = await _probe_get(client, f"{url}/health", backoff, attempts)
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
        answer = await _probe_get(client, f"{url}{endpoint}", backoff, attempts)
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
            f"{url} serves tokenizer {served!r}, but prompts are rendered with "
            f"{str(tokenizer.directory)!r}: if these differ, every sample's ids are wrong; "
            "pass --tokenizer with the server's tokenizer"
        )
    elif not served:
        probe.warnings.append(
            f"{url} does not report its tokenizer: make sure it matches {tokenizer.directory}"
        )
    return probe



"""Talking to SGLang servers: the pool that spreads requests, and one `/generate` call.

Only SGLang's native endpoints are used: `GET /health`, `/model_info` (older servers:
`/get_model_info`) and `POST /generate` with `input_ids`. What an answer means for the run is
decided here and nowhere else: a result (`/generate`'s JSON object), `Transient` (worth another
attempt: timeouts, dropped connections, 5xx, 408/425/429, a body that cannot be decoded or is
not a result), `Unreachable` (the server refuses connections: it leaves the rotation) or
`Rejected` (the server refused this prompt: other 4xx, written to errors.jsonl once).

Every request has one deadline for the whole of it (connecting, sending, every byte of the
answer): a server that trickles its answer cannot hold a request past `--timeout`.

The pool is a circuit breaker. A server is in the rotation once `/health` answers 200. One that
refuses connections, or whose probe fails, leaves it and is re-probed in the background with
capped exponential backoff; it rejoins when `/health` answers again. Requests only go to
servers in the rotation, so a dead server costs the run nothing but its probes.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from audit.generate.probes import FIRST_PROBE_ATTEMPTS, ServerProbe, probe_server
from audit.generate.server_errors import Rejected, ServerError, Transient, Unreachable, describe
from audit.model.tokens.tokenizer import Tokenizer

# Status codes that say "try again later" although they are 4xx.
_TRANSIENT_4XX = frozenset({408, 425, 429})
# Re-probes of a server out of the rotation are never closer than this, whatever --retry-backoff.
_MIN_REPROBE_DELAY = 0.1


# -- the pool -----------------------------------------------------------------------------------


@dataclass
class Server:
    """One server of the pool and its standing."""

    url: str
    in_flight: int = 0
    cooling_until: float = 0.0  # skipped until then after a transient failure
    state: str = "probing"  # probing (first probe running) | in (the rotation) | out
    failures: int = 0  # failed probes (or refused requests) in a row
    problem: str | None = None  # why it is out
    probe: ServerProbe | None = None  # what it reported the first time it answered
    left: asyncio.Event = field(default_factory=asyncio.Event)  # set when it leaves the rotation


class ServerPool:
    """The run's servers: which are in the rotation, and the one each request goes to.

    `start()` probes every server and returns as soon as one is healthy (ServerError when
    none is). A request goes to the server in the rotation with the fewest in flight,
    skipping one that just failed while another is ready; with none in the rotation it waits
    for one to come back, and fails with ServerError once every server has failed
    `give_up_after` probes in a row.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        urls: tuple[str, ...],
        tokenizer: Tokenizer,
        *,
        backoff: float,
        backoff_cap: float,
        give_up_after: int,
        warn: Callable[[str], None],
        notice: Callable[[str], None],
        on_probe: Callable[[ServerProbe], None],
    ):
        self.servers = [Server(url.rstrip("/")) for url in urls]
        self._client = client
        self._tokenizer = tokenizer
        self._backoff = backoff
        self._backoff_cap = backoff_cap
        self._give_up_after = give_up_after
        self._warn = warn
        self._notice = notice
        self._on_probe = on_probe
        self._turn = 0
        self._started = False
        self._changed = asyncio.Event()
        self._watchers: list[asyncio.Task] = []

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Probe every server; return once one is in the rotation, ServerError if none can be."""
        self._watchers = [asyncio.create_task(self._watch(s)) for s in self.servers]
        while not any(s.state == "in" for s in self.servers):
            if all(s.state == "out" for s in self.servers):
                raise ServerError(self._nobody_answered())
            await self._changed.wait()
        self._started = True
        for server in self.servers:
            if server.state == "out":
                self._warn(self._left_message(server))

    async def close(self) -> None:
        """Stop the background probes."""
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)

    @property
    def probes(self) -> list[ServerProbe]:
        """What each server reported (or why it could not be asked), in the order given."""
        return [
            s.probe or ServerProbe(url=s.url, healthy=False, problem=s.problem)
            for s in self.servers
        ]

    # -- requests ---------------------------------------------------------------------------
    async def acquire(self) -> Server:
        """The server for the next request; waits while none is in the rotation."""
        while True:
            ready = [s for s in self.servers if s.state == "in"]
            if ready:
                now = time.monotonic()
                ready = [s for s in ready if s.cooling_until <= now] or ready
                self._turn += 1
                # Rotate the start so ties are broken round robin.
                turn = self._turn % len(ready)
                server = min(ready[turn:] + ready[:turn], key=lambda s: s.in_flight)
                server.in_flight += 1
                return server
            if all(s.state == "out" and s.failures >= self._give_up_after for s in self.servers):
                raise ServerError(self._nobody_answered())
            await self._changed.wait()

    @staticmethod
    def release(server: Server, *, failed_for: float = 0.0) -> None:
        """A request to `server` is over; after a transient failure it is skipped `failed_for` s."""
        server.in_flight -= 1
        if failed_for:
            server.cooling_until = time.monotonic() + failed_for

    def leave(self, server: Server, reason: str) -> None:
        """Take `server` out of the rotation (it refused a connection); it is re-probed."""
        if server.state != "in":
            return
        server.state = "out"
        server.failures = 1
        server.problem = reason
        server.left.set()
        self._warn(self._left_message(server))
        self._changed_now()

    # -- probing ----------------------------------------------------------------------------
    async def _watch(self, server: Server) -> None:
        """Probe `server` while it is out of the rotation, with capped exponential backoff."""
        try:
            await self._watch_probes(server)
        except Exception as exc:  # the client broke on this server: out for good, and said why
            server.state = "out"
            server.failures = self._give_up_after
            server.problem = f"{server.url}: {describe(exc)}"
            self._changed_now()

    async def _watch_probes(self, server: Server) -> None:
        probe = await self._probe(server, FIRST_PROBE_ATTEMPTS)
        delay = max(self._backoff, _MIN_REPROBE_DELAY)
        while True:
            if probe.healthy:
                self._join(server, probe)
                await server.left.wait()
                delay = max(self._backoff, _MIN_REPROBE_DELAY)
            else:
                was = server.state
                server.state = "out"
                server.failures += 1
                server.problem = probe.problem
                if self._started and was == "probing":  # out before the run, said once
                    self._warn(self._left_message(server))
                self._changed_now()
            await asyncio.sleep(random.uniform(delay / 2, delay))
            delay = min(delay * 2, max(self._backoff_cap, _MIN_REPROBE_DELAY))
            probe = await self._probe(server, 1)

    async def _probe(self, server: Server, attempts: int) -> ServerProbe:
        return await probe_server(
            self._client, server.url, self._tokenizer, backoff=self._backoff, attempts=attempts
        )

    def _join(self, server: Server, probe: ServerProbe) -> None:
        came_back = server.state == "out" and self._started
        server.state = "in"
        server.failures = 0
        server.problem = None
        server.cooling_until = 0.0
        server.left = asyncio.Event()
        if server.probe is None:  # the first answer: what it serves, said once
            server.probe = probe
            for message in probe.warnings:
                self._warn(message)
            self._on_probe(probe)
        if came_back:
            self._notice(f"{server.url} answers /health again: back in the rotation")
        self._changed_now()

    def _changed_now(self) -> None:
        """Wake whoever waits for the pool to change (a server joined or left, a probe failed)."""
        self._changed.set()
        self._changed = asyncio.Event()

    def _left_message(self, server: Server) -> str:
        return (
            f"{server.url} left the rotation ({server.problem}); no request goes to it until "
            "/health answers again (re-probed with backoff)"
        )

    def _nobody_answered(self) -> str:
        return "no server answered /health: " + "; ".join(s.problem or s.url for s in self.servers)


# -- one request --------------------------------------------------------------------------------


def backoff_delay(attempt: int, retry_after: float | None, *, base: float, cap: float) -> float:
    """Capped exponential backoff with jitter, at least what the server asked for."""
    ceiling = min(cap, base * 2 ** (attempt - 1))
    delay = random.uniform(ceiling / 2, ceiling)
    if retry_after is not None:
        delay = max(delay, min(retry_after, cap))
    return delay


async def post_generate(
    client: httpx.AsyncClient, url: str, payload: bytes, *, timeout: float
) -> dict[str, Any]:
    """One `POST /generate` within `timeout` seconds, whole: the result, or why not.

    Raises `Unreachable` (connection refused: the server should leave the rotation),
    `Transient` (worth another attempt) or `Rejected` (this prompt is refused).
    """
    try:
        async with asyncio.timeout(timeout):
            response = await client.post(
                f"{url}/generate", content=payload, headers={"Content-Type": "application/json"}
            )
    except TimeoutError:
        # httpx bounds each read, not the whole answer: a server trickling bytes ends here.
        raise Transient(f"{url}: Timeout: no whole answer within {timeout:g} s") from None
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise Unreachable(f"{url}: {describe(exc)}") from None
    except httpx.TransportError as exc:  # dropped connections, read timeouts
        raise Transient(f"{url}: {describe(exc)}") from None
    except httpx.DecodingError as exc:  # a Content-Encoding the body does not follow
        raise Transient(
            f"{url}: an answer whose body cannot be decoded ({describe(exc)})"
        ) from None
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

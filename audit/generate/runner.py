"""The run: every pending prompt rendered, sent to a server, and its sample written once.

Prompts are rendered in batches (`audit.model.rendering.templating`, the same rendering TPL001 audits
against) and queued, short and long apart, to a fixed number of workers per queue; each
worker sends one prompt at a time until it is answered, rejected or out of attempts. The
canary's prompts go first and alone; the rest wait for its verdict. Stopping (Ctrl-C)
cancels the requests in flight between two writes, so no line is ever half-written.

The core knows nothing of terminals: it reports through a `GenerationEvents` object.

    plan = plan_generation(GenerateOptions(...))
    result = asyncio.run(Generator(plan, events).run())
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from audit.generate.canary import Canary, audit_lines
from audit.generate.client import ServerPool, backoff_delay, post_generate
from audit.generate.events import GenerationEvents, GenerationResult, RunStats
from audit.generate.manifest import write_manifest
from audit.generate.output import ErrorLog, ResponseLog
from audit.generate.plan import GenerationPlan
from audit.generate.probes import ServerProbe
from audit.generate.prompt_images import ImageChanged, PartitionImages
from audit.generate.prompts import Prompt, iter_prompts
from audit.generate.server_errors import Rejected, ServerError, Transient, Unreachable
from audit.model.rendering.templating import RenderFailure, prompt_ids
from audit.records.batch import AuditContext
from audit.records.images import image_source
from audit.report.report import Report

# Prompts rendered per batched tokenizer call.
_RENDER_CHUNK = 64


@dataclass
class _Job:
    prompt: Prompt
    input_ids: list[int]
    image_data: list[str] = field(default_factory=list)  # as sent: files inline, as data: URIs
    kept_images: list[str] = field(default_factory=list)  # as the record keeps them


class Generator:
    """The asynchronous engine behind `audit generate`."""

    def __init__(self, plan: GenerationPlan, events: GenerationEvents | None = None):
        self.plan = plan
        self.options = plan.options
        self.events = events or GenerationEvents()
        self.stats = RunStats(
            total=len(plan.prompt_keys), resumed=len(set(plan.prompt_keys) & plan.resumed.keys)
        )
        self.pool: ServerPool | None = None  # made in run(), with the HTTP client
        self._halt: asyncio.Event | None = None
        self._stopped: str | None = None
        self._canary: Canary | None = None
        self._result = GenerationResult(stats=self.stats)
        self._log: ResponseLog | None = None
        self._errors = ErrorLog(plan.errors_path)
        self._images = PartitionImages(plan.options.out.parent)

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
        try:
            return await self._run()
        finally:
            if self.plan.lock is not None:  # the output is free for the next run
                self.plan.lock.release()

    async def _run(self) -> GenerationResult:
        self._halt = asyncio.Event()
        if self._stopped:
            self._halt.set()
        limits = httpx.Limits(
            max_connections=None,
            max_keepalive_connections=self.options.concurrency + self.options.long_concurrency,
        )
        # Per-phase limits; the whole of each request is bounded by --timeout in post_generate.
        timeout = httpx.Timeout(self.options.timeout, connect=min(30.0, self.options.timeout))
        async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
            self.pool = ServerPool(
                client,
                self.options.servers,
                self.plan.tokenizer,
                backoff=self.options.retry_backoff,
                backoff_cap=self.options.retry_backoff_cap,
                give_up_after=self.options.max_attempts,
                warn=self.events.warning,
                notice=self.events.notice,
                on_probe=self._server_answered,
            )
            try:
                await self.pool.start()
                self._canary = Canary(
                    min(self.options.canary, self.plan.pending),
                    self._canary_report,
                    errors_path=self.plan.errors_path,
                    on_change=self._canary_changed,
                )
                self.stats.canary = self._canary.state
                self._log = ResponseLog(self.options.out, self.options.fsync_interval)
                try:
                    await self._generate(client)
                finally:
                    self._log.close()
                    self._errors.close()
            except ServerError as exc:
                if self._log is None:
                    raise  # nothing sent yet: the message says it all
                raise ServerError(
                    f"{exc}; stopped after {self.stats.written} samples, which stay in "
                    f"{self.options.out}: run the same command again to resume"
                ) from None
            finally:
                self._result.probes = self.pool.probes
                await self.pool.close()
        self._result.stopped = self._stopped
        self.events.progress(self.stats)
        return self._result

    def _server_answered(self, probe: ServerProbe) -> None:
        """A server answered for the first time: generation.json records what it serves."""
        assert self.pool is not None
        servers = [p.to_dict() for p in self.pool.probes]
        write_manifest(self.options.out.parent, dict(self.plan.manifest, servers=servers))

    async def _generate(self, client: httpx.AsyncClient) -> None:
        assert self._halt is not None and self._canary is not None
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
        everything: asyncio.Future[Any] = asyncio.gather(*tasks)
        halted = asyncio.create_task(self._halt.wait())
        try:
            await asyncio.wait({everything, halted}, return_when=asyncio.FIRST_COMPLETED)
            if everything.done() and not halted.done() and everything.exception() is None:
                # A run no longer than its canary ends before the verdict: wait for it (a stop
                # request still ends the wait), so the run is judged and its summary says so.
                verdict = asyncio.create_task(self._canary.verdict())
                tasks.append(verdict)
                await asyncio.wait({verdict, halted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            halted.cancel()
            for task in tasks:
                task.cancel()  # cancels in-flight requests; a write is never interrupted (no await in it)
            await asyncio.gather(*tasks, halted, return_exceptions=True)
            if everything.done() and not everything.cancelled():
                everything.exception()  # retrieved here; raised below when it is a real failure
            await self._canary.cancel()
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def _feed(self, short: asyncio.Queue, long: asyncio.Queue) -> None:
        """Render pending prompts in batches and queue them, short and long apart."""
        assert self._canary is not None
        canary = self._canary
        done = self.plan.resumed.keys
        fed = 0
        batch: list[Prompt] = []

        async def flush() -> None:
            nonlocal fed
            rendered = await asyncio.to_thread(
                prompt_ids,
                self.plan.tokenizer,
                [prompt.messages for prompt in batch],
                [prompt.tools for prompt in batch],
                thinking=self.options.thinking,
                extra_kwargs=[prompt.chat_template_kwargs for prompt in batch],
                renderer=self.plan.profile.prompt_renderer,
                template_kwargs=self.plan.profile.template_kwargs,
            )
            for prompt, ids in zip(batch, rendered, strict=True):
                if fed == canary.size and not canary.gate.is_set():
                    await canary.gate.wait()  # the rest waits for the canary's verdict
                fed += 1
                if isinstance(ids, RenderFailure):
                    self._record_error(
                        prompt,
                        None,
                        server="",
                        reason=f"the prompt renderer refused this prompt: {ids.reason}",
                        status=None,
                        attempts=0,
                    )
                    continue
                job = _Job(prompt, ids)
                if prompt.images:
                    try:
                        job.image_data, job.kept_images = await asyncio.to_thread(self._images.entries, prompt.images)
                    except ImageChanged as changed:
                        self._record_error(prompt, ids, server="", reason=str(changed), status=None, attempts=0)
                        continue
                queue = long if len(ids) > self.options.long_threshold else short
                await queue.put(job)
            batch.clear()

        options = self.options
        for prompt in iter_prompts(
            options.prompts, options.limit, options.split, options.skip_bad_lines, self.plan.images
        ):
            if prompt.key in done:
                continue
            batch.append(prompt)
            # The canary's prompts go out as soon as they are rendered.
            if len(batch) >= _RENDER_CHUNK or fed + len(batch) == canary.size:
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
        assert self.pool is not None
        request: dict[str, Any] = {"input_ids": job.input_ids, "sampling_params": self.plan.sampling_params}
        if job.image_data:
            request["image_data"] = job.image_data  # in placeholder order
        payload = orjson.dumps(request)
        last: Transient | None = None
        server_url = ""
        for attempt in range(1, self.options.max_attempts + 1):
            server = await self.pool.acquire()
            server_url = server.url
            self.stats.in_flight += 1
            self.events.progress(self.stats)
            failed_for = 0.0
            try:
                body = await post_generate(
                    client, server.url, payload, timeout=self.options.timeout
                )
            except Rejected as rejected:
                self._record_error(
                    job.prompt,
                    job.input_ids,
                    server=server.url,
                    reason=str(rejected),
                    status=rejected.status,
                    attempts=attempt,
                )
                return
            except Unreachable as unreachable:
                # The server is down, not busy: it leaves the rotation and the prompt goes to
                # another server at once (acquire waits while none is in the rotation).
                last = unreachable
                self.pool.leave(server, str(unreachable))
            except Transient as transient:
                last = transient
                failed_for = backoff_delay(
                    attempt,
                    transient.retry_after,
                    base=self.options.retry_backoff,
                    cap=self.options.retry_backoff_cap,
                )
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
            job.prompt,
            job.input_ids,
            server=server_url,
            reason=f"gave up after {self.options.max_attempts} attempts: {last}",
            status=last.status,
            attempts=self.options.max_attempts,
        )

    def _record_sample(self, job: _Job, body: dict[str, Any]) -> None:
        record: dict[str, Any] = {"id": job.prompt.id, "messages": job.prompt.messages}
        if job.prompt.tools is not None:
            record["tools"] = job.prompt.tools
        if job.prompt.chat_template_kwargs is not None:
            # Rendered with them: TPL001 re-renders the record with them too.
            record["chat_template_kwargs"] = job.prompt.chat_template_kwargs
        record["input_ids"] = job.input_ids
        if job.kept_images:
            record["image_data"] = job.kept_images
            record["image_sha256"] = [image.sha256 for image in job.prompt.images]
        record["output_ids"] = body["output_ids"]
        record["text"] = body.get("text")
        record["meta_info"] = body.get("meta_info")
        line = orjson.dumps(record) + b"\n"
        assert self._log is not None and self._canary is not None
        self._log.append(line)
        self.stats.written += 1
        self.stats.output_tokens += len(body["output_ids"])
        self._canary.resolved(line)
        self.events.progress(self.stats)

    def _record_error(
        self,
        prompt: Prompt,
        input_ids: list[int] | None,
        *,
        server: str,
        reason: str,
        status: int | None,
        attempts: int,
    ) -> None:
        self._errors.append(
            {
                "id": prompt.id,
                "server": server,
                "status": status,
                "reason": reason,
                "attempts": attempts,
                "prompt_tokens": len(input_ids) if input_ids is not None else None,
            }
        )
        self.stats.errors += 1
        assert self._canary is not None
        self._canary.resolved(None)
        self.events.progress(self.stats)

    # -- the canary ---------------------------------------------------------------------
    def _canary_changed(self, canary: Canary) -> None:
        self.stats.canary = canary.state
        if canary.state == "auditing":
            return
        self._result.canary_report = canary.report
        self._result.canary_message = canary.message
        if canary.report is not None:
            self.events.canary(canary.report)
        if canary.state == "failed":
            self._halt_with("canary")
        self.events.progress(self.stats)

    def _canary_report(self, lines: list[bytes]) -> Report:
        """Audit the canary's lines with the same engine as `audit check`, numbered as in the output."""
        return audit_lines(
            lines,
            AuditContext(
                self.plan.profile,
                self.plan.tokenizer,
                images=image_source(self.options.out, fetch=self.options.fetch_images),
            ),
            self.plan.rule_set,
            target=f"{self.options.out} (canary)",
            first_line=self.plan.resumed.lines + 1,
            path=self.options.out,
        )

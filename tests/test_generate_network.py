"""The generator's network edges, against stand-in servers that misbehave (tests/sglang_standin.py).

A server that trickles its answer, an answer whose body cannot be used, a server that refuses
connections at start, dies in the middle of a run, or comes back: each costs the prompts it
touches at most, never the run, and a dead server costs a run beside a live one nothing.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import httpx
import pytest

from audit.generate import (
    GenerateOptions,
    GenerationEvents,
    Generator,
    ServerError,
    plan_generation,
)
from tests.conftest import KIMI_TOKENIZER
from tests.generate_support import generate_args, make_prompts, read_samples, run_cli
from tests.sglang_standin import BAD_BODIES


def dead_url() -> str:
    """A loopback URL nobody listens on: connections are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def read_errors(directory: Path) -> list[dict]:
    path = directory / "errors.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class Recorder(GenerationEvents):
    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.notices: list[str] = []
        self.written: list[int] = []

    def warning(self, message: str) -> None:
        self.warnings.append(message)

    def notice(self, message: str) -> None:
        self.notices.append(message)

    def progress(self, stats) -> None:
        self.written.append(stats.written)


def run_core(
    tmp_path: Path,
    servers: tuple[str, ...],
    n: int,
    events: GenerationEvents | None = None,
    **options,
):
    """Plan and run the generator without the CLI; (result, seconds the run took)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    plan = plan_generation(
        GenerateOptions(
            prompts=make_prompts(tmp_path / "prompts.jsonl", n=n),
            out=tmp_path / "out" / "raw_responses.jsonl",
            servers=servers,
            tokenizer=KIMI_TOKENIZER,
            profile="kimi-k2.5",
            canary=options.pop("canary", 0),
            **options,
        )
    )
    started = time.perf_counter()
    result = asyncio.run(Generator(plan, events).run())
    return result, time.perf_counter() - started


# -- the stand-in misbehaves as asked ------------------------------------------------------------


def test_the_standin_trickles_sends_bad_bodies_and_goes_down_and_up(servers):
    body = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 3}}
    with httpx.Client(base_url=servers(trickle=0.005).url, timeout=0.5) as client:
        started = time.perf_counter()
        answer = client.post("/generate", json=body)  # every byte within the 0.5 s read timeout
        assert answer.json()["output_ids"] and time.perf_counter() - started > 0.5
    with (
        httpx.Client(base_url=servers(bad_body="encoding").url) as client,
        pytest.raises(httpx.DecodingError),
    ):
        client.post("/generate", json=body)
    with (
        httpx.Client(base_url=servers(bad_body="json").url) as client,
        pytest.raises(json.JSONDecodeError),
    ):
        client.post("/generate", json=body).json()
    with httpx.Client(base_url=servers(bad_body="shape").url) as client:
        answer = client.post("/generate", json=body)
        assert answer.status_code == 200 and "output_ids" not in answer.json()
    server = servers()
    with httpx.Client(base_url=server.url) as client:
        assert client.get("/health").status_code == 200
        server.refuse_connections()
        with pytest.raises(httpx.TransportError):  # the open connection is cut...
            client.get("/health")
        with pytest.raises(httpx.ConnectError):  # ...and new ones are refused
            httpx.get(f"{server.url}/health")
        server.accept_connections()
        assert client.get("/health").status_code == 200  # back on the same port


# -- a whole request is bounded -------------------------------------------------------------------


def test_timeout_bounds_a_whole_request_even_when_the_server_trickles(servers, tmp_path):
    server = servers(trickle=0.05)  # a ~400-byte answer takes 20 s, a byte every 0.05 s
    out = tmp_path / "raw_responses.jsonl"
    prompts = make_prompts(tmp_path / "prompts.jsonl", n=2)
    extra = ("--timeout", "1", "--max-attempts", "1", "--canary", "0")

    started = time.perf_counter()
    result = run_cli(generate_args(prompts, out, server.url, extra=extra))

    assert time.perf_counter() - started < 12, "the run waited for the trickle"
    assert result.exit_code == 1, result.output
    errors = read_errors(tmp_path)
    assert sorted(str(e["id"]) for e in errors) == sorted(
        str(json.loads(line)["id"]) for line in prompts.read_text().splitlines()
    )
    assert all("no whole answer within 1 s" in e["reason"] for e in errors)


# -- bodies that cannot be used -------------------------------------------------------------------


@pytest.mark.parametrize("kind", BAD_BODIES)
def test_a_body_that_cannot_be_used_is_an_error_for_its_prompt_not_an_aborted_run(
    servers, tmp_path, kind
):
    server = servers(bad_body=kind)
    out = tmp_path / "raw_responses.jsonl"
    prompts = make_prompts(tmp_path / "prompts.jsonl", n=3)
    extra = ("--max-attempts", "2", "--canary", "0")

    result = run_cli(generate_args(prompts, out, server.url, extra=extra))

    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "3 prompts failed" in result.output
    errors = read_errors(tmp_path)
    assert len(errors) == 3 and all("gave up after 2 attempts" in e["reason"] for e in errors)
    says = {"encoding": "cannot be decoded", "json": "not JSON", "shape": "no output_ids"}[kind]
    assert all(says in e["reason"] for e in errors), errors
    assert read_samples(out) == []


@pytest.mark.parametrize("kind", BAD_BODIES)
def test_a_bad_body_now_and_then_is_retried_and_every_prompt_written_once(servers, tmp_path, kind):
    server = servers(bad_body=kind, bad_body_every=3)
    out = tmp_path / "raw_responses.jsonl"
    prompts = make_prompts(tmp_path / "prompts.jsonl", n=12)

    result = run_cli(generate_args(prompts, out, server.url, extra=("--canary", "4")))

    assert result.exit_code == 0, result.output
    ids = [str(s["id"]) for s in read_samples(out)]
    assert len(ids) == 12 == len(set(ids))
    for sample in read_samples(out):
        assert sample["output_ids"] == server.sent[tuple(sample["input_ids"])]


# -- servers that are down ----------------------------------------------------------------------


def test_a_dead_server_alone_is_one_message_and_exit_2(tmp_path):
    prompts = make_prompts(tmp_path / "prompts.jsonl", n=2)
    result = run_cli(generate_args(prompts, tmp_path / "out.jsonl", dead_url()))
    assert result.exit_code == 2
    assert "no server answered /health" in result.output and "ConnectError" in result.output
    assert "used anyway" not in result.output and "warning" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_a_dead_server_beside_a_live_one_costs_the_run_nothing(servers, tmp_path):
    live = servers(delay=0.02)
    options = {"concurrency": 4, "retry_backoff": 0.5}  # the default backoff, as a user runs it
    alone, alone_seconds = run_core(tmp_path / "alone", (live.url,), 40, **options)
    events = Recorder()
    both, both_seconds = run_core(tmp_path / "both", (dead_url(), live.url), 40, events, **options)

    assert alone.stats.written == both.stats.written == 40
    assert both.stats.retries == 0  # no request ever went to the dead server
    assert both_seconds < 1.5 * alone_seconds + 0.5, (both_seconds, alone_seconds)
    [left] = [w for w in events.warnings if "left the rotation" in w]
    assert "ConnectError" in left
    generation = json.loads((tmp_path / "both" / "out" / "generation.json").read_text())
    assert [s["model_path"] is not None for s in generation["servers"]] == [False, True]


def test_a_server_down_at_start_joins_the_rotation_when_it_comes_back(servers, tmp_path):
    late, live = servers(), servers(delay=0.05)
    late.refuse_connections()
    events = Recorder()

    async def bring_back_later():
        await asyncio.sleep(0.4)
        late.accept_connections()

    async def run():
        plan = plan_generation(
            GenerateOptions(
                prompts=make_prompts(tmp_path / "prompts.jsonl", n=40),
                out=tmp_path / "raw_responses.jsonl",
                servers=(late.url, live.url),
                tokenizer=KIMI_TOKENIZER,
                profile="kimi-k2.5",
                canary=0,
                concurrency=2,
                retry_backoff=0.05,
                retry_backoff_cap=0.2,
            )
        )
        back = asyncio.create_task(bring_back_later())
        result = await Generator(plan, events).run()
        await back
        return result

    result = asyncio.run(run())

    assert result.stats.written == 40 and result.stats.retries == 0
    assert late.received, "the server that came back got no request"
    assert any("back in the rotation" in n and late.url in n for n in events.notices)
    generation = json.loads((tmp_path / "generation.json").read_text())
    assert all(s["model_path"] for s in generation["servers"])  # recorded once it answered


def test_a_server_dying_mid_run_leaves_the_rotation_and_the_other_finishes(servers, tmp_path):
    dying, live = servers(delay=0.02), servers(delay=0.02)
    events = Recorder()

    class KillAfterFive(Recorder):
        def progress(self, stats) -> None:
            if stats.written == 5 and dying.generate_requests and not self.warnings:
                dying.refuse_connections()
            events.progress(stats)

        def warning(self, message: str) -> None:
            self.warnings.append(message)
            events.warning(message)

    result, _ = run_core(
        tmp_path, (dying.url, live.url), 40, KillAfterFive(), concurrency=4, retry_backoff=0.05
    )

    assert result.stats.written == 40 and result.stats.errors == 0
    samples = read_samples(tmp_path / "out" / "raw_responses.jsonl")
    assert len({str(s["id"]) for s in samples}) == 40
    assert result.stats.retries <= 4  # at most the requests in flight when it died
    assert any(dying.url in w and "left the rotation" in w for w in events.warnings)


def test_every_server_gone_mid_run_stops_with_one_message_and_the_run_resumes(servers, tmp_path):
    server = servers(delay=0.02)
    prompts = make_prompts(tmp_path / "prompts.jsonl", n=30)
    out = tmp_path / "raw_responses.jsonl"

    class KillAfterFive(GenerationEvents):
        def progress(self, stats) -> None:
            if stats.written == 5:
                server.refuse_connections()

    plan = plan_generation(
        GenerateOptions(
            prompts=prompts,
            out=out,
            servers=(server.url,),
            tokenizer=KIMI_TOKENIZER,
            profile="kimi-k2.5",
            canary=0,
            concurrency=2,
            max_attempts=3,
            retry_backoff=0.05,
        )
    )
    with pytest.raises(ServerError) as stopped:
        asyncio.run(Generator(plan, KillAfterFive()).run())

    message = str(stopped.value)
    assert (
        message.startswith("no server answered /health") and "run the same command again" in message
    )
    written = read_samples(out)
    assert 5 <= len(written) < 30
    assert read_errors(tmp_path) == []  # the waiting prompts were not burnt as errors

    server.accept_connections()
    result = run_cli(generate_args(prompts, out, server.url))
    assert result.exit_code == 0, result.output
    assert len({str(s["id"]) for s in read_samples(out)}) == 30 == len(read_samples(out))


def test_what_a_server_reports_about_itself_is_printed_as_text_not_markup(servers, tmp_path):
    server = servers(model_path="/models/[/]Evil[bold")
    prompts = make_prompts(tmp_path / "prompts.jsonl", n=2)
    out = tmp_path / "raw_responses.jsonl"
    result = run_cli(generate_args(prompts, out, server.url, extra=("--canary", "0")))
    assert result.exit_code == 0, result.output
    assert "serves tokenizer '/models/[/]Evil[bold'" in result.output


@pytest.mark.parametrize("url", ["http://", "http://127.0.0.1:99999", "http://[::1", "ftp://host"])
def test_a_server_url_that_cannot_be_one_is_refused_before_anything_is_sent(tmp_path, url):
    prompts = make_prompts(tmp_path / "prompts.jsonl", n=1)
    result = run_cli(generate_args(prompts, tmp_path / "out.jsonl", url))
    assert result.exit_code == 2 and "expected a URL such as" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "out.jsonl").exists()

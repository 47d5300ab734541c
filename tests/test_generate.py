"""`audit generate` against a real HTTP server on loopback (tests/sglang_standin.py), no mocks."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from audit.flows.checking import check_session
from audit.flows.session import CheckOptions, prepare
from audit.flows.targets import resolve_target
from audit.generate import scan_prompts
from audit.model.rendering.templating import prompt_ids
from tests.conftest import DEEPSEEK_TOKENIZER, KIMI_TOKENIZER, ROOT
from tests.generate_support import (
    KIMI_END_OF_TURN,
    N_PROMPTS,
    generate_args,
    make_prompts,
    read_samples,
    run_cli,
    template_ids,
)


def test_every_prompt_once_through_503s_with_the_template_ids_and_the_server_ids(
    servers, tmp_path, kimi_tokenizer
):
    server = servers(fail_every=4)
    prompts = make_prompts(tmp_path / "prompts.jsonl")
    out = tmp_path / "B9" / "raw_responses.jsonl"

    result = run_cli(generate_args(prompts, out, server.url, extra=("--concurrency", "8")))

    assert result.exit_code == 0, result.output
    samples = read_samples(out)
    sources = {str(p["id"]): p for p in map(json.loads, prompts.read_text().splitlines())}
    assert sorted(str(s["id"]) for s in samples) == sorted(sources)
    for sample in samples:
        source = sources[str(sample["id"])]
        assert sample["id"] == source["id"]  # the id keeps its JSON type
        assert sample["messages"] == source["messages"]
        assert sample["input_ids"] == template_ids(kimi_tokenizer, source)
        assert sample["output_ids"] == server.sent[tuple(sample["input_ids"])]
        assert sample["output_ids"][-1] == KIMI_END_OF_TURN
        assert sample["meta_info"]["completion_tokens"] == len(sample["output_ids"])
        assert sample["text"] == kimi_tokenizer.decode_batch([sample["output_ids"]])[0]
    assert server.generate_requests >= N_PROMPTS + N_PROMPTS // 4  # the 503s were retried
    for body in server.received:
        assert set(body) == {"input_ids", "sampling_params"}
        assert body["sampling_params"] == {
            "max_new_tokens": 16384,
            "stop_token_ids": [KIMI_END_OF_TURN],
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "no_stop_trim": True,
        }
    assert not (out.parent / "errors.jsonl").exists()

    # generation.json tells `audit check` how to audit the partition, and it passes.
    generation = json.loads((out.parent / "generation.json").read_text())
    assert generation["profile"] == "kimi-k2.5" and generation["thinking"] is True
    assert generation["tokenizer"]["sha256"] == kimi_tokenizer.fingerprint.sha256
    assert not Path(generation["tokenizer"]["path"]).is_absolute()
    assert generation["servers"][0]["url"] == server.url
    report = check_session(prepare(resolve_target(str(out.parent), tmp_path), CheckOptions()))
    assert report.verdict == "pass" and report.records == N_PROMPTS


def test_sigint_stops_cleanly_and_a_second_run_finishes_each_prompt_once(servers, tmp_path):
    server = servers(delay=0.03)
    prompts = make_prompts(tmp_path / "prompts.jsonl")
    out = tmp_path / "run" / "raw_responses.jsonl"
    args = generate_args(prompts, out, server.url, extra=("--concurrency", "2", "--canary", "0"))
    process = subprocess.Popen(
        [sys.executable, "-m", "audit", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not out.exists() or out.read_bytes().count(b"\n") < 5):
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)

    assert process.returncode == 130, stderr.decode()
    assert b"Traceback" not in stderr
    first = read_samples(out)
    assert 5 <= len(first) < N_PROMPTS
    assert len({str(s["id"]) for s in first}) == len(first)

    result = run_cli(generate_args(prompts, out, server.url, extra=("--concurrency", "8")))

    assert result.exit_code == 0, result.output
    samples = read_samples(out)
    assert sorted(str(s["id"]) for s in samples) == sorted(scan_prompts(prompts))
    assert samples[: len(first)] == first  # earlier samples are kept as they were
    for sample in samples:
        assert sample["output_ids"] == server.sent[tuple(sample["input_ids"])]


def test_a_partial_last_line_left_by_a_crash_is_cut_and_its_prompt_generated_again(
    servers, tmp_path
):
    server = servers()
    prompts = make_prompts(tmp_path / "prompts.jsonl")
    out = tmp_path / "raw_responses.jsonl"
    assert run_cli(generate_args(prompts, out, server.url, extra=("--limit", "3"))).exit_code == 0
    whole = out.read_bytes()
    lost = json.loads(whole.splitlines()[-1])["id"]
    out.write_bytes(
        whole[: whole.rfind(b"\n", 0, len(whole) - 1) + 1] + whole.splitlines()[-1][:57]
    )

    result = run_cli(generate_args(prompts, out, server.url))

    assert result.exit_code == 0, result.output
    assert "partial last line" in result.output
    samples = read_samples(out)
    assert sorted(str(s["id"]) for s in samples) == sorted(scan_prompts(prompts))
    assert lost in [s["id"] for s in samples[2:]]


@pytest.mark.parametrize("partial", [b"", b'{"id": "glaive-0001", "input_ids": [1, 2'])
def test_zero_bytes_after_the_last_whole_line_are_cut_and_their_prompts_generated_again(
    servers, tmp_path, partial
):
    # What a crash leaves when the file system had allocated space no write reached: zeros,
    # after the whole lines (and perhaps after a partial one).
    server = servers()
    prompts = make_prompts(tmp_path / "prompts.jsonl", n=6)
    out = tmp_path / "raw_responses.jsonl"
    assert run_cli(generate_args(prompts, out, server.url, extra=("--limit", "3"))).exit_code == 0
    written = out.read_bytes()
    zeros = (1 << 20) + 3  # past the 64 KiB the tail is read backwards in
    out.write_bytes(written + partial + b"\0" * zeros)

    result = run_cli(generate_args(prompts, out, server.url))

    assert result.exit_code == 0, result.output
    said = [line for line in result.output.splitlines() if line.startswith("resume: cut")]
    if partial:
        assert said == [
            f"resume: cut a partial last line ({len(partial)} bytes) and {zeros:,} zero bytes after it "
            f"left by a crash in {out}"
        ]
    else:
        assert said == [
            f"resume: cut {zeros:,} zero bytes after the last whole line (space allocated, never "
            f"written) left by a crash in {out}"
        ]
    assert out.read_bytes().startswith(written) and b"\0" not in out.read_bytes()
    samples = read_samples(out)
    assert sorted(str(s["id"]) for s in samples) == sorted(scan_prompts(prompts))


def test_zero_bytes_before_other_bytes_at_the_end_are_not_cut(servers, tmp_path):
    server = servers()
    prompts = make_prompts(tmp_path / "prompts.jsonl", n=4)
    out = tmp_path / "raw_responses.jsonl"
    assert run_cli(generate_args(prompts, out, server.url, extra=("--limit", "2"))).exit_code == 0
    damaged = out.read_bytes() + b"\0" * 100 + b"not ours"
    out.write_bytes(damaged)

    result = run_cli(generate_args(prompts, out, server.url))

    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"{out}:3: not a sample this generator wrote" in result.output
    assert out.read_bytes() == damaged and server.generate_requests == 2


def test_a_bad_prompt_line_names_the_flag_that_skips_it_and_the_flag_reports_each_one(servers, tmp_path):
    server = servers()
    good = make_prompts(tmp_path / "good.jsonl", n=6).read_bytes().splitlines(keepends=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b"".join([*good[:2], b'{"id": "cut", "messages": \n', *good[2:4], b"[1, 2]\n", *good[4:]]))

    refused = run_cli(generate_args(prompts, tmp_path / "refused" / "raw_responses.jsonl", server.url))
    assert refused.exit_code == 2 and server.generate_requests == 0
    (line,) = refused.output.strip().splitlines()
    assert line.startswith(f"audit: error: {prompts}:3: not valid JSON (")
    assert line.endswith("--skip-bad-lines skips such lines, reporting each")

    out = tmp_path / "B9" / "raw_responses.jsonl"
    result = run_cli(generate_args(prompts, out, server.url, extra=("--skip-bad-lines",)))

    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f"prompts: 8 rows read from {prompts} (JSONL): 6 to send, 0 refused, 0 dropped, 2 bad lines skipped" in lines
    skipped = [line.strip() for line in lines if line.strip().startswith("skipped ")]
    assert [s.split(": ", 1)[0] for s in skipped] == [f"skipped {prompts}:3", f"skipped {prompts}:6"]
    assert "not valid JSON" in skipped[0] and skipped[1].endswith("expected a JSON object (a prompt or a conversation), got a list")
    assert "· 2 bad prompt lines skipped" in lines[-1]
    assert sorted(str(s["id"]) for s in read_samples(out)) == sorted(str(json.loads(g)["id"]) for g in good)
    recorded = json.loads((out.parent / "generation.json").read_text())["skipped_prompt_lines"]
    assert recorded["count"] == 2 and [entry["line"] for entry in recorded["lines"]] == [3, 6]
    assert recorded["lines"][1]["reason"] == "expected a JSON object (a prompt or a conversation), got a list"


def test_canary_stops_a_run_whose_outputs_lack_the_response_token(servers, tmp_path):
    server = servers(strip_think=True)
    prompts = make_prompts(tmp_path / "prompts.jsonl")
    out = tmp_path / "raw_responses.jsonl"

    result = run_cli(
        generate_args(prompts, out, server.url, extra=("--canary", "10", "--concurrency", "16"))
    )

    assert result.exit_code == 1, result.output
    assert "SEG001" in result.output and "canary failed" in result.output
    assert len(read_samples(out)) == 10  # what was written stays; nothing more was sent
    assert server.generate_requests == 10


def test_a_run_no_longer_than_its_canary_is_judged_and_its_summary_gives_the_verdict(servers, tmp_path):
    prompts = make_prompts(tmp_path / "prompts.jsonl", n=4)
    out = tmp_path / "raw_responses.jsonl"
    passed = run_cli(generate_args(prompts, out, servers().url, extra=("--canary", "16")))
    assert passed.exit_code == 0, passed.output
    assert passed.output.strip().splitlines()[-1].endswith("· canary passed"), passed.output

    broken = tmp_path / "broken" / "raw_responses.jsonl"
    failed = run_cli(generate_args(prompts, broken, servers(strip_think=True).url, extra=("--canary", "16")))
    assert failed.exit_code == 1, failed.output
    assert "canary failed" in failed.output and "SEG001" in failed.output


def test_canary_zero_sends_everything(servers, tmp_path):
    server = servers(strip_think=True)
    prompts = make_prompts(tmp_path / "prompts.jsonl", n=12)
    out = tmp_path / "raw_responses.jsonl"
    result = run_cli(generate_args(prompts, out, server.url, extra=("--canary", "0")))
    assert result.exit_code == 0, result.output
    assert len(read_samples(out)) == 12


def test_rejected_requests_go_to_errors_jsonl_once_with_their_reason(
    servers, tmp_path, kimi_tokenizer
):
    server = servers(context_length=300)
    prompts = make_prompts(tmp_path / "prompts.jsonl")
    out = tmp_path / "raw_responses.jsonl"
    sources = [json.loads(line) for line in prompts.read_text().splitlines()]
    too_long = {str(p["id"]) for p in sources if len(template_ids(kimi_tokenizer, p)) > 300}
    assert 0 < len(too_long) < N_PROMPTS

    result = run_cli(generate_args(prompts, out, server.url, extra=("--canary", "0")))

    assert result.exit_code == 1
    assert "prompts failed" in result.output
    errors = [json.loads(line) for line in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert {str(e["id"]) for e in errors} == too_long
    assert all(
        e["status"] == 400 and "context length" in e["reason"] and e["attempts"] == 1
        for e in errors
    )
    assert server.generate_requests == N_PROMPTS  # a 4xx is not retried
    assert {str(s["id"]) for s in read_samples(out)} == {str(p["id"]) for p in sources} - too_long


def test_dropped_connections_are_retried_and_several_servers_share_the_load(servers, tmp_path):
    first, second = servers(drop_every=3), servers(fail_every=5)
    prompts = make_prompts(tmp_path / "prompts.jsonl")
    out = tmp_path / "raw_responses.jsonl"

    result = run_cli(
        generate_args(prompts, out, first.url, second.url, extra=("--concurrency", "6"))
    )

    assert result.exit_code == 0, result.output
    samples = read_samples(out)
    assert len(samples) == N_PROMPTS == len({str(s["id"]) for s in samples})
    assert len(first.received) > 5 and len(second.received) > 5


def test_a_server_failing_every_other_request_on_any_path_still_serves_each_prompt_once(
    servers, tmp_path
):
    server = servers(fail_every=2, fail_all_paths=True)
    prompts = make_prompts(tmp_path / "prompts.jsonl", n=12)
    out = tmp_path / "raw_responses.jsonl"
    result = run_cli(generate_args(prompts, out, server.url, extra=("--canary", "4")))
    assert result.exit_code == 0, result.output
    assert sorted(str(s["id"]) for s in read_samples(out)) == sorted(scan_prompts(prompts))
    # /health and /model_info were retried through their 503s too.
    assert json.loads((tmp_path / "generation.json").read_text())["servers"][0]["model_path"]


def test_timeouts_are_retried(servers, tmp_path):
    server = servers(delay=0.3)
    prompts = make_prompts(tmp_path / "prompts.jsonl", n=2)
    out = tmp_path / "raw_responses.jsonl"
    result = run_cli(
        generate_args(prompts, out, server.url, extra=("--timeout", "0.1", "--max-attempts", "2"))
    )
    assert result.exit_code == 1
    errors = [json.loads(line) for line in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert len(errors) == 2 and all(
        "gave up after 2 attempts" in e["reason"] and "Timeout" in e["reason"] for e in errors
    )


def test_sampling_options_are_sent_only_when_set(servers, tmp_path):
    server = servers()
    prompts = make_prompts(tmp_path / "prompts.jsonl", n=3)
    extra = ("--temperature", "0.6", "--top-p", "0.95", "--max-new-tokens", "5", "--canary", "0")
    result = run_cli(generate_args(prompts, tmp_path / "out.jsonl", server.url, extra=extra))
    assert result.exit_code == 0, result.output
    params = server.received[0]["sampling_params"]
    assert (
        params["temperature"] == 0.6 and params["top_p"] == 0.95 and params["max_new_tokens"] == 5
    )
    sample = read_samples(tmp_path / "out.jsonl")[0]
    assert sample["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert len(sample["output_ids"]) == 5


def test_thinking_off_renders_the_closed_think_prompt(servers, tmp_path, kimi_tokenizer):
    server = servers()
    prompts = make_prompts(tmp_path / "prompts.jsonl", n=2)
    out = tmp_path / "raw_responses.jsonl"
    result = run_cli(
        generate_args(prompts, out, server.url, extra=("--thinking", "off", "--canary", "0"))
    )
    assert result.exit_code == 0, result.output
    source = json.loads(prompts.read_text().splitlines()[0])
    [sample] = [s for s in read_samples(out) if s["id"] == source["id"]]
    assert sample["input_ids"] == template_ids(kimi_tokenizer, source, thinking=False)
    assert sample["input_ids"][-2:] == [163606, 163607]  # <think></think>
    assert json.loads((tmp_path / "generation.json").read_text())["thinking"] is False


@pytest.mark.parametrize("thinking", [True, False])
def test_gemma4_prompts_are_its_chat_templates_rendering_in_each_mode(tmp_path, thinking):
    """`generate --profile gemma-4` renders with the folder's template: <|think|> in the system
    turn with thinking on, the empty thought channel prefilled with it off."""
    from audit.model.tokens.tokenizer_loading import load_tokenizer
    from tests.sglang_standin import SGLangStandin

    gemma = ROOT / "fixtures" / "tokenizers" / "gemma-4-mini"
    server = SGLangStandin(gemma, think_end="<channel|>", end_of_turn="<turn|>").start()
    try:
        prompts = make_prompts(tmp_path / "prompts.jsonl", n=3)
        out = tmp_path / "raw_responses.jsonl"
        args = ["generate", str(prompts), "--tokenizer", str(gemma), "--profile", "gemma-4", "--out", str(out),
                "--server", server.url, "--retry-backoff", "0.01", "--canary", "0",
                "--thinking", "on" if thinking else "off"]
        result = run_cli(args)
        assert result.exit_code == 0, result.output
    finally:
        server.stop()
    tokenizer = load_tokenizer(gemma)
    samples = {s["id"]: s for s in read_samples(out)}
    for line in prompts.read_text().splitlines():
        source = json.loads(line)
        rendered = tokenizer.hf.apply_chat_template(
            source["messages"], tools=source.get("tools"), add_generation_prompt=True, tokenize=False,
            enable_thinking=thinking,
        )
        ids = samples[source["id"]]["input_ids"]
        assert ids == tokenizer.encode_text(rendered)
        assert (98 in ids) is thinking  # <|think|>
        ending = "<|turn>model\n" if thinking else "<|turn>model\n<|channel>thought\n<channel|>"
        assert ids[-len(tokenizer.encode_text(ending)):] == tokenizer.encode_text(ending)


def test_resuming_with_other_settings_is_refused(servers, tmp_path):
    server = servers()
    prompts = make_prompts(tmp_path / "prompts.jsonl", n=4)
    out = tmp_path / "raw_responses.jsonl"
    assert run_cli(generate_args(prompts, out, server.url, extra=("--limit", "2"))).exit_code == 0
    result = run_cli(generate_args(prompts, out, server.url, extra=("--thinking", "off")))
    assert result.exit_code == 2
    assert "thinking" in result.output and "another --out" in result.output
    assert len(read_samples(out)) == 2


def test_a_server_reporting_another_tokenizer_is_warned_about(servers, tmp_path):
    server = servers(legacy_info=True, model_path="/models/Qwen/Qwen3-8B")
    prompts = make_prompts(tmp_path / "prompts.jsonl", n=2)
    result = run_cli(
        generate_args(prompts, tmp_path / "out.jsonl", server.url, extra=("--canary", "0"))
    )
    assert result.exit_code == 0, result.output
    assert "warning" in result.output and "Qwen3-8B" in result.output
    generation = json.loads((tmp_path / "generation.json").read_text())
    assert (
        generation["servers"][0]["model_path"] == "/models/Qwen/Qwen3-8B"
    )  # read from /get_model_info


def test_no_healthy_server_is_a_usage_error(tmp_path):
    prompts = make_prompts(tmp_path / "prompts.jsonl", n=2)
    result = run_cli(generate_args(prompts, tmp_path / "out.jsonl", "http://127.0.0.1:9"))
    assert result.exit_code == 2
    assert "no server answered /health" in result.output


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            [
                '{"id": "a", "messages": [{"role": "user", "content": "x"}]}',
                '{"id": "b", "messages": ',
            ],
            "2: not valid JSON",
        ),
        (
            ['{"id": true, "messages": [{"role": "user", "content": "x"}]}'],
            "1: `id` must be a non-empty string or an integer",
        ),
        (['{"id": "a"}'], "1: needs `messages`"),
        (
            ['{"id": "a", "messages": [{"content": "x"}]}'],
            "messages[0] must be an object with a `role`",
        ),
        (
            ['{"id": 7, "messages": [{"role": "user", "content": "x"}]}'] * 2,
            "2: id 7 repeats line 1",
        ),
        (["", "  "], "no prompts"),
    ],
)
def test_bad_prompts_are_one_error_line_and_exit_2_before_any_request(
    servers, tmp_path, lines, message
):
    server = servers()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(lines) + "\n")
    out = tmp_path / "raw_responses.jsonl"
    result = run_cli(generate_args(prompts, out, server.url))
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert server.generate_requests == 0 and not out.exists()


@pytest.mark.parametrize(
    ("tokenizer_dir", "profile_tokens"),
    [(KIMI_TOKENIZER, "<think>"), (DEEPSEEK_TOKENIZER, "<think>")],
)
@pytest.mark.parametrize("thinking", [True, False])
def test_rendering_is_the_chat_template(tokenizer_dir, profile_tokens, thinking):
    from audit.model.tokens.tokenizer_loading import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    messages = [{"role": "user", "content": "Convert 12 USD to EUR."}]
    [ids] = prompt_ids(tokenizer, [messages], [None], thinking=thinking)
    rendered = tokenizer.hf.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, thinking=thinking
    )
    assert ids == tokenizer.encode_text(rendered)
    ends_open = ids[-1] == tokenizer.token_id(profile_tokens)
    assert ends_open is thinking


def test_the_standin_speaks_the_native_protocol(servers):
    server = servers()
    with httpx.Client(base_url=server.url) as client:
        assert client.get("/health").status_code == 200
        assert client.get("/model_info").json()["model_path"]
        bad = client.post(
            "/generate", json={"input_ids": [1, 2], "sampling_params": {"max_tokens": 4}}
        )
        assert bad.status_code == 400 and "max_tokens" in bad.json()["error"]["message"]
        both = client.post("/generate", json={"input_ids": [1], "text": "x"})
        assert both.status_code == 400
        batch = client.post(
            "/generate", json={"input_ids": [[5, 6], [7]], "sampling_params": {"max_new_tokens": 3}}
        )
        assert [len(item["output_ids"]) for item in batch.json()] == [3, 3]
        assert batch.json()[0]["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
        single = client.post(
            "/generate", json={"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 500}}
        ).json()
        assert single["meta_info"]["finish_reason"] == {"type": "stop", "matched": KIMI_END_OF_TURN}
        assert single["output_ids"][-1] == KIMI_END_OF_TURN and "<|im_end|>" not in single["text"]


def test_a_canary_whose_requests_are_all_rejected_stops_the_run(servers, tmp_path):
    server = servers(context_length=10)
    prompts = make_prompts(tmp_path / "prompts.jsonl")
    out = tmp_path / "raw_responses.jsonl"
    result = run_cli(generate_args(prompts, out, server.url, extra=("--canary", "4")))
    assert result.exit_code == 1
    assert "every one of the first 4 requests failed" in result.output
    assert server.generate_requests == 4
    assert len((tmp_path / "errors.jsonl").read_text().splitlines()) == 4


def test_the_core_runs_without_the_cli_and_reports_through_events(servers, tmp_path):
    import asyncio

    from audit.generate import GenerateOptions, GenerationEvents, Generator, plan_generation

    class Recorder(GenerationEvents):
        def __init__(self) -> None:
            self.snapshots: list[tuple[int, int]] = []
            self.reports: list = []

        def progress(self, stats) -> None:
            self.snapshots.append((stats.written, stats.in_flight))

        def canary(self, report) -> None:
            self.reports.append(report)

    server = servers()
    options = GenerateOptions(
        prompts=make_prompts(tmp_path / "prompts.jsonl", n=8),
        out=tmp_path / "raw_responses.jsonl",
        servers=(server.url,),
        tokenizer=KIMI_TOKENIZER,
        profile="kimi-k2.5",
        canary=3,
        concurrency=2,
    )
    events = Recorder()
    result = asyncio.run(Generator(plan_generation(options), events).run())
    assert result.stopped is None and result.stats.written == 8
    assert [r.verdict for r in events.reports] == ["pass"] and events.reports[0].records == 3
    assert events.snapshots[-1] == (8, 0)
    assert max(in_flight for _, in_flight in events.snapshots) <= 2

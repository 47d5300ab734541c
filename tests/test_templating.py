"""Prompt rendering (audit.model.rendering.templating): one path for the prompt a run sends and the one TPL001 expects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import audit
from audit.model.families.profiles import PROFILES_DIR
from audit.model.rendering.templating import (
    CHAT_TEMPLATE,
    RENDERERS,
    PromptRenderer,
    RenderFailure,
    encode_prompts,
    prompt_ids,
    render_prompts,
)
from tests.conftest import KIMI_TOKENIZER
from tests.generate_support import generate_args, make_prompts, read_samples, run_cli

HELLO = [{"role": "user", "content": "Hello, can you help?"}]
# The Kimi template reads tool_calls[i]['id']: a call without one cannot be rendered.
NO_CALL_ID = [
    {"role": "user", "content": "Convert 12 USD."},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "convert"}}]},
]


def _findings(data: Path, **options) -> list[tuple[int, str, str]]:
    report = audit.check_target(data, **options)
    return [(f["line"], f["rule"], f["message"]) for f in report.findings.iter_rows(named=True)]


def test_a_prompt_the_renderer_refuses_stays_in_its_place_and_the_rest_are_encoded_in_one_batch(
    kimi_tokenizer,
):
    texts = render_prompts(kimi_tokenizer, [HELLO, NO_CALL_ID, HELLO], [None] * 3, thinking=True)
    assert isinstance(texts[1], RenderFailure) and "UndefinedError" in texts[1].reason
    assert texts[0] == texts[2] and texts[0].endswith(
        "<|im_assistant|>assistant<|im_middle|><think>"
    )
    ids = prompt_ids(kimi_tokenizer, [HELLO, NO_CALL_ID, HELLO], [None] * 3, thinking=True)
    assert ids[1] == texts[1]
    assert ids[0] == ids[2] == encode_prompts(kimi_tokenizer, [texts[0]])[0]
    assert ids[0] == kimi_tokenizer.encode_text(texts[0])


def test_extra_kwargs_override_the_thinking_switch(kimi_tokenizer):
    [on, off] = render_prompts(
        kimi_tokenizer,
        [HELLO, HELLO],
        [None, None],
        thinking=True,
        extra_kwargs=[None, {"thinking": False}],
    )
    assert on.endswith("<think>") and off.endswith("<think></think>")


def test_a_profile_naming_an_unknown_renderer_is_one_error_line(tmp_path):
    profile = tmp_path / "kimi-encoder.toml"
    profile.write_text(
        'encoder = "deepseek-v9"\n' + (PROFILES_DIR / "kimi-k2.5.toml").read_text()
    )
    result = run_cli(
        [
            "check",
            "B0_clean",
            "--profile",
            str(profile),
            "--tokenizer",
            str(KIMI_TOKENIZER),
            "--report",
            str(tmp_path / "r.json"),
        ]
    )
    assert result.exit_code == 2
    assert (
        "encoder: no prompt encoder 'deepseek-v9'" in result.output and CHAT_TEMPLATE in result.output
    )
    assert "Traceback" not in result.output


def test_the_profiles_renderer_is_what_the_generator_sends_and_what_tpl001_expects(
    servers, tmp_path, monkeypatch, kimi_tokenizer
):
    """A family with its own encoder: name it in the profile, and both sides follow it."""

    def with_house_rules(tokenizer, messages, tools, thinking, extra):
        house = [{"role": "system", "content": "House rules: answer in one line."}, *messages]
        return RENDERERS[CHAT_TEMPLATE].render(tokenizer, house, tools, thinking, extra)

    monkeypatch.setitem(
        RENDERERS,
        "house-rules",
        PromptRenderer("house-rules", with_house_rules, lambda tokenizer: True, "nothing"),
    )
    profile = tmp_path / "kimi-house.toml"
    profile.write_text(
        'encoder = "house-rules"\n' + (PROFILES_DIR / "kimi-k2.5.toml").read_text()
    )
    server = servers()
    prompts = make_prompts(tmp_path / "prompts.jsonl", n=6)
    out = tmp_path / "P1" / "raw_responses.jsonl"
    args = generate_args(prompts, out, server.url, extra=("--canary", "3"))
    args[args.index("--profile") + 1] = str(profile)

    result = run_cli(args)

    assert result.exit_code == 0, result.output
    samples = read_samples(out)
    assert len(samples) == 6
    for text in kimi_tokenizer.decode_batch([s["input_ids"] for s in samples]):
        assert "House rules: answer in one line." in text
    # generation.json names the profile file: the audit renders with the same encoder and passes.
    assert _findings(out.parent) == []
    # The chat template alone would not give these prompts: the built-in profile flags each one.
    rules = {rule for _, rule, _ in _findings(out.parent, profile="kimi-k2.5")}
    assert rules == {"TPL001"}


def test_chat_template_kwargs_of_a_prompt_are_rendered_written_and_audited(
    servers, tmp_path, kimi_tokenizer
):
    server = servers()
    source = json.loads(make_prompts(tmp_path / "all.jsonl", n=1).read_text())
    assert source["tools"]
    declared = "// convert(amount: number, to: string): number"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps(dict(source, chat_template_kwargs={"tools_ts_str": declared})) + "\n"
    )
    out = tmp_path / "P1" / "raw_responses.jsonl"

    result = run_cli(generate_args(prompts, out, server.url, extra=("--canary", "0")))

    assert result.exit_code == 0, result.output
    [sample] = read_samples(out)
    assert sample["chat_template_kwargs"] == {"tools_ts_str": declared}
    assert declared in kimi_tokenizer.decode_batch([sample["input_ids"]])[0]
    assert _findings(out.parent) == []
    # The same ids with the arguments lost: the template renders JSON tools instead.
    del sample["chat_template_kwargs"]
    out.write_text(json.dumps(sample) + "\n")
    assert [rule for _, rule, _ in _findings(out.parent)] == ["TPL001"]


def test_a_prompt_the_template_cannot_render_is_an_error_for_that_prompt(servers, tmp_path):
    server = servers()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"id": "ok", "messages": HELLO})
        + "\n"
        # a tool's result after the call: the call is context, not an answer dropped as trailing
        + json.dumps({"id": "bad", "messages": [*NO_CALL_ID, {"role": "tool", "content": "11 EUR"}]})
        + "\n"
    )
    out = tmp_path / "raw_responses.jsonl"

    result = run_cli(generate_args(prompts, out, server.url, extra=("--canary", "0")))

    assert result.exit_code == 1 and "Traceback" not in result.output
    assert [s["id"] for s in read_samples(out)] == ["ok"]
    [error] = [json.loads(line) for line in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert error["id"] == "bad" and error["attempts"] == 0 and "UndefinedError" in error["reason"]
    assert server.generate_requests == 1


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (
            '{"id": "a", "messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": 3}',
            "`chat_template_kwargs` must be an object",
        ),
        (
            (
                '{"id": "a", "messages": [{"role": "user", "content": "x"}]}\n'
                '{"id": "a", "messages": [{"role": "user", "content": "y"}]}'
            ),
            "2: id 'a' repeats line 1",
        ),
    ],
)
def test_check_prompts_uses_the_generators_loader(tmp_path, line, says):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(line + "\n")
    result = run_cli(
        ["check", "B0_clean", "--prompts", str(prompts), "--report", str(tmp_path / "r.json")]
    )
    assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output


def test_reading_a_partition_does_not_load_the_http_client():
    import subprocess
    import sys

    code = "import sys, audit.flows.targets, audit.flows.checking; print('httpx' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- models that ship a Python encoder instead of a chat template (DeepSeek-V3.2, V4) ---------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = {
    "id": "call_0",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
}
AGENTIC = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": "", "reasoning_content": "Look.", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_0", "content": "Snow, -3 C."},
]


def test_deepseek_prompts_are_rendered_by_the_built_in_encoders(real_tokenizer_dirs):
    from audit.model.encoders import encoder
    from audit.model.families.profiles import load_profile
    from audit.model.rendering.templating import get_renderer
    from tests.conftest import real_tokenizer

    for name in ("deepseek-v3.2", "deepseek-v4"):
        _, tokenizer = real_tokenizer(real_tokenizer_dirs, name)
        profile = load_profile(name).resolve(tokenizer)
        # No chat template ships with these models: the profile's encoder renders instead.
        assert not getattr(tokenizer.hf, "chat_template", None)
        assert profile.prompt_renderer == name and get_renderer(name).available(tokenizer)
        [ids, off] = prompt_ids(
            tokenizer,
            [AGENTIC, AGENTIC],
            [[WEATHER], [WEATHER]],
            thinking=True,
            extra_kwargs=[None, {"thinking": False}],
            renderer=name,
        )
        assert ids == tokenizer.encode_text(encoder(name)(AGENTIC, [WEATHER], thinking=True))
        assert off == tokenizer.encode_text(encoder(name)(AGENTIC, [WEATHER], thinking=False))
        assert ids != off
    # V4's reasoning effort comes from the record's template arguments too.
    [effort] = render_prompts(
        tokenizer,
        [HELLO],
        [None],
        thinking=True,
        extra_kwargs=[{"reasoning_effort": "max"}],
        renderer="deepseek-v4",
    )
    assert effort.startswith("<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum")
    # A conversation the encoder (as SGLang) refuses is a failure in its place, never a crash.
    [refused] = render_prompts(
        tokenizer,
        [[{"role": "user", "content": "x"}, {"role": "oracle", "content": "y"}]],
        [None],
        thinking=True,
        renderer="deepseek-v4",
    )
    assert isinstance(refused, RenderFailure) and "EncoderError" in refused.reason


def test_arguments_that_parse_to_a_lone_surrogate_are_a_refusal_to_render_never_a_crash(real_tokenizer_dirs):
    # The encoders parse a call's arguments with Python's json, which takes "\\ud800": the
    # rendering then held a lone surrogate, and encoding it raised UnicodeEncodeError in TPL001
    # (ERR001 on the record, exit 2).
    from audit.checks.ruleset import load_rule_set
    from audit.engine.runner import audit_blocks
    from audit.model.families.profiles import load_profile
    from audit.records.batch import AuditContext
    from audit.records.sources import memory_blocks
    from tests.conftest import real_tokenizer

    call = {**CALL, "function": {"name": "get_weather", "arguments": '{"city": "\\ud800"}'}}
    messages = [*AGENTIC[:2], {**AGENTIC[2], "tool_calls": [call]}, AGENTIC[3]]
    for name in ("deepseek-v3.2", "deepseek-v4"):
        _, tokenizer = real_tokenizer(real_tokenizer_dirs, name)
        [refused] = render_prompts(tokenizer, [messages], [[WEATHER]], thinking=True, renderer=name)
        assert isinstance(refused, RenderFailure) and "U+D800, a lone surrogate" in refused.reason
        [ids] = prompt_ids(tokenizer, [AGENTIC], [[WEATHER]], thinking=True, renderer=name)
        output = tokenizer.encode_text("Snowy.<｜end▁of▁sentence｜>")
        record = {"id": "s", "input_ids": ids, "output_ids": output, "messages": messages, "tools": [WEATHER]}
        context = AuditContext(load_profile(name).resolve(tokenizer), tokenizer)
        shard = audit_blocks(memory_blocks([json.dumps(record).encode()]), context, load_rule_set())
        assert shard.internal_errors == []
        rules = {rule for part in shard.parts for rule in part.read()["rule"].to_list()}
        assert "TPL001" in rules and "ERR001" not in rules


def test_the_generator_sends_and_tpl001_expects_the_encoders_prompt(tmp_path, real_tokenizer_dirs):
    """DeepSeek-V3.2 end to end: `audit generate` renders with the built-in encoder (agentic
    continuations included), and the audit of what it wrote passes; a prompt with the tools
    preamble of DeepSeek's release file passes too, one mangled otherwise does not."""
    from audit.model.encoders import deepseek_v32
    from tests.conftest import real_tokenizer
    from tests.sglang_standin import SGLangStandin

    directory, tokenizer = real_tokenizer(real_tokenizer_dirs, "deepseek-v3.2")
    prompts = tmp_path / "prompts.jsonl"
    lines = [
        {"id": "agentic", "messages": AGENTIC, "tools": [WEATHER]},
        {"id": "call", "messages": AGENTIC[:2], "tools": [WEATHER]},
        {"id": "chat", "messages": HELLO},
    ]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "P1" / "raw_responses.jsonl"
    with SGLangStandin(directory, end_of_turn="<｜end▁of▁sentence｜>") as server:
        args = generate_args(prompts, out, server.url, extra=("--canary", "0"))
        args[args.index("--tokenizer") + 1] = str(directory)
        args[args.index("--profile") + 1] = "deepseek-v3.2"
        result = run_cli(args)

    assert result.exit_code == 0, result.output
    samples = {sample["id"]: sample for sample in read_samples(out)}
    decoded = tokenizer.decode_batch([s["input_ids"] for s in samples.values()])
    texts = dict(zip(samples, decoded, strict=True))
    # After tool results: no <｜Assistant｜>, the reasoning re-opened.
    assert texts["agentic"].endswith("</function_results>\n\n<think>")
    assert "## Tools\nYou have access" in texts["call"]  # SGLang's preamble
    assert _findings(out.parent) == []

    release = deepseek_v32.render(
        AGENTIC[:2], [WEATHER], thinking=True, tools_preamble=deepseek_v32.RELEASE_TOOLS_PREAMBLE
    )
    mangled = release.replace("## Tools\n\n", "## Tools\n", 1)  # one blank line of seven
    for text in (release, mangled):
        assert text != deepseek_v32.render(AGENTIC[:2], [WEATHER], thinking=True)
    rows = [
        dict(samples["call"], id=name, input_ids=tokenizer.encode_text(text))
        for name, text in (("release", release), ("mangled", mangled))
    ]
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert [(line, rule) for line, rule, _ in _findings(out.parent)] == [(2, "TPL001")]


def test_a_v4_prompt_at_reasoning_effort_max_passes_unless_the_record_names_another(
    tmp_path, real_tokenizer_dirs
):
    """The effort is a request option the messages do not carry: a prompt rendered at "max"
    is a real rendering of them, unless the record's own template arguments say otherwise."""
    from audit.model.encoders import deepseek_v4
    from tests.conftest import real_tokenizer

    directory, tokenizer = real_tokenizer(real_tokenizer_dirs, "deepseek-v4")
    prompt = deepseek_v4.render(AGENTIC, [WEATHER], thinking=True, reasoning_effort="max")
    at_max = tokenizer.encode_text(prompt)
    output = tokenizer.encode_text("It snows.</think>It snows, -3 C.<｜end▁of▁sentence｜>")
    base = {"input_ids": at_max, "output_ids": output, "messages": AGENTIC, "tools": [WEATHER]}
    rows = [
        {**base, "id": "unsaid"},
        {**base, "id": "said-max", "chat_template_kwargs": {"reasoning_effort": "max"}},
        {**base, "id": "said-high", "chat_template_kwargs": {"reasoning_effort": "high"}},
    ]
    data = tmp_path / "P" / "raw_responses.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    found = _findings(data.parent, profile="deepseek-v4", tokenizer=directory)
    assert [(line, rule) for line, rule, _ in found] == [(3, "TPL001")]

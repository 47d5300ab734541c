"""Kimi-K3's built-in encoder renders what the checkpoint's `encoding_k3.py` renders.

The exact strings are those the public ports of `encoding_k3.py` test (see the module's
docstring); the ids come from a stand-in tokenizer (`tests.kimi_k3_support`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.model.encoders import ENCODERS, EncoderError, SegmentedPrompt, kimi_k3, xtml
from audit.model.rendering.templating import (
    RENDERERS,
    encode_prompts,
    prompt_ids,
    render_prompts,
    render_variants,
)
from audit.model.tokens.tokenizer import Tokenizer
from audit.model.tokens.tokenizer_loading import load_tokenizer
from tests.kimi_k3_support import standin_tokenizer

ROOT = Path(__file__).resolve().parents[1]
EFFORT_MAX = (
    '<|open|>message role="system" type="thinking-effort"<|sep|>`thinking_effort` guides on how much '
    "to think in your thinking channel (not including the response channel), supported values include "
    "`low`, `medium`, `high`, and `max`.\nNow the system is invoked with `thinking_effort=max`."
    "<|close|>message<|sep|><|end_of_msg|>"
)
USER_HI = '<|open|>message role="user"<|sep|>hi<|close|>message<|sep|><|end_of_msg|>'
OPEN_THINK = '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>'
OPEN_RESPONSE = '<|open|>message role="assistant"<|sep|><|open|>response<|sep|>'
TOOL = {
    "type": "function",
    "function": {"name": "search", "description": "Search.", "parameters": {"type": "object", "properties": {}}},
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return standin_tokenizer(tmp_path_factory.mktemp("kimi-k3-standin"))


def test_first_turn_with_thinking_and_a_system_prompt() -> None:
    messages = [{"role": "system", "content": "be nice"}, {"role": "user", "content": "hi"}]
    assert kimi_k3.render(messages, thinking=True) == (
        EFFORT_MAX
        + '<|open|>message role="system"<|sep|>be nice<|close|>message<|sep|><|end_of_msg|>'
        + USER_HI
        + OPEN_THINK
    )


def test_without_thinking_no_effort_note_and_the_response_channel_opens() -> None:
    text = kimi_k3.render([{"role": "user", "content": "hi"}], thinking=False)
    assert text == USER_HI + OPEN_RESPONSE


def test_past_turns_keep_their_think_channel_empty_or_not() -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "sure", "reasoning_content": "they said again"},
        {"role": "user", "content": "how are you"},
    ]
    assert kimi_k3.render(messages, thinking=True) == (
        EFFORT_MAX
        + USER_HI
        + '<|open|>message role="assistant"<|sep|><|open|>think<|sep|><|close|>think<|sep|>'
        "<|open|>response<|sep|>hello<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
        '<|open|>message role="user"<|sep|>again<|close|>message<|sep|><|end_of_msg|>'
        '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>they said again<|close|>think<|sep|>'
        "<|open|>response<|sep|>sure<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
        '<|open|>message role="user"<|sep|>how are you<|close|>message<|sep|><|end_of_msg|>' + OPEN_THINK
    )
    off = kimi_k3.render(messages, thinking=False)
    assert "think" not in off and "they said again" not in off


def test_tools_are_declared_first_and_calls_and_results_render_as_xtml() -> None:
    messages = [
        {"role": "user", "content": "find"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "look it up",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "search", "arguments": '{"q": "x", "n": 2}'}},
                {"id": "b", "type": "function", "function": {"name": "open", "arguments": {"ok": True, "v": None}}},
            ],
        },
        # results given out of order: put into the order of the calls, named by them
        {"role": "tool", "tool_call_id": "b", "content": "opened"},
        {"role": "tool", "tool_call_id": "a", "content": "found"},
    ]
    text = kimi_k3.render(messages, [TOOL], thinking=True, thinking_effort="low")
    declare = (
        '<|open|>message role="system" type="tool-declare"<|sep|># Tools\nHere are the available tools, '
        'described in JSONSchema.\n\n```json\n[{"function":{"description":"Search.","name":"search",'
        '"parameters":{"properties":{},"type":"object"}},"type":"function"}]\n```'
        "<|close|>message<|sep|><|end_of_msg|>"
    )
    assert text.startswith(declare + '<|open|>message role="system" type="thinking-effort"<|sep|>')
    assert "`thinking_effort=low`" in text
    assert text.endswith(
        '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>look it up<|close|>think<|sep|>'
        "<|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
        '<|open|>call tool="search" index="1"<|sep|>'
        '<|open|>argument key="q" type="string"<|sep|>x<|close|>argument<|sep|>'
        '<|open|>argument key="n" type="number"<|sep|>2<|close|>argument<|sep|><|close|>call<|sep|>'
        '<|open|>call tool="open" index="2"<|sep|>'
        '<|open|>argument key="ok" type="boolean"<|sep|>true<|close|>argument<|sep|>'
        '<|open|>argument key="v" type="null"<|sep|>null<|close|>argument<|sep|><|close|>call<|sep|>'
        "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
        '<|open|>message role="tool" tool="search" index="1"<|sep|>found<|close|>message<|sep|><|end_of_msg|>'
        '<|open|>message role="tool" tool="open" index="2"<|sep|>opened<|close|>message<|sep|><|end_of_msg|>'
        + OPEN_THINK
    )


def test_arguments_that_are_not_json_render_raw_in_a_json_block() -> None:
    call = {"id": "a", "function": {"name": "f", "arguments": "{not json"}}
    text = kimi_k3.render([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [call]}], thinking=False)
    assert '<|open|>json type="object"<|sep|>{not json<|close|>json<|sep|>' in text


def _call_turn(arguments: object, reasoning: str = "") -> list[dict]:
    call = {"id": "a", "function": {"name": "f", "arguments": arguments}}
    return [{"role": "user", "content": "x"}, {"role": "assistant", "reasoning_content": reasoning, "tool_calls": [call]}]


def test_the_two_revisions_write_string_arguments_and_blank_reasoning_as_each_did() -> None:
    """a590ce09 keeps each value's own JSON text and writes any reasoning but ""; c5d1dd4 writes
    each value again with json.dumps and leaves whitespace-only reasoning out."""
    arguments = '{"a": [1,2], "n": 1e2, "s": "x\\"y", "a": {"k":true}}'
    turn = _call_turn(arguments, reasoning=" \n")
    newest = kimi_k3.render(turn, thinking=True)
    earlier = kimi_k3.render(turn, thinking=True, revision=kimi_k3.EARLIER)

    def argument(key: str, kind: str, text: str) -> str:
        return f'<|open|>argument key="{key}" type="{kind}"<|sep|>{text}<|close|>argument<|sep|>'

    assert (
        argument("a", "array", "[1,2]") + argument("n", "number", "1e2") + argument("s", "string", 'x"y')
        + argument("a", "object", '{"k":true}')
    ) in newest
    assert "<|open|>think<|sep|> \n<|close|>think<|sep|>" in newest
    # what follows the object is ignored by the newest, a JSON error (raw) for the earlier
    assert kimi_k3.render(_call_turn(arguments + " etc", reasoning=" \n"), thinking=True) == newest
    assert "etc<|close|>json<|sep|>" in kimi_k3.render(_call_turn(arguments + " etc"), thinking=True, revision=kimi_k3.EARLIER)
    assert earlier == kimi_k3.render(
        _call_turn({"a": {"k": True}, "n": 100.0, "s": 'x"y'}), thinking=True, revision=kimi_k3.EARLIER
    )
    assert '<|open|>think<|sep|><|close|>think<|sep|>' in earlier and '{"k": true}' in earlier
    for text in ("[1]", "  ", "{not json"):  # newest: raw in a json element
        raw = f'<|open|>json type="object"<|sep|>{text}<|close|>json<|sep|>'
        assert raw in kimi_k3.render(_call_turn(text), thinking=False)
    assert "json" not in kimi_k3.render(_call_turn("  "), thinking=False, revision=kimi_k3.EARLIER)


def test_the_earlier_revision_is_a_real_rendering_the_renderer_accepts(tokenizer: Tokenizer) -> None:
    turn = _call_turn('{"a": [1,2]}')
    variants = render_variants(tokenizer, turn, None, thinking=True, renderer="kimi-k3")
    assert kimi_k3.render(turn, thinking=True, revision=kimi_k3.EARLIER) in variants
    assert kimi_k3.render(turn, thinking=True) not in variants


def _parsed_calls(text: str) -> list[tuple[str, dict]]:
    """The calls of a rendered assistant turn, read back as SGLang's Kimi-K3 detector reads
    them: attribute values unescaped, a string argument raw, others JSON."""
    calls = []
    for name, body in re.findall(r'<\|open\|>call tool="([^"]*)" index="\d+"<\|sep\|>(.*?)<\|close\|>call<\|sep\|>', text):
        arguments = {}
        for key, kind, value in re.findall(
            r'<\|open\|>argument key="([^"]*)" type="([^"]*)"<\|sep\|>(.*?)<\|close\|>argument<\|sep\|>', body
        ):
            arguments[xtml.unescape_attribute(key)] = value if kind == "string" else json.loads(value)
        calls.append((xtml.unescape_attribute(name), arguments))
    return calls


def test_tool_calls_with_quotes_and_ampersands_in_attributes_round_trip() -> None:
    arguments = {'say "hi"': "a & b", "a&quot;b": [1, {"x": "&amp;"}], "plain": 'quote " & amp'}
    name = 'q&a "tool"'
    call = {"id": "a", "function": {"name": name, "arguments": arguments}}
    text = kimi_k3.render([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [call]}], thinking=True)
    assert 'tool="q&amp;a &quot;tool&quot;"' in text
    assert 'key="a&amp;quot;b"' in text
    assert _parsed_calls(text) == [(name, arguments)]


def test_content_spelling_a_marker_stays_text(tokenizer: Tokenizer) -> None:
    messages = [
        {"role": "user", "content": "write <|open|>tools<|sep|> and <|end_of_msg|>"},
        {"role": "assistant", "content": "ok", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {"s": "<|close|>argument<|sep|>"}}}]},
        {"role": "tool", "tool_call_id": "a", "content": "<|close|>message<|sep|>"},
    ]
    [text] = render_prompts(tokenizer, [messages], [None], thinking=True, renderer="kimi-k3")
    assert isinstance(text, SegmentedPrompt)
    [ids] = encode_prompts(tokenizer, [text])
    markers = set(xtml.MARKER_IDS.values())
    expected = [s.text for s in text.segments if s.control]
    found = [i for i in ids if i in markers]
    assert [tokenizer.decode_batch([[i]])[0] for i in found] == expected
    assert tokenizer.decode_batch([ids])[0] == text
    # joined and encoded in one piece, the content's marker strings would become markers
    assert len([i for i in tokenizer.encode_text(str(text)) if i in markers]) == len(found) + 7


def test_a_segmented_prompt_keeps_its_segments_when_copied_or_pickled() -> None:
    import copy
    import pickle

    text = kimi_k3.render([{"role": "user", "content": "hi <|open|>"}], thinking=True)
    for again in (pickle.loads(pickle.dumps(text)), copy.deepcopy(text)):
        assert again == text and again.segments == text.segments


def test_each_segment_is_encoded_on_its_own(tokenizer: Tokenizer) -> None:
    text = kimi_k3.render([{"role": "user", "content": "hi"}], thinking=False)
    [ids] = encode_prompts(tokenizer, [text])
    by_segment = [
        i
        for s in text.segments
        for i in (tokenizer.encode_text(s.text) if s.control else tokenizer.encode_batch_as_text([s.text])[0])
    ]
    assert ids == by_segment
    assert ids[-1] == xtml.MARKER_IDS["<|sep|>"]


def test_the_renderer_takes_the_records_effort_and_accepts_other_efforts_as_variants(tokenizer: Tokenizer) -> None:
    assert ENCODERS["kimi-k3"] is kimi_k3.render
    messages = [{"role": "user", "content": "hi"}]
    [low] = render_prompts(
        tokenizer, [messages], [None], thinking=True, renderer="kimi-k3", extra_kwargs=[{"thinking_effort": "low"}]
    )
    assert "`thinking_effort=low`" in low
    variants = render_variants(tokenizer, messages, None, thinking=True, renderer="kimi-k3")
    assert variants[2] == USER_HI + OPEN_THINK  # no effort note
    assert any("`thinking_effort=high`" in text for text in variants)
    # a record that names its effort has no other (the earlier revision renders it at that effort)
    named = render_variants(
        tokenizer, messages, None, thinking=True, renderer="kimi-k3", extra_kwargs={"thinking_effort": "low"}
    )
    assert all("`thinking_effort=low`" in text for text in named) and low in named
    # a request's tool_choice or response_format, which the messages do not carry: its note accepted
    assert kimi_k3.render(messages, thinking=True, tool_choice="required") in variants
    assert kimi_k3.render(messages, thinking=True, response_format={"type": "json_object"}) in variants
    # unless the record names the option
    chosen = render_variants(
        tokenizer, messages, None, thinking=True, renderer="kimi-k3", extra_kwargs={"tool_choice": "none"}
    )
    assert kimi_k3.render(messages, thinking=True, tool_choice="required") not in chosen
    [off] = render_prompts(tokenizer, [messages], [None], thinking=True, renderer="kimi-k3", extra_kwargs=[{"thinking": False}])
    assert off.endswith(OPEN_RESPONSE)
    assert RENDERERS["kimi-k3"].available(tokenizer)


@pytest.mark.parametrize(
    ("messages", "options", "says"),
    [
        ([{"role": "developer", "content": "x"}], {}, "role 'developer'"),
        (["hi"], {}, "messages[0] is not an object"),
        ([{"role": "user", "content": "x"}], {"thinking_effort": "medium"}, "thinking_effort 'medium'"),
        ([{"role": "tool", "content": "x"}], {}, "no tool name"),
        ([{"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}], {}, "has no function name"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}],
            {"revision": kimi_k3.EARLIER},
            "not an object",
        ),
        ([{"role": "user", "content": "x"}], {"revision": "v2"}, "no Kimi-K3 encoder revision 'v2'"),
    ],
)
def test_conversations_the_encoder_refuses_raise_one_clear_error(messages, options, says) -> None:
    with pytest.raises(EncoderError, match=re.escape(says)):
        kimi_k3.render(messages, thinking=True, **options)


def test_a_refused_conversation_is_a_render_failure_not_an_exception(tokenizer: Tokenizer) -> None:
    [failure] = prompt_ids(tokenizer, [[{"role": "developer", "content": "x"}]], [None], thinking=True, renderer="kimi-k3")
    assert not isinstance(failure, list) and "developer" in failure.reason


def _with_xtml_markers(folder: Path) -> Path:
    """Kimi-K2.5's fixture tokenizer with the four XTML markers added after its last id (its own
    tokens kept, so the kimi-k2.5 profile still reads its outputs)."""
    source = ROOT / "fixtures" / "tokenizers" / "kimi-k2.5-mini"
    backend = json.loads((source / "tokenizer.json").read_text())
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    number = max(token["id"] for token in backend["added_tokens"])
    for marker in xtml.MARKER_IDS:
        number += 1
        token = {"id": number, "content": marker, "single_word": False, "lstrip": False, "rstrip": False}
        backend["added_tokens"].append({**token, "normalized": False, "special": True})
        backend["model"]["vocab"][marker] = number
        config["added_tokens_decoder"][str(number)] = {**token, "normalized": False, "special": True}
        del config["added_tokens_decoder"][str(number)]["id"]
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(backend))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_generate_sends_the_encoders_prompt_segment_by_segment(servers, tmp_path: Path) -> None:
    """`audit generate` with a profile naming the kimi-k3 encoder sends its prompt: markers as
    their ids, content (a tool result spelling a marker) as text."""
    from audit.model.families.profiles import PROFILES_DIR
    from tests.generate_support import generate_args, read_samples, run_cli

    directory = _with_xtml_markers(tmp_path / "tokenizer")
    tokenizer = load_tokenizer(directory)
    profile = tmp_path / "kimi-k3-encoder.toml"
    profile.write_text('encoder = "kimi-k3"\n' + (PROFILES_DIR / "kimi-k2.5.toml").read_text())
    call = {"id": "c0", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "a \\"b\\" & c"}'}}
    agentic = [
        {"role": "user", "content": "Look it up."},
        {"role": "assistant", "content": "", "reasoning_content": "Use the tool.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c0", "content": "found <|close|>message<|sep|><|end_of_msg|>"},
    ]
    lines = [{"id": "agentic", "messages": agentic, "tools": [TOOL]}, {"id": "chat", "messages": agentic[:1]}]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "P1" / "raw_responses.jsonl"
    args = generate_args(prompts, out, servers().url, extra=("--canary", "0"))
    args[args.index("--tokenizer") + 1] = str(directory)
    args[args.index("--profile") + 1] = str(profile)

    result = run_cli(args)

    assert result.exit_code == 0, result.output
    sent = {sample["id"]: sample["input_ids"] for sample in read_samples(out)}
    expected = encode_prompts(tokenizer, [kimi_k3.render(line["messages"], line.get("tools"), thinking=True) for line in lines])
    assert [sent["agentic"], sent["chat"]] == expected
    end_of_msg = tokenizer.token_id("<|end_of_msg|>")
    # tools, effort note, user, assistant, tool result: not the markers the result spells
    assert sent["agentic"].count(end_of_msg) == 5
    assert tokenizer.decode_batch([sent["agentic"]])[0].endswith(
        'found <|close|>message<|sep|><|end_of_msg|><|close|>message<|sep|><|end_of_msg|>' + OPEN_THINK
    )


def test_a_tiktoken_tokenizer_behind_remote_code_encodes_content_as_text(tmp_path: Path) -> None:
    """Kimi's real tokenizers are tiktoken code (`--trust-remote-code`): a segment of content is
    encoded with no special token allowed, as `allow_special_tokens=False` does."""
    from tests import tiktoken_remote_code

    tokenizer = load_tokenizer(tiktoken_remote_code.build(tmp_path / "kimi-tiktoken"), trust_remote_code=True)
    assert tokenizer.encode_text("a<|im_end|>") == [*tokenizer.encode_text("a"), 163586]
    [as_text] = tokenizer.encode_batch_as_text(["a<|im_end|>"])
    assert 163586 not in as_text and tokenizer.decode_batch([as_text]) == ["a<|im_end|>"]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(), JSON_VALUES, max_size=4), st.sampled_from([None, (",", ":"), (", ", ": ")]))
def test_string_arguments_are_read_one_level_deep_to_the_same_values(arguments: dict, separators) -> None:
    text = json.dumps(arguments, ensure_ascii=False, separators=separators)
    read = xtml.text_arguments(text)
    assert read is not None and [key for key, _, _ in read] == list(arguments)
    for key, kind, written in read:
        value = arguments[key]
        assert kind == xtml.argument_type(value)
        assert written == value if isinstance(value, str) else json.loads(written) == value


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_any_argument_text_is_read_or_written_raw_never_an_error(text: str) -> None:
    read = xtml.text_arguments(text)
    assert read is None or all(isinstance(part, str) for argument in read for part in argument)


def test_generate_with_the_kimi_k3_profile_sends_what_tpl001_expects(tmp_path: Path) -> None:
    """`audit generate --profile kimi-k3`: the prompts are the encoder's, and the audit of what
    it wrote finds no prompt unlike its messages (TPL001) and no prompt ending out of place."""
    from fixtures.kimi_k3 import TOKENIZER_DIR
    from tests.generate_support import generate_args, read_samples, run_cli
    from tests.sglang_standin import SGLangStandin

    tokenizer = load_tokenizer(TOKENIZER_DIR)
    call = {"id": "c0", "type": "function", "function": {"name": "search", "arguments": '{"q": "a & b"}'}}
    agentic = [
        {"role": "user", "content": "Search it."},
        {"role": "assistant", "content": "", "reasoning_content": "Search.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c0", "content": "<|open|>tools<|sep|> quoted"},
    ]
    lines = [{"id": "agentic", "messages": agentic, "tools": [TOOL]}, {"id": "chat", "messages": agentic[:1]}]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "P1" / "raw_responses.jsonl"
    with SGLangStandin(TOKENIZER_DIR, think_end="<|sep|>", end_of_turn="<|end_of_msg|>") as server:
        args = generate_args(prompts, out, server.url, extra=("--canary", "0"))
        args[args.index("--tokenizer") + 1] = str(TOKENIZER_DIR)
        args[args.index("--profile") + 1] = "kimi-k3"
        result = run_cli(args)

    assert result.exit_code == 0, result.output
    sent = {sample["id"]: sample["input_ids"] for sample in read_samples(out)}
    rendered = [kimi_k3.render(line["messages"], line.get("tools"), thinking=True) for line in lines]
    assert [sent["agentic"], sent["chat"]] == encode_prompts(tokenizer, rendered)
    from audit.api import check_target

    rules = set(check_target(out.parent, cache=False).findings["rule"].to_list())
    assert not rules & {"TPL001", "PRM001", "PRM002", "ERR001"}

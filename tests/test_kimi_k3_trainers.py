"""Kimi-K3 data through the trainers: SpecForge's `kimi-k3-thinking` template and speculators render
with the checkpoint tokenizer's Python renderer (audit's kimi-k3 encoder,
`audit.model.rendering.chat_rendering`), on the stand-in tokenizer (`tests.kimi_k3_support`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from audit.base.errors import ConfigError
from audit.model.encoders import kimi_k3
from audit.model.rendering.templating import encode_prompts
from audit.model.tokens.tokenizer import Tokenizer
from audit.model.tokens.tokenizer_loading import load_tokenizer
from audit.model.trainers.specforge import TrainedSequence, specforge_samples
from audit.model.trainers.speculators import SpeculatorsResult, speculators_rows
from audit.model.trainers.trainer_rules import resolve_trainer
from tests.kimi_k3_support import standin_tokenizer

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "c0", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
CONVERSATION = [
    {"role": "user", "content": "Find x."},
    {"role": "assistant", "content": "", "reasoning_content": "Use the tool.", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c0", "content": "x is 1"},
    {"role": "assistant", "content": "x is 1.", "reasoning_content": "Got it."},
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return standin_tokenizer(tmp_path_factory.mktemp("kimi-k3-standin"))


def _trained(tokenizer: Tokenizer, ids: np.ndarray, mask: np.ndarray) -> list[str]:
    """The text of each run of trained tokens."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    return tokenizer.decode_batch([ids[a:b].tolist() for a, b in zip(edges[::2], edges[1::2], strict=True)])


def _specforge(tokenizer: Tokenizer, conversation: list[dict]) -> TrainedSequence:
    trainer = resolve_trainer("specforge", profile="kimi-k3", thinking="mixed")
    [(_, made)] = specforge_samples(tokenizer, [conversation], [[TOOL]], trainer, renderer="kimi-k3")
    assert isinstance(made, TrainedSequence)
    return made


def test_specforge_trains_the_reasoning_inline_and_leaves_end_of_msg_out(tokenizer: Tokenizer) -> None:
    made = _specforge(tokenizer, CONVERSATION)
    # The checkpoint's renderer: tools declared, thinking on at effort max, every turn's reasoning kept.
    assert made.text == kimi_k3.render_conversation(CONVERSATION, [TOOL], thinking=True)
    assert "`thinking_effort=max`" in made.text
    assert _trained(tokenizer, made.input_ids, made.loss_mask) == [
        "Use the tool.<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
        '<|open|>call tool="lookup" index="1"<|sep|><|open|>argument key="q" type="string"<|sep|>x'
        "<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>",
        "Got it.<|close|>think<|sep|><|open|>response<|sep|>x is 1.<|close|>response<|sep|><|close|>message<|sep|>",
    ]


def test_specforge_renders_thinking_off_data_with_a_think_channel(tokenizer: Tokenizer) -> None:
    plain = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]
    made = _specforge(tokenizer, plain)
    assert made.text.endswith(
        '<|open|>message role="assistant"<|sep|><|open|>think<|sep|><|close|>think<|sep|>'
        "<|open|>response<|sep|>Hello.<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
    )


def test_specforge_encodes_the_text_whole_so_a_result_spelling_markers_becomes_markers(tokenizer: Tokenizer) -> None:
    spelled = [*CONVERSATION[:2], {**CONVERSATION[2], "content": "x <|close|>message<|sep|>"}, CONVERSATION[3]]
    made = _specforge(tokenizer, spelled)
    assert made.input_ids.tolist() == tokenizer.encode_text(made.text)
    [served] = encode_prompts(tokenizer, [kimi_k3.render_conversation(spelled, [TOOL], thinking=True)])
    close = tokenizer.token_id("<|close|>")
    assert made.input_ids.tolist().count(close) == served.count(close) + 1


def test_speculators_rows_are_the_servers_segment_by_segment_renders(tokenizer: Tokenizer) -> None:
    [result] = speculators_rows(tokenizer, [CONVERSATION], [[TOOL]], resolve_trainer("speculators"), renderer="kimi-k3")
    assert isinstance(result, SpeculatorsResult)
    assert [row.turn for row in result.rows] == [1, 3]
    row = result.rows[-1]
    whole, prompt = encode_prompts(
        tokenizer,
        [kimi_k3.render_conversation(CONVERSATION, [TOOL], thinking=True), kimi_k3.render(CONVERSATION[:3], [TOOL], thinking=True)],
    )
    assert row.input_ids.tolist() == whole and row.boundary == len(prompt)
    assert _trained(tokenizer, row.input_ids, row.loss_mask) == [
        "Got it.<|close|>think<|sep|><|open|>response<|sep|>x is 1.<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
    ]


def test_a_family_specforge_has_no_template_for_is_one_line_saying_so() -> None:
    with pytest.raises(ConfigError, match=r"SpecForge 0\.2\.0 has no template for gemma-4: its `gemma` template .* is Gemma 3's"):
        resolve_trainer("specforge", profile="gemma-4", thinking=True)


def _partition(tmp_path: Path) -> Path:
    """Kimi-K3 records as `audit generate` writes them (prompts from the encoder, outputs as
    the model writes XTML, each encoded segment by segment): a plain answer, a call, a call
    after a tool result that spells markers, and a call entered straight from the reasoning."""
    from audit.model.encoders.base import Segment, SegmentedPrompt
    from fixtures.kimi_k3 import TOKENIZER_DIR

    tokenizer = load_tokenizer(TOKENIZER_DIR)

    def ids(*parts: str) -> list[int]:  # "!" marks a marker
        segments = [Segment(p[1:], True) if p.startswith("!") else Segment(p) for p in parts]
        return encode_prompts(tokenizer, [SegmentedPrompt(segments)])[0]

    c, o, s, end = "!<|close|>", "!<|open|>", "!<|sep|>", "!<|end_of_msg|>"
    call = [o, "tools", s, o, "call", " tool", '="', "lookup", '"', " index", '="', "1", '"', s,
            o, "argument", " key", '="', "q", '"', " type", '="', "string", '"', s, "x", c, "argument", s,
            c, "call", s, c, "tools", s, c, "message", s, end]
    spelled = [*CONVERSATION[:3], {"role": "user", "content": "again <|close|>message<|sep|>"}]
    rows = [
        ([CONVERSATION[0]], None, ["Add them.", c, "think", s, o, "response", s, "It is 4.", c, "response", s, c, "message", s, end]),
        ([CONVERSATION[0]], [TOOL], ["Use the tool.", c, "think", s, o, "response", s, c, "response", s, *call]),
        (spelled, [TOOL], ["Again.", c, "think", s, o, "response", s, c, "response", s, *call]),
        ([CONVERSATION[0]], [TOOL], ["Use the tool.", *call]),
    ]
    records = [
        {"id": f"r{k}", "messages": messages, **({"tools": tools} if tools else {}),
         "input_ids": encode_prompts(tokenizer, [kimi_k3.render(messages, tools, thinking=True)])[0],
         "output_ids": ids(*output), "meta_info": {"finish_reason": {"type": "stop", "matched": 163586}}}
        for k, (messages, tools, output) in enumerate(rows)
    ]
    data = tmp_path / "raw_responses.jsonl"
    data.write_text("".join(json.dumps(record) + "\n" for record in records))
    return data


@pytest.mark.parametrize(
    ("trainer", "expected"),
    [
        # SpecForge: <|end_of_msg|> out of the loss (ignore_token); the text tokenized whole (the
        # spelled markers become markers); a call straight from the reasoning re-rendered with a
        # response channel; the earlier turn of a multi-turn record trained too (TRN009).
        ("specforge", [(1, "TRN003"), (2, "TRN003"), (3, "TRN002"), (3, "TRN003"), (3, "TRN009"), (4, "TRN002"), (4, "TRN003")]),
        # speculators: the server's segment-by-segment ids, trained through <|end_of_msg|>.
        ("speculators", [(3, "TRN009"), (4, "TRN002")]),
    ],
)
def test_the_trainer_view_of_kimi_k3_records(tmp_path: Path, trainer: str, expected: list) -> None:
    from audit.api import check_target
    from fixtures.kimi_k3 import TOKENIZER_DIR

    data = _partition(tmp_path)
    plain = check_target(data, profile="kimi-k3", tokenizer=TOKENIZER_DIR, thinking=True, cache=False)
    # clean records, prompts as the encoder renders them (a call straight from the reasoning is counted)
    assert plain.findings.select("line", "rule").rows() == [(4, "SEG004")]
    report = check_target(data, profile="kimi-k3", tokenizer=TOKENIZER_DIR, thinking=True, trainer=trainer, cache=False)
    found = report.findings.filter(report.findings["rule"].str.starts_with("TRN"))
    assert sorted(found.select("line", "rule").rows()) == expected

"""`audit inspect`'s core: the token-by-token view of a record, built from the findings."""

from __future__ import annotations

import json
import time
from pathlib import Path

import polars as pl
import pytest

from audit.flows.checking import check_session
from audit.flows.session import CheckOptions, prepare
from audit.flows.targets import resolve_target
from audit.flows.token_view import Inspector, LineIndex
from audit.model.templating import prompt_ids
from audit.tui.detail import DetailLines
from tests.conftest import KIMI_TOKENIZER, PREPARED

LONG_REASONING = 30_000


def inspector_for(target: str, root: Path = PREPARED, **options) -> Inspector:
    session = prepare(resolve_target(target, root), CheckOptions(**options))
    report = check_session(session)
    return Inspector(session.target.data_file, report.findings, session.profile, session.tokenizer)


@pytest.fixture(scope="module")
def glaive() -> Inspector:
    return inspector_for("B1_glaive")


def write_long_partition(directory: Path) -> Path:
    """A partition of one clean record and one with a 30k-token reasoning and a second </think>."""
    from audit.model.tokenizer_loading import load_tokenizer

    tokenizer = load_tokenizer(KIMI_TOKENIZER)
    clean = json.loads((PREPARED / "B0_clean" / "raw_responses.jsonl").read_text().splitlines()[0])
    words = tokenizer.encode_text(" the user wants the weather")
    reasoning = (words * (LONG_REASONING // len(words) + 1))[:LONG_REASONING]
    think_end, end_of_turn = tokenizer.token_id("</think>"), tokenizer.token_id("<|im_end|>")
    answer = tokenizer.encode_text("It is sunny.")
    output = reasoning[:20_000] + [think_end] + reasoning[20_000:] + [think_end] + answer + [end_of_turn]
    long = {
        "id": "long-0001",
        "input_ids": clean["input_ids"],
        "output_ids": output,
        "meta_info": {"finish_reason": {"type": "stop", "matched": end_of_turn}},
    }
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "raw_responses.jsonl").open("w") as out:
        out.write(json.dumps(clean) + "\n")
        out.write(json.dumps(long) + "\n")
    (directory / "generation.json").write_text(
        json.dumps({"profile": "kimi-k2.5", "tokenizer": {"path": str(KIMI_TOKENIZER)}, "thinking": True})
    )
    return directory


def test_the_list_holds_exactly_the_labelled_lines_with_their_rules(glaive: Inspector) -> None:
    labels = json.loads((PREPARED / "B1_glaive" / "labels.json").read_text())
    assert [e.line for e in glaive.entries] == sorted(set(glaive.findings["line"].to_list()))
    assert {int(line) for line in labels} <= {e.line for e in glaive.entries}
    by_line = {e.line: e for e in glaive.entries}
    assert "PRM001" in by_line[20].rules and by_line[20].id == "glaive-0019"
    # A record whose findings are all warnings is listed as a warning, any error makes it an error.
    only_warnings = glaive.findings.group_by("line").agg((pl.col("severity") == "warning").all().alias("w"))
    for line, warning in only_warnings.iter_rows():
        assert by_line[line].severity == ("warning" if warning else "error")
    assert by_line[44].severity == "warning"  # SEG004 alone
    assert [e.line for e in glaive.select("PRM001")] == [20, 57]
    assert [e.line for e in glaive.select(query="glaive-0019")] == [20]


def test_special_tokens_get_their_role_and_the_output_its_segments(glaive: Inspector) -> None:
    view = glaive.view(44)  # a tool call entered before </think> (SEG004)
    roles = dict(view.special_tokens.select("piece", "role").iter_rows())
    assert roles["<|tool_calls_section_begin|>"] == "tool:section_begin"
    assert roles["<|im_end|>"] == "end_of_turn"
    tokens = view.output.tokens
    marked = tokens.filter(pl.col("rules").is_not_null())
    assert marked.filter(pl.col("rules").str.contains("SEG004")).select("index", "piece", "segment").rows() == [
        (86, "<|tool_calls_section_begin|>", "tool_calls")
    ]
    assert tokens["segment"][0] == "reasoning"

    answered = glaive.view(17).output.tokens  # RTR002: the ids themselves are well formed
    response_at = answered.filter(pl.col("role") == "response")["index"][0]
    segments = answered["segment"].to_list()
    assert segments[response_at] == "reasoning" and segments[response_at + 1] == "answer"


def test_prompt_suffix_finding_shows_expected_beside_actual(glaive: Inspector) -> None:
    view = glaive.view(20)
    (comparison,) = [c for c in view.comparisons if c.rule == "PRM001"]
    expected, actual = comparison.rows
    assert expected[0] == "expected" and "<|im_middle|><think>'" in expected[1]
    assert actual[0] == "actual" and actual[1].startswith("'<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>'")
    last = view.prompt.tokens.tail(1).row(0, named=True)
    assert (last["piece"], last["role"]) == ("</think>", "response") and "PRM001" in last["rules"].split(",")
    assert view.prompt.start + view.prompt.height == view.prompt.total


def test_round_trip_findings_show_decoded_text_and_both_id_lists(glaive: Inspector) -> None:
    plain_text_markers = {c.rule: c for c in glaive.view(41).comparisons}["RTR001"]
    rows = dict(plain_text_markers.rows)
    assert "<|tool_calls_" in rows["decoded"]
    assert "27:'<'" in rows["saved ids"] and "163595:'<|tool_calls_section_begin|>'" in rows["re-encoded"]
    edited = dict({c.rule: c for c in glaive.view(17).comparisons}["RTR002"].rows)
    assert "Sure! 36 times" in edited["text field"] and "Sure!" not in edited["decoded ids"]


def test_unreadable_lines_and_out_of_vocabulary_ids_are_shown_not_raised(glaive: Inspector) -> None:
    cut = glaive.view(45)
    assert cut.problem.startswith("not a JSON record") and cut.output.height == 0 and cut.raw_excerpt
    text_ids = glaive.view(27)
    assert text_ids.problem == "output_ids is not a list of token ids" and text_ids.prompt.height > 0
    foreign = glaive.view(55).output.tokens.filter(pl.col("index") == 94).row(0, named=True)
    assert (foreign["id"], foreign["role"], foreign["piece"]) == (100000, "out_of_vocabulary", "")
    assert "INT003" in foreign["rules"]
    # Every line of the detail renders, whatever the record holds.
    for line in (27, 45, 55, 7):
        assert all(text.plain is not None for text in DetailLines(glaive.view(line)))


def test_line_index_reads_single_lines_by_number_without_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"a":1}\n\n{"b":2}\n{"c":3}')
    index = LineIndex(path, chunk_bytes=3)  # chunks smaller than a line still find every newline
    assert index.lines == 4
    assert [index.read(n) for n in (1, 2, 3, 4)] == [b'{"a":1}', b"", b'{"b":2}', b'{"c":3}']
    with pytest.raises(IndexError):
        index.read(5)


def test_a_30k_token_output_builds_quickly_and_renders_any_line_lazily(tmp_path: Path) -> None:
    inspector = inspector_for(str(write_long_partition(tmp_path / "long")))
    assert [e.line for e in inspector.entries] == [2] and "SEG002" in inspector.entries[0].rules
    started = time.perf_counter()
    view = inspector.view(2)
    lines = DetailLines(view)
    built = time.perf_counter() - started
    assert view.output.height == view.output.total > LONG_REASONING
    assert view.output.tokens["segment"][20_000] == "reasoning" and view.output.tokens["segment"][20_001] == "answer"
    assert len(lines) > LONG_REASONING
    assert built < 3.0, f"building the view took {built:.2f}s"
    started = time.perf_counter()
    bottom = [lines.line(y).plain for y in range(len(lines) - 40, len(lines))]
    assert time.perf_counter() - started < 0.2
    assert "<|im_end|>" in "".join(bottom)
    marked = [lines.line(y).plain for y in lines.first_finding_lines()]
    assert any("SEG002" in row and "</think>" in row for row in marked)


def test_a_tiktoken_tokenizer_behind_remote_code_gets_roles_for_its_chat_markers(tmp_path: Path) -> None:
    from audit.model.tokenizer_loading import load_tokenizer
    from tests import tiktoken_remote_code

    directory = tiktoken_remote_code.build(tmp_path / "kimi-tiktoken")
    tokenizer = load_tokenizer(directory, trust_remote_code=True)
    prompt = prompt_ids(tokenizer, [[{"role": "user", "content": "What is 2+2?"}]], [None], thinking=True)[0]
    stripped = tokenizer.encode_text("Two and two make four. It is 4.<|im_end|>")  # </think> lost
    partition = tmp_path / "P1"
    partition.mkdir()
    record = {"id": "r-1", "input_ids": prompt, "output_ids": stripped,
              "meta_info": {"finish_reason": {"type": "stop", "matched": 163586}}}
    (partition / "raw_responses.jsonl").write_text(json.dumps(record) + "\n")
    (partition / "generation.json").write_text(json.dumps(
        {"profile": "kimi-k2.5", "tokenizer": {"path": str(directory)}, "trust_remote_code": True}
    ))
    # generation.json records the need; only the caller's own flag lets the code run.
    inspector = inspector_for(str(partition), trust_remote_code=True)
    view = inspector.view(1)
    assert "SEG001" in inspector.entries[0].rules
    roles = dict(view.prompt.tokens.filter(pl.col("role").is_not_null()).select("piece", "role").iter_rows())
    assert (roles["<|im_assistant|>"], roles["<|im_middle|>"]) == ("special", "special")
    assert (roles["<|im_end|>"], roles["<think>"]) == ("end_of_turn", "think")
    assert view.output.tokens["segment"].unique().to_list() == ["reasoning"]  # never closed


def _harmony_partition(directory: Path, harmony: Path, tokenizer) -> Path:
    """gpt-oss records: an answer after analysis, and a tool call (finish stop)."""
    from audit.model.templating import prompt_ids as render

    [prompt] = render(tokenizer, [[{"role": "user", "content": "Weather in Paris?"}]], [None], thinking=True)
    outputs = [
        "<|channel|>analysis<|message|>Think first.<|end|><|start|>assistant<|channel|>final<|message|>Sunny.<|return|>",
        (
            "<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant<|channel|>commentary"
            " to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>"
        ),
    ]
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "raw_responses.jsonl").open("w") as out:
        for n, text in enumerate(outputs):
            ids = tokenizer.encode_text(text)
            out.write(json.dumps({"id": f"h-{n}", "input_ids": prompt, "output_ids": ids,
                                  "meta_info": {"finish_reason": {"type": "stop", "matched": ids[-1]}}}) + "\n")
    (directory / "generation.json").write_text(
        json.dumps({"profile": "gpt-oss", "tokenizer": {"path": str(harmony)}, "thinking": True})
    )
    return directory


def test_harmony_outputs_get_their_channels_as_segments(tmp_path: Path, real_tokenizer_dirs) -> None:
    from tests.conftest import real_tokenizer

    harmony, tokenizer = real_tokenizer(real_tokenizer_dirs, "harmony")
    inspector = inspector_for(str(_harmony_partition(tmp_path / "oss", harmony, tokenizer)))
    answer = inspector.view(1).output.tokens
    by_piece = dict(zip(answer["piece"].to_list(), answer["segment"].to_list(), strict=False))
    assert by_piece[" first"] == "reasoning" and by_piece["final"] == "answer"
    assert answer["segment"][0] == "reasoning" and answer["segment"][-1] == "answer"
    call = inspector.view(2).output.tokens
    assert call["segment"][0] == "reasoning" and call["segment"][-1] == "tool_calls"
    assert "tool_calls" in call.filter(pl.col("piece") == "city")["segment"].to_list()


def test_inspect_shows_what_each_flagged_rule_explains(tmp_path: Path) -> None:
    # The view asks the rule that flagged the record (`Rule.explain`), not a table of its own.
    from audit.checks.base import Explanation
    from audit.checks.prompt import PromptSuffix

    class Explained(PromptSuffix):
        def explain(self, batch, row, position):
            ids = batch.records["input_ids"][row]
            return Explanation(self.code, "custom", (("last id", str(ids[-1])), ("position", str(position))))

    session = prepare(resolve_target("B1_glaive", PREPARED), CheckOptions())
    report = check_session(session)
    inspector = Inspector(session.target.data_file, report.findings, session.profile, session.tokenizer,
                          rules={"PRM001": Explained()})
    (explained,) = inspector.view(20).comparisons
    assert explained.title == "custom" and dict(explained.rows)["position"] == str(inspector.view(20).findings[0].position)
    assert dict(explained.rows)["last id"] == str(inspector.view(20).prompt.tokens["id"][-1])


def test_the_reader_normalises_the_prompt_ids_alias_for_inspect(tmp_path: Path) -> None:
    clean = json.loads((PREPARED / "B0_clean" / "raw_responses.jsonl").read_text().splitlines()[0])
    clean["prompt_ids"] = clean.pop("input_ids")
    clean["output_ids"] = clean["output_ids"][:-1]  # TRM002: a finding to list
    partition = tmp_path / "alias"
    partition.mkdir()
    (partition / "raw_responses.jsonl").write_text(json.dumps(clean) + "\n")
    (partition / "generation.json").write_text(
        json.dumps({"profile": "kimi-k2.5", "tokenizer": {"path": str(KIMI_TOKENIZER)}, "thinking": True})
    )
    view = inspector_for(str(partition)).view(1)
    assert view.problem is None and view.prompt.total == len(clean["prompt_ids"])
    assert view.prompt.tokens["id"].to_list() == clean["prompt_ids"][-view.prompt.height:]


def test_special_ids_are_the_tokens_skip_special_tokens_drops(real_tokenizer_dirs) -> None:
    from tests.conftest import real_tokenizer

    _, qwen = real_tokenizer(real_tokenizer_dirs, "qwen3")
    specials = qwen.special_ids
    assert qwen.token_id("<|im_end|>") in specials and qwen.token_id("<|endoftext|>") in specials
    assert qwen.token_id("<think>") not in specials and qwen.token_id("<tool_call>") not in specials
    ids = [qwen.token_id(t) for t in ("<think>", "<|im_end|>")]
    assert qwen.decode_batch_skipping_special([ids]) == ["<think>"]

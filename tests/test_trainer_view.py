"""The trainer view (`--trainer`): the reimplemented trainers against what the real ones made,
the view's verdicts both ways on real Qwen3 / Qwen3.6 tokenizers and templates, and the
command line around it (docs/trainer-view.md).

The references were made by SpecForge 0.2.0 and speculators 0.9.0 themselves
(fixtures/trainer_references.py; speculators against a local stand-in of vLLM's render
endpoint), on the conversations the view builds from the shipped samples.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from audit.cli import app
from audit.model.tokens.tokenizer import Tokenizer
from audit.model.trainers.specforge import Refusal, TrainedSequence, specforge_samples
from audit.model.trainers.speculators import SpeculatorsResult, speculators_rows
from audit.model.trainers.trainer_rules import TRAINERS_DIR, resolve_trainer
from tests.conftest import FIXTURES, KIMI_TOKENIZER, PREPARED, real_tokenizer, write_jsonl

REFERENCES = FIXTURES / "trainer_references"
SETS = sorted(p.stem for p in REFERENCES.glob("*__*.json"))
CONVERSATIONS = sorted(p.stem for p in (REFERENCES / "conversations").glob("*.json"))
runner = CliRunner()


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _tokenizer(key: str, dirs: dict[str, Path | None], cache: dict[str, Tokenizer] = {}) -> Tokenizer:  # noqa: B006
    if key not in cache:
        if key == "kimi-k2.5-mini":
            from audit.flows.session import shared_tokenizer

            cache[key] = shared_tokenizer(KIMI_TOKENIZER, False)
        else:
            cache[key] = real_tokenizer(dirs, key)[1]
    return cache[key]


def _partition_file(partition: str) -> Path:
    local = REFERENCES / "partitions" / partition / "raw_responses.jsonl"
    return local if local.exists() else PREPARED / partition / "raw_responses.jsonl"


def _runs(mask: np.ndarray) -> list[list[int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    return [[int(a), int(b)] for a, b in zip(edges[::2], edges[1::2], strict=True)]


# -- the reimplementation, array for array -------------------------------------------------------


@pytest.mark.parametrize("name", SETS)
def test_the_reimplementation_trains_what_the_trainer_itself_made(name: str, real_tokenizer_dirs) -> None:
    reference = _load(REFERENCES / f"{name}.json")
    meta = reference["meta"]
    given = {r["line"]: r for r in _load(REFERENCES / "conversations" / f"{meta['partition']}.json")["records"]}
    tokenizer = _tokenizer(meta["tokenizer"], real_tokenizer_dirs)
    spec = f"specforge:{meta['template']}" if meta["template"] else "speculators"
    trainer = resolve_trainer(spec, max_length=meta["max_length"])
    records = reference["records"]
    conversations = [given[r["line"]]["conversations"] for r in records]
    tools = [given[r["line"]]["tools"] for r in records]
    wrong = []
    if trainer.template is not None:
        for record, (_, made) in zip(records, specforge_samples(tokenizer, conversations, tools, trainer), strict=True):
            if "input_ids" in record:
                ok = isinstance(made, TrainedSequence) and made.input_ids.tolist() == record["input_ids"] and (
                    _runs(made.loss_mask) == record["loss_mask"])
            else:  # SpecForge raised (stops) or skipped the conversation
                ok = isinstance(made, Refusal) and made.stops == ("error" in record)
            if not ok:
                wrong.append(record["line"])
    else:
        results = speculators_rows(tokenizer, conversations, tools, trainer)
        for record, made in zip(records, results, strict=True):
            rows = made.rows if isinstance(made, SpeculatorsResult) else []
            ours = [{"input_ids": row.input_ids.tolist(), "loss_mask": _runs(row.loss_mask)} for row in rows]
            if ours != record["rows"]:
                wrong.append(record["line"])
    assert wrong == [], f"{name}: lines where the reimplementation differs from {meta}"
    assert len(records) >= 14


@pytest.mark.parametrize("partition", CONVERSATIONS)
def test_the_view_gives_the_trainers_the_conversations_the_references_were_made_from(
    partition: str, real_tokenizer_dirs
) -> None:
    # The script that made the references builds them as the view does today (trainer_inputs).
    from fixtures.trainer_references import conversations

    stored = _load(REFERENCES / "conversations" / f"{partition}.json")
    key = stored["tokenizer"]
    directory = KIMI_TOKENIZER if key == "kimi-k2.5-mini" else real_tokenizer(real_tokenizer_dirs, key)[0]
    assert conversations(partition, directory, stored["profile"]) == stored["records"]


def test_the_specforge_rules_are_the_wheels_registry_value_for_value() -> None:
    registry = _load(REFERENCES / "specforge-0.2.0-templates.json")
    data = tomllib.loads((TRAINERS_DIR / "specforge-0.2.0.toml").read_text(encoding="utf-8"))
    assert list(data["templates"]) == list(registry)  # the 26 templates, in registration order
    assert len(registry) == 26
    for name, fields in registry.items():
        table = data["templates"][name]
        for key, value in fields.items():
            assert table.get(key) == value, f"{name}.{key}"


# -- the view, both ways, on real tokenizers and templates ----------------------------------------------


def _findings(target: Path, tokenizer: Path, profile: str, trainer: str) -> pl.DataFrame:
    from audit import check_target

    report = check_target(target, tokenizer=tokenizer, profile=profile, trainer=trainer, cache=False)
    assert report.trainer_view is not None
    return report.findings


def _changed_by_the_trainer(
    record: dict[str, Any], exact: list[int], prompt: int, tokenizer: Tokenizer, *, inserted: bool = False
) -> bool:
    """What the real trainer's own arrays say: does it train other ids, or another mask over the
    record's turn? A whitespace separator after the sample is not a change; `inserted`: a
    system prompt the trainer added to the prompt is not counted here (TRN001's), only
    whether anything else differs: the sample is the trained ids less one run of prompt ids."""
    ids = list(record["input_ids"])
    mask = np.zeros(len(ids), dtype=np.int64)
    for start, end in record["loss_mask"]:
        mask[start:end] = 1
    while ids and len(ids) > len(exact) - (0 if inserted else 0) and not tokenizer.decode_batch([ids[-1:]])[0].strip():
        ids, mask = ids[:-1], mask[:-1]  # the template's separator after the last turn
    if not inserted:
        if ids != exact:
            return True
        return not (mask[prompt:].all() and (prompt == 0 or mask[prompt - 1] == 0))
    common = next((i for i, (a, b) in enumerate(zip(ids, exact, strict=False)) if a != b), min(len(ids), len(exact)))
    tail = next((i for i, (a, b) in enumerate(zip(ids[::-1], exact[::-1], strict=False)) if a != b), len(exact))
    output = len(exact) - prompt
    if common + tail < len(exact) or common > prompt or tail < output:
        return True
    start = len(ids) - output
    return not (mask[start:].all() and mask[start - 1] == 0)


@pytest.mark.parametrize(
    ("partition", "key", "profile", "template"),
    [("qwen3", "qwen3", "qwen3", "qwen3-thinking"), ("qwen3.6", "qwen-3.6", "qwen3.6", "qwen3.5")],
)
def test_the_view_flags_every_record_the_trainer_changes_and_no_record_it_keeps_intact(
    partition: str, key: str, profile: str, template: str, real_tokenizer_dirs
) -> None:
    directory, tokenizer = real_tokenizer(real_tokenizer_dirs, key)
    path = _partition_file(partition)
    labels = _load(path.parent / "labels.json")
    found = _findings(path, directory, profile, f"specforge:{template}")
    by_line: dict[int, set[str]] = {}
    for line, rule, severity in found.filter(pl.col("rule").str.starts_with("TRN")).select(
        "line", "rule", "severity"
    ).iter_rows():
        if severity == "error":
            by_line.setdefault(line, set()).add(rule)
    reference = {r["line"]: r for r in _load(REFERENCES / f"{partition}__specforge__{template}.json")["records"]}
    system_prompt = resolve_trainer(f"specforge:{template}").template.system_prompt
    records = {json_line: json.loads(text) for json_line, text in enumerate(path.read_text().splitlines(), start=1)}
    judged = 0
    for line, record in records.items():
        if line not in reference or labels.get(str(line)) in ("prefilled-assistant", "unknown-role"):
            continue
        judged += 1
        flagged = by_line.get(line, set())
        inserted = labels.get(str(line)) == "no-system-message" and bool(system_prompt)
        if inserted:
            # Saved without a system message: SpecForge adds its own (TRN001); what else it
            # changes is judged on its arrays less that insertion.
            assert "TRN001" in flagged, (line, flagged)
            flagged = flagged - {"TRN001"}
        assert "TRN001" not in flagged, (line, flagged)
        changed = _changed_by_the_trainer(
            reference[line], record["input_ids"] + record["output_ids"], len(record["input_ids"]), tokenizer,
            inserted=inserted,
        )
        assert bool(flagged) == changed, (line, labels.get(str(line)), flagged)
    assert judged >= 35
    kinds = {labels[str(line)] for line in by_line if str(line) in labels}
    assert "no-system-message" in kinds and len(by_line) > 10


def test_the_odd_conversation_shapes_are_findings_not_errors(real_tokenizer_dirs) -> None:
    directory, _ = real_tokenizer(real_tokenizer_dirs, "qwen-3.6")
    path = _partition_file("qwen3.6")
    labels = {shape: int(line) for line, shape in _load(path.parent / "labels.json").items()}
    found = _findings(path, directory, "qwen3.6", "specforge:qwen3.5")
    rules = {line: set(group["rule"]) for (line,), group in found.group_by("line")}
    assert {"TRN005"} <= rules[labels["prefilled-assistant"]]  # the output follows an assistant turn: cut
    assert {"TRN005", "TRN008"} <= rules[labels["unknown-role"]]  # cut, and Qwen3.5's template raises
    assert "ERR001" not in set(found["rule"])


# -- the command line -----------------------------------------------------------------------------


def test_check_with_a_trainer_adds_the_view_to_the_usual_report(tmp_path: Path, real_tokenizer_dirs) -> None:
    directory, _ = real_tokenizer(real_tokenizer_dirs, "qwen3")
    data = _partition_file("qwen3")
    report = tmp_path / "r.json"
    done = runner.invoke(app, ["check", str(data), "--tokenizer", str(directory), "--profile", "qwen3",
                               "--trainer", "specforge:qwen3-thinking", "--report", str(report), "--no-cache"])
    assert done.exit_code == 1, done.output
    saved = _load(report)
    trn = [f for f in saved["findings"] if f["rule"].startswith("TRN")]
    assert trn and all(isinstance(f["line"], int) for f in trn)
    assert {"TRN001", "TRN002"} <= {f["rule"] for f in trn}
    assert any(f["rule"].startswith("TRM") or f["rule"].startswith("SEG") for f in saved["findings"])  # the usual rules
    view = saved["trainer_view"]
    assert view["template"] == "qwen3-thinking" and view["viewed"] >= 40
    assert view["summary"].startswith("SpecForge 0.2.0 (qwen3-thinking) would train ")
    assert "because its default system prompt was added" in view["summary"]
    assert view["summary"] in " ".join(done.output.split()) or view["summary"][:60] in done.output


def test_without_a_trainer_the_report_has_no_trainer_rule_and_no_view(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    done = runner.invoke(app, ["check", "B2_sharegpt", "--data-root", str(PREPARED), "--report", str(report)])
    saved = _load(report)
    assert done.exit_code == 1
    assert "trainer_view" not in saved
    assert not any(r["code"].startswith("TRN") for r in saved["results"])


def test_trainer_view_prints_the_trainer_rules_alone() -> None:
    done = runner.invoke(app, ["trainer-view", "B2_sharegpt", "--data-root", str(PREPARED),
                               "--trainer", "speculators", "--format", "json"])
    saved = json.loads(done.stdout)
    assert {r["code"] for r in saved["results"]} <= {f"TRN{n:03d}" for n in range(1, 11)} | {"ERR001"}
    assert saved["trainer_view"]["name"] == "speculators"
    assert done.exit_code in (0, 1)


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        (["--trainer", "specforge:nope"], "unknown SpecForge 0.2.0 template 'nope' (known: llama3"),
        (["--trainer", "trainme"], "unknown trainer 'trainme' (known: specforge, speculators)"),
        (["--trainer", "specforge:gpt-oss"], "is not modelled"),
        (["--trainer", "speculators:qwen3"], "has no templates"),
        (["--trainer", "specforge"], "no template audit picks for profile"),  # no default for DeepSeek
        (["--trainer-max-length", "10"], "the trainer view needs a trainer"),
    ],
)
def test_a_trainer_that_cannot_be_used_is_one_line_and_exit_2(arguments: list[str], error: str) -> None:
    done = runner.invoke(app, ["check", "D1_deepseek", "--data-root", str(PREPARED), "--report", "none", *arguments])
    assert done.exit_code == 2
    lines = [line for line in done.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("audit: error:") and error in " ".join(done.output.split())


def test_messages_of_odd_shapes_give_findings_never_an_error(tmp_path: Path) -> None:
    good = json.loads((PREPARED / "B0_clean" / "raw_responses.jsonl").read_text().splitlines()[0])
    shapes: list[Any] = [
        "not a list", [1, 2], [{"role": "user"}], [{"from": "human", "value": "hi"}],
        [{"role": "user", "content": [{"type": "text", "text": "parts"}]}], [], None,
        [{"role": "tool", "content": "early"}, {"role": "user", "content": "x"}],
        [{"role": "user", "content": "x", "tool_calls": "not json"}],
        [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}],
    ]
    records = []
    for i, messages in enumerate(shapes):
        record = {**good, "id": f"odd-{i}"}
        if messages is None:
            record.pop("messages")
        else:
            record["messages"] = messages
        records.append(record)
    records.append({**good, "id": "tools-odd", "tools": "not a list"})
    path = write_jsonl(tmp_path / "odd.jsonl", records)
    for trainer in ("specforge:kimi-k2-thinking", "specforge:kimi-k2-instruct", "speculators"):
        done = runner.invoke(app, ["check", str(path), "--tokenizer", str(KIMI_TOKENIZER), "--profile", "kimi-k2.5",
                                   "--trainer", trainer, "--format", "jsonl", "--no-cache"])
        assert done.exit_code in (0, 1), done.output
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert not any(f.get("rule") == "ERR001" for f in lines)
        rules: dict[int, set[str]] = {}
        for finding in lines:
            rules.setdefault(finding["line"], set()).add(finding["rule"])
        # Messages that are not a list of objects are the record contract's (the reader rejects
        # the line); a record without messages is TRN010's; the rest are viewed.
        assert "INT002" in rules[1] and "INT002" in rules[2]
        assert rules[7] >= {"TRN010"}
        if trainer.startswith("specforge"):
            assert "TRN008" in rules[6]  # an empty list: the reply alone, after no user turn
            assert "TRN005" in rules[8]  # a leading tool message is dropped


@pytest.mark.parametrize(
    "arguments",
    ['{"n": ' + "9" * 5000 + "}", "[" * 5000 + "]" * 5000, '{"city": "\\ud800"}'],
    ids=["digits", "nesting", "surrogate"],
)
def test_arguments_json_loads_cannot_take_are_a_trainer_refusal_never_an_error(tmp_path: Path, arguments: str) -> None:
    # Python's json raises ValueError past 4,300 digits and RecursionError past its nesting limit
    # (SpecForge catches only JSONDecodeError), and decodes "\\ud800" to a lone surrogate that
    # no tokenizer encodes: each stopped the trainer view with ERR001.
    good = json.loads((PREPARED / "B0_clean" / "raw_responses.jsonl").read_text().splitlines()[0])
    call = {"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": arguments}}
    history = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "functions.f:0", "content": "done"}]
    path = write_jsonl(tmp_path / "args.jsonl", [{**good, "id": "args", "messages": history}])
    for trainer in ("specforge:kimi-k2-thinking", "speculators"):
        done = runner.invoke(app, ["check", str(path), "--tokenizer", str(KIMI_TOKENIZER), "--profile", "kimi-k2.5",
                                   "--trainer", trainer, "--format", "jsonl", "--no-cache"])
        assert done.exit_code in (0, 1), done.output
        rules = {json.loads(line)["rule"] for line in done.stdout.splitlines() if line.startswith("{")}
        assert "ERR001" not in rules and "TRN008" in rules, (trainer, rules)


def test_the_summary_names_the_share_and_its_causes() -> None:
    from audit.report.trainer_summary import _sentence

    causes = [
        {"code": "TRN001", "severity": "error", "records": 9, "cause": "its default system prompt was added"},
        {"code": "TRN002", "severity": "error", "records": 3, "cause": "its re-tokenized text differs from the exact ids"},
        {"code": "TRN009", "severity": "warning", "records": 6, "cause": "it also trains the prompt's earlier assistant turns"},
    ]
    text = _sentence("SpecForge 0.2.0 (qwen3-thinking)", 29, 1, 12, causes)
    assert text.startswith("SpecForge 0.2.0 (qwen3-thinking) would train 41% of these records (12 of 29) on something "
                           "else: 31% because its default system prompt was added, 10% because its re-tokenized")
    assert "for 21% it also trains the prompt's earlier assistant turns (warning)" in text
    assert "(1 record could not be viewed: see TRN010)" in text
    assert _sentence("speculators 0.9.0", 5, 0, 0, []) == "speculators 0.9.0 would train each of these 5 records on its exact sample."


def test_every_trainer_rule_fires_on_a_shipped_sample(real_tokenizer_dirs) -> None:
    from audit import check_target
    from audit.checks import RULES

    fired: set[str] = set()
    for target, key, profile, trainer, max_length in [
        (PREPARED / "B1_glaive", "kimi-k2.5-mini", "kimi-k2.5", "specforge:kimi-k2-thinking", None),
        (PREPARED / "B2_sharegpt", "kimi-k2.5-mini", "kimi-k2.5", "speculators", None),
        (_partition_file("qwen3.6"), "qwen-3.6", "qwen3.6", "specforge:qwen3.5", None),
        (_partition_file("qwen3"), "qwen3", "qwen3", "specforge:qwen3-thinking", 256),
    ]:
        tokenizer = KIMI_TOKENIZER if key == "kimi-k2.5-mini" else real_tokenizer(real_tokenizer_dirs, key)[0]
        report = check_target(target, tokenizer=tokenizer, profile=profile, trainer=trainer,
                              trainer_max_length=max_length, cache=False)
        fired |= set(report.findings["rule"].unique().to_list())
    trainer_rules = {code for code, rule in RULES.items() if rule.requires == "trainer"}
    assert trainer_rules - fired == set()


def test_a_rule_set_of_trainer_rules_alone_needs_a_trainer(tmp_path: Path) -> None:
    rules = tmp_path / "trn.toml"
    rules.write_text('select = ["TRN"]\n[rules.TRN009]\nseverity = "error"\n')
    base = ["B2_sharegpt", "--data-root", str(PREPARED), "--rules", str(rules)]
    done = runner.invoke(app, ["check", *base, "--report", "none"])
    assert done.exit_code == 2 and "run only with --trainer" in done.output
    done = runner.invoke(app, ["trainer-view", *base, "--trainer", "specforge:kimi-k2-thinking", "--format", "json"])
    saved = json.loads(done.stdout)
    assert {r["code"]: r["severity"] for r in saved["results"]}["TRN009"] == "error"  # configured as any rule


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        (lambda d: d["templates"]["qwen3-thinking"].update(parser_typ="thinking"), "[templates.qwen3-thinking]: unknown key 'parser_typ'"),
        (lambda d: d["templates"]["qwen3-thinking"].update(parser_type="thinkin"), "[templates.qwen3-thinking].parser_type: no [parsers.thinkin]"),
        (lambda d: d["templates"]["qwen"].update(enable_thinking="yes"), "[templates.qwen].enable_thinking: expected bool"),
        (lambda d: d["patterns"]["general"].update(end="end_token"), "[patterns.general].end: names a template key"),
        (lambda d: d["patterns"]["longcat"].update(end_regex="[Round"), "[patterns.longcat].end_regex: not a regular expression"),
        (lambda d: d["profiles"]["qwen3"].update(thinking="qwen4"), "[profiles.qwen3].thinking: no template 'qwen4'"),
        (lambda d: d["preprocessing"].update(max_length=0), "preprocessing.max_length: expected a positive length"),
        (lambda d: d["preprocessing"].update(max_length_setting="data.max_length"), "preprocessing.max_length_setting: write {n} where the length goes"),
        (lambda d: d["preprocessing"].pop("max_length_setting"), "preprocessing.max_length_setting: expected str"),
        (lambda d: d["parsers"]["general"].update(keys=["content"]), "[parsers.general].keys: a parser keeps at least role and content"),
    ],
)
def test_a_trainer_rules_file_is_checked_like_a_profile(edit: Any, error: str) -> None:
    from audit.base.errors import ConfigError
    from audit.model.trainers.trainer_rules import parse_trainer_rules

    path = TRAINERS_DIR / "specforge-0.2.0.toml"
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    parse_trainer_rules(data, path)  # the shipped file reads
    edit(data)
    with pytest.raises(ConfigError) as raised:
        parse_trainer_rules(data, path)
    assert str(raised.value).startswith(str(path)) and error in str(raised.value)
    assert "\n" not in str(raised.value)


def test_the_speculators_rules_map_every_other_role_to_the_assistant() -> None:
    from audit.model.trainers.speculators import normalize_conversation

    trainer = resolve_trainer("speculators")
    turns = normalize_conversation(
        [{"from": "human", "value": "hi"}, {"role": "gpt-4o", "content": "x", "name": "n"},
         {"role": "assistant", "content": None, "reasoning_content": "r"}], trainer
    )
    assert [t["role"] for t in turns] == ["user", "assistant", "assistant"]
    assert turns[1] == {"role": "assistant", "content": "x"}  # `name` is not kept
    assert turns[2]["thinking"] == turns[2]["reasoning_content"] == "r" and turns[2]["content"] == ""


# -- hostile conversations --------------------------------------------------------------------------

_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**40), st.floats(allow_nan=True), _TEXT)
_JSONISH = st.recursive(_SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(_TEXT, inner, max_size=3)), max_leaves=6)
_ROLE = st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "developer", "function", "human", "gpt",
                                   "ipython", "", "ASSISTANT"]), _TEXT, st.integers(), st.none())
_CALL = st.one_of(
    st.fixed_dictionaries(
        {"function": st.fixed_dictionaries({"name": st.one_of(_TEXT, st.integers(), st.none()),
                                            "arguments": st.one_of(_TEXT, _JSONISH, st.just('{"a": 1'),
                                                                   st.just("{'a': True}"),
                                                                   st.just('{"a": "\\ud800"}'))})},
        optional={"id": _SCALAR, "type": st.sampled_from(["function", "other"])}),
    _JSONISH,
)
_OBJECT_MESSAGE = (
    st.fixed_dictionaries(
        {"role": _ROLE},
        optional={
            "content": st.one_of(_TEXT, st.none(), st.integers(), st.lists(st.one_of(
                st.fixed_dictionaries({"type": st.sampled_from(["text", "image", "x"]), "text": _SCALAR}), _JSONISH),
                max_size=2), st.dictionaries(_TEXT, _SCALAR, max_size=2)),
            "reasoning_content": st.one_of(_TEXT, st.none(), st.integers()),
            "tool_calls": st.one_of(st.lists(_CALL, max_size=2), _JSONISH),
            "tool_call_id": _SCALAR,
            "name": _SCALAR,
            "from": _ROLE,
            "value": _SCALAR,
        },
    )
)
# Mostly objects (a message that is not one is the record contract's, INT002: the view never sees it).
_MESSAGE = st.one_of(_OBJECT_MESSAGE, _OBJECT_MESSAGE, _OBJECT_MESSAGE, _OBJECT_MESSAGE, _JSONISH)
_TOOLS = st.one_of(st.none(), _JSONISH, st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.one_of(_TEXT, st.integers())}, optional={"parameters": _JSONISH, "description": _SCALAR})}),
    _JSONISH), max_size=2))


@settings(max_examples=int(os.environ.get("TRAINER_VIEW_EXAMPLES", "6")), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(conversations=st.lists(st.tuples(st.lists(_MESSAGE, max_size=5), _TOOLS), min_size=8, max_size=8))
def test_any_conversation_a_record_may_carry_is_viewed_or_refused_never_an_error(
    tmp_path_factory: pytest.TempPathFactory, real_tokenizer_dirs, conversations: list[tuple[list[Any], Any]]
) -> None:
    # The record's own ids are clean (a shipped Qwen3 record); only what the trainer is given
    # (its messages and tools) is hostile. Every record is judged, none raises.
    directory, _ = real_tokenizer(real_tokenizer_dirs, "qwen3")
    good = json.loads(_partition_file("qwen3").read_text().splitlines()[0])
    records = []
    for index, (messages, tools) in enumerate(conversations):
        record = {**good, "id": f"hostile-{index}", "messages": messages}
        record.pop("tools", None)
        if tools is not None:
            record["tools"] = tools
        records.append(json.dumps(record, ensure_ascii=False, allow_nan=True))
    path = write_jsonl(tmp_path_factory.mktemp("hostile-view") / "raw_responses.jsonl", list(records))
    from audit import check_target

    for trainer in ("specforge:qwen3-thinking", "specforge:qwen", "speculators"):
        report = check_target(path, tokenizer=directory, profile="qwen3", trainer=trainer, cache=False)
        assert report.records == len(records)
        assert "ERR001" not in set(report.findings["rule"]), report.findings.filter(pl.col("rule") == "ERR001")


# -- the reply a server returns for a Qwen3 call that is not JSON --------------------------------


def _qwen3_unparsed_calls(tmp_path: Path, tokenizer: Tokenizer) -> tuple[Path, dict[str, str]]:
    """A Qwen3 reference record with a tool call, its call edited four ways (the answer texts by id)."""
    for line in _partition_file("qwen3").read_text().splitlines():
        record = json.loads(line)
        text = tokenizer.decode_batch([record["output_ids"]])[0]
        if record.get("messages") and "</think>" in text and text.count("<tool_call>") == 1 and '"arguments": {' in text:
            break
    call = text[text.index("<tool_call>") : text.index("</tool_call>") + len("</tool_call>")]
    broken = call.replace("}}\n</tool_call>", "}\n</tool_call>")  # one closing brace short
    assert broken != call
    calls = {
        # JSON's false and true as Python's: the call reads as a Python literal, not as JSON
        "python-literal": call.replace('"arguments": {', '"arguments": {"dry_run": true, ', 1)
        .replace("false", "False").replace("true", "True"),
        "not-json": broken,
        "one-of-two": call + "\n" + broken,
        "text-then-not-json": "Let me look that up.\n" + broken,
    }
    answers = {name: text[: text.index("<tool_call>")] + edited + text[text.index("</tool_call>") + 12 :]
               for name, edited in calls.items()}
    records = [{**record, "id": name, "output_ids": tokenizer.encode_batch([answer])[0]} for name, answer in answers.items()]
    return write_jsonl(tmp_path / "calls.jsonl", records), answers


def _replies(path: Path, tokenizer: Tokenizer, reply_shape: str) -> dict[str, dict[str, Any]]:
    from audit.model.families.profiles import load_profile
    from audit.records.batch import AuditContext, Batch
    from audit.records.reader import parse_block
    from audit.records.sources import file_blocks
    from audit.records.trainer_input import TrainerInput, trainer_inputs

    trainer = resolve_trainer("specforge", profile="qwen3", reply_shape=reply_shape)
    context = AuditContext(load_profile("qwen3").resolve(tokenizer, thinking=True), tokenizer, trainer=trainer)
    replies = {}
    for block in file_blocks(path):
        batch = Batch(parse_block(block, keep_source=True).records, context)
        for row, item in enumerate(trainer_inputs(batch)):
            assert isinstance(item, TrainerInput)
            replies[batch.records["id"][row]] = item.reply
    return replies


def test_a_qwen3_call_that_is_not_json_is_the_reply_each_server_returns(tmp_path: Path, real_tokenizer_dirs) -> None:
    directory, tokenizer = real_tokenizer(real_tokenizer_dirs, "qwen3")
    path, answers = _qwen3_unparsed_calls(tmp_path, tokenizer)
    after_think = {name: answer.split("</think>", 1)[1].removesuffix("<|im_end|>") for name, answer in answers.items()}

    # vLLM's hermes parser (the default): json.loads fails on one call, so no call at all and
    # the whole answer is content. Never a call whose arguments are the call's text.
    for name, reply in _replies(path, tokenizer, "vllm").items():
        assert "tool_calls" not in reply, name
        assert reply["content"] == after_think[name].lstrip(), name

    # SGLang's Qwen25Detector: the text before the first call, stripped, and the calls that parse.
    sglang = _replies(path, tokenizer, "sglang")
    for name, reply in sglang.items():
        assert reply["content"] == after_think[name][: after_think[name].index("<tool_call>")].strip(), name
    assert "tool_calls" not in sglang["python-literal"] and "tool_calls" not in sglang["not-json"]
    assert sglang["text-then-not-json"]["content"] == "Let me look that up."
    kept = sglang["one-of-two"]["tool_calls"]
    first = json.loads(after_think["one-of-two"].split("<tool_call>")[1].split("</tool_call>")[0])
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in kept] == [(first["name"], first["arguments"])]

    # Through the trainers: no arguments emptied (SpecForge's {} for text that is not JSON) and no
    # conversation dropped (speculators' render refusing it) for a call no server returns.
    for trainer in ("specforge:qwen3-thinking", "speculators"):
        for shape in ("vllm", "sglang"):
            done = runner.invoke(app, ["trainer-view", str(path), "--tokenizer", str(directory), "--profile", "qwen3",
                                       "--trainer", trainer, "--reply-shape", shape, "--format", "jsonl", "--no-cache"])
            assert done.exit_code in (0, 1), done.output
            rules = {json.loads(line)["rule"] for line in done.stdout.splitlines() if line.startswith("{")}
            assert not rules & {"TRN007", "TRN008", "ERR001"}, (trainer, shape, rules)


def test_the_reply_shape_is_the_trainer_views_and_checked() -> None:
    base = ["check", "B2_sharegpt", "--data-root", str(PREPARED), "--no-cache"]
    done = runner.invoke(app, [*base, "--reply-shape", "sglang"])
    assert done.exit_code == 2 and "needs a trainer" in done.output
    done = runner.invoke(app, [*base, "--trainer", "speculators", "--reply-shape", "tgi"])
    assert done.exit_code == 2 and "tgi" in done.output
    from audit import check_target

    report = check_target(PREPARED / "B2_sharegpt", trainer="speculators", reply_shape="sglang", cache=False)
    assert report.trainer_view["reply_shape"] == "sglang"
    assert check_target(PREPARED / "B2_sharegpt", trainer="speculators", cache=False).trainer_view["reply_shape"] == "vllm"

"""Template fidelity (TPL001), degenerate outputs (DEG001/DEG002), harmony channels, fingerprints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import audit
from audit.checks import RULES
from audit.checks.base import DOC_SECTIONS
from audit.cli import app
from audit.model.rendering.templating import prompt_ids
from tests.conftest import KIMI_TOKENIZER, PREPARED, write_jsonl

NEW_RULES = ["TPL001", "DEG001", "DEG002", "CHN001", "CHN002", "CHN003"]


def _clean_record(index: int = 0) -> dict:
    lines = (PREPARED / "B0_clean" / "raw_responses.jsonl").read_text().splitlines()
    return json.loads(lines[index])


def _audit(tmp_path: Path, records: list[dict], **options) -> list[tuple[int, str, str]]:
    data = write_jsonl(tmp_path / "raw_responses.jsonl", records)
    options.setdefault("profile", "kimi-k2.5")
    options.setdefault("tokenizer", KIMI_TOKENIZER)
    report = audit.check_target(data, **options)
    return [(f["line"], f["rule"], f["message"]) for f in report.findings.iter_rows(named=True)]


@pytest.mark.parametrize("code", NEW_RULES)
def test_new_rules_document_themselves(code: str) -> None:
    assert set(RULES[code].docs()) == set(DOC_SECTIONS)
    result = CliRunner().invoke(app, ["explain", code])
    assert result.exit_code == 0 and "Why it matters" in result.output


def test_template_mismatch_names_the_first_difference_with_both_sides(tmp_path: Path) -> None:
    clean = _clean_record()
    assert "messages" in clean
    drifted = dict(clean, id="drifted")
    drifted["messages"] = [m for m in clean["messages"] if m["role"] != "system"] or clean["messages"]
    drifted["messages"] = [dict(m) for m in drifted["messages"]]
    drifted["messages"][-1]["content"] = drifted["messages"][-1]["content"] + " Please."
    findings = _audit(tmp_path, [clean, drifted])
    assert [(line, rule) for line, rule, _ in findings] == [(2, "TPL001")]
    message = findings[0][2]
    assert "input_ids differ from the chat template's rendering at input_ids[" in message
    assert "saved '" in message and "template '" in message


def test_prompts_file_maps_ids_to_messages(tmp_path: Path) -> None:
    clean = _clean_record()
    bare = {k: v for k, v in clean.items() if k not in ("messages", "tools")}
    wrong = dict(clean, messages=[{"role": "user", "content": "something else entirely"}])
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{k: wrong.get(k) for k in ("id", "messages", "tools")}])
    assert [rule for _, rule, _ in _audit(tmp_path, [bare], prompts=prompts)] == ["TPL001"]
    good = write_jsonl(tmp_path / "good.jsonl", [{k: clean.get(k) for k in ("id", "messages", "tools")}])
    assert _audit(tmp_path, [bare], prompts=good) == []


def test_bad_prompts_file_is_one_line_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"id": 1}\n')
    result = CliRunner().invoke(app, ["check", str(PREPARED / "B0_clean"), "--prompts", str(bad),
                                      "--report", str(tmp_path / "r.json")])
    assert result.exit_code == 2
    assert "prompts.jsonl:1: needs `messages`, a non-empty list of chat messages" in result.output


def test_repetition_loop_and_empty_answer(tmp_path: Path, kimi_tokenizer) -> None:
    clean = _clean_record()
    think_end, end = 163607, 163586
    output = clean["output_ids"]
    at = output.index(think_end) + 1
    loop = dict(clean, id="loop", output_ids=output[:at] + output[at:at + 5] * 20 + [end])
    loop["meta_info"] = dict(clean["meta_info"], completion_tokens=len(loop["output_ids"]))
    empty = dict(clean, id="empty", output_ids=output[:at] + [end])
    empty["meta_info"] = dict(clean["meta_info"], completion_tokens=len(empty["output_ids"]))
    loop.pop("text", None), empty.pop("text", None)
    findings = _audit(tmp_path, [clean, loop, empty])
    assert {(line, rule) for line, rule, _ in findings} == {(2, "DEG001"), (3, "DEG002")}
    assert "5-token n-gram" in next(m for _, r, m in findings if r == "DEG001")


def test_degenerate_thresholds_are_rule_parameters(tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text('[rules.DEG002]\nmin_answer_tokens = 100000\n')
    findings = _audit(tmp_path, [_clean_record()], rules=rules)
    assert [rule for _, rule, _ in findings] == ["DEG002"]
    rules.write_text('[rules.DEG002]\nmin_answer_tokens = "many"\n')
    with pytest.raises(Exception, match="min_answer_tokens: expected int"):
        _audit(tmp_path, [_clean_record()], rules=rules)


def test_fingerprint_recorded_in_the_data_is_a_config_error(tmp_path: Path) -> None:
    record = dict(_clean_record(), tokenizer={"sha256": "0" * 64, "vocab_size": 163608})
    data = write_jsonl(tmp_path / "raw_responses.jsonl", [record])
    result = CliRunner().invoke(app, ["check", str(data), "--profile", "kimi-k2.5", "--tokenizer",
                                      str(KIMI_TOKENIZER), "--report", str(tmp_path / "r.json")])
    assert result.exit_code == 2
    assert "tokenizer mismatch: line 1 of" in result.output and "000000000000…" in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("audit: error")]
    assert len(errors) == 1 and "Traceback" not in result.output


def test_fingerprint_vocab_size_in_generation_json(tmp_path: Path) -> None:
    partition = tmp_path / "P1"
    partition.mkdir()
    write_jsonl(partition / "raw_responses.jsonl", [_clean_record()])
    (partition / "generation.json").write_text(json.dumps({"tokenizer": {"vocab_size": 128815}}))
    result = CliRunner().invoke(app, ["check", str(partition), "--profile", "kimi-k2.5", "--tokenizer",
                                      str(KIMI_TOKENIZER), "--report", str(tmp_path / "r.json")])
    assert result.exit_code == 2
    assert "records a vocabulary of 128815 ids" in result.output


def test_prompts_alike_but_for_key_order_are_each_rendered_as_written(tmp_path: Path, kimi_tokenizer) -> None:
    """The template writes tools with `tojson`, which keeps their keys' order: two records whose
    tools differ only in that order have different prompt ids, and each is judged by its own
    rendering (a rendering kept for one is not reused for the other)."""
    clean = _clean_record()
    assert clean.get("tools"), "the sample record declares tools"
    reordered_tools = [{key: tool[key] for key in reversed(list(tool))} for tool in clean["tools"]]
    reordered = dict(clean, id="reordered", tools=reordered_tools)
    reordered["input_ids"] = prompt_ids(kimi_tokenizer, [clean["messages"]], [reordered_tools], thinking=True)[0]
    assert reordered["input_ids"] != clean["input_ids"], "the template keeps the tools' key order"
    reordered["meta_info"] = dict(clean["meta_info"], prompt_tokens=len(reordered["input_ids"]))
    assert _audit(tmp_path, [clean, reordered]) == []
    assert [(line, rule) for line, rule, _ in _audit(tmp_path, [clean, dict(reordered, tools=clean["tools"])])] == [
        (2, "TPL001")
    ]

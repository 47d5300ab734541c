"""Every case in rule_cases.toml: the rule flags the record exactly when the case says it should."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from audit.engine import audit_file
from audit.templating import prompt_ids

CASES = tomllib.loads((Path(__file__).parent / "rule_cases.toml").read_text())["case"]


def build_record(case: dict, tokenizer) -> dict:
    if "prompt" in case:
        prompt = tokenizer.encode_text(case["prompt"])
    else:
        prompt = prompt_ids(tokenizer, [[{"role": "user", "content": "Hello, can you help?"}]], [None], thinking=True)[0]
    output = tokenizer.encode_text(case["output"]) if case["output"] else []
    if "output_plain" in case:  # text whose special-token strings stay ordinary pieces
        backend = tokenizer.hf.backend_tokenizer
        backend.encode_special_tokens = True
        try:
            output += backend.encode(case["output_plain"], add_special_tokens=False).ids
        finally:
            backend.encode_special_tokens = False
    if "output_tail" in case:
        output += tokenizer.encode_text(case["output_tail"])
    record: dict = {"id": "case", "input_ids": prompt, "output_ids": output}
    finish = case.get("finish", "stop")
    if finish != "none":
        reason = {"stop": {"type": "stop", "matched": 163586}, "length": {"type": "length", "length": len(output)},
                  "abort": {"type": "abort", "message": "client disconnected"}}[finish]
        record["meta_info"] = {"finish_reason": reason, "prompt_tokens": len(prompt), "completion_tokens": len(output)}
    if "text" in case:
        record["text"] = case["text"]
    return record


@pytest.mark.parametrize("case", CASES, ids=[f"{c['rule']}-{c['expect']}-{i}" for i, c in enumerate(CASES)])
def test_rule_case(case, tmp_path, kimi_context, default_rules):
    path = tmp_path / "case.jsonl"
    path.write_text(json.dumps(build_record(case, kimi_context.tokenizer)) + "\n")
    findings = audit_file(path, kimi_context, default_rules).findings
    mine = findings.filter(findings["rule"] == case["rule"])
    if case["expect"] == "fail":
        assert mine.height == 1, findings.to_dicts()
        if "position" in case:
            assert mine["position"][0] == case["position"]
    else:
        assert mine.is_empty(), mine.to_dicts()

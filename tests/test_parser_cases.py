"""SGLang's own parser tests, as records: what its unit tests feed its tool-call detectors and
reasoning parsers is what models really emit, and the audit must judge it as SGLang does.

`tests/parser_cases/PROFILE.toml` holds, per family, the model-output strings of SGLang's tests
(`test/registered/.../test_*_detector.py`, `test_function_call_parser.py`,
`test_reasoning_parser.py`), each with what SGLang's test makes of it: `well-formed` (parsed into
calls or reasoning) or `malformed` (no call, an error, or text it drops), and the test it came
from. Each string becomes one record on the family's real tokenizer (the rule cases' tokenizers,
`tests/test_rule_cases.TOKENIZERS`): the prompt rendered by the family's template (with the
test's tools), the output the string placed where the family writes it (`before`: the reasoning
it closes; `after`: the end of turn it stops on). A well-formed case gets no error-severity
finding; a malformed one gets one at least. Where the project judges a form differently from
SGLang on purpose, the case says why (`exception`), and the opposite is asserted.

Keys of a file: `profile`, `thinking` (default true), `[defaults]` (`before`, `after`, `tools`),
then `[[case]]` tables: `source` (SGLang file and test), `sglang` ("well-formed" or "malformed"),
`output` (the string as the test feeds it), optionally `before`, `after`, `tools`, `exception`,
`rules` (the codes that flag the case, any of them; an exception names them, warnings too).
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from audit.checks.ruleset import load_rule_set
from audit.engine.runner import audit_file
from audit.model.families.profiles import builtin_profiles, load_profile
from audit.records.batch import AuditContext
from tests.test_rule_cases import TOKENIZERS, Setup, _load

CASES_DIR = Path(__file__).parent / "parser_cases"
_FILE_KEYS = {"profile", "thinking", "defaults", "case"}
_CASE_KEYS = {"source", "sglang", "output", "before", "after", "tools", "exception", "rules"}
_VERDICTS = ("well-formed", "malformed")


@dataclass(frozen=True)
class ParserCase:
    """One SGLang model-output string placed in a record of its family."""

    file: str
    number: int
    profile: str
    thinking: bool
    source: str
    sglang: str
    output: str
    tools: list[dict[str, Any]] | None
    exception: str | None
    rules: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.file}#{self.number}-{self.sglang}"

    @property
    def flagged_expected(self) -> bool:
        """Should the audit flag it? As SGLang judges it, unless the project judges otherwise."""
        return (self.sglang == "malformed") != (self.exception is not None)


def load_parser_cases(directory: Path = CASES_DIR) -> list[ParserCase]:
    cases: list[ParserCase] = []
    for path in sorted(directory.glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        unknown = set(data) - _FILE_KEYS
        assert not unknown, f"{path.name}: unknown keys {sorted(unknown)}"
        profile = data["profile"]
        assert profile in builtin_profiles() and profile in TOKENIZERS, f"{path.name}: profile {profile!r}"
        defaults = data.get("defaults", {})
        for number, case in enumerate(data["case"], start=1):
            where = f"{path.name}#{number}"
            assert set(case) <= _CASE_KEYS, f"{where}: unknown keys {sorted(set(case) - _CASE_KEYS)}"
            assert case["sglang"] in _VERDICTS, f"{where}: sglang is one of {_VERDICTS}"
            assert "::" in case["source"], f"{where}: source is FILE::TEST"
            exception = case.get("exception")
            assert exception is None or exception.strip(), f"{where}: an exception says why"
            before = case.get("before", defaults.get("before", ""))
            after = case.get("after", defaults.get("after", ""))
            cases.append(ParserCase(
                file=path.stem, number=number, profile=profile, thinking=data.get("thinking", True),
                source=case["source"], sglang=case["sglang"], output=before + case["output"] + after,
                tools=case.get("tools", defaults.get("tools")), exception=exception,
                rules=tuple(case.get("rules", ())),
            ))
    return cases


CASES = load_parser_cases()


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory, real_tokenizer_dirs: dict[str, Path | None]) -> dict[str, Any]:
    """Each file's cases audited together (one record a case, in order), by the default rules."""
    workdir = tmp_path_factory.mktemp("parser-cases")
    findings: dict[str, Any] = {}
    rule_set = load_rule_set()
    for file in sorted({case.file for case in CASES}):
        members = [case for case in CASES if case.file == file]
        first = members[0]
        tokenizer = _load(TOKENIZERS[first.profile], real_tokenizer_dirs)
        setup = Setup(tokenizer, load_profile(first.profile).resolve(tokenizer, thinking=first.thinking))
        lines = [
            json.dumps(setup.record({"output": case.output, "tools": case.tools}, case.label), ensure_ascii=False)
            for case in members
        ]
        path = workdir / f"{file}.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        found = audit_file(path, AuditContext(setup.profile, setup.tokenizer), rule_set).findings
        for line, case in enumerate(members, start=1):
            findings[case.label] = found.filter(pl.col("line") == line)
    return findings


def test_the_corpus_covers_every_family_with_tool_calls() -> None:
    """Every profile with a tool-call or harmony format has SGLang cases, both verdicts overall."""
    covered = {case.profile for case in CASES}
    wanted = {
        name for name in builtin_profiles()
        if (load_profile(name).tool_calls is not None or load_profile(name).channels is not None)
        # Each shares its reader and SGLang detector with a profile that has cases (glm-4.6v:
        # format "glm-4.5", Glm4MoeDetector, as glm-4.5).
        and name not in ("kimi-k2-thinking", "qwen3-thinking-2507", "deepseek-r1-0528", "glm-4.6v")
    }
    assert wanted <= covered, f"no SGLang cases for {sorted(wanted - covered)}"
    assert {case.sglang for case in CASES} == set(_VERDICTS)


def test_every_exception_is_one_the_profiles_page_documents() -> None:
    """A case judged otherwise than SGLang names the rules that judge it, and the profiles page
    lists each of them among the deliberate differences."""
    page = (Path(__file__).parent.parent / "docs" / "profiles.md").read_text(encoding="utf-8")
    listed = page.split("Some are judged otherwise, on", 1)[-1].split("\n## ", 1)[0]
    for case in CASES:
        if case.exception is None:
            continue
        assert case.rules, f"{case.label}: an exception names the rules that judge the case"
        missing = [code for code in case.rules if code not in listed]
        assert not missing, f"{case.label}: {missing} not among the profiles page's exceptions"


@pytest.mark.parametrize("case", CASES, ids=[case.label for case in CASES])
def test_sglang_parser_case(case: ParserCase, audited: dict[str, Any]) -> None:
    """Well-formed for SGLang: no error finding; malformed: flagged at error severity (or the
    project's documented exception, the other way round)."""
    found = audited[case.label]
    errors = found.filter(pl.col("severity") == "error")
    shown = found.select("rule", "severity", "position", "message").rows()
    context = f"{case.label} ({case.source}): SGLang: {case.sglang}; exception: {case.exception}\nfound: {shown}"
    if case.flagged_expected:
        assert not errors.is_empty(), context
        if case.rules:
            assert set(errors["rule"].to_list()) & set(case.rules), context
    else:
        assert errors.is_empty(), context
        if case.rules:  # judged otherwise, at warning severity (an undeclared tool: TCL006)
            assert set(found["rule"].to_list()) & set(case.rules), context

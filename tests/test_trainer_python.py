"""`--trainer-python`: the trainer's own code, run in its own environment, beside the view's model.

The environment is built once (torch, transformers and SpecForge at the pins of
`fixtures/trainer_references.py`) in a folder kept between runs, or named by
`AUDIT_TRAINER_PYTHON`; where the packages cannot be installed the tests that need it skip,
saying why. The one-line errors need no environment.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from audit.cli import app
from fixtures.trainer_references import TRAINER_PACKAGES
from tests.conftest import DEEPSEEK_TOKENIZER, PREPARED

runner = CliRunner()


@pytest.fixture(scope="session")
def trainer_python() -> Path:
    """The Python of an environment with SpecForge 0.2.0 under its pinned transformers."""
    named = os.environ.get("AUDIT_TRAINER_PYTHON")
    if named:
        return Path(named)
    pins = hashlib.sha256(json.dumps(TRAINER_PACKAGES).encode()).hexdigest()[:12]
    venv = Path(tempfile.gettempdir()) / f"audit-trainer-env-{pins}"
    python = venv / "bin" / "python"
    if not (venv / "complete").is_file():
        shutil.rmtree(venv, ignore_errors=True)
        try:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
            for packages in TRAINER_PACKAGES:
                subprocess.run(
                    [str(python), "-m", "pip", "install", "--quiet", *packages],
                    check=True, capture_output=True, text=True, timeout=1200,
                )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            said = (getattr(exc, "stderr", "") or "").strip().splitlines()
            pytest.skip(f"the trainer's environment cannot be installed here: {said[-1] if said else exc}")
        (venv / "complete").write_text("\n")
    return python


def trainer_view(target: str, tmp_path: Path, *args: str) -> tuple[int, dict, str]:
    report = tmp_path / f"report-{len(list(tmp_path.iterdir()))}.json"
    result = runner.invoke(
        app, ["trainer-view", target, "--data-root", str(PREPARED), "--no-cache", "--report", str(report), *args]
    )
    return result.exit_code, json.loads(report.read_text()) if report.exists() else {}, result.output


def flagged(report: dict) -> Counter:
    return Counter((f["line"], f["rule"]) for f in report["findings"])


def test_where_the_model_is_right_the_trainers_own_code_changes_no_finding(trainer_python, tmp_path):
    trainer = ("--trainer", "specforge:kimi-k2-thinking")
    _, modelled, output = trainer_view("B0_clean", tmp_path, *trainer)
    _, installed, output = trainer_view("B0_clean", tmp_path, *trainer, "--trainer-python", str(trainer_python))
    assert flagged(installed) == flagged(modelled) and flagged(modelled), output
    assert installed["trainer_view"]["summary"] == modelled["trainer_view"]["summary"]


def test_a_folder_the_trainer_loads_otherwise_is_caught_on_every_record(trainer_python, tmp_path):
    # A DeepSeek-format folder declaring LlamaTokenizerFast over its byte-level BPE: the audit
    # reads its tokenizer.json, but the trainer's transformers loads a Metaspace Llama tokenizer
    # (spaces vanish), so SpecForge trains other ids on every record.
    folder = tmp_path / "deepseek-llama-class"
    shutil.copytree(DEEPSEEK_TOKENIZER, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "LlamaTokenizerFast"}))
    trainer = ("--trainer", "specforge:deepseek-v3", "--tokenizer", str(folder))
    _, modelled, _ = trainer_view("D1_deepseek", tmp_path, *trainer)
    status, installed, output = trainer_view(
        "D1_deepseek", tmp_path, *trainer, "--trainer-python", str(trainer_python)
    )
    records = installed["input"]["records"]
    changed = [f for f in installed["findings"] if f["rule"] == "TRN002"]
    assert status == 1 and len({f["line"] for f in changed}) == records, output
    assert sum(1 for f in modelled["findings"] if f["rule"] == "TRN002") < records
    assert all("as installed (transformers 5.8.1)" in f["message"] for f in changed)
    assert installed["profile"] and installed["trainer_view"]
    assert "python" in json.dumps(installed)


def test_a_python_that_cannot_run_the_trainer_is_one_line(tmp_path):
    base = ["trainer-view", "B0_clean", "--data-root", str(PREPARED), "--no-cache"]
    cases = [
        # This environment has no SpecForge: the worker says so, the run stops before reading.
        ((*base, "--trainer", "specforge:kimi-k2-thinking", "--trainer-python", sys.executable),
         "cannot run specforge there (ModuleNotFoundError"),
        ((*base, "--trainer", "specforge:kimi-k2-thinking", "--trainer-python", str(tmp_path / "python")),
         "no such file"),
        ((*base, "--trainer", "speculators", "--trainer-python", sys.executable), "asks a running vLLM"),
        (("check", "B0_clean", "--data-root", str(PREPARED), "--trainer-python", sys.executable),
         "the trainer view needs a trainer"),
    ]
    for args, said in cases:
        result = runner.invoke(app, list(args))
        assert result.exit_code == 2, (args, result.output)
        assert said in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr

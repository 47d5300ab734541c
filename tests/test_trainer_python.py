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
import time
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


def llama_class_folder(tmp_path: Path, model_type: str | None = None) -> Path:
    """The shipped DeepSeek tokenizer as DeepSeek-format folders ship: tokenizer_config.json
    naming LlamaTokenizerFast over the byte-level BPE tokenizer.json (and a config.json)."""
    folder = tmp_path / f"deepseek-llama-class-{model_type}"
    shutil.copytree(DEEPSEEK_TOKENIZER, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "LlamaTokenizerFast"}))
    if model_type is not None:
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    return folder


def test_the_trainers_tokenizer_load_is_modelled_and_named_with_its_fix(tmp_path):
    # The audit reads the folder's tokenizer.json; SpecForge's transformers 5.8.1 loads a
    # Metaspace Llama tokenizer from it (spaces vanish): every record trains other ids.
    trainer = ("--trainer", "specforge:deepseek-v3")
    status, report, output = trainer_view("D1_deepseek", tmp_path, *trainer, "--tokenizer", str(llama_class_folder(tmp_path)))
    records = report["input"]["records"]
    changed = [f for f in report["findings"] if f["rule"] == "TRN002"]
    assert status == 1 and len({f["line"] for f in changed}) == records, output
    assert all("transformers 5.8.1 loads this tokenizer folder as a Metaspace LlamaTokenizer" in f["message"]
               and '"model_type": "deepseek_v3"' in f["message"] for f in changed)
    assert "Youareahelpfulassistant" in changed[0]["message"]
    summary = report["trainer_view"]["summary"]
    assert summary.count("loads this tokenizer folder as") == 1 and "fix:" in summary
    assert report["trainer_view"]["tokenizer_load"]["transformers"] == "5.8.1"
    # The fix it names: a config.json whose model type 5.8.1 loads the folder's tokenizer.json by.
    _, fixed, _ = trainer_view("D1_deepseek", tmp_path, *trainer, "--tokenizer", str(llama_class_folder(tmp_path, "deepseek_v3")))
    assert sum(1 for f in fixed["findings"] if f["rule"] == "TRN002") < records
    assert "tokenizer_load" not in fixed["trainer_view"]
    # Model types 5.8.1 does not map load the Metaspace tokenizer too.
    _, unmapped, _ = trainer_view("D1_deepseek", tmp_path, *trainer, "--tokenizer", str(llama_class_folder(tmp_path, "deepseek_v32")))
    assert len({f["line"] for f in unmapped["findings"] if f["rule"] == "TRN002"}) == records


def test_the_modelled_load_encodes_as_the_pinned_transformers_does(trainer_python, tmp_path):
    from audit.model.trainers.trainer_load import trainer_encoder
    from audit.model.trainers.trainer_rules import load_trainer_rules

    folder = llama_class_folder(tmp_path)
    texts = ["You are a helpful assistant.", "你好，世界！\n\tTabs  and  spaces ", "émigré 🙂 123 4567",
             "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>ok<｜end▁of▁sentence｜>",
             "def f(x):\n    return {'a': [1, 2]}  # ▁marker", "", " leading", "trailing \n\n"]
    script = (
        "import json, sys, logging, warnings; logging.disable(logging.CRITICAL); warnings.simplefilter('ignore');"
        "from transformers import AutoTokenizer; t = AutoTokenizer.from_pretrained(sys.argv[1]);"
        "print(json.dumps([t.encode(x, add_special_tokens=False) for x in json.loads(sys.stdin.read())]))"
    )
    real = subprocess.run([str(trainer_python), "-c", script, str(folder)], input=json.dumps(texts),
                          capture_output=True, text=True, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    encoder = trainer_encoder(load_trainer_rules("specforge").loading, folder)
    assert encoder is not None
    flat = encoder.encode_flat(texts)
    modelled = [flat.values[flat.offsets[i] : flat.offsets[i + 1]].tolist() for i in range(len(texts))]
    assert modelled == json.loads(real.stdout.strip().splitlines()[-1])


def test_a_folder_the_trainer_loads_otherwise_gets_the_same_findings_from_its_own_code(trainer_python, tmp_path):
    trainer = ("--trainer", "specforge:deepseek-v3", "--tokenizer", str(llama_class_folder(tmp_path)))
    _, modelled, _ = trainer_view("D1_deepseek", tmp_path, *trainer)
    status, installed, output = trainer_view(
        "D1_deepseek", tmp_path, *trainer, "--trainer-python", str(trainer_python)
    )
    records = installed["input"]["records"]
    assert status == 1 and flagged(installed) == flagged(modelled), output
    assert len({line for line, rule in flagged(installed) if rule == "TRN002"}) == records
    assert "python" in installed["trainer_view"]


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
        ((*base, "--trainer", "specforge:kimi-k2-thinking", "--trainer-timeout", "5"), "pass both, or neither"),
    ]
    for args, said in cases:
        result = runner.invoke(app, list(args))
        assert result.exit_code == 2, (args, result.output)
        assert said in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_trainer_process_that_hangs_is_stopped_and_said_in_one_line(tmp_path):
    # A fake trainer's Python: one that never answers, one that starts and then hangs on the rows.
    never = tmp_path / "never"
    never.write_text("#!/bin/sh\nsleep 121\n")  # a child of its own, stopped with it
    stuck = tmp_path / "stuck"
    stuck.write_text(
        f"#!{sys.executable}\nimport json, sys, time\nsys.stdin.readline()\n"
        "print(json.dumps({'ready': {'transformers': '5.8.1'}}), flush=True)\nsys.stdin.readline()\ntime.sleep(120)\n"
    )
    for fake, doing in ((never, "(starting)"), (stuck, "(preprocessing 30 conversations)")):
        fake.chmod(0o755)
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "audit", "trainer-view", "B0_clean", "--data-root", str(PREPARED), "--no-cache",
             "--trainer", "specforge:kimi-k2-thinking", "--trainer-python", str(fake), "--trainer-timeout", "2"],
            capture_output=True, text=True, timeout=100,
        )
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert f"gave no answer in 2 s {doing} and was stopped" in result.stderr
        assert "--trainer-timeout" in result.stderr and "ERR001" not in result.stdout
        assert time.monotonic() - started < 60  # not the 120 s its sleep lasts
        for left in (str(fake), "sleep 121"):  # stopped, with what it started
            assert subprocess.run(["pgrep", "-f", left], capture_output=True, text=True).stdout.strip() == ""


def test_a_large_block_is_asked_a_bounded_part_at_a_time_in_order(tmp_path):
    from audit.model.trainers.installed_trainer import ROWS_PER_ANSWER, InstalledTrainer, TrainerJob

    echo = tmp_path / "echo"  # answers each conversation with its number and the size of its request
    echo.write_text(
        f"#!{sys.executable}\nimport json, sys\nsys.stdin.readline()\n"
        "print(json.dumps({'ready': {'transformers': '5.8.1'}}), flush=True)\n"
        "for line in sys.stdin:\n    rows = json.loads(line)['rows']\n"
        "    print(json.dumps({'made': [{'n': r['n'], 'asked': len(rows)} for r in rows]}), flush=True)\n"
    )
    echo.chmod(0o755)
    worker = InstalledTrainer(TrainerJob(python=echo, trainer="specforge", template=None, max_length=2048,
                                         tokenizer=tmp_path, trust_remote_code=False, timeout=30))
    try:
        made = worker.preprocess([{"n": i} for i in range(2 * ROWS_PER_ANSWER + 3)])
    finally:
        worker.close()
    assert [m["n"] for m in made] == list(range(2 * ROWS_PER_ANSWER + 3))
    assert max(m["asked"] for m in made) == ROWS_PER_ANSWER


# -- without a trainer: the installed transformers' own load of the folder ---------------------------


def declared_folder(tmp_path: Path, tokenizer_class: str) -> Path:
    """The shipped DeepSeek tokenizer, its tokenizer_config.json naming `tokenizer_class`."""
    folder = tmp_path / f"deepseek-{tokenizer_class}"
    shutil.copytree(DEEPSEEK_TOKENIZER, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": tokenizer_class}))
    return folder


def check(tmp_path: Path, folder: Path) -> tuple[dict, str]:
    report = tmp_path / f"check-{len(list(tmp_path.iterdir()))}.json"
    result = runner.invoke(app, ["check", "D1_deepseek", "--data-root", str(PREPARED), "--no-cache",
                                 "--tokenizer", str(folder), "--report", str(report)])
    assert result.exit_code == 1, result.output
    return json.loads(report.read_text()), result.output


def test_a_folder_autotokenizer_loads_otherwise_is_said_once_and_decided_once(tmp_path, monkeypatch):
    # transformers 5.x builds a Qwen2Tokenizer's pre-tokenizer itself: DeepSeek's tokenizer.json
    # declared Qwen2TokenizerFast splits digits otherwise through AutoTokenizer.
    folder = declared_folder(tmp_path, "Qwen2TokenizerFast")
    report, output = check(tmp_path, folder)
    load = report["tokenizer"]["load"]
    assert load["loads_as"] == "Qwen2Tokenizer" and load["ids"] != load["folder_ids"]
    assert '"tokenizer_class": "PreTrainedTokenizerFast"' in load["fix"]
    assert output.count("warning: transformers") == 1 and "encodes otherwise than its tokenizer.json" in output
    assert sum("encodes otherwise" in f["message"] for f in report["findings"]) == 0  # no record carries it
    # Decided once per folder and transformers release: a later run reads it from the cached state.
    import audit.model.trainers.trainer_load as trainer_load

    def never(*args, **kwargs):
        raise AssertionError("decided again")

    monkeypatch.setattr(trainer_load, "installed_load", never)
    again, output = check(tmp_path, folder)
    assert again["tokenizer"]["load"] == report["tokenizer"]["load"] and output.count("warning: transformers") == 1


def test_the_fix_it_names_loads_the_folder_as_its_tokenizer_json(tmp_path):
    report, output = check(tmp_path, declared_folder(tmp_path, "PreTrainedTokenizerFast"))
    assert "load" not in report["tokenizer"] and "warning: transformers" not in output


def test_under_the_trainers_transformers_a_llama_class_folder_is_said_to_lose_its_spaces(trainer_python, tmp_path):
    # The installed transformers 5.8.1 (SpecForge's pin; taken from its environment, with the
    # tokenizers and huggingface_hub it needs) turns a LlamaTokenizerFast folder over a byte-level
    # tokenizer.json into a Metaspace LlamaTokenizer: `audit check` says so once, without a trainer.
    found = subprocess.run([str(trainer_python), "-c", "import transformers, tokenizers, huggingface_hub as h;"
                            "print(transformers.__file__, tokenizers.__file__, h.__file__, sep='\\n')"],
                           capture_output=True, text=True, check=True)
    shadow = tmp_path / "transformers-5.8.1"
    shadow.mkdir()
    for init in found.stdout.split():
        package = Path(init).parent
        for path in [package, *package.parent.glob(f"{package.name}-*.dist-info")]:
            (shadow / path.name).symlink_to(path)
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), str(Path(__file__).parents[1])])}
    result = subprocess.run([sys.executable, "-m", "audit", "check", "D1_deepseek", "--data-root", str(PREPARED),
                             "--no-cache", "--tokenizer", str(llama_class_folder(tmp_path)), "--report", str(report)],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 1, result.stderr
    load = json.loads(report.read_text())["tokenizer"]["load"]
    assert load["transformers"] == "5.8.1" and load["loads_as"] == "LlamaTokenizer"
    assert load["reads"] == "Youareahelpfulassistant."
    assert result.stdout.count("warning: transformers 5.8.1 (installed)") == 1

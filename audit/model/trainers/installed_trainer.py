"""A trainer's own code, run in its own Python: `--trainer-python PATH`.

The trainer view reimplements the trainers' preprocessing (`audit.model.trainers.specforge`) so that
it needs no torch. Where a training environment is at hand, its Python runs the trainer's own
code instead (`audit/model/trainers/trainer_worker.py`, one process per run, conversations sent a batch
at a time as JSON lines): the tokenizer loaded as the trainer loads it, under the transformers
it pins, and the conversation preprocessed by the trainer itself. What it trains is compared
with the exact sample like the view's (`audit.records.trainer_view`).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from audit.base.errors import ConfigError, RunStopped
from audit.model.tokens.tokenizer import Tokenizer
from audit.model.trainers.trainer_rules import Trainer

WORKER = Path(__file__).with_name("trainer_worker.py")
# The trainers whose own code a worker runs (speculators asks a running vLLM to render).
RUNNABLE = ("specforge",)
# Conversations per request: SpecForge preprocesses one in milliseconds (a long agentic one in a
# tenth of a second), so an answer takes seconds, far inside the default time-out.
ROWS_PER_ANSWER = 256


@dataclass(frozen=True)
class TrainerJob:
    """What the trainer's Python is asked to load: which trainer, template, length and tokenizer."""

    python: Path
    trainer: str
    template: str | None
    max_length: int
    tokenizer: Path
    trust_remote_code: bool
    timeout: float  # seconds the process may take over one answer (`Trainer.python_timeout`)


def trainer_job(trainer: Trainer, tokenizer: Tokenizer) -> TrainerJob | None:
    """What a run with `trainer` asks its Python to load; None when the run models the trainer."""
    if trainer.python is None:
        return None
    return TrainerJob(
        python=trainer.python,
        trainer=trainer.name,
        template=trainer.template.name if trainer.template else None,
        max_length=trainer.max_length,
        tokenizer=tokenizer.directory,
        trust_remote_code=tokenizer.trust_remote_code,
        timeout=trainer.python_timeout,
    )


class InstalledTrainer:
    """One running worker in the trainer's Python; `preprocess` asks it for a batch of rows."""

    def __init__(self, job: TrainerJob):
        self.job = job
        # What the trainer prints, kept for the line that says why it stopped (closed in close()).
        self._log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        try:
            self._process = subprocess.Popen(
                [str(job.python), str(WORKER)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                # Never the network: the tokenizer is the local folder the run audits with.
                env={**_own_environment(), "TRANSFORMERS_VERBOSITY": "error", "PYTHONIOENCODING": "utf-8",
                     "HF_HUB_OFFLINE": "1"},
                # Its own process group: stopping it stops what it started too (`_kill`).
                start_new_session=os.name == "posix",
            )
        except OSError as exc:
            raise ConfigError(f"--trainer-python {job.python}: cannot run it ({exc.strerror})") from None
        first = {"trainer": job.trainer, "template": job.template, "max_length": job.max_length,
                 "tokenizer": str(job.tokenizer), "trust_remote_code": job.trust_remote_code}
        try:
            ready = self._ask(first, "starting")
        except ConfigError:
            self.close()
            raise
        if "error" in ready:
            self.close()
            raise ConfigError(
                f"--trainer-python {job.python}: cannot run {job.trainer} there ({ready['error']}); "
                f"install it in that environment (pip install {job.trainer}) or leave the option out"
            )
        self.versions: dict[str, str] = ready["ready"]

    @property
    def label(self) -> str:
        """`as installed (transformers 5.8.1)`: what a finding adds to the trainer's name."""
        return f"as installed (transformers {self.versions.get('transformers', '?')})"

    def preprocess(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The trainer's own result for each conversation (`trainer_worker` says the shape), asked
        `ROWS_PER_ANSWER` at a time: each answer's time-out bounds a few seconds of its work,
        however large the block of records."""
        made: list[dict[str, Any]] = []
        for start in range(0, len(rows), ROWS_PER_ANSWER):
            part = rows[start : start + ROWS_PER_ANSWER]
            made.extend(self._ask({"rows": part}, f"preprocessing {len(part)} conversations")["made"])
        return made

    def _ask(self, request: dict[str, Any], doing: str) -> dict[str, Any]:
        """Send `request`, and read the one-line answer within the job's time-out: a process
        that gives none in time (hung, or far slower than any batch should be) is killed, and
        the run stops with one line saying so."""
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        answer: list[bytes] = []

        def exchange() -> None:  # in a thread: a write to a full pipe blocks as a read does
            try:
                stdin.write(json.dumps(request).encode() + b"\n")
                stdin.flush()
                answer.append(stdout.readline())
            except (BrokenPipeError, OSError, ValueError):
                answer.append(b"")

        talking = threading.Thread(target=exchange, daemon=True)
        talking.start()
        talking.join(self.job.timeout)
        if talking.is_alive():
            self._kill()
            talking.join(10)
            raise RunStopped(
                f"--trainer-python {self.job.python}: the trainer's process gave no answer in "
                f"{self.job.timeout:g} s ({doing}) and was stopped; raise --trainer-timeout if it is only slow"
            )
        line = answer[0] if answer else b""
        if not line:
            raise RunStopped(f"--trainer-python {self.job.python}: the trainer's process stopped ({self._last_words()})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def _last_words(self) -> str:
        self._log.seek(0)
        lines = [line for line in self._log.read().decode(errors="replace").splitlines() if line.strip()]
        return lines[-1].strip()[:300] if lines else f"exit code {self._process.poll()}"

    def close(self) -> None:
        if self._process.poll() is None:
            if self._process.stdin is not None:
                self._process.stdin.close()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._kill()
        self._log.close()

    def _kill(self) -> None:
        """Stop the trainer's process and whatever it started (its process group, on POSIX)."""
        try:
            if os.name == "posix":
                os.killpg(self._process.pid, signal.SIGKILL)
            else:
                self._process.kill()
        except ProcessLookupError:
            pass  # already gone
        self._process.wait()


def _own_environment() -> dict[str, str]:
    """This process's environment without what points a Python at this one's packages."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


# One worker per job in a process (a run's batches share it), closed when the process ends.
_RUNNING: dict[TrainerJob, InstalledTrainer] = {}


def installed_trainer(job: TrainerJob) -> InstalledTrainer:
    """The running worker for `job`, started on first use."""
    if job not in _RUNNING:
        if not job.python.is_file():
            raise ConfigError(
                f"--trainer-python {job.python}: no such file; name the python of an environment that "
                "has the trainer installed (e.g. /path/to/venv/bin/python)"
            )
        if job.trainer not in RUNNABLE:
            raise ConfigError(
                f"--trainer-python runs {', '.join(RUNNABLE)}'s own code; {job.trainer}'s preprocessing asks a "
                "running vLLM server to render each conversation, which the view models instead: leave the option out"
            )
        _RUNNING[job] = InstalledTrainer(job)
    return _RUNNING[job]


@atexit.register
def _close_all() -> None:
    for worker in _RUNNING.values():
        worker.close()
    _RUNNING.clear()

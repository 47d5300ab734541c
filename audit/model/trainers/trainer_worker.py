"""The trainer's own preprocessing, run in the trainer's Python (`--trainer-python`).

This file is executed by another interpreter (a training environment's venv that has SpecForge
installed, under the transformers it pins): `python trainer_worker.py`. It imports nothing of
`audit` (that environment need not have it) and speaks JSON lines on its standard streams:

    in:  {"trainer": "specforge", "template": NAME, "max_length": N, "tokenizer": DIR,
          "trust_remote_code": false}
    out: {"ready": {"python": ..., "transformers": ..., "specforge": ..., "tokenizer_class": ...}}
         or {"error": "one line"}
    in:  {"rows": [{"conversations": [...], "tools": [...]}, ...]}
    out: {"made": [{"input_ids": [...], "loss_mask": [...]} | {"error": NAME} | {"skipped": true}]}

The tokenizer is loaded as the trainer loads it (`AutoTokenizer.from_pretrained` under its own
transformers), and each conversation goes through SpecForge's `preprocess_conversations` with
the template from its `TEMPLATE_REGISTRY`: what the trainer would really train, its own code.
Anything the libraries print goes to standard error; standard output carries the replies only.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def main() -> None:
    # Run as a script, this file's folder leads sys.path, and audit's own modules there
    # (`specforge.py`, `speculators.py`) would hide the trainer's packages of the same names.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    # The replies keep the real standard output; file descriptor 1 becomes standard error, so
    # nothing a library prints (Python or C) mixes with them.
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(value: dict[str, Any]) -> None:
        replies.write(json.dumps(value) + "\n")
        replies.flush()

    first = sys.stdin.readline()
    if not first:
        return
    job = json.loads(first)
    try:
        preprocess = _prepare(job)
    except Exception as exc:  # the trainer cannot run here: one line for the user, then stop
        reply({"error": f"{type(exc).__name__}: {exc}".splitlines()[0]})
        return
    reply({"ready": preprocess.ready})
    for line in sys.stdin:
        request = json.loads(line)
        reply({"made": [preprocess(row) for row in request["rows"]]})


class _SpecForge:
    def __init__(self, job: dict[str, Any]):
        import logging
        import platform
        import warnings
        from importlib.metadata import version

        warnings.simplefilter("ignore")
        logging.disable(logging.CRITICAL)
        from specforge.data.preprocessing import preprocess_conversations
        from specforge.data.template import TEMPLATE_REGISTRY
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(job["tokenizer"], trust_remote_code=job["trust_remote_code"])
        self.template = TEMPLATE_REGISTRY.get(job["template"])
        self.max_length = job["max_length"]
        self.preprocess = preprocess_conversations
        self.ready = {
            "python": platform.python_version(),
            "transformers": version("transformers"),
            "specforge": version("specforge"),
            "tokenizer_class": type(self.tokenizer).__name__,
        }

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        tools = row.get("tools") if isinstance(row.get("tools"), list) else []
        try:
            result = self.preprocess(self.tokenizer, [row["conversations"]], self.template, self.max_length, tools=[tools])
        except Exception as exc:  # SpecForge does not catch a template error: its run stops there
            return {"error": type(exc).__name__}
        if not result["input_ids"]:
            return {"skipped": True}
        return {"input_ids": result["input_ids"][0][0].tolist(), "loss_mask": result["loss_mask"][0][0].tolist()}


def _prepare(job: dict[str, Any]) -> _SpecForge:
    if job["trainer"] != "specforge":
        raise ValueError(f"no worker for trainer {job['trainer']!r}")
    return _SpecForge(job)


if __name__ == "__main__":
    main()

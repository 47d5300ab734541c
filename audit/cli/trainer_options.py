"""The `--trainer` options `check` and `trainer-view` share, and the options they set."""

from __future__ import annotations

import dataclasses
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

TrainerOption = Annotated[
    str | None,
    typer.Option(
        "--trainer",
        metavar="NAME[:TEMPLATE]",
        help="Also show what a trainer fed text would train on instead of each record's exact ids "
        "(TRN rules): specforge[:TEMPLATE] (SpecForge 0.2.0; TEMPLATE a name of its registry, default "
        "by profile) or speculators (0.9.0). See docs/trainer-view.md.",
    ),
]
TrainerMaxLengthOption = Annotated[
    int | None,
    typer.Option(
        "--trainer-max-length",
        min=1,
        metavar="N",
        help="The max_length the trainer cuts sequences at (default: its own, SpecForge 2048, speculators 8192).",
    ),
]

TrainerPythonOption = Annotated[
    Path | None,
    typer.Option(
        "--trainer-python",
        metavar="PATH",
        help="The python of an environment that has the trainer installed (a training venv's "
        "bin/python): its own code preprocesses each conversation, under its own transformers, "
        "beside the view's model of it (SpecForge). See docs/trainer-view.md.",
    ),
]

TrainerTimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--trainer-timeout",
        min=1,
        metavar="SECONDS",
        help="How long the --trainer-python process may take over one answer (its start, or a batch "
        "of at most 256 conversations) before it is stopped and the run ends, exit 2 (default: 300).",
    ),
]


class ReplyShape(StrEnum):
    vllm = "vllm"
    sglang = "sglang"


ReplyShapeOption = Annotated[
    ReplyShape | None,
    typer.Option(
        "--reply-shape",
        help="The server whose reply the trainer view builds where vLLM's and SGLang's differ (a Qwen3 "
        "tool call that is not JSON): vllm (default: the whole answer as content) or sglang (the text "
        "before the calls, the calls that parse).",
    ),
]


def with_trainer(
    options: Any,
    trainer: str | None,
    max_length: int | None,
    *,
    only: bool = False,
    reply_shape: ReplyShape | None = None,
    python: Path | None = None,
    timeout: float | None = None,
) -> Any:
    """`options` (the core's CheckOptions) with the trainer view's settings."""
    return dataclasses.replace(
        options,
        trainer=trainer,
        trainer_max_length=max_length,
        trainer_only=only,
        trainer_reply_shape=None if reply_shape is None else reply_shape.value,
        trainer_python=python,
        trainer_timeout=timeout,
    )

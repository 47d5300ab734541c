"""What the generator tests share: prompts, stand-in servers, and running the CLI on them."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from audit.cli import app
from tests.conftest import KIMI_TOKENIZER, PREPARED

KIMI_END_OF_TURN = 163586
N_PROMPTS = 40


def make_prompts(path: Path, n: int = N_PROMPTS) -> Path:
    """The B0 sample's prompts (system + user + tools), then plain chats, `n` in all."""
    prompts = []
    for line in (PREPARED / "B0_clean" / "raw_responses.jsonl").read_text().splitlines():
        record = json.loads(line)
        prompts.append(
            {"id": record["id"], "messages": record["messages"], "tools": record["tools"]}
        )
    for i in range(n - len(prompts)):
        messages = [{"role": "user", "content": f"What is {i} times {i + 3}? Explain briefly."}]
        if i % 3 == 0:
            messages = [
                {"role": "user", "content": "Hello there."},
                {"role": "assistant", "content": "Hi! How can I help?"},
                *messages,
            ]
        prompts.append({"id": i, "messages": messages})
    prompts = prompts[:n]
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return path


def generate_args(prompts: Path, out: Path, *urls: str, extra: tuple[str, ...] = ()) -> list[str]:
    args = [
        "generate",
        str(prompts),
        "--tokenizer",
        str(KIMI_TOKENIZER),
        "--profile",
        "kimi-k2.5",
        "--out",
        str(out),
    ]
    for url in urls:
        args += ["--server", url]
    return [*args, "--retry-backoff", "0.01", *extra]


def run_cli(args: list[str]):
    return CliRunner().invoke(app, args)


def read_samples(out: Path) -> list[dict]:
    data = out.read_bytes()
    assert not data or data.endswith(b"\n"), "the output ends in a partial line"
    return [json.loads(line) for line in data.splitlines()]


def template_ids(kimi_tokenizer, prompt: dict, thinking: bool = True) -> list[int]:
    """What the chat template renders, asked of transformers directly (tokenize=True)."""
    rendered = kimi_tokenizer.hf.apply_chat_template(
        prompt["messages"],
        tools=prompt.get("tools"),
        add_generation_prompt=True,
        tokenize=True,
        thinking=thinking,
    )
    return list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)

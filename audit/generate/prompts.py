"""The prompts file: JSONL, one prompt a line, read and validated here for every command.

Each line is an object with `id` (a non-empty string or an integer, unique in the file),
`messages` (a non-empty list of chat messages, each an object with a `role`), and optionally
`tools` (a list of tool definitions) and `chat_template_kwargs` (an object of extra arguments
for the prompt renderer, e.g. gpt-oss's `reasoning_effort`). `audit generate` sends these
prompts; `audit check --prompts` gives TPL001 the same prompts to re-render. A bad line is
one error naming the file and line (exit 2), before anything is sent or audited.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from audit.base.errors import InputError


@dataclass(frozen=True)
class Prompt:
    """One line of the prompts file."""

    line: int
    id: str | int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    chat_template_kwargs: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        """The id as the output and the audit compare it (a string)."""
        return str(self.id)

    def source(self) -> dict[str, Any]:
        """The prompt in the shape a record carries it: `messages`, `tools`, `chat_template_kwargs`."""
        return {
            "messages": self.messages,
            "tools": self.tools,
            "chat_template_kwargs": self.chat_template_kwargs,
        }


def parse_prompt(path: Path, line: int, raw: bytes) -> Prompt:
    """One line of a prompts file as a Prompt; InputError naming the line when it is not one."""
    where = f"{path}:{line}"
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(
            f"{where}: not valid JSON ({exc}); each line must be one JSON object"
        ) from None
    if not isinstance(value, dict):
        raise InputError(
            f"{where}: expected a JSON object with id and messages, got a {type(value).__name__}"
        )
    prompt_id = value.get("id")
    if isinstance(prompt_id, bool) or not isinstance(prompt_id, str | int) or prompt_id == "":
        raise InputError(
            f"{where}: needs an `id` (a non-empty string or an integer), got {prompt_id!r}"
        )
    messages = value.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InputError(f"{where}: needs `messages`, a non-empty list of chat messages")
    for n, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InputError(f"{where}: messages[{n}] must be an object with a `role` string")
    tools = value.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise InputError(
            f"{where}: `tools` must be a list of tool definitions, got {type(tools).__name__}"
        )
    kwargs = value.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise InputError(
            f"{where}: `chat_template_kwargs` must be an object of template arguments, "
            f"got {type(kwargs).__name__}"
        )
    return Prompt(
        line=line, id=prompt_id, messages=messages, tools=tools or None, chat_template_kwargs=kwargs
    )


def iter_prompts(path: Path, limit: int | None = None) -> Iterator[Prompt]:
    """The prompts of a JSONL file in order, each validated, at most `limit` of them."""
    count = 0
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            if limit is not None and count >= limit:
                return
            count += 1
            yield parse_prompt(path, number, raw)


def _checked_prompts(path: Path, limit: int | None) -> Iterator[Prompt]:
    """Every prompt, with the whole-file checks: the file exists, ids are unique, it is not empty."""
    if not path.is_file():
        raise InputError(
            f"{path}: no such prompts file (JSONL with id, messages and optional tools)"
        )
    first_seen: dict[str, int] = {}
    for prompt in iter_prompts(path, limit):
        if prompt.key in first_seen:
            raise InputError(
                f"{path}:{prompt.line}: id {prompt.id!r} repeats line {first_seen[prompt.key]}; "
                "every prompt needs its own id"
            )
        first_seen[prompt.key] = prompt.line
        yield prompt
    if not first_seen:
        raise InputError(f"{path}: no prompts in the file")


def scan_prompts(path: Path, limit: int | None = None) -> list[str]:
    """Validate the prompts file before any request; return the prompt keys in order.

    Raises an InputError naming the line of the first bad line or repeated id.
    """
    return [prompt.key for prompt in _checked_prompts(path, limit)]


def load_prompts(path: Path) -> dict[str, dict[str, Any]]:
    """The prompts file as sources by id (see `Prompt.source`), for TPL001's `--prompts`."""
    return {prompt.key: prompt.source() for prompt in _checked_prompts(path, None)}

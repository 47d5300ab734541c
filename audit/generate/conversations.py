"""One dataset row as a prompt: ShareGPT, UltraChat and OpenAI conversations normalised to messages.

`normalise_row(row)` takes a row's columns (a dict: a JSONL object or a table row) and returns a
`Normalised` prompt (messages, tools, template arguments, the row's own id, and which
normalisations it took), a `Dropped` row (nothing to prompt with: a null or empty conversation) or
a `Refused` row with the kind of problem and a one-line reason. It never raises: whatever a row
holds (numbers for text, megabytes of it, nesting a thousand deep) is a reason.

The conversation is the first of these columns a row has:

| column | shape | read as |
|---|---|---|
| `messages` | OpenAI / UltraChat: `{role, content}` turns | as is |
| `conversations` | ShareGPT: `{from, value}` turns (OpenAI turns also taken) | `from` -> `role`, `value` -> `content` |
| `conversation` | lmsys-chat: `{role, content}` turns | as is |
| `prompt` | UltraChat's prompt text, when there are no turns | one user turn |

Roles are those both trainers (SpecForge, speculators) accept: `human` -> `user`, `gpt` ->
`assistant`, `user`, `assistant`, `system`, `tool`, and OpenAI's `developer`; any other is
refused, never guessed. The dataset's own answers, the assistant turns that end the
conversation, are dropped: they are what a run generates again. What remains must have a user
turn, and the last one must have text. A row's `system` column becomes a first system turn;
`tools` (a list, or that list as a JSON string, as tables often hold it) and
`chat_template_kwargs` are taken as the prompts file has them. A table gives every row every
field of a struct column, null where the row had none: those nulls are dropped. Images (a
LLaVA `image`/`images` column placed by `<image>` tags, OpenAI image parts) become
`{"type": "image"}` parts, their references in `Normalised.images` (`audit.generate.image_parts`).
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from audit.generate.image_parts import (
    ImageColumn,
    ImagePartError,
    content_parts,
    read_image_features,
    tagged_text,
    take_images,
)

# Columns holding a row's id, in order of preference.
ID_COLUMNS = ("id", "prompt_id", "conversation_id")
TURN_COLUMNS = ("messages", "conversations", "conversation")
# Role names both trainers accept -> the role the chat template sees.
ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "developer": "developer",
    "tool": "tool",
}
# Limits on one row: what no prompt needs and a hostile row could send.
MAX_TEXT_CHARS = 16_000_000  # all the row's strings together
MAX_DEPTH = 64  # nesting of lists and objects in a turn or a tool definition
MAX_NODES = 1_000_000  # values in all
MAX_ID_CHARS = 1024
SHOWN = 60  # characters of a value quoted in a reason

# What normalisation a row took -> how the summary says it.
NORMALISATIONS = {
    "sharegpt_roles": "ShareGPT turns mapped (from/value to role/content, human/gpt to user/assistant)",
    "trailing_answers": "the dataset's own answers after the last user or tool turn dropped",
    "prompt_column": "the `prompt` column taken as the user turn",
    "system_column": "the `system` column taken as the first turn",
    "tools_decoded": "`tools` given as a JSON string, decoded",
    "table_nulls": "null fields of the table's struct columns dropped",
    "row_ids": "no id of its own: the file and row number as the id",
}
# Kinds of refusal -> how the summary says it.
REFUSALS = {
    "no_conversation": "no conversation (`messages`, `conversations`, `conversation` or `prompt`)",
    "bad_turn": "a turn that is not a chat message",
    "unknown_role": "a role the format does not know",
    "bad_content": "content that is not text or an image",
    "bad_image": "an image that is not a path, an http(s) URL or a data: URI",
    "image_mismatch": "images that do not match their places (`<image>` tags or image parts)",
    "image_unreadable": "an image that cannot be read (missing, outside the dataset's folder, not an image)",
    "images_without_vision": "images, for a profile without [vision]",
    "no_user_turn": "no user turn",
    "empty_last_user_turn": "the last user turn has no content",
    "bad_tools": "`tools` that are not a list of tool definitions",
    "bad_template_kwargs": "`chat_template_kwargs` that are not an object",
    "bad_id": "an id that is not a non-empty string or an integer",
    "too_large": "too large or too deeply nested",
}


@dataclass(frozen=True)
class Normalised:
    """A row as a prompt: what the chat template is given, and how it was made so."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    chat_template_kwargs: dict[str, Any] | None
    id: str | int | None  # the row's own id, None when it has none
    notes: frozenset[str] = field(default_factory=frozenset)  # keys of NORMALISATIONS
    images: tuple[str, ...] = ()  # the images the messages place, in order (path, URL, data: URI)


@dataclass(frozen=True)
class Refused:
    """A row that cannot be a prompt: the kind (a key of REFUSALS) and the reason, one line."""

    kind: str
    reason: str


@dataclass(frozen=True)
class Dropped:
    """A row with nothing to prompt with (a null or empty conversation)."""

    reason: str


class _Refusal(Exception):
    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


_SHORT = reprlib.Repr()  # Python 3.11 takes no settings in the constructor
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict = 3, 4, 4
_SHORT.maxstring = _SHORT.maxother = SHOWN


def shown(value: Any) -> str:
    """A value quoted in a reason: its repr, cut short (never built whole: a value may be huge)."""
    text = _SHORT.repr(value)
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."


def normalise_row(row: Any, *, from_table: bool = False) -> Normalised | Refused | Dropped:
    """The row as a prompt, or why not. Never raises on the row's content."""
    if not isinstance(row, dict):
        return Refused("no_conversation", f"a row must be an object, got a {type(row).__name__}")
    try:
        return _normalise(row, from_table)
    except (_Refusal, ImagePartError) as refusal:
        return Refused(refusal.kind, refusal.reason)
    except RecursionError:
        return Refused("too_large", f"nested more than {MAX_DEPTH} deep")


def _normalise(row: dict[str, Any], from_table: bool) -> Normalised | Dropped:
    notes: set[str] = set()
    budget = _Budget()
    row_id = _row_id(row)
    images = ImageColumn(row)
    column = next((c for c in TURN_COLUMNS if c in row and row[c] is not None), None)
    if column is None and isinstance(row.get("prompt"), str):
        turns: list[Any] = [{"role": "user", "content": row["prompt"]}]
        notes.add("prompt_column")
        column = "prompt"
    elif column is None:
        if any(c in row for c in (*TURN_COLUMNS, "prompt")) and row.get("prompt") is None:
            return Dropped("a null conversation")
        raise _Refusal(
            "no_conversation",
            "needs `messages`, a non-empty list of chat messages (or ShareGPT `conversations`, "
            "or a `prompt`)",
        )
    else:
        turns = row[column]
        if not isinstance(turns, list):
            raise _Refusal(
                "no_conversation",
                f"`{column}` must be a list of chat messages, got a {type(turns).__name__}",
            )
        if not turns:
            return Dropped(f"an empty `{column}`")
    read_image_features(column, turns)
    budget.visit(turns, 1)
    budget.visit(images.entries, 1)
    messages = [_turn(column, n, turn, notes, from_table, images) for n, turn in enumerate(turns)]
    images.finish()
    system = row.get("system")
    if system is not None:
        if not isinstance(system, str):
            raise _Refusal("bad_content", f"`system` must be text, got {shown(system)}")
        budget.visit(system, 1)
        if system.strip() and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": system})
            notes.add("system_column")
    kept = len(messages)
    while kept and messages[kept - 1]["role"] == "assistant":
        kept -= 1
    if kept < len(messages):
        notes.add("trailing_answers")
        messages = messages[:kept]
    placed = take_images(messages)  # those of dropped answers go with them
    users = [n for n, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise _Refusal("no_user_turn", f"`{column}` has no user turn to answer")
    if not _has_content(messages[users[-1]].get("content")):
        turn = users[-1] - ("system_column" in notes)  # its place among the row's own turns
        place = "the `prompt`" if column == "prompt" else f"{column}[{turn}], the last user turn,"
        raise _Refusal("empty_last_user_turn", f"{place} has no text")
    tools = _tools(row.get("tools"), notes, from_table, budget)
    kwargs = row.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise _Refusal(
                "bad_template_kwargs",
                f"`chat_template_kwargs` must be an object of template arguments, got a "
                f"{type(kwargs).__name__}",
            )
        budget.visit(kwargs, 1)
        if from_table:
            kwargs = _without_nulls(kwargs, notes)
    if row_id is None:
        notes.add("row_ids")
    return Normalised(messages, tools, kwargs, row_id, frozenset(notes), placed)


def _row_id(row: dict[str, Any]) -> str | int | None:
    """The row's own id: the first of ID_COLUMNS it has (not null), checked."""
    for column in ID_COLUMNS:
        value = row.get(column)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
            raise _Refusal(
                "bad_id",
                f"`{column}` must be a non-empty string or an integer, got {shown(value)}",
            )
        if isinstance(value, int) and not -(2**63) <= value < 2**64:
            raise _Refusal("bad_id", f"`{column}` {shown(value)} is outside 64-bit integers")
        if isinstance(value, str) and (len(value) > MAX_ID_CHARS or _surrogates(value)):
            raise _Refusal(
                "bad_id", f"`{column}` is not a usable id (over {MAX_ID_CHARS} characters or not UTF-8)"
            )
        return value
    return None


def _turn(
    column: str, n: int, turn: Any, notes: set[str], from_table: bool, images: ImageColumn
) -> dict[str, Any]:
    """One turn as a chat message with a known role, and text (or text and image parts) content."""
    where = f"{column}[{n}]"
    if not isinstance(turn, dict):
        raise _Refusal(
            "bad_turn",
            f"{where} must be an object with a `role` (or ShareGPT `from`) string, got a "
            f"{type(turn).__name__}",
        )
    if from_table:
        turn = _without_nulls(turn, notes, keep=("content", "value"))
    sharegpt = "from" in turn and "role" not in turn
    role = turn.get("from") if sharegpt else turn.get("role")
    if not isinstance(role, str):
        raise _Refusal(
            "bad_turn", f"{where} must be an object with a `role` (or ShareGPT `from`) string"
        )
    other = turn.get("from") if not sharegpt else None
    if other is not None and (not isinstance(other, str) or ROLES.get(other) != ROLES.get(role)):
        raise _Refusal(
            "bad_turn", f"{where} has both `from` {shown(other)} and `role` {shown(role)}"
        )
    mapped = ROLES.get(role)
    if mapped is None:
        raise _Refusal(
            "unknown_role",
            f"{where} has the role {shown(role)}; known roles: {', '.join(ROLES)}",
        )
    if sharegpt or ("value" in turn and "content" not in turn):
        message = {"role": mapped, "content": turn.get("value")}
        message.update((k, v) for k, v in turn.items() if k not in ("from", "value", "role", "content"))
        notes.add("sharegpt_roles")
    else:
        message = {k: mapped if k == "role" else v for k, v in turn.items() if k not in ("from", "value")}
    if mapped != role:
        notes.add("sharegpt_roles")
    content = message.get("content")
    if isinstance(content, str):
        message["content"] = tagged_text(where, content, images)
    elif isinstance(content, list):
        message["content"] = content_parts(where, content, images)
    elif content is not None:
        raise _Refusal("bad_content", f"{where}.content must be text, got {shown(content)}")
    if "tool_calls" in message and message["tool_calls"] is not None:
        calls = message["tool_calls"]
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise _Refusal("bad_turn", f"{where}.tool_calls must be a list of objects")
    return message


def _has_content(content: Any) -> bool:
    """Text that is not blank, or an image."""
    if isinstance(content, str):
        return bool(content.strip())
    if isinstance(content, list):
        return any(part["type"] == "image" or part["text"].strip() for part in content)
    return False


def _tools(
    tools: Any, notes: set[str], from_table: bool, budget: _Budget
) -> list[dict[str, Any]] | None:
    if isinstance(tools, str):
        if len(tools) > MAX_TEXT_CHARS:
            raise _Refusal("too_large", f"`tools` is over {MAX_TEXT_CHARS:,} characters")
        try:
            tools = orjson.loads(tools) if tools.strip() else None
        except orjson.JSONDecodeError as exc:
            raise _Refusal("bad_tools", f"`tools` is a string but not JSON ({exc})") from None
        notes.add("tools_decoded")
        from_table = False  # decoded JSON has no struct nulls
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise _Refusal(
            "bad_tools", f"`tools` must be a list of tool definitions (objects), got {shown(tools)}"
        )
    budget.visit(tools, 1)
    if from_table:
        tools = [_without_nulls(tool, notes) for tool in tools]
    return tools or None


def _without_nulls(value: dict[str, Any], notes: set[str], keep: Iterable[str] = ()) -> dict[str, Any]:
    """A table's struct without the null fields every row gets for another row's keys."""
    kept = frozenset(keep)

    def clean(item: Any) -> Any:
        if isinstance(item, dict):
            return {k: clean(v) for k, v in item.items() if v is not None or k in kept}
        if isinstance(item, list):
            return [clean(v) for v in item]
        return item

    cleaned = {k: clean(v) for k, v in value.items() if v is not None or k in kept}
    if cleaned != value:
        notes.add("table_nulls")
    return cleaned


class _Budget:
    """What one row may hold: text, values and depth, counted as its parts are visited."""

    def __init__(self) -> None:
        self.chars = 0
        self.nodes = 0

    def visit(self, value: Any, depth: int) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise _Refusal("too_large", f"more than {MAX_NODES:,} values")
        if depth > MAX_DEPTH:
            raise _Refusal("too_large", f"nested more than {MAX_DEPTH} deep")
        if isinstance(value, str):
            self.chars += len(value)
            if self.chars > MAX_TEXT_CHARS:
                raise _Refusal("too_large", f"over {MAX_TEXT_CHARS:,} characters of text")
            if _surrogates(value):
                raise _Refusal("bad_content", "text with lone surrogates, which is not UTF-8")
        elif isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise _Refusal("bad_content", f"an object key that is not text: {shown(key)}")
                self.visit(key, depth + 1)
                self.visit(item, depth + 1)
        elif isinstance(value, list):
            for item in value:
                self.visit(item, depth + 1)
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise _Refusal("bad_content", f"a number that JSON cannot hold: {value!r}")
        elif value is not None and not isinstance(value, bool | int):
            raise _Refusal(
                "bad_content", f"a {type(value).__name__} value, which JSON cannot hold"
            )


def _surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False

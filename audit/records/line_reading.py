"""One line read strictly: JSON a strict parser takes whole (no NaN, no key given twice, UTF-8),
of the record contract's field types; else a `RejectedLine` naming the line and the problem."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import orjson

from audit.base.json_values import json_type
from audit.records import sources
from audit.records.id_lists import ID_LIST_FIELDS, IdLists
from audit.records.meta_info import TOKEN_ID_LIMIT as TOKEN_ID_LIMIT  # the id lists' limit too
from audit.records.meta_info import meta_info_problem
from audit.records.meta_info import shown as _shown

NOT_A_TOKEN_ID = "is not a token id (integers only, from 0 to 2**32 - 1)"

# The kinds of problem that keep a line from being a record (`RejectedLine.problem`); the rule
# that reports each kind says so itself (`Rule.problem`).
UNREADABLE = "unreadable"  # not JSON for a strict parser, not UTF-8, cut short, a key given twice
CONTRACT = "contract"  # JSON, but not of the record contract's shape and types


@dataclass(frozen=True)
class RejectedLine:
    """A line that is not a record: bad JSON, not UTF-8, wrong types, or cut short."""

    line: int
    reason: str
    problem: str  # UNREADABLE or CONTRACT
    field: str | None = None  # the id list a bad token id is in, and its index there
    position: int | None = None
    id: str | None = None  # the record's id, where the line reads far enough to give one


# A line's id where the line is no JSON (cut short, a bad byte later on): the first key of an
# object written by a JSON writer, `{"id": "..."` or `{"id": 12`, read from its first bytes.
_LEADING_ID = re.compile(rb'\A\s*\{\s*"id"\s*:\s*("(?:[^"\\]|\\.)*"|-?[0-9]+)\s*[,}]')


def record_id(value: Any) -> str | None:
    """The id of a parsed line, as the record frame holds it (an integer as its digits), or None
    when it has none a record could have (`_field_problem` names a bad one)."""
    sample_id = value.get("id") if isinstance(value, dict) else None
    if isinstance(sample_id, str):
        return sample_id
    if isinstance(sample_id, int) and not isinstance(sample_id, bool):
        return str(sample_id)
    return None


def leading_id(text: bytes) -> str | None:
    """The id a line that is no JSON starts with, or None."""
    found = _LEADING_ID.match(text[:4096])
    if found is None:
        return None
    try:
        return record_id({"id": json.loads(found.group(1))})
    except ValueError:
        return None


def long_line(line: int, size: int, *, unterminated: bool) -> RejectedLine:
    """A line over `sources.MAX_LINE_BYTES`, skipped unread (`audit.records.sources`): unreadable."""
    cut = " with no newline (cut short?)" if unterminated else ""
    return RejectedLine(
        line,
        f"a line of {size:,} bytes{cut}, over the {sources.MAX_LINE_BYTES:,} bytes a line may have: skipped, not read",
        UNREADABLE,
    )


# -- the strict reading of one line ------------------------------------------------------------

# Why a line whose arrays and objects nest deeper than a JSON writer goes is no record.
TOO_DEEP = "arrays and objects nested too deeply to be written again (over 253 levels)"

# A JSON escape that decodes to ":" (see `_may_repeat_keys`).
_ESCAPED_COLONS = (b"\\u003a", b"\\u003A")


def read_strictly(
    line: int, text: bytes, *, last_unterminated: bool, id_lists: IdLists | None = None
) -> tuple[Any, RejectedLine | None]:
    """The line's JSON value, or why it is not a record (polars is never asked about it then).

    With `id_lists`, the id lists of a line that allows it are read natively (`IdLists`): the
    value then holds them as int64 arrays, and everything else as the full reading gives it.
    """
    read = id_lists.read(text) if id_lists is not None else None
    if read is not None:
        value, text, arrays = read
    else:
        arrays = None
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError as err:
            return None, _not_json(line, text, err, last_unterminated=last_unterminated)
    if not isinstance(value, dict):
        return None, RejectedLine(line, f"a JSON {json_type(value)}, expected an object", CONTRACT)
    try:
        may_repeat = _may_repeat_keys(text, value)
    except orjson.JSONEncodeError:
        # orjson reads 1,023 levels but writes 254: such a value could not be written again
        # (the source prompt, the gate's outputs), so it is no record.
        return None, RejectedLine(line, TOO_DEEP, UNREADABLE, id=record_id(value))
    if may_repeat and (repeated := _repeated_key(text)) is not None:
        return None, RejectedLine(line, repeated, UNREADABLE, id=record_id(value))
    problem = _field_problem(value)
    if problem is not None:
        return None, RejectedLine(line, problem, CONTRACT, id=record_id(value))
    if arrays:
        value.update(arrays)
    return value, None


def _not_json(line: int, text: bytes, err: Exception, *, last_unterminated: bool) -> RejectedLine:
    sample_id = leading_id(text)
    try:
        text.decode("utf-8")
    except UnicodeDecodeError as bad:
        return RejectedLine(line, f"bytes that are not UTF-8 at column {bad.start + 1}", UNREADABLE, id=sample_id)
    if last_unterminated:
        return RejectedLine(
            line, "last line is cut short with no newline: is the file still being written?", UNREADABLE,
            id=sample_id,
        )
    return RejectedLine(line, f"not valid JSON: {err}", UNREADABLE, id=sample_id)


def _may_repeat_keys(text: bytes, value: dict[str, Any]) -> bool:
    """A cheap test that is True for every line holding an object with a repeated key.

    Each key is followed by one ":" outside strings. Written again without repeats
    (`orjson.dumps` of the parsed value, which kept one value per key), the line has exactly as
    many ":" as before, plus one per `\u003a` escape that decoded to ":". A repeated key takes
    its ":" with it, so fewer means a repeat. The id lists, nearly all of a line, are left out
    of the writing: a list of integers holds no ":", so the line's own count can only be higher
    when one holds something else, and such a line gets the careful parse too. Only the rare
    lines this flags (a repeat, a `\\u003a` that was not an escape, an id list of objects or
    strings) get the careful parse.
    """
    escaped = sum(text.count(escape) for escape in _ESCAPED_COLONS) if b"\\u003" in text else 0
    rest = {key: item for key, item in value.items() if key not in ID_LIST_FIELDS}
    keys_of_id_lists = len(value) - len(rest)
    # The decoded `text`, a tenth of a line, is counted where it is, not written again: written,
    # a string holds its ":" as they are (orjson escapes none), plus its key's.
    decoded = rest.get("text")
    in_text = 0
    if isinstance(decoded, str):
        del rest["text"]
        in_text = decoded.count(":") + 1
    return orjson.dumps(rest).count(b":") + in_text + keys_of_id_lists != text.count(b":") + escaped


def _repeated_key(text: bytes) -> str | None:
    """Parse `text` again noting every object's keys; the finding when one repeats, else None."""
    repeated: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in items]
        if len(set(keys)) != len(keys):
            repeated.append(next(key for i, key in enumerate(keys) if key in keys[:i]))
        return dict(items)

    try:
        json.loads(text, object_pairs_hook=pairs)
    except RecursionError:
        return "nested too deeply to check that no key repeats"
    if not repeated:
        return None
    return (
        f"key {json.dumps(repeated[0])} appears twice in one object: JSON readers disagree on "
        "which value counts (polars keeps the first, json and orjson the last)"
    )


def _is_int(value: Any) -> bool:
    """A JSON integer that fits the 64 bits polars reads counts into."""
    return isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < 1 << 63


def _field_problem(value: dict[str, Any]) -> str | None:
    """What is wrong with the JSON types of the fields the audit reads, or None.

    Polars would coerce some of them silently (an id `true`, `1.5` or `[1]` all become strings),
    so their types are checked on the strictly parsed value. A few dict look-ups per record.
    """
    sample_id = value.get("id", "")
    if not isinstance(sample_id, str) and not (isinstance(sample_id, int) and not isinstance(sample_id, bool)):
        # orjson reads integers beyond 64 bits as floats: such an id is not kept exactly either.
        return f"id must be a string or an integer, got {_shown(sample_id)}"
    for name in ID_LIST_FIELDS:
        ids = value.get(name)
        if ids is not None and not isinstance(ids, list):
            return f"{name} must be a list of token ids, got {json_type(ids)}"
    text = value.get("text")
    if text is not None and not isinstance(text, str):
        return f"text must be a string (the server's decoded output), got {_shown(text)}"
    for name in ("messages", "tools"):
        prompt = value.get(name)
        if prompt is not None and not (isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt)):
            return f"{name} must be a list of objects, got {_shown(prompt)}"
    images = value.get("image_data")
    if images is not None and not isinstance(images, str) and not (
        isinstance(images, list) and all(isinstance(i, str) for i in images)
    ):
        return (
            "image_data must be a list of strings (a path relative to the data file's folder, an "
            f"http(s) URL or a data: URI, one per image placeholder), or one such string, got {_shown(images)}"
        )
    return meta_info_problem(value.get("meta_info"))


def id_list_problem(value: dict[str, Any]) -> tuple[str, int, str] | None:
    """(field, index, reason) of the first element of an id list that is not a 64-bit integer
    (or null, the policy's), or None.

    Per-element Python: only for lines whose text holds a boolean literal, or the lines of a
    block whose id columns could not be built (see `_records_frame`).
    """
    for name in ID_LIST_FIELDS:
        ids = value.get(name)
        if not isinstance(ids, list):
            continue
        for index, token in enumerate(ids):
            if token is not None and not _is_int(token):
                return name, index, f"{name}[{index}] = {_shown(token)} {NOT_A_TOKEN_ID}"
    return None


def prompt_fields(value: dict[str, Any]) -> dict[str, Any] | None:
    """The record's source prompt (`messages`, `tools`, `chat_template_kwargs`), if it has one."""
    if not isinstance(value.get("messages"), list) and not isinstance(value.get("tools"), list):
        return None
    return {key: value[key] for key in ("messages", "tools", "chat_template_kwargs") if key in value}


def source_prompt(value: dict[str, Any]) -> str | None:
    """The record's source prompt as JSON, if it has one (see `prompt_fields`)."""
    prompt = prompt_fields(value)
    return None if prompt is None else orjson.dumps(prompt).decode()

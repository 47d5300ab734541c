"""Gemma-4's call reader: `call:NAME{key:value,...}` in the template's own argument notation
(`<|"|>` strings, bare keys and scalars), read as SGLang's gemma4_detector reads it, exactly."""

from __future__ import annotations

import json
import re

import orjson

from audit.model.calls.call_readers import MAX_ELEMENT_DEPTH, ToolCall, _first_text, _Malformed

# The string delimiter, one special id in Gemma-4's vocabulary: `<|"|>text<|"|>`.
GEMMA4_QUOTE = '<|"|>'
# A bare key as the template writes one (`{{- key -}}:`, escape_keys=False): any text up to the
# `:` (SGLang's reader), spaces inside it kept, but none of the notation's own characters; and a
# bare value: a number, a boolean, or null (`None`: Jinja's rendering of a null argument). The
# spaces around a key are left out (" a" and "a" read alike), so a key of spaces only (`{ :1}`)
# reads as "", as an empty one does.
_GEMMA4_KEY = re.compile(r"\s*((?:[^\s:,{}\[\]\"<>|](?:[^:,{}\[\]\"<>|]*[^\s:,{}\[\]\"<>|])?)?)\s*:\s*")
_GEMMA4_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_GEMMA4_WORDS = {"true": True, "false": False, "None": None, "null": None}
_GEMMA4_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def gemma4_call(head: str, body: str) -> list[ToolCall]:
    """Gemma-4: the text between `<|tool_call>` and `<tool_call|>` is `call:NAME{ARGUMENTS}`,
    ARGUMENTS `key:value` pairs joined by `,` with bare keys; a string value is
    `<|"|>text<|"|>`, a number, boolean or null bare, an object `{...}` and an array `[...]`
    nested (the chat template's `format_argument`). Read as SGLang's gemma4_detector reads it
    (`_extract_tool_calls`, `_parse_gemma4_args`), but exact: where SGLang takes a bare word as
    a string, keeps the rest of an unterminated string, or drops text after the closing brace,
    the call is out of the format. Top-level strings are returned as `strings` (judged by the
    declared types); every other value as JSON in `arguments`."""
    text = head + body
    if not text.startswith("call:"):
        return [ToolCall(name=None, arguments=text, malformed="the call does not start with 'call:'", problem_at=0)]
    brace = text.find("{")
    if brace == -1:
        return [ToolCall(name=None, arguments=text, malformed="no '{' opens the arguments", problem_at=len(text))]
    name = text[5:brace]
    if name and not _GEMMA4_NAME.fullmatch(name):
        return [ToolCall(name=name.strip() or None, arguments=text[brace:],
                         malformed=f"the function name {name[:40]!r} is not one word", problem_at=5)]
    # The call's frame is `call:NAME{...}` up to the brace that closes the first (SGLang's
    # `_find_matching_brace`); what is inside is the arguments, which may not read (TCL002).
    end = _gemma4_closing_brace(text, brace)
    if end == -1:
        return [ToolCall(name=name or None, arguments=text[brace:],
                         arguments_error="are cut short: the '{' that opens them is never closed")]
    try:
        pairs, read_to = _gemma4_object(text, brace)
    except _Malformed as broken:
        problem, _ = broken.args
        return [ToolCall(name=name or None, arguments=text[brace:end], arguments_error=f"do not read ({problem})")]
    if read_to != end:  # the brace SGLang closes at is not the one the arguments close at
        return [ToolCall(name=name or None, arguments=text[brace:end],
                         arguments_error=f"do not read (the object closes at {text[read_to - 1:][:40]!r})")]
    if text[end:].strip():
        at = _first_text(text, end)
        return [ToolCall(name=name or None, arguments=text[brace:end],
                         malformed=f"text after the arguments: {text[at:][:40]!r}", problem_at=at)]
    strings = tuple((key, value) for key, value in pairs if isinstance(value, _Gemma4String))
    others = {key: value for key, value in pairs if not isinstance(value, _Gemma4String)}
    try:
        arguments = orjson.dumps(others).decode()
    except (TypeError, orjson.JSONEncodeError):  # an integer past 64 bits: the standard library
        arguments = json.dumps(others, ensure_ascii=False)
    return [ToolCall(name=name or None, arguments=arguments, strings=strings)]


def _gemma4_closing_brace(text: str, brace: int) -> int:
    """The offset after the `}` that closes the `{` at `brace`, skipping `<|"|>` strings; -1 when
    it is never closed."""
    depth, at = 0, brace
    while at < len(text):
        if text.startswith(GEMMA4_QUOTE, at):
            close = text.find(GEMMA4_QUOTE, at + len(GEMMA4_QUOTE))
            if close == -1:
                return -1
            at = close + len(GEMMA4_QUOTE)
            continue
        if text[at] == "{":
            depth += 1
        elif text[at] == "}":
            depth -= 1
            if depth == 0:
                return at + 1
        at += 1
    return -1


class _Gemma4String(str):
    """A top-level value the model delimited with `<|"|>`: a string whatever its text."""


def _gemma4_object(text: str, at: int, depth: int = 0) -> tuple[list[tuple[str, object]], int]:
    """`{key:value,...}` from `text[at] == "{"`: the pairs and the offset after the `}`."""
    if depth > MAX_ELEMENT_DEPTH:
        raise _Malformed(f"arguments nested more than {MAX_ELEMENT_DEPTH} levels deep", at)
    pairs: list[tuple[str, object]] = []
    at += 1
    while True:
        at = _first_text(text, at)
        if text.startswith("}", at) and not pairs:
            return pairs, at + 1
        key = _GEMMA4_KEY.match(text, at)
        if key is None:
            if text.startswith(GEMMA4_QUOTE, at) or text.startswith('"', at):
                raise _Malformed(f"a key written as a string: {text[at:][:40]!r} (keys are bare)", at)
            raise _Malformed(_gemma4_missing("a key then ':'", text, at), at)
        value, at = _gemma4_value(text, key.end(), depth)
        pairs.append((key.group(1), _Gemma4String(value) if depth == 0 and isinstance(value, str) else value))
        at = _first_text(text, at)
        if text.startswith(",", at):
            at += 1
        elif text.startswith("}", at):
            return pairs, at + 1
        else:
            raise _Malformed(_gemma4_missing("',' or '}'", text, at), at)


def _gemma4_array(text: str, at: int, depth: int) -> tuple[list[object], int]:
    items: list[object] = []
    at = _first_text(text, at + 1)
    if text.startswith("]", at):
        return items, at + 1
    while True:
        value, at = _gemma4_value(text, at, depth)
        items.append(value)
        at = _first_text(text, at)
        if text.startswith(",", at):
            at += 1
        elif text.startswith("]", at):
            return items, at + 1
        else:
            raise _Malformed(_gemma4_missing("',' or ']'", text, at), at)


def _gemma4_value(text: str, at: int, depth: int) -> tuple[object, int]:
    at = _first_text(text, at)
    if text.startswith(GEMMA4_QUOTE, at):
        end = text.find(GEMMA4_QUOTE, at + len(GEMMA4_QUOTE))
        if end == -1:
            raise _Malformed(f"a string opened with {GEMMA4_QUOTE} is never closed", at)
        return text[at + len(GEMMA4_QUOTE) : end], end + len(GEMMA4_QUOTE)
    if text.startswith("{", at):
        pairs, end = _gemma4_object(text, at, depth + 1)
        return dict(pairs), end
    if text.startswith("[", at):
        if depth > MAX_ELEMENT_DEPTH:
            raise _Malformed(f"arguments nested more than {MAX_ELEMENT_DEPTH} levels deep", at)
        return _gemma4_array(text, at, depth + 1)
    number = _GEMMA4_NUMBER.match(text, at)
    word = re.match(r"[A-Za-z]+", text[at:])
    if word is not None and word.group() in _GEMMA4_WORDS:
        return _GEMMA4_WORDS[word.group()], at + word.end()
    if number is not None and (word is None or number.end() > at):
        literal = number.group()
        value: object = float(literal) if any(c in literal for c in ".eE") else int(literal)
        return value, number.end()
    raise _Malformed(
        f"a value that is not {GEMMA4_QUOTE}text{GEMMA4_QUOTE}, a number, a boolean, null, "
        f"an object or an array: {text[at:][:40]!r}",
        at,
    )


def _gemma4_missing(wanted: str, text: str, at: int) -> str:
    return f"{wanted} expected, the arguments end" if at >= len(text) else f"{wanted} expected at {text[at:][:40]!r}"


def gemma4_tools_in_prompt(prompt: str, begin: str, end: str) -> list[dict] | None:
    """The tools the template declared in a prompt, each `<|tool>declaration:NAME{...}<tool|>`
    in its own notation (`format_function_declaration`: types upper-case, strings between
    `<|"|>`), as OpenAI-style tools with JSON Schema types; None when the prompt declares none.
    A declaration that does not read is left out."""
    tools: list[dict] = []
    start = prompt.find(begin)
    while start >= 0:
        stop = prompt.find(end, start + len(begin))
        if stop < 0:
            break
        text = prompt[start + len(begin) : stop].strip()
        brace = text.find("{")
        if text.startswith("declaration:") and brace > len("declaration:"):
            try:
                pairs, read_to = _gemma4_object(text, brace)
            except _Malformed:
                pairs, read_to = [], -1
            if read_to == len(text):
                declared = _schema(dict(pairs))
                function: dict[str, object] = {"name": text[len("declaration:") : brace]}
                if isinstance(declared, dict):
                    function.update(declared)
                tools.append({"type": "function", "function": function})
        start = prompt.find(begin, stop + len(end))
    return tools or None


def _schema(value: object) -> object:
    """A declaration's value with its `type`s in JSON Schema's lower case."""
    if isinstance(value, dict):
        return {
            key: (_lower(item) if key == "type" else _schema(item)) for key, item in value.items()
        }
    if isinstance(value, list):
        return [_schema(item) for item in value]
    return str(value) if isinstance(value, str) else value


def _lower(value: object) -> object:
    if isinstance(value, str):
        return value.lower()
    if isinstance(value, list):
        return [item.lower() if isinstance(item, str) else item for item in value]
    return value

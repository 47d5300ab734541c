"""XTML, the markup of Kimi-K3's prompts and replies.

Its brackets are four special tokens: `<|open|>TAG ATTRIBUTES<|sep|>` opens an element,
`<|close|>TAG<|sep|>` closes it, `<|end_of_msg|>` ends a message. Tag names and attributes are
ordinary text: `<|open|>call tool="NAME" index="1"<|sep|>`. An attribute value escapes `&` then
`"` (`&amp;`, `&quot;`); `<` and `>` stay as they are, the brackets being tokens. A call's
argument is `<|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>`: a string
value raw with `type="string"`, any other value as JSON (`json.dumps` defaults) typed
boolean/null/number/object/array. Sources: `encoding_k3.py` as its public ports read
(`audit.model.encoders.kimi_k3`), SGLang's `function_call/kimik3_format.py`.

A rendering is a list of `Segment`s: markers are control segments, everything else text, and
each segment is encoded on its own (`_open_tag` writes ` key`, `="`, the value and `"` as four
segments, as the reference does).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from audit.model.encoders.base import Segment

OPEN = "<|open|>"
CLOSE = "<|close|>"
SEP = "<|sep|>"
END_OF_MSG = "<|end_of_msg|>"
# An image part of a message's content, left for the vision processor (a marker too).
IMAGE_PLACEHOLDER = "<|kimi_image_placeholder|>"
# The marker ids of the real tokenizer (tokenizer_config.json of the release, as the wrapper
# around the vendored encoding_k3.py records them); `<|end_of_msg|>` is the stop token.
MARKER_IDS = {END_OF_MSG: 163586, OPEN: 163587, CLOSE: 163588, SEP: 163589}

Segments = list[Segment]


def escape_attribute(value: Any) -> str:
    """An attribute value as XTML writes it: `&` then `"` escaped (that order)."""
    return str(value).replace("&", "&amp;").replace('"', "&quot;")


def unescape_attribute(value: str) -> str:
    """The value an escaped attribute holds (`&quot;` undone before `&amp;`)."""
    return value.replace("&quot;", '"').replace("&amp;", "&")


def argument_type(value: Any) -> str:
    """The `type` attribute of an argument (bool before number: True is an int in Python)."""
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    return "array"


def argument_text(value: Any) -> str:
    """An argument's value as written between its tags: a string raw, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def control(marker: str) -> Segments:
    """Markup: special-token strings in it are their ids."""
    return [Segment(marker, True)] if marker else []


def text(value: Any) -> Segments:
    """Text (content, tag names, attribute fragments): special-token strings in it are text."""
    value = str(value)
    return [Segment(value)] if value else []


_OPEN, _CLOSE, _SEP = Segment(OPEN, True), Segment(CLOSE, True), Segment(SEP, True)
_EQUALS_QUOTE, _QUOTE = Segment('="', False), Segment('"', False)


def open_tag(tag: str, attributes: Iterable[tuple[str, Any]] = ()) -> Segments:
    """`<|open|>TAG KEY="VALUE"...<|sep|>`, the value escaped."""
    out = [_OPEN, Segment(tag, False)]
    for key, value in attributes:
        out.append(Segment(f" {key}", False))
        out.append(_EQUALS_QUOTE)
        out += text(escape_attribute(value))
        out.append(_QUOTE)
    out.append(_SEP)
    return out


def close_tag(tag: str) -> Segments:
    """`<|close|>TAG<|sep|>`."""
    return [_CLOSE, Segment(tag, False), _SEP]


def end_of_msg() -> Segments:
    """`<|end_of_msg|>`, the end of every message (and the model's stop token)."""
    return control(END_OF_MSG)


# One argument as written: (key, type attribute, the text between its tags).
Argument = tuple[str, str, str]
_JSON = json.JSONDecoder(strict=False)
_JSON_SPACE = " \t\n\r"


def mapping_arguments(arguments: Mapping[str, Any]) -> list[Argument]:
    """Arguments given as a mapping: each value typed and written (`argument_text`)."""
    return [(str(key), argument_type(value), argument_text(value)) for key, value in arguments.items()]


def text_arguments(text: str) -> list[Argument] | None:
    """Arguments given as a JSON object's text, as `encoding_k3._parse_arguments_object` (revision
    a590ce09) reads them: one level deep, each value written as its own slice of the text (a
    string value decoded), so nested spacing and number spelling are kept; duplicate keys kept,
    anything after the closing brace ignored. None where the text is not such an object (the
    encoder then writes it raw in a `json` element)."""
    try:
        return _parsed_object(text)
    except (ValueError, IndexError, RecursionError):
        return None


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in _JSON_SPACE:
        at += 1
    return at


def _parsed_object(text: str) -> list[Argument] | None:
    at = _skip_space(text, 0)
    if text[at : at + 1] != "{":
        return None
    at = _skip_space(text, at + 1)
    if at >= len(text):
        return None
    parsed: list[Argument] = []
    if text[at] == "}":
        return parsed
    while True:
        key, at = _JSON.raw_decode(text, at)
        if not isinstance(key, str):
            return None
        at = _skip_space(text, at)
        if text[at : at + 1] != ":":
            return None
        start = _skip_space(text, at + 1)
        value, at = _JSON.raw_decode(text, start)
        parsed.append((key, argument_type(value), value if isinstance(value, str) else text[start:at]))
        at = _skip_space(text, at)
        separator = text[at : at + 1]
        at = _skip_space(text, at + len(separator))
        if separator == "}":
            return parsed
        if separator != ",":
            return None

"""Kimi-K3's call text: XTML tags, read as SGLang's KimiK3Detector reads them.

A reader of `audit.model.calls.call_readers`' kind: it gets the text between a call's `<|open|>call`
and `<|close|>call<|sep|>` (both markers are sequences of ids: `audit.model.tokens.flat_ids.marker_view`)
and returns the call, `malformed` where SGLang would drop or misread it.
"""

from __future__ import annotations

import re

import orjson

from audit.model.calls.call_readers import ToolCall

# SGLang's KimiK3Detector (python/sglang/srt/function_call/kimik3_detector.py): a call is
# `<|open|>call\s+ATTRS<|sep|>BODY<|close|>call<|sep|>` (_CALL_RE), each argument
# `<|open|>argument\s+ATTRS<|sep|>VALUE<|close|>argument<|sep|>` (_ARG_RE), an attribute
# `\w+="[^"]*"` (_ATTR_RE) with `&quot;` and `&amp;` unescaped. The reader gets what lies between
# the call's `<|open|>call` and `<|close|>call<|sep|>`.
_K3_SEP = "<|sep|>"
_K3_CALL = re.compile(r"(?P<space>\s+)(?P<attrs>(?:(?!<\|sep\|>).)*?)<\|sep\|>", re.DOTALL)
_K3_ARGUMENT = re.compile(
    r"<\|open\|>argument\s+(?P<attrs>(?:(?!<\|sep\|>).)*?)<\|sep\|>"
    r"(?P<value>(?:(?!<\|open\|>argument|<\|close\|>argument<\|sep\|>).)*)<\|close\|>argument<\|sep\|>",
    re.DOTALL,
)
_K3_ATTRIBUTE = re.compile(r'(?P<k>\w+)="(?P<v>[^"]*)"')
# The attribute list as the renderer writes it (encoding_k3.py `_open_tag`): ` key="value"` pairs.
_K3_ATTRIBUTES = re.compile(r'\s*(?:\w+="[^"]*"(?:\s+\w+="[^"]*")*)?\s*')
# A value the renderer escapes has no `&` but in `&amp;` and `&quot;`.
_K3_BARE_AMPERSAND = re.compile(r"&(?!amp;|quot;)")
# The `type` attribute's values (kimik3_structural_tag.py `_JSON_TO_XTML_TYPE`), and the JSON
# types each admits.
_K3_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "number": (int, float), "boolean": (bool,), "array": (list,), "object": (dict,),
    "null": (type(None),),
}


def _k3_attributes(text: str) -> tuple[dict[str, str], str | None]:
    """The attributes of a tag, unescaped as SGLang's `_parse_attrs`, and why they are not what
    the renderer writes (None when they are)."""
    attributes = {m["k"]: m["v"].replace("&quot;", '"').replace("&amp;", "&") for m in _K3_ATTRIBUTE.finditer(text)}
    if not _K3_ATTRIBUTES.fullmatch(text):
        return attributes, f'attributes are not key="value" pairs: {text[:40]!r}'
    if _K3_BARE_AMPERSAND.search(text):
        return attributes, f"an attribute value holds an unescaped '&': {text[:40]!r}"
    return attributes, None


def kimi_k3_call(head: str, body: str) -> list[ToolCall]:
    """Kimi-K3 (the checkpoint's encoding_k3.py, as SGLang's KimiK3Detector reads it): after
    `<|open|>call`, ` tool="NAME" index="N"<|sep|>`, then per argument `<|open|>argument
    key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>`, nothing between them. `type="string"`
    values are raw text; other types are JSON of that type. Malformed where SGLang drops the
    call (no separator, no `tool`) or misreads it (an argument never closed swallows the next,
    text outside the arguments is lost, a value that is not JSON is kept as a string)."""
    call = _K3_CALL.match(head)
    if call is None:
        return [ToolCall(name=None, arguments=head, malformed="call tag without attributes and <|sep|>", problem_at=0)]
    attributes, problem = _k3_attributes(call["attrs"])
    name = attributes.get("tool") or None
    malformed = problem_at = None

    def broken(why: str, at: int) -> None:
        nonlocal malformed, problem_at
        if malformed is None:
            malformed, problem_at = why, at

    if problem is not None:
        broken(problem, call.start("attrs"))
    if name is None:
        broken('call has no tool="NAME" attribute: SGLang drops it', call.start("attrs"))
    index = attributes.get("index")
    if index is None or not re.fullmatch(r"[1-9][0-9]*", index):
        broken(f'call index {index!r} is not index="N" (N from 1)', call.start("attrs"))
    strings: list[tuple[str, str]] = []
    json_values: dict[str, str] = {}
    seen: set[str] = set()
    order: list[str] = []
    at = call.end()
    while at < len(head):
        argument = _K3_ARGUMENT.match(head, at)
        if argument is None:
            rest = head[at:]
            if rest.startswith("<|open|>argument"):
                broken("an <|open|>argument is not closed by <|close|>argument<|sep|>", at)
            else:
                broken(f"text outside the argument tags: {rest[:40]!r}", at)
            break
        arg_attributes, problem = _k3_attributes(argument["attrs"])
        key, kind, value = arg_attributes.get("key"), arg_attributes.get("type", "string"), argument["value"]
        if problem is not None:
            broken(problem, argument.start("attrs"))
        if not key:
            broken('argument has no key="K" attribute', argument.start("attrs"))
        elif key in seen:  # SGLang keeps the last value: the first is lost
            broken(f"argument {key!r} written twice", argument.start("attrs"))
        seen.add(key or "")
        order.append(key or "")
        if kind not in _K3_TYPES:
            broken(f"argument {key!r} has type {kind!r}, not one of {', '.join(_K3_TYPES)}", argument.start("attrs"))
        elif kind == "string":
            strings.append((key or "", value))
        else:
            try:
                parsed = orjson.loads(value)
            except orjson.JSONDecodeError:
                parsed = None
                # Left for the arguments' JSON check: a non-string value is JSON (SGLang keeps it as text).
            else:
                if not isinstance(parsed, _K3_TYPES[kind]) or (kind == "number" and isinstance(parsed, bool)):
                    broken(f"argument {key!r} is type {kind!r} but its value is {value[:40]!r}", argument.start("value"))
            json_values[key or ""] = value
        at = argument.end()
    # The JSON-typed values as one object, which the arguments' JSON check judges.
    arguments = "{" + ", ".join(f"{orjson.dumps(k).decode()}: {v}" for k, v in json_values.items()) + "}"
    return [ToolCall(name=name, arguments=arguments, malformed=malformed, problem_at=problem_at, strings=tuple(strings),
                     index=index, order=tuple(order))]

"""Arguments written as text parameters or nested elements, as the JSON object a server returns.

An OpenAI-compatible server's tool parser hands a call's arguments back as a JSON string; for
formats that write each parameter as text (Qwen3.5/3.6's `<parameter=K>`, GLM's `<arg_value>`)
or as nested elements (MiniMax-M3) it converts each value by the type the tool's schema
declares first, as SGLang's qwen3_coder_detector `_convert_param_value` and glm4_moe_detector
do: string types as written, integers and numbers parsed, booleans by `true`, `null` as null,
anything else read as JSON (or a Python literal) when it reads, as written when not. This is
that conversion, close to SGLang's, for the trainer view's conversations (docs/trainer-view.md).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from typing import Any

from audit.model.calls.call_elements import Element
from audit.model.calls.call_values import declared_type, properties_of

_STRING_TYPES = {"string", "str", "text", "varchar", "char", "enum"}
_INTEGER_PREFIXES = ("int", "uint", "long", "short", "unsigned")
_NUMBER_PREFIXES = ("num", "float")
_BOOLEAN_TYPES = {"boolean", "bool", "binary"}


def convert_value(text: str, schema: Any) -> Any:
    """One parameter's text as the value a server's tool parser gives it (see the module docs)."""
    kind = (declared_type(schema) or "").strip().lower()
    if text.strip().lower() == "null" and kind not in _STRING_TYPES:
        return None
    if kind in _STRING_TYPES:
        return text
    if kind.startswith(_INTEGER_PREFIXES):
        try:
            return int(text.strip())
        except ValueError:
            return text
    if kind.startswith(_NUMBER_PREFIXES):
        try:
            number = float(text.strip())
        except ValueError:
            return text
        return int(number) if number.is_integer() and "." not in text and "e" not in text.lower() else number
    if kind in _BOOLEAN_TYPES:
        return text.strip().lower() == "true"
    for read in (json.loads, ast.literal_eval):
        try:
            return read(text.strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return text


def parameters_object(pairs: tuple[tuple[str, str], ...], schema: Mapping | None) -> dict[str, Any]:
    """(name, value text) pairs as the arguments object, each value by its declared type."""
    properties = properties_of(schema) if isinstance(schema, Mapping) else {}
    return {name: convert_value(value, properties.get(name)) for name, value in pairs}


def elements_object(elements: tuple[Element, ...], schema: Mapping | None) -> dict[str, Any]:
    """Nested elements (MiniMax-M3) as the arguments object: an element with children is an
    object, or an array when its children are `item`s; a leaf converts by its schema."""
    properties = properties_of(schema) if isinstance(schema, Mapping) else {}
    return {element.tag: _element_value(element, properties.get(element.tag)) for element in elements}


def _element_value(element: Element, schema: Any) -> Any:
    if not element.children:
        return convert_value(element.text.strip(), schema)
    if all(child.tag == "item" for child in element.children):
        items = schema.get("items") if isinstance(schema, Mapping) else None
        return [_element_value(child, items) for child in element.children]
    properties = properties_of(schema) if isinstance(schema, Mapping) else {}
    return {child.tag: _element_value(child, properties.get(child.tag)) for child in element.children}

"""Arguments written as nested elements (MiniMax-M3), judged leaf by leaf against the schema.

An object's keys and an array's `<item>`s are elements; each leaf's text must convert to the
type its schema declares, as SGLang's minimax_m3.py converts it (`elements_error`), and a
boolean leaf is written as the template writes it, `true` (`elements_literal`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from audit.model.calls.call_values import is_integer, properties_of


@dataclass(frozen=True)
class Element:
    """One element of arguments written as nested elements: `<tag>text</tag>`, or
    `<tag>` children `</tag>` (an object's keys, or an array's `<item>`s)."""

    tag: str
    text: str = ""
    children: tuple[Element, ...] = ()


# SGLang's minimax_m3.py: a leaf's text converted by the schema's `type` (only `type` is read).
_M3_STRING = {"string", "str"}
_M3_INTEGER = {"integer", "int"}
_M3_NUMBER = {"number", "float"}
_M3_BOOLEAN = {"boolean", "bool"}
_M3_CONTAINER = {"object", "array"}
_M3_SCALAR = _M3_STRING | _M3_INTEGER | _M3_NUMBER | _M3_BOOLEAN | {"null"}
_M3_NULLS = {"null", "Null", "NULL", ""}
_M3_TRUTHS = {"true", "1", "yes", "on", "false", "0", "no", "off"}


def _schema_types(schema: Any) -> set[str]:
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    if isinstance(kind, str):
        return {kind.lower()}
    if isinstance(kind, list):
        return {t.lower() for t in kind if isinstance(t, str)}
    return set()


def _untyped(schema: Any) -> bool:
    return not isinstance(schema, Mapping) or (
        not _schema_types(schema) and not any(key in schema for key in ("properties", "items", "prefixItems"))
    )


def _child_schema(parent: Any, tag: str, index: int) -> Any:
    """The schema of a child element (SGLang `_get_child_schema`): an array's `<item>` number
    `index`, an object's property, or its additionalProperties."""
    if not isinstance(parent, Mapping):
        return None
    if "array" in _schema_types(parent) and tag == "item":
        prefix = parent.get("prefixItems")
        if isinstance(prefix, list) and index < len(prefix):
            return prefix[index]
        for key in ("additionalItems", "items"):
            if isinstance(parent.get(key), Mapping):
                return parent[key]
        return prefix[-1] if isinstance(prefix, list) and prefix else None
    properties = properties_of(parent)
    if tag in properties:
        return properties[tag]
    extra = parent.get("additionalProperties")
    return extra if isinstance(extra, Mapping) else None


def _leaf_error(text: str, schema: Any) -> str | None:
    """Why a leaf's text does not convert to its declared type (SGLang `_convert_leaf_value`
    falls back to the raw string then), or None."""
    if _untyped(schema):
        return None
    types = _schema_types(schema)
    nullable = "null" in types
    if types & _M3_STRING or (nullable and text in _M3_NULLS):
        return None
    # An integral number (3.0) is an integer, as JSON Schema and the text formats' check have it.
    if types & _M3_INTEGER and is_integer(text):
        return None
    if types & _M3_NUMBER:
        try:
            float(text)
            return None
        except ValueError:
            pass
    if types & _M3_BOOLEAN and text.lower().strip() in _M3_TRUTHS:
        return None
    declared = "/".join(sorted(types))
    if types & (_M3_INTEGER | _M3_NUMBER | _M3_BOOLEAN):
        return f"declared {declared}, not one"
    if types & _M3_CONTAINER:
        return f"declared {declared}, written as text"
    return None  # a type SGLang has no conversion for: kept as text


def elements_literal(elements: tuple[Element, ...], schema: Any, path: str = "") -> str | None:
    """The first leaf declared boolean written as a Python bool (`True`, where MiniMax-M3's
    template writes `true` with `tojson`), as `have 'path' written as a Python bool`, or None."""
    seen: dict[str, int] = {}
    for element in elements:
        index = seen.get(element.tag, 0)
        seen[element.tag] = index + 1
        child = _child_schema(schema, element.tag, index)
        where = f"{path}.{element.tag}" if path else element.tag
        if element.children:
            if found := elements_literal(element.children, child, where):
                return found
        elif _schema_types(child) & _M3_BOOLEAN and element.text.strip() in ("True", "False"):
            return f"have {where!r} written as a Python bool, not JSON: {element.text.strip()!r}"
    return None


def elements_error(elements: tuple[Element, ...], schema: Any, path: str = "") -> str | None:
    """Why arguments written as nested elements do not read as the tool's `parameters` schema
    declares them, or None (an undeclared tool or element is never an error).

    Each leaf's text must convert to its declared scalar type, as SGLang converts it; an element
    declared object or array is written as elements, never as text; an element declared as a
    scalar holds no elements (SGLang cannot read such a call and drops it)."""
    seen: dict[str, int] = {}
    for element in elements:
        index = seen.get(element.tag, 0)
        seen[element.tag] = index + 1
        child = _child_schema(schema, element.tag, index)
        where = f"{path}.{element.tag}" if path else element.tag
        types = _schema_types(child)
        scalar = bool(types & _M3_SCALAR) and not types & _M3_CONTAINER
        if element.children:
            if scalar:
                return f"have {where!r} declared {'/'.join(sorted(types))}, written as elements"
            problem = elements_error(element.children, child, where)
        elif element.text or scalar:
            problem = _leaf_error(element.text, child)
            problem = problem and f"have {where!r} {problem}: {element.text[:60]!r}"
        else:
            problem = None  # an empty element: an empty object or array
        if problem:
            return problem
    return None

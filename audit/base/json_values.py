"""JSON values named as JSON names them, for messages about data that came as JSON."""

from __future__ import annotations

from typing import Any


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type (`null`, `boolean`, `integer`, `number`, `string`,
    `array`, `object`)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)

"""How the values of a tool call are judged: by the type the record's `tools` declare.

The serving stack's tool-call parser converts each value by its declared type, and a value the
model wrote that does not convert is data the target never meant. Two shapes of arguments:

- parameters written as text (Qwen3.5/3.6's `<parameter=K>`, GLM's `<arg_value>`, DSML's
  `string="true"`): each value judged by the types its property admits (`allowed_types`,
  `value_error`), as SGLang's qwen3_coder and GLM detectors convert them (by the primary one,
  `declared_type`; a value of another admitted type is still a valid argument);
- arguments written as nested elements (MiniMax-M3), judged leaf by leaf against the schema
  they sit under: `audit.model.calls.call_elements`.

A `string` value is any text; an integer, number, boolean, object or array value must read as
one; a parameter or tool the record does not declare is never an error.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Mapping
from typing import Any

import orjson

from audit.base.json_values import json_type

# -- parameters written as text ----------------------------------------------------------------

# SGLang's qwen3_coder_detector `_convert_param_value` and glm4_moe_detector `parse_arguments`.
_STRING_TYPES = {"string", "str", "text", "varchar", "char", "enum"}
_INTEGER_PREFIXES = ("int", "uint", "long", "short", "unsigned")
_NUMBER_PREFIXES = ("num", "float")
_BOOLEAN_TYPES = {"boolean", "bool", "binary"}


def declared_type(schema: Any) -> str | None:
    """The primary type a JSON-schema property declares, as SGLang infers it
    (`infer_type_from_json_schema`): `type` (the first non-null of a list), anyOf/oneOf, enum,
    allOf, `properties` (object), `items` (array). None when it declares none."""
    if not isinstance(schema, Mapping):
        return None
    kind = schema.get("type")
    if isinstance(kind, str):
        return kind
    if isinstance(kind, list) and kind:
        non_null = [t for t in kind if t != "null"]
        return str(non_null[0]) if non_null else "string"
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list):
        types = [t for t in (declared_type(b) for b in branches) if t]
        if types:
            distinct = set(types)
            if len(distinct) == 1:
                return types[0]
            if len(distinct) == 2 and "null" in distinct:
                return next(t for t in types if t != "null")
            return "string" if "string" in distinct else types[0]
    enum = schema.get("enum")
    if isinstance(enum, list):
        kinds = {json_type(v) for v in enum}
        return kinds.pop() if len(kinds) == 1 else "string"
    if isinstance(schema.get("allOf"), list):
        for branch in schema["allOf"]:
            kind = declared_type(branch)
            if kind and kind != "string":
                return kind
        return "string"
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return None


def allowed_types(schema: Any) -> str | tuple[str, ...] | None:
    """The types a property's value may read as, for judging a value written as text.

    SGLang converts a value by the schema's primary type (`declared_type`); a value that reads
    as another type the schema allows is still a valid argument the template would render
    that way (`{"type": ["integer", "string"]}` and "abc"), so every type the schema admits is
    kept: `type` (a name or a list), anyOf/oneOf (the union of their branches), enum/const
    (the kinds of their values), allOf (the types every branch allows), `properties` (object),
    `items` (array). Null is left out: "null" reads as every type's null. A single type is a
    string ("string" when a string is allowed: any text is one), several a tuple, and None
    when the schema does not constrain the type (then nothing is judged).
    """
    kinds = _admitted(schema)
    if kinds is None:
        return None
    kinds = [kind for kind in kinds if kind != "null"]
    if not kinds:
        return None
    if any(_normal_kind(kind) == "string" for kind in kinds):
        return "string"
    unique = tuple(dict.fromkeys(kinds))
    return unique[0] if len(unique) == 1 else unique


def _admitted(schema: Any, depth: int = 0) -> list[str] | None:
    """Every JSON type `schema` admits, or None when it does not constrain the type."""
    if not isinstance(schema, Mapping) or depth > 32:
        return None
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list) and kind and all(isinstance(k, str) for k in kind):
        return list(kind)
    for keyword in ("anyOf", "oneOf"):
        branches = schema.get(keyword)
        if isinstance(branches, list) and branches:
            union: list[str] = []
            for branch in branches:
                kinds = _admitted(branch, depth + 1)
                if kinds is None:
                    return None  # one branch admits anything: so does the union
                union.extend(kinds)
            return union
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(values, list):
        return [json_type(value) for value in values] or None
    if isinstance(schema.get("allOf"), list):
        common: set[str] | None = None
        for branch in schema["allOf"]:
            kinds = _admitted(branch, depth + 1)
            if kinds is not None:
                common = set(kinds) if common is None else common & set(kinds)
        return sorted(common) if common else None
    if "properties" in schema:
        return ["object"]
    if "items" in schema:
        return ["array"]
    return None


def _normal_kind(declared: str) -> str | None:
    """A declared type name as one of SGLang's conversions, or None when it has none."""
    kind = declared.strip().lower()
    if kind in _STRING_TYPES or kind == "null":
        return "string"
    if kind.startswith(_INTEGER_PREFIXES):
        return "integer"
    if kind.startswith(_NUMBER_PREFIXES):
        return "number"
    if kind in _BOOLEAN_TYPES:
        return "boolean"
    if kind.startswith(("object", "dict")):
        return "object"
    if kind.startswith(("array", "arr", "list")):
        return "array"
    return None


def value_error(value: str, declared: str | tuple[str, ...] | list[str] | None) -> str | None:
    """Why a parameter written as text reads as none of its declared types, or None.

    `declared` is a type name, several (`allowed_types`), or None. A string is any text;
    `null` (any case) is every type's null, and so is `None`, what Qwen's template writes for a
    null value (`| string`); an undeclared parameter is never an error. Booleans are accepted
    in any case (`True` is what Qwen's template writes for a Python bool). An integer may be
    written as an integral number (`3.0`, what a template renders for the JSON-schema integer
    3.0). Objects and arrays read as JSON or as a Python literal, as SGLang falls back, but
    never with a trailing comma (`{"a": 1,}`: neither JSON nor what the template renders).
    """
    if declared is None:
        return None
    kinds = (declared,) if isinstance(declared, str) else tuple(declared)
    text = value.strip()
    if not kinds or text.lower() == "null" or text == "None":
        return None
    problems = []
    for kind in kinds:
        problem = _kind_error(text, kind)
        if problem is None:
            return None
        problems.append(problem)
    if len(problems) == 1:
        return f"declared {kinds[0]}, {problems[0]}"
    return f"declared {' or '.join(kinds)}, reads as none of them"


def _kind_error(text: str, declared: str) -> str | None:
    kind = _normal_kind(declared)
    if kind is None or kind == "string":
        return None  # any text is a string; a type SGLang has no conversion for is kept as text
    if kind == "integer":
        return None if is_integer(text) else "not an integer"
    if kind == "number":
        try:
            float(text)
        except ValueError:
            return "not a number"
        return None
    if kind == "boolean":
        return None if text.lower() in ("true", "false") else "not true or false"
    if _trailing_comma(text):
        return f"not a JSON {kind} (a trailing comma, which JSON and the template's tojson never write)"
    wanted = dict if kind == "object" else list
    if not isinstance(_literal(text), wanted):
        return f"not a JSON {kind}"
    return None


def _trailing_comma(text: str) -> bool:
    """Is `text` an object or array with a comma just before a closing bracket? Not JSON, and
    no template writes it; only the literal_eval fallback of SGLang's detectors reads it.
    Tokenized, so a comma inside a string is not one."""
    if not text.startswith(("{", "[")) or "," not in text:
        return False
    try:
        orjson.loads(text)
        return False  # JSON has no trailing comma
    except orjson.JSONDecodeError:
        pass
    try:
        tokens = [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.string.strip()]
    except (SyntaxError, tokenize.TokenError):
        return False
    return any(a == "," and b in ")]}" for a, b in zip(tokens, tokens[1:], strict=False))


def python_literal(text: str, *, scalars: bool = True) -> str | None:
    """What `text` is when it is a Python literal rather than JSON ("a Python dict"), else None.

    The trace of a pipeline that parsed a call and wrote a value back with `str()`: single
    quotes, `True`, `False`, `None`, tuples. JSON is never one, nor text that is neither (cut
    short, or with a trailing comma: broken JSON, which the JSON check names). With
    `scalars=False` a bare `True`, `False` or `None` is not one either (what Qwen's template
    writes for a boolean or null parameter, with `| string`).
    """
    stripped = text.strip()
    if not stripped or stripped[0] not in "{[(TFN":
        return None
    try:
        orjson.loads(stripped)
        return None
    except orjson.JSONDecodeError:
        pass
    try:
        value = ast.literal_eval(stripped)
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(stripped).readline) if t.string.strip()]
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, tokenize.TokenError):
        return None
    if not isinstance(value, dict | list | tuple | bool) and value is not None:
        return None
    if not scalars and not isinstance(value, dict | list | tuple):
        return None
    if any(a.string == "," and b.string in ")]}" for a, b in zip(tokens, tokens[1:], strict=False)):
        return None  # a trailing comma: JSON cut or edited by hand, not a repr
    python_only = isinstance(value, tuple) or any(
        (t.type == tokenize.STRING and not t.string.startswith('"'))
        or (t.type == tokenize.NAME and t.string in ("True", "False", "None"))
        for t in tokens
    )
    if not python_only:
        return None
    kind = {dict: "dict", list: "list", tuple: "tuple", bool: "bool"}.get(type(value), "None")
    return f"a Python {kind}"


def string_error(declared: str | tuple[str, ...] | list[str] | None) -> str | None:
    """Why a value the model marked as a string (DSML's `string="true"`, which SGLang passes on
    as text whatever the schema says) is not one its declared types admit, or None."""
    if declared is None:
        return None
    kinds = (declared,) if isinstance(declared, str) else tuple(declared)
    if not kinds or any(_normal_kind(kind) in (None, "string") for kind in kinds):
        return None
    return f"declared {' or '.join(kinds)}, written as a string"


def parameter_literal(value: str, declared: str | tuple[str, ...] | None, *, python_scalars: bool) -> str | None:
    """`python_literal` of a parameter written as text, when it is one of the types the tools
    declare for it (an object as a Python dict, a boolean as `True` where the template writes
    `true`, ...), else None. `python_scalars`: the template writes booleans and null with
    `| string` (Qwen3.5/3.6), so `True` and `None` are its own form there."""
    if declared is None:
        return None
    kinds = {_normal_kind(kind) for kind in ((declared,) if isinstance(declared, str) else declared)}
    if "string" in kinds:
        return None  # any text is a string
    literal = python_literal(value, scalars=not python_scalars)
    wanted = {"a Python dict": "object", "a Python list": "array", "a Python tuple": "array", "a Python bool": "boolean"}
    if literal is None or (literal != "a Python None" and wanted[literal] not in kinds):
        return None
    return literal


def is_integer(text: str) -> bool:
    """An integer, or a number with no fractional part (JSON Schema's integer: 3.0 is one)."""
    try:
        int(text)
        return True
    except ValueError:
        pass
    try:
        number = orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return isinstance(number, float) and number.is_integer()


def _literal(text: str) -> Any:
    """JSON, else a Python literal (SGLang's `safe_literal_eval` fallback), else None."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def parameter_types(tools: Any, name: str | None) -> dict[str, str | tuple[str, ...] | None] | None:
    """The types each parameter of the tool `name` may read as (`allowed_types`), from an
    OpenAI-style `tools` list.

    None when the tool (or the list) is unknown: then nothing about its values is judged.
    """
    schema = tool_parameters(tools, name)
    if schema is None:
        return None
    return {key: allowed_types(value) for key, value in properties_of(schema).items()}


def tools_in_prompt(prompt: str, begin: str, end: str) -> list[dict] | None:
    """The tool schemas a template wrote into a prompt between `begin` and `end`, one JSON
    object a line (Qwen's and GLM's `<tools>` block), or None when the prompt holds none.
    The first such block that holds a schema counts (the templates also name the tags in a
    sentence before it: "within <tools></tools> XML tags")."""
    start = prompt.find(begin)
    while start >= 0:
        stop = prompt.find(end, start + len(begin))
        if stop < 0:
            return None
        tools = []
        for line in prompt[start + len(begin) : stop].splitlines():
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(value, dict):
                tools.append(value)
        if tools:
            return tools
        start = prompt.find(begin, stop + len(end))
    return None


def properties_of(schema: Mapping) -> dict[str, Any]:
    # Top-level properties, else those of anyOf/oneOf/allOf branches (SGLang's get_schema_properties).
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        return dict(properties)
    merged: dict[str, Any] = {}
    for keyword in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(keyword)
        if isinstance(branches, list):
            for branch in branches:
                if isinstance(branch, Mapping):
                    for key, value in properties_of(branch).items():
                        merged.setdefault(key, value)
    return merged


def tool_parameters(tools: Any, name: str | None) -> Mapping | None:
    """The `parameters` schema of the tool `name` in an OpenAI-style `tools` list, or None."""
    if not isinstance(tools, list) or name is None:
        return None
    for tool in tools:
        if not isinstance(tool, Mapping):
            continue
        function = tool.get("function", tool)
        if isinstance(function, Mapping) and function.get("name") == name:
            schema = function.get("parameters")
            return schema if isinstance(schema, Mapping) else None
    return None

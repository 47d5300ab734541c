"""What each tool call's arguments say: JSON that parses, values of the declared types, no
Python literal where the template writes JSON; one row a call (`CALLS_SCHEMA`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

import orjson
import polars as pl

from audit.model.calls.call_elements import elements_error, elements_literal
from audit.model.calls.call_json import elements_object, parameters_object
from audit.model.calls.call_readers import ToolCall
from audit.model.calls.call_values import (
    parameter_literal,
    parameter_types,
    python_literal,
    string_error,
    tool_parameters,
    value_error,
)
from audit.records.batch import Batch

# One row per call (several per record), in output order.
CALLS_SCHEMA: dict[str, pl.DataType] = {
    "row": pl.UInt32(),
    "start": pl.Int64(),  # token index where the call starts (its first marker)
    "end": pl.Int64(),  # exclusive: just after its last marker
    "head_at": pl.Int64(),  # where the call's name / id starts
    "body_at": pl.Int64(),  # where its arguments start
    "name": pl.String(),
    "call_id": pl.String(),
    "arguments": pl.String(),
    "malformed": pl.String(),  # how the call's text breaks the format's grammar, or null
    "problem_at": pl.Int64(),  # token index where it breaks it (null: at the call's start)
    "arguments_error": pl.String(),  # why the arguments do not read, or null
    "literal": pl.String(),  # an argument written as a Python literal, not JSON (TCL005), or null
    # Parameters written as text or elements, as the JSON object a server's tool parser returns
    # (audit.model.calls.call_json); null for formats whose `arguments` are JSON already.
    "values": pl.String(),
}


class ReadCall(NamedTuple):
    """A call and where it sits in its record's output_ids."""

    row: int
    start: int
    end: int
    head_at: int
    body_at: int
    call: ToolCall
    problem_token: int | None = None  # where `call.problem_at` falls, as a token index


def judge_calls(batch: Batch, read: list[ReadCall]) -> pl.DataFrame:
    """Calls as rows, each with why its arguments do not read (JSON, or the declared types)."""
    columns: dict[str, list] = {name: [] for name in CALLS_SCHEMA}
    fmt = batch.profile.tool_call_spec.format
    named_by_id = fmt.has_call_ids
    typed = {
        item.row for item in read
        if item.call.parameters is not None or item.call.elements is not None or item.call.strings
    }
    declared = _declared_tools(batch, typed)
    for row, start, end, head_at, body_at, call, problem_token in read:
        if not (named_by_id or call.name or call.malformed):
            # Every format names the function it calls; Kimi's name is inside its call id (TCL003).
            call = replace(call, malformed="a call with no function name")
        literal: str | None = None
        values = None
        error: str | None
        if call.arguments_error is not None:
            error = call.arguments_error
        elif call.elements is not None:
            schema = tool_parameters(declared.get(row), call.name)
            error = elements_error(call.elements, schema) if schema is not None else None
            literal = elements_literal(call.elements, schema) if schema is not None and error is None else None
            values = _json_text(elements_object(call.elements, schema))
        elif call.parameters is None:
            error = _json_error(call.arguments)
            if error is not None and (kind := python_literal(call.arguments)) is not None:
                error, literal = None, f"are written as {kind}, not JSON: {call.arguments.strip()[:80]!r}"
            if error is None and call.strings:
                error = _strings_error(call, parameter_types(declared.get(row), call.name))
            if error is None and call.strings:
                values = _written_object(call)
        else:
            types = parameter_types(declared.get(row), call.name)
            error = _parameters_error(call, types)
            literal = None if error is not None else _parameters_literal(call, types, fmt.python_scalars)
            values = _json_text(parameters_object(call.parameters, tool_parameters(declared.get(row), call.name)))
        for name, value in (
            ("row", row), ("start", start), ("end", end), ("head_at", head_at), ("body_at", body_at),
            ("name", call.name), ("call_id", call.call_id), ("arguments", call.arguments),
            ("malformed", call.malformed), ("problem_at", problem_token), ("arguments_error", error),
            ("literal", literal), ("values", values),
        ):
            columns[name].append(value)
    return pl.DataFrame(columns, schema=CALLS_SCHEMA)


def _written_object(call: ToolCall) -> str | None:
    """The arguments of a call whose strings were read apart from its JSON values (DSML, XTML) as
    one JSON object in the order the model wrote them, as the server's parser returns it (a
    later duplicate key wins, as in its dict); None when the JSON values do not read."""
    try:
        parsed = orjson.loads(call.arguments)
    except orjson.JSONDecodeError:
        return None
    strings = dict(call.strings)
    if not isinstance(parsed, dict) or not call.order:
        return None
    merged: dict[str, Any] = {}
    for key in call.order:
        merged[key] = strings[key] if key in strings else parsed.get(key)
    return _json_text(merged)


def _json_text(value: Any) -> str | None:
    try:
        return orjson.dumps(value).decode()
    except (TypeError, orjson.JSONEncodeError):  # a value JSON cannot hold (an integer past 64 bits)
        return None


def _declared_tools(batch: Batch, rows: set[int]) -> dict[int, Any]:
    """The tools each record declares: its own `tools` (or `--prompts`), else, where the profile
    says how the template writes them (`prompt_tools`), the schemas in its prompt, decoded in
    one batch for the records that need it."""
    declared = {row: (batch.source_prompt(row) or {}).get("tools") for row in rows}
    marks = batch.profile.tool_call_spec.prompt_tools
    missing = sorted(row for row, tools in declared.items() if tools is None)
    if marks is None or not missing:
        return declared
    prompts = batch.records["input_ids"].gather(missing).to_list()
    texts = batch.tokenizer.decode_batch([ids or [] for ids in prompts])
    for row, text in zip(missing, texts, strict=True):
        declared[row] = batch.profile.tool_call_spec.format.read_tools(text, *marks)
    return declared


def _parameters_error(
    call: ToolCall, types: dict[str, str | tuple[str, ...] | None] | None
) -> str | None:
    if not types:
        return None  # the tool is not declared: what its values should be is unknown
    for key, value in call.parameters or ():
        problem = value_error(value, types.get(key))
        if problem:
            return f"have parameter {key!r} {problem}: {value[:60]!r}"
    return None


def _strings_error(call: ToolCall, types: dict[str, str | tuple[str, ...] | None] | None) -> str | None:
    for key, value in call.strings:
        problem = string_error((types or {}).get(key))
        if problem:
            return f"have parameter {key!r} {problem}: {value[:60]!r}"
    return None


def _parameters_literal(
    call: ToolCall, types: dict[str, str | tuple[str, ...] | None] | None, python_scalars: bool
) -> str | None:
    for key, value in call.parameters or ():
        kind = parameter_literal(value, (types or {}).get(key), python_scalars=python_scalars)
        if kind is not None:
            return f"have parameter {key!r} written as {kind}, not JSON: {value.strip()[:60]!r}"
    return None


def _json_error(text: str) -> str | None:
    try:
        orjson.loads(text.strip())
    except orjson.JSONDecodeError as exc:
        return f"are not valid JSON ({exc}): {text[:80]!r}"
    return None

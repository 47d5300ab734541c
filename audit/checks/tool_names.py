"""Tool names: every call the model makes is to a tool its request declared."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import polars as pl

from audit.checks.base import RecordRule, Severity, empty_findings, findings_frame
from audit.records.batch import Batch
from audit.records.call_view import tool_call_view
from audit.records.channels import harmony_messages

# gpt-oss addresses a function call `to=functions.NAME`; `browser.*` and `python` are its
# built-in tools, never declared in a request's `tools`.
_FUNCTION_RECIPIENT = "functions."


class ToolNotDeclared(RecordRule):
    """A call to a tool the record's request never declared (a warning).

    What it checks:
        Where the record carries the tools its request declared (its own `tools`, or the
        `--prompts` file's), every tool call in the answer names one of them: the function
        name of a tool-call block, Kimi's name inside a canonical call id
        (`functions.NAME:IDX`), gpt-oss's `to=functions.NAME`. A record without `tools`, a
        call whose text is malformed (TCL001's), a Kimi id of another form (TCL003's) and
        gpt-oss's built-in tools (`browser.*`, `python`) are not judged. A warning: models
        do call tools they were not given (a name from their training, a tool of an earlier
        turn, a misspelling), and that is their real output, to count rather than reject.

    Why it matters:
        SGLang's detectors drop such a call or forward it by policy, so a serving stack
        rarely shows it; in training data it teaches the drafter calls to names the prompt
        never offered. A high rate points at prompts rendered without the tools the
        generation used (a `tools` list lost between the prompt file and the template),
        which TPL001 catches only when the record carries its messages.

    Example:
        tools: [{"type": "function", "function": {"name": "get_weather", ...}}]
        output: <tool_call>
        {"name": "get_time", "arguments": {"city": "Paris"}}
        </tool_call>

    Fix:
        Check that the prompts were rendered with the same `tools` the records carry; make
        it an error (`[rules.TCL006] severity = "error"`) to keep such calls out, or leave it
        a warning to count them.
    """

    code = "TCL006"
    name = "tool-not-declared"
    severity = Severity.WARNING
    reads_source = True

    def applies(self, batch: Batch) -> bool:
        profile = batch.profile
        if profile.channel_markers:
            return True
        return profile.tool_calls is not None and bool(profile.tool_markers or profile.tool_text_markers)

    def find(self, batch: Batch) -> pl.DataFrame:
        calls = _called(batch)
        if calls.is_empty():
            return empty_findings()
        rows: list[int] = []
        positions: list[int | None] = []
        messages: list[str] = []
        for row, position, name in calls.iter_rows():
            if rows and rows[-1] == row:
                continue  # one finding per record
            declared = _declared_names((batch.source_prompt(row) or {}).get("tools"))
            if declared is None or name in declared:
                continue
            rows.append(row)
            positions.append(position)
            offered = ", ".join(sorted(declared)[:5]) or "none"
            messages.append(f"call to {name!r}, a tool the request does not declare (declared: {offered})")
        return findings_frame(rows, positions, messages)


def _called(batch: Batch) -> pl.DataFrame:
    """Every judged call's record, position and function name, in output order."""
    schema = {"row": pl.UInt32, "position": pl.Int64, "name": pl.String}
    if batch.profile.channel_markers:
        messages = harmony_messages(batch)
        calls = messages.filter(
            (pl.col("terminator") == "call") & pl.col("recipient").str.starts_with(_FUNCTION_RECIPIENT)
        )
        return calls.select(
            pl.col("row").cast(pl.UInt32),
            pl.col("channel_at").alias("position"),
            pl.col("recipient").str.strip_prefix(_FUNCTION_RECIPIENT).alias("name"),
        ).cast(schema)  # type: ignore[arg-type]
    spec = batch.profile.tool_call_spec
    calls = tool_call_view(batch).calls.filter(pl.col("malformed").is_null() & pl.col("name").is_not_null())
    if spec.format.has_call_ids:
        pattern = re.compile(spec.call_id_pattern or r"^$")
        canonical = [bool(cid and pattern.match(cid.strip())) for cid in calls["call_id"].to_list()]
        calls = calls.filter(pl.Series(canonical, dtype=pl.Boolean))
    return calls.select("row", pl.col("head_at").alias("position"), pl.col("name").str.strip_chars()).cast(schema)  # type: ignore[arg-type]


def _declared_names(tools: Any) -> set[str] | None:
    """The names of the functions a request declares (OpenAI's `{"type": "function",
    "function": {"name": ...}}` or a bare `{"name": ...}`), or None when it carries no list."""
    if not isinstance(tools, list):
        return None
    return {name for name in _names(tools) if name}


def _names(tools: Iterable[Any]) -> Iterable[str]:
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        name = function.get("name") if isinstance(function, dict) else tool.get("name")
        if isinstance(name, str):
            yield name.strip()

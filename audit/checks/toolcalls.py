"""Tool calls: markers kept as their ids, in grammar order, with readable calls in the answer."""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from audit.checks.base import Severity, ToolCallRule, findings_frame
from audit.model.calls.call_formats import ROLE_LETTERS
from audit.records.batch import Batch
from audit.records.call_view import tool_call_view
from audit.records.expressions import truncated

_ROLE_OF_LETTER = {letter: role for role, letter in ROLE_LETTERS.items()}


class ToolMarkerGrammar(ToolCallRule):
    """Tool-call markers unbalanced or out of the family's grammar order, or a call's text malformed.

    What it checks:
        In the answer (after `</think>`), the tool-call marker ids read in order follow the
        profile's grammar. Kimi: section begin, then per call: call begin, call id, argument
        begin, arguments, call end; then section end. Every call closed, every section closed.
        An output cut by the token limit or an abort may stop inside a call: what it has must
        be in order, and the unfinished call's text is not judged (the cut is TRM001's or
        TRM003's).
        Where part of a call's structure is text (Qwen3.5/3.6's `<function=NAME>` and
        `<parameter=K>` tags, DeepSeek's DSML tags, MiniMax-M3's `<invoke name="NAME">`), that
        text follows the format too, and every call names its function (Kimi's name is in its
        call id, TCL003's). Whitespace between markers, where the template writes a newline or
        nothing, is drift the serving parsers ignore (docs/profiles.md, what the model emits).
        Markers inside the reasoning are text the model thinks with, not calls: not judged.

    Why it matters:
        A marker dropped or moved means the token stream is not one the model produced: a
        tool-call parser rewrote it, or a post-processing step cut part of it. The drafter
        would learn a grammar the target never speaks.

    Example:
        <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
        <|tool_call_argument_begin|>{"city": "Paris"}<|tool_calls_section_end|>   (no call end)

    Fix:
        Save `output_ids` from `/generate` without a tool-call parser; never rebuild tool
        calls from parsed JSON.
    """

    code = "TCL001"
    name = "tool-marker-grammar"

    def find(self, batch: Batch) -> pl.DataFrame:
        view = tool_call_view(batch)
        expected = batch.profile.tool_call_spec.format.description
        # An output cut by the token limit or an abort may stop inside a call: the markers it
        # has must be a prefix of the grammar (the cut itself is TRM001's or TRM003's).
        cut = batch.records.select(truncated()).to_series().to_numpy()
        out_of_order = np.flatnonzero(~view.grammar_ok.to_numpy() & ~(cut & view.prefix_ok.to_numpy()))
        rows: list[int] = []
        positions: list[int | None] = []
        messages: list[str] = []
        if len(out_of_order):
            for row, letters, empty_head, at in zip(
                out_of_order.tolist(),
                view.letters.gather(out_of_order).to_list(),
                view.empty_head.gather(out_of_order).to_list(),
                view.first_marker.gather(out_of_order).to_list(),
                strict=True,
            ):
                rows.append(row)
                positions.append(at)
                messages.append(
                    "a call begins with no id or name before the next marker"
                    if empty_head
                    else "tool-call markers out of order: "
                    + " ".join(_ROLE_OF_LETTER[letter].replace("_", "-") for letter in letters)
                    + f"; expected {expected}"
                )
        # A call's text cut by the limit is unfinished, not malformed: the cut is TRM001's.
        cut_rows = pl.Series("row", np.flatnonzero(cut), dtype=pl.UInt32)
        if view.calls["malformed"].null_count() < view.calls.height:
            malformed = (
                view.calls.filter(pl.col("malformed").is_not_null() & ~pl.col("row").is_in(cut_rows.implode()))
                .group_by("row", maintain_order=True)
                .first()
            )
            at = pl.coalesce("problem_at", "start")
            for row, start, problem in malformed.select("row", at, "malformed").iter_rows():
                rows.append(row)
                positions.append(start)
                messages.append(f"tool call text out of the format ({problem}); expected {expected}")
        stray = view.stray
        if stray.height:
            stray = stray.filter(~pl.col("row").is_in(pl.Series(rows, dtype=pl.UInt32).append(cut_rows).implode()))
        for row, start, text in stray.iter_rows():
            rows.append(row)
            positions.append(start)
            messages.append(f"text between tool-call markers where the template writes none: {text.strip()[:40]!r}; expected {expected}")
        return findings_frame(rows, positions, messages)


class ToolArgumentsInvalidJson(ToolCallRule):
    """Tool-call arguments that do not parse, as JSON or as the tool's declared parameter types.

    What it checks:
        In every well-formed tool call of the answer, the arguments are one JSON value (fenced
        JSON for DeepSeek-R1). Formats that write each parameter as text (Qwen3.5/3.6
        `<parameter=K>`, GLM `<arg_value>`, DSML `string="true"`) are judged as SGLang's
        detectors convert them, by the type the record's `tools` declare for the parameter
        (from the line, or `--prompts`): a `string` is any text (`[WIP] fix` is fine), an
        integer, number, boolean (`true`/`false` in any case), object or array must read as
        one (GLM's escaped JSON once unescaped, as SGLang reads it; never with a trailing
        comma, `{"a": 1,}`, which no `tojson` writes), and an undeclared parameter never errs.

    Why it matters:
        The target model writes valid arguments nearly always; broken ones are the trace
        of truncation inside a call or of a parser that re-serialised the arguments and cut
        them. Training on them teaches the drafter malformed calls.

    Example:
        <|tool_call_argument_begin|>{"city": "Paris"<|tool_call_end|>

    Fix:
        Save raw `output_ids`; check the record's finish reason (a length stop inside a call
        is a truncation to drop, not to repair).
    """

    code = "TCL002"
    name = "tool-arguments-invalid-json"

    def find(self, batch: Batch) -> pl.DataFrame:
        calls = tool_call_view(batch).calls
        bad = calls.filter(pl.col("arguments_error").is_not_null() & pl.col("malformed").is_null())
        first = bad.group_by("row", maintain_order=True).first()
        return findings_frame(
            first["row"].to_list(),
            first["body_at"].to_list(),
            [
                f"arguments of call {name or '?'} {error}"
                for name, error in first.select("name", "arguments_error").iter_rows()
            ],
        )


class ToolArgumentPythonLiteral(ToolCallRule):
    """A tool-call argument written as a Python literal (`{'a': 1}`, `True`, `None`), not as JSON.

    What it checks:
        In every well-formed call of the answer, an object, array, boolean or null argument is
        written as the family's template writes it: JSON (`tojson`), never Python's `repr`
        (single quotes, `True`/`False`/`None`, tuples). JSON formats (Kimi, DeepSeek, Qwen3,
        DSML's `string="false"` values) are judged whole; parameters written as text (GLM's
        `<arg_value>`, Qwen3.5/3.6's `<parameter=K>`) by the type the record's tools declare
        for them, so a string parameter holding `{'a': 1}` is just text; MiniMax-M3's
        boolean elements the same way. Qwen3.5/3.6's template writes a boolean or null with
        `| string`, so there `True` and `None` are its own form and pass. Arguments cut short
        or with a trailing comma are not a Python literal: they stay TCL002's.

    Why it matters:
        The templates write every object and array with `tojson`, and the model was trained
        on those renderings; SGLang's detectors accept a Python literal only through their
        `literal_eval` fallback. What writes `{'Accept': 'json'}` is nearly always a pipeline
        that parsed the call and put the value back with `str()`: the ids are then a
        re-rendering, not what the model emitted, and the drafter learns a form the target
        does not produce. An error by default, for that reason; a team whose model does emit
        Python literals for real (seen in serving logs, not only in the data) can make it a
        warning: `[rules.TCL005] severity = "warning"`.

    Example:
        <tool_call>fetch<arg_key>headers</arg_key><arg_value>{'Accept': 'json'}</arg_value></tool_call>

    Fix:
        Save raw `output_ids` from `/generate`; never rebuild a call's text from parsed
        arguments. Where arguments must be written again, write them with `json.dumps`.
    """

    code = "TCL005"
    name = "tool-argument-python-literal"

    def find(self, batch: Batch) -> pl.DataFrame:
        calls = tool_call_view(batch).calls
        flagged = calls.filter(
            pl.col("literal").is_not_null() & pl.col("malformed").is_null() & pl.col("arguments_error").is_null()
        )
        first = flagged.group_by("row", maintain_order=True).first()
        return findings_frame(
            first["row"].to_list(),
            first["body_at"].to_list(),
            [
                f"arguments of call {name or '?'} {literal}; the template writes JSON, and the serving "
                "parser reads this only through its literal_eval fallback"
                for name, literal in first.select("name", "literal").iter_rows()
            ],
        )


class ToolCallIdMalformed(ToolCallRule):
    """A tool-call id not of the family's canonical form, e.g. Kimi's `functions.NAME:IDX` (a warning).

    What it checks:
        For families whose calls carry an id (Kimi), each call's id matches the profile's
        `call_id_pattern`. A warning by default: the id the model writes follows the ids it
        was shown, so it is not always the canonical one.

    Why it matters:
        Kimi's serving stack routes tool results by these ids, and the drafter learns the ids
        the data holds. An id without its index or prefix can be a parser's rewrite
        (`functions.get_weather` from an OpenAI-style `tool_calls` list), but real Kimi outputs
        carry other forms too: `get_weather:0`, and `call_...` when the conversation history
        used OpenAI-style ids (the model copies them; vLLM's Kimi-K2 parser learned to accept
        `call_...` ids, vllm-project/vllm#32146, and SGLang's kimik2_detector reads
        `(functions.)?NAME:IDX`). So the rate is reported, not gated: make it an error in a
        rule set (`[rules.TCL003] severity = "error"`) for data rendered with canonical ids,
        or widen `call_id_pattern` in a profile for the forms your data may hold. A call with
        no function name at all is TCL001's.

    Example:
        <|tool_call_begin|>get_weather<|tool_call_argument_begin|>{...}<|tool_call_end|>

    Fix:
        Save raw `output_ids`; do not re-render tool calls from an OpenAI-style
        `tool_calls` list; give the history's calls ids of the canonical form.
    """

    code = "TCL003"
    name = "tool-call-id-malformed"
    severity = Severity.WARNING

    def applies(self, batch: Batch) -> bool:
        if not super().applies(batch):
            return False
        spec = batch.profile.tool_call_spec
        return spec.format.has_call_ids and bool(spec.call_id_pattern)

    def find(self, batch: Batch) -> pl.DataFrame:
        spec = batch.profile.tool_call_spec
        calls = tool_call_view(batch).calls.filter(pl.col("malformed").is_null())
        pattern = re.compile(spec.call_id_pattern or "")  # set: the rule applies only then
        bad_mask = [not (cid and pattern.match(cid.strip())) for cid in calls["call_id"].to_list()]
        first = calls.filter(pl.Series(bad_mask, dtype=pl.Boolean)).group_by("row", maintain_order=True).first()
        return findings_frame(
            first["row"].to_list(),
            first["head_at"].to_list(),
            [f"tool call id {value!r} does not match {spec.call_id_pattern}" for value in first["call_id"].to_list()],
        )

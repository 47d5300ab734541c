"""The conversation a trainer is given for each record: its `messages` and the output as a reply.

Teams that feed a trainer text build it from what they saved: the record's `messages` and
`tools`, and the output as the assistant message an OpenAI-compatible server returns when it
runs the family's reasoning and tool-call parsers (as SGLang's do):

* `reasoning_content`: the reasoning (`audit.records.response`) as the model wrote it between
  its markers, absent when the output has none;
* `content`: the answer without the stop token, leading whitespace removed (the space between
  `</think>` and the answer: servers and templates both drop it); before tool calls, the text
  before the first call, stripped as the tool parsers strip it, without the calls' markup;
  "" when the reasoning never ended; in XTML (Kimi-K3), what the response channel holds, as
  SGLang's detector takes it out (`strip_response_wrappers`, nothing stripped);
* `tool_calls`: `[{id, type: "function", function: {name, arguments: JSON string}}]` from the
  tool-call view (`audit.records.call_view`), the call's own id where the format writes one
  (Kimi), else `call_N`; arguments as written for JSON formats, parameters and elements
  converted as the server's parser converts them (`audit.model.calls.call_json`).

Otherwise the texts are kept as the model wrote them: SGLang's parsers also strip an answer's
trailing whitespace, which the view keeps, so that a record is never blamed for what a server
alone would change (the templates strip what they re-write themselves). An answer
whose calls do not read (markers out of grammar, a malformed call) comes back as the server
leaves text it cannot parse: the whole answer as `content`, no `tool_calls`; a Qwen3 call that
is not JSON as the trainer's `reply_shape` says (vLLM's: the same; SGLang's: the text before
the calls and the calls that parse). Everything is decoded in one batched call per block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from audit.model.tokens.flat_ids import FlatIds
from audit.records.batch import Batch
from audit.records.call_view import tool_call_view
from audit.records.response import response_bounds

# Formats whose call is one JSON object, name and arguments together (Qwen3's
# `{"name": ..., "arguments": {...}}`): a tool parser that cannot parse it sees no call at all
# (text that is not JSON, a Python literal included); where the arguments are text of their own
# (Kimi, DeepSeek), the parser hands them on as written, and it is the trainer that must read
# them. What the reply then is depends on the server (`Trainer.reply_shape`): vLLM's hermes parser
# (vllm/tool_parsers/hermes_tool_parser.py `extract_tool_calls`) leaves the whole answer as
# content, no call; SGLang's (0.5.23 function_call/qwen25_detector.py `detect_and_parse`) keeps
# the text before the first call, stripped, as content and the calls that parse, and drops the
# others.
_WHOLE_JSON_CALLS = {"qwen3"}


@dataclass
class TrainerInput:
    """One record as a trainer is given it, and where its output's parts sit in `output_ids`."""

    messages: list[Any]  # the record's messages, as saved
    tools: Any
    reply: dict[str, Any]  # the output as the server's assistant message
    reasoning: tuple[int, int] | None = None  # [start, end) of the reasoning in output_ids
    calls: list[tuple[int, str]] = field(default_factory=list)  # (start in output_ids, name) per call

    @property
    def conversation(self) -> list[Any]:
        return [*self.messages, self.reply]


@dataclass(frozen=True)
class NotViewed:
    """A record the view cannot give a trainer (no messages; ids it cannot decode), and why."""

    reason: str


def trainer_inputs(batch: Batch) -> list[TrainerInput | NotViewed]:
    """Every record of the batch as a trainer is given it (see the module docs), once per batch."""
    return batch.shared(_inputs)


def _inputs(batch: Batch) -> list[TrainerInput | NotViewed]:
    found: list[TrainerInput | NotViewed | None] = [None] * batch.height
    prompts: dict[int, dict[str, Any]] = {}
    has_source = batch.context.prompts is not None or batch.records["source"].null_count() < batch.height
    readable = _readable_ids(batch)
    for row in range(batch.height):
        prompt = batch.source_prompt(row) if has_source else None
        messages = prompt.get("messages") if prompt else None
        if messages is None:
            found[row] = NotViewed("the record carries no `messages`: a trainer fed text has nothing to build")
        elif not isinstance(messages, list):
            found[row] = NotViewed(f"its `messages` is a {type(messages).__name__}, not a list of messages")
        elif not readable[row]:
            found[row] = NotViewed("its ids are missing or outside the vocabulary (the INT rules name them)")
        else:
            prompts[row] = prompt or {}
    rows = sorted(prompts)
    if not rows:
        return [item or NotViewed("not viewed") for item in found]
    bounds = response_bounds(batch)
    frame = pl.concat([batch.records.select(pl.col("output_ids").list.len().alias("length")), bounds], how="horizontal")
    calls: dict[int, list[dict[str, Any]]] = {}
    if batch.profile.tool_calls is not None:
        view = tool_call_view(batch)
        frame = frame.with_columns(first_marker=view.first_marker)
        whole_json = batch.profile.tool_calls.format.name in _WHOLE_JSON_CALLS
        trainer = batch.context.trainer
        drop_unparsed = whole_json and trainer is not None and trainer.reply_shape == "sglang"
        calls = _readable_calls(view.calls, view.grammar_ok, whole_json, drop_unparsed)
    else:
        frame = frame.with_columns(first_marker=pl.lit(None, dtype=pl.Int64))
    xtml = batch.profile.profile.xtml
    spans = _spans(frame[rows])
    output = batch.records["output_ids"].gather(rows)
    flat = FlatIds.from_series(output)
    base = flat.offsets[:-1]
    starts = np.array([s for r in spans for s in (r["reasoning"][0], r["answer"][0], r["raw"][0])], dtype=np.int64)
    ends = np.array([e for r in spans for e in (r["reasoning"][1], r["answer"][1], r["raw"][1])], dtype=np.int64)
    texts = batch.tokenizer.decode_flat(FlatIds.slices(flat.values, np.repeat(base, 3) + starts, np.repeat(base, 3) + ends))
    for k, row in enumerate(rows):
        reasoning_text, answer_text, raw_text = texts[3 * k : 3 * k + 3]
        span = spans[k]
        reply: dict[str, Any] = {"role": "assistant"}
        if span["has_reasoning"]:
            reply["reasoning_content"] = reasoning_text
        row_calls = calls.get(row)
        if row_calls is not None:  # calls read (SGLang's shape: possibly none of them kept)
            reply["content"] = answer_text.strip()
            if row_calls:
                reply["tool_calls"] = [_call_message(call, i) for i, call in enumerate(row_calls)]
        else:
            reply["content"] = raw_text.lstrip() if span["closed"] or not span["has_reasoning"] else ""
        if xtml is not None and (span["closed"] or not span["has_reasoning"]):
            reply["content"] = _xtml_reply_text(answer_text if row_calls is not None else raw_text, xtml.markers)
        prompt = prompts[row]
        found[row] = TrainerInput(
            messages=prompt["messages"],
            tools=prompt.get("tools"),
            reply=reply,
            reasoning=span["reasoning"] if span["has_reasoning"] else None,
            calls=[(int(call["start"]), str(call["name"] or "")) for call in row_calls or []],
        )
    return [item or NotViewed("not viewed") for item in found]


def _readable_calls(
    calls: pl.DataFrame, grammar_ok: pl.Series, whole_json: bool, drop_unparsed: bool
) -> dict[int, list[dict[str, Any]]]:
    """Per record, its calls, when every one of them reads (in grammar, well formed, named;
    `whole_json`: the format writes each call as one JSON object, which must be JSON, not a
    Python literal). `drop_unparsed` (SGLang's shape): a whole-JSON call that does not parse is
    left out and the others kept, possibly none."""
    by_row: dict[int, list[dict[str, Any]]] = {}
    for call in calls.iter_rows(named=True):
        by_row.setdefault(call["row"], []).append(call)

    def parses(item: dict[str, Any]) -> bool:
        return not whole_json or (item["arguments_error"] is None and item["literal"] is None and bool(item["name"]))

    readable: dict[int, list[dict[str, Any]]] = {}
    for row, items in by_row.items():
        if not grammar_ok[row] or any(item["malformed"] is not None for item in items):
            continue
        if drop_unparsed:
            readable[row] = [item for item in items if parses(item)]
        elif all(item["name"] and parses(item) for item in items):
            readable[row] = items
    return readable


def _readable_ids(batch: Batch) -> np.ndarray:
    """Per record: are both id lists present, and every id one the tokenizer has?"""
    present = batch.output_present & batch.records["input_ids"].is_not_null().to_numpy()
    prompts = batch.input_flat
    unknown = np.concatenate([[0], np.cumsum(~batch.tokenizer.knows(prompts.values))])
    prompt_ok = unknown[prompts.offsets[1:]] == unknown[prompts.offsets[:-1]]
    return present & prompt_ok & batch.decodable.to_numpy()


def _spans(frame: pl.DataFrame) -> list[dict[str, Any]]:
    """Per viewed record: the reasoning, the answer before its calls, and the whole answer."""
    spans = []
    for row in frame.iter_rows(named=True):
        length, end = row["length"], row["answer_end"] if row["answer_end"] is not None else row["length"]
        has_reasoning = row["reasoning_start"] is not None
        r_start = row["reasoning_start"] if has_reasoning else 0
        r_end = row["reasoning_end"] if row["reasoning_end"] is not None else r_start
        a_start = row["answer_start"] if row["answer_start"] is not None else length
        first_marker = row["first_marker"]
        before_calls = first_marker if first_marker is not None and first_marker >= a_start else end
        spans.append({
            "has_reasoning": has_reasoning,
            "closed": row["answer_start"] is not None,
            "reasoning": (int(r_start), int(max(r_end, r_start))),
            "answer": (int(a_start), int(max(min(before_calls, end), a_start))),
            "raw": (int(a_start), int(max(end, a_start))),
        })
    return spans


def _xtml_reply_text(text: str, markers: dict[str, str]) -> str:
    """An XTML answer's text as SGLang's Kimi-K3 detector returns it (`kimik3_format.py`
    `strip_response_wrappers`): what the response channel holds (to the text's end when it is
    not closed), else the text without the channel's close; the message's close taken out;
    nothing stripped."""
    opened, closed = markers["answer_open"], markers["answer_close"]
    at = text.find(opened)
    if at != -1:
        end = text.find(closed, at + len(opened))
        text = text[at + len(opened) :] if end == -1 else text[at + len(opened) : end]
    else:
        text = text.replace(closed, "")
    return text.replace(markers["message_close"], "")


def _call_message(call: dict[str, Any], index: int) -> dict[str, Any]:
    arguments = call["values"] if call["values"] is not None else call["arguments"].strip()
    return {
        "id": call["call_id"] or f"call_{index}",
        "type": "function",
        "function": {"name": call["name"], "arguments": arguments},
    }

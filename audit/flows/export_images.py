"""The rows of records that send images, as speculators 0.9.0 trains on them: the prompt with each
image pad expanded as the server expanded it, and the conversation with its images beside it.

speculators sends a row to vLLM as its `messages` when they hold content parts
(`train/data.py::build_client_item`); vLLM renders them with the reply's turn closed
(`add_generation_prompt=False`, `data_generation/vllm_client.py::generate_hidden_states`), expands
each image, and `extract_output` drops the row unless the ids vLLM returns are the row's. So an
image row carries:

    input_ids   the prompt with each placeholder's one pad repeated N times, N the image's tokens
                (`audit.model.families.vision.server_counts`, the count the image rules check
                `meta_info.prompt_tokens` with: of its two ways, the one that gives
                `prompt_tokens`, the file's size when the record has none), then the output
    loss_mask   0 over the prompt, every image span with it
    messages    the record's messages, each content a list of parts as speculators stores them
                (`preprocessing.py::_adapt_part_for_vllm`): `{"type": "text", "text"}`, and for
                the k-th image part `{"type": "image_url", "image_url": {"url"}}` naming the k-th
                `image_data` entry: a path as an absolute `file://` URL (as speculators writes
                a path), a URL or `data:` URI as it is, bare base64 as a `data:` URI; then the
                reply as the trainer view builds it (`audit.records.trainer_input`: the answer
                as content, the reasoning as `reasoning_content`, the calls as `tool_calls`
                with JSON arguments); each message with the fields speculators keeps

A row whose images cannot be counted (an image not read, placeholders that do not match the
images, counts that give no `prompt_tokens`) is left as the prompt was sent, with no messages,
and counted. Every other row gets an empty `messages` list, which speculators sends as ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl

from audit.flows.export_rows import SampleBlock
from audit.model.families.vision import ResolvedVision, server_counts
from audit.model.rendering.chat_rendering import chat_renderer
from audit.model.trainers.speculators import vllm_messages
from audit.records.batch import AuditContext, Batch
from audit.records.images import ImageSource, message_images, read_image, vision_layout
from audit.records.inline_images import RAW_BASE64
from audit.records.trainer_input import TrainerInput, trainer_inputs

_PART = pl.Struct({"type": pl.String(), "text": pl.String(), "image_url": pl.Struct({"url": pl.String()})})
_CALL = pl.Struct(
    {"id": pl.String(), "type": pl.String(), "function": pl.Struct({"name": pl.String(), "arguments": pl.String()})}
)
# The fields speculators' `_normalize_conversation` keeps: role, content, tool calls (arguments as
# the JSON text an OpenAI message holds: vLLM decodes it before rendering), the tool-call id, and
# the reasoning (as `reasoning_content`).
MESSAGES_DTYPE = pl.List(
    pl.Struct(
        {
            "role": pl.String(),
            "content": pl.List(_PART),
            "reasoning_content": pl.String(),
            "tool_calls": pl.List(_CALL),
            "tool_call_id": pl.String(),
        }
    )
)

# datasets' feature for the column as the Arrow IPC stream holds it (large lists and strings).
_TEXT = {"dtype": "large_string", "_type": "Value"}
MESSAGES_FEATURE = {
    "feature": {
        "role": _TEXT,
        "content": {"feature": {"type": _TEXT, "text": _TEXT, "image_url": {"url": _TEXT}}, "_type": "LargeList"},
        "reasoning_content": _TEXT,
        "tool_calls": {
            "feature": {"id": _TEXT, "type": _TEXT, "function": {"name": _TEXT, "arguments": _TEXT}},
            "_type": "LargeList",
        },
        "tool_call_id": _TEXT,
    },
    "_type": "LargeList",
}


@dataclass
class ImageTally:
    """What became of the rows that send images."""

    expanded: int = 0  # written with expanded ids and messages
    unexpanded: int = 0  # left as sent: their images could not be counted
    closed: int = 0  # of the expanded, rows ended as the template closes the turn (see `with_images`)
    rerendered: int = 0  # of the expanded, rows whose messages the template renders to other ids
    first_rerendered: int | None = None  # the line of the first


def with_images(block: SampleBlock, records: pl.DataFrame, context: AuditContext, tally: ImageTally) -> SampleBlock:
    """The block (built from `records`, row for row, before any length policy) with each image
    row's pads expanded and its messages; every row gets a `messages` entry. Each image row's
    messages are rendered as vLLM renders them for speculators (`rendered_ids`). Where the render
    ends the turn otherwise than the record (it goes on with the text the template closes the
    turn with, `<|im_end|>`'s newline; it leaves out a stop id the model wrote and the template
    does not, GLM's `<|user|>`), the row ends as the render does, what the record lacks untrained,
    so that the row is the ids vLLM returns; where the render differs anywhere else, speculators
    will drop the row, and the tally counts it."""
    vision = context.profile.vision
    messages: list[list[dict[str, Any]]] = [[] for _ in range(block.rows)]
    repeats = np.ones(len(block.values), dtype=np.int64)
    ends_as: dict[int, tuple[int, np.ndarray]] = {}  # row -> (stop ids left out, render's text after)
    if vision is not None and "image_data" in records.columns:
        batch = Batch(records, context)
        prompt_lengths = records["input_ids"].list.len().to_numpy()
        for row in np.flatnonzero(records["image_data"].is_not_null().to_numpy()).tolist():
            start = int(block.offsets[row])
            prompt = block.values[start : start + int(prompt_lengths[row])]
            counts = _image_counts(prompt, records["image_data"][row].to_list(), records["prompt_tokens"][row],
                                   vision, context.images)
            conversation = _conversation(batch, row, records["image_data"][row].to_list(), context.images)
            if counts is None or conversation is None:
                tally.unexpanded += 1
                continue
            pads = start + np.flatnonzero(np.isin(prompt, vision.pads))
            repeats[pads] = counts
            messages[row] = conversation
            tally.expanded += 1
        rows = [row for row, conversation in enumerate(messages) if conversation]
        stops = np.asarray([*context.profile.end_of_turn, *context.profile.eos], dtype=np.int64)
        for row, ids in zip(rows, rendered_ids([messages[row] for row in rows], context), strict=True):
            sent = block.values[int(block.offsets[row]) : int(block.offsets[row + 1])].astype(np.int64)
            same = _common_prefix(ids, sent) if ids is not None else -1
            if ids is not None and same == len(sent) == len(ids):
                continue
            if ids is not None and np.isin(sent[same:], stops).all():  # only the turn's end differs
                ends_as[row] = (len(sent) - same, ids[same:])
                tally.closed += 1
            else:
                tally.rerendered += 1
                if tally.first_rerendered is None:
                    tally.first_rerendered = int(block.lines[row])
    values, mask = np.repeat(block.values, repeats), np.repeat(block.mask, repeats)  # the prompt's 0 over each pad
    ends = np.zeros(len(repeats) + 1, dtype=np.int64)
    np.cumsum(repeats, out=ends[1:])
    offsets = ends[block.offsets]
    if ends_as:  # each row ended as its render ends, what the record lacks untrained
        pieces_v: list[np.ndarray] = []
        pieces_m: list[np.ndarray] = []
        lengths = np.diff(offsets)
        for row in range(block.rows):
            cut, after = ends_as.get(row, (0, np.zeros(0, dtype=np.int64)))
            pieces_v += [values[offsets[row] : offsets[row + 1] - cut], after.astype(values.dtype)]
            pieces_m += [mask[offsets[row] : offsets[row + 1] - cut], np.zeros(len(after), dtype=mask.dtype)]
            lengths[row] += len(after) - cut
        values, mask = np.concatenate(pieces_v), np.concatenate(pieces_m)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return SampleBlock(
        block.record_ids,
        block.lines,
        values,
        mask,
        offsets,
        pl.Series("messages", messages, dtype=MESSAGES_DTYPE),
    )


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def rendered_ids(conversations: list[list[dict[str, Any]]], context: AuditContext) -> list[np.ndarray | None]:
    """Each conversation as vLLM renders a speculators multimodal row (`vllm_client.py`: a chat
    request, `add_generation_prompt=False`, the final turn closed, no tools, no template
    keywords): the messages as vLLM parses them (`audit.model.trainers.speculators.vllm_messages`,
    each image part an `{"type": "image"}` the template writes one placeholder for), the text
    encoded whole, markers recognised. None where the template
    refuses the conversation (speculators drops the row then too)."""
    render = chat_renderer(context.tokenizer, context.profile.prompt_renderer)
    texts: list[str | None] = []
    for conversation in conversations:
        try:
            texts.append(str(render(vllm_messages(conversation, images=True), None, add_generation_prompt=False)))
        except Exception:  # noqa: BLE001 - a template's own error: the server refuses the request
            texts.append(None)
    encoded = iter(context.tokenizer.encode_batch([text for text in texts if text is not None]))
    return [None if text is None else np.asarray(next(encoded), dtype=np.int64) for text in texts]


def _image_counts(prompt: np.ndarray, entries: list[str], prompt_tokens: int | None,
                  vision: ResolvedVision, images: ImageSource) -> list[int] | None:
    """N per placeholder, in order: the way of counting that gives `prompt_tokens` (the file's
    size first), or the file's size when the record has none; None when they cannot be known."""
    layout = vision_layout(prompt, vision)
    if (layout.placeholders != len(entries) or layout.pads != len(entries) or layout.expanded_at is not None
            or layout.unbalanced is not None):
        return None
    ways: list[list[int | None]] = [[], []]
    for entry in entries:
        read = read_image(entry, images)
        counts = server_counts(*read.size, vision.settings) if read.size is not None else None
        if counts is None:
            return None
        ways[0].append(counts[0])
        ways[1].append(counts[1])
    base = len(prompt) - len(entries)
    for way in ways:
        if all(n is not None for n in way):
            known = [n for n in way if n is not None]
            if prompt_tokens is None or base + sum(known) == prompt_tokens:
                return known
    return None


def _conversation(batch: Batch, row: int, entries: list[str], images: ImageSource) -> list[dict[str, Any]] | None:
    """The record's messages as speculators stores a multimodal row's, then its reply as the
    trainer view gives it (`audit.records.trainer_input`: the server's assistant message, its
    reasoning, answer and calls); None when the record has no messages, their image parts are
    not its images, or the view cannot give the reply."""
    prompt = batch.source_prompt(row)
    parts = message_images(prompt)
    if prompt is None or parts is None or len(parts) != len(entries):
        return None
    reply = trainer_inputs(batch)[row]
    if not isinstance(reply, TrainerInput):
        return None
    urls = iter(image_url(entry, images) for entry in entries)
    conversation = []
    for message in [*prompt["messages"], reply.reply]:
        if not isinstance(message, dict):
            return None
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        elif not isinstance(content, list):
            content = []
        adapted = []
        for part in content:
            if any(part is image for image in parts):
                adapted.append({"type": "image_url", "image_url": {"url": next(urls)}})
            elif isinstance(part, str):
                adapted.append({"type": "text", "text": part})
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                adapted.append({"type": "text", "text": part["text"]})
        conversation.append(_turn(message, adapted))
    return conversation


def _turn(message: dict[str, Any], content: list[dict[str, Any]]) -> dict[str, Any]:
    """One message with the fields speculators keeps (`_normalize_conversation`)."""
    reasoning = message.get("reasoning_content") or message.get("thinking") or message.get("reasoning")
    calls = message.get("tool_calls") if isinstance(message.get("tool_calls"), list) else None
    call_id = message.get("tool_call_id")
    return {
        "role": str(message.get("role")),
        "content": content,
        "reasoning_content": reasoning if isinstance(reasoning, str) and reasoning else None,
        "tool_calls": [_call(call) for call in calls] if calls else None,
        "tool_call_id": str(call_id) if call_id else None,
    }


def _call(call: Any) -> dict[str, Any]:
    """A tool call as an OpenAI message holds it, its arguments as JSON text."""
    call = call if isinstance(call, dict) else {}
    function = call.get("function") if isinstance(call.get("function"), dict) else call
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = orjson.dumps(arguments if arguments is not None else {}, option=orjson.OPT_NON_STR_KEYS).decode()
    name = function.get("name")
    return {
        "id": str(call["id"]) if call.get("id") is not None else None,
        "type": str(call.get("type") or "function"),
        "function": {"name": str(name) if name is not None else None, "arguments": arguments},
    }


def image_url(entry: str, images: ImageSource) -> str:
    """An `image_data` entry as a URL vLLM loads: a path (relative to the data file's folder) as
    an absolute `file://` URL, bare base64 as a `data:` URI, any URL as it is."""
    if entry[:8].lower().startswith(("http://", "https://", "data:", "file://")):
        return entry
    folder = images.folder
    path = Path(entry) if folder is None else folder / entry
    if RAW_BASE64.fullmatch(entry) and not path.exists():
        return f"data:image/png;base64,{entry}"  # the decoder reads the format from the bytes
    return path.absolute().as_uri() if path.is_absolute() or folder is not None else entry

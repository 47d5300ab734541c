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
                reply, `{"role": "assistant"}` with the record's `text`

A row whose images cannot be counted (an image not read, placeholders that do not match the
images, counts that give no `prompt_tokens`) is left as the prompt was sent, with no messages,
and counted. Every other row gets an empty `messages` list, which speculators sends as ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from audit.flows.export_rows import SampleBlock
from audit.model.families.vision import ResolvedVision, server_counts
from audit.records.batch import AuditContext, Batch
from audit.records.images import RAW_BASE64, ImageSource, message_images, read_image, vision_layout

_PART = pl.Struct({"type": pl.String(), "text": pl.String(), "image_url": pl.Struct({"url": pl.String()})})
MESSAGES_DTYPE = pl.List(pl.Struct({"role": pl.String(), "content": pl.List(_PART)}))

# datasets' feature for the column as the Arrow IPC stream holds it (large lists and strings).
_TEXT = {"dtype": "large_string", "_type": "Value"}
MESSAGES_FEATURE = {
    "feature": {
        "role": _TEXT,
        "content": {"feature": {"type": _TEXT, "text": _TEXT, "image_url": {"url": _TEXT}}, "_type": "LargeList"},
    },
    "_type": "LargeList",
}


@dataclass
class ImageTally:
    """What became of the rows that send images."""

    expanded: int = 0  # written with expanded ids and messages
    unexpanded: int = 0  # left as sent: their images could not be counted


def with_images(block: SampleBlock, records: pl.DataFrame, context: AuditContext, tally: ImageTally) -> SampleBlock:
    """The block (built from `records`, row for row, before any length policy) with each image
    row's pads expanded and its messages; every row gets a `messages` entry."""
    vision = context.profile.vision
    messages: list[list[dict[str, Any]]] = [[] for _ in range(block.rows)]
    repeats = np.ones(len(block.values), dtype=np.int64)
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
    ends = np.zeros(len(repeats) + 1, dtype=np.int64)
    np.cumsum(repeats, out=ends[1:])
    return SampleBlock(
        block.record_ids,
        block.lines,
        np.repeat(block.values, repeats),
        np.repeat(block.mask, repeats),  # the prompt's 0, over every pad it repeats
        ends[block.offsets],
        pl.Series("messages", messages, dtype=MESSAGES_DTYPE),
    )


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
    """The record's messages as speculators stores a multimodal row's, then its reply; None when
    the record has no messages or their image parts are not its images."""
    prompt = batch.source_prompt(row)
    parts = message_images(prompt)
    if prompt is None or parts is None or len(parts) != len(entries):
        return None
    urls = iter(image_url(entry, images) for entry in entries)
    conversation = []
    for message in prompt["messages"]:
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        elif not isinstance(content, list):
            content = []
        adapted = []
        for part in content:
            if any(part is image for image in parts):
                adapted.append({"type": "image_url", "image_url": {"url": next(urls)}})
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                adapted.append({"type": "text", "text": part["text"]})
        conversation.append({"role": str(message.get("role")), "content": adapted})
    reply = batch.records["text"][row]
    conversation.append({"role": "assistant", "content": [{"type": "text", "text": reply or ""}]})
    return conversation


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

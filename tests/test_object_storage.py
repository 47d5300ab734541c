"""Object storage: targets, the data root and saved reports as URLs, against a local S3 server.

The server is moto's, in its own process on 127.0.0.1 (tests/s3_server.py); the audit reaches
it through the real client (fsspec, s3fs, botocore, HTTP). The same data served from the store
and from disk must give the same findings, byte for byte the same outputs.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from audit.cli import app
from audit.errors import InputError
from audit.records import InputDigest, iter_line_blocks
from audit.storage import ObjectPath, is_url, location
from audit.targets import resolve_target
from tests.conftest import KIMI_TOKENIZER, PREPARED
from tests.s3_server import upload_tree

runner = CliRunner()
ROOT = "s3://bucket/prepared"


@pytest.fixture
def prepared(s3):
    """The shipped Kimi sample partitions under s3://bucket/prepared/."""
    for name in ("B0_clean", "B1_glaive"):
        upload_tree(s3.filesystem, PREPARED / name, f"bucket/prepared/{name}")
    return s3


def cli(*args: str):
    return runner.invoke(app, [*args])


def check_json(*args: str) -> tuple[int, dict]:
    result = cli("check", *args, "--tokenizer", str(KIMI_TOKENIZER), "--format", "json", "--no-cache")
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def error_line(result) -> str:
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("audit: error: ") and "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize("partition", ["B1_glaive", "B0_clean"])
def test_check_from_the_store_finds_what_check_from_disk_finds(prepared, partition, tmp_path):
    local_code, local = check_json(partition, "--data-root", str(PREPARED), "--reports-dir", str(tmp_path / "l"))
    code, remote = check_json(partition, "--data-root", ROOT, "--reports-dir", str(tmp_path / "r"))
    assert code == local_code == (1 if partition == "B1_glaive" else 0)
    assert remote["findings"] == local["findings"]
    assert remote["results"] == local["results"]
    assert remote["input"]["path"] == f"{ROOT}/{partition}/raw_responses.jsonl"
    for key in ("sha256", "bytes", "lines", "records", "output_tokens"):
        assert remote["input"][key] == local["input"][key]
    # the report stays local, in --reports-dir
    assert [p.name.split("-")[0] for p in (tmp_path / "r").glob("*.json")] == [partition]


def test_a_partition_url_and_an_object_url_are_targets(prepared, tmp_path):
    _, by_prefix = check_json(f"{ROOT}/B1_glaive", "--reports-dir", str(tmp_path))
    _, by_object = check_json(f"{ROOT}/B1_glaive/raw_responses.jsonl", "--reports-dir", str(tmp_path))
    assert by_prefix["findings"] == by_object["findings"] and by_prefix["target"] == by_object["target"]


def test_all_partitions_under_an_object_storage_root(s3, tmp_path):
    for name in ("B0_clean", "B1_glaive"):  # the partitions of one tokenizer
        upload_tree(s3.filesystem, PREPARED / name, f"bucket/kimi/{name}")
    s3.filesystem.pipe_file("bucket/kimi/notes/readme.txt", b"not a partition")
    result = cli(
        "check", "--all", "--data-root", "s3://bucket/kimi", "--tokenizer", str(KIMI_TOKENIZER),
        "--format", "jsonl", "--reports-dir", str(tmp_path), "--no-cache",
    )
    assert result.exit_code == 1, result.output
    targets = {json.loads(line)["target"] for line in result.stdout.splitlines()}
    assert "B1_glaive" in targets
    assert sorted(p.name.split("-")[0] for p in tmp_path.glob("*.json")) == ["B0_clean", "B1_glaive"]


@pytest.mark.parametrize(
    "name",
    ["..", "../secret", "%2e%2e", "B1_glaive%2F..%2F..%2Fsecret", "/secret", "a/b", "secret/", ".hidden"],
)
def test_a_partition_name_never_leaves_an_object_storage_root(prepared, name):
    prepared.filesystem.pipe_file("bucket/secret/raw_responses.jsonl", (PREPARED / "B1_glaive/raw_responses.jsonl").read_bytes())
    result = cli("check", name, "--data-root", ROOT, "--tokenizer", str(KIMI_TOKENIZER))
    assert result.exit_code == 2
    assert "secret/raw_responses" not in error_line(result)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(alphabet=st.sampled_from("ab._-/%2Fe\\:"), min_size=1, max_size=12))
def test_any_name_resolves_under_the_root_or_is_refused(prepared, name):
    prepared.filesystem.pipe_file("bucket/prepared/ab/raw_responses.jsonl", b'{"id": 1}\n')
    root = ObjectPath(ROOT)
    try:
        target = resolve_target(name, root)
    except InputError:
        return
    # Names that look like paths are local paths, never keys under the root or elsewhere.
    assert isinstance(target.data_file, ObjectPath) is False or target.data_file.is_relative_to(root)


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("s3://bucket/prepared/B1_glaive/missing.jsonl", "no such object or prefix"),
        ("s3://bucket/prepared/nothing-here", "no such object or prefix"),
        ("s3://no-such-bucket/raw_responses.jsonl", "no such object or prefix"),
        ("s3://bucket/prepared", "no raw_responses.jsonl"),  # a prefix of partitions, not one
        ("s3://bucket/prefix.jsonl", "no raw_responses.jsonl"),  # a prefix named like a file
        ("s3://bucket/empty.jsonl", "the file is empty"),
    ],
)
def test_hostile_locations_are_one_error_line(prepared, target, says):
    prepared.filesystem.pipe_file("bucket/prefix.jsonl/part-0", b'{"id": 1}\n')
    prepared.filesystem.pipe_file("bucket/empty.jsonl", b"")
    result = cli("check", target, "--tokenizer", str(KIMI_TOKENIZER), "--profile", "kimi-k2.5")
    assert result.exit_code == 2
    line = error_line(result)
    assert says in line and target in line


def test_missing_credentials_are_one_error_line(prepared, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    result = cli("check", f"{ROOT}/B1_glaive", "--tokenizer", str(KIMI_TOKENIZER))
    assert result.exit_code == 2
    assert "no credentials for s3://" in error_line(result) and "AWS_ACCESS_KEY_ID" in result.output


def test_a_relative_tokenizer_in_a_stored_generation_json_asks_for_tokenizer(prepared):
    result = cli("check", "B1_glaive", "--data-root", ROOT)
    assert result.exit_code == 2
    assert "pass --tokenizer DIR" in error_line(result)


def test_inspect_print_reads_the_lines_it_shows_from_the_store(prepared):
    args = ["--tokenizer", str(KIMI_TOKENIZER), "--print", "--line", "7", "--format", "json"]
    local = cli("inspect", "B1_glaive", "--data-root", str(PREPARED), *args)
    remote = cli("inspect", "B1_glaive", "--data-root", ROOT, *args)
    assert local.exit_code == remote.exit_code == 0, remote.output
    shown, expected = json.loads(remote.stdout), json.loads(local.stdout)
    assert shown["records"] == expected["records"] and shown["records"][0]["line"] == 7


def test_report_renders_a_report_saved_in_the_store(prepared, tmp_path):
    saved = tmp_path / "B1.json"
    cli("check", "B1_glaive", "--data-root", ROOT, "--tokenizer", str(KIMI_TOKENIZER), "--report", str(saved))
    prepared.filesystem.pipe_file("bucket/reports/B1.json", saved.read_bytes())
    result = cli("report", "s3://bucket/reports/B1.json", "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["findings"] == json.loads(saved.read_text())["findings"]
    missing = cli("report", "s3://bucket/reports/none.json")
    assert missing.exit_code == 2 and "s3://bucket/reports/none.json" in error_line(missing)


def test_a_saved_report_never_makes_the_html_samples_reach_the_store(prepared, tmp_path):
    saved = tmp_path / "B1.json"
    cli("check", "B1_glaive", "--data-root", ROOT, "--tokenizer", str(KIMI_TOKENIZER), "--report", str(saved))
    page = tmp_path / "B1.html"
    result = cli("report", str(saved), "--html", str(page), "--tokenizer", str(KIMI_TOKENIZER))
    assert result.exit_code == 0, result.output
    assert "samples omitted: the audited data is in object storage" in page.read_text()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), min_size=1, max_size=30),
    cut=st.floats(0, 1),
    block=st.integers(1, 64),
)
def test_a_byte_range_streams_the_same_lines_from_the_store_as_from_disk(s3, tmp_path_factory, lines, cut, block):
    data = b"\n".join(lines) + b"\n"
    local = tmp_path_factory.mktemp("range") / "data.jsonl"
    local.write_bytes(data)
    s3.filesystem.pipe_file("bucket/range/data.jsonl", data)
    remote = ObjectPath("s3://bucket/range/data.jsonl")
    start = data.find(b"\n", int(len(data) * cut)) + 1 if cut else 0  # a line start
    first_line = data[:start].count(b"\n") + 1

    def read(path):
        digest = InputDigest()
        blocks = iter_line_blocks(path, digest, block, start=start, end=len(data), first_line=first_line)
        return [(b.first_line, b.lines) for b in blocks], digest.sha256, digest.bytes

    assert read(remote) == read(local)


def test_urls_and_paths():
    assert is_url("s3://bucket/key") and is_url("gs://b/k") and not is_url("file:///tmp/x")
    assert not is_url("prepared/B1") and not is_url("C:\\data")
    assert location("file:///tmp/x").as_posix() == "/tmp/x"
    path = ObjectPath("s3://bucket/prepared/B1/raw_responses.jsonl")
    assert (path.name, path.stem, path.parent.name, path.bucket) == ("raw_responses.jsonl", "raw_responses", "B1", "bucket")
    assert path.is_relative_to(ObjectPath("s3://bucket/prepared"))
    assert not path.is_relative_to(ObjectPath("s3://bucket/prep"))
    for name in ("..", ".", "", "a/../b", "a\\b"):
        with pytest.raises(InputError):
            ObjectPath("s3://bucket/prepared") / name

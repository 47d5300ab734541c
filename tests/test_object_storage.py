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

from audit.base.errors import InputError
from audit.base.storage import ObjectPath, is_url, location
from audit.cli import app
from audit.flows.targets import resolve_target
from audit.records.sources import InputDigest, file_blocks
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
        blocks = file_blocks(path, start=start, end=len(data), first_line=first_line, digest=digest, block_bytes=block)
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


# -- gate ----------------------------------------------------------------------------------------

GATED = "s3://bucket/gated/B1"


def gate(*args: str):
    return cli("gate", *args, "--tokenizer", str(KIMI_TOKENIZER))


def stored(s3, prefix: str = "bucket/gated/B1") -> dict[str, bytes]:
    """Every object under `prefix`, by name (the lock included, were one left)."""
    return {
        path.rsplit("/", 1)[-1]: s3.filesystem.cat_file(path)
        for path in s3.filesystem.find(prefix)
    }


def unfinished_uploads(s3) -> list[str]:
    listed = s3.filesystem.call_s3("list_multipart_uploads", Bucket="bucket")
    return [upload["Key"] for upload in listed.get("Uploads", []) or []]


@pytest.mark.parametrize("source", ["disk", "store"])
def test_gate_into_the_store_writes_what_a_local_gate_writes(prepared, tmp_path, source):
    local = tmp_path / "gated"
    assert gate("B1_glaive", "--data-root", str(PREPARED), "--out", str(local)).exit_code == 1
    root = str(PREPARED) if source == "disk" else ROOT
    result = gate("B1_glaive", "--data-root", root, "--out", GATED)
    assert result.exit_code == 1, result.output
    assert f"-> {GATED}/" in result.output
    objects = stored(prepared)
    assert sorted(objects) == ["clean.jsonl", "manifest.json", "quarantine.jsonl"]  # no lock left
    for name in ("clean.jsonl", "quarantine.jsonl"):
        assert objects[name] == (local / name).read_bytes()
    manifest = json.loads(objects["manifest.json"])
    expected = json.loads((local / "manifest.json").read_text())
    assert manifest["outputs"] == expected["outputs"] and manifest["counts"] == expected["counts"]
    assert manifest["input"]["sha256"] == expected["input"]["sha256"]
    if source == "store":
        assert manifest["input"]["path"] == f"{ROOT}/B1_glaive/raw_responses.jsonl"


def test_gate_from_the_store_to_disk_is_byte_identical(prepared, tmp_path):
    assert gate("B1_glaive", "--data-root", str(PREPARED), "--out", str(tmp_path / "a")).exit_code == 1
    assert gate("B1_glaive", "--data-root", ROOT, "--out", str(tmp_path / "b")).exit_code == 1
    for name in ("clean.jsonl", "quarantine.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_gate_again_into_the_store_is_unchanged(prepared):
    assert gate("B1_glaive", "--data-root", ROOT, "--out", GATED).exit_code == 1
    before = stored(prepared)
    again = gate("B1_glaive", "--data-root", ROOT, "--out", GATED)
    assert again.exit_code == 1 and "unchanged" in again.output
    assert stored(prepared) == before


def test_outputs_without_a_manifest_in_the_store_are_an_unfinished_gate_redone(prepared):
    prepared.filesystem.pipe_file("bucket/gated/B1/clean.jsonl", b"half of an earlier gate\n")
    result = gate("B1_glaive", "--data-root", ROOT, "--out", GATED)
    assert result.exit_code == 1, result.output
    objects = stored(prepared)
    assert json.loads(objects["manifest.json"])["outputs"]["clean.jsonl"]["bytes"] == len(objects["clean.jsonl"])
    assert objects["clean.jsonl"] != b"half of an earlier gate\n"


def test_the_gate_of_another_input_in_the_store_is_kept_unless_forced(prepared):
    assert gate("B1_glaive", "--data-root", ROOT, "--out", GATED).exit_code == 1
    kept = stored(prepared)
    refused = gate("B0_clean", "--data-root", ROOT, "--out", GATED)
    assert refused.exit_code == 2 and "--force" in error_line(refused)
    assert stored(prepared) == kept
    forced = gate("B0_clean", "--data-root", ROOT, "--out", GATED, "--force")
    assert forced.exit_code == 0, forced.output
    assert json.loads(stored(prepared)["manifest.json"])["target"] == "B0_clean"


def test_a_gate_holding_the_prefix_refuses_a_second_one(prepared):
    holder = {"pid": 4242, "host": "trainer-7", "command": "audit gate B1 --out s3://bucket/gated/B1",
              "started_at": "2026-01-01T00:00:00Z", "token": "x"}
    prepared.filesystem.pipe_file("bucket/gated/B1/.audit.lock", json.dumps(holder).encode())
    result = gate("B1_glaive", "--data-root", ROOT, "--out", GATED)
    assert result.exit_code == 2
    line = error_line(result)
    assert "in use by another audit run" in line and "trainer-7" in line and "4242" in line
    assert f"delete {GATED}/.audit.lock" in line
    assert sorted(stored(prepared)) == [".audit.lock"]


def test_a_lock_left_by_a_dead_process_of_this_host_is_taken_over(prepared):
    import socket
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    holder = {"pid": int(gone.stdout), "host": socket.gethostname(), "command": "audit gate", "token": "x"}
    prepared.filesystem.pipe_file("bucket/gated/B1/.audit.lock", json.dumps(holder).encode())
    result = gate("B1_glaive", "--data-root", ROOT, "--out", GATED)
    assert result.exit_code == 1, result.output
    assert ".audit.lock" not in stored(prepared)


def test_a_failure_midway_leaves_the_previous_gate_in_the_store_whole(prepared, monkeypatch):
    import audit.flows.gating as gating

    assert gate("B1_glaive", "--data-root", ROOT, "--out", GATED).exit_code == 1
    before = stored(prepared)
    split = gating._split

    def broken(data_file, quarantined, clean, quarantine, block_bytes):
        split(data_file, quarantined, clean, quarantine, block_bytes)  # the uploads hold every byte
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gating, "_split", broken)
    result = gate("B0_clean", "--data-root", ROOT, "--out", GATED, "--force")
    assert result.exit_code == 2 and "No space left" in result.output
    assert stored(prepared) == before
    assert unfinished_uploads(prepared) == []


def test_an_input_in_the_store_that_changes_during_the_gate_writes_nothing(prepared, monkeypatch):
    import audit.flows.gating as gating

    audited = gating.check_session

    def audit_then_append(session, progress=None):
        report = audited(session, progress=progress)
        key = "bucket/prepared/B1_glaive/raw_responses.jsonl"
        prepared.filesystem.pipe_file(key, prepared.filesystem.cat_file(key) + b"\n")
        return report

    monkeypatch.setattr(gating, "check_session", audit_then_append)
    result = gate("B1_glaive", "--data-root", ROOT, "--out", GATED)
    assert result.exit_code == 2 and "changed while it was being gated" in error_line(result)
    assert stored(prepared) == {}


def test_a_killed_gate_s_unfinished_uploads_are_aborted_by_the_next(prepared):
    for name in ("clean.jsonl", "quarantine.jsonl"):
        prepared.filesystem.call_s3("create_multipart_upload", Bucket="bucket", Key=f"gated/B1/{name}")
    prepared.filesystem.call_s3("create_multipart_upload", Bucket="bucket", Key="gated/B1/theirs.bin")
    assert gate("B1_glaive", "--data-root", ROOT, "--out", GATED).exit_code == 1
    assert unfinished_uploads(prepared) == ["gated/B1/theirs.bin"]  # only the gate's own


def test_reports_and_pages_may_go_to_the_store(prepared):
    result = cli(
        "check", "B1_glaive", "--data-root", ROOT, "--tokenizer", str(KIMI_TOKENIZER),
        "--report", "s3://bucket/reports/B1.json", "--html", "s3://bucket/reports/B1.html",
    )
    assert result.exit_code == 1, result.output
    report = json.loads(prepared.filesystem.cat_file("bucket/reports/B1.json"))
    assert report["target"] == "B1_glaive"
    assert b"<html" in prepared.filesystem.cat_file("bucket/reports/B1.html")


def test_a_long_line_in_the_store_is_skipped_unread_as_on_disk(s3, tmp_path, monkeypatch):
    from audit.flows.checking import check_session
    from audit.flows.gating import gate_session
    from audit.flows.session import CheckOptions, prepare
    from audit.records import sources

    monkeypatch.setattr(sources, "MAX_LINE_BYTES", 1 << 16)
    good = (PREPARED / "B0_clean" / "raw_responses.jsonl").read_bytes().splitlines()[:2]
    data = good[0] + b"\n" + b"z" * (5 << 16) + b"\n" + good[1] + b"\n"
    s3.filesystem.pipe_file("bucket/long/raw_responses.jsonl", data)
    options = CheckOptions(profile="kimi-k2.5", tokenizer=KIMI_TOKENIZER, cache=False, block_bytes=1 << 14)
    session = prepare(resolve_target("s3://bucket/long", ObjectPath(ROOT)), options)
    found = check_session(session).log.collect()
    assert found.select("line", "rule").rows() == [(2, "INT001")]
    assert found["message"][0].startswith(f"a line of {5 << 16:,} bytes, over the {1 << 16:,} bytes")
    gated = gate_session(session, tmp_path / "gated")
    assert (tmp_path / "gated" / "clean.jsonl").read_bytes() == good[0] + b"\n" + good[1] + b"\n"
    entry = json.loads((tmp_path / "gated" / "quarantine.jsonl").read_bytes())
    assert entry["line"] == 2 and entry["raw_omitted"] == {"offset": len(good[0]) + 1, "bytes": 5 << 16}
    assert gated.manifest["counts"] == {"in": 3, "clean": 2, "quarantined": 1}

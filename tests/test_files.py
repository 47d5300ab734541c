"""Outputs are written atomically, readable by others, and leave no stray temporary file."""

from __future__ import annotations

import os
import stat

import pytest

from audit.base.files import write_file


def test_written_file_follows_the_umask_and_replaces_the_old_one(tmp_path):
    target = tmp_path / "nested" / "report.json"
    previous = os.umask(0o022)
    try:
        write_file(target, "old\n")
        write_file(target, "new\n")
    finally:
        os.umask(previous)
    assert target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # not mkstemp's private 0600
    assert [p.name for p in target.parent.iterdir()] == ["report.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "page.html"
    target.write_text("old")
    with pytest.raises(UnicodeEncodeError):
        write_file(target, "\ud800 is not encodable")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]

"""Outputs are written atomically, readable by others, and leave no stray temporary file; a
destination that is not a regular file is written through or refused, never replaced."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from audit.base.destinations import refuse_overlap, same_file
from audit.base.errors import InputError
from audit.base.files import open_temporary, write_directory_atomically, write_file
from tests.conftest import ROOT


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


# == What a destination is decides how it is written (audit.base.destinations) ==================


def make_device(path: Path, kind: int = stat.S_IFCHR) -> Path:
    """A device node in a test's own folder (the null device's numbers), never the system's."""
    try:
        os.mknod(path, kind | 0o666, os.makedev(1, 3) if kind == stat.S_IFCHR else os.makedev(7, 0))
    except PermissionError:
        pytest.skip("making a device node needs root (CAP_MKNOD)")
    return path


def test_a_character_device_is_written_through_and_stays_a_device(tmp_path):
    null = make_device(tmp_path / "null")
    write_file(null, "{}\n")
    temporary = open_temporary(tmp_path, "clean.jsonl")  # a streamed output committed onto it
    temporary.file.write(b"records\n")
    temporary.commit(null)
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]  # no temporary left


def test_a_fifo_is_written_through_to_its_reader_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    write_file(fifo, [b'{"verdict": ', b'"pass"}\n'])
    reader.join(timeout=10)
    assert received == [b'{"verdict": "pass"}\n']
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("kind", ["directory", "block device", "socket"])
def test_a_directory_a_block_device_or_a_socket_is_refused_in_one_line(tmp_path, kind):
    target = tmp_path / "out"
    if kind == "directory":
        target.mkdir()
    elif kind == "block device":
        make_device(target, stat.S_IFBLK)
    else:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(target))
        server.close()
    before = os.lstat(target)
    with pytest.raises(InputError, match=f"it is a {kind}; name a file") as refused:
        write_file(target, "{}\n")
    assert "\n" not in str(refused.value)
    after = os.lstat(target)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_symlink_is_followed_and_never_replaced(tmp_path):
    (tmp_path / "reports").mkdir()
    real = tmp_path / "reports" / "report.json"
    real.write_text("old\n")
    link = tmp_path / "latest.json"
    link.symlink_to("reports/report.json")
    write_file(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == "reports/report.json"
    assert real.read_text() == "new\n"
    # A streamed output committed through a link to another directory lands at the target too.
    temporary = open_temporary(tmp_path, link.name)
    temporary.file.write(b"streamed\n")
    temporary.commit(link)
    assert link.is_symlink() and real.read_text() == "streamed\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "reports"]


def test_a_dangling_symlink_gets_its_target_made_and_a_loop_is_refused(tmp_path):
    dangling = tmp_path / "report.json"
    dangling.symlink_to("kept/report.json")
    write_file(dangling, "{}\n")
    assert dangling.is_symlink() and (tmp_path / "kept" / "report.json").read_text() == "{}\n"
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(InputError, match="loop of symbolic links"):
        write_file(tmp_path / "a", "{}\n")
    assert (tmp_path / "a").is_symlink() and (tmp_path / "b").is_symlink()


def test_a_link_to_a_device_is_written_through_the_device(tmp_path):
    null = make_device(tmp_path / "null")
    (tmp_path / "report.json").symlink_to(null)
    write_file(tmp_path / "report.json", "{}\n")
    assert (tmp_path / "report.json").is_symlink() and stat.S_ISCHR(os.lstat(null).st_mode)


def test_dev_stdout_writes_through_the_open_stdout(tmp_path):
    """Through the descriptor itself, as a shell does: what was printed before stays."""
    out = tmp_path / "out.txt"
    script = (
        "import sys; from pathlib import Path; from audit.base.files import write_file\n"
        "print('table', flush=True); write_file(Path('/dev/stdout'), '{}\\n'); print('verdict')\n"
    )
    with out.open("wb") as stdout:
        subprocess.run([sys.executable, "-c", script], stdout=stdout, check=True, cwd=ROOT)
    assert out.read_text() == "table\n{}\nverdict\n"
    piped = subprocess.run([sys.executable, "-c", script], capture_output=True, check=True, cwd=ROOT)
    assert piped.stdout == b"table\n{}\nverdict\n"


def test_a_cache_entry_never_replaces_a_link_or_a_file_in_its_place(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "entry").symlink_to(elsewhere)
    with pytest.raises(NotADirectoryError):
        write_directory_atomically(tmp_path / "entry", lambda staging: (staging / "meta.json").write_text("{}"))
    assert (tmp_path / "entry").is_symlink() and list(elsewhere.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "entry"]


def test_outputs_are_compared_with_inputs_by_path_and_by_inode(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    os.link(data, tmp_path / "hard.jsonl")
    (tmp_path / "soft.jsonl").symlink_to("data.jsonl")
    for named in ("data.jsonl", "hard.jsonl", "soft.jsonl", "./sub/../data.jsonl"):
        with pytest.raises(InputError, match="would overwrite the input"):
            refuse_overlap([("--report", tmp_path / named)], [("the input", data)])
    with pytest.raises(InputError, match="are one file"):
        refuse_overlap([("--report", tmp_path / "r.json"), ("--html", tmp_path / "r.json")], [])
    refuse_overlap([("--report", tmp_path / "r.json"), ("--html", tmp_path / "r.html")], [("the input", data)])
    assert same_file(data, tmp_path / "hard.jsonl") and not same_file(data, tmp_path / "r.json")

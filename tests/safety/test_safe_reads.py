"""The primitives every reader of a stranger's file goes through (taperlm.files.io): nothing opened
can block, a name read from a file stays inside its folder, and a declared or actual size past
the format's limit is refused before it is read."""

from __future__ import annotations

import os
import threading

import pytest

from conftest import raises_naming
from taperlm.errors import UnsafeFileError
from taperlm.files.io import open_regular, path_inside, read_bytes, read_text

pytestmark = pytest.mark.unit


def _special_files(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    return {"a FIFO": fifo, "a device": "/dev/zero", "a folder": folder}


@pytest.mark.parametrize("kind", ["a FIFO", "a device", "a folder"])
def test_nothing_opened_blocks_or_reads_a_special_file(tmp_path, kind):
    path = _special_files(tmp_path)[kind]
    done: list[BaseException] = []

    def read():
        try:
            read_bytes(path, 1 << 20, "test file")
        except BaseException as err:
            done.append(err)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(10)
    assert done, f"reading {kind} blocked"
    assert isinstance(done[0], UnsafeFileError)
    assert kind in str(done[0]) and str(path) in str(done[0])


def test_a_link_to_a_special_file_is_refused_too(tmp_path):
    link = tmp_path / "link"
    link.symlink_to("/dev/zero")
    with raises_naming(UnsafeFileError, str(link), "device", "regular file"):
        open_regular(link, 10)


def test_size_is_checked_before_reading(tmp_path):
    f = tmp_path / "big"
    f.write_bytes(b"x" * 101)
    assert read_bytes(f, 101) == b"x" * 101
    with raises_naming(UnsafeFileError, "manifest", str(f), "101 bytes", "100 bytes"):
        read_bytes(f, 100, "manifest")


def test_text_that_is_not_utf8_is_named(tmp_path):
    f = tmp_path / "t"
    f.write_bytes(b"ok\xff")
    with raises_naming(UnsafeFileError, str(f), "UTF-8", "byte 2"):
        read_text(f, 100)


@pytest.mark.parametrize(
    "name", ["../victim.txt", "a/../../victim.txt", "/etc/passwd", "link/victim.txt", "outlink"]
)
def test_names_read_from_a_file_stay_inside_its_folder(tmp_path, name):
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "link").symlink_to(tmp_path / "outside")
    (root / "outlink").symlink_to(tmp_path / "victim.txt")
    with raises_naming(UnsafeFileError, "shard", repr(name), str(root), "outside"):
        path_inside(root, name, "shard")


@pytest.mark.parametrize("name", ["x.bin", "a/x.bin", "a/../x.bin", "./a/x.bin"])
def test_names_inside_the_folder_are_kept(tmp_path, name):
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    got = path_inside(root, name)
    assert got == (root / name).resolve()

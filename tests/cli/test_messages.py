"""Class 7 of issue 26: messages name the actual cause instead of guessing one.

Every path a command takes is tried with every kind of thing that is not a regular file (a
folder, a FIFO, a socket, a symlink loop, a broken symlink): the message names the path and
its kind (a FIFO is not a "source folder"; a folder where the lock file belongs is not a full
disk). OS errors while writing are explained by their errno, and a run that stops on NaN/inf
says what the run shows (a non-finite RoPE table names model.rope_theta; a loss that was never
finite on the untouched initial weights does not blame the learning rate).
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest

import fault_harness as H
from conftest import assert_own_options
from taperlm.cli import main as cli_main
from taperlm.files.io import not_a_file, os_error_cause

SRC = Path(__file__).resolve().parents[2] / "src" / "taperlm"


def make_kind(path: Path, kind: str) -> None:
    """Put `kind` (not a regular file) at `path`."""
    if kind == "a folder":
        path.mkdir()
    elif kind == "a FIFO (named pipe)":
        os.mkfifo(path)
    elif kind == "a socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    elif kind == "a symlink loop":
        os.symlink(path.name, path)
    elif kind == "a broken symlink":
        os.symlink(path.parent / "nowhere" / "x", path)
    else:
        raise ValueError(kind)


KINDS = ["a folder", "a FIFO (named pipe)", "a socket", "a symlink loop", "a broken symlink"]


@pytest.mark.unit
@pytest.mark.parametrize("kind", KINDS)
def test_not_a_file_names_every_kind(tmp_path, kind):
    path = tmp_path / "x"
    make_kind(path, kind)
    assert not_a_file(path) == kind
    (tmp_path / "f").write_text("x")
    assert not_a_file(tmp_path / "f") is None and not_a_file(tmp_path / "absent") is None


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return H.prepare_data(tmp_path_factory.mktemp("messages"))


# (role, the kinds that are wrong there, argv and the path to spoil, the message)
def _train_lock(tmp: Path, data: Path):
    run = tmp / "run"
    run.mkdir()
    argv = [*H.train_argv(data, run), "--stop-after-steps", "1"]
    return argv, run / ".lock", "The path {p} is {kind} where taperlm writes a file"


def _prepare_source(tmp: Path, data: Path):
    p = tmp / "corpus.txt"
    argv = ["prepare", "--source", str(p), "--tokenizer", "bpe:300", "--out", str(tmp / "d")]
    return argv, p, "source {p} is {kind}, not a file or folder"


def _prepare_folder_entry(tmp: Path, data: Path):
    folder = tmp / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("some text\n" * 50)
    argv = ["prepare", "--source", str(folder), "--tokenizer", "bpe:300", "--out", str(tmp / "d")]
    return argv, folder / "b.txt", "source folder {folder}: b.txt is {kind}, not a regular file"


def _config_file(tmp: Path, data: Path):
    p = tmp / "c.yaml"
    return (
        ["plan", "--config", str(p)],
        p,
        "{p} is {kind}, not a file",
    )  # --config P (a FIFO...) or config file P


ROLES = {
    "train RUN/.lock": (_train_lock, KINDS),
    "prepare --source": (_prepare_source, KINDS[1:]),  # a folder is a valid source
    "prepare --source folder entry": (_prepare_folder_entry, KINDS[1:]),  # folders are walked
    "plan/train --config": (_config_file, KINDS),
}
CASES = [(role, kind) for role, (_, kinds) in ROLES.items() for kind in kinds]


@pytest.mark.parametrize(("role", "kind"), CASES, ids=[f"{r}-{k.split()[1]}" for r, k in CASES])
def test_every_path_names_the_kind_it_found(role, kind, data, tmp_path, capsys):
    build, _ = ROLES[role]
    argv, path, expected = build(tmp_path, data)
    make_kind(path, kind)
    rc = cli_main(argv)  # a FIFO that were opened would block here forever
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith(f"taperlm {argv[0]}: error: ") and err.count("\n") == 1, err
    assert_own_options(argv[0], err)
    assert expected.format(p=path, kind=kind, folder=path.parent) in err, err
    assert "disk space" not in err and "does not exist" not in err
    assert not_a_file(path) == kind  # left as it was


@pytest.mark.unit
@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (errno.ENOSPC, "The file system of {parent} is full (or over quota): free space there"),
        (errno.EDQUOT, "is full (or over quota)"),
        (errno.EACCES, "Permission denied: fix the permissions of {parent}"),
        (errno.EPERM, "Permission denied"),
        (errno.EROFS, "The folder {parent} is on a read-only file system"),
        (errno.ENOTDIR, "A part of {parent} is a file, not a folder"),
        (errno.ENAMETOOLONG, "The path is too long"),
        (errno.EIO, "reported an I/O error"),
        (errno.EBUSY, "Fix the cause above at {path}"),
    ],
)
def test_os_errors_are_explained_by_their_errno(tmp_path, code, expected):
    path = tmp_path / "run" / "metrics.jsonl"
    text = os_error_cause(OSError(code, os.strerror(code)), path)
    assert expected.format(parent=path.parent, path=path) in text


@pytest.mark.unit
def test_only_a_full_disk_is_called_a_full_disk():
    """The guess this class was about: no message outside os_error_cause's errno table advises
    freeing disk space."""
    hits = [
        f"{p.relative_to(SRC)}:{i}"
        for p in SRC.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "disk space" in line.lower() or "free space" in line.lower()
    ]
    assert hits == ["files/io.py:" + hits[0].split(":")[1]] and len(hits) == 1, hits


def test_rope_theta_that_breaks_the_tables_is_named():
    from taperlm.config.presets import get_preset
    from taperlm.errors import ConfigError
    from taperlm.models import TaperedLM

    cfg = get_preset("transformer-tiny")
    cfg.rope_theta = 1e-300
    with pytest.raises(ConfigError, match=r"model\.rope_theta = 1e-300 gives non-finite RoPE"):
        TaperedLM(cfg)


@pytest.mark.parametrize(
    ("nan_from", "expected"),
    [
        ("1-", "no update was applied, so train.lr is not the cause"),
        ("3-", "Lower train.lr, check the data, or raise train.max_bad_steps"),
    ],
)
def test_divergence_advice_follows_what_the_run_shows(
    nan_from, expected, data, tmp_path, monkeypatch, capsys
):
    H.inject_nan(monkeypatch, nan_from)
    run = tmp_path / "run"
    argv = [*H.train_argv(data, run, "train.max_bad_steps=2", "train.restore_nonfinite=false")]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err, err

"""Issue 26, class 2: a command writes only into a folder that is new, empty or of its own kind,
and never deletes, overwrites or chmods a file it did not write -- `--force` included.

Every folder output of every command (found by walking the parsers, checked against
`taperlm.files.outdirs.OUTPUT_FOLDERS`) is tried with every kind of folder: new, empty, its own kind,
each other command's kind, a user's non-empty folder, a file, a symlink to each of those and a
dangling symlink. A refused case ends at once with exit code 2 and a line naming the option, and
leaves every file (content and mode) as it was; an accepted one passes the check. The commands'
`--force` options (prepare, export) are tried on the folders they used to write into.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

import pytest

import fault_harness as H
from conftest import assert_own_options, raises_naming
from taperlm.cli import COMMANDS, build_parser, subcommand_parser
from taperlm.cli import main as cli_main
from taperlm.errors import ConfigError
from taperlm.files.outdirs import KINDS, OUTPUT_FOLDERS, check_folder
from taperlm.spec.domains import PathArg

FOLDERS = sorted(
    (cmd, a.option_strings[0] if a.option_strings else a.dest)
    for cmd in COMMANDS
    for a in subcommand_parser(build_parser(), cmd)._actions
    if isinstance(a.type, PathArg) and a.type.role == "output" and a.type.kind == "dir"
)


@pytest.mark.unit
def test_every_folder_output_has_a_kind():
    assert sorted(OUTPUT_FOLDERS) == FOLDERS


def make_folder(root: Path, kind: str) -> Path:
    """A folder of `kind`: new, empty, lock-only, user (non-empty, no marker), file, one of KINDS (its
    marker and a file), legacy-KIND (the layout of folders written before markers)."""
    p = root / f"f-{kind}"
    if kind == "new":
        return p
    if kind == "file":
        p.write_text("precious")
        return p
    p.mkdir()
    if kind == "empty":
        return p
    if kind == "lock-only":  # a writer's lock and nothing else: the lock decides
        (p / ".lock").write_text("")
        return p
    (p / "precious.txt").write_text("mine")
    if kind == "user":
        (p / "config.yaml").write_text("model: {d_model: 64}\n")
        (p / "meta.json").write_text("{}")
        return p
    if kind.startswith("legacy-"):
        legacy = {
            "run": {"config.yaml": "model: {}\n", "metrics.jsonl": ""},
            "data": {"meta.json": '{"format": "taperlm-tokens"}'},
            "compare": {"report.json": "{}"},
            "export": {"config.json": '{"model_type": "taperlm"}'},
            "lm-eval-tasks": {"taperlm_utils.py": "", "taperlm_piqa.yaml": ""},
        }[kind[len("legacy-") :]]
        for name, text in legacy.items():
            (p / name).write_text(text)
        return p
    (p / KINDS[kind].marker).write_text("x")
    return p


FOLDER_KINDS = [
    "new",
    "empty",
    "lock-only",
    "user",
    "file",
    *KINDS,
    *(f"legacy-{k}" for k in KINDS),
]
LINKS = ["link-to-own", "link-to-user", "dangling-link"]


def _snapshot(root: Path) -> dict[str, tuple[str, int]]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = (f"-> {os.readlink(p)}", 0)
        elif p.is_file():
            out[rel] = (H._sha256(p), stat.S_IMODE(p.stat().st_mode))
        else:
            out[rel] = ("dir", stat.S_IMODE(p.stat().st_mode))
    return out


def _argv(cmd: str, option: str, value: Path, tmp: Path) -> list[str]:
    """`cmd` with its required arguments pointing at missing inputs (the folder check comes
    first, so they are never read) and `option value`."""
    argv = [cmd]
    for a in subcommand_parser(build_parser(), cmd)._actions:
        name = a.option_strings[0] if a.option_strings else a.dest
        if name == option:
            continue
        if not a.option_strings and a.nargs != "?":
            argv.append(str(tmp / "absent" / a.dest))
        elif a.option_strings and a.required:
            argv += [name, str(tmp / "absent" / a.dest)]
    if cmd == "eval":
        argv.append(str(tmp / "absent" / "run"))
    return [*argv, option, str(value)]


def _expected(kind: str, own: str) -> bool:
    """Whether a command writing `own` folders may write into a folder of `kind`."""
    base = kind.removeprefix("legacy-")
    return kind in ("new", "empty", "lock-only") or base == own


CASES = [(c, o, k) for c, o in FOLDERS for k in FOLDER_KINDS + LINKS]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("cmd", "option", "kind"), CASES, ids=[f"{c} {o} {k}" for c, o, k in CASES]
)
def test_command_x_folder_kind(cmd, option, kind, tmp_path, capsys):
    own = OUTPUT_FOLDERS[(cmd, option)]
    root = tmp_path / "root"
    root.mkdir()
    if kind in LINKS:
        target = {
            "link-to-own": make_folder(root, own),
            "link-to-user": make_folder(root, "user"),
            "dangling-link": root / "gone",
        }[kind]
        folder = root / "link"
        folder.symlink_to(target)
        allowed = kind == "link-to-own"
    else:
        folder = make_folder(root, kind)
        allowed = _expected(kind, own)
    if allowed:  # the check lets it through (the command itself is tested elsewhere)
        check_folder(folder, own, option)
        return
    before = _snapshot(root)
    rc = cli_main(_argv(cmd, option, folder, tmp_path))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith(f"taperlm {cmd}: error: {option} "), err
    assert_own_options(cmd, err)
    assert "Traceback" not in err
    assert _snapshot(root) == before


@pytest.mark.unit
def test_the_check_refuses_what_it_should(tmp_path):
    """check_folder is not vacuous: every kind refuses a user's folder and every other kind."""
    for own in KINDS:
        root = tmp_path / own
        root.mkdir()
        with raises_naming(ConfigError, "--out", str(root), "new or empty folder"):
            check_folder(make_folder(root, "user"), own, "--out")
        for other in set(KINDS) - {own}:
            with pytest.raises(ConfigError, match=re.escape(f"is {KINDS[other].what}")):
                check_folder(make_folder(root, other), own, "--out")


# ----------------------------------------------------------------------------------------------
# --force is narrow; real writes into own folders keep working


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return H.prepare_data(tmp_path_factory.mktemp("outdirs"))


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("trained") / "run"
    assert cli_main([*H.train_argv(data, run), "--stop-after-steps", "1"]) == 0
    return run


def _corpus(tmp: Path) -> Path:
    p = tmp / "corpus.txt"
    p.write_text(H.corpus_text(3000), encoding="utf-8")
    return p


@pytest.mark.unit
def test_prepare_force_adds_beside_user_files_but_replaces_none(tmp_path, capsys):
    corpus = _corpus(tmp_path)
    user = make_folder(tmp_path, "user")  # holds meta.json: prepare would replace it
    before = _snapshot(user)
    argv = ["prepare", "--source", str(corpus), "--tokenizer", "bpe:300", "--no-progress"]
    assert cli_main([*argv, "--out", str(user), "--force"]) == 2
    assert "already holds meta.json" in capsys.readouterr().err
    assert _snapshot(user) == before
    (user / "meta.json").unlink()
    (user / "train.bin").write_text("my own file that looks like a shard")
    assert cli_main([*argv, "--out", str(user), "--force"]) == 2
    assert "train.bin" in capsys.readouterr().err
    (user / "train.bin").unlink()
    before = _snapshot(user)
    assert cli_main([*argv, "--out", str(user), "--force"]) == 0
    after = _snapshot(user)
    assert {k: v for k, v in after.items() if k in before} == before  # nothing of theirs touched


def test_export_force_replaces_only_an_export(trained, tmp_path, capsys):
    pytest.importorskip("transformers")
    out = tmp_path / "exp"
    assert cli_main(["export", str(trained), "--out", str(out)]) == 0
    (out / "README.md").write_text("my notes")
    (out / "README.md").chmod(0o600)
    assert cli_main(["export", str(trained), "--out", str(out)]) == 2
    assert "add --force" in capsys.readouterr().err
    (out / "notes.txt").write_text("beside")  # a file of the user's the export never writes
    before = _snapshot(out)
    # README.md is the model card the export writes: the user's edit is refused, nothing written
    assert cli_main(["export", str(trained), "--out", str(out), "--force"]) == 2
    assert "README.md" in capsys.readouterr().err
    assert _snapshot(out) == before
    assert (out / "README.md").read_text() == "my notes"
    assert stat.S_IMODE((out / "README.md").stat().st_mode) == 0o600  # not chmodded
    (out / "README.md").rename(tmp_path / "my-notes.md")  # the user moves it out: replaced
    (out / "config.json").write_text((out / "config.json").read_text())  # same bytes: ours
    assert cli_main(["export", str(trained), "--out", str(out), "--force"]) == 0
    assert "taperlm" in (out / "README.md").read_text()
    assert (out / "notes.txt").read_text() == "beside"
    assert not [p for p in out.iterdir() if p.name.startswith(".taperlm-export-tmp")]
    user = make_folder(tmp_path, "user")
    before = _snapshot(user)
    assert cli_main(["export", str(trained), "--out", str(user), "--force"]) == 2
    assert _snapshot(user) == before


def test_train_continues_its_own_run_and_marks_new_ones(trained, data, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    assert (run / KINDS["run"].marker).is_file()
    assert cli_main([*H.train_argv(data, run), "--stop-after-steps", "2"]) == 0
    legacy = tmp_path / "legacy"
    shutil.copytree(trained, legacy)
    (legacy / KINDS["run"].marker).unlink()  # a run written before the markers
    assert cli_main([*H.train_argv(data, legacy), "--stop-after-steps", "2"]) == 0


def test_trainer_refuses_a_foreign_folder_for_library_callers(trained, tmp_path):
    """compare cells and library users reach the trainer without the CLI's check."""
    from taperlm.config import load_run_config
    from taperlm.training.loop import train

    user = make_folder(tmp_path, "user")
    before = _snapshot(user)
    with raises_naming(ConfigError, str(user), "new or empty folder"):
        train(load_run_config(trained / "config.yaml"), user)
    assert _snapshot(user) == before


def test_export_records_its_files_and_force_replaces_only_those(trained, tmp_path, capsys):
    """The marker records every file the export wrote with its sha256; --force removes files
    of the earlier export that it no longer writes only while unchanged, and an export without
    a record (written before it existed) gets nothing replaced."""
    pytest.importorskip("transformers")
    import json

    from taperlm.files.io import sha256_file

    out = tmp_path / "exp"
    assert cli_main(["export", str(trained), "--out", str(out)]) == 0
    marker = out / KINDS["export"].marker
    files = json.loads(marker.read_text())["files"]
    on_disk = {p.name for p in out.iterdir()} - {marker.name}
    assert set(files) == on_disk and "README.md" in files
    assert all(files[n] == [sha256_file(out / n)] for n in files)
    # two files of an earlier export that this one no longer writes: one unchanged, one edited
    for name in ("old-a.bin", "old-b.bin"):
        (out / name).write_text(name)
        files[name] = [sha256_file(out / name)]
    marker.write_text(json.dumps({"files": files}))
    (out / "old-b.bin").write_text("edited by the user")
    assert cli_main(["export", str(trained), "--out", str(out), "--force"]) == 0
    assert (
        not (out / "old-a.bin").exists() and (out / "old-b.bin").read_text() == "edited by the user"
    )
    # an export from before the record: no file is known to be ours, nothing is replaced
    marker.write_text("written by taperlm (a `taperlm export` folder)\n")
    before = _snapshot(out)
    capsys.readouterr()
    assert cli_main(["export", str(trained), "--out", str(out), "--force"]) == 2
    assert "config.json" in capsys.readouterr().err
    assert _snapshot(out) == before


# ----------------------------------------------------------------------------------------------
# issue 41, class 7: a rerun replaces only the files it wrote that nobody edited since


@pytest.mark.unit
def test_every_folder_kind_says_how_a_rerun_treats_its_files():
    """Every kind of folder a command writes is in REWRITES: either its files are installed
    (`install_files`, replaced only while unchanged) or it is the command's own state."""
    from taperlm.files.outdirs import REWRITES

    assert set(REWRITES) == set(KINDS)
    assert {k for k, v in REWRITES.items() if v == "install"} == {"export", "lm-eval-tasks"}


def _write_tasks(out: Path, data_dir: Path, tasks: list[str]) -> int:
    argv = ["eval", "--write-lm-eval-tasks", str(out), "--tasks", ",".join(tasks)]
    return cli_main([*argv, "--data-dir", str(data_dir)])


def test_lm_eval_tasks_rerun_keeps_edited_files(tmp_path, capsys, monkeypatch):
    """A task YAML the user edited is refused by name on a rerun, nothing is written; an
    unedited folder is rewritten; tasks written earlier (not in this run's --tasks) are kept."""
    from eval_helpers import write_eval_files

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    data_dir = write_eval_files(tmp_path / "data")
    out = tmp_path / "tasks"
    assert _write_tasks(out, data_dir, ["piqa", "arc_easy"]) == 0
    yaml_file = out / "taperlm_piqa.yaml"
    assert yaml_file.is_file() and (out / "data" / "arc_easy.jsonl").is_file()
    assert _write_tasks(out, data_dir, ["piqa"]) == 0  # unchanged: rewritten
    assert (out / "taperlm_arc_easy.yaml").is_file()  # an earlier task is kept
    yaml_file.write_text(yaml_file.read_text() + "# tuned by the user\n")
    before = _snapshot(out)
    capsys.readouterr()
    assert _write_tasks(out, data_dir, ["piqa"]) == 2
    err = capsys.readouterr().err
    assert "taperlm_piqa.yaml" in err and "--write-lm-eval-tasks" in err, err
    assert _snapshot(out) == before
    assert _write_tasks(out, data_dir, ["arc_easy"]) == 0  # other files are still replaceable
    assert yaml_file.read_text().endswith("# tuned by the user\n")

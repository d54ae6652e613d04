"""Issue 26, class 2 for named output files: a command writes a new file or replaces one that
taperlm wrote (its mark inside the file's own format), never a file of the user's -- `--force`
included -- and never writes through or replaces a symbolic link.

Every file output of every command (found by walking the parsers, checked against
`taperlm.files.outfiles.OUTPUT_FILES`) is tried with every state of its path: new, a taperlm file of
its format, a taperlm file of another format, a user's file, a folder, a link to a taperlm file,
to a user's file and a dangling link -- with and without --force where the command has one. A
refused case ends at once with exit code 2 and a line naming the option and leaves every byte
and mode as it was; an accepted one gets past the check (the command then stops on its missing
inputs, so nothing is written either).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from taperlm.cli import COMMANDS, build_parser, subcommand_parser
from taperlm.cli import main as cli_main
from taperlm.files.outfiles import (
    FORCE_TO_REPLACE,
    GGUF_KEY,
    OUTPUT_FILES,
    WRITTEN_BY,
    json_mark,
    written_by_taperlm,
    yaml_mark,
)
from taperlm.spec.domains import PathArg


def _file_options() -> list[tuple[str, str]]:
    found = []
    for cmd in COMMANDS:
        for a in subcommand_parser(build_parser(), cmd)._actions:
            t = a.type
            if isinstance(t, PathArg) and t.role == "output" and (t.kind == "file" or t.kind_of):
                found.append((cmd, a.option_strings[0]))
    return sorted(found)


FILES = _file_options()


@pytest.mark.unit
def test_every_file_output_has_a_format():
    assert sorted(OUTPUT_FILES) == FILES


def _png(path: Path, mark: bool) -> None:
    from matplotlib.figure import Figure

    from taperlm.files.outfiles import png_metadata

    fig = Figure(figsize=(1, 1))
    fig.subplots().plot([0, 1])
    fig.savefig(path, format="png", metadata=png_metadata() if mark else None)


def _gguf(path: Path, mark: bool) -> None:
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("x")
    w.add_token_list(["a", "b"])  # an array before the mark: the scan skips it
    if mark:
        w.add_string(GGUF_KEY, f"{WRITTEN_BY} export")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_own(path: Path, fmt: str, mark: bool = True) -> None:
    """A file of format `fmt` as taperlm writes it (`mark=False`: the same without the mark)."""
    if fmt == "json":
        path.write_text(json.dumps(json_mark({"a": 1}, "x") if mark else {"a": 1}))
    elif fmt == "yaml":
        path.write_text(yaml_mark("a: 1\n", "x") if mark else "a: 1\n")
    elif fmt == "png":
        _png(path, mark)
    elif fmt == "gguf":
        _gguf(path, mark)
    else:
        path.write_text("text\n")


OTHER = {"json": "yaml", "yaml": "json", "png": "json", "gguf": "png", "text": "json"}


@pytest.mark.unit
def test_the_marks_are_read_by_format(tmp_path):
    """Each reader finds its mark and nothing else: the same file without it, another format's
    marked file, a user's bytes."""
    for fmt in ("json", "yaml", "png", "gguf"):
        own, bare, other = tmp_path / f"own.{fmt}", tmp_path / f"bare.{fmt}", tmp_path / "o"
        write_own(own, fmt)
        write_own(bare, fmt, mark=False)
        write_own(other, OTHER[fmt])
        assert written_by_taperlm(own, fmt), fmt
        assert not written_by_taperlm(bare, fmt), fmt
        assert not written_by_taperlm(other, fmt), fmt
        (tmp_path / "user").write_bytes(b"\x89PNG\r\n\x1a\nGGUF{# written by")
        assert not written_by_taperlm(tmp_path / "user", fmt)


@pytest.mark.unit
def test_the_real_writers_mark_their_files(tmp_path):
    from taperlm.analysis.plots import plot_width_profiles

    png = plot_width_profiles({"u": [4, 4]}, 4, tmp_path / "w.png")
    assert written_by_taperlm(png, "png")
    assert cli_main(["plan", "--preset", "transformer-tiny", "--plot", str(png)]) == 0
    assert written_by_taperlm(png, "png")  # its own plot is replaced (and marked again)


STATES = ["new", "own", "own-other-format", "user", "folder", "link-own", "link-user", "dangling"]


def _argv(cmd: str, option: str, value: Path, tmp: Path) -> list[str]:
    """`cmd` with its required arguments pointing at missing inputs (the output check comes
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
    if cmd == "export":
        argv += ["--format", "gguf"]
    return [*argv, option, str(value)]


def _snapshot(root: Path) -> dict[str, tuple[str, int]]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = (f"-> {os.readlink(p)}", 0)
        elif p.is_file():
            out[rel] = (p.read_bytes().hex(), stat.S_IMODE(p.stat().st_mode))
        else:
            out[rel] = ("dir", stat.S_IMODE(p.stat().st_mode))
    return out


def _allowed(state: str, fmt: str, force: bool | None) -> bool:
    if state == "new":
        return True
    if state == "own" and fmt != "text":  # plain text has no mark: never replaced
        return force is not False  # options with --force replace their own only under it
    return False


CASES = [
    (c, o, s, f)
    for c, o in FILES
    for s in STATES
    for f in ((False, True) if (c, o) in FORCE_TO_REPLACE else (None,))
]


@pytest.mark.parametrize(
    ("cmd", "option", "state", "force"),
    CASES,
    ids=[
        f"{c} {o} {s}" + {None: "", False: " no-force", True: " force"}[f] for c, o, s, f in CASES
    ],
)
def test_command_x_file_state(cmd, option, state, force, tmp_path, capsys):
    fmt = OUTPUT_FILES[(cmd, option)]
    root = tmp_path / "root"
    root.mkdir()
    path = root / "out"
    if state in ("own", "link-own"):
        write_own(root / "own", fmt)
    if state == "own-other-format":
        write_own(path, OTHER[fmt])
    if state in ("user", "link-user"):
        (root / "user").write_text("the user's own file\n")
        (root / "user").chmod(0o600)
    if state == "own":
        (root / "own").rename(path)
    elif state == "folder":
        path.mkdir()
        (path / "keep.txt").write_text("kept")
    elif state == "user":
        (root / "user").rename(path)
    elif state.startswith("link") or state == "dangling":
        target = {"link-own": "own", "link-user": "user", "dangling": "gone"}[state]
        path.symlink_to(root / target)
    before = _snapshot(root)
    argv = _argv(cmd, option, path, tmp_path) + (["--force"] if force else [])
    rc = cli_main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert _snapshot(root) == before  # refused, or stopped later on the missing inputs
    refused = err.startswith(f"taperlm {cmd}: error: {option} {path}")
    assert refused != _allowed(state, fmt, force), err
    if refused:
        assert rc == 2, err


def test_every_file_output_may_name_a_new_folder(tmp_path):
    """A file output in folders that do not exist yet (`--out res/new/x.json`) passes the
    argument checks, so every writer must create them: every writer goes through
    `io.atomic_output` (JSON, text, YAML, PNG, GGUF), which does; none may stop with a raw
    FileNotFoundError."""
    from taperlm.analysis.plots import plot_width_profiles
    from taperlm.files.io import atomic_output, atomic_write_json, atomic_write_text

    atomic_write_text(tmp_path / "a" / "b" / "x.txt", "x\n")
    atomic_write_json(tmp_path / "c" / "d" / "x.json", {"x": 1})
    with atomic_output(tmp_path / "e" / "f" / "x.bin") as tmp:
        tmp.write_bytes(b"x")
    png = plot_width_profiles({"u": [4, 4]}, 4, tmp_path / "g" / "h" / "w.png")
    assert written_by_taperlm(png, "png")
    assert (tmp_path / "a/b/x.txt").read_text() == "x\n"
    assert json.loads((tmp_path / "c/d/x.json").read_text()) == {"x": 1}
    assert (tmp_path / "e/f/x.bin").read_bytes() == b"x"
    new = tmp_path / "new" / "deeper" / "blocks.json"
    argv = ["plan", "--preset", "transformer-tiny", "--multiple-of", "256"]
    argv += ["--set", "model.mlp_width=512", "--block-configs"]
    assert cli_main([*argv, str(new)]) == 0
    assert written_by_taperlm(new, "json")

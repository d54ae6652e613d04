"""Class 3 of issue 16: every output path of every command is checked before the work starts.

The output options are found by walking every subcommand's parser (`taperlm.spec.domains.output_path`
marks them; `input_path` marks what a command reads). Each is tried with every bad kind of path:
empty, a file where a folder is expected or the reverse, a path below a file, a place where no
file can be created, and the path of one of the command's own inputs (the run dir itself, the
data dir, the config file). Every case must end at once with exit code 2 and one line naming
the option, and leave every existing file untouched and nothing new on disk.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import fault_harness as H
from conftest import assert_own_options
from taperlm.cli import COMMANDS, build_parser, subcommand_parser
from taperlm.cli import main as cli_main
from taperlm.spec.domains import PathArg

pytestmark = pytest.mark.unit


def _options(role: str) -> list[tuple[str, str, str]]:
    """(command, option, kind) of every path option with `role` (output | input)."""
    parser = build_parser()
    out = []
    for cmd in COMMANDS:
        for a in subcommand_parser(parser, cmd)._actions:
            if isinstance(a.type, PathArg) and a.type.role == role:
                name = a.option_strings[0] if a.option_strings else a.dest
                out.append((cmd, name, a.type.kind))
    return out


OUTPUTS = _options("output")
INPUTS = _options("input")
KINDS = ("empty", "wrong_kind", "below_a_file", "unwritable", "an_input")


def test_every_command_with_outputs_is_covered():
    """Every command that writes has its outputs declared (prepare, train, eval, export, compare,
    novelty, generate: --out; plan/novelty: --plot; eval: --write-lm-eval-tasks)."""
    cmds = {c for c, _, _ in OUTPUTS}
    assert cmds == {c for c in COMMANDS}
    assert {(c, o) for c, o, _ in OUTPUTS} >= {
        (c, "--out") for c in ("prepare", "train", "eval", "export", "compare", "novelty")
    } | {("generate", "--out"), ("plan", "--plot"), ("eval", "--write-lm-eval-tasks")}


PATH_LIKE = re.compile(
    r"(^|_)(out|output|plot|save|write|dump|dir|path|file|json|report|log)(_|s?$)"
)


def test_options_named_like_paths_are_declared():
    """An option whose name says it is a path (--out, --report-dir, --save-json, ...) is declared
    with output_path or input_path, so a new one cannot escape the checks by its type."""
    parser = build_parser()
    undeclared = [
        f"{cmd} {a.option_strings[0] if a.option_strings else a.dest}"
        for cmd in COMMANDS
        for a in subcommand_parser(parser, cmd)._actions
        if a.nargs != 0 and PATH_LIKE.search(a.dest) and not isinstance(a.type, PathArg)
    ]
    assert not undeclared, f"declare these with output_path/input_path: {undeclared}"


def _unwritable_folder(tmp: Path) -> Path:
    """A folder in which this process cannot create files: a read-only folder, or (as root,
    where permission bits do not stop writes) /proc, which refuses new entries."""
    ro = tmp / "readonly"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        (ro / "probe").touch()
    except OSError:
        return ro
    (ro / "probe").unlink()
    return Path("/proc")


def _argv(cmd: str, option: str, value: str, tmp: Path, inputs: dict[str, str]) -> list[str]:
    """`cmd` with its required arguments (missing paths under tmp unless given in `inputs`)
    and `option value`."""
    argv = [cmd]
    for a in subcommand_parser(build_parser(), cmd)._actions:
        name = a.option_strings[0] if a.option_strings else a.dest
        if name == option:
            continue
        if not a.option_strings and (a.nargs != "?" or name in inputs):
            argv.append(inputs.get(name, str(tmp / "absent" / a.dest)))
        elif a.option_strings and (a.required or name in inputs):
            argv += [name, inputs.get(name, str(tmp / "absent" / a.dest))]
    return [*argv, f"{option}={value}" if option.startswith("-") else value]


def _cases() -> list[tuple[str, str, str, str, str | None]]:
    cases = []
    for cmd, opt, kind in OUTPUTS:
        for bad in KINDS:
            if bad == "an_input":
                for c, inp, _ in INPUTS:
                    if c == cmd:
                        cases.append((cmd, opt, kind, bad, inp))
            else:
                cases.append((cmd, opt, kind, bad, None))
    return cases


CASES = _cases()


@pytest.mark.parametrize(
    ("cmd", "option", "kind", "bad", "inp"),
    CASES,
    ids=[f"{c} {o} {b}" + (f" {i}" if i else "") for c, o, _, b, i in CASES],
)
def test_bad_output_path_stops_before_work(cmd, option, kind, bad, inp, tmp_path, capsys):
    tmp = tmp_path
    inputs: dict[str, str] = {}
    if bad == "empty":
        value = ""
    elif bad == "wrong_kind":  # a file where a folder is expected, or the reverse
        if kind == "dir":
            value = str(tmp / "a_file")
            Path(value).write_text("precious")
        else:
            value = str(tmp / "a_folder")
            Path(value).mkdir()
            (Path(value) / "kept.txt").write_text("precious")
    elif bad == "below_a_file":
        (tmp / "a_file").write_text("precious")
        value = str(tmp / "a_file" / "out")
    elif bad == "unwritable":
        value = str(_unwritable_folder(tmp) / "out")
    else:  # the path of one of the command's inputs (the run dir itself, the data dir, ...)
        target = tmp / "the_input"
        if kind == "dir":
            target.mkdir()
            (target / "kept.txt").write_text("precious")
        else:
            target.write_text("precious")
        value = inputs[inp] = str(target)
    before = H.snapshot(tmp)
    argv = _argv(cmd, option, value, tmp, inputs)
    try:
        rc = cli_main(argv)
    except SystemExit as exc:  # argparse itself: would print usage, not one line
        pytest.fail(f"argparse exit {exc.code} for {argv}")
    err = capsys.readouterr().err
    assert rc == 2, (argv, err)
    assert err.startswith(f"taperlm {cmd}: error: {option}"), err
    assert_own_options(cmd, err)
    assert err.count("\n") == 1, err
    assert H.snapshot(tmp) == before
    assert not (tmp / "absent").exists()
    leftovers = [p.name for p in tmp.rglob(".taperlm-probe-*")]
    assert not leftovers


def test_good_output_paths_pass_the_check(tmp_path):
    """The check refuses nothing legitimate: a new path in a writable folder, an existing empty
    folder, an existing file to be replaced, a missing parent chain."""
    from taperlm.spec.domains import check_output

    (tmp_path / "empty").mkdir()
    (tmp_path / "old.json").write_text("{}")
    check_output(tmp_path / "new", "dir", "--out")
    check_output(tmp_path / "empty", "dir", "--out")
    check_output(tmp_path / "old.json", "file", "--out")
    check_output(tmp_path / "a" / "b" / "c.json", "file", "--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "old.json"]


def test_eval_out_folder_fails_before_loading_the_model(tmp_path, capsys, monkeypatch):
    """The issue's example: `eval RUN --out FOLDER` used to evaluate for an hour and then die
    with IsADirectoryError; now nothing is loaded."""
    import taperlm.checkpoint.loading

    def boom(*a, **k):
        raise AssertionError("the model was loaded before the output path was checked")

    monkeypatch.setattr(taperlm.checkpoint.loading, "load_any", boom)
    (tmp_path / "results").mkdir()
    rc = cli_main(["eval", str(tmp_path), "--out", str(tmp_path / "results"), "--device", "cpu"])
    assert rc == 2
    assert "--out" in capsys.readouterr().err and os.listdir(tmp_path / "results") == []

"""The benchmark scripts never write over a file they did not write (the project's rule for every
command, benchmarks/outputs.py): every output option of every script refuses a user's file when
the arguments are parsed, before any work, and leaves it as it was; what they write carries a
stamp, so a rerun replaces its own results; every other place a script writes or deletes a file
is listed here with the reason it is safe (a temporary folder, the repository's own outputs)."""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import os
import sys
from pathlib import Path

import pytest

from conftest import assert_naming, raises_naming

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in ("common", "outputs"))
OUTPUT_OPTIONS = ("--json", "--plot", "--png", "--md", "--csv", "--out", "--report-file")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module
    finally:
        sys.path.remove(str(BENCH))


def _calls(name: str):
    """(function, call name, line, call node) of every call in benchmarks/<name>.py."""
    tree = ast.parse((BENCH / f"{name}.py").read_text(encoding="utf-8"))
    owner: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for sub in ast.walk(node):
                owner.setdefault(id(sub), node.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            yield owner.get(id(node), "<module>"), called, node.lineno, node


def _output_options(name: str) -> dict[str, str | None]:
    """{option: the name of its `type=`} for the output options a script declares."""
    out: dict[str, str | None] = {}
    for _, called, _, node in _calls(name):
        if called != "add_argument" or not node.args:
            continue
        first = node.args[0]
        if isinstance(first, ast.Constant) and first.value in OUTPUT_OPTIONS:
            kind = next((k.value for k in node.keywords if k.arg == "type"), None)
            out[first.value] = getattr(kind, "id", getattr(kind, "attr", None))
    return out


@pytest.mark.unit
def test_every_output_option_is_checked_when_parsed():
    """Enumerated from the sources: every output file option of every script (and of
    common.add_gpu_benchmark_arguments) has type=output_file; the one output folder option
    (compare_precision --out) is checked by outputs.folder_problem."""
    seen = {}
    for name in [*SCRIPTS, "common"]:
        for option, kind in _output_options(name).items():
            seen[(name, option)] = kind
    assert seen, "no output options found: the scan is broken"
    folders = {
        ("compare_precision", "--out"),
        ("wsd_first_look", "--out"),
        ("behaviour_snapshot", "--out"),
    }
    for key, kind in seen.items():
        assert kind == ("Path" if key in folders else "output_file"), key
    for name, _ in folders:
        assert any(called == "folder_problem" for _, called, _, _ in _calls(name)), name


# Every other write or delete in a script, and why it cannot touch a user's file.
ALLOWED_WRITES = {
    ("behaviour_snapshot", "prepare_items", "write_text"): "corpora in its temporary folder",
    ("behaviour_snapshot", "eval_files", "write_text"): "task files in its temporary folder",
    ("compare_precision", "_smoke_args", "write_text"): "the toy corpus, in its claimed --out",
    ("docs_numbers", "write", "write_text"): "regenerates the numbers in the repository's docs",
    ("families", "_reset_peak_rss", "open"): "/proc/self/clear_refs (a kernel control file)",
    ("gpu", "synthetic_corpus", "write_text"): "a corpus in its own temporary folder",
    ("gpu", "taper_section", "rmtree"): "its own temporary folder",
    ("gpu", "cells_section", "rmtree"): "its own temporary folder",
    ("scale", "run_row", "rmtree"): "its own temporary folder",
    ("prepare_scale", "memory", "unlink"): "inputs it made in its temporary folder",
    ("prepare_scale", "reader", "unlink"): "inputs it made in its temporary folder",
    ("prepare_scale", "make_input", "open"): "inputs it makes in its temporary folder",
    ("prepare_scale", "main", "write_text"): "benchmarks/results (the repository's own)",
    ("ratio_measurements", "main", "write_text"): "src/taperlm/spec/ratio_measurements.json, the "
    "package's copy of the measurements, which only this script writes",
    ("trend_all_points", "main", "write_text"): "benchmarks/results/trend_all_points.json and "
    ".md (the repository's own, which only this script writes)",
    ("trend_all_points", "main", "copyfile"): "its figures into docs/img/all-points-*.png (the "
    "repository's own, which only this script writes)",
}
WRITERS = {"write_text", "write_bytes", "savefig", "dump", "unlink", "rmtree", "rename", "move",
           "remove", "rmdir", "chmod", "copy", "copyfile", "copytree"}  # fmt: skip


def _is_write(called: str | None, node: ast.Call) -> bool:
    if called == "open":
        mode = node.args[1] if len(node.args) > 1 else None
        mode = mode or next((k.value for k in node.keywords if k.arg == "mode"), None)
        return isinstance(mode, ast.Constant) and any(c in str(mode.value) for c in "wax+")
    if called == "replace" and isinstance(node.func, ast.Attribute):  # os.replace, not str's
        return getattr(node.func.value, "id", None) == "os"
    return called in WRITERS


@pytest.mark.unit
def test_every_other_write_is_listed_with_its_reason():
    found = {
        (name, func, called)
        for name in [*SCRIPTS, "common"]
        for func, called, _, node in _calls(name)
        if _is_write(called, node)
    }
    assert found == set(ALLOWED_WRITES), sorted(found ^ set(ALLOWED_WRITES))


def _user_file(tmp_path: Path) -> tuple[Path, bytes]:
    p = tmp_path / "mine.json"
    p.write_text('{"precious": true}\n')
    return p, p.read_bytes()


FILE_OPTIONS = [
    *sorted(
        (name, option)
        for name in SCRIPTS
        for option, kind in _output_options(name).items()
        if kind == "output_file"
    ),
    ("gpu", "--json"),  # these two from common.add_gpu_benchmark_arguments
    ("scale", "--json"),
]


@pytest.mark.parametrize(("name", "option"), FILE_OPTIONS, ids=[" ".join(c) for c in FILE_OPTIONS])
def test_a_users_file_is_refused_before_any_work(name, option, bench, tmp_path, monkeypatch):
    mine, before = _user_file(tmp_path)
    module = bench(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py"])
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as stop:
        module.main([option, str(mine)])
    assert stop.value.code == 2
    assert_naming(err.getvalue(), str(mine), "choose a new path")
    assert mine.read_bytes() == before


def test_what_a_benchmark_writes_it_may_replace(bench, tmp_path):
    outputs, common = bench("outputs"), bench("common")
    p = common.write_json("x", {"rows": [1]}, tmp_path / "r.json")
    assert json.loads(p.read_text()) == {"written_by": outputs.STAMP, "rows": [1]}
    assert outputs.output_problem(p) is None
    common.write_json("x", {"rows": [2]}, p)  # a rerun replaces its own
    assert json.loads(p.read_text())["rows"] == [2]
    mine, before = _user_file(tmp_path)
    with raises_naming(SystemExit, str(mine), "choose a new path"):
        common.write_json("x", {"rows": [3]}, mine)  # the library path refuses too
    assert mine.read_bytes() == before
    # a PNG carries the stamp in its metadata
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, _ = plt.subplots()
    png = outputs.save_figure(fig, tmp_path / "f.png")
    plt.close(fig)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and outputs.is_ours(png)
    # the repository's own output folders hold the scripts' committed results
    assert outputs.is_ours(outputs.RESULTS_DIR / "anything.json")
    assert outputs.is_ours(outputs.RESULTS_DIR.parents[1] / "docs" / "img" / "robustness.png")
    # a folder where a file goes, a dangling link
    assert_naming(outputs.output_problem(tmp_path), str(tmp_path), str(tmp_path / "results.json"))
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    assert_naming(outputs.output_problem(tmp_path / "dangling"), "dangling", str(tmp_path / "gone"))
    # a link to a user's file is the user's file; one to ours is written through, link kept
    (tmp_path / "link.json").symlink_to(mine)
    assert_naming(outputs.output_problem(tmp_path / "link.json"), "link.json", "choose a new path")
    (tmp_path / "ours.json").symlink_to(p)
    common.write_json("x", {"rows": [4]}, tmp_path / "ours.json")
    assert (tmp_path / "ours.json").is_symlink() and json.loads(p.read_text())["rows"] == [4]


@pytest.mark.unit
def test_compare_precision_fills_only_its_own_folders(bench, tmp_path):
    outputs, cp = bench("outputs"), bench("compare_precision")
    assert outputs.folder_problem(tmp_path / "new") is None
    (tmp_path / "empty").mkdir()
    assert outputs.folder_problem(tmp_path / "empty") is None
    user = tmp_path / "user"
    user.mkdir()
    (user / "precision.md").write_text("my notes")
    (user / "text.txt").write_text("my text")
    snapshot = {p.name: p.read_bytes() for p in user.iterdir()}
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as stop:
        cp.main(["--smoke", "--out", str(user)])
    assert stop.value.code == 2
    assert_naming(err.getvalue(), str(user), "new or empty folder")
    assert {p.name: p.read_bytes() for p in user.iterdir()} == snapshot
    claimed = outputs.claim_folder(tmp_path / "claimed")
    (claimed / "data").mkdir()  # an interrupted run: claimed before anything else
    assert outputs.folder_problem(claimed) is None
    earlier = tmp_path / "earlier"  # filled before folders were claimed
    earlier.mkdir()
    (earlier / "precision.json").write_text(json.dumps({"candidates": {}, "target": 0.012}))
    assert outputs.folder_problem(earlier, cp._earlier_run) is None
    assert_naming(outputs.folder_problem(user / "text.txt"), str(user / "text.txt"), "folder")


def test_no_script_imports_torch_for_the_output_rules():
    """prepare_scale.py measures memory without torch: outputs.py must not pull it in."""
    src = (BENCH / "outputs.py").read_text(encoding="utf-8")
    assert "import torch" not in src
    env = {**os.environ, "PYTHONPATH": str(BENCH)}
    import subprocess

    code = "import sys, outputs; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)

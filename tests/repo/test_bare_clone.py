"""A fresh clone with nothing beside it: what the repository ships must stand alone.

- tests see ../shared/data only through the `shared_data` fixture (conftest gives those tests the
  `shared` marker and runs every other test with the lookup off; .ci/run runs the `shared` tests
  again in a bare copy, where they must skip cleanly);
- code, docs and reports cite only files of the repository, never the maintainers' notes beside
  it (PAPER.md, DESIGN.md, shared/data/README.md).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from taperlm.evaluation.locate import EVAL_DATA_ENV, NO_EVAL_DATA, eval_data_dir, wikitext_test

REPO = Path(__file__).resolve().parents[2]
OUTSIDE = re.compile(r"\b(PAPER|DESIGN)\.md\b|shared/data/README|shared/reference")
# How a test could reach ../shared other than through the fixture.
REACH = re.compile(r"[\"']shared[\"']|eval_data_dir\(|wikitext_test\(|_default_dirs\(")


def _shipped_files() -> list[Path]:
    files = [REPO / "README.md"]
    for folder in ("src", "docs", "benchmarks", "configs", "tests"):
        files += [p for p in (REPO / folder).rglob("*") if p.suffix in {".py", ".md", ".yaml"}]
    return [p for p in files if p.is_file() and p != Path(__file__)]


def test_nothing_cites_files_outside_the_repository():
    cites = [
        f"{p.relative_to(REPO)}:{i}"
        for p in _shipped_files()
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not cites, f"citations of files that are not in the repository: {cites}"


def test_tests_reach_shared_data_only_through_the_fixture():
    allowed = {"conftest.py", "test_readme.py", Path(__file__).name}
    reach = [
        f"{p.name}:{i}"
        for p in sorted((REPO / "tests").rglob("*.py"))
        if p.name not in allowed
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if REACH.search(line)
    ]
    assert not reach, f"use the `shared_data` fixture to read ../shared/data: {reach}"


def test_unmarked_tests_see_no_evaluation_data(monkeypatch):
    """This test has no `shared` marker: the library finds no evaluation data here, nor in the
    commands it starts, even where ../shared/data lies beside the checkout."""
    assert eval_data_dir() is None
    with pytest.raises(Exception, match="not found"):
        wikitext_test()
    code = "from taperlm.evaluation.locate import eval_data_dir; print(eval_data_dir())"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "None"
    monkeypatch.setenv(EVAL_DATA_ENV, NO_EVAL_DATA)  # the documented way to turn it off
    assert eval_data_dir() is None


def test_shared_tests_are_marked(request, shared_data):
    assert request.node.get_closest_marker("shared") is not None
    assert shared_data.is_dir() and shared_data == eval_data_dir()

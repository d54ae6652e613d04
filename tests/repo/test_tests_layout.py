"""The tests' own layout: one folder per feature under tests/, shared helpers beside conftest.py,
module names unique across the folders (conftest puts every folder on sys.path and modules import
each other by name), and a `unit` lane that collects and runs without torch."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def _modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.unit
def test_module_names_are_unique_across_the_areas():
    counts = Counter(p.name for p in _modules())
    twice = {name: n for name, n in counts.items() if n > 1}
    assert not twice, f"test modules import each other by name, so each name is used once: {twice}"


@pytest.mark.unit
def test_every_test_module_sits_in_an_area_folder():
    at_root = [p.name for p in TESTS.glob("test_*.py")]
    assert not at_root, f"put these into the folder of the feature they test: {at_root}"
    deeper = [str(p.relative_to(TESTS)) for p in _modules() if len(p.relative_to(TESTS).parts) > 2]
    assert not deeper, f"one level of area folders only: {deeper}"


def test_the_unit_lane_collects_without_torch():
    """`-m unit` collects only modules with a unit mark and blocks torch (conftest.py); a unit
    module that imports torch at its top fails here, before anyone runs the lane."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *sys.path])}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "unit", "--collect-only", "-q",
         "-p", "no:cacheprovider", "tests"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    assert len(ids) > 1000, out.stdout[-2000:]
    assert "tests/taper/test_taper.py::" in out.stdout

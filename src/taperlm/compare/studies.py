"""The registry of studies: every mode of `taperlm compare`, registered here under its `--paper`
name (`COMPARISON`: without --paper), and `run_study`, which runs the one asked for by the
skeleton of `taperlm.compare.study`. A new mode is one function returning a `StudyPlan`,
declared with its name in `taperlm.compare.options.PAPER_STUDIES` (the one list of the modes,
torch-free: it is also `--paper`'s choices) or registered with `@study(NAME)`;
tests/compare/test_compare_studies.py registers a toy one and runs it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from taperlm.compare.options import PAPER_MODES, PAPER_STUDIES, CompareOptions
from taperlm.compare.study import COMPARISON, Study, run_plan, single
from taperlm.errors import ConfigError


def _study_at(ref: str) -> Study:
    """The study function a "module:function" reference of `PAPER_STUDIES` names."""
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


# name -> study: the plain comparison, then the --paper modes in the order --help lists them.
STUDIES: dict[str, Study] = {
    COMPARISON: single,
    **{name: _study_at(ref) for name, ref in PAPER_STUDIES.items()},
}


def study(name: str) -> Callable[[Study], Study]:
    """Register the decorated function as the study `name` (`--paper NAME`)."""

    def register(fn: Study) -> Study:
        STUDIES[name] = fn
        return fn

    return register


def run_study(opts: CompareOptions) -> tuple[Path, Path]:
    """Run the study of `opts.paper` (None: the plain comparison); returns (report.md,
    report.json)."""
    name = opts.paper or COMPARISON
    if name not in STUDIES:
        raise ConfigError(f"--paper {name!r} is unknown; choose from {', '.join(PAPER_MODES)}")
    return run_plan(opts, STUDIES[name])

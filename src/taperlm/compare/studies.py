"""The registry of studies: every mode of `taperlm compare`, registered here under its `--paper`
name (`COMPARISON`: without --paper), and `run_study`, which runs the one asked for by the
skeleton of `taperlm.compare.study`. A new mode is one function returning a `StudyPlan`,
registered with `@study(NAME)` and named among `--paper`'s choices
(`taperlm.compare.options.PAPER_MODES`); tests/compare/test_compare_studies.py registers a toy one and
runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from taperlm.compare.families import families_plan
from taperlm.compare.longrun import longrun_plan
from taperlm.compare.options import PAPER_MODES, CompareOptions
from taperlm.compare.scaling import scaling_plan
from taperlm.compare.study import COMPARISON, Study, run_plan, single
from taperlm.errors import ConfigError

# name -> study: the plain comparison, then the --paper modes in the order --help lists them.
STUDIES: dict[str, Study] = {
    COMPARISON: single,
    "controlled": single,  # §3's grid, one comparison (taperlm.compare.grid.paper_allocations)
    "sweep": single,  # §4's grid, one comparison
    "families": families_plan,  # §6's table: one comparison per family
    "scaling": scaling_plan,  # the ratio sweep at (size, tokens) points, the fitted best ratio
    "tokens": longrun_plan,  # that sweep over tokens per parameter, with the trends
    "ratios": longrun_plan,  # that sweep past 1.9 -> 0.1, with the trends
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

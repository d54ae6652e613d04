"""`taperlm compare`: train width allocations x seeds at one budget and report the difference.

    taperlm compare --out cmp                                   # defaults: see docs/compare.md
    taperlm compare --preset transformer-small --tapers 'uniform;cosine:1.5:0.5' --seeds 5 \\
        --tokens 2000000 --data data/default --out cmp-small
    taperlm compare --paper controlled --out cmp-paper          # the paper's controlled grid
    taperlm compare --tapers 'uniform;cosine;novelty:pilot;cosine+heads:cosine:1.25:0.75' \\
        --out cmp-beyond                                        # beyond the paper
    taperlm compare --paper families --out cmp-families         # the paper's family table, tiny presets
    taperlm compare --paper scaling --out cmp-scaling           # best ratio vs size (~3.3 h)
    taperlm compare --paper tokens --out cmp-tokens             # advantage vs training length
    taperlm compare --paper ratios --out cmp-ratios             # the sweep past 1.9 -> 0.1

Parses the arguments and runs the study of `--paper` (none: the plain comparison) with
`taperlm.compare.study.run_study`: every mode is a study registered there. The options, their
domains and defaults are declared once in `taperlm.compare.options`; the training recipe and the precedence of settings in
`taperlm.compare.comparison`; the default corpus cache in `taperlm.compare.comparison`. No torch import
here.
"""

from __future__ import annotations

import argparse

from taperlm.commands.common import add_logger_argument, add_model_arguments, logger_names
from taperlm.compare.options import (
    DEFAULT_PRESET,
    PAPER_MODE_PRESET,
    add_option_arguments,
    options_from,
)
from taperlm.config import env_overrides


def add_arguments(parser: argparse.ArgumentParser) -> None:
    default = f"{DEFAULT_PRESET} (--paper controlled/sweep: {PAPER_MODE_PRESET})"
    add_model_arguments(parser, taper=False, default_preset=default)
    add_option_arguments(parser)  # declared once, with their domains: CompareOptions
    add_logger_argument(parser)  # every run its own logged run, all in one group


def run(args: argparse.Namespace) -> int:
    from taperlm.compare.study import run_study  # lazy: torch only once a job runs

    args.loggers = logger_names(args.loggers)
    opts = options_from(args)
    # $TAPERLM_SET joins --set, after it (its layer is above --set: `taperlm.config.assembly`), so the
    # report's reproducing command shows it as --set.
    opts.overrides = [*opts.overrides, *env_overrides()]
    if opts.dry_run:  # the cost, before anything is spent: nothing is created
        from taperlm.compare.study import dry_run  # lazy: torch

        print(dry_run(opts))
        return 0
    from taperlm.compare.execute import PendingCells  # lazy: torch

    try:
        run_study(opts)  # every mode is a study (taperlm.compare.study)
    except PendingCells as pending:  # cells queued on a cluster: rerun to update
        print(f"taperlm compare: {pending}")
    return 0

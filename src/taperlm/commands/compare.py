"""`taperlm compare`: train width allocations x seeds at one budget and report the difference.

    taperlm compare --out cmp                                   # defaults: see docs/compare.md
    taperlm compare --preset transformer-small --tapers 'uniform;cosine:1.5:0.5' --seeds 5 \\
        --tokens 2000000 --data data/default --out cmp-small
    taperlm compare --paper controlled --out cmp-paper          # the paper's controlled grid
    taperlm compare --tapers 'uniform;cosine;novelty:pilot;cosine+heads:cosine:1.25:0.75' \\
        --out cmp-beyond                                        # beyond the paper
    taperlm compare --paper families --out cmp-families         # the paper's family table, tiny presets
    taperlm compare --paper scaling --out cmp-scaling           # best ratio vs size (~3 h)

Parses the arguments and calls `taperlm.compare.job.run_comparison` (`--paper families`:
`taperlm.compare.families.run_families`, one comparison per family; precedence of settings,
the default corpus cache and every default are documented there). No torch import here.
"""

from __future__ import annotations

import argparse
import dataclasses

from taperlm.commands.common import add_logger_argument, add_model_arguments, logger_names
from taperlm.compare.families import DEFAULT_FAMILIES
from taperlm.compare.job import (
    DEFAULT_EVAL_LIMIT,
    DEFAULT_NOVELTY_TOKENS,
    DEFAULT_PRESET,
    DEFAULT_SEEDS,
    DEFAULT_THREADS,
    DEFAULT_TOKENS,
    DEFAULT_VAL_TOKENS,
    PAPER_MODE_SEEDS,
    SCALING_SEEDS,
    CompareOptions,
)
from taperlm.compare.tuning import DEFAULT_TUNE_SEEDS
from taperlm.domains import (
    MAX_COUNT,
    MAX_TOKENS,
    MAX_WORKERS,
    input_path,
    number,
    output_path,
    up_to,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, taper=False, default_preset=DEFAULT_PRESET)
    parser.add_argument(
        "--tapers",
        help="allocations to compare, e.g. 'uniform;cosine:1.5:0.5;groups:1.5,1.0,0.5' "
        "(separate with ';', or with ',' when no spec holds commas; NAME=SPEC names one; "
        "uniform is always added); SPEC+heads:HEAD_SPEC or heads:HEAD_SPEC also tapers the "
        "attention heads; +kv:KV_SPEC (or kv:KV_SPEC alone) the KV heads per layer; "
        "novelty:pilot[:STRENGTH] takes widths from a short uniform pilot run "
        "of each seed [default: uniform;cosine:1.5:0.5]",
    )
    parser.add_argument(
        "--taper",
        dest="taper_list",
        action="append",
        default=[],
        metavar="SPEC",
        help="one allocation (repeatable; alternative to --tapers)",
    )
    parser.add_argument(
        "--paper",
        choices=("controlled", "sweep", "families", "scaling"),
        help="the paper's grids: controlled = uniform / wider-early / wider-middle / wider-late "
        "(3 equal groups, §3); sweep = cosine/linear/sigmoid x 5 ratios + uniform (§4); "
        "families = uniform vs cosine 1.5->0.5 for every family's preset, reported like the "
        "paper's 760M table (§6); scaling = the cosine ratio sweep at 3 sizes x 2 token budgets, "
        "each at its uniform model's tuned lr, with the fitted best ratio per point "
        "(docs/compare.md)",
    )
    parser.add_argument(
        "--preset-size",
        help="--paper families: size of every family's preset (micro, tiny, small, 440m, 760m, 1.3b; "
        "the paper's sizes train with its recipe) [micro]; --paper scaling: a list of sizes "
        "[micro,tiny,small] (440m,760m,1.3b: the GPU experiment, at half and all of the "
        "paper's tokens)",
    )
    parser.add_argument(
        "--families",
        help="--paper families: preset families to compare "
        f"[{','.join(DEFAULT_FAMILIES)}; also titans-mac, titans-mal]",
    )
    parser.add_argument(
        "--seeds",
        type=number(int, up_to(MAX_COUNT)),
        help=f"seeds 0..N-1 [{DEFAULT_SEEDS}; {PAPER_MODE_SEEDS} with --paper, "
        f"{SCALING_SEEDS} with --paper scaling]",
    )
    parser.add_argument(
        "--tokens",
        type=number(int, up_to(MAX_TOKENS)),
        help=f"training tokens per run [default {DEFAULT_TOKENS:,}]",
    )
    parser.add_argument(
        "--data",
        type=input_path(),
        help="data dir from `taperlm prepare` (default: the built-in corpus, prepared once into "
        "the cache)",
    )
    parser.add_argument(
        "--val-tokens",
        type=number(int, up_to(MAX_TOKENS, 0)),
        default=DEFAULT_VAL_TOKENS,
        help=f"validation tokens for the final loss/ppl (0 = whole val split) [{DEFAULT_VAL_TOKENS}]",
    )
    parser.add_argument(
        "--eval-tasks",
        default="none",
        help="tasks after training: none (default), paper (the nine zero-shot tasks), niah "
        "(S-NIAH-1/2/3 at --eval-niah-lengths), all, or a list such as wikitext,piqa,niah_single_1",
    )
    parser.add_argument(
        "--eval-limit",
        type=number(int, up_to(MAX_COUNT, 0)),
        default=DEFAULT_EVAL_LIMIT,
        help=f"first N items per zero-shot task (0 = all) [{DEFAULT_EVAL_LIMIT}]",
    )
    parser.add_argument(
        "--eval-niah-lengths",
        default="",
        help="NIAH lengths in tokens for --eval-tasks niah (default: each cell's context_length)",
    )
    parser.add_argument(
        "--eval-data",
        type=input_path(),
        help="folder laid out like ../shared/data (default: $TAPERLM_EVAL_DATA or ../shared/data)",
    )
    parser.add_argument(
        "--novelty-tokens",
        type=number(int, up_to(MAX_TOKENS, 2)),
        default=DEFAULT_NOVELTY_TOKENS,
        help=f"tokens for the novelty measurement [{DEFAULT_NOVELTY_TOKENS}]",
    )
    parser.add_argument(
        "--novelty-data",
        type=input_path(),
        help="text file for novelty (default: WikiText-2 test from ../shared/data, else the "
        "val split)",
    )
    parser.add_argument(
        "--jobs",
        type=number(int, up_to(MAX_WORKERS)),
        help="cells trained at a time, each in its own worker process (default: as many as "
        "there are idle CPU cores for --threads each; 1 = in this process). Changes the speed, "
        "never the numbers",
    )
    parser.add_argument(
        "--threads",
        type=number(int, up_to(MAX_WORKERS)),
        default=DEFAULT_THREADS,
        help=f"torch CPU threads per cell [{DEFAULT_THREADS}]; more only helps when there are "
        "more idle cores than cells",
    )
    parser.add_argument(
        "--pilot-tokens",
        type=number(int, up_to(MAX_TOKENS)),
        help="training tokens of each novelty:pilot pilot run [default: a quarter of --tokens]",
    )
    parser.add_argument(
        "--tune-lr",
        action="store_true",
        help="each allocation at its own best peak lr: every allocation trained at every "
        "--lr-grid lr on --tune-seeds tuning seeds (disjoint from the reported ones), the lowest "
        "mean val loss chosen, then the reported seeds run at the chosen lrs; reported beside "
        "the shared-lr difference (docs/compare.md)",
    )
    parser.add_argument(
        "--lr-grid",
        help="--tune-lr: the peak lrs to try, e.g. 1e-3,2e-3,4e-3,8e-3 [the recipe's lr x "
        "0.5, 1, 2, 4]",
    )
    parser.add_argument(
        "--tune-seeds",
        type=number(int, up_to(MAX_COUNT)),
        help=f"--tune-lr: tuning seeds per allocation and lr [{DEFAULT_TUNE_SEEDS}]",
    )
    parser.add_argument(
        "--tune-lr-scope",
        dest="tune_scope",
        choices=("each", "uniform"),
        help="--tune-lr: each = every allocation tuned, reported at its own lr beside the "
        "shared lr (default); uniform = only uniform tuned, every allocation trained at its lr",
    )
    parser.add_argument(
        "--out", type=output_path("dir"), required=True, help="output folder (resumable)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_logger_argument(parser)  # every run its own logged run, all in one group


def run(args: argparse.Namespace) -> int:
    from taperlm.compare.families import run_families
    from taperlm.compare.job import run_comparison
    from taperlm.compare.scaling import run_scaling
    from taperlm.config import env_overrides

    args.loggers = logger_names(args.loggers)
    names = [f.name for f in dataclasses.fields(CompareOptions)]
    opts = CompareOptions(**{name: getattr(args, name) for name in names})
    # $TAPERLM_SET joins --set: the report's reproducing command then shows it as --set.
    opts.overrides = [*opts.overrides, *env_overrides()]
    modes = {"families": run_families, "scaling": run_scaling}
    modes.get(opts.paper or "", run_comparison)(opts)
    return 0

"""The command line that reproduces a comparison, every choice explicit (report.json's
`command`; `--paper families` / `scaling` reuse its run arguments per comparison)."""

from __future__ import annotations

import shlex

from taperlm.compare.grid import Grid
from taperlm.compare.options import (
    DEFAULT_TUNE_SEEDS,
    CompareOptions,
    is_main_job,
    list_text,
    model_preset,
    width_step,
)


def canonical_command(opts: CompareOptions, grid: Grid) -> str:
    """A command line that reproduces this comparison (every choice explicit)."""
    parts = ["taperlm", "compare"]
    if opts.config:
        parts += ["--config", str(opts.config)]
    else:
        parts += ["--preset", str(model_preset(opts))]
    if grid.paper:
        parts += ["--paper", grid.paper]
    else:
        specs = [
            a.spec_string if a.label == a.spec_string else f"{a.name}={a.spec_string}"
            for a in grid.allocations
        ]
        parts += ["--tapers", ";".join(specs)]
    step = width_step(opts)
    if step:
        parts += ["--multiple-of", str(step)]
    pilot = grid.pilot and grid.pilot.tokens
    args = run_arguments(opts, len(grid.seeds), grid.base.train.tokens, pilot)
    if is_main_job(opts):
        # the main job's own recipe, which a named --preset does not get: said as --set (before
        # the user's own, which the values already include)
        t = grid.base.train
        main = [f"train.lr={t.lr:g}", f"train.eval_tokens={t.eval_tokens}"]
        main.append(f"train.eval_every={t.eval_every}")
        at = args.index("--tokens") + 2
        args[at:at] = [x for o in main for x in ("--set", o)]
    return shlex.join(parts + args)


def run_arguments(
    opts: CompareOptions, seeds: int, tokens: int, pilot: int | None = None
) -> list[str]:
    """The arguments after the model and allocations in a reproducing command line (`pilot`:
    the pilot runs' tokens, when the grid has novelty:pilot allocations)."""
    parts = ["--seeds", str(seeds), "--tokens", str(tokens)]
    if opts.first_seed:
        parts[2:2] = ["--first-seed", str(opts.first_seed)]
    if opts.data is not None:
        parts += ["--data", str(opts.data)]
    for o in opts.overrides:
        parts += ["--set", o]
    parts += ["--val-tokens", str(opts.val_tokens), "--eval-tasks", list_text(opts.eval_tasks)]
    if opts.eval_tasks not in ((), ("none",)):
        parts += ["--eval-limit", str(opts.eval_limit)]
    if opts.eval_niah_lengths:
        parts += ["--eval-niah-lengths", list_text(opts.eval_niah_lengths)]
    parts += ["--novelty-tokens", str(opts.novelty_tokens)]
    if opts.novelty_data is not None:
        parts += ["--novelty-data", str(opts.novelty_data)]
    if pilot is not None:
        parts += ["--pilot-tokens", str(pilot)]
    if opts.tune_lr:
        parts.append("--tune-lr")
        if opts.lr_grid is not None:  # else each model's default grid, around its recipe's lr
            parts += ["--lr-grid", list_text(opts.lr_grid)]
        parts += ["--tune-seeds", str(opts.tune_seeds or DEFAULT_TUNE_SEEDS)]
        parts += ["--tune-lr-scope", opts.tune_scope or "each"]
        if opts.lr_grid_extend:
            parts += ["--lr-grid-extend", str(opts.lr_grid_extend)]
    parts += ["--stop", opts.stop.as_text(), "--stop-alpha", f"{opts.stop_alpha:g}"]
    parts += ["--min-seeds", str(opts.min_seeds), "--stop-on", opts.stop_on]
    if opts.nproc_per_cell > 1:  # the order of a step's sums: the last bits of the numbers
        parts += ["--nproc-per-cell", str(opts.nproc_per_cell)]
    parts += ["--out", str(opts.out)]  # --jobs/--threads change the speed, never the numbers
    return parts

"""The comparison job (`taperlm compare`): the allocations, the checks that run before any work,
and `run_comparison`, which ties recipe, inputs, grid, training and report together.

The options: `taperlm.compare.options`; the base config every cell starts from (and the
precedence of settings): `taperlm.compare.recipe`; the data dir and evaluation settings:
`taperlm.compare.inputs`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from taperlm import __version__
from taperlm.compare import sequential, tuning_report
from taperlm.compare import tuning as tune
from taperlm.compare.executor import PendingCells, choose_jobs, train_reported
from taperlm.compare.grid import (
    DEFAULT_TAPERS,
    Allocation,
    Grid,
    build_grid,
    paper_allocations,
    parse_allocations,
)
from taperlm.compare.inputs import check_niah_lengths, data_dir_of, eval_settings
from taperlm.compare.options import (
    FLAG_KEY,
    CompareOptions,
    check_option_ranges,
    model_preset,
    width_step,
)
from taperlm.compare.pilots import pilot_tokens, run_pilots
from taperlm.compare.recipe import base_config
from taperlm.compare.report import ComparisonReport, write_report
from taperlm.compare.reproduce import canonical_command
from taperlm.compare.runner import EvalSettings, Results, SharedInputs
from taperlm.config import RunConfig
from taperlm.data.loader import load_meta
from taperlm.errors import ConfigError
from taperlm.files.outdirs import check_folder, claim
from taperlm.files.runlock import locked
from taperlm.runtime.device import resolve_device
from taperlm.spec.domains import MAX_SEED
from taperlm.training.settings import validate_train_config


def allocations(opts: CompareOptions) -> list[Allocation]:
    """The allocations to compare (uniform always included, paper numbers attached)."""
    if opts.paper and (opts.tapers or opts.taper_list):
        raise ConfigError("give either --paper MODE or --tapers/--taper, not both")
    if opts.paper:
        return paper_allocations(opts.paper, opts.multiple_of)
    if opts.preset_size or opts.families:
        raise ConfigError(
            "--preset-size and --families belong to --paper families; for one model give "
            "--preset FAMILY-SIZE (e.g. --preset gated-small)"
        )
    if opts.tapers == ():
        raise ConfigError("--tapers is empty; give e.g. --tapers 'uniform;cosine:1.5:0.5'")
    texts = [*(opts.tapers or ()), *opts.taper_list]
    return parse_allocations(texts or list(DEFAULT_TAPERS), width_step(opts))


def reported_seeds(opts: CompareOptions) -> list[int]:
    """The reported seeds, in order: --first-seed, +1, ... (--seeds of them)."""
    last = opts.first_seed + opts.seeds - 1
    if last > MAX_SEED:
        raise ConfigError(
            f"--first-seed {opts.first_seed} with --seeds {opts.seeds} reaches seed {last}, "
            f"beyond the largest seed {MAX_SEED}; use a smaller --first-seed"
        )
    return list(range(opts.first_seed, opts.first_seed + opts.seeds))


def check_options(opts: CompareOptions) -> tuple[list[Allocation], RunConfig]:
    """Validate everything that does not need the data (so that nothing is prepared or trained
    for a comparison that cannot run); returns (allocations, provisional base config)."""
    check_option_ranges(opts)
    check_executor_options(opts)
    sequential.rule_of(opts)  # a bad --stop fails before any work
    allocs = allocations(opts)
    seeds = reported_seeds(opts)
    tune.check_tuning_options(opts, seeds, allocs)
    provisional = base_config(opts, None, None)
    build_grid(provisional, allocs, seeds, opts.paper)
    validate_train_config(provisional)
    resolve_device(provisional.train.device, "train.device")  # there, before any work
    pilot_tokens(opts, provisional)  # a bad --pilot-tokens fails before any work
    return allocs, provisional


def executor_only_options(opts: CompareOptions) -> list[str]:
    """The Slurm executor's options (--slurm-*, --wait) that `opts` set to other than their
    defaults: every field whose flag names the executor, found from the fields themselves so
    that a new --slurm-* option is covered without a list to keep."""
    given = []
    for f in dataclasses.fields(opts):
        if (f.name.startswith("slurm_") or f.name == "wait") and getattr(opts, f.name) != f.default:
            given.append(f.metadata[FLAG_KEY])
    return given


def check_executor_options(opts: CompareOptions) -> None:
    """The Slurm executor's options mean nothing on this machine: given without
    `--executor slurm`, they are refused rather than silently ignored."""
    if opts.executor == "slurm":
        return
    given = executor_only_options(opts)
    if given:
        raise ConfigError(
            f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for --executor slurm, "
            f"but this comparison runs with --executor {opts.executor}: add --executor slurm "
            "to run its cells as Slurm jobs, or drop the option"
        )


@dataclass
class Inputs:
    """What every cell of a comparison shares: the data and how cells are evaluated."""

    data_dir: Path
    meta: dict[str, Any]
    settings: EvalSettings


def run_comparison(opts: CompareOptions) -> ComparisonReport:
    """Validate, prepare the data if needed, train and evaluate every cell (resumably) and write
    the report; returns it (its report.md and report.json: `md_path`, `json_path`). A study of several comparisons (`--paper
    families`, ...) calls this for each: `taperlm.compare.studies.run_study`."""
    for mode, per in (("families", "family"), ("scaling", "(size, tokens)")):
        if opts.paper == mode:
            raise ConfigError(
                f"--paper {mode} runs one comparison per {per}: call "
                "taperlm.compare.studies.run_study (what `taperlm compare` does)"
            )
    clock = _Clock()
    allocs, provisional = check_options(opts)
    if opts.executor == "slurm":  # a cluster that refuses the jobs: before any work
        from taperlm.compare.slurm import SlurmSettings, check_cluster  # lazy: optional extra

        check_cluster(SlurmSettings.from_options(opts))
    seeds = reported_seeds(opts)
    data_dir = data_dir_of(opts, provisional)
    meta = load_meta(data_dir)
    notes: list[str] = []
    base = base_config(opts, data_dir, int(meta["vocab_size"]), notes)
    for note in notes:
        print(f"taperlm compare: note: {note}", file=sys.stderr)
    inputs = Inputs(data_dir, meta, eval_settings(opts))
    check_niah_lengths(inputs.settings, base.model.context_length)
    SharedInputs(data_dir, inputs.settings).load()  # inputs too small for the job: fail first

    check_folder(opts.out, "compare", "--out")
    claim(opts.out, "compare")
    with locked(opts.out, "comparison folder"):  # one comparison writes a folder at a time
        report = _run_locked(opts, base, allocs, seeds, inputs, clock)
    print(f"wrote {report.md_path} and {report.json_path} ({clock.wall() / 60:.1f} min)")
    return report


def _run_locked(
    opts: CompareOptions,
    base: RunConfig,
    allocs: list[Allocation],
    seeds: list[int],
    inputs: Inputs,
    clock: _Clock,
) -> ComparisonReport:
    """The comparison in its locked folder: lr tuning, pilots, the grid, the report."""
    data_dir, settings = inputs.data_dir, inputs.settings
    tuning = None
    if opts.tune_lr:
        tuning = tune.run_tuning(opts, base, allocs, seeds, data_dir, settings)
        if tuning.scope == "uniform":  # every allocation at uniform's tuned lr
            uniform = next(a for a in allocs if a.is_uniform)
            base = tune.with_chosen_lr(base, tuning, uniform.name)
    pilot = None
    if any(a.needs_pilot for a in allocs):
        pilot = run_pilots(opts, base, seeds, data_dir, int(inputs.meta["vocab_size"]), settings)
    grid = build_grid(base, allocs, seeds, opts.paper, pilot and pilot.rho_mlp)
    grid.pilot = pilot
    print(
        f"taperlm compare: {len(grid.allocations)} allocations x {len(seeds)} seeds = "
        f"{len(grid.cells)} runs of {base.train.tokens:,} tokens "
        f"({grid.budget[grid.allocations[0].name]['params']:,} params each) into {opts.out}",
        file=sys.stderr,
    )
    jobs = choose_jobs(opts, grid, opts.out / "runs", settings, reported=True)
    stopping: sequential.Stopping | None = None
    report = _reporter(opts, grid, inputs, clock, jobs, tuning, lambda: stopping)

    def partial(results: Results) -> None:
        report(grid, results, f" (PARTIAL: {len(results)}/{len(grid.cells)} runs done)")

    cap_grid = grid
    try:
        grid, results, stopping = train_reported(
            opts, grid, data_dir, settings, jobs=jobs, on_seed_done=partial
        )
    except PendingCells as pending:  # cells still queued on a cluster: the report so far
        done = {c.seed for c in grid.cells if c.name in pending.results}
        done -= {c.seed for c in grid.cells if c.name not in pending.results}
        kept = {c.name: pending.results[c.name] for c in grid.cells if c.seed in done}
        if kept:  # the seeds whose every cell is done, as a seed's end writes it
            partial(kept)
        raise
    if tuning:
        if tuning.scope == "each":
            tune.run_tuned(opts, grid, results, tuning, data_dir, settings, cap_grid)
        tune.finish_cost(tuning, list(results.values()))
    return report(grid, results, "")


def _reporter(
    opts: CompareOptions,
    grid: Grid,
    inputs: Inputs,
    clock: _Clock,
    jobs: int,
    tuning: tune.LrTuning | None,
    stopping: Callable[[], sequential.Stopping | None],
) -> Callable[[Grid, Results, str], ComparisonReport]:
    """report(grid, results, title suffix): writes report.md / report.json for the results so
    far: with --tune-lr report.json's `lr_tuning`, its section and lr_tuning.png; once the seeds
    are settled (`stopping()`), `stopping`, its section and sequence.png."""
    command = canonical_command(opts, grid)

    def report(used: Grid, results: Results, suffix: str) -> ComparisonReport:
        meta = _report_meta(opts, used, results, command, inputs) | {
            "wall_s": clock.wall(),
            "cpu_s": clock.cpu(),
            "jobs": jobs,
        }
        meta["title"] += suffix
        extras = []
        stop = stopping()
        if stop is not None:
            extras.append(("stopping", sequential.with_plot(stop, opts.out), sequential.section))
        if tuning:
            plotted = tuning_report.with_plot(tuning, opts.out)
            extras.append(("lr_tuning", plotted, tuning_report.tuning_section))
        return write_report(used, results, opts.out, meta, extras)

    return report


class _Clock:
    """Wall time and CPU time (this process and its finished worker processes) since made."""

    def __init__(self) -> None:
        self.t_start, self.cpu_start = time.perf_counter(), _cpu_seconds()

    def wall(self) -> float:
        return time.perf_counter() - self.t_start

    def cpu(self) -> float:
        return _cpu_seconds() - self.cpu_start


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished worker processes."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _report_meta(
    opts: CompareOptions, grid: Grid, results: Results, command: str, inputs: Inputs
) -> dict[str, Any]:
    m = grid.base.model
    return {
        "title": _title(opts, grid),
        "command": command,
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "taperlm_version": __version__,
        "torch_version": torch.__version__,
        "threads": opts.threads,
        "jobs": opts.jobs,
        "paper_mode": opts.paper,
        "cells": len(grid.cells),
        "wall_s": 0.0,
        "cpu_s": 0.0,
        "model": {
            "family": m.family,
            "n_layers": m.n_layers,
            "d_model": m.d_model,
            "n_heads": m.n_heads,
            "mlp_width": m.mlp_width,
            "vocab_size": m.vocab_size,
        },
        "settings": _settings_meta(grid, results, inputs),
    }


def _settings_meta(grid: Grid, results: Results, inputs: Inputs) -> dict[str, Any]:
    """report.json's meta.settings: the training recipe, the data and the evaluation."""
    first = next(iter(results.values()))
    t, settings = grid.base.train, inputs.settings
    return {
        "tokens": t.tokens,
        "steps": t.steps,
        "batch_tokens": t.batch_tokens,
        "seq_len": t.seq_len,
        "lr": t.lr,
        "warmup_tokens": t.warmup_tokens,
        "eval_every": t.eval_every,
        "eval_tokens": t.eval_tokens,
        "seeds": grid.seeds,
        "data_dir": str(inputs.data_dir),
        "train_tokens": int(inputs.meta["splits"]["train"]["tokens"]),
        "val_tokens": first.val.tokens,
        "eval_tasks": settings.eval_tasks,
        "eval_limit": settings.eval_limit,
        "novelty_text": settings.novelty_text or f"the val split of {inputs.data_dir}",
        "novelty_tokens": settings.novelty_tokens,
    }


def _title(opts: CompareOptions, grid: Grid) -> str:
    model = str(opts.config) if opts.config else model_preset(opts)
    mode = f"paper {grid.paper}" if grid.paper else f"{len(grid.allocations)} allocations"
    return f"{model}, {mode}, {len(grid.seeds)} seeds, {grid.base.train.tokens:,} tokens/run"

"""Training a grid's cells with compare's options: how many at a time (`choose_jobs`), the one
call every stage makes (`train_cells`: the reported grid, novelty pilots, lr tuning), and
`train_reported`, the call for a grid of *reported* seeds: it adds the seeds in order and stops
by the rule of --stop (`taperlm.compare.sequential`), returning the grid of the seeds it used.
A stage whose seeds are reported (every mode's grid, --tune-lr's own-lr grid) calls
`train_reported`; tuning seeds and pilots, which choose rather than report, call `train_cells`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from taperlm import cpus
from taperlm.compare import runner, sequential
from taperlm.compare.grid import Grid
from taperlm.compare.options import CompareOptions
from taperlm.compare.runner import EvalSettings
from taperlm.compare.scheduler import run_grid

Results = dict[str, dict[str, Any]]


def choose_jobs(
    opts: CompareOptions, grid: Grid, runs: Path, settings: EvalSettings, reported: bool = False
) -> int:
    """--jobs, else as many cells at a time as idle cores allow at --threads each (at least
    one, at most the cells left to run); says what it chose and why (`reported`: a grid of
    reported seeds, which --stop may end sooner)."""
    # module attributes, looked up per call: tests stand in for the machine and the cells' state
    todo = sum(
        runner.cell_state(c, runs / c.name, settings.to_dict())[0] != "cached" for c in grid.cells
    )
    if todo == 0:
        return 1
    if opts.jobs is not None:
        jobs, usable = opts.jobs, cpus.usable_cpus()
        why = f"--jobs {jobs}; {usable} usable CPU(s)"
        if jobs * opts.threads > usable:
            why += f", OVERSUBSCRIBED: {jobs * opts.threads} threads (slower, same numbers)"
    else:
        idle, usable, busy = cpus.idle_cpus()
        jobs = max(1, min(todo, idle // opts.threads))
        why = f"{usable} usable CPU(s), {busy:.1f} busy with other processes; --jobs N to override"
    most = "up to " if reported and opts.stop.strip() != "fixed" else ""
    print(
        f"taperlm compare: {most}{todo} cell(s) to run, {min(jobs, todo)} at a time with "
        f"{opts.threads} torch thread(s) each ({why})",
        file=sys.stderr,
    )
    return jobs


def train_cells(
    opts: CompareOptions,
    grid: Grid,
    data_dir: Path,
    settings: EvalSettings,
    jobs: int | None = None,
    on_seed_done: Callable[[Results], None] | None = None,
    monitor: sequential.Monitor | None = None,
) -> Results:
    """Train (or reuse) every cell of `grid` into OUT/runs, `jobs` at a time (None: as
    `choose_jobs` decides); cell name -> result. With a `monitor`, no cell starts after it
    stopped (`taperlm.compare.scheduler.run_grid`)."""
    if jobs is None:
        jobs = choose_jobs(opts, grid, opts.out / "runs", settings)
    return run_grid(
        grid,
        opts.out,
        data_dir,
        settings,
        progress=not opts.no_progress,
        on_seed_done=on_seed_done,
        jobs=jobs,
        threads=opts.threads,
        monitor=monitor,
    )


def train_reported(
    opts: CompareOptions,
    grid: Grid,
    data_dir: Path,
    settings: EvalSettings,
    jobs: int | None = None,
    on_seed_done: Callable[[Results], None] | None = None,
) -> tuple[Grid, Results, dict[str, Any]]:
    """Train the reported seeds of `grid` in order until the rule of --stop stops them
    (`sequential`; `--stop fixed`: all of them); returns (the grid of the seeds used, their
    results, report.json's `stopping`). Cells of later seeds that were running (with --jobs > 1)
    stop with a checkpoint, or stay cached when done first, and are not returned: the decision and the report read seeds 0..n-1 only."""
    rule = sequential.rule_of(opts)
    monitor = sequential.Monitor(rule, grid)
    if jobs is None:
        jobs = choose_jobs(opts, grid, opts.out / "runs", settings, reported=True)
    results = train_cells(opts, grid, data_dir, settings, jobs, on_seed_done, monitor)
    monitor.update(results)
    n, reason = monitor.stopped_at, monitor.reason
    if n is None:  # cannot happen: every cell ran unless it stopped
        raise AssertionError("the grid finished without its monitor seeing every seed")
    used = sequential.truncated(grid, n)
    kept = {c.name: results[c.name] for c in used.cells}
    return used, kept, sequential.record(rule, used, kept, n, reason, len(grid.seeds))

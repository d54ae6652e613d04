"""Running a comparison's cells: one executor, `Executor`, runs a grid's cells `jobs` at a time
on worker processes (`taperlm.compare.workers`) or, with one at a time, here in this process:
the one-worker case of the same interface, which brings every cell to done with the same
`taperlm.compare.cell.run_one` on the same inputs, so the numbers never depend on `--jobs`.
Around it: the grid's progress display and a clean stop on Ctrl-C (`run_grid`), how many cells
at a time (`choose_jobs`), the one call every stage makes (`train_cells`: the reported grid,
novelty pilots, lr tuning), and `train_reported`, the call for a grid of *reported* seeds: it
adds the seeds in order and stops by the rule of --stop (`taperlm.compare.statistics`),
returning the grid of the seeds it used. A stage whose seeds are reported (every mode's grid,
--tune-lr's own-lr grid) calls `train_reported`; tuning seeds and pilots, which choose rather
than report, call `train_cells`."""

from __future__ import annotations

import importlib
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm.auto import tqdm

from taperlm.compare import cell as compare_cell
from taperlm.compare.cell import (
    CellInterrupted,
    EvalSettings,
    SharedInputs,
    cell_state,
    read_result,
)
from taperlm.compare.grid import Cell, Grid
from taperlm.compare.options import CompareOptions
from taperlm.compare.report import fmt_signed
from taperlm.compare.results import CellResult, Results, Stopping
from taperlm.compare.statistics import Monitor, record, rule_of, truncated
from taperlm.compare.workers import device_slots, run_groups, run_in_workers
from taperlm.runtime import cpus
from taperlm.runtime.device import resolve_device
from taperlm.runtime.progress import progress_bar


class StopRequest:
    """Ctrl-C (SIGINT) or SIGTERM while cells run: the first asks every running cell to stop at
    its next step with a checkpoint; a second one interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        sys.stderr.write(
            "\ntaperlm compare: stopping: running cells save a checkpoint at their next step "
            "(press Ctrl-C again to stop at once)\n"
        )

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class GridDisplay:
    """The grid's progress: a bar over the tokens of the whole grid (cells done + steps of the
    running ones), one bar per worker when several run, and a line per finished cell
    (validation loss, throughput, the grid's progress and the ETA)."""

    def __init__(self, grid: Grid, runs: Path, workers: int, progress: bool, log) -> None:
        self.grid, self.n = grid, len(grid.cells)
        self.counted = {c.name for c in grid.cells if read_result(runs / c.name) is not None}
        self.done_tokens = sum(c.config.train.tokens for c in grid.cells if c.name in self.counted)
        self.base = self.done_tokens  # tokens not trained by this invocation (for the ETA)
        self.running: dict[str, int] = {}  # cell -> tokens it has reached
        self.finished = 0
        self.t_start = time.perf_counter()
        self.write = log or (lambda msg: tqdm.write(msg, file=sys.stderr))
        kw: dict[str, Any] = {"dynamic_ncols": True, "disable": not progress}
        self.bar = progress_bar(
            total=grid.total_tokens,
            initial=self.done_tokens,
            unit="tok",
            unit_scale=True,
            desc="grid",
            position=0,
            **kw,
        )
        self.workers = [
            progress_bar(
                total=1, desc=f"worker {i + 1}", position=i + 1, leave=False, unit="step", **kw
            )
            for i in range(workers if workers > 1 else 0)
        ]
        self.on_slot: dict[int, str] = {}
        self._refreshed = 0.0

    def _label(self, cell: Cell, slot: int, what: str = "") -> str:
        if self.workers:
            return f"worker {slot + 1} {cell.name}{what}"
        return f"grid {self.finished + 1}/{self.n} {cell.name}{what}"

    def step(self, slot: int, cell: Cell, step: int, total: int, loss: float) -> None:
        batch = cell.config.train.batch_tokens
        if cell.name not in self.running:  # its first step in this invocation
            self.base += (step - 1) * batch
        self.running[cell.name] = step * batch
        self.bar.n = self.done_tokens + sum(self.running.values())
        bar = self.workers[slot] if self.workers else self.bar
        if self.workers:
            if self.on_slot.get(slot) != cell.name:  # a new cell on this worker
                self.on_slot[slot] = cell.name
                bar.reset(total=total)
            bar.update(step - bar.n)
        bar.set_description(self._label(cell, slot), refresh=False)
        bar.set_postfix(step=f"{step}/{total}", loss=f"{loss:.4f}", refresh=False)
        now = time.monotonic()
        if now - self._refreshed > 0.2 or step == total:
            self._refreshed = now
            for b in (self.bar, *self.workers):
                b.refresh()

    def evaluating(self, slot: int, cell: Cell) -> None:
        bar = self.workers[slot] if self.workers else self.bar
        bar.set_description(self._label(cell, slot, " (evaluating)"))

    def done(self, cell: Cell, result: CellResult, status: str) -> None:
        self.finished += 1
        self.running.pop(cell.name, None)
        if cell.name not in self.counted:
            self.counted.add(cell.name)
            self.done_tokens += cell.config.train.tokens
        self.bar.n = self.done_tokens + sum(self.running.values())
        self.bar.refresh()
        elapsed = time.perf_counter() - self.t_start
        rate = result.train.tokens_per_s or 0.0
        self.write(
            f"[{self.finished}/{self.n}] {cell.name}: {status}; val loss "
            f"{result.val.loss:.4f} (ppl {result.val.ppl:.2f}), {rate:,.0f} tok/s, "
            f"rho_mlp r={fmt_signed(result.novelty.pearson_mlp)}; "
            f"grid {self.done_tokens:,}/{self.grid.total_tokens:,} tokens, {elapsed:.0f} s "
            f"elapsed" + self.eta(elapsed)
        )

    def eta(self, elapsed: float) -> str:
        now = self.done_tokens + sum(self.running.values())
        return _eta(now - self.base, self.grid.total_tokens - now, elapsed)

    def close(self) -> None:
        for b in self.workers:
            b.close()
        self.bar.close()


def run_grid(
    grid: Grid,
    out_dir: Path,
    data_dir: Path,
    settings: EvalSettings,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    on_seed_done: Callable[[Results], None] | None = None,
    jobs: int = 1,
    threads: int = 1,
    monitor: Monitor | None = None,
    executor: CellExecutor | None = None,
) -> Results:
    """Run every cell (resuming/caching as described above); cell name -> result.

    `jobs` > 1 runs that many cells at a time in worker processes (`taperlm.compare.workers`),
    each with `threads` torch threads; `jobs` = 1 runs them here, one after the other. Every
    cell computes the same numbers either way. `on_seed_done(results so far)` is called whenever
    the last cell of a seed finishes (not after the final cell), e.g. to write a partial report.
    Ctrl-C stops the running cells at their next step with a checkpoint and raises
    KeyboardInterrupt. With a `monitor` (`taperlm.compare.statistics.Monitor`), no cell is
    started once it has stopped (cells already running finish); the result then holds the cells
    that were done, the monitor's seeds among them. `executor`: where the cells run (None:
    this machine, `Executor`); one that leaves cells queued elsewhere raises its pending error
    with `results` set to the cells done."""
    runs = out_dir / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    settings_dict = settings.to_dict()
    results: Results = {}
    todo: list[Cell] = []
    for cell in grid.cells:  # every folder is checked before anything trains
        state, cached = cell_state(cell, runs / cell.name, settings_dict)
        if state == "cached":
            results[cell.name] = cached
        else:
            todo.append(cell)
    announced: list[bool] = []  # the stop was said
    if monitor is not None and monitor.update(results):  # decided from the cache alone
        todo, announced = [], [True]
    # a bar per worker of this machine (cells elsewhere report only when done)
    bars = min(jobs, len(todo)) if executor is None or isinstance(executor, Executor) else 1
    display = GridDisplay(grid, runs, bars, progress, log)
    for cell in grid.cells:
        if cell.name in results:
            display.done(cell, results[cell.name], "cached")

    def finished(cell: Cell, result: CellResult, status: str) -> None:
        results[cell.name] = result
        display.done(cell, result, status)
        if monitor is not None and not announced and monitor.update(results):
            announced.append(True)
            display.write(
                f"taperlm compare: {monitor.reason} after {monitor.stopped_at} seed(s): no new "
                "cells start; running ones stop at their next step with a checkpoint"
            )
        seed_cells = [c.name for c in grid.cells if c.seed == cell.seed]
        if (
            on_seed_done is not None
            and len(results) < len(grid.cells)
            and all(name in results for name in seed_cells)
        ):
            on_seed_done(dict(results))

    def wants(cell: Cell) -> bool:  # whether to start the cell (the monitor has not stopped)
        return monitor is None or monitor.wants(cell.seed)

    try:
        with StopRequest() as stop:
            runner_of = executor or Executor(jobs, threads, data_dir, settings)
            runner_of.run(todo, runs, display, finished, stop, wants)
    except PendingCells as pending:  # queued elsewhere: what is done so far goes with it
        pending.results = {c.name: results[c.name] for c in grid.cells if c.name in results}
        raise
    finally:
        display.close()
    return {c.name: results[c.name] for c in grid.cells if c.name in results}


class PendingCells(Exception):
    """Cells still queued or running elsewhere (a cluster) and the caller did not wait for them:
    the command returns, and running it again picks up their results. `results`: the cells done
    so far (set by `run_grid`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.results: Results = {}


class CellExecutor(Protocol):
    """Where a grid's cells run: the one interface between a comparison (its grid, its
    sequential stop, its report) and the machines. Two implementations: `Executor` (this
    machine) and `taperlm.compare.slurm.SlurmExecutor` (a Slurm cluster); another (Ray,
    Kubernetes) is one more class with this method, made by `make_executor`, and touches no
    study and no report.

    `run` brings the cells of `todo` to done into runs/<cell> (each cell's folder is its whole
    state: result.json marks it done), calling `finished(cell, result, status)` for each one
    done, in this process; `display` (GridDisplay) shows progress, `stop` (StopRequest) tells of
    a Ctrl-C, `wants(cell)` whether a cell not yet started is still wanted (a sequential stop
    decided: no). It returns once every wanted cell is done, raises KeyboardInterrupt after a
    stop, or `PendingCells` when cells are still queued or running
    elsewhere and the caller did not ask to wait for them."""

    def run(self, todo: list[Cell], runs: Path, display, finished, stop, wants) -> None: ...


# --executor NAME -> "module:class" of its implementation (imported when chosen), made with
# (options, jobs, data dir, evaluation settings).
EXECUTORS: dict[str, str] = {
    "local": "taperlm.compare.execute:Executor",
    "slurm": "taperlm.compare.slurm:SlurmExecutor",
}


def make_executor(
    opts: CompareOptions | None, jobs: int, threads: int, data_dir: Path, settings: EvalSettings
) -> CellExecutor:
    """The executor --executor names (None options: the local one, `jobs` at a time)."""
    name = "local" if opts is None else opts.executor
    if name == "local":
        nproc = 1 if opts is None else opts.nproc_per_cell
        return Executor(jobs, threads, data_dir, settings, nproc)
    module, cls = EXECUTORS[name].split(":")
    return getattr(importlib.import_module(module), cls).from_options(
        opts, jobs, data_dir, settings
    )


@dataclass(frozen=True)
class Executor:
    """Where a grid's cells run: `jobs` worker processes, or this process when one cell runs at
    a time (or only one is left). Either way each cell is brought to done by
    `taperlm.compare.cell.run_one` with `threads` torch threads and the same inputs: the same
    numbers whatever `jobs` is. With `nproc` > 1 (or cells on several GPUs) each cell is a group
    of `nproc` processes on its own devices (`taperlm.compare.groups`)."""

    jobs: int  # cells at a time (1: here, one after the other)
    threads: int  # torch threads per cell
    data_dir: Path  # the comparison's data
    settings: EvalSettings  # how every cell is evaluated
    nproc: int = 1  # processes per cell (--nproc-per-cell)

    def run(self, todo: list[Cell], runs: Path, display, finished, stop, wants) -> None:
        """Run the cells of `todo` into runs/<cell> (`CellExecutor.run`)."""
        gpus = _cuda_devices(todo)
        if self.nproc > 1 or (gpus and self.jobs > 1 and len(todo) > 1):
            slots = device_slots(gpus, self.nproc, self.jobs) if gpus else None
            run_groups(
                todo, runs, self.data_dir, self.settings, self.jobs, self.threads, self.nproc,
                slots, display, finished, stop, wants,
            )  # fmt: skip
        elif self.jobs > 1 and len(todo) > 1:
            run_in_workers(
                todo, runs, self.data_dir, self.settings, self.jobs, self.threads,
                display, finished, stop, wants,
            )  # fmt: skip
        else:
            shared = SharedInputs(self.data_dir, self.settings)
            _run_here(todo, runs, shared, self.threads, display, finished, stop, wants)


def _cuda_devices(todo: list[Cell]) -> int:
    """GPUs visible to this process when the cells train on CUDA, else 0 (CPU cells)."""
    if not todo or not torch.cuda.is_available():
        return 0
    on = resolve_device(todo[0].config.train.device)
    return torch.cuda.device_count() if on.startswith("cuda") else 0


def _run_here(todo, runs, shared, threads, display, finished, stop, wants) -> None:
    """The cells one after the other in this process, with `threads` torch threads (those
    `wants(cell)` still asks for when their turn comes): each by `taperlm.compare.cell.run_one`, the code a
    worker runs for a cell, its progress going straight to `display`."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for cell in todo:
            if not wants(cell):
                continue
            try:
                # a module attribute, looked up per cell: tests stand in for the cell's run
                result, status = compare_cell.run_one(  # looked up per call: the seam tests patch
                    cell,
                    runs / cell.name,
                    shared,
                    jobs=1,
                    stopping=lambda: stop.requested,
                    on_step=lambda step, total, loss, cell=cell: display.step(
                        0, cell, step, total, loss
                    ),
                    on_evaluate=lambda cell=cell: display.evaluating(0, cell),
                )
            except CellInterrupted as err:
                display.write(f"taperlm compare: {err}")
                raise KeyboardInterrupt from None
            finished(cell, result, status)
            if stop.requested:
                raise KeyboardInterrupt
    finally:
        torch.set_num_threads(previous)


def _eta(done_now: int, left: int, elapsed: float) -> str:
    if done_now <= 0 or left <= 0:
        return ""
    return f", ETA {left * elapsed / done_now / 60:.1f} min"


def choose_jobs(
    opts: CompareOptions,
    grid: Grid,
    runs: Path,
    settings: EvalSettings,
    reported: bool = False,
    idle_cpus: Callable[[], tuple[int, int, float]] = cpus.idle_cpus,
    usable_cpus: Callable[[], int] = cpus.usable_cpus,
    cell_state: Callable[[Cell, Path, dict[str, Any]], tuple[str, Any]] = compare_cell.cell_state,
) -> int:
    """--jobs, else as many cells at a time as idle cores allow at --threads each (at least
    one, at most the cells left to run); says what it chose and why (`reported`: a grid of
    reported seeds, which --stop may end sooner). The machine's CPU counts and the cells' state
    default to the real ones; a caller (a test) may stand in for another machine."""
    todo = sum(cell_state(c, runs / c.name, settings.to_dict())[0] != "cached" for c in grid.cells)
    if todo == 0:
        return 1
    nproc = opts.nproc_per_cell  # processes per cell (each opts.threads torch threads)
    gpus = 0 if opts.executor != "local" else _cuda_devices(grid.cells)
    if opts.executor != "local":  # cells in flight on the cluster: a wave
        jobs = opts.jobs or slurm_wave(opts, grid)
        why = f"--jobs {jobs}" if opts.jobs else "a wave; --jobs N to override"
    elif opts.jobs is not None:
        jobs, usable = opts.jobs, usable_cpus()
        why = f"--jobs {jobs}; {usable} usable CPU(s)"
        if gpus:
            why = f"--jobs {jobs}; {gpus} GPU(s)"
        elif jobs * opts.threads * nproc > usable:
            why += f", OVERSUBSCRIBED: {jobs * opts.threads * nproc} threads (slower, same numbers)"
    elif gpus:
        jobs = max(1, min(todo, gpus // nproc))
        why = f"{gpus} GPU(s), {nproc} per cell; --jobs N to override"
    else:
        idle, usable, busy = idle_cpus()
        jobs = max(1, min(todo, idle // (opts.threads * nproc)))
        why = f"{usable} usable CPU(s), {busy:.1f} busy with other processes; --jobs N to override"
    most = "up to " if reported and opts.stop.kind != "fixed" else ""
    group = f" x {nproc} process(es)" if nproc > 1 else ""
    print(
        f"taperlm compare: {most}{todo} cell(s) to run, {min(jobs, todo)} at a time{group} with "
        f"{opts.threads} torch thread(s) each ({why})",
        file=sys.stderr,
    )
    return jobs


def slurm_wave(opts: CompareOptions, grid: Grid) -> int:
    """Cells in flight on a cluster by default: every cell of the fixed design, else the cells
    of the first --min-seeds seeds (the sequential stop decides after each wave)."""
    if opts.stop.kind == "fixed":
        return len(grid.cells)
    return len(grid.allocations) * min(len(grid.seeds), max(1, opts.min_seeds))


def train_cells(
    opts: CompareOptions,
    grid: Grid,
    data_dir: Path,
    settings: EvalSettings,
    jobs: int | None = None,
    on_seed_done: Callable[[Results], None] | None = None,
    monitor: Monitor | None = None,
) -> Results:
    """Train (or reuse) every cell of `grid` into OUT/runs, `jobs` at a time (None: as
    `choose_jobs` decides); cell name -> result. With a `monitor`, no cell starts after it
    stopped (`run_grid`)."""
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
        executor=make_executor(opts, jobs, opts.threads, data_dir, settings),
    )


def train_reported(
    opts: CompareOptions,
    grid: Grid,
    data_dir: Path,
    settings: EvalSettings,
    jobs: int | None = None,
    on_seed_done: Callable[[Results], None] | None = None,
) -> tuple[Grid, Results, Stopping]:
    """Train the reported seeds of `grid` in order until the rule of --stop stops them
    (`sequential`; `--stop fixed`: all of them); returns (the grid of the seeds used, their
    results, report.json's `stopping`). Cells of later seeds that were running (with --jobs > 1)
    stop with a checkpoint, or stay cached when done first, and are not returned: the decision and the report read seeds 0..n-1 only."""
    rule = rule_of(opts)
    monitor = Monitor(rule, grid)
    if jobs is None:
        jobs = choose_jobs(opts, grid, opts.out / "runs", settings, reported=True)
    results = train_cells(opts, grid, data_dir, settings, jobs, on_seed_done, monitor)
    monitor.update(results)
    n, reason = monitor.stopped_at, monitor.reason
    if n is None:  # cannot happen: every cell ran unless it stopped
        raise AssertionError("the grid finished without its monitor seeing every seed")
    used = truncated(grid, n)
    kept = {c.name: results[c.name] for c in used.cells}
    return used, kept, record(rule, used, kept, n, reason, len(grid.seeds))

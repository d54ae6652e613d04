"""Cells of a comparison in parallel worker processes (`taperlm compare --jobs N`).

Each worker is a fresh (spawned) Python process that sets its torch threads before torch is
imported, loads the shared inputs once and then runs the cells the parent hands it, one at a
time, with `taperlm.compare.runner.run_one` — the same function, on the same inputs, as the
in-process path (`--jobs 1`), so every cell computes the same numbers whatever the number of
workers. Workers report progress, results and errors through one queue; the parent draws the
bars, writes the result lines and the partial reports.

A sequential comparison that has stopped (`wants(cell)` false for the cells of later seeds)
hands out no more cells and asks the workers still running such cells to stop the same way
(checkpointed, not reported, resumed by a later run that needs them).

Stopping: Ctrl-C reaches the workers too (same process group); a worker then finishes its
current step, saves a checkpoint and reports the cell as interrupted, and the parent raises
KeyboardInterrupt once all have stopped. A second Ctrl-C in the parent kills the workers at
once. A worker whose parent disappears stops the same way at its next step.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import queue
import signal
import time
import traceback
from pathlib import Path

from taperlm.errors import TrainingError

STARTUP_TIMEOUT_S = 300.0  # a worker that has not reported within this time after start is dead
STOP_GRACE_S = 60.0  # after a stop request, how long running cells may take to checkpoint
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _worker_main(slot: int, threads: int, jobs: int, data_dir: str, settings: dict, tasks, events):
    """A worker process: take (index, cell) tasks until None, report every step and the end."""
    for name in THREAD_ENV:
        os.environ[name] = str(threads)
    stop = {"requested": False}

    def request_stop(signum, frame) -> None:
        stop["requested"] = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    parent = os.getppid()

    import torch  # lazy: imported after the thread variables above are set

    from taperlm.compare.runner import (  # lazy: imports torch
        CellInterrupted,
        EvalSettings,
        SharedInputs,
        run_one,
    )

    torch.set_num_threads(threads)
    shared = SharedInputs(Path(data_dir), EvalSettings.from_dict(settings))
    events.put(("ready", slot, None))
    while True:
        task = tasks.get()
        if task is None:
            return
        index, cell, run_dir = task

        def stopping() -> bool:
            return stop["requested"] or os.getppid() != parent

        last_sent = 0.0

        def on_step(step: int, total: int, loss: float, index=index) -> None:
            nonlocal last_sent  # the queue carries a few steps a second, not every one
            now = time.monotonic()
            if now - last_sent > 0.2 or step == total:
                last_sent = now
                events.put(("step", slot, (index, step, total, loss)))

        try:
            result, status = run_one(
                cell,
                Path(run_dir),
                shared,
                jobs=jobs,
                stopping=stopping,
                on_step=on_step,
                on_evaluate=lambda index=index: events.put(("evaluate", slot, index)),
            )
        except CellInterrupted as err:
            events.put(("interrupted", slot, (index, str(err))))
            return
        except BaseException as err:  # reported to the parent, which raises it
            events.put(("error", slot, (index, _picklable(err))))
            return
        events.put(("done", slot, (index, result, status)))
        if stopping():
            return


def _picklable(err: BaseException) -> bytes:
    """The exception itself when it survives pickling (our errors do), else a TrainingError
    carrying its traceback."""
    try:
        data = pickle.dumps(err)
        pickle.loads(data)
        return data
    except Exception:
        text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        return pickle.dumps(TrainingError(f"a compare worker failed:\n{text}"))


def run_in_workers(
    todo, runs: Path, data_dir: Path, settings, jobs, threads, display, finished, stop, wants=None
) -> None:
    """Run the cells `todo` on `jobs` worker processes (see the module docstring). `display`
    (executor.GridDisplay) shows progress, `finished(cell, result, status)` takes each result,
    `stop` (executor.StopRequest) tells of a Ctrl-C, `wants(cell)` whether a cell not yet
    handed out should still start (a sequential comparison that has stopped: no)."""
    pool = _WorkerPool(todo, runs, display, finished, stop, wants)
    pool.start(min(jobs, len(todo)), threads, jobs, data_dir, settings)
    try:
        pool.serve()
    except KeyboardInterrupt:  # a second Ctrl-C: stop at once
        for p in pool.procs:
            if p.is_alive():
                p.kill()
        raise
    finally:
        pool.close()
    for line in pool.interrupted:
        display.write(f"taperlm compare: {line}")
    for line in pool.halted:
        display.write(f"taperlm compare: {line}: not needed now (a run with more seeds resumes it)")
    if pool.error is not None:
        raise pool.error
    if stop.requested or pool.interrupted:
        raise KeyboardInterrupt


class _WorkerPool:
    """The parent's side of the workers: hands out cells, reads their events, notices a worker
    that died or never started."""

    def __init__(self, todo, runs: Path, display, finished, stop, wants=None) -> None:
        self.todo, self.runs, self.stop = todo, runs, stop
        self.wants = wants or (lambda cell: True)
        self.halting: set[int] = set()  # slots asked to stop a cell no longer wanted
        self.halted: list[str] = []
        self.display, self.finished = display, finished
        self.ctx = mp.get_context("spawn")
        self.events = self.ctx.Queue()
        self.pending = list(enumerate(todo))
        self.procs: list = []
        self.inbox: list = []
        self.running: dict[int, int] = {}  # slot -> index of its cell
        self.started: dict[int, float] = {}  # slot -> start time, until it reports ready
        self.idle: list[int] = []
        self.error: BaseException | None = None
        self.interrupted: list[str] = []
        self.stop_sent: float | None = None

    def start(self, count: int, threads: int, jobs: int, data_dir: Path, settings) -> None:
        # Workers start with SIGINT ignored (inherited through exec) until they install their
        # own handler, so a Ctrl-C during their start-up prints no traceback.
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for slot in range(count):
                tasks = self.ctx.SimpleQueue()
                p = self.ctx.Process(
                    target=_worker_main,
                    args=(
                        slot,
                        threads,
                        jobs,
                        str(data_dir),
                        settings.to_dict(),
                        tasks,
                        self.events,
                    ),
                    name=f"taperlm-compare-worker-{slot + 1}",
                    daemon=True,
                )
                p.start()
                self.procs.append(p)
                self.inbox.append(tasks)
                self.started[slot] = time.monotonic()
        finally:
            signal.signal(signal.SIGINT, handler)

    def _accepting(self) -> bool:
        self.pending = [(i, c) for i, c in self.pending if self.wants(c)]
        return bool(self.pending) and self.error is None and not self.stop.requested

    def serve(self) -> None:
        """Hand out cells and handle events until every cell is done or the pool stops."""
        while self.running or self._accepting():
            if self.stop.requested and self.stop_sent is None:
                self.stop_sent = time.monotonic()
                _signal_all(self.procs)
            while self.idle and self._accepting():
                slot = self.idle.pop()
                index, cell = self.pending.pop(0)
                self.running[slot] = index
                self.inbox[slot].put((index, cell, str(self.runs / cell.name)))
            if not self.running and (self.error is not None or self.stop.requested):
                break
            try:
                kind, slot, payload = self.events.get(timeout=0.5)
            except queue.Empty:
                if self._quiet():
                    break
                continue
            self._handle(kind, slot, payload)

    def _quiet(self) -> bool:
        """No event for a while: notice a dead worker; True once a stop's grace is over."""
        dead = _dead_worker(self.procs, self.running, self.started, self.todo)
        if dead is not None and self.error is None:
            self.error = dead
            _signal_all(self.procs)
        if dead is not None:
            self.running.pop(dead.slot, None)
            self.started.pop(dead.slot, None)
        return self.stop_sent is not None and time.monotonic() - self.stop_sent > STOP_GRACE_S

    def _handle(self, kind: str, slot: int, payload) -> None:
        if kind == "ready":
            self.started.pop(slot, None)
            self.idle.append(slot)
        elif kind == "step":
            index, step, total, loss = payload
            self.display.step(slot, self.todo[index], step, total, loss)
        elif kind == "evaluate":
            self.display.evaluating(slot, self.todo[payload])
        elif kind == "done":
            index, result, status = payload
            self.running.pop(slot)
            self.halting.discard(slot)  # it finished before it saw the request: kept, cached
            self.idle.append(slot)
            self.finished(self.todo[index], result, status)
            self._halt_unwanted()
        elif kind == "interrupted":
            self.running.pop(slot)
            (self.halted if slot in self.halting else self.interrupted).append(payload[1])
        elif kind == "error":
            index, data = payload
            self.running.pop(slot)
            if self.error is None:
                self.error = pickle.loads(data)
                _signal_all(self.procs)  # the others checkpoint and stop

    def _halt_unwanted(self) -> None:
        """Ask the workers running cells that are no longer wanted (a sequential comparison
        stopped before their seed) to stop at their next step with a checkpoint: the report
        will not read them, and a later run that needs them resumes them."""
        for slot, index in self.running.items():
            if slot not in self.halting and not self.wants(self.todo[index]):
                self.halting.add(slot)
                p = self.procs[slot]
                if p.is_alive() and p.pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.pid, signal.SIGTERM)
        if self.halting and self.stop_sent is None:
            self.stop_sent = time.monotonic()  # the same grace as a Ctrl-C's

    def close(self) -> None:
        """Tell every live worker to exit, then reap them."""
        for slot, p in enumerate(self.procs):
            if p.is_alive():
                with contextlib.suppress(OSError, ValueError):
                    self.inbox[slot].put(None)
        _reap(self.procs)


def _signal_all(procs) -> None:
    for p in procs:
        if p.is_alive() and p.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)  # workers stop at their next step


class WorkerDied(TrainingError):
    def __init__(self, message: str, slot: int) -> None:
        super().__init__(message)
        self.slot = slot

    def __reduce__(self):
        return (WorkerDied, (str(self), self.slot))


def _dead_worker(procs, running: dict[int, int], started: dict[int, float], todo):
    """A WorkerDied error for a worker that died (killed, out of memory) or never came up."""
    for slot, p in enumerate(procs):
        dead = not p.is_alive()
        late = slot in started and time.monotonic() - started[slot] > STARTUP_TIMEOUT_S
        if (slot in running or slot in started) and (dead or late):
            what = f"cell {todo[running[slot]].name}" if slot in running else "no cell yet"
            state = f"died (exit code {p.exitcode})" if dead else "did not start"
            return WorkerDied(
                f"compare worker {slot + 1} ({what}) {state}; every cell's newest checkpoint "
                "is intact: rerun the same command to resume (with fewer --jobs if the machine "
                "ran out of memory)",
                slot,
            )
    return None


def _reap(procs, timeout: float = 10.0) -> None:
    """Wait for the workers to exit; kill those that do not."""
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)

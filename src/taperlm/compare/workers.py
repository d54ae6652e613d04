"""The processes that run a comparison's cells besides this one: spawned worker processes
(`--jobs N`) and process groups (`--nproc-per-cell N`). Nothing here imports torch at import
time: each process's entry point sets its threads and environment first.

Workers: Each worker is a fresh (spawned) Python process that sets its torch threads before torch is
imported, loads the shared inputs once and then runs the cells the parent hands it, one at a
time, with `taperlm.compare.cell.run_one` — the same function, on the same inputs, as the
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

Process groups: Each cell trains as a torchrun-style group of N processes: every process gets the environment
torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) and calls the trainer `taperlm train` uses, which joins the group
(`taperlm.training.distributed.init_distributed`: nccl on CUDA, gloo on CPU) and wraps the model
as the cell's `train.parallel` says (DDP or FSDP2). So a cell's numbers with N processes are those
of `torchrun --nproc-per-node N -m taperlm.cli train` on its config. Rank 0 holds the cell's run
dir lock, decides what the cell needs (`taperlm.compare.cell.cell_state`), records the session, and evaluates
the trained cell alone (the evaluation is single-process) before writing result.json.

Every rank answers each step the same way (a stop or a checkpoint is collective): each rank's own
wish (a stop was requested; `taperlm.compare.cell.CheckpointClock` says a checkpoint is due) is combined by an
all-reduce, the largest wish winning.

On GPUs every group sees only its own devices (`CUDA_VISIBLE_DEVICES`, `device_slots`): a cell's
numbers do not depend on which devices it got. The local executor launches the groups here
(`run_groups`); the Slurm executor runs the same `rank_main` in each task of a cell's job
(`taperlm.compare.slurm`)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import queue
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taperlm.errors import ConfigError, TrainingError
from taperlm.files.outdirs import claim
from taperlm.files.runlock import locked

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

    from taperlm.compare.cell import (  # lazy: imports torch
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
    (`taperlm.compare.execute.GridDisplay`) shows progress, `finished(cell, result, status)`
    takes each result, `stop` (`taperlm.compare.execute.StopRequest`) tells of a Ctrl-C,
    `wants(cell)` whether a cell not yet handed out should still start (a sequential comparison
    that has stopped: no)."""
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


ACTIONS = (None, "checkpoint", "stop")  # a step's answer, by rank of urgency


def device_slots(devices: int, nproc: int, jobs: int) -> list[list[int]]:
    """The devices of each of `jobs` cells running at once, `nproc` each: slot i gets devices
    i*nproc .. i*nproc+nproc-1, so no two running cells share one. ConfigError when they do
    not fit."""
    if nproc < 1 or jobs < 1:
        raise ConfigError(f"--nproc-per-cell and --jobs must be >= 1, got {nproc} and {jobs}")
    if jobs * nproc > devices:
        raise ConfigError(
            f"--jobs {jobs} x --nproc-per-cell {nproc} = {jobs * nproc} GPUs, but {devices} "
            f"are visible; give --jobs {max(1, devices // nproc)} or fewer"
            if devices >= nproc
            else f"--nproc-per-cell {nproc} needs {nproc} GPUs per cell, but {devices} are "
            "visible; give a smaller --nproc-per-cell"
        )
    return [list(range(i * nproc, (i + 1) * nproc)) for i in range(jobs)]


def group_env(rank: int, nproc: int, port: int, devices: list[int] | None) -> dict[str, str]:
    """The torchrun-style environment of rank `rank` of a one-machine group of `nproc`
    (`devices`: the group's GPUs, as CUDA_VISIBLE_DEVICES; None: CPU, gloo)."""
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in devices)
    return env


def free_port() -> int:
    """A TCP port free on the loopback interface now (the group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class CellTask:
    """What every rank of a cell's group needs (picklable: sent to spawned processes and, by
    submitit, to Slurm jobs)."""

    cell: Any  # taperlm.compare.grid.Cell
    run_dir: str
    data_dir: str
    settings: dict[str, Any]  # EvalSettings.to_dict()
    threads: int  # torch threads per process
    jobs: int  # cells at a time (recorded with the session)


def rank_main(task: CellTask, env: dict[str, str], events: Any = None) -> None:
    """One rank of a cell's group, in a process of its own: sets the group's environment and
    torch threads before torch is imported, asks for a stop at the next step on SIGINT/SIGTERM,
    then `run_rank`. Rank 0 puts ("done", status) or ("interrupted", message) on `events`."""
    os.environ.update(env)
    for name in THREAD_ENV:
        os.environ[name] = str(task.threads)
    stop = {"requested": False}

    def request_stop(signum, frame) -> None:
        stop["requested"] = True

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)
    import torch  # lazy: after the thread variables above

    torch.set_num_threads(task.threads)
    from taperlm.compare.cell import CellInterrupted  # lazy: torch

    try:
        status = run_rank(task, lambda: stop["requested"])
    except CellInterrupted as err:
        if events is not None:
            events.put(("interrupted", str(err)))
        raise SystemExit(3) from None
    if events is not None and status is not None:
        events.put(("done", status))


def run_rank(task: CellTask, stopping: Callable[[], bool]) -> str | None:
    """This process's part of the cell (the group's environment already set): rank 0 returns the
    cell's status ("cached", "trained", ...), the other ranks None. CellInterrupted on every
    rank when a stop ended training early."""
    from taperlm.compare.cell import (  # lazy: torch
        CellInterrupted,
        CheckpointClock,
        EvalSettings,
        SharedInputs,
        cell_state,
        run_cell,
    )
    from taperlm.training.distributed import (  # lazy: torch
        broadcast_object,
        init_distributed,
        shutdown,
    )
    from taperlm.training.loop import train  # lazy: torch

    cell, run_dir = task.cell, Path(task.run_dir)
    info = init_distributed(cell.config.train.device)
    hook = _agreed_hook(CheckpointClock(cell.config.train.checkpoint_every, stopping))
    try:
        with contextlib.ExitStack() as hold:
            state: str | None = None
            if info.is_main:
                try:
                    claim(run_dir, "run")
                    hold.enter_context(locked(run_dir))  # held through training and evaluation
                    state = cell_state(cell, run_dir, task.settings)[0]
                except BaseException:
                    broadcast_object("failed", info)  # the other ranks must not wait in train
                    raise
            state = broadcast_object(state, info)
            if state == "failed":
                raise TrainingError(f"{cell.name}: rank 0 of its group failed (see its error)")
            if not info.is_main:
                if state == "train":
                    res = train(cell.config, run_dir, resume="auto", progress=False, on_step=hook)
                    if not res.finished:
                        raise CellInterrupted(cell.name, res.step, res.total_steps)
                return None
            shared = SharedInputs(Path(task.data_dir), EvalSettings.from_dict(task.settings))
            _, status = run_cell(cell, run_dir, shared, False, hook, None, task.jobs)
            return status
    finally:
        shutdown(info)


def _agreed_hook(clock: Callable[[int, int], str | None]):
    """The trainer's `on_step` for one rank: this rank's wish (`clock`), the group's largest."""

    def hook(step: int, total: int, loss: float) -> str | None:
        wish = ACTIONS.index(clock(step, total))
        import torch  # lazy: torch is loaded by now
        import torch.distributed as dist  # lazy: as torch above

        if dist.is_available() and dist.is_initialized():
            on = (
                torch.device("cuda", torch.cuda.current_device())
                if dist.get_backend() == "nccl"
                else torch.device("cpu")
            )
            value = torch.tensor([wish], dtype=torch.int64, device=on)
            dist.all_reduce(value, op=dist.ReduceOp.MAX)
            wish = int(value.item())
        if wish == ACTIONS.index("stop") and step >= total:
            return None  # the last step: a stop there would only finish
        return ACTIONS[wish]

    return hook


def run_group(
    task: CellTask, nproc: int, devices: list[int] | None, stop_requested: Callable[[], bool]
) -> str:
    """Train and evaluate one cell as a group of `nproc` spawned processes on this machine
    (`devices`: its GPUs; None: CPU); returns rank 0's status. CellInterrupted when a stop
    (`stop_requested()`, passed on to the group as SIGTERM) ended it early; TrainingError when a
    rank failed (the others are stopped; the cell's checkpoints stay intact)."""
    from taperlm.compare.cell import CellInterrupted  # lazy: torch

    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    port = free_port()
    procs = []
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN) if _main_thread() else None
    try:
        for rank in range(nproc):
            env = group_env(rank, nproc, port, devices)
            p = ctx.Process(
                target=rank_main,
                args=(task, env, events if rank == 0 else None),
                name=f"taperlm-cell-{task.cell.name}-rank{rank}",
                daemon=True,
            )
            p.start()
            procs.append(p)
    finally:
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
    signalled = False
    try:
        while any(p.is_alive() for p in procs):
            if stop_requested() and not signalled:
                signalled = True
                _signal(procs, signal.SIGTERM)
            if any(p.exitcode not in (None, 0, 3) for p in procs):
                _signal(procs, signal.SIGTERM)  # a rank failed: the others cannot go on
                time.sleep(2.0)
                for p in procs:
                    if p.is_alive():
                        p.kill()
                break
            time.sleep(0.1)
        for p in procs:
            p.join()
    except BaseException:
        for p in procs:
            if p.is_alive():
                p.kill()
        raise
    outcome = None
    with contextlib.suppress(Exception):
        while True:
            outcome = events.get(timeout=0.5)
            if outcome[0] == "done":
                break
    codes = [p.exitcode for p in procs]
    if outcome is not None and outcome[0] == "done" and all(c == 0 for c in codes):
        return str(outcome[1])
    if (outcome is not None and outcome[0] == "interrupted") or all(c in (0, 3) for c in codes):
        from taperlm.checkpoint.store import list_checkpoints  # lazy: torch

        saved = [step for step, _ in list_checkpoints(Path(task.run_dir))]
        raise CellInterrupted(task.cell.name, max(saved, default=0), task.cell.config.train.steps)
    raise TrainingError(
        f"cell {task.cell.name}: its group of {nproc} processes failed (exit codes {codes}); its "
        "newest checkpoint is intact: rerun the same command to resume"
    )


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _signal(procs, sig: int) -> None:
    for p in procs:
        if p.is_alive() and p.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, sig)


def run_groups(
    todo, runs: Path, data_dir: Path, settings, jobs: int, threads: int, nproc: int,
    slots: list[list[int]] | None, display, finished, stop, wants,
) -> None:  # fmt: skip
    """The local executor's cells as groups (`run_group`), `jobs` at a time: each slot a thread
    that launches the next wanted cell's group on the slot's devices (`slots[i]`; None: CPU).
    Results go to `finished(cell, result, status)` in this (the main) thread; a failed group
    stops the others at their next step (checkpointed) and is raised; a stop (Ctrl-C) raises
    KeyboardInterrupt once every group has checkpointed."""
    from taperlm.compare.cell import CellInterrupted, read_result  # lazy: torch

    pending = list(todo)
    lock = threading.Lock()
    outcomes: list[tuple[Any, Any, str | BaseException]] = []
    failed: list[BaseException] = []

    def next_cell():
        with lock:
            while pending:
                cell = pending.pop(0)
                if wants(cell) and not failed and not stop.requested:
                    return cell
            return None

    def slot_loop(slot: int) -> None:
        while (cell := next_cell()) is not None:
            task = CellTask(cell, str(runs / cell.name), str(data_dir), settings.to_dict(),
                            threads, jobs)  # fmt: skip
            devices = slots[slot] if slots is not None else None
            try:
                status = run_group(task, nproc, devices, lambda: stop.requested or bool(failed))
            except BaseException as err:  # handed to the main thread
                with lock:
                    if not isinstance(err, CellInterrupted):
                        failed.append(err)
                    outcomes.append((cell, None, err))
                return
            with lock:
                outcomes.append((cell, read_result(runs / cell.name), status))

    workers = [threading.Thread(target=slot_loop, args=(i,), daemon=True) for i in range(jobs)]
    for w in workers:
        w.start()
    interrupted: list[str] = []
    while any(w.is_alive() for w in workers) or outcomes:
        with lock:
            ready, outcomes[:] = list(outcomes), []
        for cell, result, status in ready:
            if isinstance(status, CellInterrupted):
                interrupted.append(str(status))
            elif not isinstance(status, BaseException):
                finished(cell, result, status)
        time.sleep(0.1)
    for line in interrupted:
        display.write(f"taperlm compare: {line}")
    if failed:
        raise failed[0]
    if stop.requested or interrupted:
        raise KeyboardInterrupt

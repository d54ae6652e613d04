"""The Slurm executor (`taperlm compare --executor slurm`): each cell a Slurm job, through
submitit (the `[slurm]` extra; docs/cluster.md says why submitit).

A cell's job runs its --nproc-per-cell processes as the job's tasks across --slurm-nodes nodes;
every task exports the torchrun environment (submitit's `TorchDistributedEnvironment`) and runs
the rank code of the local executor's process groups (`taperlm.compare.workers.run_rank`), so a
cell computes what it computes on one machine with the same number of processes. Cells that go
out together (a wave) are one job array.

The output folder on the shared filesystem is the whole state. Each cell's folder holds its run
(checkpoints, result.json once done); OUT/slurm/cells/<cell>.json records the jobs submitted for
it (id, log paths); OUT/slurm/jobs/ is submitit's folder (the job's pickled call, its logs).
Running the command again reads these, asks `squeue` (and `sacct` where accounting is on) what
became of each job, shows every cell's state (done, queued, running, failed, missing) with job ids
and logs, submits only what is missing, and writes the report from the finished cells.

Faults: a job that runs out of time or is preempted is requeued by submitit (Slurm's warning
signal, USR2 90 s before the limit) and resumes from its cell's last checkpoint (at most
`taperlm.compare.cell.CHECKPOINT_SECONDS` old, or the cell's own train.checkpoint_every); a job killed otherwise
(scancel, a node failure, an error) is resubmitted by the next run of the command, again resuming
from the last checkpoint, until a cell has failed MAX_ATTEMPTS times: then it is reported with its
log and not submitted again. What keeps one cell from training twice at once, from two login
nodes: the command holds the comparison folder's lock (`taperlm.files.runlock`, flock on OUT/.lock)
while it submits, so two commands never submit at the same time, and one sees the other's jobs
queued or running in `squeue` and does not submit them again; and rank 0 of every cell's job holds
the cell's run dir lock (flock on runs/<cell>/.lock) while it trains, so a second job of the same
cell stops before training. flock locks hold across hosts on NFSv4 and on Lustre mounted with
`flock` (docs/cluster.md)."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from taperlm.compare.cell import EvalSettings, cell_state
from taperlm.compare.execute import PendingCells
from taperlm.compare.grid import Cell
from taperlm.compare.options import CompareOptions
from taperlm.compare.results import read_record, write_record
from taperlm.compare.workers import CellTask, run_rank
from taperlm.errors import ConfigError, MalformedFileError

MAX_ATTEMPTS = 3  # jobs of one cell that ended without finishing it before it is given up
POLL_S = 30.0  # --wait: seconds between looks at the queue
COMMAND_TIMEOUT_S = 60.0  # sbatch/squeue/sacct/scancel
QUEUED = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED", "CONFIGURING")
RUNNING = ("RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING")


def parse_minutes(text: str) -> int:
    """--slurm-time in Slurm's forms (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) as whole
    minutes (rounded up); ConfigError naming the option otherwise."""
    given = text.strip()
    try:
        days, rest = given.split("-", 1) if "-" in given else ("0", given)
        parts = [int(p) for p in rest.split(":")]
        d = int(days)
        if "-" in given:  # D-HH[:MM[:SS]]
            h, m, s = [*parts, 0, 0][:3]
        elif len(parts) == 1:
            h, m, s = 0, parts[0], 0
        elif len(parts) == 2:
            h, m, s = 0, parts[0], parts[1]
        else:
            h, m, s = parts
        if len(parts) > 3 or min(d, h, m, s) < 0:
            raise ValueError
    except ValueError:
        raise ConfigError(
            f"--slurm-time {text!r} is not a Slurm time limit; give e.g. 12:00:00, 90 (minutes) "
            "or 2-00:00:00"
        ) from None
    minutes = d * 1440 + h * 60 + m + (1 if s else 0)
    if minutes < 1:
        raise ConfigError(f"--slurm-time {text!r} is under a minute; give e.g. 12:00:00")
    return minutes


def parse_extra(text: str) -> dict[str, Any]:
    """--slurm-extra ('--mem=64G --exclusive') as submitit's additional sbatch parameters;
    ConfigError for anything that is not an sbatch long option."""
    out: dict[str, Any] = {}
    words = shlex.split(text)
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--") or len(word) < 3:
            raise ConfigError(
                f"--slurm-extra: {word!r} is not an sbatch long option; give e.g. "
                "'--mem=64G --exclusive'"
            )
        key, eq, value = word[2:].partition("=")
        if not eq and i + 1 < len(words) and not words[i + 1].startswith("--"):
            value, i = words[i + 1], i + 1
        out[key.replace("-", "_")] = value if (eq or value) else True
        i += 1
    return out


@dataclass(frozen=True)
class SlurmSettings:
    """Every cell's job: where (partition, account, qos, constraint), how long, how large."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    minutes: int | None = None
    nodes: int = 1
    tasks_per_node: int = 1  # processes of the cell on each node
    gpus_per_node: int = 0
    cpus_per_task: int = 1
    constraint: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_options(cls, opts: CompareOptions) -> SlurmSettings:
        on_cuda = _on_cuda(opts)
        nproc, nodes = opts.nproc_per_cell, opts.slurm_nodes
        if nproc % nodes:
            raise ConfigError(
                f"--nproc-per-cell {nproc} does not split evenly across --slurm-nodes {nodes}; "
                "give a multiple of the nodes"
            )
        per_node = nproc // nodes
        gpus = opts.slurm_gpus_per_node
        if gpus is None:
            gpus = per_node if on_cuda else 0
        return cls(
            partition=opts.slurm_partition,
            account=opts.slurm_account,
            qos=opts.slurm_qos,
            minutes=parse_minutes(opts.slurm_time) if opts.slurm_time else None,
            nodes=nodes,
            tasks_per_node=per_node,
            gpus_per_node=gpus,
            cpus_per_task=opts.threads,
            constraint=opts.slurm_constraint,
            extra=parse_extra(opts.slurm_extra),
        )

    def submitit_parameters(self) -> dict[str, Any]:
        """The parameters of `submitit.SlurmExecutor.update_parameters` (None: left out)."""
        params: dict[str, Any] = {
            "partition": self.partition,
            "account": self.account,
            "qos": self.qos,
            "time": self.minutes,
            "nodes": self.nodes,
            "ntasks_per_node": self.tasks_per_node,
            "cpus_per_task": self.cpus_per_task,
            "gpus_per_node": self.gpus_per_node or None,
            "constraint": self.constraint,
        }
        if self.extra:
            params["additional_parameters"] = dict(self.extra)
        return params

    def sbatch_args(self) -> list[str]:
        """The same settings as sbatch arguments (the dry run, `sbatch --test-only`)."""
        args = []
        for key, value in self.submitit_parameters().items():
            if key == "additional_parameters":
                for k, v in value.items():
                    flag = "--" + k.replace("_", "-")
                    args.append(flag if v is True else f"{flag}={v}")
            elif value is not None:
                args.append(f"--{key.replace('_', '-')}={value}")
        return args


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)


def check_cluster(settings: SlurmSettings) -> None:
    """Refuse, before anything is submitted, a cluster that cannot take the jobs: no Slurm here,
    no submitit, or settings Slurm rejects (a wrong partition, account, qos, constraint or
    size: `sbatch --test-only` asks the controller without submitting)."""
    if shutil.which("sbatch") is None or shutil.which("squeue") is None:
        raise ConfigError(
            "--executor slurm needs Slurm's sbatch and squeue on PATH (run it on a login node "
            "of the cluster)"
        )
    try:
        import submitit  # noqa: F401  (checked here, before any work)
    except ImportError:
        raise ConfigError("--executor slurm needs submitit: pip install 'taperlm[slurm]'") from None
    r = _run(["sbatch", "--test-only", *settings.sbatch_args(), "--wrap", "true"])
    if r.returncode != 0:
        said = " ".join(ln.strip() for ln in r.stderr.splitlines() if ln.strip())[:500]
        raise ConfigError(
            f"Slurm refuses these job settings ({' '.join(settings.sbatch_args())}): {said}; "
            "check --slurm-partition/--slurm-account/--slurm-qos/--slurm-constraint (sinfo, "
            "sacctmgr show assoc user=$USER)"
        )


class CellJob:
    """The call a cell's Slurm job runs in each of its tasks (pickled by submitit). Its
    `checkpoint` makes it checkpointable for submitit (which looks for the method), so a
    timeout or preemption requeues it: the cell then resumes from its last checkpoint."""

    def __init__(self, task: CellTask) -> None:
        self.task = task

    def __call__(self) -> str | None:

        import submitit

        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ[name] = str(self.task.threads)
        torch.set_num_threads(self.task.threads)
        return run_rank(self.task, lambda: False)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(CellJob(self.task))


@dataclass(frozen=True)
class SlurmJob:
    """One job submitted for a cell (an entry of its record's `jobs`)."""

    id: str  # the Slurm job id (array tasks: <array>_<task>)
    stdout: str | None = None  # its log files (None: not recorded)
    stderr: str | None = None
    submitted: str | None = None  # when (local time, ISO 8601)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SlurmJob:
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})


@dataclass
class CellRecord:
    """OUT/slurm/cells/<cell>.json: the jobs submitted for one cell, oldest first, and those
    cancelled by a decided sequential stop (not failures)."""

    jobs: list[SlurmJob] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"jobs": [j.to_json() for j in self.jobs], "cancelled": self.cancelled}

    @classmethod
    def from_json(cls, data: Any) -> CellRecord:
        """The record `to_json` wrote, entries not of its shape left out; ValueError when it
        holds no list of jobs."""
        if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
            raise ValueError("no list of jobs")
        jobs = [
            SlurmJob.from_json(j)
            for j in data["jobs"]
            if isinstance(j, dict) and isinstance(j.get("id"), str)
        ]
        cancelled = [str(c) for c in data.get("cancelled", []) if isinstance(c, str)]
        return cls(jobs, cancelled)

    @classmethod
    def read(cls, path: Path) -> CellRecord:
        if not path.is_file():
            return cls()
        try:
            return read_record(path, "Slurm cell record", cls.from_json)
        except MalformedFileError:
            raise
        except ValueError:
            raise ConfigError(
                f"{path} is not a Slurm cell record; move it away and rerun"
            ) from None

    def write(self, path: Path) -> None:
        write_record(path, self)


def job_states(name: str) -> dict[str, str]:
    """Job id -> Slurm state of this comparison's jobs still known to the controller (queued,
    running, or ended moments ago), by job name; array tasks one by one."""
    r = _run(["squeue", "-h", "-r", "--name", name, "-o", "%i|%T"])
    if r.returncode != 0:
        raise ConfigError(f"squeue failed: {r.stderr.strip()[:300]}")
    out = {}
    for line in r.stdout.splitlines():
        job, _, state = line.strip().partition("|")
        if job:
            out[job] = state
    return out


def ended_state(job_id: str) -> str:
    """How an ended job ended (sacct: COMPLETED, TIMEOUT, PREEMPTED, FAILED, CANCELLED, ...),
    or "ENDED" where accounting is off."""
    if shutil.which("sacct") is None:
        return "ENDED"
    r = _run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State"])
    states = [s.split()[0] for s in r.stdout.split() if s.strip()] if r.returncode == 0 else []
    return states[-1] if states else "ENDED"


@dataclass
class SlurmExecutor:
    """Cells as Slurm jobs (the module docstring); `CellExecutor` of `taperlm.compare.executor`.
    `jobs`: cells in flight at once (a wave); `wait`: poll until every wanted cell is done."""

    out: Path
    jobs: int
    data_dir: Path
    settings: EvalSettings
    slurm: SlurmSettings
    threads: int = 1
    wait: bool = False
    poll_s: float = POLL_S
    log: Any = None  # message -> None (None: stderr)

    @classmethod
    def from_options(
        cls, opts: CompareOptions, jobs: int, data_dir: Path, settings: EvalSettings
    ) -> SlurmExecutor:
        slurm = SlurmSettings.from_options(opts)
        check_cluster(slurm)
        return cls(opts.out, jobs, data_dir, settings, slurm, opts.threads, opts.wait, POLL_S)

    @property
    def name(self) -> str:
        """The Slurm job name of this comparison's jobs (one per --out folder)."""
        digest = hashlib.sha256(str(self.out.resolve()).encode()).hexdigest()[:10]
        return f"taperlm-{digest}"

    def _say(self, msg: str) -> None:
        (self.log or (lambda m: print(m, file=sys.stderr)))(f"taperlm compare: {msg}")

    def run(self, todo: list[Cell], runs: Path, display, finished, stop, wants) -> None:
        cells_dir = self.out / "slurm" / "cells"
        cells_dir.mkdir(parents=True, exist_ok=True)
        left = list(todo)
        while True:
            live = job_states(self.name)
            table, submit, active, waiting = [], [], 0, []
            for cell in list(left):
                state, cached = cell_state(cell, runs / cell.name, self.settings.to_dict())
                if state == "cached":
                    left.remove(cell)
                    finished(cell, cached, "done")
                    continue
                record = CellRecord.read(cells_dir / f"{cell.name}.json")
                status, job = self._status(cell, record, live)
                if status in ("queued", "running") and not wants(cell):
                    self._cancel(cell, record, cells_dir, job, status)
                    status = "cancelled (decided)"
                elif status in ("queued", "running"):
                    active += 1
                elif status == "missing" and wants(cell):
                    submit.append(cell)
                    waiting.append(cell.name)
                table.append((cell.name, status, job))
            room = max(0, self.jobs - active)
            wave = submit[:room]
            if wave and not stop.requested:
                for cell, job in zip(wave, self._submit(wave, runs, cells_dir)):
                    table = [(n, "queued (new)", job) if n == cell.name else (n, s, j)
                             for n, s, j in table]  # fmt: skip
                    waiting.remove(cell.name)
            self._show(table)
            pending = [t for t in table if t[1].startswith(("queued", "running"))]
            failed = [t for t in table if t[1].startswith("failed")]
            if not pending and not waiting:
                if failed:
                    raise ConfigError(
                        f"{len(failed)} cell(s) failed {MAX_ATTEMPTS} times and are not "
                        "submitted again: "
                        + "; ".join(f"{n}: {j}" for n, _, j in failed)
                        + "; fix the cause (its log), then delete its record under "
                        f"{cells_dir} and rerun"
                    )
                return
            if stop.requested:
                raise KeyboardInterrupt
            if not self.wait:
                raise PendingCells(
                    f"{len(pending)} cell(s) queued or running on Slurm (job name {self.name}); "
                    "run the same command again to see their state, submit what is missing and "
                    "write the report (or add --wait)"
                )
            time.sleep(self.poll_s)

    def _status(self, cell: Cell, record: CellRecord, live: dict[str, str]) -> tuple[str, str]:
        """(state, what to show: the job id and log) of a cell not done."""
        if not record.jobs:
            return "missing", ""
        last = record.jobs[-1]
        where = f"job {last.id}, log {last.stderr or '?'}"
        state = live.get(last.id)
        if state in QUEUED:
            return "queued", where
        if state in RUNNING:
            return "running", where
        failures = [j for j in record.jobs if j.id not in record.cancelled]
        if len(failures) >= MAX_ATTEMPTS:
            how = ended_state(last.id)
            return f"failed ({len(failures)} jobs, the last {how})", where
        return "missing", where  # ended without finishing: submitted again, resuming

    def _cancel(self, cell, record: CellRecord, cells_dir: Path, job: str, status: str) -> None:
        """scancel a job of a cell the sequential stop no longer needs (a running one stops at
        once; its checkpoints stay for a later run that needs the cell)."""
        job_id = record.jobs[-1].id
        _run(["scancel", job_id])
        record.cancelled.append(job_id)
        record.write(cells_dir / f"{cell.name}.json")
        self._say(f"{cell.name}: {status} job {job_id} cancelled (the comparison is decided)")

    def _submit(self, wave: list[Cell], runs: Path, cells_dir: Path) -> list[str]:
        """Submit the wave (a job array when it has several cells: its cells ask for the same
        resources); record each job; returns what to show per cell."""
        import submitit

        folder = self.out / "slurm" / "jobs" / "%j"
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=MAX_ATTEMPTS)
        executor.update_parameters(job_name=self.name, **self.slurm.submitit_parameters())
        submitted = []
        with executor.batch():
            for cell in wave:
                task = CellTask(
                    cell, str(runs / cell.name), str(self.data_dir), self.settings.to_dict(),
                    self.threads, self.jobs,
                )  # fmt: skip
                submitted.append(executor.submit(CellJob(task)))
        shown = []
        for cell, job in zip(wave, submitted):
            path = cells_dir / f"{cell.name}.json"
            record = CellRecord.read(path)
            entry = SlurmJob(
                id=str(job.job_id),
                stdout=str(job.paths.stdout),
                stderr=str(job.paths.stderr),
                submitted=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            )
            record.jobs.append(entry)
            record.write(path)
            shown.append(f"job {entry.id}, log {entry.stderr}")
        return shown

    def _show(self, table: list[tuple[str, str, str]]) -> None:
        if not table:
            return
        width = max(len(n) for n, _, _ in table)
        lines = [f"  {n:<{width}}  {s}" + (f"  ({j})" if j else "") for n, s, j in table]
        self._say("cells on Slurm (done cells not shown):\n" + "\n".join(lines))


def _on_cuda(opts: CompareOptions) -> bool:
    """Whether --set train.device=cuda asks for GPUs (then each node gets one per process
    unless --slurm-gpus-per-node says otherwise); with the default device (auto) the jobs get
    the GPUs --slurm-gpus-per-node asks for, none without it."""
    for o in opts.overrides:
        key, _, value = o.partition("=")
        if key.strip() == "train.device":
            return value.strip().startswith("cuda")
    return False


def describe_jobs(opts: CompareOptions, cells: int) -> str:
    """What `--dry-run` says of the jobs it would submit."""
    slurm = SlurmSettings.from_options(opts)
    return (
        f"{cells} Slurm job(s), one per cell, as job arrays of one wave each: sbatch "
        + " ".join(slurm.sbatch_args())
        + f" (each job {slurm.nodes} node(s) x {slurm.tasks_per_node} task(s))"
    )

"""Fault-injection harness for `taperlm train`: SIGKILL at random moments, resume, compare.

One *trial* trains a tiny model (2 layers, d_model 32, vocab 320, seq 32, 16 steps, a checkpoint
every step, keep 2) into a fresh run dir, killing the training process with SIGKILL up to
`max_kills` times -- either after a random delay inside the training window, or the moment a
checkpoint's temporary directory appears (mid-write) -- and rerunning the same command after each
kill until it finishes. After every kill the harness checks, with its own manifest/sha256 reader:

* every `checkpoints/step_*` directory either verifies or is older than the newest one that does
  (an interrupted pruning of an old checkpoint is harmless; a partial *newest* checkpoint is not);
* the next attempt resumes from exactly the newest checkpoint that verifies (or starts fresh when
  there is none) -- the child process logs what `Trainer._restore` was given;

and at the end: the run finished (exit 0), and its per-step losses, validation losses and final
weights are bitwise equal to an uninterrupted run of the same command (CPU, one thread).

Children are forked from a process that has already imported torch (fast: no 4 s import per
attempt) or, with `--spawn exec`, started as fresh interpreters (`python tests/fault_harness.py
--child train ...`). Both are real processes killed with SIGKILL.

Opt-in long run (result in docs/reliability.md):

    python tests/fault_harness.py --trials 100 --seed 0 [--spawn fork|exec] [--json out.json]

Child mode (also the torchrun entry point of tests/training/test_torchrun_restart.py):

    python tests/fault_harness.py --child train --preset ... --out RUN
    env: TAPERLM_HARNESS_LOG=FILE          append one JSON line per restore / injected death
         TAPERLM_HARNESS_DIE_AT_STEP=K     exit with os._exit(17) before optimizer step K ...
         TAPERLM_HARNESS_DIE_RANK=R        ... on rank R only (default 1) ...
         (only on the first torchrun attempt: TORCHELASTIC_RESTART_COUNT unset or 0)
         TAPERLM_HARNESS_PAUSE_AT_STEP=K   sleep 60 s inside the checkpoint write of step K, after
                                           the weight shards and before state.pt (a kill then
                                           lands mid-write, deterministically)
         TAPERLM_HARNESS_MEASURE=1         log checkpoint save/restore seconds, the bytes of
                                           parameters, gradients and optimizer state at the
                                           first step, and the peak RSS at exit (the 440M dry
                                           run, tests/training/test_scale_dryrun.py)
         TAPERLM_HARNESS_START_AT=T        start the command at unix time T (two writers racing)

Two writers (`--two-writers N`): N trials in which two processes train the same run dir, started
at the same instant or up to a second apart; exactly one may write (the other stops with an error
naming the holder, or finds the run finished), their lock-holding intervals never overlap, and
the run is bitwise the uninterrupted one.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
LOG_ENV = "TAPERLM_HARNESS_LOG"
DIE_STEP_ENV = "TAPERLM_HARNESS_DIE_AT_STEP"
DIE_RANK_ENV = "TAPERLM_HARNESS_DIE_RANK"
PAUSE_STEP_ENV = "TAPERLM_HARNESS_PAUSE_AT_STEP"
MEASURE_ENV = "TAPERLM_HARNESS_MEASURE"
START_AT_ENV = "TAPERLM_HARNESS_START_AT"
DIE_CODE = 17

# 16 optimizer steps of 128 tokens; checkpoint every step, keep 2 (so pruning runs every step).
TINY_SETS = [
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=2",
    "model.mlp_width=96",
    "model.vocab_size=320",
    "model.context_length=64",
    "train.seq_len=32",
    "train.micro_batch_size=4",
    "train.batch_tokens=128",
    "train.tokens=2048",
    "train.warmup_tokens=256",
    "train.lr=0.003",
    "train.log_every=1",
    "train.eval_every=4",
    "train.eval_tokens=64",
    "train.checkpoint_every=1",
    "train.keep_checkpoints=2",
]
TOTAL_STEPS = 16
WORDS = (
    "the a king queen lord lady speak hear night day sword crown love hate old young river "
    "castle horse storm fire stone bread wine shall will must not never ever good ill".split()
)


# ----------------------------------------------------------------------------------------------
# data and commands


def corpus_text(n_words: int = 6000, seed: int = 0) -> str:
    rng = random.Random(seed)
    lines, line = [], []
    for _ in range(n_words):
        line.append(rng.choice(WORDS))
        if len(line) >= rng.randint(6, 14):
            lines.append(" ".join(line).capitalize() + ".")
            line = []
    return "\n".join(lines) + "\n"


def prepare_data(root: Path, seed: int = 0, vocab: int = 300) -> Path:
    """A tiny `taperlm prepare` data dir (byte-level BPE with `vocab` ids) under `root`."""
    from taperlm.cli import main

    root.mkdir(parents=True, exist_ok=True)
    src = root / f"corpus{seed}.txt"
    src.write_text(corpus_text(seed=seed), encoding="utf-8")
    out = root / f"data{seed}"
    argv = ["prepare", "--source", str(src), "--tokenizer", f"bpe:{vocab}", "--out", str(out)]
    rc = main([*argv, "--val-tokens", "400", "--workers", "1", "--no-progress"])
    if rc != 0:
        raise RuntimeError(f"taperlm prepare failed ({rc})")
    return out


def train_argv(data: Path, out: Path, *extra_sets: str) -> list[str]:
    """`taperlm train` arguments of the tiny harness run (without the program name)."""
    argv = ["train", "--preset", "transformer-tiny", "--data", str(data), "--out", str(out)]
    for s in [*TINY_SETS, *extra_sets]:
        argv += ["--set", s]
    return [*argv, "--no-progress"]


def compare_argv(data: Path, out: Path, *extra: str) -> list[str]:
    """`taperlm compare` of one uniform cell of the tiny harness model (2 steps of 128 tokens)."""
    sets = [*TINY_SETS[:6], "train.seq_len=32", "train.micro_batch_size=2",
            "train.batch_tokens=64", "train.eval_tokens=64"]  # fmt: skip
    argv = ["compare", "--preset", "transformer-tiny", "--data", str(data), "--out", str(out),
            "--tapers", "uniform", "--seeds", "1", "--tokens", "128", "--val-tokens", "64",
            "--novelty-tokens", "64", "--threads", "1", "--no-progress"]  # fmt: skip
    for s in sets:
        argv += ["--set", s]
    return [*argv, *extra]


def child_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def inject_nan(monkeypatch: Any, steps: str) -> None:
    """Make the chosen optimizer steps non-finite (loss and every gradient NaN) in this process's
    trainers, so the tests of skipped steps, divergence stops and checkpoints that refuse NaN run
    the real trainer. `steps` (1-based): "3" | "3,5" | "3-" (from step 3 on)."""
    from taperlm.training import loop

    chosen = {int(p) for p in steps.split(",") if p.strip() and not p.strip().endswith("-")}
    start = next((int(p.strip()[:-1]) for p in steps.split(",") if p.strip().endswith("-")), None)
    real = loop.Trainer.forward_backward

    def poisoned(self, batches):
        loss = real(self, batches)
        n = self.step + 1
        if n in chosen or (start is not None and n >= start):
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.fill_(float("nan"))
            loss = loss * float("nan")
        return loss

    monkeypatch.setattr(loop.Trainer, "forward_backward", poisoned)


# ----------------------------------------------------------------------------------------------
# the child: the real CLI plus a restore logger and an optional injected rank death


def _log(event: dict[str, Any]) -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    event = {
        **event,
        "pid": os.getpid(),
        "rank": int(os.environ.get("RANK", "0")),
        "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(event) + "\n").encode())
    finally:
        os.close(fd)


def install_hooks() -> None:
    """Patch the trainer: log every restore; die at step K on one rank on the first attempt."""
    from taperlm.training import loop

    real_restore = loop.Trainer._restore

    def restore(self, path):
        _log({"event": "restore", "path": str(path), "step": int(Path(path).name.split("_")[-1])})
        return real_restore(self, path)

    loop.Trainer._restore = restore  # type: ignore[method-assign]

    from taperlm.files import runlock

    real_acquire, real_release = runlock.RunLock.acquire, runlock.RunLock.release

    def acquire(self):
        try:
            out = real_acquire(self)
        except Exception:
            _log({"event": "lock_refused", "t": time.time(), "dir": str(self.directory)})
            raise
        _log({"event": "lock", "t": time.time(), "dir": str(self.directory)})
        return out

    def release(self):
        if self.held:
            _log({"event": "unlock", "t": time.time(), "dir": str(self.directory)})
        return real_release(self)

    runlock.RunLock.acquire = acquire  # type: ignore[method-assign]
    runlock.RunLock.release = release  # type: ignore[method-assign]

    pause_at = int(os.environ.get(PAUSE_STEP_ENV, "0") or 0)
    if pause_at:
        from taperlm.checkpoint import store

        real_write = store._write_state

        def write_state(path, state):
            if state.get("step") == pause_at:
                _log({"event": "pause", "step": pause_at, "path": str(path.parent)})
                time.sleep(60)
            return real_write(path, state)

        store._write_state = write_state

    die_at = int(os.environ.get(DIE_STEP_ENV, "0") or 0)
    die_rank = int(os.environ.get(DIE_RANK_ENV, "1") or 1)
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") in ("", "0")
    if die_at and first_attempt:
        real_forward_backward = loop.Trainer.forward_backward

        def forward_backward(self, batches):
            if self.step + 1 == die_at and self.info.rank == die_rank:
                _log({"event": "die", "step": die_at})
                os._exit(DIE_CODE)
            return real_forward_backward(self, batches)

        loop.Trainer.forward_backward = forward_backward  # type: ignore[method-assign]


def _tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (local shards of DTensors)."""
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors if t is not None]
    return sum(
        {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in local}.values()
    )


def install_measurements() -> None:
    """TAPERLM_HARNESS_MEASURE=1: log the seconds of every checkpoint save and restore, and the
    bytes of parameters, gradients and optimizer state this rank holds at its first step."""
    from taperlm.training import loop

    for name in ("save", "_restore"):
        real = getattr(loop.Trainer, name)

        def timed(self, *a, _real=real, _name=name, **k):
            t0 = time.perf_counter()
            out = _real(self, *a, **k)
            seconds = time.perf_counter() - t0
            _log({"event": f"{_name.strip('_')}_time", "step": self.step, "s": seconds})
            return out

        setattr(loop.Trainer, name, timed)
    from taperlm.training import optim

    real_step = optim.PeriodicOptimizer.step

    def step(self):
        params = [p for g in self.param_groups for p in g["params"]]
        grads = _tensor_bytes(p.grad for p in params)
        out = real_step(self)
        if not getattr(self, "_measured", False):
            self._measured = True
            state = [v for s in self.state.values() for k, v in s.items() if k != "step"]
            _log(
                {
                    "event": "tensors",
                    "parameters": _tensor_bytes(params),
                    "gradients": grads,
                    "optimizer": _tensor_bytes(state),
                }
            )
        return out

    optim.PeriodicOptimizer.step = step  # type: ignore[method-assign]


def child_main(argv: list[str]) -> int:
    import resource

    import torch

    torch.set_num_threads(1)
    install_hooks()
    if os.environ.get(MEASURE_ENV):
        install_measurements()
    from taperlm.cli import main

    start_at = float(os.environ.get(START_AT_ENV, "0") or 0)
    if start_at:
        time.sleep(max(0.0, start_at - time.time()))
    try:
        return main(argv)
    finally:
        if os.environ.get(MEASURE_ENV):
            peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            _log({"event": "exit", "peak_rss_bytes": peak_kb * 1024})


# ----------------------------------------------------------------------------------------------
# independent checkpoint verification (does not use taperlm's own verifier)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def checkpoint_ok(path: Path) -> bool:
    """Whether a checkpoint dir is complete: manifest present and every file's size and sha256
    match it."""
    try:
        manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
        files = manifest["files"]
        if not files:
            return False
        for name, info in files.items():
            f = path / name
            if f.stat().st_size != info["bytes"] or _sha256(f) != info["sha256"]:
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def scan_checkpoints(run: Path) -> tuple[list[int], list[int], list[str]]:
    """(steps that verify, steps that do not, names of temp entries) under run/checkpoints."""
    good, bad, tmp = [], [], []
    root = run / "checkpoints"
    if not root.is_dir():
        return good, bad, tmp
    for p in sorted(root.iterdir()):
        if p.name.startswith(".tmp-"):
            tmp.append(p.name)
        elif p.is_dir() and p.name.startswith("step_"):
            (good if checkpoint_ok(p) else bad).append(int(p.name[5:]))
    return sorted(good), sorted(bad), tmp


def snapshot(path: Path) -> dict[str, str]:
    """relative path -> sha256 of every file below `path` (to prove nothing was overwritten)."""
    path = Path(path)
    if path.is_file():
        return {".": _sha256(path)}
    if not path.exists():
        return {}
    return {
        p.relative_to(path).as_posix(): _sha256(p) for p in sorted(path.rglob("*")) if p.is_file()
    }


def read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def metrics(run: Path) -> list[dict[str, Any]]:
    from taperlm.training.metrics import read_metrics

    return read_metrics(run / "metrics.jsonl")


def final_weights(run: Path, step: int = TOTAL_STEPS):
    """Full weights of a checkpoint (read from its shards by taperlm's converter)."""
    from taperlm.checkpoint.store import load_model_state

    return load_model_state(run / "checkpoints" / f"step_{step:08d}", verify=False)


# ----------------------------------------------------------------------------------------------
# starting and killing children


def preload() -> None:
    """Import what a training child needs once, before forking (saves seconds per attempt)."""
    import matplotlib

    matplotlib.use("Agg")
    import safetensors.torch
    import torch
    import torch.distributed.checkpoint
    import torch.distributed.checkpoint.state_dict

    import taperlm.commands.train
    import taperlm.data.loader
    import taperlm.models
    import taperlm.training.loop
    import taperlm.training.metrics
    import taperlm.training.optim

    # Import every taperlm module a training child would import lazily, so forked children never
    # read source files (other engineers may be editing the working tree while trials run).
    with contextlib.redirect_stdout(None):
        import pkgutil

        for mod in pkgutil.walk_packages(taperlm.__path__, "taperlm."):
            if mod.name.split(".")[1] not in ("hf", "evaluation", "analysis"):
                importlib.import_module(mod.name)
    del safetensors
    torch.set_num_threads(1)


@dataclass
class Child:
    pid: int
    proc: subprocess.Popen | None = None
    output: Path | None = None

    def poll(self) -> int | None:
        if self.proc is not None:
            return self.proc.poll()
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            return None
        self._status = os.waitstatus_to_exitcode(status)
        return self._status

    def kill(self) -> int:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        return self.wait()

    def wait(self) -> int:
        if self.proc is not None:
            return self.proc.wait()
        if hasattr(self, "_status"):
            return self._status
        _, status = os.waitpid(self.pid, 0)
        self._status = os.waitstatus_to_exitcode(status)
        return self._status


def start_child(
    argv: list[str],
    log: Path,
    output: Path,
    spawn: str = "fork",
    extra_env: dict[str, str] | None = None,
) -> Child:
    """Run `taperlm <argv>` (with the hooks) in a new process; stdout+stderr go to `output`."""
    env = {**child_env(), LOG_ENV: str(log), **(extra_env or {})}
    if spawn == "exec":
        with open(output, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, str(HERE), "--child", *argv],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return Child(proc.pid, proc, output)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child never returns into the caller (pytest or the trial loop)
        code = 70
        try:
            os.environ.update(env)
            fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (the process exits below)
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            before = {m for m in sys.modules if m.startswith("taperlm")}
            code = child_main(argv)
            late = sorted(m for m in sys.modules if m.startswith("taperlm") and m not in before)
            if late:  # read from disk after the fork: the trial may mix code versions
                _log({"event": "late_imports", "modules": late})
        except BaseException:  # report, never unwind into the parent's stack
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return Child(pid, None, output)


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


# ----------------------------------------------------------------------------------------------
# one trial


@dataclass
class Attempt:
    mode: str  # "random" | "ckpt" | "none" (not killed on purpose)
    expected_resume: int | None  # newest verifying checkpoint before the attempt
    resumed: int | None = None  # what the child logged
    killed: bool = False
    rc: int | None = None
    tmp_at_kill: bool = False  # a checkpoint temp dir of this process existed when killed
    good_after: list[int] = field(default_factory=list)
    bad_after: list[int] = field(default_factory=list)
    fallback_warnings: int = 0


@dataclass
class TrialResult:
    attempts: list[Attempt]
    failures: list[str]

    @property
    def ok(self) -> bool:
        return not self.failures


def reference_run(data: Path, out: Path, spawn: str = "fork") -> tuple[float, float]:
    """An uninterrupted run into `out`. Returns (first, last): seconds from config.yaml being
    written to the first and to the last checkpoint appearing -- the window random kills aim at."""
    log, text = out.parent / "ref-log.jsonl", out.parent / "ref.out"
    child = start_child(train_argv(data, out), log, text, spawn)
    t_cfg = t_first = t_last = None
    seen = 0
    while child.poll() is None:
        now = time.perf_counter()
        if t_cfg is None and (out / "config.yaml").exists():
            t_cfg = now
        n = len(list((out / "checkpoints").glob("step_*"))) if t_cfg else 0
        if n and t_first is None:
            t_first = now
        if (out / "checkpoints" / f"step_{TOTAL_STEPS:08d}").exists():
            t_last = t_last or now
        seen = max(seen, n)
        time.sleep(0.001)
    rc = child.wait()
    if rc != 0:
        raise RuntimeError(f"reference run failed ({rc}): {text.read_text()}")
    t_cfg = t_cfg or time.perf_counter()
    first = (t_first or t_cfg) - t_cfg
    last = (t_last or time.perf_counter()) - t_cfg
    return max(0.0, first), max(first + 0.05, last)


def _wait_and_kill(
    child: Child, run: Path, mode: str, rng: random.Random, window: tuple[float, float]
) -> bool:
    """Kill `child` per `mode`; False when it exited first."""
    cfg_before = _stamp(run / "config.yaml")
    ckdir = run / "checkpoints"
    suffix = f"-{child.pid}"
    skip = rng.randint(0, 4)  # ckpt mode: let this many checkpoint writes pass first
    seen: set[str] = set()
    started = None
    # random mode: from just before the first checkpoint to just after the last one
    delay = rng.uniform(0.5 * window[0], 1.1 * window[1])
    while child.poll() is None:
        if mode == "random":
            if started is None and _stamp(run / "config.yaml") not in (None, cfg_before):
                started = time.perf_counter()
            if started is not None and time.perf_counter() - started >= delay:
                child.kill()
                return True
            time.sleep(0.001)
        else:
            try:
                names = [
                    n
                    for n in os.listdir(ckdir)
                    if n.startswith(".tmp-step_") and n.endswith(suffix)
                ]
            except FileNotFoundError:
                names = []
            new = [n for n in names if n not in seen]
            if new:
                seen.update(new)
                if len(seen) > skip:
                    time.sleep(rng.choice([0.0, 0.0, rng.uniform(0.0, 0.004)]))
                    child.kill()
                    return True
            time.sleep(0.0002)
    return False


def run_trial(
    data: Path,
    ref: Path,
    work: Path,
    rng: random.Random,
    window: tuple[float, float],
    max_kills: int = 3,
    spawn: str = "fork",
    modes: tuple[str, ...] = ("random", "ckpt"),
) -> TrialResult:
    """Train into `work/run`, killing up to `max_kills` times; check every invariant."""
    run = work / "run"
    log = work / "log.jsonl"
    failures: list[str] = []
    attempts: list[Attempt] = []
    kills = 0
    for n in range(max_kills + 3):
        good, _, _ = scan_checkpoints(run)
        mode = rng.choice(modes) if kills < max_kills else "none"
        att = Attempt(mode=mode, expected_resume=good[-1] if good else None)
        before = len(read_log(log))
        out = work / f"attempt{n}.out"
        child = start_child(train_argv(data, run), log, out, spawn)
        if mode != "none":
            att.killed = _wait_and_kill(child, run, mode, rng, window)
            kills += att.killed
            att.tmp_at_kill = att.killed and any(
                x.endswith(f"-{child.pid}") for x in scan_checkpoints(run)[2]
            )
        att.rc = child.wait()
        new_events = read_log(log)[before:]
        events = [e for e in new_events if e["event"] == "restore"]
        late = [m for e in new_events if e["event"] == "late_imports" for m in e["modules"]]
        if late and spawn == "fork":
            failures.append(f"attempt {n}: the child imported {late} after the fork (preload them)")
        att.resumed = events[-1]["step"] if events else None
        text = out.read_text(errors="replace")
        att.fallback_warnings = text.count("skipping bad checkpoint")
        att.good_after, att.bad_after, _ = scan_checkpoints(run)
        attempts.append(att)
        where = f"attempt {n} ({mode}{', killed' if att.killed else ''})"
        if events and att.resumed != att.expected_resume:
            failures.append(
                f"{where}: resumed from step {att.resumed}, newest complete was {att.expected_resume}"
            )
        if not att.killed:
            if att.rc != 0:
                failures.append(f"{where}: exit code {att.rc}: {text[-2000:]}")
                break
            if att.expected_resume is not None and not events:
                failures.append(f"{where}: did not resume (newest complete {att.expected_resume})")
            if "Traceback" in text:
                failures.append(f"{where}: traceback in output: {text[-2000:]}")
        if att.good_after and any(b > att.good_after[-1] for b in att.bad_after):
            failures.append(
                f"{where}: a partial checkpoint is the newest: bad {att.bad_after}, good {att.good_after}"
            )
        if not att.good_after and att.bad_after:
            failures.append(f"{where}: only partial checkpoints {att.bad_after}")
        if not att.killed:
            break
    else:
        failures.append("the run never finished")
    if not failures:
        failures += compare_runs(run, ref)
    return TrialResult(attempts, failures)


def two_writers_trial(
    data: Path, ref: Path, work: Path, rng: random.Random, spawn: str = "fork"
) -> TrialResult:
    """Two `taperlm train` processes on one fresh run dir, the second starting 0-1 s after the
    first (a third of the trials at the same instant). Checks: no traceback; each exits 0 or
    stops with `is in use by pid <the other>`; never both refused; the lock-holding intervals
    (logged by the children) do not overlap; the run is bitwise the uninterrupted one."""
    run, log = work / "run", work / "log.jsonl"
    failures: list[str] = []
    gap = 0.0 if rng.random() < 1 / 3 else rng.uniform(0.0, 1.0)
    start = time.time() + 0.3
    children = []
    for i, offset in enumerate((0.0, gap)):
        env = {START_AT_ENV: repr(start + offset)}
        children.append(start_child(train_argv(data, run), log, work / f"w{i}.out", spawn, env))
    codes = [c.wait() for c in children]
    texts = [(work / f"w{i}.out").read_text(errors="replace") for i in range(2)]
    pids = [c.pid for c in children]
    for i, (rc, text) in enumerate(zip(codes, texts)):
        if "Traceback" in text:
            failures.append(f"writer {i}: traceback: {text[-1500:]}")
        if rc == 2:
            holder = f"is in use by pid {pids[1 - i]} "
            if holder not in text and "it has not recorded itself yet" not in text:
                failures.append(f"writer {i}: refused without naming the holder: {text[-600:]}")
        elif rc != 0:
            failures.append(f"writer {i}: exit code {rc}: {text[-1500:]}")
    if codes == [2, 2]:
        failures.append("both writers were refused")
    events = [e for e in read_log(log) if e["event"] in ("lock", "unlock") and e["dir"] == str(run)]
    spans: dict[int, list[float]] = {}
    for e in events:
        spans.setdefault(e["pid"], []).append(e["t"])
    intervals = sorted((ts[0], ts[-1]) for ts in spans.values() if len(ts) == 2)
    if len(intervals) != len(spans):
        failures.append(f"unbalanced lock events: {events}")
    for (_, a_end), (b_start, _) in itertools.pairwise(intervals):
        if b_start < a_end:
            failures.append(f"two writers held the run dir at once: {intervals}")
    if not failures:
        failures += compare_runs(run, ref)
    attempts = [Attempt(mode="writer", expected_resume=None, rc=rc, killed=False) for rc in codes]
    return TrialResult(attempts, failures)


def compare_runs(run: Path, ref: Path) -> list[str]:
    """Differences between a (resumed) run and the uninterrupted reference: [] if identical."""
    import torch

    out = []
    recs, ref_recs = metrics(run), metrics(ref)
    train = [(r["step"], r["loss"]) for r in recs if "loss" in r]
    ref_train = [(r["step"], r["loss"]) for r in ref_recs if "loss" in r]
    if train != ref_train:
        out.append(f"losses differ: {train} vs reference {ref_train}")
    val = [(r["step"], r["val_loss"]) for r in recs if "val_loss" in r]
    if val != [(r["step"], r["val_loss"]) for r in ref_recs if "val_loss" in r]:
        out.append(f"validation losses differ: {val}")
    if not checkpoint_ok(run / "checkpoints" / f"step_{TOTAL_STEPS:08d}"):
        out.append("the final checkpoint does not verify")
        return out
    a, b = final_weights(run), final_weights(ref)
    if a.keys() != b.keys() or any(not torch.equal(a[k], b[k]) for k in a):
        out.append("final weights differ from the reference")
    return out


# ----------------------------------------------------------------------------------------------
# the opt-in many-trial run


def _setup(work: Path, spawn: str) -> tuple[Path, Path, tuple[float, float]]:
    """(data dir, uninterrupted reference run, its kill window) of a many-trial run."""
    preload()
    work.mkdir(parents=True, exist_ok=True)
    data = prepare_data(work / "data")
    ref = work / "ref" / "run"
    ref.parent.mkdir(parents=True, exist_ok=True)
    return data, ref, reference_run(data, ref, spawn)


def many_trials(
    trials: int,
    seed: int,
    work: Path,
    spawn: str = "fork",
    max_kills: int = 3,
    verbose: bool = True,
) -> dict[str, Any]:
    data, ref, window = _setup(work, spawn)
    rng = random.Random(seed)
    results = []
    t0 = time.perf_counter()
    for i in range(trials):
        twork = work / f"trial{i:03d}"
        twork.mkdir(parents=True, exist_ok=True)
        res = run_trial(data, ref, twork, rng, window, max_kills=max_kills, spawn=spawn)
        results.append(res)
        if verbose:
            kinds = ",".join(
                f"{a.mode}{'*' if a.tmp_at_kill else ''}{'' if a.killed else '-'}@{a.resumed}"
                for a in res.attempts
            )
            print(
                f"trial {i}: {'ok' if res.ok else 'FAIL'} [{kinds}] {res.failures[:1]}", flush=True
            )
        if res.ok:  # keep failing trials for inspection only
            import shutil

            shutil.rmtree(twork, ignore_errors=True)
    atts = [a for r in results for a in r.attempts]
    summary = {
        "trials": trials,
        "seed": seed,
        "spawn": spawn,
        "passed": sum(r.ok for r in results),
        "failed": [i for i, r in enumerate(results) if not r.ok],
        "failures": [f for r in results for f in r.failures][:20],
        "kills": sum(a.killed for a in atts),
        "kills_random": sum(a.killed and a.mode == "random" for a in atts),
        "kills_during_checkpoint_write": sum(a.killed and a.mode == "ckpt" for a in atts),
        "kills_with_temp_dir_present": sum(a.tmp_at_kill for a in atts),
        "resumes": sum(a.resumed is not None for a in atts),
        "fresh_starts_after_kill": sum(
            a.resumed is None and a.expected_resume is None for a in atts[1:]
        ),
        "partial_old_checkpoints_seen": sum(bool(a.bad_after) for a in atts),
        "resumes_with_fallback_warning": sum(a.fallback_warnings > 0 for a in atts),
        "reference_window_s": [round(w, 3) for w in window],
        "seconds": round(time.perf_counter() - t0, 1),
    }
    return summary


def many_two_writer_trials(
    trials: int, seed: int, work: Path, spawn: str = "fork", verbose: bool = True
) -> dict[str, Any]:
    import shutil

    data, ref, _ = _setup(work, spawn)
    rng = random.Random(seed)
    t0 = time.perf_counter()
    results = []
    for i in range(trials):
        twork = work / f"trial{i:03d}"
        twork.mkdir(parents=True, exist_ok=True)
        res = two_writers_trial(data, ref, twork, rng, spawn)
        results.append(res)
        if verbose:
            codes = [a.rc for a in res.attempts]
            print(f"trial {i}: {'ok' if res.ok else 'FAIL'} exits {codes} {res.failures[:1]}")
        if res.ok:
            shutil.rmtree(twork, ignore_errors=True)
    codes = [tuple(a.rc for a in r.attempts) for r in results]
    return {
        "two_writer_trials": trials,
        "seed": seed,
        "spawn": spawn,
        "passed": sum(r.ok for r in results),
        "failed": [i for i, r in enumerate(results) if not r.ok],
        "failures": [f for r in results for f in r.failures][:20],
        "one_refused": sum(c.count(2) == 1 for c in codes),
        "both_finished_one_after_the_other": sum(c == (0, 0) for c in codes),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-kills", type=int, default=3)
    p.add_argument("--spawn", choices=("fork", "exec"), default="fork")
    p.add_argument("--work", type=Path, help="scratch dir (default: a new temp dir)")
    p.add_argument("--json", type=Path, help="also write the summary here")
    p.add_argument(
        "--two-writers", type=int, metavar="N", help="instead: N trials of two racing writers"
    )
    a = p.parse_args(argv)
    import tempfile

    work = a.work or Path(tempfile.mkdtemp(prefix="taperlm-faults-"))
    if a.two_writers:
        summary = many_two_writer_trials(a.two_writers, a.seed, work, a.spawn)
    else:
        summary = many_trials(a.trials, a.seed, work, a.spawn, a.max_kills)
    text = json.dumps(summary, indent=2)
    print(text)
    if a.json:
        a.json.write_text(text + "\n")
    return 0 if not summary["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())

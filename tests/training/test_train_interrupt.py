"""Ctrl-C during `taperlm train`, with real signals to real processes: the run checkpoints the
step in progress (or says that nothing or only an older checkpoint is saved), and the same
command resumes exactly at the step the message names, whatever the moment of the interrupt:
while setting up, before the first periodic checkpoint, in the middle of a save, and under
torchrun (every rank stops at the same step, one message). A second Ctrl-C stops at once
(`SignalStop`, tested in-process)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import assert_naming, torchrun_command
from taperlm.checkpoint import store as ckpt
from taperlm.cli import main as cli_main
from taperlm.files.runlock import holder_of
from taperlm.training.metrics import read_metrics

SMALL = [
    "model.n_layers=2", "model.d_model=32", "model.n_heads=2", "model.mlp_width=96",
    "model.vocab_size=512", "model.context_length=64", "train.seq_len=32",
    "train.micro_batch_size=2", "train.batch_tokens=64", "train.tokens=768",  # 12 steps
    "train.warmup_tokens=512", "train.log_every=1", "train.eval_every=0",
    "train.checkpoint_every=1000", "train.keep_checkpoints=3",
]  # fmt: skip
RESUMES = re.compile(r"resumes at step (\d+)|starts again at step (\d+)")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    import fault_harness

    root = tmp_path_factory.mktemp("interrupt")
    (root / "corpus.txt").write_text(fault_harness.corpus_text(12000, 0), encoding="utf-8")
    out = root / "data"
    argv = ["prepare", "--source", str(root / "corpus.txt"), "--tokenizer", "bpe:512"]
    assert cli_main([*argv, "--out", str(out)]) == 0
    return out


def _command(data_dir: Path, out: Path, *extra: str) -> list[str]:
    args = ["-m", "taperlm.cli", "train", "--preset", "transformer-tiny", "--data", str(data_dir)]
    for s in [*SMALL, *extra]:
        args += ["--set", s]
    return [*args, "--out", str(out)]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _logged_steps(out: Path) -> int:
    try:
        return sum(1 for r in read_metrics(out / "metrics.jsonl") if "loss" in r)
    except (OSError, ValueError):
        return 0


def _interrupt(cmd: list[str], out: Path, when):
    """Start `cmd` in its own process group, wait until `when(out)`, send SIGINT to the group as
    a terminal does; (returncode, stderr)."""
    proc = subprocess.Popen(
        cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.time() + 120
    while not when(out):
        assert proc.poll() is None, f"ended before the interrupt:\n{proc.communicate()[1]}"
        assert time.time() < deadline
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def _message_step(err: str) -> int:
    found = RESUMES.findall(err)
    assert len(found) == 1, f"expected one resume message:\n{err}"
    return int(found[0][0] or found[0][1])


def _resume_and_check(cmd: list[str], out: Path, step: int, total: int = 12) -> None:
    """The same command again: it starts at `step` (announced when it resumes) and finishes."""
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    if step == 1:
        assert "resuming" not in done.stderr
    else:
        assert f"continuing at step {step} of {total}" in done.stderr, done.stderr
    assert f"done: step {total}/{total}" in done.stdout
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r]
    assert steps == list(range(1, total + 1))


def test_ctrl_c_before_the_first_checkpoint_saves_and_resumes_there(data_dir, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, *_command(data_dir, out)]
    rc, err = _interrupt(cmd, out, lambda o: _logged_steps(o) >= 3)
    assert rc == 130, err
    step = _message_step(err)
    assert_naming(
        err, f"step {step - 1} of 12", "checkpoint", "taperlm train --preset transformer-tiny"
    )
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [step - 1]
    assert "Traceback" not in err
    _resume_and_check(cmd, out, step)


@pytest.mark.slow
@pytest.mark.parametrize(
    "moment",
    ["setting-up", "mid-save", "resumed-setting-up"],
)
def test_ctrl_c_at_any_moment_resumes_where_the_message_says(data_dir, tmp_path, moment):
    out = tmp_path / "run"
    extra = ("train.tokens=1920",)  # 30 steps: time to hit a save
    extra += ("train.checkpoint_every=1",) if moment == "mid-save" else ()
    cmd = [sys.executable, *_command(data_dir, out, *extra)]
    if moment == "setting-up":  # the run dir is locked, no step has run yet

        def when(o: Path) -> bool:
            return holder_of(o) is not None
    elif moment == "resumed-setting-up":  # a run with checkpoints, interrupted while loading
        rc, err = _interrupt(cmd, out, lambda o: _logged_steps(o) >= 5)
        assert rc == 130 and "saved the checkpoint" in err, err

        def when(o: Path) -> bool:
            return holder_of(o) is not None
    else:  # checkpoint_every=1: a save is under way most of the time

        def when(o: Path) -> bool:
            return any(ckpt.checkpoints_dir(o).glob(".tmp-*")) if o.exists() else False

    rc, err = _interrupt(cmd, out, when)
    assert rc == 130, err
    step = _message_step(err)
    have = [s for s, _ in ckpt.list_checkpoints(out)]
    assert (max(have) + 1 if have else 1) == step, (have, err)
    assert "Traceback" not in err
    _resume_and_check(cmd, out, step, total=30)


@pytest.mark.slow
@pytest.mark.distributed
def test_ctrl_c_under_torchrun_stops_every_rank_at_one_step(data_dir, tmp_path):
    out = tmp_path / "run"
    cmd = torchrun_command(
        *_command(data_dir, out, "train.micro_batch_size=1", "train.tokens=1920")
    )
    rc, err = _interrupt(cmd, out, lambda o: _logged_steps(o) >= 3)
    assert rc != 0
    step = _message_step(err)  # one message (rank 0's)
    assert f"interrupted at step {step - 1} of 30; saved the checkpoint" in err
    assert "torchrun <the same options> -m taperlm.cli train" in err
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [step - 1]
    _resume_and_check(cmd, out, step, total=30)


def test_signal_stop_asks_once_then_stops_at_once():
    """Before the first step ends a signal interrupts (nothing to save); then the first asks for
    a stop, a repeat within SAME_REQUEST_S (torchrun's agent forwarding the same Ctrl-C) is the
    same request, a later one interrupts at once; the last step is never 'interrupted'."""
    from taperlm.training import interrupt

    clock = [100.0]
    stop = interrupt.SignalStop(clock=lambda: clock[0])
    with pytest.raises(KeyboardInterrupt):
        stop._handle(signal.SIGINT, None)
    assert stop(1, 30, 0.0) is None and stop.armed
    stop._handle(signal.SIGINT, None)
    clock[0] += 0.5
    stop._handle(signal.SIGINT, None)
    assert stop(30, 30, 0.0) is None and stop.stopped_at is None
    assert stop(7, 30, 0.0) == "stop" and stop.stopped_at == 7
    clock[0] += 2.0
    with pytest.raises(KeyboardInterrupt):
        stop._handle(signal.SIGINT, None)


def test_an_interrupt_during_an_import_waits_for_it(tmp_path, monkeypatch):
    """Cutting an import short leaves a half-initialized module behind (the trainer's cleanup
    then failed on sympy with an unrelated traceback): the interrupt is repeated after it."""
    from taperlm.training import interrupt

    got: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
    try:
        (tmp_path / "slow_module_i31.py").write_text(
            "import signal, sys\n"
            "from taperlm.training.interrupt import _interrupt_when_safe\n"
            "_interrupt_when_safe(signal.SIGUSR1, sys._getframe())\n"
            "LOADED = True\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        import slow_module_i31  # noqa: F401  (no KeyboardInterrupt inside the import)

        deadline = time.time() + 10
        while not got and time.time() < deadline:
            time.sleep(0.01)
        assert got == [signal.SIGUSR1]  # the signal came again once the import was done
        with pytest.raises(KeyboardInterrupt):
            interrupt._interrupt_when_safe(signal.SIGINT, sys._getframe())
    finally:
        signal.signal(signal.SIGUSR1, previous)

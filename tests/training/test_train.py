"""The trainer: exact resume, update periods, non-finite steps, storage faults, corrupt
checkpoints, bad input, and the run-directory API (tiny models on a tiny prepared corpus)."""

from __future__ import annotations

import errno
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import fault_harness
from conftest import TINY_RUN_SETS, assert_naming, raises_naming
from taperlm.checkpoint import store as ckpt
from taperlm.checkpoint.loading import load_run_model
from taperlm.cli import main as cli_main
from taperlm.config import RunConfig, apply_overrides, run_config_from_dict, to_dict
from taperlm.config.presets import get_preset
from taperlm.errors import CheckpointError, ConfigError, DataError, TrainingWarning
from taperlm.training.loop import TrainingError, train
from taperlm.training.metrics import read_metrics
from taperlm.training.optim import LRSchedule, param_groups

TINY = [
    *TINY_RUN_SETS,  # 2 layers, d_model 32; steps of 2 micro-batches of 4 x 32
    "train.tokens=2048",  # 8 steps
    "train.warmup_tokens=512",
    "train.lr=0.003",
    "train.log_every=1",
    "train.eval_every=4",
    "train.eval_tokens=256",
    "train.checkpoint_every=2",
    "train.keep_checkpoints=10",
]


def _corpus(n_words: int = 12000, seed: int = 0) -> str:
    return fault_harness.corpus_text(n_words, seed)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("traindata")
    src = root / "corpus.txt"
    src.write_text(_corpus(), encoding="utf-8")
    out = root / "data"
    rc = cli_main(["prepare", "--source", str(src), "--tokenizer", "bpe:512", "--out", str(out)])
    assert rc == 0
    return out


def tiny_config(data_dir: Path, *overrides: str) -> RunConfig:
    data = {"model": to_dict(get_preset("transformer-tiny", resolve=False))}
    apply_overrides(data, [*TINY, *overrides])
    cfg = run_config_from_dict(data).resolve()
    cfg.data.dir = str(data_dir)
    return cfg


def losses(run: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r]


def val_losses(run: Path) -> list[tuple[int, float]]:
    return [
        (r["step"], r["val_loss"]) for r in read_metrics(run / "metrics.jsonl") if "val_loss" in r
    ]


def weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return ckpt.load_model_state(run / "checkpoints" / ckpt.checkpoint_name(step))


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory) -> Path:
    """One uninterrupted 8-step run, shared by the resume tests."""
    out = tmp_path_factory.mktemp("ref") / "run"
    res = train(tiny_config(data_dir), out, progress=False)
    assert res.step == 8 and res.finished
    return out


# ----------------------------------------------------------------------------------------------
# run directory, resume


def test_run_directory_contents(reference):
    assert (reference / "config.yaml").is_file()
    assert (reference / "loss.png").stat().st_size > 1000
    recs = read_metrics(reference / "metrics.jsonl")
    steps = [r for r in recs if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 9))
    assert steps[-1]["tokens"] == 2048
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "skipped_steps"):
        assert key in steps[0]
    assert steps[0]["mfu"] is None  # no peak on CPU
    evals = [r for r in recs if "val_loss" in r]
    assert [r["step"] for r in evals] == [4, 8]
    assert evals[-1]["val_ppl"] == pytest.approx(2.718281828 ** evals[-1]["val_loss"])
    names = [p.name for _, p in ckpt.list_checkpoints(reference)]
    assert names == [ckpt.checkpoint_name(s) for s in (2, 4, 6, 8)]
    assert (reference / "checkpoints" / "latest").read_text().strip() == names[-1]
    for _, p in ckpt.list_checkpoints(reference):
        manifest = ckpt.verify_checkpoint(p)
        assert set(manifest["files"]) == {"__0_0.distcp", ".metadata", "state.pt"}
        assert manifest["format"] == "dcp" and manifest["world_size"] == 1
    # the LR follows warmup (2 steps) then cosine to 0.1 x lr
    lrs = [r["lr"] for r in steps]
    assert lrs[0] == pytest.approx(0.0015) and lrs[1] == pytest.approx(0.003)
    assert lrs[2] == lrs[1]  # the cosine starts at the peak
    assert all(a > b for a, b in itertools.pairwise(lrs[2:]))
    assert losses(reference)[-1] < losses(reference)[0]


def test_resume_in_process_is_exact(data_dir, reference, tmp_path):
    out = tmp_path / "run"
    first = train(tiny_config(data_dir), out, progress=False, stop_after=3)
    assert first.step == 3 and not first.finished
    # step 3 was checkpointed by stop_after; drop it so the resume starts from step 2
    import shutil

    shutil.rmtree(out / "checkpoints" / ckpt.checkpoint_name(3))
    res = train(tiny_config(data_dir), out, progress=False)
    assert res.step == 8
    assert losses(out) == losses(reference)
    assert val_losses(out) == val_losses(reference)
    assert_same_weights(weights(out, 8), weights(reference, 8))


# Slow (three 96-step CLI runs, ~90 s on 2 cores): the default lane kills real `taperlm train`
# processes at random moments and mid-write and resumes them bit for bit in test_faults.py
# (test_sigkill_trials_resume_exactly, test_kill_in_the_middle_of_a_checkpoint_write).
@pytest.mark.slow
def test_sigkill_then_resume_is_exact(data_dir, tmp_path):
    """The CLI killed with SIGKILL soon after its step-4 checkpoint, resumed: same losses and
    weights as an uninterrupted CLI run (both single-threaded subprocesses)."""
    args = ["-m", "taperlm.cli", "train", "--preset", "transformer-tiny", "--data", str(data_dir)]
    for s in [*TINY, "train.checkpoint_every=1", "train.tokens=24576"]:  # 96 steps
        args += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    ref = tmp_path / "ref"
    subprocess.run([sys.executable, *args, "--out", str(ref), "--no-progress"], env=env, check=True)
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, *args, "--out", str(out), "--no-progress"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while not (out / "checkpoints" / ckpt.checkpoint_name(4)).exists():
        assert proc.poll() is None and time.time() < deadline, "run ended before step 4"
        time.sleep(0.01)
    time.sleep(random.Random(0).uniform(0.0, 0.02))  # possibly in the middle of a write
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = [s for s, _ in ckpt.list_checkpoints(out)]
    # Older checkpoints may already be pruned (keep-last-k) on a fast machine.
    assert done and max(done) >= 4 and 96 not in done
    r = subprocess.run(
        [sys.executable, *args, "--out", str(out), "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "done: step 96/96" in r.stdout
    assert losses(out) == losses(ref)
    assert_same_weights(weights(out, 96), weights(ref, 96))


def test_resume_modes_and_config_conflicts(data_dir, reference, tmp_path):
    with raises_naming(ConfigError, str(reference), "--resume auto", "fresh --out"):
        train(tiny_config(data_dir), reference, resume="never", progress=False)
    with raises_naming(CheckpointError, "--resume must", str(tmp_path / "fresh"), "--resume auto"):
        train(tiny_config(data_dir), tmp_path / "fresh", resume="must", progress=False)
    # every key that differs, with the run's value and the new one
    with raises_naming(ConfigError, "train.lr: 0.003", "0.001", "model.d_model: 32", "64"):
        train(tiny_config(data_dir, "train.lr=0.001", "model.d_model=64"), reference)
    # runtime settings may change: resuming a finished run is a no-op that succeeds
    res = train(tiny_config(data_dir, "train.log_every=3"), reference, progress=False)
    assert res.step == 8


def test_corrupt_newest_checkpoint_falls_back(data_dir, reference, tmp_path):
    out = tmp_path / "run"
    train(tiny_config(data_dir), out, progress=False, stop_after=4)  # checkpoints 2, 4
    bad = out / "checkpoints" / ckpt.checkpoint_name(4) / "__0_0.distcp"
    raw = bytearray(bad.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one bit flip in the weights
    bad.write_bytes(bytes(raw))
    with raises_naming(CheckpointError, str(bad), "sha256", "delete this checkpoint"):
        ckpt.load_checkpoint(bad.parent)
    with pytest.warns(TrainingWarning, match="skipping bad checkpoint"):
        res = train(tiny_config(data_dir), out, progress=False)  # resumes from step 2
    assert res.step == 8
    assert losses(out) == losses(reference)
    assert_same_weights(weights(out, 8), weights(reference, 8))


def test_truncated_and_incomplete_checkpoints_are_detected(reference, tmp_path):
    import shutil

    copy = tmp_path / "c"
    shutil.copytree(reference / "checkpoints" / ckpt.checkpoint_name(8), copy)
    state = copy / "state.pt"
    state.write_bytes(state.read_bytes()[:-100])
    with raises_naming(CheckpointError, "state.pt", "truncated"):
        ckpt.verify_checkpoint(copy)
    (copy / "manifest.json").unlink()
    with raises_naming(CheckpointError, str(copy), "manifest.json"):
        ckpt.load_checkpoint(copy)


# ----------------------------------------------------------------------------------------------
# numerics and storage faults


def test_nan_step_is_skipped(data_dir, reference, tmp_path, monkeypatch):
    from taperlm.training.loop import Trainer

    trainer = Trainer(tiny_config(data_dir), tmp_path / "run")
    try:
        trainer.fit(progress=False, stop_after=2)
        before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        adam_steps = {id(p): int(s["step"]) for p, s in trainer.optimizer.state.items()}
        fault_harness.inject_nan(monkeypatch, "3")
        trainer.fit(progress=False, stop_after=3)
        # the skipped step changed neither the weights nor the optimizer
        assert_same_weights(trainer.model.state_dict(), before)
        assert {id(p): int(s["step"]) for p, s in trainer.optimizer.state.items()} == adam_steps
        assert all(p.grad is None for p in trainer.model.parameters())
        res = trainer.fit(progress=False)
    finally:
        trainer.close()
    assert res.skipped_steps == 1 and res.step == 8
    out = tmp_path / "run"
    recs = [r for r in read_metrics(out / "metrics.jsonl") if "loss" in r]
    assert recs[2]["loss"] == "nan" and recs[2]["grad_norm"] == "nan"
    assert [r["skipped_steps"] for r in recs] == [0, 0, 1, 1, 1, 1, 1, 1]
    assert all(torch.isfinite(t).all() for t in weights(out, 8).values())
    assert recs[3]["loss"] != losses(reference)[3]  # the data moved on by one batch


def test_repeated_nan_stops_with_last_good_checkpoint(data_dir, tmp_path, monkeypatch):
    fault_harness.inject_nan(monkeypatch, "3-")
    out = tmp_path / "run"
    cfg = tiny_config(data_dir, "train.max_bad_steps=3", "train.checkpoint_every=1")
    with raises_naming(TrainingError, "3 consecutive steps", "step_00000002"):
        train(cfg, out, progress=False)
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [1, 2]
    ckpt.verify_checkpoint(out / "checkpoints" / ckpt.checkpoint_name(2))


@pytest.mark.parametrize(
    "fault",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        PermissionError(errno.EROFS, "Read-only file system"),
    ],
)
def test_storage_fault_keeps_previous_checkpoint(data_dir, tmp_path, monkeypatch, fault):
    out = tmp_path / "run"
    real = ckpt._write_state
    calls = {"n": 0}

    def flaky(path, state):
        calls["n"] += 1
        if calls["n"] == 2:  # the second checkpoint (step 4) fails half-written
            (path.parent / "__0_0.distcp").write_bytes(b"partial")
            raise fault
        real(path, state)

    monkeypatch.setattr(ckpt, "_write_state", flaky)
    with pytest.raises(CheckpointError) as e:
        train(tiny_config(data_dir), out, progress=False)
    msg = str(e.value)
    assert str(out / "checkpoints" / ckpt.checkpoint_name(4)) in msg
    assert fault.strerror in msg and "step_00000002 is intact" in msg
    assert [p.name for p in (out / "checkpoints").iterdir() if p.is_dir()] == [
        ckpt.checkpoint_name(2)
    ]
    ckpt.verify_checkpoint(out / "checkpoints" / ckpt.checkpoint_name(2))
    assert (out / "checkpoints" / "latest").read_text().strip() == ckpt.checkpoint_name(2)


# ----------------------------------------------------------------------------------------------
# update periods


class _Periodic(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fast = torch.nn.Linear(4, 4, bias=False)
        self.slow = torch.nn.Linear(4, 4, bias=False)
        self.slow.weight.update_period = 3  # type: ignore[attr-defined]
        self.emb = torch.nn.Embedding(5, 4)
        self.gain = torch.nn.Parameter(torch.ones(4))


def test_param_groups_decay_and_periods():
    m = _Periodic()
    groups = param_groups(m, 0.1)
    by = {(g["decay"], g["period"]): g["params"] for g in groups}
    assert set(by) == {(True, 1), (False, 1), (True, 3)}
    assert by[(True, 3)] == [m.slow.weight] and by[(True, 1)] == [m.fast.weight]
    assert {id(p) for p in by[(False, 1)]} == {id(m.emb.weight), id(m.gain)}
    assert all(g["weight_decay"] == (0.1 if g["decay"] else 0.0) for g in groups)


def test_update_periods_accumulate_and_step(data_dir, tmp_path, monkeypatch):
    """A parameter with update_period=3 changes only after steps 3 and 6, by an Adam step on the
    sum of its three gradients; the others change every step; resume mid-period is exact."""
    from taperlm.models import lm

    real_init = lm.TaperedLM.__init__

    def init(self, cfg):
        real_init(self, cfg)
        self.blocks[1].mlp.w_out.weight.update_period = 3

    monkeypatch.setattr(lm.TaperedLM, "__init__", init)
    cfg = tiny_config(data_dir, "train.checkpoint_every=1", "train.weight_decay=0.0")
    out = tmp_path / "run"
    train(cfg, out, progress=False)
    key = "blocks.1.mlp.w_out.weight"
    w = [weights(out, s)[key] for s in range(1, 9)]
    changed = [not torch.equal(a, b) for a, b in itertools.pairwise(w)]  # step s -> s+1, s = 1..7
    assert changed == [False, True, False, False, True, False, False]
    assert torch.equal(w[0], w[1])  # steps 1 and 2: only accumulating
    other = [weights(out, s)["blocks.1.mlp.w_in.weight"] for s in (1, 2)]
    assert not torch.equal(*other)
    from checkpoint_helpers import saved_keys

    # the accumulating gradient is checkpointed
    assert f"pending_grads.{key}" in saved_keys(out / "checkpoints" / ckpt.checkpoint_name(2))
    # resuming in the middle of a period reproduces the uninterrupted run
    out2 = tmp_path / "resumed"
    train(cfg, out2, progress=False, stop_after=2)  # before the slow param's first update
    train(cfg, out2, progress=False, stop_after=4)
    train(cfg, out2, progress=False)
    assert losses(out2) == losses(out)
    assert_same_weights(weights(out2, 8), weights(out, 8))


# ----------------------------------------------------------------------------------------------
# bad input


def _cli(args: list[str], capsys) -> tuple[int, str]:
    rc = cli_main(args)
    return rc, capsys.readouterr().err


def _train_args(data: Path | str, out: Path, *sets: str) -> list[str]:
    args = ["train", "--preset", "transformer-tiny", "--data", str(data), "--out", str(out)]
    for s in [*TINY, *sets]:
        args += ["--set", s]
    return [*args, "--no-progress"]


def test_missing_and_empty_data_dir(tmp_path, capsys):
    rc, err = _cli(_train_args(tmp_path / "nope", tmp_path / "run"), capsys)
    assert rc == 2
    assert_naming(err, str(tmp_path / "nope"), "taperlm prepare")
    (tmp_path / "empty").mkdir()
    rc, err = _cli(_train_args(tmp_path / "empty", tmp_path / "run"), capsys)
    assert rc == 2
    assert_naming(err, str(tmp_path / "empty"), "taperlm prepare")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_corrupt_shard_header(data_dir, tmp_path, capsys):
    import shutil

    bad = tmp_path / "data"
    shutil.copytree(data_dir, bad)
    raw = bytearray((bad / "train-00000.bin").read_bytes())
    raw[20] ^= 0xFF  # inside the token count field
    (bad / "train-00000.bin").write_bytes(bytes(raw))
    rc, err = _cli(_train_args(bad, tmp_path / "run"), capsys)
    assert rc == 2
    assert_naming(err, "train-00000.bin", "header")
    assert "Traceback" not in err


def test_vocab_mismatch(data_dir, tmp_path, capsys):
    rc, err = _cli(_train_args(data_dir, tmp_path / "run", "model.vocab_size=256"), capsys)
    vocab = json.loads((data_dir / "meta.json").read_text())["vocab_size"]
    assert 256 < vocab <= 512
    assert rc == 2
    assert_naming(err, f"{vocab} ids", "model.vocab_size is 256", f"--set model.vocab_size={vocab}")


def test_token_ids_beyond_vocab(data_dir, tmp_path, monkeypatch):
    """A batch with an id >= vocab (e.g. an unverified large shard) is named, not an IndexError."""
    from taperlm.data import loader

    real = loader.TokenBatches.__next__

    def poisoned(self):
        x, y = real(self)
        x[0, 0] = 600
        return x, y

    monkeypatch.setattr(loader.TokenBatches, "__next__", poisoned)
    with raises_naming(DataError, "token id 600", "model.vocab_size=512", "taperlm prepare"):
        train(tiny_config(data_dir), tmp_path / "run", progress=False)


def test_config_key_errors(data_dir, tmp_path, capsys):
    rc, err = _cli(_train_args(data_dir, tmp_path / "r", "train.lrr=0.1"), capsys)
    assert rc == 2
    assert_naming(err, "train", "'lrr'", "'lr'")
    rc, err = _cli(_train_args(data_dir, tmp_path / "r", "train.lr=fast"), capsys)
    assert rc == 2
    assert_naming(err, "train.lr", "number", "'fast'")
    rc, err = _cli(_train_args(data_dir, tmp_path / "r", "train.batch_tokens=300"), capsys)
    assert rc == 2
    assert_naming(err, "train.batch_tokens (300)", "128, 256, 512")
    rc, err = _cli(["train", "--out", str(tmp_path / "none"), "--data", str(data_dir)], capsys)
    assert rc == 2
    assert_naming(err, "--preset NAME", "--config FILE")


def test_continue_from_run_dir_without_preset(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli_main([*_train_args(data_dir, out), "--stop-after-steps", "2"]) == 0
    assert "stopped: step 2/8" in capsys.readouterr().out
    assert cli_main(["train", "--out", str(out), "--no-progress"]) == 0
    assert "done: step 8/8" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# load_run_model


def test_load_run_model(reference, data_dir):
    model, cfg = load_run_model(reference)
    assert cfg.model.mlp_widths == tiny_config(data_dir).model.mlp_widths
    assert_same_weights(model.state_dict(), weights(reference, 8))
    m4, _ = load_run_model(reference, step=4)
    assert_same_weights(m4.state_dict(), weights(reference, 4))
    m_dir, _ = load_run_model(reference / "checkpoints" / ckpt.checkpoint_name(6))
    assert_same_weights(m_dir.state_dict(), weights(reference, 6))
    assert not model.training


def test_load_run_model_errors(reference, tmp_path):
    import shutil

    with raises_naming(CheckpointError, str(tmp_path / "missing"), "taperlm train"):
        load_run_model(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with raises_naming(CheckpointError, str(tmp_path / "empty"), "config.yaml"):
        load_run_model(tmp_path / "empty")
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(reference / "config.yaml", run / "config.yaml")
    with raises_naming(CheckpointError, str(run), f"taperlm train --out {run}"):
        load_run_model(run)
    with raises_naming(CheckpointError, str(reference), "step 5", "2, 4"):
        load_run_model(reference, step=5)
    # a config of another shape/family than the checkpoint: the differing keys are named
    other = tmp_path / "other"
    shutil.copytree(reference, other)
    text = (other / "config.yaml").read_text()
    (other / "config.yaml").write_text(
        text.replace("family: transformer", "family: gated").replace("n_heads: 2", "n_heads: 4")
    )
    with pytest.raises(CheckpointError) as e:
        load_run_model(other)
    assert_naming(str(e.value), "model.family: 'transformer'", "'gated'", "model.n_heads")


# ----------------------------------------------------------------------------------------------
# schedule and compile


def test_lr_schedule_shape():
    s = LRSchedule(lr=1.0, warmup_steps=4, total_steps=20, min_lr_ratio=0.1)
    assert [s(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert (
        s(4) == pytest.approx(1.0) and s(20) == pytest.approx(0.1) and s(50) == pytest.approx(0.1)
    )
    assert s(12) == pytest.approx(0.55)  # half-way through the cosine
    vals = [s(i) for i in range(4, 21)]
    assert all(a >= b for a, b in itertools.pairwise(vals))


def test_compile_failure_warns_and_trains_eagerly(data_dir, tmp_path, monkeypatch):
    import torch._dynamo

    def broken(module, *a, **k):
        def call(*args, **kwargs):
            raise RuntimeError("inductor: no C++ compiler to compile the kernels")

        return call

    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 2)
    cfg = tiny_config(data_dir, "train.compile=true", "model.taper=cosine:1.5:0.5")
    n_widths = len(set(cfg.model.mlp_widths))
    assert n_widths == 2
    with pytest.warns(TrainingWarning, match="torch.compile failed"):
        res = train(cfg, tmp_path / "r", progress=False)
    assert res.step == 8
    assert torch._dynamo.config.recompile_limit >= n_widths + 8  # one entry per width + margin


def _failing_backend(where: str):
    """A torch.compile backend (AOTAutograd, graphs run as traced) that fails where asked:
    compiling the forward, compiling the backward (lazily, at the first loss.backward()), or
    running the backward the second time (the step's second micro-batch, after the first one
    accumulated gradients)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    calls = {"backward": 0}

    def fw(gm, example_inputs):
        if where == "forward-compile":
            raise RuntimeError("inductor: C++ compile of the forward kernels failed")
        return make_boxed_func(gm.forward)

    def bw(gm, example_inputs):
        if where == "backward-compile":
            raise RuntimeError("inductor: C++ compile of the backward kernels failed")

        def run(args):
            calls["backward"] += 1
            if calls["backward"] == 2:
                raise RuntimeError("inductor: compiled backward kernel failed")
            return gm(*args)

        run._boxed_call = True
        return run

    return aot_autograd(fw_compiler=fw, bw_compiler=bw)


@pytest.mark.parametrize("scope", ["model", "blocks"])
@pytest.mark.parametrize("where", ["forward-compile", "backward-compile", "backward-run"])
def test_compile_failure_anywhere_in_the_step_trains_exactly_as_eager(
    data_dir, tmp_path, monkeypatch, scope, where
):
    """A compile failure at any point of the first step (the forward, the lazily compiled
    backward, a backward of the second micro-batch after the first accumulated gradients)
    falls back to eager once and redoes the step from zero gradients on the same
    micro-batches: every logged loss equals an eager run's exactly."""
    import torch._dynamo

    eager = tiny_config(data_dir, "train.tokens=768")
    train(eager, tmp_path / "eager", progress=False)
    real_compile = torch.compile
    backend = _failing_backend(where)
    monkeypatch.setattr(torch, "compile", lambda fn, **k: real_compile(fn, backend=backend))
    torch._dynamo.reset()
    cfg = tiny_config(
        data_dir, "train.tokens=768", "train.compile=true", f"train.compile_scope={scope}"
    )
    with pytest.warns(TrainingWarning, match="torch.compile failed") as caught:
        train(cfg, tmp_path / "c", progress=False)
    torch._dynamo.reset()
    assert sum("torch.compile failed" in str(w.message) for w in caught) == 1
    assert losses(tmp_path / "c") == losses(tmp_path / "eager")
    assert val_losses(tmp_path / "c") == val_losses(tmp_path / "eager")


def test_metrics_json_is_strict(reference):
    for line in (reference / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_tokens_round_up_to_whole_steps(data_dir, tmp_path, capsys):
    """train.tokens that is not a whole number of batches trains the next whole step (at least
    the tokens asked for), and says so; a whole number is left alone, silently."""
    cfg = tiny_config(data_dir, "train.tokens=640", "train.checkpoint_every=0")  # 2.5 steps
    assert cfg.train.steps == 3
    res = train(cfg, tmp_path / "r", progress=False)
    assert (res.step, res.tokens, res.total_steps) == (3, 768, 3)
    err = capsys.readouterr().err
    assert_naming(err, "train.tokens 640", "train.batch_tokens 256", "3 steps", "768 tokens")
    assert tiny_config(data_dir, "train.tokens=768").train.rounding_note() is None
    # compare rounds once, for every cell, and says so once
    from taperlm.compare.options import CompareOptions
    from taperlm.compare.recipe import base_config

    notes: list[str] = []
    opts = CompareOptions(out=tmp_path / "c", tokens=40960, overrides=["train.batch_tokens=16384"])
    base = base_config(opts, None, None, notes)
    assert base.train.tokens == 49152 and base.train.steps == 3
    assert notes == [
        "train.tokens 40,960 is not a whole number of steps of train.batch_tokens 16,384: "
        "training 3 steps = 49,152 tokens (rounded up)"
    ]

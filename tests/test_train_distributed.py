"""`taperlm train` under torchrun with 2 CPU processes (gloo): DDP matches one process with the
same global batch, FSDP2 matches DDP, and their checkpoints load anywhere.

Tolerance: both sides see exactly the same sequences per optimizer step (the loader's rank
partition invariant), so they differ only in the order of fp32 sums (gradient all-reduce vs
accumulation). Over 6 steps of a tiny model that moves losses by ~1e-6; we allow 1e-4 absolute
on every step's loss and 1e-4 on the final weights (max abs). Measured (torch 2.13 CPU):
single vs DDP 9.5e-7 (loss) / 2.7e-6 (weights); DDP vs FSDP2 exactly equal. A real error is far
above the tolerance: giving both ranks the same data moves the losses by 7e-2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import torchrun_command
from taperlm.training import checkpoint as ckpt
from taperlm.training.metrics import read_metrics

pytestmark = pytest.mark.distributed

SETS = [
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=2",
    "model.mlp_width=96",
    "model.vocab_size=512",
    "model.context_length=64",
    "train.seq_len=32",
    "train.micro_batch_size=4",
    "train.batch_tokens=256",
    "train.tokens=1536",  # 6 steps
    "train.warmup_tokens=256",
    "train.lr=0.003",
    "train.log_every=1",
    "train.eval_every=3",
    "train.eval_tokens=256",
    "train.checkpoint_every=3",
]
TOL = 1e-4


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    from taperlm.cli import main
    from test_train import _corpus

    root = tmp_path_factory.mktemp("ddpdata")
    (root / "c.txt").write_text(_corpus(6000, seed=1), encoding="utf-8")
    out = root / "data"
    assert (
        main(
            [
                "prepare",
                "--source",
                str(root / "c.txt"),
                "--tokenizer",
                "bpe:512",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    return out


def _args(data_dir: Path, out: Path, *extra: str) -> list[str]:
    args = ["train", "--preset", "transformer-tiny", "--data", str(data_dir), "--out", str(out)]
    for s in [*SETS, *extra]:
        args += ["--set", s]
    return [*args, "--no-progress"]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _single(data_dir: Path, out: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "taperlm.cli", *_args(data_dir, out)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]


def _torchrun(data_dir: Path, out: Path, *extra: str, timeout: int = 120) -> str:
    cmd = torchrun_command("-m", "taperlm.cli", *_args(data_dir, out, *extra))
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    return r.stdout


def _losses(run: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r]


def _max_weight_diff(a: Path, b: Path, step: int) -> float:
    from safetensors.torch import load_file

    wa = load_file(str(a / "checkpoints" / ckpt.checkpoint_name(step) / "model.safetensors"))
    wb = load_file(str(b / "checkpoints" / ckpt.checkpoint_name(step) / "model.safetensors"))
    assert wa.keys() == wb.keys()
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


@pytest.fixture(scope="module")
def single_run(data_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("single") / "run"
    _single(data_dir, out)
    return out


@pytest.fixture(scope="module")
def ddp_run(data_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp") / "run"
    stdout = _torchrun(data_dir, out)
    assert stdout.count("done: step 6/6") == 1  # one summary, from rank 0
    return out


def test_ddp_matches_single_process(single_run, ddp_run):
    a, b = _losses(single_run), _losses(ddp_run)
    assert len(a) == len(b) == 6
    assert max(abs(x - y) for x, y in zip(a, b)) < TOL, (a, b)
    assert _max_weight_diff(single_run, ddp_run, 6) < TOL
    # one process wrote the logs: one line per step
    assert [r["step"] for r in read_metrics(ddp_run / "metrics.jsonl") if "loss" in r] == list(
        range(1, 7)
    )


def test_fsdp_matches_ddp_and_checkpoint_is_portable(data_dir, ddp_run, tmp_path):
    out = tmp_path / "fsdp"
    _torchrun(data_dir, out, "train.parallel=fsdp")
    a, b = _losses(ddp_run), _losses(out)
    assert max(abs(x - y) for x, y in zip(a, b)) < TOL, (a, b)
    assert _max_weight_diff(ddp_run, out, 6) < TOL
    # full (unsharded) weights: loadable in one process
    model, cfg = ckpt.load_run_model(out)
    assert cfg.train.parallel == "fsdp"
    assert sum(p.numel() for p in model.parameters()) > 0
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_fsdp_checkpoint_resumes_in_one_process(data_dir, single_run, tmp_path):
    """Stop an FSDP run at step 3 and finish it in a single process: same result as the
    single-process run (within the DDP tolerance), i.e. optimizer state and data position are
    saved in a world-size-independent form."""
    out2 = tmp_path / "mixed"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "taperlm.cli",
        *_args(data_dir, out2, "train.parallel=fsdp"),
        "--stop-after-steps",
        "3",
    ]
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    _single(data_dir, out2)
    a, b = _losses(single_run), _losses(out2)
    assert len(b) == 6
    assert max(abs(x - y) for x, y in zip(a, b)) < TOL, (a, b)
    assert _max_weight_diff(single_run, out2, 6) < TOL

"""`taperlm train` under torchrun with 2 CPU processes (gloo): DDP matches one process with the
same global batch, FSDP2 matches DDP, their sharded (DCP) checkpoints resume on another number of
processes and under the other wrapper, and Hope's update periods survive FSDP2.

Tolerance: both sides see exactly the same sequences per optimizer step (the loader's rank
partition invariant), so they differ only in the order of fp32 sums (gradient all-reduce vs
accumulation). Over 6 steps of a tiny model that moves losses by ~1e-6; we allow 1e-4 absolute
on every step's loss and 1e-4 on the final weights (max abs). Measured (torch 2.13 CPU):
single vs DDP 9.5e-7 (loss) / 2.7e-6 (weights); DDP vs FSDP2 equal losses and weights
within FSDP_TOL (bitwise equal on an AMD EPYC, 1.2e-7 apart on an Intel Xeon: FSDP2 reduces
gradients with reduce-scatter and clips shard by shard, so a CPU's kernels may round the last bit
differently). A real error is far above the tolerance: giving both ranks the same data moves
the losses by 7e-2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import TINY_RUN_SETS, torchrun_command
from taperlm.checkpoint import store as ckpt
from taperlm.checkpoint.loading import load_run_model
from taperlm.training.metrics import read_metrics

pytestmark = pytest.mark.distributed

# FSDP2 vs DDP: their final weights (max abs). A missed update of Hope's slow levels moves them
# by ~1e-3 (lr 2e-3).
FSDP_TOL = 1e-6

SETS = [
    *TINY_RUN_SETS,  # 2 layers, d_model 32; steps of 2 micro-batches of 4 x 32
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


def _args(data_dir: Path, out: Path, *extra: str, preset: str = "transformer-tiny") -> list[str]:
    args = ["train", "--preset", preset, "--data", str(data_dir), "--out", str(out)]
    for s in [*SETS, *extra]:
        args += ["--set", s]
    return [*args, "--no-progress"]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _single(data_dir: Path, out: Path, *flags: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "taperlm.cli", *_args(data_dir, out), *flags],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]


def _torchrun(
    data_dir: Path,
    out: Path,
    *extra: str,
    timeout: int = 120,
    flags: tuple[str, ...] = (),
    preset: str = "transformer-tiny",
) -> str:
    cmd = torchrun_command(
        "-m", "taperlm.cli", *_args(data_dir, out, *extra, preset=preset), *flags
    )
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    return r.stdout


def _losses(run: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r]


def _max_weight_diff(a: Path, b: Path, step: int) -> float:
    wa = ckpt.load_model_state(a / "checkpoints" / ckpt.checkpoint_name(step))
    wb = ckpt.load_model_state(b / "checkpoints" / ckpt.checkpoint_name(step))
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
    model, cfg = load_run_model(out)
    assert cfg.train.parallel == "fsdp"
    assert sum(p.numel() for p in model.parameters()) > 0
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_fsdp_checkpoint_resumes_in_one_process(data_dir, single_run, tmp_path):
    """Stop an FSDP run at step 3 and finish it in a single process: same result as the
    single-process run (within the DDP tolerance), i.e. optimizer state and data position are
    saved in a world-size-independent form."""
    out2 = tmp_path / "mixed"
    _torchrun(data_dir, out2, "train.parallel=fsdp", flags=("--stop-after-steps", "3"))
    _single(data_dir, out2)
    a, b = _losses(single_run), _losses(out2)
    assert len(b) == 6
    assert max(abs(x - y) for x, y in zip(a, b)) < TOL, (a, b)
    assert _max_weight_diff(single_run, out2, 6) < TOL


def test_sharded_checkpoints_resume_across_fsdp_and_ddp_bitwise(data_dir, ddp_run, tmp_path):
    """FSDP2 (2 ranks) stops at step 2, DDP (2 ranks, background checkpoint writes) continues to
    step 4, FSDP2 finishes: each leg reads the other wrapper's shards, and the losses are bitwise
    those of the uninterrupted DDP run. (The weights agree to ~4e-9, not bitwise: FSDP2 sums the
    clipping norm shard by shard, so its updates differ from DDP's in the last bits.)"""
    out = tmp_path / "chain"
    _torchrun(data_dir, out, "train.parallel=fsdp", flags=("--stop-after-steps", "2"))
    manifest = ckpt.read_manifest(out / "checkpoints" / ckpt.checkpoint_name(2))
    shards = [f for f in manifest["files"] if f.endswith(".distcp")]
    assert manifest["world_size"] == 2 and len(shards) == 2  # each rank wrote its own
    _torchrun(
        data_dir,
        out,
        "train.parallel=ddp",
        "train.async_checkpoint=true",
        "train.checkpoint_every=1",
        flags=("--stop-after-steps", "4"),
    )
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [3, 4]
    _torchrun(data_dir, out, "train.parallel=fsdp")
    assert _losses(out) == _losses(ddp_run)
    assert _max_weight_diff(out, ddp_run, 6) < FSDP_TOL


def test_distillation_under_ddp_and_fsdp_matches_one_process(data_dir, single_run, tmp_path):
    """A distilled run (train.distill_from, every rank loading the teacher itself) on 2 ranks,
    started under DDP and resumed under FSDP2 (each rank loading the teacher again): the same
    losses and weights as in one process (the DDP tolerance), and the teacher's identity in the
    checkpoint FSDP2 wrote. One run covers both wrappers: an uninterrupted FSDP2 run would repeat
    its FSDP2 half at the cost of another torchrun."""
    teach = (
        f"train.distill_from={single_run}",
        "train.distill_mix=0.7",
        "train.distill_temperature=2",
    )
    one, ddp = tmp_path / "one", tmp_path / "ddp"
    r = subprocess.run(
        [sys.executable, "-m", "taperlm.cli", *_args(data_dir, one, *teach)],
        env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    _torchrun(data_dir, ddp, *teach, flags=("--stop-after-steps", "3"))
    assert len(_losses(ddp)) == 3  # steps 1-3 under DDP
    _torchrun(data_dir, ddp, *teach, "train.parallel=fsdp")  # steps 4-6 under FSDP2
    plain = _losses(single_run)
    a, b = _losses(one), _losses(ddp)
    assert len(b) == 6 and max(abs(x - y) for x, y in zip(a, b)) < TOL, (a, b)
    assert _max_weight_diff(one, ddp, 6) < TOL
    assert max(abs(x - y) for x, y in zip(_losses(one), plain)) > 1e-2  # the teacher mattered
    state = ckpt.load_train_state(ckpt.find_checkpoint(ddp))
    assert (
        state["distill_teacher"]
        == ckpt.load_train_state(ckpt.find_checkpoint(one))["distill_teacher"]
        is not None
    )


def test_single_process_checkpoint_resumes_on_two_ranks(data_dir, single_run, tmp_path):
    """1 -> 2: a one-process checkpoint continued by FSDP2 on 2 ranks ends where the one-process
    run ends (within the DDP tolerance: the later steps sum gradients in another order)."""
    out = tmp_path / "grow"
    _single(data_dir, out, "--stop-after-steps", "3")
    _torchrun(data_dir, out, "train.parallel=fsdp")
    a, b = _losses(single_run), _losses(out)
    assert a[:3] == b[:3] and len(b) == 6
    assert max(abs(x - y) for x, y in zip(a, b)) < TOL, (a, b)
    assert _max_weight_diff(single_run, out, 6) < TOL


HOPE_SETS = ["model.hope.update_periods=[1,2,3]", "train.checkpoint_every=6"]


def _optimizer_groups(run: Path, step: int) -> list[tuple[int, bool, list[str]]]:
    """(period, decay, parameter names) of every optimizer group saved in a checkpoint."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    flat = run / "flat.pt"
    dcp_to_torch_save(str(run / "checkpoints" / ckpt.checkpoint_name(step)), str(flat))
    groups = torch.load(flat, weights_only=False)["optimizer"]["param_groups"]
    return sorted((g["period"], g["decay"], sorted(g["params"])) for g in groups)


def test_hope_update_periods_survive_fsdp(data_dir, tmp_path):
    """Hope (CMS periods 1, 2, 3) under FSDP2 and DDP on 2 ranks: the same optimizer groups
    (slow levels in their own period groups) and the same weights after 6 steps. Before the
    fix, fully_shard dropped the period tags and every level stepped every step."""
    runs = {}
    for parallel in ("ddp", "fsdp"):
        runs[parallel] = tmp_path / parallel
        _torchrun(
            data_dir, runs[parallel], *HOPE_SETS, f"train.parallel={parallel}", preset="hope-tiny"
        )
    groups = _optimizer_groups(runs["fsdp"], 6)
    assert groups == _optimizer_groups(runs["ddp"], 6)
    periods = {period for period, _, names in groups if names}
    assert periods == {1, 2, 3}
    slow = [n for period, _, names in groups if period == 3 for n in names]
    assert "blocks.0.mlp.levels.2.w_in.weight" in slow and "blocks.0.mlp.norms.1.weight" in slow
    assert _losses(runs["fsdp"]) == _losses(runs["ddp"])
    assert _max_weight_diff(runs["fsdp"], runs["ddp"], 6) < FSDP_TOL


def test_fsdp_meta_init_mixed_precision_and_planned_memory(tmp_path):
    """tests/training/scale_worker.py on 2 ranks: models built on meta and sharded are bitwise the CPU
    build (every family, tied or not); the bf16 policy computes with bf16 weights while the
    sharded weights and gradients stay fp32 and gradients are reduced in fp32; the parameter,
    gradient, AdamW and step-guard bytes each rank holds are the planner's per-GPU figures
    (within 10%)."""
    import json

    worker = Path(__file__).resolve().parent / "scale_worker.py"
    r = subprocess.run(
        torchrun_command(str(worker), str(tmp_path / "out")),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    for rank in range(2):
        res = json.loads((tmp_path / f"out-{rank}.json").read_text())
        assert res["meta_init"] and all(res["meta_init"].values()), res["meta_init"]
        bf16, fp32 = res["mixed_precision"]["bf16"], res["mixed_precision"]["fp32"]
        assert bf16["compute_dtype"] == "torch.bfloat16" and bf16["reduce_dtype"] == "torch.float32"
        assert fp32["compute_dtype"] == "torch.float32"
        for r_ in (bf16, fp32):
            assert r_["param_dtypes"] == r_["grad_dtypes"] == ["torch.float32"] and r_["finite"]
        for preset, lines in res["memory"].items():
            for line, (measured, planned) in lines.items():
                assert abs(planned - measured) <= 0.1 * measured, (rank, preset, line)

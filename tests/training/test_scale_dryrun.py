"""The CPU dry run at a real shape (opt-in: `pytest -m slow tests/training/test_scale_dryrun.py`, about
10 minutes and up to ~10 GiB of RAM on 2 cores; numbers in docs/scaling.md).

For `transformer-440m` and `titans-mag-440m` (short sequences: 128 tokens, micro-batch 1; two
of Titans' 64-token memory chunks, since with one chunk no token reads what the memory wrote and
the write projections get no gradient):

1. one process trains 2 optimizer steps (2 micro-batches each) and writes a checkpoint;
2. FSDP2 on 2 gloo processes trains the same 2 steps (1 micro-batch per rank) and writes a
   sharded (DCP) checkpoint, then a second launch resumes from it and trains step 3.

Checked: both ranks resume from step 2; the FSDP2 losses equal the one-process losses (fp32
reordering only); every rank's peak RSS is well below the one-process peak; the parameter,
gradient and AdamW bytes a rank holds are the planner's per-GPU figures within 10%.
`TAPERLM_DRYRUN_JSON=FILE` also writes every measurement there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fault_harness as H
from conftest import torchrun_command

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

PRESETS = os.environ.get("TAPERLM_DRYRUN_PRESETS", "transformer-440m,titans-mag-440m").split(",")
SETS = [
    "train.seq_len=128",
    "train.micro_batch_size=1",
    "train.batch_tokens=256",
    "train.tokens=768",  # 3 steps
    "train.warmup_tokens=256",
    "train.log_every=1",
    "train.eval_tokens=0",
    "train.checkpoint_every=2",
    "train.keep_checkpoints=1",
]


def _run(
    data: Path, out: Path, log: Path, preset: str, ranks: int, *extra: str, stop: int = 0
) -> float:
    argv = ["train", "--preset", preset, "--data", str(data), "--out", str(out)]
    for s in [*SETS, *extra]:
        argv += ["--set", s]
    argv.append("--no-progress")
    if stop:
        argv += ["--stop-after-steps", str(stop)]
    if ranks == 1:
        cmd = [sys.executable, str(H.HERE), "--child", *argv]
    else:
        cmd = torchrun_command(str(H.HERE), "--child", *argv, nproc=ranks)
    env = {**H.child_env(), H.LOG_ENV: str(log), H.MEASURE_ENV: "1"}
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-4000:]
    return time.perf_counter() - t0


def _events(log: Path, event: str) -> list[dict]:
    return [e for e in H.read_log(log) if e["event"] == event]


@pytest.mark.parametrize("preset", PRESETS)
def test_440m_dry_run_fsdp2_two_ranks(preset, tmp_path):
    from taperlm.config.presets import get_preset
    from taperlm.training.metrics import read_metrics
    from taperlm.training.planner import GiB, plan_training

    data = H.prepare_data(tmp_path / "data")
    one, log1 = tmp_path / "one", tmp_path / "one.jsonl"
    wall1 = _run(data, one, log1, preset, 1, stop=2)
    fsdp, log2 = tmp_path / "fsdp", tmp_path / "fsdp.jsonl"
    wall2 = _run(data, fsdp, log2, preset, 2, "train.parallel=fsdp", stop=2)
    log3 = tmp_path / "resume.jsonl"
    wall3 = _run(data, fsdp, log3, preset, 2, "train.parallel=fsdp")

    restores = sorted((e["rank"], e["step"]) for e in _events(log3, "restore"))
    assert restores == [(0, 2), (1, 2)]
    losses1 = [r["loss"] for r in read_metrics(one / "metrics.jsonl") if "loss" in r]
    losses2 = [r["loss"] for r in read_metrics(fsdp / "metrics.jsonl") if "loss" in r]
    assert len(losses1) == 2 and len(losses2) == 3
    assert max(abs(a - b) for a, b in zip(losses1, losses2)) < 1e-3, (losses1, losses2)

    peak1 = max(e["peak_rss_bytes"] for e in _events(log1, "exit"))
    peaks = {e["rank"]: e["peak_rss_bytes"] for e in _events(log2, "exit")}
    peaks_resume = {e["rank"]: e["peak_rss_bytes"] for e in _events(log3, "exit")}
    plan = plan_training(get_preset(preset), 2, 80 * GiB, 1, 128, parallel="fsdp")
    plan1 = plan_training(get_preset(preset), 1, 80 * GiB, 1, 128)
    if plan.params_total > 1e8:  # (tiny presets, for a quick check of this test: runtime-bound)
        assert max(peaks.values()) < 0.75 * peak1 and max(peaks_resume.values()) < 0.75 * peak1
    tensors = {e["rank"]: e for e in _events(log2, "tensors")}
    tensors1 = _events(log1, "tensors")[0]
    for line in ("parameters", "gradients", "optimizer"):
        for t in tensors.values():
            assert abs(plan.lines[line] - t[line]) <= 0.1 * t[line], (line, t)
        assert abs(plan1.lines[line] - tensors1[line]) <= 0.1 * tensors1[line], line

    result = {
        "preset": preset,
        "params": plan.params_total,
        "one_process": {
            "peak_rss_GiB": peak1 / GiB,
            "wall_s": wall1,
            "tensors_GiB": {k: tensors1[k] / GiB for k in ("parameters", "gradients", "optimizer")},
            "save_s": [e["s"] for e in _events(log1, "save_time")],
            "losses": losses1,
        },
        "fsdp2_2_ranks": {
            "peak_rss_GiB": {r: v / GiB for r, v in sorted(peaks.items())},
            "peak_rss_resume_GiB": {r: v / GiB for r, v in sorted(peaks_resume.items())},
            "wall_s": [wall2, wall3],
            "tensors_GiB_rank0": {
                k: tensors[0][k] / GiB for k in ("parameters", "gradients", "optimizer")
            },
            "planned_GiB": {
                k: plan.lines[k] / GiB for k in ("parameters", "gradients", "optimizer")
            },
            "save_s": [e["s"] for e in _events(log2, "save_time") + _events(log3, "save_time")],
            "restore_s": [e["s"] for e in _events(log3, "restore_time")],
            "losses": losses2,
            "checkpoint_GB": sum(
                f.stat().st_size for f in (fsdp / "checkpoints").glob("step_*/*") if f.is_file()
            )
            / 1e9,
        },
    }
    print(json.dumps(result, indent=2))
    out = os.environ.get("TAPERLM_DRYRUN_JSON")
    if out:
        path = Path(out)
        old = json.loads(path.read_text()) if path.exists() else {}
        old[preset] = result
        path.write_text(json.dumps(old, indent=2) + "\n")

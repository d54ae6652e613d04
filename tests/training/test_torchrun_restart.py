"""A rank that dies mid-run under `torchrun --max-restarts 1` (2 CPU processes, gloo): torchrun
restarts the group, both ranks resume from the newest checkpoint, and the run ends with the same
losses and weights as an uninterrupted 2-process run (issue 8, item 5).

The death is injected by tests/fault_harness.py's child mode: with TAPERLM_HARNESS_DIE_AT_STEP=K,
rank 1 calls os._exit(17) before optimizer step K on the first attempt only
(TORCHELASTIC_RESTART_COUNT == 0); every restore is logged to TAPERLM_HARNESS_LOG.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

import fault_harness as H
from conftest import torchrun_command

pytestmark = pytest.mark.distributed

DIE_AT = 7  # checkpoints every step: the restart resumes from step 6


def _torchrun(data: Path, out: Path, log: Path, *extra: str, env: dict | None = None):
    cmd = torchrun_command(
        *extra,
        str(H.HERE),
        "--child",
        *H.train_argv(data, out, "train.micro_batch_size=2"),  # 2 ranks x 2 x 32 = 128 tokens
    )
    full_env = {**H.child_env(), H.LOG_ENV: str(log), **(env or {})}
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=240)


def test_rank_death_is_restarted_and_resumes_exactly(tmp_path):
    data = H.prepare_data(tmp_path / "data")
    ref, ref_log = tmp_path / "ref", tmp_path / "ref.jsonl"
    r = _torchrun(data, ref, ref_log)
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.count("done: step 16/16") == 1

    run, log = tmp_path / "run", tmp_path / "run.jsonl"
    r = _torchrun(
        data,
        run,
        log,
        "--max-restarts",
        "1",
        env={H.DIE_STEP_ENV: str(DIE_AT), H.DIE_RANK_ENV: "1"},
    )
    assert r.returncode == 0, r.stderr[-4000:]
    assert "done: step 16/16" in r.stdout
    events = H.read_log(log)
    deaths = [e for e in events if e["event"] == "die"]
    assert [(e["rank"], e["restart"], e["step"]) for e in deaths] == [(1, 0, DIE_AT)]
    restores = sorted(
        (e["rank"], e["restart"], e["step"]) for e in events if e["event"] == "restore"
    )
    assert restores == [(0, 1, DIE_AT - 1), (1, 1, DIE_AT - 1)]  # both ranks, second attempt
    assert not [e for e in H.read_log(ref_log) if e["event"] == "restore"]

    assert H.compare_runs(run, ref) == []  # losses, val losses, final weights: bitwise equal
    w = H.final_weights(run)
    assert all(torch.isfinite(t).all() for t in w.values())
    assert os.path.getsize(run / "metrics.jsonl") > 0

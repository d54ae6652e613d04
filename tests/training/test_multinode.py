"""Multi-node training, executed on this one machine: two torchrun launchers (`--nnodes 2`, one
process each, c10d rendezvous on localhost) act as two nodes, for DDP and FSDP2 (gloo); their
losses match a single-node run of the same world size, and a run checkpointed on 2 nodes resumes
on 1 node. scripts/train.sbatch (docs/scaling.md's Slurm script) is run as Slurm would run it on
2 nodes (`srun` and `scontrol` stand-ins start one launcher per node here), so the launch command
it assembles is the one tested.

Tolerance as in tests/training/test_train_distributed.py (TOL: fp32 summation order). Default suite: the
Slurm script's 2-node DDP run against one process (one launch of 2 x 1 processes, ~10 s on 2
cores); the direct 2-node DDP and FSDP2 runs against single-node runs and the 2 -> 1 node resume
are slow (8 launches, ~1.5 min).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import torchrun_command
from taperlm.cli import main as cli_main
from taperlm.training.metrics import read_metrics
from test_train_distributed import TOL, _args, _env, _losses, data_dir  # noqa: F401

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
HAVE_TB = importlib.util.find_spec("tensorboard") is not None
SBATCH = REPO / "scripts" / "train.sbatch"
GRADS = "train.log_grads_every=2"  # per-layer gradient norms: a collective under FSDP2

# Slurm stand-ins: srun starts its command once per node (SLURM_NNODES) with the node's ids, as
# `srun --ntasks-per-node 1` does, and fails if any fails; scontrol names every node localhost.
FAKE_SRUN = """#!/usr/bin/env bash
while [[ "$1" == --* ]]; do shift; done
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do
    SLURM_NODEID=$i SLURM_PROCID=$i SLURMD_NODENAME=localhost "$@" > "$SRUN_LOG.$i" 2>&1 &
    pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
exit $rc
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
[ "$1 $2" = "show hostnames" ] || exit 2
for ((i = 0; i < SLURM_NNODES; i++)); do echo localhost; done
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _wait_all(procs: list[subprocess.Popen], timeout: int = 240) -> list[str]:
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), [o[-3000:] for o in outs]
    return outs


def _nodes(data: Path, out: Path, nodes: int, *extra: str, nproc: int = 1, flags=()) -> None:
    """`nodes` torchrun launchers, one per "node", meeting at a c10d rendezvous on localhost."""
    port = _free_port()
    procs = []
    for rank in range(nodes):
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(nodes), "--nproc_per_node", str(nproc), "--node-rank", str(rank),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}",
            "--rdzv-id", f"test-{port}",
            "-m", "taperlm.cli", *_args(data, out, *extra), *flags,
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(
                cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
        )
    _wait_all(procs)


def _one_node(data: Path, out: Path, *extra: str) -> None:
    """The reference: one node, 2 processes (`torchrun --standalone`)."""
    cmd = torchrun_command("-m", "taperlm.cli", *_args(data, out, *extra))
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]


def _layer_norms(run: Path) -> list[list[float]]:
    return [
        r["layer_grad_norm"] for r in read_metrics(run / "metrics.jsonl") if "layer_grad_norm" in r
    ]


def _close(a: list[float], b: list[float]) -> None:
    assert len(a) == len(b) == 6
    assert max(abs(x - y) for x, y in zip(a, b)) < TOL, (a, b)


@pytest.fixture(scope="module")
def single(data_dir, tmp_path_factory) -> Path:  # noqa: F811
    """One process, in this one: the losses and per-layer gradient norms every run here has."""
    out = tmp_path_factory.mktemp("single") / "run"
    assert cli_main(_args(data_dir, out, GRADS)) == 0
    return out


def _same_as(ref: Path, run: Path) -> None:
    """Losses and per-layer gradient norms of `run` are `ref`'s (within TOL)."""
    _close(_losses(ref), _losses(run))
    norms_ref, norms_run = _layer_norms(ref), _layer_norms(run)
    assert len(norms_ref) == len(norms_run) == 3
    for a, b in zip(norms_ref, norms_run):
        assert max(abs(x - y) for x, y in zip(a, b)) < TOL, (a, b)


def test_slurm_script_trains_on_two_nodes(data_dir, single, tmp_path):  # noqa: F811
    """scripts/train.sbatch under stand-ins for srun/scontrol: 2 nodes x 1 process, DDP; the
    losses and per-layer gradient norms are those of one process (within TOL)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {
        **_env(),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "node[01-02]",
        "SLURM_JOB_ID": "4242",
        "GPUS_PER_NODE": "1",
        "RDZV_PORT": str(_free_port()),
        "TAPERLM_PYTHON": sys.executable,
        "SRUN_LOG": str(tmp_path / "node"),
    }
    out = tmp_path / "slurm"
    args = _args(data_dir, out, GRADS)[1:]  # after `train`: what the user gives the script
    if HAVE_TB:
        args += ["--logger", "tensorboard"]  # logged by rank 0 alone
    r = subprocess.run(["bash", str(SBATCH), *args], env=env, capture_output=True, timeout=240)
    logs = [(tmp_path / f"node.{i}").read_text() for i in range(2)]
    assert r.returncode == 0, logs
    assert sum(log.count("done: step 6/6") for log in logs) == 1  # rank 0 reports, on one node

    if HAVE_TB:
        assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1
    _same_as(single, out)


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_nodes_match_one_node(data_dir, single, tmp_path, parallel):  # noqa: F811
    """2 nodes x 1 process vs 1 node x 2 processes (same world size) and one process: the same
    losses and per-layer gradient norms (under FSDP2 summed across the ranks' shards)."""
    one, two = tmp_path / "one", tmp_path / "two"
    _one_node(data_dir, one, f"train.parallel={parallel}", GRADS)
    _nodes(data_dir, two, 2, f"train.parallel={parallel}", GRADS)
    _same_as(one, two)
    _same_as(single, two)


@pytest.mark.slow
def test_two_node_checkpoint_resumes_on_one_node(data_dir, tmp_path):  # noqa: F811
    """FSDP2 on 2 nodes stops at step 3 (sharded checkpoint); the run finishes on 1 node (2
    processes, a c10d launch of 1 node) with the losses of an uninterrupted 1-node run."""
    ref, out = tmp_path / "ref", tmp_path / "moved"
    _one_node(data_dir, ref, "train.parallel=fsdp")
    _nodes(data_dir, out, 2, "train.parallel=fsdp", flags=("--stop-after-steps", "3"))
    assert len(_losses(out)) == 3
    _nodes(data_dir, out, 1, "train.parallel=fsdp", nproc=2)
    _close(_losses(ref), _losses(out))

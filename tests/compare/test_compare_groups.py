"""`taperlm compare --nproc-per-cell N`: the devices each running cell is given (a pure function,
no GPU needed), the default --jobs per device count, and a cell trained as a group of 2 gloo
processes equal bit for bit to `taperlm train` under torchrun with 2 processes on its config;
`--dry-run`: the cost before spending, creating nothing."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import torchrun_command
from taperlm.cli import main
from taperlm.compare import cell as compare_cell
from taperlm.compare import execute, workers
from taperlm.compare.options import CompareOptions
from taperlm.errors import ConfigError
from test_compare import data_dir  # noqa: F401 (fixture)


@pytest.mark.parametrize(
    "devices,nproc,jobs",
    [(8, 1, 8), (8, 2, 4), (8, 4, 2), (8, 8, 1), (8, 3, 2), (16, 8, 2), (4, 2, 1), (2, 1, 2)],
)
def test_device_slots_are_disjoint_and_complete(devices, nproc, jobs):
    """Every running cell gets exactly nproc devices, no device goes to two cells, and every
    device named exists."""
    slots = workers.device_slots(devices, nproc, jobs)
    assert len(slots) == jobs
    assert all(len(s) == nproc for s in slots)
    used = [d for s in slots for d in s]
    assert len(used) == len(set(used))
    assert all(0 <= d < devices for d in used)


@pytest.mark.parametrize("devices,nproc,jobs", [(8, 2, 5), (8, 16, 1), (1, 2, 1), (8, 1, 9)])
def test_device_slots_refuse_what_does_not_fit(devices, nproc, jobs):
    with pytest.raises(ConfigError, match=r"--nproc-per-cell|--jobs"):
        workers.device_slots(devices, nproc, jobs)


def test_group_env_is_torchruns():
    """What each rank of a group is given: torchrun's variables, and on GPUs its own devices
    only (a cell's numbers then do not depend on which devices it got)."""
    envs = [workers.group_env(r, 4, 29500, [4, 5, 6, 7]) for r in range(4)]
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert all(e["WORLD_SIZE"] == "4" and e["MASTER_PORT"] == "29500" for e in envs)
    assert {e["CUDA_VISIBLE_DEVICES"] for e in envs} == {"4,5,6,7"}
    assert "CUDA_VISIBLE_DEVICES" not in workers.group_env(0, 2, 1, None)  # CPU: gloo


@pytest.mark.parametrize("gpus,nproc,cells,want", [(8, 8, 10, 1), (8, 2, 10, 4), (8, 1, 3, 3)])
def test_default_jobs_are_devices_over_nproc(gpus, nproc, cells, want, monkeypatch, capsys):
    monkeypatch.setattr(execute, "_cuda_devices", lambda cells: gpus)
    grid = SimpleNamespace(cells=[SimpleNamespace(name=f"c{i}") for i in range(cells)])
    jobs = execute.choose_jobs(
        CompareOptions(out=Path("x"), nproc_per_cell=nproc),
        grid,
        Path("x"),
        compare_cell.EvalSettings(),
        cell_state=lambda cell, run_dir, settings: ("train", None),
    )
    assert jobs == want
    assert f"{gpus} GPU(s), {nproc} per cell" in capsys.readouterr().err


def _cli(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    return rc, out.getvalue(), err.getvalue()


def test_dry_run_prints_gpu_hours_and_creates_nothing(tmp_path):
    """The paper's 440M at 30B tokens: each cell's GPU-hours at the measured MFU, the fixed
    total and the sequential range, the jobs; no folder, no file, nothing trained."""
    out = tmp_path / "nothing"
    before = sorted(tmp_path.rglob("*"))
    rc, stdout, _ = _cli(
        ["compare", "--preset", "transformer-440m", "--tokens", "30000000000", "--seeds", "5",
         "--nproc-per-cell", "8", "--dry-run", "--out", str(out)]
    )  # fmt: skip
    assert rc == 0
    assert sorted(tmp_path.rglob("*")) == before and not out.exists()
    assert "39.5% MFU" in stdout
    cells = [ln for ln in stdout.splitlines() if ln.startswith("  ") and "GPU-hours" in ln]
    assert len(cells) == 10  # uniform and the default taper x 5 seeds
    hours = [float(ln.split(": ")[1].split(" GPU")[0].replace(",", "")) for ln in cells]
    # 6N + attention FLOPs per token at 455.9M parameters: ~82 GPU-hours a run (~10 h on 8)
    assert all(70 < h < 100 for h in hours)

    def number(after: str) -> float:
        return float(stdout.split(after, 1)[1].split(" GPU")[0].replace(",", ""))

    # the printed hours are rounded to 0.1: their sums agree to within that per cell
    assert number("total, fixed design (every seed): ") == pytest.approx(sum(hours), abs=1)
    low = sum(h for h, ln in zip(hours, cells) if ln.split("-s")[-1][0] in "012")
    assert number("between ") == pytest.approx(low, abs=1)  # --min-seeds 3 .. every seed
    assert "in 10 cells" in stdout
    assert "each a group of 8 process(es)" in stdout


# ------------------------------------------------------------------ a cell as a group (gloo)

TINY = [
    "--preset", "transformer-tiny", "--set", "model.n_layers=3", "--set", "model.d_model=32",
    "--set", "model.n_heads=2", "--set", "model.mlp_width=64", "--set", "model.context_length=32",
    "--set", "train.seq_len=32", "--set", "train.micro_batch_size=2",
    "--set", "train.batch_tokens=128", "--set", "train.eval_tokens=64",
    "--set", "train.checkpoint_every=4", "--tokens", "1024", "--val-tokens", "128",
    "--novelty-tokens", "96", "--threads", "1", "--no-progress", "--stop", "fixed",
]  # fmt: skip


@pytest.mark.distributed
def test_cell_of_two_gloo_processes_equals_torchrun_train(data_dir, tmp_path):  # noqa: F811
    """One cell, 2 processes: its checkpoint and metrics equal `taperlm train` under torchrun
    with 2 processes on the cell's own config.yaml, bit for bit; its sessions say so."""
    out = tmp_path / "cmp"
    rc, _, err = _cli(
        ["compare", *TINY, "--tapers", "uniform", "--seeds", "1", "--nproc-per-cell", "2",
         "--jobs", "1", "--data", str(data_dir), "--out", str(out)]
    )  # fmt: skip
    assert rc == 0, err
    cell = out / "runs" / "uniform-s0"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = torchrun_command(
        "-m", "taperlm.cli", "train", "--config", str(cell / "config.yaml"),
        "--out", str(tmp_path / "train"), "--no-progress",
    )  # fmt: skip
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    from taperlm.checkpoint import store as ckpt

    a = ckpt.load_model_state(cell / "checkpoints" / ckpt.checkpoint_name(8))
    b = ckpt.load_model_state(tmp_path / "train" / "checkpoints" / ckpt.checkpoint_name(8))
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)

    def losses(run: Path) -> list[float]:
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in rows if "loss" in r]

    assert losses(cell) == losses(tmp_path / "train")
    result = json.loads((cell / "result.json").read_text())
    assert result["train"]["steps"] == 8
    assert [s["processes"] for s in result["sessions"] if s["phase"] == "train"] == [2]
    report = json.loads((out / "report.json").read_text())
    assert "--nproc-per-cell 2" in report["meta"]["command"]


def test_a_cell_held_elsewhere_is_not_trained_twice(tmp_path):
    """A second job of one cell (two login nodes submitted it) finds its run dir held by the
    first and stops before training, naming the holder."""
    from taperlm.errors import RunInUseError

    run_dir = tmp_path / "runs" / "c-s0"
    run_dir.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from taperlm.files.runlock import locked\n"
         "with locked(sys.argv[1]):\n    print('held', flush=True); time.sleep(120)",
         str(run_dir)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        train = SimpleNamespace(device="cpu", checkpoint_every=0)
        cell = SimpleNamespace(name="c-s0", config=SimpleNamespace(train=train))
        task = workers.CellTask(cell, str(run_dir), str(tmp_path), {}, 1, 1)
        with pytest.raises(RunInUseError, match=f"pid {holder.pid}"):
            workers.run_rank(task, lambda: False)
        assert not (run_dir / "sessions.jsonl").exists()  # no session started, nothing trained
        assert not (run_dir / "checkpoints").exists()
    finally:
        holder.kill()
        holder.wait()

"""`taperlm compare --executor slurm` against a real single-node Slurm on localhost
(`slurm_localhost`: Debian's munged, slurmctld and slurmd as plain processes): a tiny comparison,
2 processes per cell (gloo, the tasks of one job), one job killed mid-training; the next run of
the command shows every cell's state, resubmits only the killed cell, which resumes from its
checkpoint, and every cell's numbers equal the local executor's. Also: a second run while the
jobs are queued submits nothing twice; a wrong partition is refused before anything is
submitted. Opt-in (`-m slurm`, ~3-5 min on 2 busy cores); skips where Slurm cannot be had.

Run: python3 -m pytest -q -p no:cacheprovider -m slurm tests/cluster
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import slurm_localhost
from taperlm.cli import main
from taperlm.compare import slurm
from test_compare import data_dir  # noqa: F401 (fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# 2 allocations x 1 seed of 256 steps (of 128 tokens) each, a checkpoint every 16 steps: long
# enough for the test to see a checkpoint and kill the job before the cell is done
TINY = [
    "--preset", "transformer-tiny", "--set", "model.n_layers=3", "--set", "model.d_model=32",
    "--set", "model.n_heads=2", "--set", "model.mlp_width=64", "--set", "model.context_length=32",
    "--set", "train.seq_len=32", "--set", "train.micro_batch_size=2",
    "--set", "train.batch_tokens=128", "--set", "train.eval_tokens=64",
    "--set", "train.checkpoint_every=16", "--set", "train.keep_checkpoints=4",
    "--tokens", "32768", "--val-tokens", "128", "--novelty-tokens", "96", "--threads", "1",
    "--no-progress", "--stop", "fixed", "--tapers", "uniform;late=cosine:0.5:1.5",
    "--seeds", "1", "--nproc-per-cell", "2",
]  # fmt: skip
CELLS = ("uniform-s0", "late-s0")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = slurm_localhost.why_not()
    if why:
        pytest.skip(why)
    local = slurm_localhost.LocalSlurm(tmp_path_factory.mktemp("slurm"))
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(local.conf)
    try:
        local.start()
        yield local
    finally:
        local.stop()
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


def _cli(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    return rc, out.getvalue(), err.getvalue()


def _record(out: Path, cell: str) -> list[str]:
    path = out / "slurm" / "cells" / f"{cell}.json"
    return [j["id"] for j in json.loads(path.read_text())["jobs"]] if path.exists() else []


def _wait(ready, what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_wrong_partition_is_refused_before_anything_is_submitted(cluster, data_dir, tmp_path):  # noqa: F811
    out = tmp_path / "cmp"
    args = ["compare", *TINY, "--executor", "slurm", "--slurm-partition", "nosuchpartition",
            "--data", str(data_dir), "--out", str(out)]  # fmt: skip
    rc, _, err = _cli(args)
    assert rc != 0
    assert "Slurm refuses these job settings" in err and "--slurm-partition" in err
    assert not out.exists() and cluster.jobs() == []


def test_killed_job_resumes_and_every_cell_equals_local(cluster, data_dir, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(slurm, "POLL_S", 1.0)
    local, out = tmp_path / "local", tmp_path / "slurm"
    rc, _, err = _cli(
        ["compare", *TINY, "--jobs", "1", "--data", str(data_dir), "--out", str(local)]
    )
    assert rc == 0, err

    args = ["compare", *TINY, "--executor", "slurm", "--slurm-time", "20",
            "--data", str(data_dir), "--out", str(out)]  # fmt: skip
    rc, stdout, err = _cli(args)  # submits the wave (a job array) and returns
    assert rc == 0, err
    assert "queued or running on Slurm" in stdout
    first = {c: _record(out, c) for c in CELLS}
    assert all(len(ids) == 1 for ids in first.values()), first
    assert "queued (new)" in err

    rc, _, err = _cli(args)  # a second run while they are queued/running: nothing twice
    assert rc == 0, err
    assert {c: _record(out, c) for c in CELLS} == first
    assert "queued (new)" not in err and ("queued" in err or "running" in err)

    # kill the first cell's job once it has a checkpoint and before it is done
    victim = CELLS[0]
    job = first[victim][0]
    ckpts = out / "runs" / victim / "checkpoints"
    _wait(lambda: any(p.name.startswith("step_") for p in ckpts.glob("step_*")), "a checkpoint")
    assert not (out / "runs" / victim / "result.json").exists(), "the cell ended before the kill"
    # SIGKILL, as a node failure or the OOM killer would (a plain scancel's SIGTERM is what
    # submitit's jobs ignore until Slurm's KillWait ends them the same way)
    subprocess.run(["scancel", "--signal=KILL", job], check=True)
    _wait(lambda: job not in cluster.jobs(), f"job {job} to end")
    assert not (out / "runs" / victim / "result.json").exists()

    rc, _, err = _cli([*args, "--wait"])  # shows the states, resubmits the killed cell, waits
    assert rc == 0, err
    assert len(_record(out, victim)) == 2  # resubmitted once
    assert len(_record(out, CELLS[1])) == 1  # never twice
    assert (out / "report.md").is_file()

    for cell in CELLS:
        a = json.loads((local / "runs" / cell / "result.json").read_text())
        b = json.loads((out / "runs" / cell / "result.json").read_text())
        assert b["val"] == a["val"], cell  # bit for bit: the loss as stored
        assert b["novelty"] == a["novelty"], cell
        assert b["curve"] == a["curve"], cell
    # the verdict (the stop's record, the paired differences over training, the paper's
    # comparison) is the local executor's: nothing in a report depends on where cells ran
    rl, rs = (json.loads((o / "report.json").read_text()) for o in (local, out))
    for key in ("stopping", "loss_vs_tokens", "paper_comparison", "checks"):
        assert rs[key] == rl[key], key
    resumed = json.loads((out / "runs" / victim / "result.json").read_text())["train"]
    assert resumed["resumed_from_step"] > 0  # it went on from its checkpoint
    sessions = [
        json.loads(x) for x in (out / "runs" / victim / "sessions.jsonl").read_text().splitlines()
    ]
    assert next(s["from_step"] for s in sessions if s["phase"] == "train") == 0
    assert len([s for s in sessions if s["phase"] == "train"]) >= 2

    rc, _, err = _cli(args)  # all done: nothing submitted, the report written from the cells
    assert rc == 0, err
    assert all(len(_record(out, c)) == n for c, n in ((victim, 2), (CELLS[1], 1)))


def test_two_commands_never_submit_one_folder_at_once(cluster, data_dir, tmp_path):  # noqa: F811
    """Another process (another login node's command) holds the comparison folder: this one is
    refused, naming it, and submits nothing; each cell's job then holds its run dir the same way
    (`taperlm.files.runlock`), so a cell never trains twice at once."""
    out = tmp_path / "cmp"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from taperlm.files.runlock import locked\n"
         "with locked(sys.argv[1], 'comparison folder'):\n"
         "    print('held', flush=True); time.sleep(120)", str(out)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        args = ["compare", *TINY, "--executor", "slurm", "--data", str(data_dir),
                "--out", str(out)]  # fmt: skip
        rc, _, err = _cli(args)
        assert rc != 0 and "is in use by pid" in err and str(holder.pid) in err
        assert cluster.jobs() == [] and not (out / "slurm").exists()
    finally:
        holder.kill()
        holder.wait()

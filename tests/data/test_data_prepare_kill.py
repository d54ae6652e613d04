"""SIGKILL during `taperlm prepare` (real processes, tests/data/prepare_faults.py), re-preparing over an
existing data dir: until the commit point the old data dir loads exactly as before, after it the
new one does, and rerunning the same command (with another --workers) finishes with bytes
identical to an uninterrupted run.

The default run kills at three moments; `-m slow` adds the others and kills at random times.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taperlm.cli import main
from taperlm.data import datadir
from test_data_prepare import digest, loaded, write_folder

CHILD = Path(__file__).with_name("prepare_faults.py")
ARGS = [
    "--tokenizer",
    "bpe:300",
    "--val-fraction",
    "0.05",
    "--val-tokens",
    "2500",  # more than the picked documents hold: the tail split runs too
    "--shard-tokens",
    "900",
    "--no-progress",
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("kill")
    src = write_folder(root / "src")
    argv = ["prepare", "--source", str(src), *ARGS]
    ref = root / "ref"
    assert main([*argv, "--out", str(ref), "--workers", "1"]) == 0
    old = root / "old"
    assert main(["prepare", "--source", str(src), "--tokenizer", "bpe:280", "--out", str(old),
                 "--workers", "1", "--no-progress"]) == 0  # fmt: skip
    return argv, ref, old


def start_child(moment: str, argv: list[str], out: Path, flag: Path, workers: int):
    env = {**os.environ, "TAPERLM_TEST_BATCH_CHARS": "1500", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(CHILD), moment, str(flag), "--", *argv]
    return subprocess.Popen(
        [*cmd, "--out", str(out), "--workers", str(workers)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_at(moment: str, argv: list[str], out: Path, tmp: Path, workers: int = 1) -> None:
    flag = tmp / "paused"
    child = start_child(moment, argv, out, flag, workers)
    deadline = time.monotonic() + 120
    while not flag.exists():
        if child.poll() is not None:
            raise AssertionError(f"child ended ({child.returncode}) before {moment}: {child.stderr.read()}")  # fmt: skip
        if time.monotonic() > deadline:
            child.kill()
            raise AssertionError(f"child never reached {moment}")
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL


def check_kill_and_rerun(setup, tmp_path: Path, moment: str, workers: int = 1) -> None:
    argv, ref, old = setup
    out = tmp_path / "data"
    shutil.copytree(old, out)
    before = loaded(out)
    kill_at(moment, argv, out, tmp_path, workers)
    committed = moment.startswith(("committed", "moved"))
    assert loaded(out) == (loaded(ref) if committed else before)
    assert (out / datadir.WORK_DIR).is_dir() == (not committed)
    # Rerun with the other worker count: continues (or finishes the commit) and ends identical.
    assert main([*argv, "--out", str(out), "--workers", str(3 - workers)]) == 0
    assert digest(out) == digest(ref)
    assert not (out / datadir.WORK_DIR).exists() and not (out / datadir.COMMIT_DIR).exists()


@pytest.mark.parametrize(
    ("moment", "workers"), [("published:4", 2), ("state:5", 1), ("committed", 1)]
)
def test_sigkill_then_rerun(setup, tmp_path, moment, workers) -> None:
    check_kill_and_rerun(setup, tmp_path, moment, workers)


@pytest.mark.slow
@pytest.mark.parametrize(
    "moment", ["tokenizer-saved", "published:1", "state:2", "tail-moved", "moved:1", "moved:4"]
)
def test_sigkill_then_rerun_more_moments(setup, tmp_path, moment) -> None:
    check_kill_and_rerun(setup, tmp_path, moment)


@pytest.mark.slow
def test_sigkill_at_random_times(setup, tmp_path) -> None:
    """Up to three kills at random delays, then a run to the end; six trials."""
    argv, ref, old = setup
    rng = random.Random(0)
    for trial in range(6):
        out = tmp_path / f"t{trial}"
        shutil.copytree(old, out)
        before = loaded(out)
        for kill in range(3):
            flag = tmp_path / f"f{trial}-{kill}"
            child = start_child("never", argv, out, flag, workers=rng.choice([1, 2]))
            time.sleep(rng.uniform(0.5, 4.0))
            if child.poll() is not None:
                break
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
            state = loaded(out)
            assert state in (before, loaded(ref))
        assert main([*argv, "--out", str(out), "--workers", "1"]) == 0
        assert digest(out) == digest(ref)

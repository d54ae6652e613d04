"""`taperlm compare --stop`: a tiny comparison stops adding seeds when its rule holds, gives the
same stop and numbers on one process and on two workers (cells of later seeds that were already
running stay cached and out of the report), and a stopped comparison resumed with a tighter rule
continues from its cache."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from test_compare import ALLOCS, TINY, _cli, data_dir  # noqa: F401 (fixture)

# a half-width any finite interval meets: stops at --min-seeds, the first n where the sequence
# is bounded (n = 3 at the default error rate), whatever the tiny models' numbers are
LOOSE = ["--stop", "half-width:100", "--min-seeds", "3"]


def _run(data: Path, out: Path, *extra: str) -> tuple[dict, str]:
    args = ["compare", *TINY, *ALLOCS, "--data", str(data), "--out", str(out), *extra]
    rc, _, err = _cli(args)
    assert rc == 0, err
    return json.loads((out / "report.json").read_text()), err


def _numbers(rep: dict) -> dict:
    return {
        "losses": {a["name"]: a["val_loss"]["values"] for a in rep["allocations"]},
        "seeds": rep["meta"]["settings"]["seeds"],
        "stopping": rep["stopping"],
    }


def test_stops_at_the_rule_and_resumes(data_dir, tmp_path):  # noqa: F811
    """One process: stops at the rule, resumes with a tighter one from its cache, and the
    replay of its report stops where it did."""
    _stop_and_resume(data_dir, tmp_path, workers=False)


@pytest.mark.slow
def test_stops_at_the_rule_the_same_on_any_number_of_workers_and_resumes(data_dir, tmp_path):  # noqa: F811
    """The same with two workers beside the one process, to the last digit (about 1 minute more
    on 2 cores). The default lane has both halves: test_stops_at_the_rule_and_resumes (the rule,
    one process) and test_compare.py's test_two_workers_give_bit_identical_numbers (workers give
    the in-process numbers)."""
    _stop_and_resume(data_dir, tmp_path, workers=True)


def _stop_and_resume(data_dir: Path, tmp_path: Path, workers: bool) -> None:  # noqa: F811
    one, _ = _run(data_dir, tmp_path / "one", "--seeds", "5", *LOOSE, "--jobs", "1")
    s = one["stopping"]
    assert (s["stopped_at"], s["reason"], s["cap"], s["rule"]) == (
        3,
        "half-width",
        5,
        "half-width:100",
    )
    assert one["meta"]["settings"]["seeds"] == [0, 1, 2]
    assert all(a["val_loss"]["n"] == 3 for a in one["allocations"])
    # one process: nothing of seeds 3, 4 ever started
    assert sorted(p.name for p in (tmp_path / "one" / "runs").iterdir()) == sorted(
        f"{a}-s{k}" for a in ("uniform", "late") for k in range(3)
    )
    assert [e["n"] for e in s["sequence"]] == [1, 2, 3] and s["sequence"][-1]["stops"]
    assert s["sequence"][0]["comparisons"]["late"]["ci"] is None  # unbounded at n = 1
    assert "--stop half-width:100" in one["meta"]["command"]
    assert "--seeds 5" in one["meta"]["command"]  # the cap, not the seeds used
    md = (tmp_path / "one" / "report.md").read_text()
    assert "## When it stopped" in md  # its numbers are report.json's "stopping", checked above
    assert (tmp_path / "one" / "sequence.png").is_file()

    if workers:
        # two workers: a cell of seed 3 may already run when seed 2 completes; it finishes and
        # stays cached, and the report is the one-process report to the last digit
        two, err2 = _run(data_dir, tmp_path / "two", "--seeds", "5", *LOOSE, "--jobs", "2")
        assert _numbers(two) == _numbers(one)
        assert not (tmp_path / "two" / "runs" / "uniform-s4").exists()  # never started
        assert "half-width after 3 seed(s): no new cells start" in err2

    # resumed with a tighter rule: continues with seed 3 (seeds 0-2 cached), up to the new cap
    tight, err = _run(data_dir, tmp_path / "one", "--seeds", "4", "--stop", "half-width:1e-9")
    assert tight["stopping"]["reason"] == "cap" and tight["stopping"]["stopped_at"] == 4
    trained = sorted(
        ln.split(":")[0].split("] ")[1] for ln in err.splitlines() if ": trained" in ln
    )
    assert trained == ["late-s3", "uniform-s3"]
    for a in tight["allocations"]:
        assert a["val_loss"]["values"][:3] == _numbers(one)["losses"][a["name"]]
    if workers:
        # the two-worker folder resumed likewise: a seed-3 cell stopped there with a checkpoint
        # (or finished) continues to the very numbers the one-process folder trained from scratch
        tight2, _ = _run(data_dir, tmp_path / "two", "--seeds", "4", "--stop", "half-width:1e-9")
        assert _numbers(tight2) == _numbers(tight)
    # the replay of benchmarks/sequential_replay.py on the 4-seed report stops where compare
    # stopped under the same rule, and sums the recorded run seconds of the seeds it used
    replay = _replay(tight, "half-width:100")
    assert (replay["fixed_seeds"], replay["sequential_seeds"], replay["reason"]) == (
        4,
        3,
        "half-width",
    )
    per_seed = [sum(_run_s(a["per_seed"][str(k)]) for a in tight["allocations"]) for k in range(4)]
    assert replay["fixed_run_s"] == pytest.approx(sum(per_seed)) and per_seed[3] > 0
    assert replay["sequential_run_s"] == pytest.approx(sum(per_seed[:3]))
    # and back to the looser rule: the stop at 3 again, from the cache alone
    again, err = _run(data_dir, tmp_path / "one", "--seeds", "5", *LOOSE)
    assert ": trained" not in err and _numbers(again) == _numbers(one)


def _run_s(entry: dict) -> float:
    return entry["train_wall_s"] + sum(v or 0.0 for v in (entry["times"] or {}).values())


def _replay(report: dict, stop: str) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import sequential_replay

    args = argparse.Namespace(stop=stop, alpha=0.05, min_seeds=3, stop_on="each")
    (row,) = sequential_replay.from_compare_report("tiny", report, args)
    return row


def test_workers_stop_running_cells_the_comparison_no_longer_needs():
    """After the stop, a worker running a cell of a later seed is asked to stop it (SIGTERM:
    checkpoint at the next step), a worker on a wanted cell is left alone, and the halted cell's
    "interrupted" report is not taken for a Ctrl-C (which would end compare with an error)."""
    import subprocess
    import time
    from types import SimpleNamespace

    from taperlm.compare import workers

    sleepers = [subprocess.Popen(["sleep", "30"]) for _ in range(2)]
    try:
        procs = [
            SimpleNamespace(pid=p.pid, is_alive=lambda p=p: p.poll() is None) for p in sleepers
        ]
        todo = [SimpleNamespace(seed=2, name="a-s2"), SimpleNamespace(seed=3, name="a-s3")]
        pool = workers._WorkerPool.__new__(workers._WorkerPool)
        pool.todo, pool.procs, pool.running = todo, procs, {0: 0, 1: 1}
        pool.wants, pool.halting, pool.halted, pool.interrupted = (
            lambda c: c.seed < 3,
            set(),
            [],
            [],
        )
        pool.stop_sent = None
        pool._halt_unwanted()
        assert pool.halting == {1} and pool.stop_sent is not None
        deadline = time.monotonic() + 10
        while sleepers[1].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sleepers[1].returncode == -15 and sleepers[0].poll() is None
        pool._handle("interrupted", 1, (1, "a-s3 stopped at step 2/4 (checkpointed)"))
        assert pool.halted and not pool.interrupted and pool.running == {0: 0}
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


def test_two_allocations_that_train_alike_stop_with_no_practical_difference(data_dir, tmp_path):  # noqa: F811
    """uniform against the same widths given outright (custom:64,64,64): every seed's pair trains
    alike, so `--stop equivalent` (margin 0.02 nats) stops at --min-seeds, before the cap of 6,
    and report.md's verdict says "no practical difference (within ±0.02 nats)"."""
    args = ["compare", *TINY, "--tapers", "uniform;same=custom:64,64,64", "--seeds", "6"]
    out = tmp_path / "same"
    rc, _, err = _cli([*args, "--stop", "equivalent", "--data", str(data_dir), "--out", str(out)])
    assert rc == 0, err
    rep = json.loads((out / "report.json").read_text())
    s = rep["stopping"]
    assert (s["stopped_at"], s["reason"], s["cap"]) == (3, "equivalent", 6)
    assert s["rule"] == "equivalent:0.02"  # the margin stated
    last = s["sequence"][-1]["comparisons"]["same"]
    assert last["within_margin"] and last["mean"] == 0.0
    assert rep["meta"]["settings"]["seeds"] == [0, 1, 2]
    md = (out / "report.md").read_text()
    verdict = next(ln for ln in md.splitlines() if ln.startswith("- **same vs uniform"))
    assert "no practical difference (within ±0.02 nats)" in verdict
    assert "stopped after 3 of at most 6 seeds" in md and "no practical difference" in md
    assert "--stop equivalent" in rep["meta"]["command"]

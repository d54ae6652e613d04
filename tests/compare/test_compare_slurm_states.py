"""The Slurm executor's bookkeeping without a cluster: its settings (--slurm-time's forms,
--slurm-extra, the sbatch arguments), every state a cell can be in (missing, queued, running,
failed after MAX_ATTEMPTS, cancelled by the stop not counted), the waves (never more cells in
flight than --jobs, seeds in order) and the cancelling of queued cells once the sequential stop
has decided. The executor against a real Slurm: tests/cluster/test_slurm_executor.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from taperlm.compare import slurm
from taperlm.compare.cell import EvalSettings
from taperlm.compare.options import CompareOptions
from taperlm.errors import ConfigError


@pytest.mark.parametrize(
    "text,minutes",
    [("90", 90), ("10:30", 11), ("12:00:00", 720), ("2-00:00:00", 2880), ("1-6", 1800),
     ("0-00:01", 1), ("1-00:00:30", 1441)],
)  # fmt: skip
def test_slurm_time_forms(text, minutes):
    assert slurm.parse_minutes(text) == minutes


@pytest.mark.parametrize("text", ["", "abc", "1:2:3:4", "-5", "00:00", "1-x", "1:-1"])
def test_bad_slurm_time_names_the_option(text):
    with pytest.raises(ConfigError, match="--slurm-time"):
        slurm.parse_minutes(text)


def test_slurm_extra_and_sbatch_args():
    assert slurm.parse_extra("--mem=64G --exclusive --gres gpu:8") == {
        "mem": "64G",
        "exclusive": True,
        "gres": "gpu:8",
    }
    with pytest.raises(ConfigError, match="--slurm-extra"):
        slurm.parse_extra("mem=64G")
    opts = CompareOptions(
        out=Path("x"), nproc_per_cell=16, slurm_nodes=2, slurm_partition="gpu",
        slurm_account="lab", slurm_time="12:00:00", slurm_gpus_per_node=8,
        slurm_constraint="h100", slurm_extra="--mem=0 --exclusive", threads=4,
    )  # fmt: skip
    args = slurm.SlurmSettings.from_options(opts).sbatch_args()
    for want in ("--partition=gpu", "--account=lab", "--time=720", "--nodes=2",
                 "--ntasks-per-node=8", "--gpus-per-node=8", "--cpus-per-task=4",
                 "--constraint=h100", "--mem=0", "--exclusive"):  # fmt: skip
        assert want in args
    with pytest.raises(ConfigError, match="split evenly"):
        slurm.SlurmSettings.from_options(CompareOptions(out=Path("x"), nproc_per_cell=3,
                                                        slurm_nodes=2))  # fmt: skip


def _executor(tmp_path: Path, jobs: int, wait: bool = True) -> slurm.SlurmExecutor:
    return slurm.SlurmExecutor(
        tmp_path, jobs, tmp_path / "data", EvalSettings(), slurm.SlurmSettings(), 1, wait, 0.0
    )


def _record(jobs: list[str], cancelled: tuple[str, ...] = ()) -> slurm.CellRecord:
    return slurm.CellRecord(
        [slurm.SlurmJob(j, stderr=f"/logs/{j}.err") for j in jobs], list(cancelled)
    )


def test_every_state_of_a_cell(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "ended_state", lambda job: "TIMEOUT")
    ex = _executor(tmp_path, 1)
    cell = SimpleNamespace(name="c")
    assert ex._status(cell, _record([]), {})[0] == "missing"
    assert ex._status(cell, _record(["7"]), {"7": "PENDING"})[0] == "queued"
    assert ex._status(cell, _record(["7"]), {"7": "REQUEUED"})[0] == "queued"
    assert ex._status(cell, _record(["7"]), {"7": "RUNNING"})[0] == "running"
    assert ex._status(cell, _record(["7"]), {})[0] == "missing"  # ended unfinished: again
    state, where = ex._status(cell, _record(["5", "6", "7"]), {})
    assert state == "failed (3 jobs, the last TIMEOUT)" and "/logs/7.err" in where
    # a job the stop cancelled is no failure
    assert ex._status(cell, _record(["5", "6", "7"], ("6",)), {})[0] == "missing"


def test_a_damaged_record_is_refused(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a Slurm cell record"):
        slurm.CellRecord.read(path)


class FakeQueue:
    """Stands in for the controller's answers (squeue, scancel) and for the cells' folders: a
    one-node cluster that runs the oldest queued job and finishes it at the next look."""

    def __init__(self) -> None:
        self.state: dict[str, str] = {}  # job id -> PENDING/RUNNING
        self.cell_of: dict[str, str] = {}
        self.done: set[str] = set()
        self.waves: list[list[str]] = []
        self.cancelled: list[str] = []
        self.most_in_flight = 0

    def job_states(self, name: str) -> dict[str, str]:
        for job, st in list(self.state.items()):  # one node: one job at a time, in order
            if st == "RUNNING":
                self.done.add(self.cell_of[job])
                del self.state[job]
        if self.state and "RUNNING" not in self.state.values():
            self.state[next(iter(self.state))] = "RUNNING"
        return dict(self.state)

    def submit(self, wave, runs, cells_dir):
        self.waves.append([c.name for c in wave])
        shown = []
        for cell in wave:
            job = str(100 + len(self.cell_of))
            self.state[job], self.cell_of[job] = "PENDING", cell.name
            path = cells_dir / f"{cell.name}.json"
            record = slurm.CellRecord.read(path)
            record.jobs.append(slurm.SlurmJob(job, stderr="-"))
            record.write(path)
            shown.append(job)
        self.most_in_flight = max(self.most_in_flight, len(self.state))
        return shown

    def scancel(self, cmd):
        self.cancelled.append(cmd[1])
        self.state.pop(cmd[1], None)


def _grid_run(tmp_path, monkeypatch, jobs: int, decided_after: int | None):
    q = FakeQueue()
    monkeypatch.setattr(slurm, "job_states", q.job_states)
    monkeypatch.setattr(slurm.SlurmExecutor, "_submit", q.submit)
    monkeypatch.setattr(slurm, "_run", q.scancel)
    monkeypatch.setattr(
        slurm, "cell_state",
        lambda cell, run_dir, settings: ("cached", cell.name) if cell.name in q.done
        else ("train", None),
    )  # fmt: skip
    cells = [SimpleNamespace(name=f"{a}-s{s}", seed=s) for s in range(3) for a in ("u", "t")]
    finished: list[str] = []
    stop = SimpleNamespace(requested=False)

    def wants(cell) -> bool:  # the sequential stop: decided once seed 0..n-1 are all done
        seeds_done = {c.seed for c in cells if c.name in finished}
        if decided_after is not None and set(range(decided_after)) <= seeds_done:
            return cell.seed < decided_after
        return True

    ex = _executor(tmp_path, jobs)
    ex.run(cells, tmp_path / "runs", None, lambda c, r, s: finished.append(c.name), stop, wants)
    return q, finished


def test_waves_go_out_in_seed_order_within_the_slots(tmp_path, monkeypatch):
    q, finished = _grid_run(tmp_path, monkeypatch, jobs=2, decided_after=None)
    # the first wave fills the slots; then each freed slot takes the next cell, in seed order
    assert q.waves[0] == ["u-s0", "t-s0"]
    assert [c for w in q.waves for c in w] == [f"{a}-s{s}" for s in range(3) for a in "ut"]
    assert q.most_in_flight <= 2
    assert sorted(finished) == sorted(f"{a}-s{s}" for s in range(3) for a in "ut")


def test_a_decided_comparison_cancels_its_queued_cells(tmp_path, monkeypatch):
    """Seeds 0 and 1 go out in one wave of 4 slots; seed 0 finishes first and decides: seed 1's
    cells, still queued, are cancelled (recorded as such, not as failures) and nothing more is
    submitted."""
    q, finished = _grid_run(tmp_path, monkeypatch, jobs=4, decided_after=1)
    assert q.waves[0] == ["u-s0", "t-s0", "u-s1", "t-s1"]
    assert len(q.waves) == 1  # seed 2 never goes out
    assert set(finished) >= {"u-s0", "t-s0"}
    cancelled = {q.cell_of[j] for j in q.cancelled}
    assert cancelled == {"u-s1", "t-s1"} - set(finished) and cancelled
    for name in cancelled:
        record = slurm.CellRecord.read(tmp_path / "slurm" / "cells" / f"{name}.json")
        assert record.cancelled == [record.jobs[-1].id]


def _executor_fields() -> list:
    import dataclasses

    return [
        f
        for f in dataclasses.fields(CompareOptions)
        if f.name.startswith("slurm_") or f.name == "wait"
    ]


def _non_default(f) -> object:
    """A value other than the field's default, of its kind."""
    if f.default is False:
        return True
    if f.type in ("int", "int | None") or isinstance(f.default, int):
        return 2
    return "x"


def test_every_slurm_option_is_enumerated():
    names = {f.name for f in _executor_fields()}
    assert {"wait", "slurm_partition", "slurm_account", "slurm_time", "slurm_extra"} <= names


@pytest.mark.parametrize("field", _executor_fields(), ids=lambda f: f.name)
def test_slurm_options_refused_with_the_local_executor(field, tmp_path):
    """Every --slurm-* option (and --wait) given without --executor slurm is refused by name,
    before anything is created, instead of being silently ignored."""
    from taperlm.compare.comparison import check_options
    from taperlm.compare.options import FLAG_KEY

    out = tmp_path / "cmp"
    opts = CompareOptions(out=out, **{field.name: _non_default(field)})
    with pytest.raises(ConfigError, match=rf"{field.metadata[FLAG_KEY]}.*--executor slurm"):
        check_options(opts)
    assert not out.exists()

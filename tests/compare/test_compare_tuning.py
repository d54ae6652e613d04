"""`taperlm compare --tune-lr`: the tuning seeds are disjoint from the reported ones, each
allocation's chosen lr is recorded and used, the report shows both differences, the lr grid and
its options are checked, and a rerun trains nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import raises_naming
from taperlm.compare import report, tuning
from taperlm.compare.options import CompareOptions, parse_lr_grid
from taperlm.errors import ConfigError
from test_compare import ALLOCS, TINY, _cli, data_dir  # noqa: F401 (fixture)

GRID = ["--tune-lr", "--lr-grid", "0.0005,0.02", "--tune-seeds", "1"]


@pytest.fixture(scope="module")
def tuned(data_dir, tmp_path_factory) -> tuple[Path, dict, str]:  # noqa: F811
    out = tmp_path_factory.mktemp("tune") / "out"
    args = ["compare", *TINY, *ALLOCS, *GRID, "--seeds", "2", "--data", str(data_dir)]
    rc, _, err = _cli([*args, "--out", str(out)])
    assert rc == 0, err
    return out, json.loads((out / "report.json").read_text()), err


def test_tuning_seeds_are_disjoint_from_the_reported_ones(tuned):
    out, rep, _ = tuned
    t = rep["lr_tuning"]
    assert not set(t["tuning_seeds"]) & set(t["reported_seeds"])
    # measured on the runs themselves: every run's training seed (init and data order) and data
    # order fingerprint, tuning runs against reported runs
    runs = {p.name: json.loads((p / "result.json").read_text()) for p in (out / "runs").iterdir()}
    tune_runs = [r for n, r in runs.items() if r["seed"] in t["tuning_seeds"]]
    reported = [r for n, r in runs.items() if r["seed"] in t["reported_seeds"]]
    assert len(tune_runs) == 2 * 2 and len(reported) >= 4
    assert {r["config"]["train"]["seed"] for r in tune_runs}.isdisjoint(
        {r["config"]["train"]["seed"] for r in reported}
    )
    assert {r["data_order"]["sha256"] for r in tune_runs}.isdisjoint(
        {r["data_order"]["sha256"] for r in reported}
    )
    # the choice reads tuning runs only: each curve point is over the tuning seeds
    for c in t["curves"].values():
        for p in c["curve"]:
            assert set(map(int, p["per_seed"])) == set(t["tuning_seeds"])


def test_chosen_lr_is_the_curves_minimum_and_is_used(tuned):
    out, rep, _ = tuned
    t = rep["lr_tuning"]
    assert set(t["chosen_lr"]) == {"uniform", "late"}
    for name, c in t["curves"].items():
        best = min(c["curve"], key=lambda p: p["mean"])
        assert c["chosen_lr"] == best["lr"] == t["chosen_lr"][name]
        assert c["at_edge"]  # a two-lr grid: every choice is at an edge
    for row in t["tuned"]:
        assert row["lr_used"] == [t["chosen_lr"][row["name"]]]
        for seed in t["reported_seeds"]:
            r = json.loads((out / "runs" / f"{row['runs']}-s{seed}" / "result.json").read_text())
            assert r["config"]["train"]["lr"] == t["chosen_lr"][row["name"]]
            assert row["tuned_per_seed"][str(seed)] == r["val"]["loss"]
    # the shared-lr table is still at the recipe's lr
    assert rep["meta"]["settings"]["lr"] == t["recipe_lr"]
    shared = {a["name"]: a for a in rep["allocations"]}
    for row in t["tuned"]:
        assert row["shared_loss"] == shared[row["name"]]["val_loss"]


def test_report_shows_curves_both_differences_and_cost(tuned):
    out, rep, _ = tuned
    md = (out / "report.md").read_text()
    assert "## Learning rate tuning" in md
    assert "Δ loss vs uniform, own lrs" in md and "Extra cost of tuning" in md
    assert (out / report.LR_PLOT).is_file() and report.LR_PLOT in md
    late = next(r for r in rep["lr_tuning"]["tuned"] if r["name"] == "late")
    assert late["tuned_diff"]["n"] == 2 and late["shared_diff"]["n"] == 2
    cost = rep["lr_tuning"]["cost"]
    assert cost["tuning_cells"] == 4 and cost["factor"] > 1.0
    assert "--tune-lr --lr-grid 0.0005,0.02 --tune-seeds 1" in rep["meta"]["command"]
    # both reported stages add seeds under --stop (the default, decided), each on its own
    # question: at a cap of 2 seeds (the sequence is unbounded there) both run to the cap
    assert rep["stopping"]["reason"] == rep["lr_tuning"]["tuned_stopping"]["reason"] == "cap"
    assert rep["lr_tuning"]["tuned_stopping"]["cap"] == 2
    assert "The own-lr comparison ran all 2 seeds" in md and "## When it stopped" in md


def test_rerun_trains_nothing(tuned, data_dir):  # noqa: F811
    out, rep, _ = tuned
    args = ["compare", *TINY, *ALLOCS, *GRID, "--seeds", "2", "--data", str(data_dir)]
    rc, _, err = _cli([*args, "--out", str(out)])
    assert rc == 0, err
    assert ": trained" not in err and ": resumed" not in err
    again = json.loads((out / "report.json").read_text())
    assert again["lr_tuning"]["chosen_lr"] == rep["lr_tuning"]["chosen_lr"]
    assert again["lr_tuning"]["tuned"] == rep["lr_tuning"]["tuned"]


def test_uniform_scope_trains_every_allocation_at_uniforms_lr(data_dir, tmp_path):  # noqa: F811
    args = ["compare", *TINY, *ALLOCS, *GRID, "--tune-lr-scope", "uniform", "--seeds", "1"]
    rc, _, err = _cli([*args, "--data", str(data_dir), "--out", str(tmp_path / "o")])
    assert rc == 0, err
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    lr = rep["lr_tuning"]["chosen_lr"]["uniform"]
    assert set(rep["lr_tuning"]["curves"]) == {"uniform"}
    runs = [
        json.loads((tmp_path / "o" / "runs" / n / "result.json").read_text()) for n in rep["runs"]
    ]
    assert len(runs) == 2 and {r["config"]["train"]["lr"] for r in runs} == {lr}
    assert rep["meta"]["settings"]["lr"] == lr


def test_lr_grid_parsing_and_default():
    """--lr-grid is parsed once, with the options (sorted, checked); the tuning reads the lrs."""
    assert parse_lr_grid("4e-3, 1e-3,2e-3") == (1e-3, 2e-3, 4e-3)
    assert tuning.lr_grid(parse_lr_grid("4e-3, 1e-3,2e-3"), 1.0) == [1e-3, 2e-3, 4e-3]
    assert parse_lr_grid(" ") is None and tuning.lr_grid(None, 2e-3) == [1e-3, 2e-3, 4e-3, 8e-3]
    for bad, named in [("1e-3", ("--lr-grid", "two")), ("1e-3,x", ("--lr-grid", "'x'")),
                       ("0,1", ("--lr-grid", "> 0")), ("1e-3,1e-3", ("--lr-grid", "1e-3", "twice")),
                       (",", ("--lr-grid", "two"))]:  # fmt: skip
        with raises_naming(ConfigError, *named):
            parse_lr_grid(bad)
        with raises_naming(ConfigError, *named):  # when the options are made, before any work
            CompareOptions(out=Path("x"), tune_lr=True, lr_grid=bad)


def test_tuning_seeds_never_overlap():
    assert tuning.tuning_seeds(3, list(range(15))) == [10_000, 10_001, 10_002]
    with raises_naming(ConfigError, "10000", "overlap"):
        tuning.tuning_seeds(2, list(range(10_001)))


@pytest.mark.parametrize(
    "extra,msg",
    [
        (["--lr-grid", "1e-3,2e-3"], "--tune-lr"),
        (["--tune-seeds", "2"], "--tune-lr"),
        (["--tune-lr", "--lr-grid", "1e-3"], "at least two"),
        (["--tune-lr", "--tapers", "uniform;novelty:pilot"], "--tune-lr-scope uniform"),
    ],
)
def test_bad_tuning_options_fail_before_any_work(extra, msg, tmp_path):
    rc, _, err = _cli(["compare", *TINY, *extra, "--out", str(tmp_path / "o")])
    assert rc != 0 and msg in err
    assert not (tmp_path / "o" / "runs").exists()


def test_robustness_summary_reads_the_reports_numbers(tuned, tmp_path, capsys):
    """benchmarks/robustness.py (docs/compare.md's robustness table) takes every number from
    the reports: a --tune-lr report gives a shared-lr and an own-lr row per tapered allocation."""
    import sys

    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        import robustness
    finally:
        sys.path.remove(str(bench))
    out, rep, _ = tuned
    rc = robustness.main(
        ["--report", f"tiny={out}", "--report", f"absent={tmp_path / 'none'}",
         "--plot", str(tmp_path / "r.png"), "--json", str(tmp_path / "r.json")]
    )  # fmt: skip
    assert rc == 0 and (tmp_path / "r.png").stat().st_size > 0
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    tapered = [a for a in rep["allocations"] if a.get("diff_vs_uniform")]
    assert len(rows) == 2 * len(tapered)
    tuned_by_name = {t["name"]: t for t in rep["lr_tuning"]["tuned"]}
    for alloc, shared, own in zip(tapered, rows[::2], rows[1::2]):
        assert shared["mean"] == alloc["diff_vs_uniform"]["val_loss"]["mean"]
        assert shared["ci"] == alloc["diff_vs_uniform"]["val_loss"]["ci"]
        assert own["mean"] == tuned_by_name[alloc["name"]]["tuned_diff"]["mean"]
        assert "(own)" in own["lr"] and "(shared)" in shared["lr"]
    shown = capsys.readouterr()
    assert "no report at" in shown.err and f"{rows[0]['mean']:+.4f}" in shown.out

"""`taperlm compare --paper scaling`: the best-ratio fit recovers a known optimum from synthetic
losses (and says when the optimum is beyond the sweep), and the mode runs end to end at a toy
scale: every point a tuned comparison, the report and figure written, a rerun trains nothing."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest

from conftest import raises_naming
from taperlm.analysis.stats import PairedDifference
from taperlm.compare import grid, scaling
from taperlm.compare.options import CompareOptions
from taperlm.errors import ConfigError
from test_compare import TINY, _cli, data_dir  # noqa: F401 (fixture)

STARTS = [1.0, 1.25, 1.5, 1.75, 1.9]


def _synthetic(best: float, seeds: int, noise: float, seed: int = 0) -> dict:
    rng = random.Random(seed)
    out = {}
    for s in range(seeds):
        offset = rng.gauss(0, 0.1)  # a per-seed level shared by its allocations (pairing)
        out[s] = {r: 5.0 + offset + 0.2 * (r - best) ** 2 + rng.gauss(0, noise) for r in STARTS}
    return out


@pytest.mark.parametrize("best", [1.3, 1.5, 1.7])
def test_fit_recovers_a_known_optimum(best):
    fit = scaling.fit_best_ratio(_synthetic(best, seeds=8, noise=0.002))
    assert fit.best == pytest.approx(best, abs=0.03)
    lo, hi = fit.ci
    assert lo - 0.02 <= best <= hi + 0.02 and hi - lo < 0.2  # a 95% interval may just miss
    assert fit.at_upper_edge == 0.0
    vertex, _, used = scaling.local_parabola(np.array(fit.starts), np.array(fit.mean_loss))
    # The vertex comes from a LAPACK solve (np.polyfit): its last bits may differ with the CPU
    # and the BLAS build, so it is the fit's best to 1e-9, not bit for bit.
    assert vertex == pytest.approx(fit.best, rel=1e-9, abs=1e-12)
    assert tuple(used) == fit.parabola.starts
    nearest = min(STARTS, key=lambda r: abs(r - best))  # the swept ratio nearest the optimum
    assert fit.lowest == nearest and fit.lowest_share[f"{nearest:g}"] > 0.9
    assert sum(fit.lowest_share.values()) == pytest.approx(1.0)


def test_a_fall_then_a_plateau_puts_the_best_inside_not_at_the_edge():
    """Losses that fall steeply to 1.75 and stay flat to 1.9 (what micro and tiny measure): a
    quadratic through all five ratios has its minimum at the edge (1.9) in every resample; the
    local parabola puts the best between 1.75 and 1.9, and the measured lowest loss is shared
    between the two across resamples."""
    rng = random.Random(3)
    level = {1.0: 0.0, 1.25: -0.05, 1.5: -0.09, 1.75: -0.17, 1.9: -0.17}
    data = {s: {r: 5.0 + v + rng.gauss(0, 0.01) for r, v in level.items()} for s in range(6)}
    x = np.array(STARTS)
    means = np.array([np.mean([data[s][r] for s in data]) for r in STARTS])
    dense = np.linspace(1.0, 1.9, 1001)
    assert dense[np.argmin(np.polyval(np.polyfit(x, means, 2), dense))] == pytest.approx(1.9)
    fit = scaling.fit_best_ratio(data)
    assert 1.75 < fit.best < 1.9 and fit.at_upper_edge < 0.5
    assert fit.parabola.starts == (1.5, 1.75, 1.9)
    share = fit.lowest_share
    assert 0.15 < share["1.75"] < 0.85 and share["1.75"] + share["1.9"] == pytest.approx(1.0)
    shown = scaling._lowest(fit)
    assert "1.75 (" in shown and "1.9 (" in shown


def test_fit_interval_widens_with_noise_and_flags_an_optimum_beyond_the_sweep():
    tight = scaling.fit_best_ratio(_synthetic(1.5, seeds=8, noise=0.002))
    loose = scaling.fit_best_ratio(_synthetic(1.5, seeds=8, noise=0.02))
    assert loose.ci[1] - loose.ci[0] > tight.ci[1] - tight.ci[0]
    beyond = scaling.fit_best_ratio(_synthetic(2.5, seeds=6, noise=0.002))
    assert beyond.best == pytest.approx(1.9) and beyond.at_upper_edge > 0.9


def _losses(best: float, starts: list[float], seeds: int = 6) -> dict:
    rng = random.Random(1)
    return {
        s: {r: 5.0 + 0.2 * (r - best) ** 2 + rng.gauss(0, 0.002) for r in starts}
        for s in range(seeds)
    }


def test_fit_flags_an_optimum_below_the_sweep_at_its_lower_edge():
    """Losses lowest at uniform and rising with every taper (what nano measures at 8 tokens
    per parameter): the best clips to 1.0 in nearly every resample, reported as
    `at_lower_edge` (the upper edge stays 0); with inverse tapers swept an optimum at 0.8 is
    inside (no edge), and one below 0.5 sits at the new lower edge, 0.5."""
    at_uniform = scaling.fit_best_ratio(_losses(0.6, STARTS))
    assert at_uniform.best == pytest.approx(1.0) and at_uniform.at_lower_edge > 0.9
    assert at_uniform.at_upper_edge == 0.0 and at_uniform.lowest == 1.0
    inverse = [0.5, 0.75, *STARTS]
    inside = scaling.fit_best_ratio(_losses(0.8, inverse))
    assert inside.best == pytest.approx(0.8, abs=0.03)
    assert inside.at_lower_edge == 0.0 and inside.at_upper_edge == 0.0
    below = scaling.fit_best_ratio(_losses(0.2, inverse))
    assert below.best == pytest.approx(0.5) and below.at_lower_edge > 0.9
    inside_up = scaling.fit_best_ratio(_synthetic(1.5, seeds=8, noise=0.002))
    assert inside_up.at_lower_edge == 0.0


def test_points_table_shows_the_lower_edge_when_the_fit_reports_it():
    """A fit with `at_lower_edge` gets its own column; a report written before it existed keeps
    its table (the docs copy of the scaling sweep's table is such a report's)."""
    row = _row(scaling.fit_best_ratio(_losses(0.6, STARTS)))
    head, _, line = scaling.points_table([row])
    assert "resamples at the lowest start" in head
    assert f"| {100 * row.fit.at_lower_edge:.0f}% |" in line and "| 0% |" in line
    written = row.to_json()
    del written["fit"]["at_lower_edge"]  # as a report written before it existed holds it
    old = scaling.ScalingPoint.from_json(written)
    assert "lowest start" not in scaling.points_table([old])[0]


def _row(fit: scaling.BestRatioFit) -> scaling.ScalingPoint:
    return scaling.ScalingPoint(
        point="p", size="toy", preset="transformer-tiny", params=1000, tokens=2000,
        tokens_per_param=2.0, lr=4e-3, lr_at_edge=False, diffs={"uniform": None}, fit=fit,
        wall_s=1.0, run_s=2.0, report="p/report.md",
    )  # fmt: skip


def test_scaling_records_read_back_as_written():
    """A point and its fit read back equal (from_json(to_json(x)) == x) in every shape the fit
    takes: resampled, one seed (no interval), no complete seed (no parabola); and every point
    of the committed scaling report reads back to the object it holds, keys it predates
    (`at_lower_edge`) read as None; so does its meta (its mode, which it predates, as scaling)."""
    resampled = scaling.fit_best_ratio(_synthetic(1.5, seeds=4, noise=0.002))
    one_seed = scaling.fit_best_ratio(_synthetic(1.5, seeds=1, noise=0.002))
    none = scaling.fit_best_ratio({0: {1.0: 5.0, 1.5: 4.9}, 1: {1.9: 4.8}})
    assert one_seed.ci is None and one_seed.parabola is not None
    assert none.best is None and none.parabola is None and none.n_seeds == 0
    for fit in (resampled, one_seed, none):
        assert scaling.BestRatioFit.from_json(fit.to_json()) == fit
        text = json.dumps(fit.to_json())
        assert scaling.BestRatioFit.from_json(json.loads(text)) == fit
    assert "mean_loss" not in none.to_json() and "parabola" not in none.to_json()
    assert scaling.Parabola.from_json(resampled.parabola.to_json()) == resampled.parabola
    diff = PairedDifference((0, 1), (-0.1, -0.2), 2, -0.15, 0.07, 0.95, 12.7, (-1.0, 0.7), False)
    point = dataclasses.replace(_row(resampled), diffs={"uniform": None, "cosine:1.5:0.5": diff})
    assert scaling.ScalingPoint.from_json(json.loads(json.dumps(point.to_json()))) == point
    root = Path(__file__).resolve().parents[2]
    data = json.loads((root / "benchmarks/results/scaling_report.json").read_text())
    meta = scaling.ScalingMeta.from_json(data["meta"])
    assert scaling.ScalingMeta.from_json(meta.to_json()) == meta
    written = {**meta.to_json(), "paper_point": grid.PAPER_POINT.to_json(), "plot": "scaling.png"}
    assert "mode" not in data["meta"]  # written before the modes: --paper scaling's
    assert written == {**data["meta"], "mode": "scaling"}
    for p in data["points"]:
        read = scaling.ScalingPoint.from_json(p)
        assert read.fit.at_lower_edge is None and "at_lower_edge" not in p["fit"]
        assert read.to_json() == {**p, "fit": {**p["fit"], "at_lower_edge": None}}
        assert scaling.ScalingPoint.from_json(read.to_json()) == read


def test_a_sweep_below_uniform_is_ordered_by_start():
    """Inverse tapers sort below uniform's 1.0 in the --tapers list (`--stop-on best` weighs the
    best against its list neighbours) and START = 1 is refused (uniform is always swept)."""
    assert scaling.tapers((0.5, 0.75, 1.5)) == (
        "cosine:0.5:1.5;cosine:0.75:1.25;uniform;cosine:1.5:0.5"
    )
    assert scaling.tapers((1.5, 1.9)).startswith("uniform;")
    assert scaling.sweep_taper(0.5) == "cosine:0.5:1.5" and scaling.sweep_taper(1.0) == "uniform"
    for starts in ((1.0, 1.5), (-0.5, 1.5), (1.5, 2.5)):
        plan = scaling.ScalingPlan(sizes=TOY.sizes, tokens=[128], starts=starts)
        with pytest.raises(ConfigError, match="other than 1"):
            scaling.point_options(CompareOptions(out=Path("x"), paper="scaling"), plan)


def test_fit_ignores_incomplete_seeds_and_needs_three_ratios():
    data = _synthetic(1.5, seeds=4, noise=0.002)
    data[9] = {1.0: 1.0}  # a seed still running: left out, not a crash
    assert scaling.fit_best_ratio(data).n_seeds == 4
    with pytest.raises(ValueError, match="3 ratios"):
        scaling.fit_best_ratio({0: {1.0: 5.0, 1.5: 4.9}})


TOY = scaling.ScalingPlan(
    sizes=[
        scaling.ScalingSize("a", "transformer-tiny", ("model.d_model=32", "model.mlp_width=160")),
        scaling.ScalingSize("b", "transformer-tiny", ("model.d_model=64", "model.mlp_width=160")),
    ],
    tokens=[128, 192],
    starts=(1.5, 1.9),
)
# TINY without --tokens and --preset (the plan sets the token budgets and sizes)
TOY_ARGS = [
    a
    for i, a in enumerate(TINY)
    if a not in ("--tokens", "--preset") and TINY[i - 1] not in ("--tokens", "--preset")
]


def _toy_opts(out: Path, data: Path) -> CompareOptions:
    from taperlm.cli import build_parser

    args = build_parser().parse_args(
        [
            "compare",
            *TOY_ARGS,
            "--paper",
            "scaling",
            "--seeds",
            "2",
            "--lr-grid",
            "2e-3,8e-3",
            "--tune-seeds",
            "1",
            "--data",
            str(data),
            "--out",
            str(out),
        ]
    )
    return CompareOptions(**{f: getattr(args, f) for f in CompareOptions.__dataclass_fields__})


@pytest.mark.slow  # ~20 s of CPU: 4 points x 8 toy runs
def test_scaling_mode_end_to_end_at_toy_scale(data_dir, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "sc"
    md, js = scaling.run_scaling(_toy_opts(out, data_dir), TOY)
    rep = json.loads(js.read_text())
    assert [p["point"] for p in rep["points"]] == ["a-128", "a-192", "b-128", "b-192"]
    assert rep["points"][2]["params"] > rep["points"][0]["params"]
    for p in rep["points"]:
        sub = json.loads((out / p["point"] / "report.json").read_text())
        assert sub["lr_tuning"]["scope"] == "uniform"
        assert sub["stopping"]["stop_on"] == "best"  # each point stops on its own question
        assert p["lr"] == sub["lr_tuning"]["chosen_lr"]["uniform"] == sub["meta"]["settings"]["lr"]
        assert sub["meta"]["settings"]["tokens"] == p["tokens"]
        assert p["fit"]["n_seeds"] == 2 and 1.0 <= p["fit"]["best"] <= 1.9
        assert p["run_s"] > 0  # the runs' own time: kept by the rerun below (wall_s is not)
        assert set(p["diffs"]) == {"uniform", "cosine:1.5:0.5", "cosine:1.9:0.1"}
    assert (out / scaling.SCALING_PLOT).is_file()
    text = md.read_text()
    assert "best start ratio" in text and "--paper scaling" in text
    # a rerun trains nothing and reports the same
    capsys.readouterr()
    scaling.run_scaling(_toy_opts(out, data_dir), TOY)
    assert ": trained" not in capsys.readouterr().err

    def numbers(points):
        return [{k: v for k, v in p.items() if k != "wall_s"} for p in points]

    assert numbers(json.loads(js.read_text())["points"]) == numbers(rep["points"])


@pytest.mark.parametrize(
    "extra,msg",
    [
        (["--tapers", "uniform;cosine"], "not both"),
        (["--tokens", "1000"], "--tokens"),
        (["--tune-lr-scope", "each"], "scope uniform"),
        (["--preset", "transformer-tiny"], "--preset"),
    ],
)
def test_scaling_mode_refuses_what_it_sets_itself(extra, msg, tmp_path):
    rc, _, err = _cli(["compare", "--paper", "scaling", *extra, "--out", str(tmp_path / "o")])
    assert rc != 0 and msg in err
    assert not (tmp_path / "o").exists()


def test_default_plan_meets_the_brief():
    plan = scaling.DEFAULT_PLAN
    assert len(plan.sizes) >= 3 and len(plan.tokens) >= 2
    assert len(plan.starts) >= 4 and max(plan.starts) >= 1.9
    with pytest.raises(ConfigError):
        scaling.point_options(CompareOptions(out=Path("x"), paper="scaling", tokens=5), plan)
    # every point of the default sweep is a valid comparison (checked without training)
    from taperlm.compare.comparison import check_options

    points = scaling.point_options(CompareOptions(out=Path("x"), paper="scaling"), plan)
    params = []
    for *_, sub in points:
        allocs, base = check_options(sub)
        assert len(allocs) == 5 and base.train.tokens == sub.tokens
        from taperlm.config.budget import total_params

        base.model.vocab_size = 2048  # the default corpus's tokenizer (bpe:2048) sets it
        params.append(total_params(base.model))
    assert max(params) / min(params) >= 4, params


def test_paper_sizes_plan():
    """--preset-size 440m,760m,1.3b: the paper's sizes, each at half and all of its tokens, with
    the paper's recipe (checked without training)."""
    from taperlm.compare.comparison import check_options

    opts = CompareOptions(out=Path("x"), paper="scaling", preset_size="440m,760m,1.3b")
    points = scaling.point_options(opts, scaling.plan_for(opts))
    assert [(p[1].name, p[2]) for p in points] == [
        ("440m", 15_000_000_000),
        ("440m", 30_000_000_000),
        ("760m", 25_000_000_000),
        ("760m", 50_000_000_000),
        ("1.3b", 50_000_000_000),
        ("1.3b", 100_000_000_000),
    ]
    command = scaling.study_command(opts, points[0][3])
    assert "--preset-size 440m,760m,1.3b" in command and "--lr-grid" not in command  # own lrs
    _, base = check_options(points[0][3])
    assert base.train.seq_len == 4096 and 0 <= base.train.tokens - 15_000_000_000 < 524_288
    with raises_naming(ConfigError, "--preset-size", "'huge'", "440m"):
        scaling.plan_for(CompareOptions(out=Path("x"), paper="scaling", preset_size="huge"))


# Every compare mode owns its --out folder from the first file it writes, so a run stopped before
# its first report (Ctrl-C in the first cell, a killed session) resumes instead of being refused
# as "not a taperlm compare folder" -- what happened to a scaling sweep stopped in its first point.
INTERRUPTED_MODES = {
    "controlled": TINY,
    "families": ["--paper", "families", "--families", "transformer", *TINY[2:]],
    "scaling": ["--paper", "scaling", *TOY_ARGS, "--lr-grid", "2e-3,8e-3", "--tune-seeds", "1"],
}


@pytest.mark.parametrize("mode", sorted(INTERRUPTED_MODES))
def test_a_compare_stopped_in_its_first_cell_resumes(mode, data_dir, tmp_path, monkeypatch):  # noqa: F811
    from taperlm.compare import cell
    from taperlm.files.outdirs import check_folder, kind_of

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cell, "run_one", stop)  # the one per-cell seam of every executor
    monkeypatch.setattr(scaling, "DEFAULT_PLAN", TOY)  # the CLI's sweep, at toy sizes
    out = tmp_path / "o"
    args = ["compare", *INTERRUPTED_MODES[mode], "--seeds", "1", "--data", str(data_dir)]
    if mode != "scaling":
        args += ["--tokens", "128"]
    rc, _, err = _cli([*args, "--out", str(out), "--jobs", "1"])
    assert rc == 130, err  # stopped, as by Ctrl-C
    assert kind_of(out) == "compare"  # the folder says whose it is ...
    check_folder(out, "compare", "--out")  # ... so the rerun's check lets it through
    rc, _, err = _cli([*args, "--out", str(out), "--jobs", "1"])
    assert rc == 130 and "not empty" not in err, err  # the rerun went back to work

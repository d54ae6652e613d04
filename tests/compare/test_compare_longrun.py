"""`taperlm compare --paper tokens` and `--paper ratios`: the plans meet the issue's brief (budgets
in tokens per parameter, the ratio sweep past 1.9 -> 0.1 with distinct widths and below uniform),
every point is a valid comparison, the trend fits recover known trends from synthetic points and
say when they cannot extrapolate (a best ratio at either edge of the sweep is a bound), the report
pieces are written, and a toy sweep with a zero-width ratio runs end to end."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
from pathlib import Path

import pytest

from taperlm.analysis.stats import PairedDifference
from taperlm.compare import grid as compare_grid
from taperlm.compare import longrun
from taperlm.compare.comparison import check_options
from taperlm.compare.options import CompareOptions, declared_options
from taperlm.compare.scaling import BestRatioFit, ScalingMeta, ScalingPoint, ScalingReport
from taperlm.errors import ConfigError
from taperlm.spec.taper import TaperSpec
from test_compare import data_dir  # noqa: F401 (fixture)
from test_compare_scaling import TOY_ARGS


def test_token_axis_plan_meets_the_brief():
    """nano: budgets spanning >= 2 orders of magnitude up to >= 68 tokens per parameter; micro
    up to >= 10; every budget within one batch of its tokens per parameter, at the parameters
    of the size's own corpus vocabulary (nano 512, micro 2048)."""
    from taperlm.config.budget import total_params
    from taperlm.config.presets import get_preset

    plan = longrun.plan_of("tokens")
    sizes = {s.name: s for s in plan.sizes}
    assert set(sizes) == {"nano", "micro"}
    for name, vocab, lo_span, top in (("nano", 512, 100, 68), ("micro", 2048, 19.9, 10)):
        cfg = get_preset(sizes[name].preset, resolve=False)
        cfg.vocab_size = vocab
        params = total_params(cfg.resolve())
        tpp = [t / params for t in sizes[name].tokens]
        assert max(tpp) >= top - 0.01 and max(tpp) / min(tpp) >= lo_span
        for t, want in zip(sizes[name].tokens, longrun.TOKENS_PER_PARAM[name]):
            assert abs(t - want * params) <= 512 and t % 1024 == 0
    assert 1.5 in plan.starts and len(plan.starts) >= 4
    assert plan.starts == (0.5, 0.75, 1.25, 1.5, 1.75, 1.9)
    assert longrun.budget_tokens("nano", 68) == sizes["nano"].tokens[-1]
    params = total_params(get_preset("transformer-nano", resolve=False).resolve())
    assert params == 266_816  # 0.27M at its 512-token vocabulary


def test_ratio_axis_goes_past_the_old_edge_with_distinct_widths():
    """1.95 -> 0.05 and 2.0 -> 0.0 (a zero last width) are swept; at nano's width step of 8 every
    swept ratio gives its own widths (at 16, 1.9 and 1.95 coincide)."""
    plan = longrun.plan_of("ratios")
    assert max(plan.starts) == 2.0 and 1.95 in plan.starts and 1.5 in plan.starts
    assert plan.starts == (0.5, 0.75, 1.25, 1.5, 1.75, 1.9, 1.95, 2.0)
    assert set(plan.starts) > set(longrun.plan_of("tokens").starts)  # contains the token axis's
    nano = next(s for s in plan.sizes if s.name == "nano")
    from taperlm.spec.solver import solve_sizes

    widths = {
        s: tuple(solve_sizes(TaperSpec.parse(f"cosine:{s}:{2 - s:g}", 8), 4, 176, zero_ok=True))
        for s in plan.starts
    }
    assert len(set(widths.values())) == len(plan.starts), widths
    assert widths[2.0][-1] == 0 and nano.multiple_of == 8
    coarse = [
        solve_sizes(TaperSpec.parse(f"cosine:{s}:{2 - s:g}", 16), 4, 176, zero_ok=True)
        for s in (1.9, 1.95)
    ]
    assert coarse[0] == coarse[1]  # why nano steps by 8


@pytest.mark.parametrize("mode", longrun.MODES)
def test_both_modes_sweep_below_uniform(mode):
    """Inverse tapers 0.75 -> 1.25 and 0.5 -> 1.5 (the best start sat at uniform, the old lower
    edge, at 8 tokens per parameter): at nano's step of 8 the widths grow with depth, mirror
    1.5 -> 0.5's and keep the budget; the points' --tapers list them by start, below uniform;
    the trend rows map a start below 1 to its allocation (not to uniform's 1.0)."""
    from taperlm.compare import scaling
    from taperlm.spec.solver import solve_sizes

    plan = longrun.plan_of(mode)
    assert {0.5, 0.75} <= set(plan.starts) and min(plan.starts) == 0.5
    assert solve_sizes(TaperSpec.parse("cosine:0.5:1.5", 8), 4, 176) == [88, 128, 224, 264]
    assert solve_sizes(TaperSpec.parse("cosine:0.75:1.25", 8), 4, 176) == [136, 152, 192, 224]
    nano = [p for p in scaling.point_options(CompareOptions(out=Path("x"), paper=mode), plan)
            if p[1].name == "nano"]  # fmt: skip
    assert nano
    for _key, _size, _tokens, sub in nano:
        allocs = sub.tapers  # the allocations, parsed once with the options
        assert [a.spec_string for a in allocs[:3]] == [
            "cosine:0.5:1.5",
            "cosine:0.75:1.25",
            "uniform",
        ]
        assert [a.start_ratio for a in allocs] == sorted(a.start_ratio for a in allocs)
        names = [a.name for a in allocs]
        assert "cosine-0.5-1.5" in names and "cosine-0.75-1.25" in names
    point = _point("nano", 266_816, 8, 0.02, 0.6, 0.0, 0.1, (0.5, 0.75, 1.0, 1.5))
    point = dataclasses.replace(
        point,
        fit=dataclasses.replace(point.fit, lowest=0.5),
        diffs={**point.diffs, "cosine:0.5:1.5": _diff(-0.01, -0.02, 0.0)},
    )
    (row,) = longrun.trend_rows([point])
    assert row.best_measured == "cosine:0.5:1.5" and row.diff_best.mean == -0.01


@pytest.mark.parametrize("mode", longrun.MODES)
def test_every_point_is_a_valid_comparison(mode):
    """Checked without training or data: the allocations, the tokens, nano's width step and
    bpe:512 corpus; the sizes can be chosen with --preset-size."""
    from taperlm.compare import scaling
    from taperlm.compare.comparison import corpus_tokenizer

    opts = CompareOptions(out=Path("x"), paper=mode)
    points = scaling.point_options(opts, longrun.plan_of(mode))
    assert len(points) == sum(len(v) for v in longrun.TOKENS_PER_PARAM.values()) or mode == "ratios"
    for _key, size, tokens, sub in points:
        allocs, base = check_options(sub)
        assert len(allocs) == 1 + len(longrun.plan_of(mode).starts)
        assert base.train.tokens == tokens
        assert sub.multiple_of == (8 if size.name == "nano" else None)
        assert corpus_tokenizer(sub) == ("bpe:512" if size.name == "nano" else "bpe:2048")
    only = longrun.plan_of(mode, ("micro",))
    assert [s.name for s in only.sizes] == ["micro"]
    with pytest.raises(ConfigError, match="nano, micro"):
        longrun.plan_of(mode, ("huge",))


def test_a_point_both_modes_sweep_trains_the_same_cells():
    """`--paper ratios` in a copy of a finished `--paper tokens` folder (or the reverse) reuses
    the kept cells instead of training them again: at every point both modes sweep, the two
    comparisons differ only in their allocation lists, so uniform's lr tuning is the same and
    every cell of an allocation both sweep has the same name and the same run config."""
    from taperlm.compare import scaling
    from taperlm.compare.grid import build_grid

    def points(mode):
        opts = CompareOptions(out=Path("x"), paper=mode)
        return {k: sub for k, _size, _t, sub in scaling.point_options(opts, longrun.plan_of(mode))}

    tokens, ratios = points("tokens"), points("ratios")
    shared = longrun.shared_points("ratios", "tokens")
    assert [f"{size}-{t}" for size, t, _ in shared] == [k for k in ratios if k in tokens]
    assert len(shared) == len(ratios)  # every ratios point is also a tokens point
    for size, t, starts in shared:
        key = f"{size}-{t}"
        a, b = tokens[key], ratios[key]
        differ = {f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)}
        assert differ == {"tapers"}, key
        cells, names = [], set()
        for sub in (a, b):
            allocs, base = check_options(sub)
            grid = build_grid(base, allocs, list(range(sub.seeds)), sub.paper)
            cells.append({c.name: c.config for c in grid.cells})
            names |= {x.name for x in allocs if x.start_ratio in starts}
        common = set(cells[0]) & set(cells[1])
        assert len(names) == len(starts)  # the shared starts; uniform is swept by every point
        assert common == {f"{n}-s{s}" for n in names | {"uniform"} for s in range(5)}, key
        for name in common:
            assert cells[0][name] == cells[1][name], (key, name)


def test_estimate_after_the_other_mode_counts_only_the_new_starts():
    """`ratios` after `tokens` trains, at each shared point, only 1.95 and 2.0 (no tuning):
    its estimate is that arithmetic, and the whole-mode estimate is unchanged without `after`."""
    new = 0.0
    for size, t, starts in longrun.shared_points("ratios", "tokens"):
        fresh = [s for s in longrun.plan_of("ratios").starts if s not in starts]
        assert fresh == [1.95, 2.0]
        new += len(fresh) * 5 * t / longrun.CELL_TOKENS_PER_S[size]
    after = longrun.estimated_hours("ratios", after="tokens")
    assert after == pytest.approx(new / 2 / 3600)
    assert after < longrun.estimated_hours("ratios") / 4
    assert longrun.estimated_hours("ratios", after="ratios") == longrun.estimated_hours("ratios")


@pytest.mark.parametrize("sizes", [("nano",), ("micro",), None])
def test_the_reports_command_runs_the_same_sizes(tmp_path, sizes):
    """The command report.json and trend.json give as "produced by" names --preset-size when one
    was given (it ran only those sizes: without it the command would run both), and parsed back
    it plans the same points."""
    import shlex

    from taperlm.cli import build_parser
    from taperlm.compare.options import options_from
    from taperlm.compare.study import StudyProgress

    for mode in longrun.MODES:
        out = tmp_path / f"{mode}-{sizes}"
        plan = longrun.longrun_plan(CompareOptions(out=out, paper=mode, preset_size=sizes))
        _, js = plan.report(StudyProgress(len(plan.parts)))
        command = json.loads(js.read_text())["meta"]["command"]
        assert json.loads((out / "trend.json").read_text())["meta"]["command"] == command
        assert ("--preset-size" in command) == (sizes is not None), command
        args = build_parser(only="compare").parse_args(shlex.split(command)[1:])
        again = longrun.longrun_plan(options_from(args))
        assert [p.key for p in again.parts] == [p.key for p in plan.parts]


def test_help_states_each_modes_estimated_time():
    """The --paper help's hours are estimated_hours' (from the measured per-run speed)."""
    text = next(f for f in declared_options() if f.name == "paper").metadata["argparse"]["help"]
    for mode in longrun.MODES:
        stated = re.search(rf"{mode} = .*?estimated ~(\d+) h", text)
        assert stated, text
        assert int(stated.group(1)) == round(longrun.estimated_hours(mode))
    after = re.search(r"ratios = .*?; ~(\d+) h after tokens, in a copy of its finished --out", text)
    assert after, text
    assert int(after.group(1)) == round(longrun.estimated_hours("ratios", after="tokens"))


def test_fit_trend_recovers_a_known_slope_and_prediction():
    rng = random.Random(0)
    xs = [(math.log10(t),) for t in (0.5, 2, 8, 32, 68)]
    ys = [-0.08 + 0.05 * x[0] + rng.gauss(0, 0.002) for x in xs]
    fit = longrun.fit_trend(xs, ys, [0.004] * 5, (math.log10(68),))
    assert fit.coefficients[1] == pytest.approx(0.05, abs=0.01)
    lo, hi = fit.coefficient_ci[1]
    assert lo < 0.05 < hi and hi - lo < 0.03
    want = -0.08 + 0.05 * math.log10(68)
    assert fit.prediction_ci[0] < want < fit.prediction_ci[1]
    # noisier points: a wider interval
    wide = longrun.fit_trend(xs, ys, [0.04] * 5, (math.log10(68),))
    assert wide.prediction_ci[1] - wide.prediction_ci[0] > 5 * (hi - lo) / 3
    # too few points, a missing interval, or a design that cannot separate the coefficients
    assert longrun.fit_trend(xs[:2], ys[:2], [0.004] * 2, (1.0,)) is None
    assert longrun.fit_trend(xs, ys, [0.004, None, 0.004, 0.004, 0.004], (1.0,)) is None
    same = [(x[0], 6.0) for x in xs]  # one size: log10(params) is constant
    assert longrun.fit_trend(same, ys, [0.004] * 5, (1.0, 8.6)) is None


def _diff(mean: float, lo: float, hi: float) -> PairedDifference:
    """A paired difference over 3 seeds with this mean and 95% interval."""
    return PairedDifference(
        seeds=(0, 1, 2),
        per_seed=(mean, mean, mean),
        n=3,
        mean=mean,
        std=(hi - lo) / 8.6,
        confidence=0.95,
        t=4.302653,
        ci=(lo, hi),
        excludes_zero=hi < 0 or lo > 0,
    )


def _point(
    size: str,
    params: int,
    tpp: float,
    d15: float,
    best: float,
    edge: float,
    lower: float | None = None,
    starts: tuple[float, ...] | None = None,
) -> ScalingPoint:
    """A scaling report's point; without `lower` and `starts` as a report written before the
    lower edge was reported reads."""
    return ScalingPoint(
        point=f"{size}-{int(tpp * params)}",
        size=size,
        preset=f"transformer-{size}",
        params=params,
        tokens=int(tpp * params),
        tokens_per_param=tpp,
        lr=4e-3,
        lr_at_edge=False,
        diffs={
            "uniform": None,
            "cosine:1.5:0.5": _diff(d15, d15 - 0.01, d15 + 0.01),
            "cosine:1.9:0.1": _diff(d15 - 0.02, d15 - 0.03, d15 - 0.01),
        },
        fit=BestRatioFit(
            best=best,
            ci=(best - 0.05, best + 0.05),
            at_upper_edge=edge,
            at_lower_edge=lower,
            lowest=1.9,
            lowest_share=None,
            n_seeds=3,
            starts=starts or (),
        ),
        wall_s=1.0,
        run_s=2.0,
        report=f"{size}-{int(tpp * params)}/report.md",
    )


def _scaling(points: list[ScalingPoint]) -> ScalingReport:
    meta = ScalingMeta("taperlm compare --paper tokens", "tokens", 1.0, "now", len(points), 8)
    return ScalingReport(meta, tuple(points), None)


def _report(tmp_path: Path, points: list[ScalingPoint]) -> Path:
    path = tmp_path / "report.json"
    meta = {"command": "taperlm compare --paper tokens", "done": len(points), "total": 8}
    path.write_text(json.dumps({"meta": meta, "points": [p.to_json() for p in points]}))
    return path


def test_trend_report_from_synthetic_points(tmp_path):
    """Two sizes whose advantage shrinks by 0.04 per decade: the per-size slopes recover it, the
    extrapolation to 440M at 68 tokens/param has an interval, the figures and table are
    written; trend.json holds every number the markdown shows."""
    pts = []
    for size, params, level in (("nano", 266_816, -0.05), ("micro", 1_058_016, -0.07)):
        for tpp in (0.5, 2, 8, 32):
            d = level + 0.04 * math.log10(tpp)
            pts.append(_point(size, params, tpp, d, 1.8 - 0.1 * math.log10(tpp), 0.0))
    md, js = longrun.write_trend_report(_scaling(pts), tmp_path, "tokens")
    trend = json.loads(js.read_text())
    at = math.log10(compare_grid.PAPER_440M.tokens_per_param)  # 68.2
    for size, level in (("nano", -0.05), ("micro", -0.07)):
        fit = trend["trends"]["diff_1.5"][size]
        assert fit["coefficients"][1] == pytest.approx(0.04, abs=1e-6)
        assert fit["prediction"] == pytest.approx(level + 0.04 * at, abs=1e-6)
    ext = trend["trends"]["diff_1.5"]["440m"]
    assert "prediction_ci" in ext and ext["prediction_ci"][0] < ext["prediction_ci"][1]
    assert trend["trends"]["best_ratio"]["nano"]["coefficients"][1] == pytest.approx(-0.1)
    for plot in (longrun.ADVANTAGE_PLOT, longrun.BEST_RATIO_PLOT):
        assert (tmp_path / plot).stat().st_size > 1000
    text = md.read_text()
    assert "PARTIAL: 8/8" not in text and "| nano-133408 |" in text
    assert f"{ext['prediction']:+.4f}" in text and f"{compare_grid.PAPER_DIFF:+.4f}" in text
    assert trend["points"][0]["best_measured"] == "cosine:1.9:0.1"


def test_trend_report_says_why_it_cannot_extrapolate(tmp_path):
    """One size: no trend with size; a best ratio at the sweep's edge: no best-ratio trend
    (a lower bound is not a fit); two points: too few for an interval."""
    pts = [_point("nano", 266_816, t, -0.05, 1.9, 0.9) for t in (0.5, 8)]
    _, js = longrun.write_trend_report(_scaling(pts), tmp_path, "tokens")
    trend = json.loads(js.read_text())["trends"]
    assert "one size" in trend["diff_1.5"]["440m"]["reason"]
    assert "needs >= 3" in trend["diff_1.5"]["nano"]["reason"]
    assert "steepest" in trend["best_ratio"]["nano"]["reason"]
    text = (tmp_path / "trend.md").read_text()
    assert "no trend: one size" in text and "(edge)" in text


def test_a_best_ratio_at_the_lower_edge_is_a_bound_not_a_trend_point(tmp_path):
    """Three points whose best sits at uniform, the lowest start swept (what nano measured at 8
    tokens per parameter): the best-ratio trend refuses to go through them, naming the lower
    edge and what to run, and the table marks "(edge: uniform)"; at an inverse taper's 0.5 the
    mark is "(edge: mildest swept)" and the advice is a lower start. Reports without the key
    (written before it existed) read as inside, as before."""
    uniform_sweep = (1.0, 1.25, 1.5, 1.75, 1.9)
    pts = [_point("nano", 266_816, t, 0.02, 1.0, 0.0, 0.9, uniform_sweep) for t in (2, 8, 32)]
    _, js = longrun.write_trend_report(_scaling(pts), tmp_path, "tokens")
    doc = json.loads(js.read_text())
    reason = doc["trends"]["best_ratio"]["nano"]["reason"]
    assert "lower edge, uniform" in reason and "upper bound" in reason
    assert "--paper tokens" in reason and "cosine:0.5:1.5" in reason
    assert "coefficients" not in doc["trends"]["best_ratio"]["nano"]
    assert "coefficients" in doc["trends"]["diff_1.5"]["nano"]  # the advantage still trends
    assert doc["points"][0]["best_ratio"]["at_lower_edge"] == 0.9
    assert doc["points"][0]["best_ratio"]["lowest_start"] == 1.0
    table = "\n".join(longrun.trend_table([longrun.TrendRow.from_json(p) for p in doc["points"]]))
    assert table.count("(edge: uniform)") == 3 and "(edge)" not in table
    assert (tmp_path / longrun.BEST_RATIO_PLOT).stat().st_size > 1000
    inverse = (0.5, 0.75, *uniform_sweep)
    deep = [_point("nano", 266_816, t, 0.02, 0.5, 0.0, 0.8, inverse) for t in (8, 32, 68)]
    rows = longrun.trend_rows(deep)
    assert "(edge: mildest swept)" in "\n".join(longrun.trend_table(rows))
    reason = longrun.trends(rows).best_ratio["nano"].reason
    assert "mildest start swept" in reason and "start 0.5" in reason and "0.25" in reason
    # one point at each edge: both named
    both = longrun.trends(longrun.trend_rows([pts[0], deep[1], _point(
        "nano", 266_816, 0.5, -0.05, 1.9, 0.9)])).best_ratio["nano"].reason  # fmt: skip
    assert "steepest" in both and "lower edge, uniform" in both and "mildest" in both
    # inside at both ends: the trend is fitted; an old report (no key) is inside
    inside = [_point("nano", 266_816, t, 0.02, 1.2, 0.1, 0.1, inverse) for t in (2, 8, 32)]
    fitted = longrun.trends(longrun.trend_rows(inside)).best_ratio["nano"]
    assert isinstance(fitted, longrun.TrendFit)
    old = longrun.trend_rows([_point("nano", 266_816, 2, 0.0, 1.29, 0.2)])
    assert old[0].best_ratio.at_lower_edge is None
    assert longrun.at_edge(old[0].best_ratio) is None


def test_a_best_ratio_trend_carried_past_the_swept_starts_says_so(tmp_path):
    """nano's best start fell 1.78 -> 1.29 -> 0.93 over 0.5 -> 8 tokens/param; a line through
    that predicts ~0.25 at 68, below the mildest start swept (0.5): the report must say the
    number lies beyond the measured ratios, and must not when the prediction stays inside."""
    inverse = (0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 1.9)
    falling = [
        _point("nano", 266_816, t, 0.0, b, 0.0, 0.1, inverse)
        for t, b in ((0.5, 1.78), (2, 1.29), (8, 0.93))
    ]
    md, js = longrun.write_trend_report(_scaling(falling), tmp_path, "tokens")
    fit = json.loads(js.read_text())["trends"]["best_ratio"]["nano"]
    assert fit["prediction"] < 0.5 and fit["swept"] == [0.5, 1.9]
    assert "beyond the starts swept (0.5 to 1.9)" in md.read_text()
    flat = [_point("nano", 266_816, t, 0.0, 1.2, 0.0, 0.1, inverse) for t in (0.5, 2, 8)]
    # noise so that the fit has an interval
    flat[1] = dataclasses.replace(flat[1], fit=dataclasses.replace(flat[1].fit, ci=(1.1, 1.3)))
    fit = longrun.trends(longrun.trend_rows(flat)).best_ratio["nano"]
    assert isinstance(fit, longrun.TrendFit) and fit.swept is None


def test_trend_records_read_back_as_written(tmp_path):
    """trend.json is its records' layout: the file reads back as a `TrendReport` that writes
    the same object, and every record reads back equal (from_json(to_json(x)) == x): rows with
    and without a best-measured difference, fitted trends with and without `swept`, reasons;
    the committed token-axis report reads back to itself."""
    inverse = (0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 1.9)
    sets = {
        "two-sizes": [
            _point(size, params, t, -0.05 + 0.04 * math.log10(t), 1.8 - 0.1 * math.log10(t), 0)
            for size, params in (("nano", 266_816), ("micro", 1_058_016))
            for t in (0.5, 2, 8, 32)
        ],
        "beyond-swept": [
            _point("nano", 266_816, t, 0.0, b, 0.0, 0.1, inverse)
            for t, b in ((0.5, 1.78), (2, 1.29), (8, 0.93))
        ],
    }
    seen: set[object] = set()
    for name, pts in sets.items():
        (tmp_path / name).mkdir()
        _, js = longrun.write_trend_report(_scaling(pts), tmp_path / name, "tokens")
        doc = json.loads(js.read_text())
        report = longrun.TrendReport.from_json(doc)
        assert json.loads(json.dumps(report.to_json())) == doc
        assert longrun.TrendReport.from_json(report.to_json()) == report
        assert longrun.Trends.from_json(report.trends.to_json()) == report.trends
        for row in report.points:
            assert longrun.TrendRow.from_json(row.to_json()) == row
            assert longrun.BestRatio.from_json(row.best_ratio.to_json()) == row.best_ratio
            for d in (row.diff_15, row.diff_best):
                if d is not None:
                    assert longrun.Difference.from_json(d.to_json()) == d
        for fit in (*report.trends.diff_15.values(), *report.trends.best_ratio.values()):
            assert type(fit).from_json(fit.to_json()) == fit
            seen.add(type(fit))
            seen |= {"swept"} if isinstance(fit, longrun.TrendFit) and fit.swept else set()
    assert seen == {longrun.TrendFit, longrun.NoTrend, "swept"}
    root = Path(__file__).resolve().parents[2]
    committed = json.loads((root / "benchmarks/results/longrun_tokens_nano.json").read_text())
    report = longrun.TrendReport.from_json(committed)
    assert json.loads(json.dumps(report.to_json())) == committed
    assert any(r.best_measured == "uniform" and r.diff_best is None for r in report.points)


def test_the_best_measured_is_named_for_every_lowest_start():
    """Whatever start has the lowest mean loss, the row names it: a swept taper with its
    difference, or uniform (start 1.0) as the baseline, never a blank that reads as missing."""
    for lowest, name in ((1.9, "cosine:1.9:0.1"), (1.5, "cosine:1.5:0.5"), (1.0, "uniform")):
        p = _point("nano", 266_816, 8, 0.02, 0.9, 0.0, 0.1, (1.0, 1.5, 1.9))
        p = dataclasses.replace(p, fit=dataclasses.replace(p.fit, lowest=lowest))
        (row,) = longrun.trend_rows([p])
        assert row.best_measured == name
        cells = longrun.trend_table([row])[-1].split(" | ")
        assert cells[4] == name
        if name == "uniform":
            assert row.diff_best is None and cells[5] == "0 (baseline)"
        else:
            assert row.diff_best.mean == p.diffs[name].mean


@pytest.mark.slow  # ~30 s of CPU: 2 points x 8 toy runs
def test_ratio_mode_end_to_end_at_toy_scale_with_a_zero_width(
    data_dir,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """The ratios mode's machinery on a toy plan whose steepest ratio 2.0 -> 0.0 gives the last
    layer no MLP: every point trains, the scaling report and the trend report are written, a
    rerun trains nothing."""
    from taperlm.cli import build_parser
    from taperlm.compare import scaling

    toy = scaling.ScalingPlan(
        sizes=[scaling.ScalingSize("a", "transformer-tiny", ("model.d_model=32",), (128, 192))],
        tokens=[128, 192],
        starts=(1.5, 2.0),
    )
    monkeypatch.setattr(longrun, "plan_of", lambda mode, sizes=None: toy)
    out = tmp_path / "r"
    argv = ["compare", *TOY_ARGS, "--paper", "ratios", "--seeds", "2", "--lr-grid", "2e-3,8e-3",
            "--tune-seeds", "1", "--data", str(data_dir), "--out", str(out)]  # fmt: skip
    args = build_parser().parse_args(argv)
    opts = CompareOptions(**{f: getattr(args, f) for f in CompareOptions.__dataclass_fields__})
    md, js = longrun.run_longrun(opts)
    rep = json.loads(js.read_text())
    assert [p["point"] for p in rep["points"]] == ["a-128", "a-192"]
    assert set(rep["points"][0]["diffs"]) == {"uniform", "cosine:1.5:0.5", "cosine:2.0:0.0"}
    sub = json.loads((out / "a-128" / "report.json").read_text())
    zero = next(a for a in sub["allocations"] if a["taper"] == "cosine:2.0:0.0")
    assert zero["widths"][-1] == 0
    trend = json.loads((out / "trend.json").read_text())
    assert trend["meta"]["mode"] == "ratios" and len(trend["points"]) == 2
    assert "--paper ratios" in md.read_text() and (out / longrun.ADVANTAGE_PLOT).is_file()
    longrun.run_longrun(opts)  # resumes: everything is there
    assert json.loads(js.read_text())["points"][0]["fit"] == rep["points"][0]["fit"]


def test_extended_lrs_adds_one_step_beyond_each_edge_chosen():
    from taperlm.compare.tuning import extended_lrs

    grid = [1e-3, 2e-3, 4e-3, 8e-3]
    assert extended_lrs(grid, {8e-3}) == [*grid, 16e-3]
    assert extended_lrs(grid, {1e-3}) == [5e-4, *grid]
    both = extended_lrs(grid, {1e-3, 8e-3})
    assert both == [5e-4, *grid, 16e-3]
    assert extended_lrs(grid, {2e-3}) is None
    assert extended_lrs([1e-3, 3e-3], {3e-3}) == pytest.approx([1e-3, 3e-3, 9e-3])
    assert extended_lrs([1e-3], {1e-3}) == [5e-4, 1e-3, 2e-3]


def test_a_chosen_lr_at_the_edge_extends_the_grid(data_dir, tmp_path):  # noqa: F811
    """--lr-grid-extend 2 with a grid far below any useful lr (1e-5, 2e-5): the choice sits at the
    upper edge, so 4e-5 and then 8e-5 join the grid (two extensions, the limit), the report says
    so and still flags the edge; without --tune-lr the option is refused; the reproducing command
    carries it."""
    from test_compare import TINY, _cli

    out = tmp_path / "o"
    args = ["compare", *TINY, "--tapers", "uniform;cosine:1.5:0.5", "--tune-lr",
            "--tune-lr-scope", "uniform", "--lr-grid", "1e-5,2e-5", "--tune-seeds", "1",
            "--lr-grid-extend", "2", "--seeds", "1", "--data", str(data_dir)]  # fmt: skip
    rc, _, err = _cli([*args, "--out", str(out)])
    assert rc == 0, err
    rep = json.loads((out / "report.json").read_text())
    tuning = rep["lr_tuning"]
    assert tuning["lrs"] == pytest.approx([1e-5, 2e-5, 4e-5, 8e-5]) and tuning["extended"] == 2
    assert tuning["chosen_lr"]["uniform"] == pytest.approx(8e-5)
    assert tuning["curves"]["uniform"]["at_edge"] is True
    assert "--lr-grid-extend 2" in rep["meta"]["command"]
    rc, _, err = _cli(["compare", *TINY, "--lr-grid-extend", "2", "--out", str(tmp_path / "x")])
    assert rc != 0 and "--lr-grid-extend" in err and "--tune-lr" in err


def test_every_report_read_together(tmp_path):
    """`rows_of_reports` reads a scaling report (through trend_rows) and a trend report (its
    rows as they are) into one list, so a trend can run across every size measured: with a
    size from each, the across-size fit exists and its line names both slopes (tokens per
    parameter and parameters), which a per-size line does not. A point in two reports, a file
    without points and a point not as the modes write it are refused naming the file."""
    micro = [
        _point("micro", 1_058_016, t, -0.1 + 0.03 * math.log10(t), 1.8, 0.0) for t in (0.2, 0.4)
    ]
    nano = [_point("nano", 266_816, t, -0.05 + 0.05 * math.log10(t), 1.5, 0.0) for t in (0.5, 2, 8)]
    (tmp_path / "a").mkdir()
    scaling = _report(tmp_path / "a", micro)
    (tmp_path / "b").mkdir()
    _, trend = longrun.write_trend_report(_scaling(nano), tmp_path / "b", "tokens")
    rows = longrun.rows_of_reports([scaling, trend])
    assert [r.point for r in rows] == [p.point for p in (*micro, *nano)]
    # each report names its mode (the packaged measurements keep it per row)
    assert longrun.report_rows(scaling).mode == "scaling"
    assert longrun.report_rows(trend).mode == "tokens"
    assert rows[:2] == longrun.trend_rows(micro)
    assert tuple(rows[2:]) == longrun.TrendReport.from_json(json.loads(trend.read_text())).points
    md, js = longrun.write_trend(tmp_path, rows, longrun.ALL_POINTS, "cmd", 5, 5)
    fits = json.loads(js.read_text())["trends"]["diff_1.5"]
    assert len(fits["440m"]["coefficients"]) == 3
    text = md.read_text()
    assert "every point measured" in text and "paper all" not in text
    across = next(line for line in text.splitlines() if "across sizes" in line and "Δ" in line)
    assert "per decade of parameters" in across
    nano_line = next(line for line in text.splitlines() if line.startswith("- Δ at 1.5→0.5, nano"))
    assert "per decade of parameters" not in nano_line
    with pytest.raises(ConfigError, match="in both"):
        longrun.rows_of_reports([scaling, scaling])
    assert longrun.rows_of_reports([scaling, scaling], widest=True) == rows[:2]
    bad = tmp_path / "bad.json"
    for content in (
        {"meta": {}},
        [],
        {"points": [{"point": "x"}]},
        {"points": "x"},
        {"points": [], "trends": {}, "meta": {}},  # a trend report that names no mode
        {"points": [], "trends": {}, "meta": "tokens"},
    ):
        bad.write_text(json.dumps(content))
        with pytest.raises(ConfigError, match=r"bad\.json"):
            longrun.rows_of_reports([bad])


def test_a_point_two_reports_measured_is_the_widest_sweeps():
    """`keep_widest`: one row per point, the row whose sweep reaches the steepest start (then the
    lowest), wherever it comes in the list; points measured once are kept as they are, in order;
    the trend across every report reads each point once."""

    def row(point, high, low, d15):
        (base,) = longrun.trend_rows([_point("nano", 266_816, 8.0, d15, 1.0, 0.0, 0.5)])
        reach = dataclasses.replace(base.best_ratio, highest_start=high, lowest_start=low)
        return dataclasses.replace(base, point=point, best_ratio=reach)

    tokens = [row("a", 1.9, 0.5, 0.01), row("b", 1.9, 0.5, 0.02), row("c", 1.9, 0.5, 0.03)]
    ratios = [row("b", 2.0, 0.5, 0.02), row("d", 2.0, 0.5, 0.04)]
    kept = longrun.keep_widest([*tokens, *ratios])
    assert [r.point for r in kept] == ["a", "b", "c", "d"]
    assert kept[1] is ratios[0] and kept[0] is tokens[0] and kept[3] is ratios[1]
    assert longrun.keep_widest([*ratios, *tokens])[0] is ratios[0]  # order does not decide
    lower = row("b", 2.0, 0.25, 0.02)  # same steepest start, reaches lower
    assert longrun.keep_widest([ratios[0], lower])[0] is lower

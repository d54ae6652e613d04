"""`taperlm compare --paper shapes`: the plan meets issue 62's brief (bell and hourglass on one
axis through uniform, the monotone comparators, nano 8 / 32 and micro 2 tokens per parameter at
`--paper tokens`' budgets, uniform's lr tuned per point), every point is a valid comparison, the
reading of per-seed losses is checked against numbers worked by hand, and a toy study runs end to
end, resumes, and its report reads back as written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from taperlm.compare import longrun, shapes
from taperlm.compare.comparison import check_options, corpus_tokenizer
from taperlm.compare.options import CompareOptions
from taperlm.config.presets import get_preset
from taperlm.errors import ConfigError
from taperlm.spec.solver import solve_sizes
from test_compare import data_dir  # noqa: F401 (fixture)
from test_compare_scaling import TOY_ARGS


def test_axis_runs_hourglass_uniform_bell_and_reads_back():
    assert shapes.AXIS == (-1.0, -0.5, 0.0, 0.5, 1.0)
    tapers = [shapes.axis_taper(x) for x in shapes.AXIS]
    assert tapers == ["hourglass:1.0", "hourglass:0.5", "uniform", "bell:0.5", "bell:1.0"]
    assert [shapes.axis_of(t) for t in tapers] == list(shapes.AXIS)
    assert all(shapes.axis_of(t) is None for t in shapes.MONOTONE)
    assert shapes.shape_tapers().split(";") == [*tapers, *shapes.MONOTONE]
    # OpenELM's eightfold widening, mean 1
    start, end = (float(v) for v in shapes.OPENELM.split(":")[1:])
    assert end / start == pytest.approx(8.0) and (start + end) / 2 == pytest.approx(1.0)
    assert [shapes.is_monotone(t) for t in tapers] == [False, False, True, False, False]


def test_points_are_the_token_axis_budgets():
    """The same points as --paper tokens (so the same budgets and folders), nano at its width
    step of 8; --preset-size picks sizes; an unknown size is refused by name."""
    points = shapes.shape_points()
    assert [(p.size, p.tokens) for p in points] == [
        ("nano", longrun.budget_tokens("nano", 8.0)),
        ("nano", longrun.budget_tokens("nano", 32.0)),
        ("micro", longrun.budget_tokens("micro", 2.0)),
    ]
    tokens_points = {s.name: set(s.tokens) for s in longrun.plan_of("tokens").sizes}
    assert all(p.tokens in tokens_points[p.size] for p in points)
    assert [p.key for p in points] == [f"{p.size}-{p.tokens}" for p in points]
    assert [p.multiple_of for p in points] == [8, 8, None]
    assert [p.size for p in shapes.shape_points(("micro",))] == ["micro"]
    with pytest.raises(ConfigError, match="nano, micro; got huge"):
        shapes.shape_points(("huge",))


def test_every_point_is_a_valid_comparison_with_exact_symmetric_budgets():
    """Checked without training: 8 allocations at each point's budget and corpus, uniform's lr
    tuned there; every allocation has uniform's MLP parameters; bell and hourglass are mirror
    symmetric, bell widest in the middle and hourglass narrowest, OpenELM widening."""
    opts = CompareOptions(out=Path("x"), paper="shapes")
    for point, sub in shapes.point_options(opts, shapes.shape_points()):
        allocs, base = check_options(sub)
        assert [a.spec_string for a in allocs] == shapes.shape_tapers().split(";")
        assert base.train.tokens == point.tokens and sub.out == Path("x") / point.key
        assert sub.tune_lr and sub.tune_scope == "uniform" and sub.lr_grid_extend == 3
        assert corpus_tokenizer(sub) == ("bpe:512" if point.size == "nano" else "bpe:2048")
        cfg = get_preset(point.preset, resolve=False)
        n, uniform = cfg.n_layers, cfg.mlp_width
        for a in allocs:
            widths = solve_sizes(a.spec, n, uniform, zero_ok=True)
            assert sum(widths) == n * uniform, a.spec_string
            x = shapes.axis_of(a.spec_string)
            if x not in (None, 0.0):
                assert widths == widths[::-1], a.spec_string
                mid, end = widths[n // 2], widths[0]
                assert (mid > end) if x > 0 else (mid < end), a.spec_string
        openelm = next(a for a in allocs if a.spec_string == shapes.OPENELM)
        w = solve_sizes(openelm.spec, n, uniform, zero_ok=True)
        assert list(w) == sorted(w) and w[-1] > 3 * w[0]


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--tapers", "uniform;bell"], "not both"),
        (["--tokens", "1000"], "token budgets itself"),
        (["--preset", "transformer-nano"], "builds its sizes from presets"),
        (["--tune-lr-scope", "each"], "tunes each point's uniform lr"),
    ],
)
def test_options_the_study_sets_are_refused(extra, match):
    from taperlm.cli import build_parser

    args = build_parser().parse_args(["compare", "--paper", "shapes", "--out", "o", *extra])
    opts = CompareOptions(**{f: getattr(args, f) for f in CompareOptions.__dataclass_fields__})
    with pytest.raises(ConfigError, match=match):
        shapes.point_options(opts, shapes.shape_points())


def test_reading_by_hand():
    """Three seeds; bell:0.5 lowest overall, cosine:1.5:0.5 the best monotone; the means, the
    paired difference and its t interval worked by hand; the axis losses a parabola in x with
    its vertex at +0.4, which the local fit recovers (exactly: three points, one parabola)."""
    seeds = (0, 1, 2)
    shift = {0: 0.0, 1: 0.03, 2: -0.01}  # a seed's offset, shared by every allocation (paired)
    axis = {x: 3.0 + (x - 0.4) ** 2 for x in shapes.AXIS}
    losses = {shapes.axis_taper(x): {s: v + shift[s] for s in seeds} for x, v in axis.items()}
    # the best monotone: 3.05 mean, beaten by bell:0.5 (3.0 + 0.01) by 0.04 in each seed but one
    losses[shapes.MONOTONE[0]] = {0: 3.05, 1: 3.08, 2: 3.05}
    losses[shapes.MONOTONE[1]] = {s: 3.5 for s in seeds}
    losses[shapes.OPENELM] = {s: 3.9 for s in seeds}
    losses["uniform"][3] = 1.0  # a seed not every allocation has: left out everywhere
    r = shapes.read_losses(losses)
    assert r.lowest == "bell:0.5" and r.best_nonmonotone == "bell:0.5"
    assert r.best_monotone == shapes.MONOTONE[0]
    assert r.means["uniform"] == pytest.approx(3.16 + 0.02 / 3)
    d = r.nonmonotone_vs_monotone  # per seed: 3.01-3.05, 3.04-3.08, 3.00-3.05
    assert d.seeds == seeds and d.per_seed == pytest.approx((-0.04, -0.04, -0.05))
    mean, sd = -0.13 / 3, (((1 / 3) ** 2 * 2 + (2 / 3) ** 2) * 1e-4 / 2) ** 0.5
    half = 4.302653 * sd / 3**0.5  # t(0.975, 2)
    assert d.mean == pytest.approx(mean) and d.ci == pytest.approx((mean - half, mean + half))
    assert r.fit.best == pytest.approx(0.4) and r.fit.n_seeds == 3
    assert r.fit.starts == shapes.AXIS and r.fit.lowest == 0.5
    with pytest.raises(ValueError, match="monotone and a non-monotone"):
        shapes.read_losses({"uniform": {0: 1.0}, shapes.OPENELM: {0: 1.0}})
    with pytest.raises(ValueError, match="a seed every allocation has"):
        shapes.read_losses({"uniform": {0: 1.0}, "bell:0.5": {1: 1.0}})


def test_help_states_the_estimated_time():
    from taperlm.cli import build_parser

    hours = shapes.estimated_hours()
    text = " ".join(
        build_parser()._subparsers._group_actions[0].choices["compare"].format_help().split()
    )
    assert f"~{hours:.1f} h on 2 idle cores at 5 seeds" in text


@pytest.mark.slow  # ~40 s of CPU: 2 toy points x (4 allocations x 2 seeds + 2 tuning runs)
def test_toy_study_end_to_end(data_dir, tmp_path, monkeypatch):  # noqa: F811
    """The study's machinery on toy points with a shorter axis (hourglass 0.5, uniform, bell
    0.5) and one monotone comparator: every point trains, report.json / report.md / shapes.png
    are written, the report reads back as written, a rerun trains nothing."""
    from taperlm.cli import build_parser
    from taperlm.compare.results import read_record

    toy = [
        shapes.ShapesPoint("a-128", "a", "transformer-tiny", 128, None),
        shapes.ShapesPoint("a-192", "a", "transformer-tiny", 192, None),
    ]
    monkeypatch.setattr(shapes, "shape_points", lambda sizes=None: toy)
    monkeypatch.setattr(shapes, "AXIS", (-0.5, 0.0, 0.5))
    monkeypatch.setattr(shapes, "MONOTONE", ("cosine:1.5:0.5",))
    out = tmp_path / "s"
    argv = ["compare", *TOY_ARGS, "--paper", "shapes", "--seeds", "2", "--lr-grid", "2e-3,8e-3",
            "--tune-seeds", "1", "--set", "model.d_model=32", "--data", str(data_dir),
            "--out", str(out)]  # fmt: skip
    args = build_parser().parse_args(argv)
    opts = CompareOptions(**{f: getattr(args, f) for f in CompareOptions.__dataclass_fields__})
    md, js = shapes.run_shapes(opts)
    rep = json.loads(js.read_text())
    assert [p["point"] for p in rep["points"]] == ["a-128", "a-192"]
    first = rep["points"][0]
    assert [s["taper"] for s in first["shapes"]] == [
        "hourglass:0.5", "uniform", "bell:0.5", "cosine:1.5:0.5"
    ]  # fmt: skip
    assert first["fit"]["starts"] == [-0.5, 0.0, 0.5] and first["fit"]["n_seeds"] == 2
    assert first["best_monotone"] in ("uniform", "cosine:1.5:0.5")
    assert first["best_nonmonotone"] in ("hourglass:0.5", "bell:0.5")
    sub = json.loads((out / "a-128" / "report.json").read_text())
    assert sub["lr_tuning"]["chosen_lr"]["uniform"] == first["lr"]
    back = read_record(js, "shapes report", shapes.ShapesReport.from_json)
    assert back.to_json() == rep
    assert "--paper shapes" in md.read_text() and (out / shapes.SHAPES_PLOT).is_file()
    before = {p: p.stat().st_mtime_ns for p in (out / "a-128").rglob("result.json")}
    shapes.run_shapes(opts)  # resumes: every cell is there
    assert {p: p.stat().st_mtime_ns for p in (out / "a-128").rglob("result.json")} == before
    assert json.loads(js.read_text())["points"][0]["fit"] == first["fit"]


def test_docs_state_the_estimated_times():
    """docs/compare.md's section states the estimates the code makes, for the study and for
    micro alone (nano 8 + nano 32 + micro 2 = the whole)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "compare.md").read_text("utf-8")
    section = text[text.index("## Shapes beyond monotone") :]
    section = section[: section.index("\n## ")]
    assert f"≈ {shapes.estimated_hours():.1f} h at 5 seeds" in section
    micro, nano = shapes.estimated_hours(sizes=("micro",)), shapes.estimated_hours(sizes=("nano",))
    assert micro + nano == pytest.approx(shapes.estimated_hours())
    assert f"micro 2 only, ≈ {micro:.1f} h" in section
    assert f"did not (≈ {shapes.estimated_hours(after_tokens=True):.1f} h)" in section


def test_in_a_tokens_folder_it_reuses_the_token_axis_cells():
    """`--paper shapes` in a copy of a finished `--paper tokens` folder trains only its new
    allocations: at each of its points, a tokens point of the same folder name whose options
    differ only in the allocation list and the stop question, so uniform's lr tuning is the
    same and every cell of uniform, cosine 1.5 -> 0.5 and 0.75 -> 1.25 has the same name and
    run config in both."""
    import dataclasses as dc

    from taperlm.compare.grid import build_grid

    tokens_plan = longrun.longrun_plan(CompareOptions(out=Path("x"), paper="tokens"))
    tokens = {part.key: part.opts for part in tokens_plan.parts}
    opts = CompareOptions(out=Path("x"), paper="shapes")
    for point, sub in shapes.point_options(opts, shapes.shape_points()):
        other = tokens[point.key]
        differ = {f.name for f in dc.fields(sub) if getattr(sub, f.name) != getattr(other, f.name)}
        assert differ == {"tapers", "stop_on"}, point.key
        cells = []
        for o in (sub, other):
            allocs, base = check_options(o)
            grid = build_grid(base, allocs, list(range(o.seeds)), o.paper)
            cells.append({c.name: c.config for c in grid.cells})
        common = set(cells[0]) & set(cells[1])
        kept = {a.name for a in check_options(sub)[0] if a.spec_string in shapes.ON_THE_TOKEN_AXIS}
        assert kept == {"uniform", "cosine-1.5-0.5", "cosine-0.75-1.25"}
        assert common == {f"{n}-s{s}" for n in kept for s in range(5)}, point.key
        assert all(cells[0][n] == cells[1][n] for n in common), point.key
    reused = shapes.estimated_hours(after_tokens=True)
    assert reused == pytest.approx(shapes.estimated_hours() * 25 / 48)

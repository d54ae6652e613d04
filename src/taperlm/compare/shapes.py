"""`taperlm compare --paper shapes`: once training is long, does a shape that is not monotone beat
the monotone tapers?

Every taper measured before this study narrows or widens monotonically with depth; the literature's
shapes do not: a middle-heavy FFN (Lee et al., COLM 2025), a narrow middle (Variable-Width
Transformers; Puzzle's searched models keep the ends and cut the middle). At each point (a preset
at a token budget, `SHAPE_POINTS`: nano at 8 and 32 tokens per parameter, micro at 2, the budgets
`--paper tokens` trains) one comparison, resumable in OUT/<size>-<tokens>/, trains

- the **middle-contrast axis**: hourglass 1, hourglass 0.5, uniform, bell 0.5, bell 1 — one
  line through uniform, written as a signed strength x (`axis_taper`: bell x above 0, hourglass
  -x below; `bell:S` and `hourglass:S` are mirror images, docs/tapers.md), and
- the **monotone comparators**: the paper's cosine 1.5 -> 0.5, the widening lead cosine 0.75 ->
  1.25 and OpenELM's linear 2/9 -> 16/9 (an eightfold widening, mean 1),

5 seeds each, every allocation at uniform's lr tuned at that point as `--paper tokens` tunes it
(`--tune-lr --tune-lr-scope uniform`, the grid extended at an edge, `longrun.LONGRUN_EXTEND`).

Per point the report (OUT/report.md, report.json, shapes.png) gives each shape's paired
difference from uniform, the shape with the lowest mean loss, the best shape on the axis fitted
with a bootstrap interval over seeds (`taperlm.compare.scaling.fit_best_ratio` with x in place
of the start ratio: the vertex of the local parabola, an edge share saying when it is a bound),
and the paired difference of the best non-monotone shape against the best monotone allocation
(uniform included): the question a user planning a long run has. shapes.png draws every point's
profiles, the lowest-loss one bold."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taperlm.analysis.plots import _figure, _save
from taperlm.analysis.stats import PairedDifference, paired_difference
from taperlm.compare.longrun import (
    CELL_TOKENS_PER_S,
    LONGRUN_EXTEND,
    SIZES,
    TUNE_LRS,
    TUNE_SEEDS,
    budget_tokens,
)
from taperlm.compare.report import diff_ci, md_table, produced_by
from taperlm.compare.results import REPORT_FILE, ComparisonReport, write_record
from taperlm.compare.scaling import (
    BestRatioFit,
    ScalingMeta,
    fit_best_ratio,
    refuse_point_settings,
    run_seconds,
    study_command,
    uniform_lr_at_edge,
)
from taperlm.compare.study import Part, StudyPlan, StudyProgress, run_plan
from taperlm.errors import ConfigError
from taperlm.files.io import atomic_write_text
from taperlm.spec.taper import TaperSpec

# size -> its tokens per parameter (budgets as `longrun.budget_tokens` rounds them: the same
# points, so the same budgets, as --paper tokens)
SHAPE_POINTS: dict[str, tuple[float, ...]] = {"nano": (8.0, 32.0), "micro": (2.0,)}
# the axis's strengths either side of uniform: 0.5 is as much contrast as cosine 1.25 -> 0.75
STRENGTHS = (0.5, 1.0)
AXIS = (*(-s for s in reversed(STRENGTHS)), 0.0, *STRENGTHS)  # -1, -0.5, 0, 0.5, 1
SHAPES_PLOT = "shapes.png"


# the allocations as the comparison's report writes them (a spec's own text: bell:1.0, ...)
def _written(**settings: Any) -> str:
    return TaperSpec(**settings).to_string()


# OpenELM's FFN widening, beta from 0.5 to 4 (x d_model) normalised to mean 1: 2/9 -> 16/9
OPENELM = _written(schedule="linear", start=2 / 9, end=16 / 9)
MONOTONE = (
    _written(schedule="cosine", start=1.5, end=0.5),
    _written(schedule="cosine", start=0.75, end=1.25),
    OPENELM,
)


def axis_taper(x: float) -> str:
    """The allocation at signed strength `x` of the middle-contrast axis, as the report writes
    it: bell:x above 0 (a wide middle), hourglass:-x below (a narrow middle), uniform at 0."""
    if x == 0:
        return "uniform"
    return _written(schedule="bell" if x > 0 else "hourglass", bump=abs(x))


def axis_of(taper: str) -> float | None:
    """`axis_taper`'s inverse: the signed strength of an allocation on the axis (None: off it,
    a monotone comparator)."""
    return next((x for x in AXIS if axis_taper(x) == taper), None)


def shape_tapers() -> str:
    """Each point's --tapers: the axis in order of x, then the monotone comparators."""
    return ";".join([*(axis_taper(x) for x in AXIS), *MONOTONE])


def is_monotone(taper: str) -> bool:
    """Whether an allocation of this study is monotone in depth (uniform included)."""
    return taper == "uniform" or taper in MONOTONE


@dataclass(frozen=True)
class ShapesPoint:
    """Where one comparison trains: a size of the long-training sweeps at a budget."""

    key: str  # <size>-<tokens>: its folder
    size: str  # a size of `longrun.SIZES`
    preset: str
    tokens: int
    multiple_of: int | None  # the width step (nano's 8; None: the tapers' default)


def shape_points(sizes: tuple[str, ...] | None = None) -> list[ShapesPoint]:
    """The study's points, at `sizes` (--preset-size's; None: every size of SHAPE_POINTS)."""
    names = list(sizes or SHAPE_POINTS)
    unknown = [n for n in names if n not in SHAPE_POINTS]
    if unknown or not names:
        raise ConfigError(
            f"--preset-size: --paper shapes runs at {', '.join(SHAPE_POINTS)}; got "
            f"{', '.join(unknown) or 'none'}"
        )
    out = []
    for name in names:
        preset, _, step = SIZES[name]
        for per_param in SHAPE_POINTS[name]:
            tokens = budget_tokens(name, per_param)
            out.append(ShapesPoint(f"{name}-{tokens}", name, preset, tokens, step))
    return out


def point_options(opts, points: list[ShapesPoint]) -> list[tuple[ShapesPoint, Any]]:
    """(point, CompareOptions) of every point: the shapes at the point's budget, uniform's lr
    tuned there; ConfigError for an option the study sets itself."""
    refuse_point_settings(opts, [p.size for p in points])
    extend = LONGRUN_EXTEND if opts.lr_grid_extend is None else opts.lr_grid_extend
    return [
        (
            p,
            dataclasses.replace(
                opts,
                out=opts.out / p.key,
                preset=p.preset,
                paper=None,
                tapers=shape_tapers(),
                tokens=p.tokens,
                tune_lr=True,
                tune_scope="uniform",
                lr_grid_extend=extend,
                preset_size=None,
                multiple_of=p.multiple_of or opts.multiple_of,
            ),
        )
        for p in points
    ]


def shapes_plan(opts) -> StudyPlan:
    """`--paper shapes`: every point one after the other, the report rewritten after each."""
    points = point_options(opts, shape_points(opts.preset_size))

    def report(done: StudyProgress) -> tuple[Path, Path]:
        meta = ScalingMeta(
            command=command(opts, points[0][1]),
            mode="shapes",
            wall_s=done.wall(),
            created=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            done=len(done.reports),
            total=done.total,
        )
        write_shapes_report(points, done.reports, opts.out, meta)
        return opts.out / "report.md", opts.out / REPORT_FILE

    parts = [
        Part(p.key, sub, "point", f"{p.size} ({p.preset}), {p.tokens:,} tokens,")
        for p, sub in points
    ]
    return StudyPlan(parts, report, mode="shapes", folder="shapes folder")


def command(opts, sub) -> str:
    """The command that reproduces the study (`sub`: a point's options, for its seeds)."""
    return study_command(opts, sub, "shapes", stop_on=opts.stop_on)


def run_shapes(opts) -> tuple[Path, Path]:
    """Run `--paper shapes`; returns (report.md, report.json)."""
    return run_plan(opts, shapes_plan)


# the allocations `--paper tokens` also trains at these points (with uniform's lr tuning): run
# in a copy of its finished folder, the study reuses their cells (same names, same configs)
ON_THE_TOKEN_AXIS = ("uniform", MONOTONE[0], MONOTONE[1])


def estimated_hours(
    seeds: int = 5,
    cores: int = 2,
    sizes: tuple[str, ...] | None = None,
    after_tokens: bool = False,
) -> float:
    """Hours on `cores` idle cores at the sweeps' measured speed (`longrun.CELL_TOKENS_PER_S`)
    for the points at `sizes` (None: all): every point trains its allocations x `seeds` runs
    and TUNE_LRS x TUNE_SEEDS tuning runs (no extension; evaluation, ~2%, left out);
    `after_tokens`: in a copy of a finished `--paper tokens` folder, only the allocations it
    did not train, and no tuning."""
    allocations = len(AXIS) + len(MONOTONE)
    if after_tokens:
        runs = (allocations - len(ON_THE_TOKEN_AXIS)) * seeds
    else:
        runs = allocations * seeds + TUNE_LRS * TUNE_SEEDS
    core_s = sum(runs * p.tokens / CELL_TOKENS_PER_S[p.size] for p in shape_points(sizes))
    return core_s / cores / 3600


# ----------------------------------------------------------------------------------------------
# the report


@dataclass(frozen=True)
class ShapeResult:
    """One allocation of a point: its widths and its loss against uniform's."""

    taper: str  # as --tapers writes it
    x: float | None  # its signed strength on the axis (None: a monotone comparator)
    widths: tuple[int, ...]  # MLP width per layer
    baseline_width: int
    mean_loss: float  # validation loss, mean over the seeds every allocation of the point has
    diff: PairedDifference | None  # its loss minus uniform's, paired by seed (uniform: None)

    def to_json(self) -> dict[str, Any]:
        return {
            "taper": self.taper,
            "x": self.x,
            "widths": list(self.widths),
            "baseline_width": self.baseline_width,
            "mean_loss": self.mean_loss,
            "diff": None if self.diff is None else self.diff.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShapeResult:
        diff = data["diff"]
        return cls(
            data["taper"],
            data["x"],
            tuple(data["widths"]),
            data["baseline_width"],
            data["mean_loss"],
            None if diff is None else PairedDifference.from_json(diff),
        )


@dataclass(frozen=True)
class ShapesRow:
    """One point as the study's report gives it: report.json's entry of `points`."""

    point: str  # <size>-<tokens>: its folder
    size: str
    preset: str
    params: int
    tokens: int
    tokens_per_param: float
    lr: float | None  # uniform's tuned lr, every allocation's (None: not tuned)
    lr_at_edge: bool | None  # the tuned lr at its grid's edge (None: not tuned)
    shapes: tuple[ShapeResult, ...]  # in --tapers' order
    lowest: str  # the allocation with the lowest mean loss
    best_nonmonotone: str  # the non-monotone shape with the lowest mean loss
    best_monotone: str  # the monotone allocation (uniform included) with the lowest mean loss
    # best_nonmonotone's loss minus best_monotone's, paired by seed: below 0, a shape that is
    # not monotone beats every monotone one measured
    nonmonotone_vs_monotone: PairedDifference
    fit: BestRatioFit  # the best x on the axis (its `starts` are the axis's x)
    run_s: float  # its runs' own seconds, tuning included
    report: str  # its report.md, relative to the study's folder

    def to_json(self) -> dict[str, Any]:
        return {
            "point": self.point,
            "size": self.size,
            "preset": self.preset,
            "params": self.params,
            "tokens": self.tokens,
            "tokens_per_param": self.tokens_per_param,
            "lr": self.lr,
            "lr_at_edge": self.lr_at_edge,
            "shapes": [s.to_json() for s in self.shapes],
            "lowest": self.lowest,
            "best_nonmonotone": self.best_nonmonotone,
            "best_monotone": self.best_monotone,
            "nonmonotone_vs_monotone": self.nonmonotone_vs_monotone.to_json(),
            "fit": self.fit.to_json(),
            "run_s": self.run_s,
            "report": self.report,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShapesRow:
        return cls(
            point=data["point"],
            size=data["size"],
            preset=data["preset"],
            params=data["params"],
            tokens=data["tokens"],
            tokens_per_param=data["tokens_per_param"],
            lr=data["lr"],
            lr_at_edge=data["lr_at_edge"],
            shapes=tuple(ShapeResult.from_json(s) for s in data["shapes"]),
            lowest=data["lowest"],
            best_nonmonotone=data["best_nonmonotone"],
            best_monotone=data["best_monotone"],
            nonmonotone_vs_monotone=PairedDifference.from_json(data["nonmonotone_vs_monotone"]),
            fit=BestRatioFit.from_json(data["fit"]),
            run_s=data["run_s"],
            report=data["report"],
        )


@dataclass(frozen=True)
class ShapesReport:
    """The study's report.json: how it was produced, its points and its figure."""

    meta: ScalingMeta
    points: tuple[ShapesRow, ...]  # the points done, in the plan's order
    plot: str | None  # shapes.png (None: no point done)

    def to_json(self) -> dict[str, Any]:
        return {
            "meta": {**self.meta.to_json(), "plot": self.plot},
            "points": [p.to_json() for p in self.points],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShapesReport:
        meta = data["meta"]
        points = tuple(ShapesRow.from_json(p) for p in data["points"])
        return cls(ScalingMeta.from_json(meta), points, meta.get("plot"))


@dataclass(frozen=True)
class ShapesReading:
    """What one point's per-seed losses say (`read_losses`)."""

    means: dict[str, float]  # taper -> mean loss over the seeds every allocation has
    lowest: str  # the allocation with the lowest mean
    best_nonmonotone: str
    best_monotone: str  # uniform included
    nonmonotone_vs_monotone: PairedDifference  # best_nonmonotone's minus best_monotone's
    fit: BestRatioFit  # the best x on the axis


def read_losses(losses: Mapping[str, Mapping[int, float]]) -> ShapesReading:
    """The reading of {taper: {seed: val loss}} (tapers as the report writes them): means over
    the seeds every allocation has (the pairing the differences use), the lowest overall, the
    best non-monotone and best monotone allocations and their paired difference, and the best
    x on the axis fitted over those seeds. ValueError without a shared seed, or without a
    monotone and a non-monotone allocation."""
    common = sorted(set.intersection(*(set(v) for v in losses.values()))) if losses else []
    if not common:
        raise ValueError("reading shapes needs a seed every allocation has")
    shared = {t: {s: float(v[s]) for s in common} for t, v in losses.items()}
    means = {t: sum(v.values()) / len(v) for t, v in shared.items()}
    nonmono = [t for t in means if not is_monotone(t)]
    mono = [t for t in means if is_monotone(t)]
    if not nonmono or not mono:
        raise ValueError("reading shapes needs a monotone and a non-monotone allocation")
    best_non = min(nonmono, key=means.__getitem__)
    best_mono = min(mono, key=means.__getitem__)
    axis = {s: {x: shared[t][s] for t in shared if (x := axis_of(t)) is not None} for s in common}
    return ShapesReading(
        means=means,
        lowest=min(means, key=means.__getitem__),
        best_nonmonotone=best_non,
        best_monotone=best_mono,
        nonmonotone_vs_monotone=paired_difference(shared[best_non], shared[best_mono]),
        fit=fit_best_ratio(axis),
    )


def shapes_row(point: ShapesPoint, report: ComparisonReport) -> ShapesRow:
    """One point's reading from its comparison's report."""
    allocs = [a for a in report.summary.allocations if a.per_seed]
    reading = read_losses(
        {a.taper: {int(s): r.val_loss for s, r in a.per_seed.items()} for a in allocs}
    )
    shapes = tuple(
        ShapeResult(
            taper=a.taper,
            x=axis_of(a.taper),
            widths=tuple(a.widths),
            baseline_width=a.baseline_width,
            mean_loss=reading.means[a.taper],
            diff=None if a.diff_vs_uniform is None else a.diff_vs_uniform.val_loss,
        )
        for a in allocs
    )
    tuning = report.summary.lr_tuning
    params = allocs[0].params
    return ShapesRow(
        point=point.key,
        size=point.size,
        preset=point.preset,
        params=params,
        tokens=report.meta.settings.tokens,
        tokens_per_param=report.meta.settings.tokens / params,
        lr=tuning.chosen_lr["uniform"] if tuning else None,
        lr_at_edge=uniform_lr_at_edge(tuning),
        shapes=shapes,
        lowest=reading.lowest,
        best_nonmonotone=reading.best_nonmonotone,
        best_monotone=reading.best_monotone,
        nonmonotone_vs_monotone=reading.nonmonotone_vs_monotone,
        fit=reading.fit,
        run_s=run_seconds(report),
        report=f"{point.key}/report.md",
    )


def write_shapes_report(
    points: list[tuple[ShapesPoint, Any]],
    reports: Mapping[str, ComparisonReport],
    out: Path,
    meta: ScalingMeta,
) -> ShapesReport:
    """report.json, report.md and shapes.png of the points done (`reports`) in `out`."""
    rows = [shapes_row(p, reports[p.key]) for p, _ in points if p.key in reports]
    plot = None
    if rows:
        plot_shapes(rows, out / SHAPES_PLOT)
        plot = SHAPES_PLOT
    report = ShapesReport(meta, tuple(rows), plot)
    write_record(out / REPORT_FILE, report)
    atomic_write_text(out / "report.md", shapes_markdown(report))
    return report


def _diff(d: PairedDifference) -> str:
    return diff_ci(d, ".4f")


def shapes_table(rows: tuple[ShapesRow, ...] | list[ShapesRow], link: bool = True) -> list[str]:
    """Per point: each allocation's loss against uniform, the lowest, the fitted best x and the
    best non-monotone against the best monotone (`link`: each point links to its report)."""
    tapers = [s.taper for s in rows[0].shapes] if rows else []
    header = ["point", "tokens/param", "lr", *(f"`{t}`" for t in tapers)]
    header += ["lowest", "fitted best x [95%]", "best non-monotone - best monotone"]
    body = []
    for r in rows:
        by = {s.taper: s for s in r.shapes}
        cells = []
        for t in tapers:
            s = by.get(t)
            cells.append(
                "-" if s is None else f"{s.mean_loss:.4f}" if s.diff is None else _diff(s.diff)
            )
        fit = r.fit
        best = "-" if fit.best is None else f"{fit.best:+.2f}"
        if fit.ci is not None:
            best += f" [{fit.ci[0]:+.2f}, {fit.ci[1]:+.2f}]"
        name = f"[{r.point}]({r.report})" if link else r.point
        lr = "-" if r.lr is None else f"{r.lr:g}" + (" (edge)" if r.lr_at_edge else "")
        vs = f"`{r.best_nonmonotone}` - `{r.best_monotone}`: {_diff(r.nonmonotone_vs_monotone)}"
        body.append([name, f"{r.tokens_per_param:.1f}", lr, *cells, f"`{r.lowest}`", best, vs])
    return md_table(header, body)


def shapes_markdown(report: ShapesReport) -> str:
    """report.md: the table, how to read it, the figure."""
    meta = report.meta
    lines = [
        "# Shapes beyond monotone: `taperlm compare --paper shapes`",
        "",
        *produced_by(meta.command),
        f"Written {meta.created}; {meta.done} of {meta.total} points done. Each allocation's cell: its validation loss "
        "minus uniform's, mean over seeds with the paired 95% t interval (uniform's column: its "
        "own loss). x is the signed strength on the middle-contrast axis (bell x above 0, "
        "hourglass -x below, uniform 0); the fitted best x is the vertex of the local parabola "
        "with a bootstrap interval over seeds (at an end of the axis it is a bound).",
        "",
        *shapes_table(report.points),
    ]
    if report.plot:
        lines += [
            "",
            f"![the shapes' width profiles per point, the lowest-loss bold]({report.plot})",
        ]
    return "\n".join(lines) + "\n"


def plot_shapes(rows: list[ShapesRow], path: Path) -> Path:
    """One panel per point: every allocation's width per layer over the baseline, the
    lowest-loss allocation bold and named with its difference from uniform."""
    fig, axes = _figure(ncols=len(rows), width=4.6 * len(rows), height=4.0)
    for ax, r in zip(axes, rows):
        for s in r.shapes:
            ratio = [w / s.baseline_width for w in s.widths]
            best = s.taper == r.lowest
            diff = "" if s.diff is None or s.diff.mean is None else f" ({s.diff.mean:+.4f})"
            ax.plot(
                range(len(ratio)),
                ratio,
                marker="o",
                markersize=3 if not best else 5,
                linewidth=3.0 if best else 1.0,
                alpha=1.0 if best else 0.45,
                label=f"{s.taper}{diff}" + (" lowest" if best else ""),
            )
        ax.axhline(1.0, color="0.3", linestyle="--", linewidth=1.0)
        ax.set_title(f"{r.point} ({r.tokens_per_param:.0f} tokens/param)", fontsize="medium")
        ax.set_xlabel("layer (0 = first)")
        ax.set_ylabel("MLP width / uniform's")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    fig.suptitle("Shapes per point (loss minus uniform's in brackets)")
    return _save(fig, path)

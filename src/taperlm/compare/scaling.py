"""`taperlm compare --paper scaling`: how the best taper ratio moves with model size and tokens.

The cosine ratio sweep (uniform and cosine START:2-START for SCALING_STARTS) is run at every
(size, token budget) of the plan: each point is a complete `taperlm compare` in
OUT/<size>-<tokens>/ (resumable, reproducible on its own with the command its report names), with
`--tune-lr --tune-lr-scope uniform`: the point's uniform model is tuned over the lr grid on tuning
seeds and every ratio trains at that lr (each size at its tuned lr, without tuning every ratio).

Per point, the best ratio is fitted with a bootstrap interval (`fit_best_ratio`): the seeds are
resampled with replacement (a seed keeps all its allocations, so the pairing survives), and the
resample's best ratio is the vertex of the parabola through its lowest-loss swept ratio and that
ratio's two neighbours (`local_parabola`); the point estimate uses all seeds, the interval is the
2.5-97.5 percentile range. Local, because losses over the whole sweep need not be a parabola (they
can fall steeply and then flatten). An optimum beyond either end of the sweep clips to that end;
the fraction of resamples at each end is reported (`at_upper_edge`: the steepest start swept,
`at_lower_edge`: the lowest, uniform's 1.0 unless inverse tapers are swept), because then the
interval is a bound, not an interval.

OUT/report.md, report.json and scaling.png put the points together: best ratio against
parameters (one line per token budget) and against tokens per parameter, beside the paper's 440M
point (1.5 -> 0.5 at 30B tokens)."""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from taperlm.analysis.plots import _figure, _save
from taperlm.analysis.stats import PairedDifference
from taperlm.compare.grid import PAPER_POINT
from taperlm.compare.options import list_text, run_arguments
from taperlm.compare.recipe import PAPER_TOKENS
from taperlm.compare.report import diff_ci, md_table, produced_by
from taperlm.compare.results import REPORT_FILE, ComparisonReport, LrTuning, write_record
from taperlm.compare.study import Part, StudyPlan, StudyProgress, run_plan
from taperlm.config.presets import PAPER_SHAPES, SMALL_SHAPES
from taperlm.errors import ConfigError
from taperlm.files.io import atomic_write_text

# Start ratios of the cosine sweep (end = 2 - start); 1.0 is uniform.
SCALING_STARTS = (1.25, 1.5, 1.75, 1.9)
BOOTSTRAP = 2000
BOOTSTRAP_SEED = 0
SCALING_PLOT = "scaling.png"


@dataclass(frozen=True)
class Parabola:
    """The local parabola a best ratio is the vertex of (`local_parabola`)."""

    starts: tuple[float, ...]  # the three swept starts it goes through
    coefficients: tuple[float, ...]  # a, b, c of a x^2 + b x + c

    def to_json(self) -> dict[str, Any]:
        return {"starts": list(self.starts), "coefficients": list(self.coefficients)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Parabola:
        return cls(tuple(data["starts"]), tuple(data["coefficients"]))


@dataclass(frozen=True)
class BestRatioFit:
    """The best start ratio of one point (`fit_best_ratio`): report.json's `fit` of a point."""

    best: float | None  # the local parabola's vertex on all seeds (None: no complete seed)
    ci: tuple[float, float] | None  # 2.5-97.5 percentiles over the resamples (None: < 2 seeds)
    at_upper_edge: float | None  # share of resamples at the steepest start swept
    # share of resamples at the lowest start swept (None also in reports written before it was)
    at_lower_edge: float | None
    lowest: float | None  # the swept start with the lowest mean loss (None: no complete seed)
    lowest_share: dict[str, float] | None  # start (as "%g") -> share of resamples lowest there
    n_seeds: int  # the complete seeds fitted
    starts: tuple[float, ...]  # the starts swept, ascending (1.0 = uniform; empty: not recorded)
    mean_loss: tuple[float, ...] | None = None  # mean loss per start (None: no complete seed)
    parabola: Parabola | None = None  # the parabola on all seeds (None: no complete seed)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "best": self.best,
            "ci": None if self.ci is None else list(self.ci),
            "at_upper_edge": self.at_upper_edge,
            "at_lower_edge": self.at_lower_edge,
            "lowest": self.lowest,
            "lowest_share": self.lowest_share,
            "n_seeds": self.n_seeds,
            "starts": list(self.starts),
        }
        if self.mean_loss is not None:
            out["mean_loss"] = list(self.mean_loss)
        if self.parabola is not None:
            out["parabola"] = self.parabola.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BestRatioFit:
        """`to_json`'s object; `lowest`, `lowest_share` and `at_lower_edge` may be missing
        (reports written before they were) and read as None, `starts` as none recorded."""
        ci, mean_loss, parabola = data["ci"], data.get("mean_loss"), data.get("parabola")
        return cls(
            best=data["best"],
            ci=None if ci is None else (ci[0], ci[1]),
            at_upper_edge=data["at_upper_edge"],
            at_lower_edge=data.get("at_lower_edge"),
            lowest=data.get("lowest"),
            lowest_share=data.get("lowest_share"),
            n_seeds=data["n_seeds"],
            starts=tuple(data.get("starts") or ()),
            mean_loss=None if mean_loss is None else tuple(mean_loss),
            parabola=None if parabola is None else Parabola.from_json(parabola),
        )


@dataclass(frozen=True)
class ScalingMeta:
    """How a scaling report was produced: report.json's `meta` (`to_json` writes it, the
    paper's point and the figure's name after it)."""

    command: str  # the command that reproduces the sweep
    mode: str  # the --paper mode: scaling | tokens | ratios | shapes
    wall_s: float  # seconds of this invocation
    created: str  # when it was written
    done: int  # points done
    total: int  # points planned

    def to_json(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "mode": self.mode,
            "wall_s": self.wall_s,
            "created": self.created,
            "done": self.done,
            "total": self.total,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScalingMeta:
        """`to_json`'s object; a report written before `mode` was recorded is `--paper
        scaling`'s (the only mode then)."""
        return cls(
            data["command"],
            data.get("mode", "scaling"),
            data["wall_s"],
            data["created"],
            data["done"],
            data["total"],
        )


@dataclass(frozen=True)
class ScalingPoint:
    """One point of a scaling sweep as its report gives it: report.json's entry of `points`
    (`to_json` writes it, field for field and in that order)."""

    point: str  # its key, <size>-<tokens> (its folder)
    size: str  # the size's name
    preset: str  # the preset the size starts from
    params: int  # parameters
    tokens: int  # training tokens per run (rounded up to whole steps)
    tokens_per_param: float  # tokens / params
    lr: float | None  # uniform's tuned lr (None: not tuned)
    lr_at_edge: bool | None  # the tuned lr is at the grid's edge (None: not tuned)
    diffs: dict[
        str, PairedDifference | None
    ]  # taper -> its val loss minus uniform's (uniform: None)
    fit: BestRatioFit  # the fitted best ratio
    wall_s: float  # the point's wall seconds in the invocation that reported it
    run_s: float | None  # its runs' own seconds (None: a report written before it was recorded)
    report: str  # its report.md, relative to the sweep's folder

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
            "diffs": {t: None if d is None else d.to_json() for t, d in self.diffs.items()},
            "fit": self.fit.to_json(),
            "wall_s": self.wall_s,
            "run_s": self.run_s,
            "report": self.report,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScalingPoint:
        return cls(
            point=data["point"],
            size=data["size"],
            preset=data["preset"],
            params=data["params"],
            tokens=data["tokens"],
            tokens_per_param=data["tokens_per_param"],
            lr=data["lr"],
            lr_at_edge=data["lr_at_edge"],
            diffs={
                t: None if d is None else PairedDifference.from_json(d)
                for t, d in data["diffs"].items()
            },
            fit=BestRatioFit.from_json(data["fit"]),
            wall_s=data["wall_s"],
            run_s=data.get("run_s"),
            report=data["report"],
        )


@dataclass(frozen=True)
class ScalingReport:
    """A scaling sweep's report.json: how it was produced, its points and its figure."""

    meta: ScalingMeta
    points: tuple[ScalingPoint, ...]  # the points done, in the plan's order
    plot: str | None  # scaling.png (None: no point has a best ratio to draw)

    def to_json(self) -> dict[str, Any]:
        """report.json's object (its meta also names the paper's point it compares with)."""
        meta = {**self.meta.to_json(), "paper_point": PAPER_POINT.to_json(), "plot": self.plot}
        return {"meta": meta, "points": [p.to_json() for p in self.points]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScalingReport:
        meta = data["meta"]
        points = tuple(ScalingPoint.from_json(p) for p in data["points"])
        return cls(ScalingMeta.from_json(meta), points, meta.get("plot"))


@dataclass(frozen=True)
class ScalingSize:
    """One model size: a name, the preset it starts from and --set overrides on top."""

    name: str
    preset: str
    overrides: tuple[str, ...] = ()
    tokens: tuple[int, ...] = ()  # empty: the plan's token budgets
    multiple_of: int | None = None  # the tapers' width step at this size (None: --multiple-of)


@dataclass
class ScalingPlan:
    """The sizes x token budgets of a scaling sweep and its ratios."""

    sizes: list[ScalingSize]
    tokens: list[int]
    starts: tuple[float, ...] = SCALING_STARTS
    extra_overrides: list[str] = field(default_factory=list)


# Sized for ~3.3 hours on 2 idle cores (measured; docs/compare.md, "--paper scaling"): 3 sizes
# spanning ~6x in parameters (micro 1.1M, tiny 1.7M, small 6.1M at the 2,048-token vocabulary), two token
# budgets each, 5 allocations x 5 seeds (options.PAPER_MODE_SEEDS) + 4 tuning lrs x 2 seeds per
# point: 33 runs per point, 198 in all.
DEFAULT_PLAN = ScalingPlan(
    sizes=[
        ScalingSize("micro", "transformer-micro"),
        ScalingSize("tiny", "transformer-tiny"),
        ScalingSize("small", "transformer-small"),
    ],
    tokens=[163_840, 327_680],
)


def plan_for(opts, default: ScalingPlan = DEFAULT_PLAN) -> ScalingPlan:
    """--preset-size LIST (e.g. 440m,760m,1.3b: the paper's sizes, each at half and all of the
    paper's tokens for it, trained with the paper's recipe), else `default`."""
    if not opts.preset_size:
        return default
    sizes = []
    for name in opts.preset_size:
        if name in PAPER_SHAPES:
            budget = PAPER_TOKENS[name]
            sizes.append(ScalingSize(name, f"transformer-{name}", tokens=(budget // 2, budget)))
        elif name in SMALL_SHAPES:
            sizes.append(ScalingSize(name, f"transformer-{name}"))
        elif name:
            known = ", ".join([*SMALL_SHAPES, *PAPER_SHAPES])
            raise ConfigError(f"--preset-size: unknown size {name!r}; choose from {known}")
    return dataclasses.replace(default, sizes=sizes)


def tapers(starts: tuple[float, ...]) -> str:
    """The sweep's --tapers list, in order of start ratio with uniform at 1.0 (first unless
    inverse tapers are swept): `--stop-on best` weighs the best against its neighbours in this
    list, which must be its neighbours on the ratio axis."""
    return ";".join(sweep_taper(s) for s in sorted([1.0, *starts]))


def sweep_taper(start: float) -> str:
    """The sweep's allocation at `start` as it is written (--tapers, the scaling report's
    `diffs` keys): cosine from `start` to 2 - start, uniform at 1.0."""
    return "uniform" if start == 1.0 else f"cosine:{start:g}:{2 - start:g}"


def refuse_point_settings(opts, sizes: list[str]) -> None:
    """A study of points (a preset at a token budget each, uniform's lr tuned at each) sets the
    model, the allocations, the budgets and the tuning itself: ConfigError naming the option
    given that would change one (`sizes`: the study's size names, for the message)."""
    mode = f"--paper {opts.paper or 'scaling'}"
    if opts.preset or opts.config:
        raise ConfigError(
            f"{mode} builds its sizes from presets ({', '.join(sizes)}); give no --preset/--config"
        )
    if opts.tapers or opts.taper_list:
        raise ConfigError("give either --paper MODE or --tapers/--taper, not both")
    if opts.tokens is not None:
        raise ConfigError(f"{mode} sets the token budgets itself; give no --tokens")
    if opts.families:
        raise ConfigError("--families belongs to --paper families")
    if opts.tune_scope == "each":
        raise ConfigError(
            f"{mode} tunes each point's uniform lr (--tune-lr-scope uniform); "
            "--tune-lr-scope each would train every allocation at every lr"
        )


def point_options(opts, plan: ScalingPlan) -> list[tuple[str, ScalingSize, int, Any]]:
    """(key, size, tokens, CompareOptions) of every point of the sweep."""
    refuse_point_settings(opts, [s.name for s in plan.sizes])
    # 2.0 -> 0.0 is the steepest: its last layer has no MLP (a zero width, docs/tapers.md);
    # a start below 1 is an inverse taper (width growing with depth), 0.0 -> 2.0 the mirror
    if any(not 0.0 <= s <= 2.0 or s == 1.0 for s in plan.starts) or len(plan.starts) < 2:
        raise ConfigError(
            "a scaling sweep needs >= 2 start ratios in [0, 2] other than 1 (uniform, always swept)"
        )
    if not plan.sizes or not plan.tokens or min(plan.tokens) < 1:
        raise ConfigError("a scaling sweep needs >= 1 size and token budgets >= 1")
    out = []
    for size in plan.sizes:
        for tokens in size.tokens or plan.tokens:
            key = f"{size.name}-{tokens}"
            sub = dataclasses.replace(
                opts,
                out=opts.out / key,
                preset=size.preset,
                paper=None,
                tapers=tapers(plan.starts),
                tokens=tokens,
                # the size's own settings win: a --set cannot collapse two sizes into one
                overrides=[*opts.overrides, *plan.extra_overrides, *size.overrides],
                tune_lr=True,
                tune_scope="uniform",
                preset_size=None,
                # each point stops on its own question: the comparisons its best ratio rests
                # on (it vs uniform and vs its neighbouring ratios; taperlm.compare.sequential)
                stop_on="best",
                multiple_of=size.multiple_of or opts.multiple_of,
            )
            out.append((key, size, tokens, sub))
    return out


def scaling_plan(opts, plan: ScalingPlan | None = None) -> StudyPlan:
    """The scaling study (`--paper scaling`): every point of `plan` (None: `DEFAULT_PLAN`) at
    the sizes of --preset-size, if given (`plan_for`), as `sweep_plan` runs them."""
    return sweep_plan(opts, plan_for(opts, plan or DEFAULT_PLAN))


def sweep_plan(
    opts,
    plan: ScalingPlan,
    mode: str = "scaling",
    on_report: Callable[[ScalingReport, Path], None] | None = None,
) -> StudyPlan:
    """A ratio sweep: every point of `plan` one after the other, the scaling report (of the
    --paper `mode`) rewritten after each (then `on_report(report, folder)`: a mode that builds on
    this one, `taperlm.compare.longrun`, adds its own report from the points in memory)."""
    points = point_options(opts, plan)

    def report(done: StudyProgress) -> tuple[Path, Path]:
        meta = ScalingMeta(
            command=study_command(opts, points[0][3], mode),
            mode=mode,
            wall_s=done.wall(),
            created=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            done=len(done.reports),
            total=done.total,
        )
        report = write_scaling_report(points, done.reports, opts.out, meta)
        if on_report is not None:
            on_report(report, opts.out)
        return opts.out / "report.md", opts.out / REPORT_FILE

    parts = [
        Part(key, sub, "point", f"{size.name} ({size.preset}), {tokens:,} tokens,")
        for key, size, tokens, sub in points
    ]
    return StudyPlan(parts, report, mode=mode, folder="scaling folder")


def run_scaling(opts, plan: ScalingPlan | None = None) -> tuple[Path, Path]:
    """Run the scaling study of `plan` (None: as `--paper scaling` does); returns (report.md,
    report.json). The Python API for a plan of one's own (e.g. toy sizes)."""
    return run_plan(opts, lambda o: scaling_plan(o, plan))


def study_command(opts, sub, mode: str = "scaling", stop_on: str = "best") -> str:
    """The command that reproduces a study of points (`sub`: a point's options, for its seeds):
    --paper MODE with the options given, the ones each point sets (tuning, `stop_on`) named."""
    parts = ["taperlm", "compare", "--paper", mode]
    if opts.preset_size:
        parts += ["--preset-size", list_text(opts.preset_size)]
    args = run_arguments(
        dataclasses.replace(opts, tune_lr=True, tune_scope="uniform", stop_on=stop_on), 0, 0
    )
    args = args[4:]  # --seeds/--tokens belong to the points; the seeds follow:
    return shlex.join([*parts, "--seeds", str(sub.seeds), *args])


# ----------------------------------------------------------------------------------------------
# the fit


def local_parabola(x: np.ndarray, means: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(vertex, coefficients, the three starts): the parabola through the swept start with the
    lowest mean loss and its two neighbours (at an end of the sweep: the three at that end);
    its vertex clipped to the swept range, or the lowest of the three when the parabola opens
    downward (no minimum between them)."""
    i = min(max(int(np.argmin(means)), 1), len(x) - 2)
    xs, ys = x[i - 1 : i + 2], means[i - 1 : i + 2]
    coef = np.polyfit(xs, ys, 2)
    if coef[0] <= 0:
        return float(xs[int(np.argmin(ys))]), coef, xs
    return float(np.clip(-coef[1] / (2 * coef[0]), x[0], x[-1])), coef, xs


def fit_best_ratio(
    losses: dict[int, dict[float, float]],
    n_boot: int = BOOTSTRAP,
    seed: int = BOOTSTRAP_SEED,
) -> BestRatioFit:
    """Best start ratio of one point from per-seed losses {seed: {start: loss}} (start 1.0 =
    uniform): the vertex of `local_parabola` through the per-start mean losses, on all seeds
    (`best`) and per bootstrap resample of seeds (`ci`: 2.5-97.5 percentiles; `at_upper_edge`:
    the fraction of resamples whose best is the steepest start, i.e. the optimum at or beyond
    the sweep; `at_lower_edge`: the same at the lowest start swept, uniform's 1.0 or an inverse
    taper's, the optimum at or below it). Local, because the losses over the whole range are no parabola: they can fall
    steeply and then flatten, and a quadratic through all of them puts its minimum at the edge
    however flat the end. Beside the fit, what was measured: `lowest`, the swept start with the
    lowest mean loss, and `lowest_share`, {start: the fraction of resamples in which it has the
    lowest mean loss}."""
    seeds = sorted(s for s, row in losses.items() if row)
    starts = sorted({r for s in seeds for r in losses[s]})
    if len(starts) < 3:
        raise ValueError("fitting a best ratio needs >= 3 ratios")
    seeds = [s for s in seeds if all(r in losses[s] for r in starts)]  # complete seeds only
    if not seeds:
        return BestRatioFit(None, None, None, None, None, None, 0, tuple(starts))
    table = np.array([[losses[s][r] for r in starts] for s in seeds])  # seeds x starts
    x = np.array(starts)
    means = table.mean(axis=0)
    best, coef, used = local_parabola(x, means)
    ci = upper = lower = share = None
    if len(seeds) >= 2:
        rng = np.random.default_rng(seed)
        picks = rng.integers(0, len(seeds), size=(n_boot, len(seeds)))
        boots = np.array([local_parabola(x, table[p].mean(axis=0))[0] for p in picks])
        ci = (float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5)))
        upper = float(np.mean(boots >= x[-1] - 1e-9))
        lower = float(np.mean(boots <= x[0] + 1e-9))
        lowest = np.argmin(table[picks].mean(axis=1), axis=1)  # resamples x starts -> index
        share = {f"{r:g}": float(np.mean(lowest == i)) for i, r in enumerate(starts)}
    return BestRatioFit(
        best=best,
        ci=ci,
        at_upper_edge=upper,
        at_lower_edge=lower,
        lowest=starts[int(np.argmin(means))],
        lowest_share=share,
        n_seeds=len(seeds),
        starts=tuple(starts),
        mean_loss=tuple(float(v) for v in means),
        parabola=Parabola(tuple(float(v) for v in used), tuple(float(c) for c in coef)),
    )


def point_losses(
    report: ComparisonReport, starts: dict[str, float]
) -> dict[int, dict[float, float]]:
    """{seed: {start: val loss}} from one point's report (`starts`: allocation name -> its
    start ratio, from the point's parsed allocations)."""
    out: dict[int, dict[float, float]] = {}
    for a in report.summary.allocations:
        start = starts[a.name]
        for seed, run in a.per_seed.items():
            out.setdefault(int(seed), {})[start] = run.val_loss
    return out


# ----------------------------------------------------------------------------------------------
# the report


def write_scaling_report(
    points, reports: dict[str, ComparisonReport], out: Path, meta: ScalingMeta
) -> ScalingReport:
    """report.json, report.md and scaling.png of the points done (`reports`) in `out`."""
    rows = []
    for key, size, _, sub in points:
        report = reports.get(key)
        if report is None:
            continue
        params = report.summary.allocations[0].params
        tokens = report.meta.settings.tokens  # rounded up to whole steps
        tuning = report.summary.lr_tuning
        fit = fit_best_ratio(point_losses(report, {a.name: a.start_ratio for a in sub.tapers}))
        rows.append(
            ScalingPoint(
                point=key,
                size=size.name,
                preset=size.preset,
                params=params,
                tokens=tokens,
                tokens_per_param=tokens / params,
                lr=tuning.chosen_lr["uniform"] if tuning else None,
                lr_at_edge=uniform_lr_at_edge(tuning),
                diffs={
                    a.taper: a.diff_vs_uniform and a.diff_vs_uniform.val_loss
                    for a in report.summary.allocations
                },
                fit=fit,
                wall_s=report.meta.wall_s,
                run_s=run_seconds(report),
                report=f"{key}/report.md",
            )
        )
    plot = None
    if any(r.fit.best is not None for r in rows):
        plot_scaling(rows, out / SCALING_PLOT)
        plot = SCALING_PLOT
    report = ScalingReport(meta, tuple(rows), plot)
    write_record(out / REPORT_FILE, report)
    atomic_write_text(out / "report.md", _markdown(rows, meta, plot))
    return report


def uniform_lr_at_edge(tuning: LrTuning | None) -> bool | None:
    """Whether uniform's tuned lr is at its grid's edge (None: not tuned)."""
    curve = None if tuning is None else tuning.curves.get("uniform")
    return None if curve is None else curve.at_edge


def points_table(rows: list[ScalingPoint], link: bool = True) -> list[str]:
    """The markdown table of the points (`link`: each point links to its own report; the docs
    copy the table without links). The share of resamples at the lowest start swept is a column
    when a fit reports it (reports written before `at_lower_edge` existed keep their table)."""
    tapers_seen = list(rows[0].diffs) if rows else []
    lower = any(r.fit.at_lower_edge is not None for r in rows)
    head = ["point", "params", "tokens", "tokens/param", "uniform's tuned lr"]
    head += [f"Δ {t} [95% CI]" for t in tapers_seen if t != "uniform"]
    head += ["best start ratio [95% bootstrap]", "resamples at the steepest"]
    head += ["resamples at the lowest start"] if lower else []
    head += ["lowest measured loss at (share of resamples)"]
    table = []
    for r in rows:
        f = r.fit
        best = "–" if f.best is None else f"{f.best:.2f}"
        if f.ci:
            best += f" [{f.ci[0]:.2f}, {f.ci[1]:.2f}]"
        edge = _share(f.at_upper_edge)
        low = _lowest(f)
        lr = "–" if r.lr is None else f"{r.lr:g}" + (" (edge)" if r.lr_at_edge else "")
        table.append(
            [
                f"[{r.point}]({r.report})" if link else r.point,
                f"{r.params:,}",
                f"{r.tokens:,}",
                f"{r.tokens_per_param:.3f}",
                lr,
                *(diff_ci(r.diffs[t], ".4f") for t in tapers_seen if t != "uniform"),
                best,
                edge,
                *([_share(f.at_lower_edge)] if lower else []),
                low,
            ]
        )
    return md_table(head, table)


def _share(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def _lowest(fit: BestRatioFit) -> str:
    """ "1.75 (52%), 1.9 (48%)": the swept starts that had the lowest mean loss in >= 10% of
    the resamples, most often first (without resamples: the lowest on all seeds)."""
    if fit.lowest is None:
        return "–"
    shares = fit.lowest_share
    if not shares:
        return f"{fit.lowest:g}"
    top = sorted(((v, k) for k, v in shares.items() if v >= 0.1), reverse=True)
    return ", ".join(f"{k} ({100 * v:.0f}%)" for v, k in top)


def run_seconds(report: ComparisonReport) -> float:
    """A point's training + evaluation seconds, tuning runs included, as each run recorded
    them (unlike the invocation's wall time, a rerun that trains nothing keeps it)."""
    tuning = report.summary.lr_tuning
    if tuning is not None:
        cost = tuning.cost
        return float(cost.tuning_s + (cost.tuned_s or 0.0) + (cost.reported_s or 0.0))
    return float(sum(report.summary.run_times.values()))


def _markdown(rows: list[ScalingPoint], meta: ScalingMeta, plot: str | None) -> str:
    title = f"# taperlm compare — paper {meta.mode}: the best cosine ratio against size and tokens"
    if meta.done < meta.total:
        title += f" (PARTIAL: {meta.done}/{meta.total} points done)"
    lines = [
        title,
        "",
        *produced_by(meta.command),
        f"{meta.done}/{meta.total} points, {meta.wall_s / 60:.1f} min this invocation; "
        f"the runs' own time (training + evaluation of every run and tuning run, as each "
        f"recorded it): {sum(r.run_s or 0.0 for r in rows) / 3600:.2f} core-hours; {meta.created}",
        "",
        *points_table(rows),
        "",
        "Δ = cosine START:2−START minus uniform, paired over seeds (95% t interval). Best start "
        "ratio: the vertex of the parabola through the swept ratio with the lowest mean loss and "
        "its two neighbours (uniform = 1.0), within the swept range; interval: 2.5–97.5 "
        f"percentiles over {BOOTSTRAP} bootstrap resamples of the seeds. When many resamples put "
        "the best at the steepest ratio, the optimum lies at or beyond it; at the lowest start "
        "swept (uniform, or an inverse taper's start below 1), at or below that. Lowest measured loss: "
        "the swept ratios with the lowest mean loss, each with the share of resamples in which it "
        "is lowest (≥ 10% shown). The paper's point: 440M parameters, 30B tokens "
        "(68 tokens/param), best 1.5→0.5.",
        "",
    ]
    if plot:
        lines += [f"![best ratio against scale]({plot})", ""]
    return "\n".join(lines)


def lowest_start(rows: list[ScalingPoint]) -> float:
    """The lowest start any point swept (1.0, uniform, unless inverse tapers were swept): the
    bottom of the best-ratio axis."""
    starts = [min(r.fit.starts or (1.0,)) for r in rows]
    return min([1.0, *starts])


def plot_scaling(rows: list[ScalingPoint], path: Path) -> None:
    """Best start ratio (bootstrap interval) against parameters, one line per token budget, and
    against tokens per parameter; the paper's 440M point on both."""
    fig, axes = _figure(2, width=12.0)
    budgets = sorted({r.tokens for r in rows})
    for ax, xkey, xlabel in (
        (axes[0], "params", "parameters"),
        (axes[1], "tokens_per_param", "training tokens per parameter"),
    ):
        for i, tokens in enumerate(budgets):
            # sorted by x alone: two points at one x keep their order (fits do not compare)
            pts = sorted(
                ((getattr(r, xkey), r.fit) for r in rows if r.tokens == tokens and r.fit.best),
                key=lambda p: p[0],
            )
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ys = [p[1].best for p in pts]
            err = [
                [y - (f.ci or (y, y))[0] for (_, f), y in zip(pts, ys)],
                [(f.ci or (y, y))[1] - y for (_, f), y in zip(pts, ys)],
            ]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, color=f"C{i}",
                        label=f"{tokens:,} tokens/run: fitted best")  # fmt: skip
            lows = [(x, f.lowest) for x, (_, f) in zip(xs, pts) if f.lowest is not None]
            if lows:
                ax.plot([x for x, _ in lows], [y for _, y in lows], marker="s", fillstyle="none",
                        markersize=9, linestyle="none", color=f"C{i}",
                        label=f"{tokens:,} tokens/run: lowest measured")  # fmt: skip
        px = PAPER_POINT.params if xkey == "params" else PAPER_POINT.tokens / PAPER_POINT.params
        ax.plot([px], [PAPER_POINT.best_start], marker="*", markersize=14, color="k",
                linestyle="none", label="paper, 440M / 30B tokens")  # fmt: skip
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("best cosine start ratio (end = 2 − start)")
        ax.set_ylim(lowest_start(rows) - 0.05, 2.0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[0].set_title("Best taper ratio against model size")
    axes[1].set_title("... against tokens per parameter")
    _save(fig, path)

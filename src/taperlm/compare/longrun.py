"""`taperlm compare --paper tokens` and `--paper ratios`: does the taper's advantage survive long
training, and where is the best ratio at the paper's 68 tokens per parameter?

Both are `--paper scaling` sweeps (`taperlm.compare.scaling`: every point a complete, resumable
`taperlm compare` in OUT/<size>-<tokens>/ with uniform's lr tuned at that point, the cosine ratio
sweep at that lr, the best ratio fitted with its bootstrap interval), over other points:

- `tokens`: the token axis. nano (0.27M parameters, bpe:512) at 0.5, 2, 8, 32 and 68 tokens per
  parameter, micro (1.06M, bpe:2048) at 0.5, 2 and 10; the sweep uniform and cosine 0.5, 0.75,
  1.25, 1.5, 1.75, 1.9 (end = 2 - start; below 1 an inverse taper, width growing with depth).
  Uniform's lr is tuned per budget (the optimum lr moves with the length of training).
- `ratios`: the ratio axis past both old edges: `tokens`' sweep and cosine 1.95 and 2.0 (2.0 ->
  0.0: the last layer's MLP vanishes, a zero width) at nano 0.5, 8 and 68 and micro 0.5 and 10
  tokens per parameter. Every ratios point is a tokens point and its sweep contains tokens', so
  run after `tokens` (in a copy of its folder) it trains only 1.95 and 2.0, and a point both
  measured has one reading: the wider sweep's (`keep_widest`).

nano's widths step by 8 (`--multiple-of 8` for its points): at 16, 1.9 -> 0.1 and 1.95 -> 0.05
give the same four widths at its baseline of 176.

On top of the scaling report (OUT/report.md, report.json, scaling.png) each mode writes the
reading across tokens per parameter (`write_trend_report`): OUT/trend.md and trend.json with, per
point, the difference at 1.5 -> 0.5, at the best measured ratio and the fitted best ratio; the
figures advantage.png (difference against tokens per parameter, one line per size, the paper's
440M point: 16.28 -> 14.44 perplexity at 68 tokens per parameter) and best_ratio.png; and the
trend of each fitted per size (y = a + b log10(tokens/param), weighted by the points' intervals)
and across sizes (y = a + b log10(tokens/param) + c log10(params)), extrapolated to the paper's
440M at 68 tokens per parameter with a parametric-bootstrap interval, or the plain reason why it
cannot be. A best ratio at either end of the sweep in most resamples (the steepest start swept,
or the lowest: uniform, or an inverse taper below it) is a bound, not an estimate: the table marks
it, the figure draws it hollow, and no best-ratio trend goes through it.

The lead these modes found (a widening taper at micro) is checked once, pre-registered, by
`taperlm.compare.confirm`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from taperlm.analysis.plots import _figure, _save
from taperlm.analysis.stats import PairedDifference
from taperlm.compare.grid import PAPER_440M, PAPER_BEST, PAPER_DIFF
from taperlm.compare.options import list_text
from taperlm.compare.recipe import COMPARE_TRAIN
from taperlm.compare.report import md_table
from taperlm.compare.results import read_record, write_record
from taperlm.compare.scaling import (
    SCALING_STARTS,
    ScalingPlan,
    ScalingPoint,
    ScalingReport,
    ScalingSize,
    sweep_plan,
    sweep_taper,
)
from taperlm.compare.study import StudyPlan, run_plan
from taperlm.config.budget import total_params
from taperlm.config.presets import get_preset
from taperlm.errors import ConfigError
from taperlm.files.io import atomic_write_text

# The sizes of the long-training sweeps: preset, the vocabulary of its built-in corpus
# (`taperlm.compare.comparison.SIZE_CORPUS_TOKENIZERS`) and its width step.
SIZES = {
    "nano": ("transformer-nano", 512, 8),
    "micro": ("transformer-micro", 2048, None),
}
TOKENS_PER_PARAM = {"nano": (0.5, 2.0, 8.0, 32.0, 68.0), "micro": (0.5, 2.0, 10.0)}
RATIO_TOKENS_PER_PARAM = {"nano": (0.5, 8.0, 68.0), "micro": (0.5, 10.0)}
# Inverse tapers (width growing with depth; start < 1) below uniform in both modes: by 8 tokens
# per parameter the best start sat at uniform, the sweep's lower edge (nano-2134016: 1.00
# [1.00, 1.23]), where a sweep that stops at uniform cannot put the optimum inside its range.
INVERSE_STARTS = (0.5, 0.75)
TOKEN_STARTS = (*INVERSE_STARTS, *SCALING_STARTS)
# The ratio axis contains the token axis's sweep (so its points supersede the token axis's rows
# where both measured one, and reuse their cells) and goes past its steepest start.
RATIO_STARTS = (*TOKEN_STARTS, 1.95, 2.0)
# Each long-training mode's sweep: size -> its tokens per parameter, and the starts swept (the
# mode's own table, looked up by its name: no other module asks which mode it is).
SWEEPS: dict[str, tuple[dict[str, tuple[float, ...]], tuple[float, ...]]] = {
    "tokens": (TOKENS_PER_PARAM, TOKEN_STARTS),
    "ratios": (RATIO_TOKENS_PER_PARAM, RATIO_STARTS),
}
MODES = tuple(SWEEPS)
ALL_POINTS = "all"  # a trend report's mode when it reads every report's points together
TREND_BOOT = 4000
ADVANTAGE_PLOT = "advantage.png"
BEST_RATIO_PLOT = "best_ratio.png"
# Training speed (tokens per core-second) of one compare cell, compare's recipe, 1 torch thread:
# nano measured here as the marginal CPU time of a 307,200- against a 102,400-token run (startup
# and evaluation excluded) on the shared 2-core machine at load 8-10; micro the marginal speed of
# its `--paper scaling` runs on idle cores (docs/compare.md, "--paper tokens"). The --help
# estimates use them.
CELL_TOKENS_PER_S = {"nano": 17_520, "micro": 5_850}
TUNE_LRS, TUNE_SEEDS = 4, 2  # tuning runs per point: uniform at 4 lrs x 2 seeds (the defaults)
# A chosen lr at the grid's edge extends the grid (--lr-grid-extend) up to this many times: the
# optimum lr moves with the budget, so a grid centred on the short runs' lr may not hold it.
LONGRUN_EXTEND = 3


def budget_tokens(size: str, tokens_per_param: float) -> int:
    """Training tokens of `size` at `tokens_per_param`: parameters at its corpus's vocabulary,
    rounded to whole steps of compare's batch (at least one)."""
    preset, vocab, _ = SIZES[size]
    cfg = get_preset(preset, resolve=False)
    cfg.vocab_size = vocab
    params = total_params(cfg.resolve())
    batch = COMPARE_TRAIN.batch_tokens
    return max(1, round(tokens_per_param * params / batch)) * batch


def plan_of(mode: str, sizes: tuple[str, ...] | None = None) -> ScalingPlan:
    """The points of `mode` (tokens | ratios), at `sizes` (of nano, micro: --preset-size's;
    None: both)."""
    if mode not in MODES:
        raise ConfigError(f"--paper {mode!r}: the long-training modes are {', '.join(MODES)}")
    table, starts = SWEEPS[mode]
    names = list(sizes or SIZES)
    unknown = [n for n in names if n not in SIZES]
    if unknown or not names:
        raise ConfigError(
            f"--preset-size: --paper {mode} runs at {', '.join(SIZES)}; got {list_text(sizes)!r}"
        )
    out = []
    for name in names:
        preset, _, step = SIZES[name]
        budgets = tuple(budget_tokens(name, t) for t in table[name])
        out.append(ScalingSize(name, preset, tokens=budgets, multiple_of=step))
    every = sorted({t for s in out for t in s.tokens})
    return ScalingPlan(sizes=out, tokens=every, starts=starts)


def estimated_hours(mode: str, seeds: int = 5, cores: int = 2, after: str | None = None) -> float:
    """Hours on `cores` idle cores, estimated from the measured per-cell speed: every point
    trains (1 + starts) x seeds runs and TUNE_LRS x TUNE_SEEDS tuning runs of its tokens (the
    final validation and curve points add ~2%, left out). `after`: the other mode, run to the end
    in the folder `mode` runs in (a copy of its --out): a point both modes sweep then trains only
    the starts `after` did not, and no tuning (a cell of the same size, budget, allocation and
    seed is the same run in both modes, so the kept one is reused; `shared_points`)."""
    plan = plan_of(mode)
    done = {(size, tokens): set(starts) for size, tokens, starts in shared_points(mode, after)}
    core_s = 0.0
    for size in plan.sizes:
        for tokens in size.tokens:
            kept = done.get((size.name, tokens))
            if kept is None:
                runs = (1 + len(plan.starts)) * seeds + TUNE_LRS * TUNE_SEEDS
            else:
                runs = len(set(plan.starts) - kept) * seeds
            core_s += runs * tokens / CELL_TOKENS_PER_S[size.name]
    return core_s / cores / 3600


def shared_points(mode: str, other: str | None) -> list[tuple[str, int, tuple[float, ...]]]:
    """(size, tokens, starts both sweep) of every point `mode` and `other` both train: there
    each of those starts' cells (and uniform's, and uniform's lr tuning) is the same run in both
    modes, so running one mode in a copy of the other's finished folder trains only the rest
    (tests/compare/test_compare_longrun.py checks the cells are the same)."""
    if other is None or other == mode:
        return []
    mine, theirs = plan_of(mode), plan_of(other)
    starts = tuple(s for s in mine.starts if s in theirs.starts)
    budgets = {s.name: set(s.tokens) for s in theirs.sizes}
    return [
        (size.name, tokens, starts)
        for size in mine.sizes
        for tokens in size.tokens
        if tokens in budgets.get(size.name, set())
    ]


def longrun_plan(opts) -> StudyPlan:
    """`--paper tokens` or `--paper ratios`: the scaling study over the mode's points, the trend
    report rewritten after each point."""
    plan = plan_of(opts.paper, opts.preset_size)
    extend = LONGRUN_EXTEND if opts.lr_grid_extend is None else opts.lr_grid_extend
    # --preset-size stays: the reports' command must name the sizes run (the points drop it)
    sub = dataclasses.replace(opts, lr_grid_extend=extend)
    return sweep_plan(
        sub,
        plan,
        mode=opts.paper,
        on_report=lambda report, out: write_trend_report(report, out, opts.paper),
    )


def run_longrun(opts) -> tuple[Path, Path]:
    """Run the study of `longrun_plan`; returns (report.md, report.json)."""
    return run_plan(opts, longrun_plan)


# ----------------------------------------------------------------------------------------------
# the reading across tokens per parameter


def _pair(ci: Any) -> tuple[float, float] | None:
    return None if ci is None else (ci[0], ci[1])


def _list(ci: tuple[float, float] | None) -> list[float] | None:
    return None if ci is None else list(ci)


@dataclass(frozen=True)
class Difference:
    """A paired difference vs uniform as the trend report keeps it (trend.json's `diff_1.5` and
    `diff_best` of a point)."""

    mean: float  # tapered minus uniform validation loss, mean over seeds
    ci: tuple[float, float] | None  # its 95% t interval (None: one seed)
    se: float | None  # the standard error the interval implies (None: no interval)

    def to_json(self) -> dict[str, Any]:
        return {"mean": self.mean, "ci": _list(self.ci), "se": self.se}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Difference:
        return cls(data["mean"], _pair(data["ci"]), data["se"])


@dataclass(frozen=True)
class BestRatio:
    """A point's fitted best ratio as the trend report keeps it (trend.json's `best_ratio`)."""

    best: float | None  # the fitted best start (None: not fitted)
    ci: tuple[float, float] | None  # its bootstrap interval (None: one seed)
    at_upper_edge: float | None  # share of resamples at the steepest start swept
    # share of resamples at the lowest start swept (None: a report written before it was)
    at_lower_edge: float | None
    lowest_start: float | None  # the lowest start swept, 1.0 = uniform (None: not reported)
    highest_start: float | None  # the steepest start swept (None: not reported)

    def to_json(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "ci": _list(self.ci),
            "at_upper_edge": self.at_upper_edge,
            "at_lower_edge": self.at_lower_edge,
            "lowest_start": self.lowest_start,
            "highest_start": self.highest_start,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BestRatio:
        return cls(
            data["best"],
            _pair(data["ci"]),
            data["at_upper_edge"],
            data["at_lower_edge"],
            data["lowest_start"],
            data["highest_start"],
        )


@dataclass(frozen=True)
class TrendRow:
    """One point of the reading across tokens per parameter (trend.json's entry of `points`;
    the packaged ratio measurements hold the same rows)."""

    point: str  # the scaling point's key, <size>-<tokens>
    size: str  # the size's name
    params: int  # parameters
    tokens: int  # training tokens per run
    tokens_per_param: float  # tokens / params
    diff_15: Difference | None  # at cosine 1.5 -> 0.5 (trend.json's `diff_1.5`; None: not swept)
    best_measured: (
        str | None
    )  # the swept taper with the lowest mean loss ("uniform": none beats it)
    diff_best: Difference | None  # at the best measured taper (None: uniform, or none)
    best_ratio: BestRatio  # the fitted best start

    def to_json(self) -> dict[str, Any]:
        return {
            "point": self.point,
            "size": self.size,
            "params": self.params,
            "tokens": self.tokens,
            "tokens_per_param": self.tokens_per_param,
            "diff_1.5": None if self.diff_15 is None else self.diff_15.to_json(),
            "best_measured": self.best_measured,
            "diff_best": None if self.diff_best is None else self.diff_best.to_json(),
            "best_ratio": self.best_ratio.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrendRow:
        d15, dbest = data["diff_1.5"], data["diff_best"]
        return cls(
            point=data["point"],
            size=data["size"],
            params=data["params"],
            tokens=data["tokens"],
            tokens_per_param=data["tokens_per_param"],
            diff_15=None if d15 is None else Difference.from_json(d15),
            best_measured=data["best_measured"],
            diff_best=None if dbest is None else Difference.from_json(dbest),
            best_ratio=BestRatio.from_json(data["best_ratio"]),
        )


def _se(d: PairedDifference | None) -> float | None:
    """Standard error of a paired difference from its 95% t interval (None without one)."""
    if not d or d.mean is None or not d.ci:
        return None
    return (d.ci[1] - d.ci[0]) / (2 * 1.96)


def trend_rows(points: list[ScalingPoint]) -> list[TrendRow]:
    """Per point of a scaling report: size, params, tokens per parameter, the difference at
    1.5 -> 0.5 and at the ratio with the lowest mean loss, and the fitted best ratio (best, ci,
    at_upper_edge, at_lower_edge: the shares of resamples at the steepest and at the lowest
    start swept, lowest_start: that start, 1.0 = uniform)."""
    rows = []
    for p in points:
        diffs = p.diffs
        fit = p.fit
        tapers = [t for t in diffs if t != "uniform"]
        at_15 = diffs.get("cosine:1.5:0.5")
        lowest = fit.lowest
        # the taper at the lowest start, named as the sweep writes it (uniform at 1.0: no
        # taper swept beats it, the best measured is the baseline)
        best_taper = None if lowest is None else sweep_taper(_ratio_key(lowest))
        if best_taper not in (*tapers, "uniform"):
            best_taper = None
        rows.append(
            TrendRow(
                point=p.point,
                size=p.size,
                params=p.params,
                tokens=p.tokens,
                tokens_per_param=p.tokens_per_param,
                diff_15=_diff(at_15),
                best_measured=best_taper,
                diff_best=_diff(diffs.get(best_taper))
                if best_taper not in (None, "uniform")
                else None,
                best_ratio=BestRatio(
                    best=fit.best,
                    ci=fit.ci,
                    at_upper_edge=fit.at_upper_edge,
                    at_lower_edge=fit.at_lower_edge,
                    lowest_start=min(fit.starts) if fit.starts else None,
                    highest_start=max(fit.starts) if fit.starts else None,
                ),
            )
        )
    return rows


def _ratio_key(x: float | str) -> float:
    """A start ratio rounded as the sweep writes it (e.g. 1.95 from 1.9500000000000002)."""
    return round(float(x), 6)


def _diff(d: PairedDifference | None) -> Difference | None:
    if not d or d.mean is None:
        return None
    return Difference(d.mean, d.ci, _se(d))


@dataclass(frozen=True)
class TrendFit:
    """A fitted trend (`fit_trend`): y = a + b . x by weighted least squares, its prediction at
    `at` with a parametric-bootstrap interval; `swept` when the prediction of a best-ratio trend
    leaves the starts swept (`_mark_beyond_swept`)."""

    coefficients: tuple[float, ...]  # a, b (, c)
    coefficient_ci: tuple[tuple[float, float], ...]  # each coefficient's 95% interval
    at: tuple[float, ...]  # the regressors predicted at
    prediction: float  # the fitted value there
    prediction_ci: tuple[float, float]  # its 95% interval
    n_points: int  # the points fitted
    swept: tuple[float, float] | None = None  # the starts swept, when the prediction leaves them

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "coefficients": list(self.coefficients),
            "coefficient_ci": [list(c) for c in self.coefficient_ci],
            "at": list(self.at),
            "prediction": self.prediction,
            "prediction_ci": list(self.prediction_ci),
            "n_points": self.n_points,
        }
        if self.swept is not None:
            out["swept"] = list(self.swept)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrendFit:
        swept = data.get("swept")
        return cls(
            tuple(data["coefficients"]),
            tuple((c[0], c[1]) for c in data["coefficient_ci"]),
            tuple(data["at"]),
            data["prediction"],
            (data["prediction_ci"][0], data["prediction_ci"][1]),
            data["n_points"],
            None if swept is None else (swept[0], swept[1]),
        )


@dataclass(frozen=True)
class NoTrend:
    """Why a trend cannot be fitted, in words (trend.json's `{"reason": ...}`)."""

    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NoTrend:
        return cls(data["reason"])


Trend = TrendFit | NoTrend


def _trend_from_json(data: Mapping[str, Any]) -> Trend:
    return NoTrend.from_json(data) if "reason" in data else TrendFit.from_json(data)


@dataclass(frozen=True)
class Trends:
    """The trends of the difference at 1.5 -> 0.5 and of the best ratio (`trends`): per size,
    and "440m" across sizes (trend.json's `trends`)."""

    diff_15: dict[str, Trend]  # size (then "440m") -> its trend (trend.json's `diff_1.5`)
    best_ratio: dict[str, Trend]  # the same for the fitted best ratio

    def to_json(self) -> dict[str, Any]:
        return {
            "diff_1.5": {k: v.to_json() for k, v in self.diff_15.items()},
            "best_ratio": {k: v.to_json() for k, v in self.best_ratio.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Trends:
        return cls(
            {k: _trend_from_json(v) for k, v in data["diff_1.5"].items()},
            {k: _trend_from_json(v) for k, v in data["best_ratio"].items()},
        )


@dataclass(frozen=True)
class TrendReport:
    """trend.json: how it was produced, the points and their trends (`write_trend_report`)."""

    mode: str  # tokens | ratios, or ALL_POINTS (every report's points together)
    command: str  # the scaling report's command
    done: int  # points done
    total: int  # points planned
    plots: tuple[str, ...]  # the figures written beside it
    points: tuple[TrendRow, ...]  # per point
    trends: Trends  # the trends fitted through them

    def to_json(self) -> dict[str, Any]:
        """trend.json's object; `meta.paper_440m` is the paper's point the report compares with."""
        return {
            "meta": {
                "mode": self.mode,
                "command": self.command,
                "done": self.done,
                "total": self.total,
                "paper_440m": {**PAPER_440M.to_json(), "diff": PAPER_DIFF, "best": PAPER_BEST},
                "plots": list(self.plots),
            },
            "points": [r.to_json() for r in self.points],
            "trends": self.trends.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrendReport:
        meta = data["meta"]
        return cls(
            meta["mode"],
            meta["command"],
            meta["done"],
            meta["total"],
            tuple(meta["plots"]),
            tuple(TrendRow.from_json(r) for r in data["points"]),
            Trends.from_json(data["trends"]),
        )


def fit_trend(
    xs: list[tuple[float, ...]],
    ys: list[float],
    ses: list[float | None],
    at: tuple[float, ...],
    n_boot: int = TREND_BOOT,
    seed: int = 0,
) -> TrendFit | None:
    """Weighted least squares y = a + b . x (x: a row of regressors, e.g. (log10 tokens/param,)
    or with log10 params), weights 1/se^2, and the prediction at `at` with a 95% interval from a
    parametric bootstrap (each y redrawn from Normal(y, se), refitted). None when the points
    cannot determine the coefficients (fewer points than coefficients + 1, or a singular design)
    or any point lacks an interval."""
    n, k = len(ys), len(at) + 1
    if n < k + 1 or any(s is None or s <= 0 for s in ses):
        return None
    design = np.array([[1.0, *x] for x in xs])
    if np.linalg.matrix_rank(design) < k:
        return None
    y, se = np.array(ys), np.array(ses, dtype=float)
    w = 1 / se**2
    target = np.array([1.0, *at])

    def solve(values: np.ndarray) -> np.ndarray:
        sw = np.sqrt(w)
        coef, *_ = np.linalg.lstsq(design * sw[:, None], values * sw, rcond=None)
        return coef

    coef = solve(y)
    rng = np.random.default_rng(seed)
    draws = y + rng.standard_normal((n_boot, n)) * se
    boots = np.array([solve(d) for d in draws])
    preds = boots @ target
    return TrendFit(
        coefficients=tuple(float(c) for c in coef),
        coefficient_ci=tuple(
            (float(np.percentile(boots[:, j], 2.5)), float(np.percentile(boots[:, j], 97.5)))
            for j in range(k)
        ),
        at=tuple(at),
        prediction=float(coef @ target),
        prediction_ci=(float(np.percentile(preds, 2.5)), float(np.percentile(preds, 97.5))),
        n_points=n,
    )


def _regressors(row: TrendRow, with_size: bool) -> tuple[float, ...]:
    x = (math.log10(row.tokens_per_param),)
    return (*x, math.log10(row.params)) if with_size else x


def trends(rows: list[TrendRow]) -> Trends:
    """The trend of the difference at 1.5 -> 0.5 and of the fitted best ratio: per size (against
    log10 tokens per parameter, predicted at 68) and across sizes (also against log10 params,
    predicted at the paper's 440M and 68), each with the reason when it cannot be fitted."""
    tpp, params = PAPER_440M.tokens_per_param, PAPER_440M.params
    out: dict[str, dict[str, Trend]] = {"diff_1.5": {}, "best_ratio": {}}
    sizes = sorted({r.size for r in rows}, key=lambda s: min(r.params for r in rows if r.size == s))
    for key, value in (("diff_1.5", _diff_value), ("best_ratio", _ratio_value)):
        usable = [(r, *value(r)) for r in rows if value(r)[0] is not None]
        for size in sizes:
            mine = [u for u in usable if u[0].size == size]
            out[key][size] = _fit_or_reason(mine, False, (math.log10(tpp),), key)
        across = (math.log10(tpp), math.log10(params))
        if len(sizes) < 2:
            out[key]["440m"] = NoTrend("one size gives no trend with size: run >= 2 sizes")
        else:
            out[key]["440m"] = _fit_or_reason(usable, True, across, key)
    best = {name: _mark_beyond_swept(fit, rows) for name, fit in out["best_ratio"].items()}
    return Trends(diff_15=out["diff_1.5"], best_ratio=best)


def _mark_beyond_swept(fit: Trend, rows: list[TrendRow]) -> Trend:
    """A line through best ratios predicts any number, but a best start outside the starts
    swept is a ratio nobody measured (below 0 it is no taper at all): `fit` with the swept
    range recorded when the prediction or its interval leaves it, so the report says so beside
    the number."""
    if not isinstance(fit, TrendFit):
        return fit
    lows = [r.best_ratio.lowest_start for r in rows]
    highs = [r.best_ratio.highest_start for r in rows]
    if None in lows or None in highs or not rows:
        return fit
    lo, hi = min(lows), max(highs)
    plo, phi = fit.prediction_ci
    if plo < lo or phi > hi:
        return dataclasses.replace(fit, swept=(lo, hi))
    return fit


def _diff_value(row: TrendRow) -> tuple[float | None, float | None]:
    d = row.diff_15
    return (None, None) if not d else (d.mean, d.se)


def _ratio_value(row: TrendRow) -> tuple[float | None, float | None]:
    b = row.best_ratio
    if b.best is None:
        return None, None
    se = (b.ci[1] - b.ci[0]) / (2 * 1.96) if b.ci else None
    return b.best, se


def at_edge(best_ratio: BestRatio) -> str | None:
    """Which end of the sweep the fitted best ratio sits at in most resamples: "upper" (the
    steepest start swept: the optimum at or beyond it), "lower" (the lowest start swept, uniform
    or an inverse taper: at or below it), or None (inside, or not reported)."""
    if (best_ratio.at_upper_edge or 0) > 0.5:
        return "upper"
    if (best_ratio.at_lower_edge or 0) > 0.5:
        return "lower"
    return None


def _lower_edge_name(best_ratio: BestRatio) -> str:
    """ "uniform" when uniform is the lowest start swept (or the report predates inverse tapers,
    which never went below it), else "mildest swept" (an inverse taper's start below 1)."""
    low = best_ratio.lowest_start
    return "uniform" if low is None or _ratio_key(low) == 1.0 else "mildest swept"


def _edge_reason(usable: list) -> str | None:
    """Why no best-ratio trend goes through points whose best sits at an end of the sweep
    (a bound there, not an estimate), and what to run; None when every point is inside."""
    upper = [u[0].point for u in usable if at_edge(u[0].best_ratio) == "upper"]
    lower = [u[0] for u in usable if at_edge(u[0].best_ratio) == "lower"]
    parts = []
    if upper:
        parts.append(
            f"the best ratio is at the sweep's steepest in most resamples at {', '.join(upper)}: "
            "its interval is a lower bound there, a trend through it is not a fit (extend the "
            "sweep: --paper ratios)"
        )
    at_uniform = [r.point for r in lower if _lower_edge_name(r.best_ratio) == "uniform"]
    below = [r for r in lower if _lower_edge_name(r.best_ratio) != "uniform"]
    if at_uniform:
        parts.append(
            "the best ratio is at the sweep's lower edge, uniform, in most resamples at "
            f"{', '.join(at_uniform)}: its interval is an upper bound there, a trend through it "
            "is not a fit (sweep below uniform: rerun --paper tokens or --paper ratios, which "
            "sweep the inverse tapers cosine:0.75:1.25 and cosine:0.5:1.5; the kept cells are "
            "reused)"
        )
    if below:
        names = ", ".join(f"{r.point} (start {r.best_ratio.lowest_start:g})" for r in below)
        parts.append(
            f"the best ratio is at the sweep's lower edge, the mildest start swept, in most "
            f"resamples at {names}: its interval is an upper bound there, a trend through it is "
            "not a fit (sweep further below: add a lower start to that point's --tapers, e.g. "
            "cosine:0.25:1.75)"
        )
    return "; ".join(parts) or None


def _fit_or_reason(usable: list, with_size: bool, at: tuple[float, ...], key: str) -> Trend:
    edge = _edge_reason(usable) if key == "best_ratio" else None
    if edge:
        return NoTrend(edge)
    # a zero-width interval (a best that never moves) carries no weight information
    usable = [u for u in usable if u[2] is not None and u[2] > 0]
    fit = fit_trend(
        [_regressors(u[0], with_size) for u in usable],
        [u[1] for u in usable],
        [u[2] for u in usable],
        at,
    )
    if fit is None:
        need = len(at) + 2
        return NoTrend(
            f"{len(usable)} point(s) with an interval; a trend with an interval needs "
            f">= {need}" + (" at >= 2 sizes" if with_size else "")
        )
    return fit


def write_trend_report(report: ScalingReport, out: Path, mode: str) -> tuple[Path, Path]:
    """trend.md, trend.json, advantage.png and best_ratio.png beside the scaling report
    `report` (the study's, in memory) in its folder `out`."""
    rows = trend_rows(list(report.points))
    meta = report.meta
    return write_trend(out, rows, mode, meta.command, meta.done, meta.total)


@dataclass(frozen=True)
class ReportRows:
    """The trend rows of one finished report (`report_rows`) and what it names of its run."""

    mode: str  # "scaling" (a scaling report) or its trend report's mode (tokens | ratios)
    command: str | None  # the command that wrote it (None: not recorded)
    done: int | None  # points done
    total: int | None  # points planned
    rows: list[TrendRow]


def report_rows(path: Path) -> ReportRows:
    """The trend rows of one report: a scaling report (`--paper scaling`'s report.json; mode
    "scaling") through `trend_rows`, a trend report (`--paper tokens`/`ratios`' trend.json; its
    meta's mode) as it is. Read bounded; a file that is neither is refused naming it."""
    return read_record(path, "scaling or trend report", lambda doc: _report_rows(path, doc))


def _report_rows(path: Path, doc: Any) -> ReportRows:
    if not isinstance(doc, dict) or not isinstance(doc.get("points"), list):
        raise ConfigError(
            f"{path}: not a scaling report (report.json of --paper scaling) or a trend "
            "report (trend.json of --paper tokens/ratios): it has no list of points"
        )
    meta = doc.get("meta")
    meta = meta if isinstance(meta, dict) else {}
    head = (meta.get("command"), meta.get("done"), meta.get("total"))
    try:
        if "trends" in doc:
            mode = meta.get("mode")
            if not isinstance(mode, str):
                raise ValueError("its meta names no mode")
            return ReportRows(mode, *head, [TrendRow.from_json(r) for r in doc["points"]])
        points = [ScalingPoint.from_json(p) for p in doc["points"]]
        return ReportRows("scaling", *head, trend_rows(points))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(
            f"{path}: a point is not as the compare modes write it ({exc}); give a report "
            "written by taperlm compare --paper scaling/tokens/ratios"
        ) from exc


def rows_of_reports(paths: list[Path], widest: bool = False) -> list[TrendRow]:
    """The trend rows of several reports (`report_rows`), in order. A point in two reports
    would count twice in a fit: refused, unless `widest`, which keeps the row of the widest
    sweep (`keep_widest`: the ratio axis's where it and the token axis measured one point)."""
    rows: list[TrendRow] = []
    seen: dict[str, Path] = {}
    for path in paths:
        mine = report_rows(path).rows
        for row in mine:
            if row.point in seen and not widest:
                raise ConfigError(
                    f"point {row.point} is in both {seen[row.point]} and {path}: keep one of "
                    "the two reports' measurement (a point counted twice weighs double in a fit)"
                )
            seen[row.point] = path
        rows += mine
    return keep_widest(rows) if widest else rows


def keep_widest(rows: list[TrendRow]) -> list[TrendRow]:
    """`rows` with one row per point: where several reports measured one point (`--paper
    ratios` and `--paper tokens` share points, with the same cells), the row of the widest
    sweep — the steepest start swept, then the lowest — which at a shared point is ratios',
    whose sweep contains tokens'. Order is kept (the first row of each point, replaced)."""
    keep: dict[str, TrendRow] = {}
    for row in rows:
        old = keep.get(row.point)
        if old is None or _reach(row) > _reach(old):
            keep[row.point] = row
    return [keep[p] for p in dict.fromkeys(r.point for r in rows)]


def _reach(row: TrendRow) -> tuple[float, float]:
    """How far a row's sweep reaches: its steepest start, then minus its lowest."""
    b = row.best_ratio
    return (b.highest_start or 0.0, -(b.lowest_start if b.lowest_start is not None else 1.0))


def write_trend(
    out: Path, rows: list[TrendRow], mode: str, command: str, done: int, total: int
) -> tuple[Path, Path]:
    """trend.md, trend.json, advantage.png and best_ratio.png of `rows` in `out`; `mode` is
    the compare mode (tokens | ratios) or ALL_POINTS for the reading across every report."""
    fitted = trends(rows)
    plots = []
    if any(r.diff_15 for r in rows):
        plot_advantage(rows, fitted, out / ADVANTAGE_PLOT)
        plots.append(ADVANTAGE_PLOT)
    if any(r.best_ratio.best is not None for r in rows):
        plot_best_ratio(rows, out / BEST_RATIO_PLOT)
        plots.append(BEST_RATIO_PLOT)
    trend = TrendReport(mode, command, done, total, tuple(plots), tuple(rows), fitted)
    write_record(out / "trend.json", trend)
    atomic_write_text(out / "trend.md", trend_markdown(trend))
    return out / "trend.md", out / "trend.json"


def _ci(d: Difference | None, fmt: str = "+.4f") -> str:
    if not d:
        return "–"
    text = format(d.mean, fmt)
    return text + (f" [{d.ci[0]:{fmt}}, {d.ci[1]:{fmt}}]" if d.ci else "")


def trend_table(rows: list[TrendRow] | tuple[TrendRow, ...]) -> list[str]:
    """The markdown table of the points (the docs copy it)."""
    head = ["point", "params", "tokens/param", "Δ 1.5→0.5 [95% CI]", "best measured",
            "Δ there [95% CI]", "fitted best start [95% bootstrap]"]  # fmt: skip
    table = []
    for r in rows:
        b = r.best_ratio
        best = "–" if b.best is None else f"{b.best:.2f}"
        if b.ci:
            best += f" [{b.ci[0]:.2f}, {b.ci[1]:.2f}]"
        edge = at_edge(b)
        if edge == "upper":
            best += " (edge)"
        elif edge == "lower":
            best += f" (edge: {_lower_edge_name(b)})"
        table.append(
            [
                r.point,
                f"{r.params:,}",
                f"{r.tokens_per_param:.2f}",
                _ci(r.diff_15),
                r.best_measured or "–",
                "0 (baseline)" if r.best_measured == "uniform" else _ci(r.diff_best),
                best,
            ]
        )
    return md_table(head, table)


def _trend_line(name: str, fit: Trend, what: str, at: str) -> str:
    if isinstance(fit, NoTrend):
        return f"- {name}: no trend: {fit.reason}."
    b, (lo, hi) = fit.coefficients[1], fit.coefficient_ci[1]
    p, (plo, phi) = fit.prediction, fit.prediction_ci
    per_size = ""
    if len(fit.coefficients) == 3:  # across sizes: the size's own slope too
        c, (clo, chi) = fit.coefficients[2], fit.coefficient_ci[2]
        per_size = f" and by {c:+.4f} [{clo:+.4f}, {chi:+.4f}] per decade of parameters"
    line = (
        f"- {name}: {what} changes by {b:+.4f} [{lo:+.4f}, {hi:+.4f}] per decade of tokens per "
        f"parameter{per_size}; at {at}: {p:+.4f} [{plo:+.4f}, {phi:+.4f}]"
    )
    if fit.swept is not None:
        line += (
            f" — beyond the starts swept ({fit.swept[0]:g} to {fit.swept[1]:g}): a straight "
            "line carried past the measured ratios, not a ratio measured; read it as a direction"
        )
    return line


def trend_markdown(trend: TrendReport) -> str:
    uniform, tapered = PAPER_440M.ppl
    if trend.mode == ALL_POINTS:
        title = "# taperlm compare — every point measured: the taper against tokens per parameter"
    else:
        title = f"# taperlm compare — paper {trend.mode}: the taper against tokens per parameter"
    if trend.done < trend.total:
        title += f" (PARTIAL: {trend.done}/{trend.total} points done)"
    source = " from the scaling and trend reports it reads" if trend.mode == ALL_POINTS else ""
    lines = [title, "", f"Produced by `{trend.command}`{source} (per point: report.md).", ""]
    lines += trend_table(trend.points)
    lines += [
        "",
        "Δ = cosine START:2−START minus uniform validation loss, paired over seeds (95% t "
        "interval); best measured: the swept ratio with the lowest mean loss; fitted best: the "
        "local-parabola vertex with its bootstrap interval (`--paper scaling`), '(edge)' when "
        "most resamples put it at the steepest ratio swept, '(edge: uniform)' or '(edge: "
        "mildest swept)' when at the lowest start swept (uniform, or an inverse taper below "
        "it): a bound, not an estimate. The paper's 440M point: "
        f"Δ = ln({tapered:.2f}/{uniform:.2f}) = {PAPER_DIFF:+.4f} at 1.5→0.5, best {PAPER_BEST:g}, "
        f"{PAPER_440M.tokens_per_param:.0f} tokens/param.",
        "",
        "## Trends",
        "",
        "Weighted least squares on log10(tokens/param) (per size) and also log10(params) "
        f"(across sizes), 95% intervals from {TREND_BOOT} parametric-bootstrap refits.",
        "",
    ]
    tpp = PAPER_440M.tokens_per_param
    for fits, what in (
        (trend.trends.diff_15, "Δ at 1.5→0.5"),
        (trend.trends.best_ratio, "the best start ratio"),
    ):
        for name, fit in fits.items():
            at = f"440M, {tpp:.0f} tokens/param" if name == "440m" else f"{tpp:.0f} tokens/param"
            label = "across sizes, extrapolated" if name == "440m" else name
            lines.append(_trend_line(f"{what}, {label}", fit, what, at))
    lines.append("")
    for plot in trend.plots:
        lines += [f"![{plot}]({plot})", ""]
    return "\n".join(lines)


def plot_advantage(rows: list[TrendRow], fitted: Trends, path: Path) -> None:
    """Δ at 1.5 -> 0.5 (and at the best measured ratio) against tokens per parameter, one colour
    per size, each size's fitted trend, and the paper's 440M point."""
    uniform, tapered = PAPER_440M.ppl
    fig, axes = _figure(1, width=8.0)
    ax = axes[0]
    for i, size in enumerate(dict.fromkeys(r.size for r in rows)):
        # sorted by x alone: two points at one x keep their order (rows do not compare)
        pts = sorted(
            ((r.tokens_per_param, r) for r in rows if r.size == size and r.diff_15),
            key=lambda p: p[0],
        )
        if not pts:
            continue
        xs = [x for x, _ in pts]
        for key, marker, style, label in (
            ("diff_15", "o", "-", "1.5→0.5"),
            ("diff_best", "s", ":", "best measured ratio"),
        ):
            ds = [(x, getattr(r, key)) for x, r in pts if getattr(r, key)]
            if not ds:
                continue
            ys = [d.mean for _, d in ds]
            err = [[y - (d.ci or (y, y))[0] for (_, d), y in zip(ds, ys)],
                   [(d.ci or (y, y))[1] - y for (_, d), y in zip(ds, ys)]]  # fmt: skip
            ax.errorbar([x for x, _ in ds], ys, yerr=err, marker=marker, linestyle=style,
                        capsize=3, color=f"C{i}", label=f"{size}: {label}")  # fmt: skip
        fit = fitted.diff_15.get(size)
        if isinstance(fit, TrendFit):
            grid = np.geomspace(min(xs), PAPER_440M.tokens_per_param, 50)
            a, b = fit.coefficients
            ax.plot(grid, a + b * np.log10(grid), color=f"C{i}", alpha=0.4, linestyle="--",
                    label=f"{size}: trend (1.5→0.5)")  # fmt: skip
    ax.plot([PAPER_440M.tokens_per_param], [PAPER_DIFF], marker="*", markersize=14,
            color="k", linestyle="none", label=f"paper, 440M: {uniform:.2f} → {tapered:.2f} ppl")  # fmt: skip
    across = fitted.diff_15.get("440m")
    if isinstance(across, TrendFit):
        # the trend across sizes carried to the paper's point: where the measurements here
        # put 440M at 68 tokens per parameter, beside what the paper measured there
        p, (lo, hi) = across.prediction, across.prediction_ci
        ax.errorbar([PAPER_440M.tokens_per_param * 1.12], [p], yerr=[[p - lo], [hi - p]],
                    marker="D", capsize=4, color="grey", linestyle="none",
                    label="trend across sizes, extrapolated to 440M")  # fmt: skip
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens per parameter")
    ax.set_ylabel("Δ val loss, tapered − uniform (nats)")
    ax.set_title("The taper's advantage against training length (below 0: taper better)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    _save(fig, path)


def plot_best_ratio(rows: list[TrendRow], path: Path) -> None:
    """The fitted best start ratio (bootstrap interval) against tokens per parameter, one
    colour per size; a hollow circle where most resamples sit at the steepest ratio swept, a
    hollow downward triangle where they sit at the lowest start swept (uniform or an inverse
    taper); the paper's point."""
    fig, axes = _figure(1, width=8.0)
    ax = axes[0]
    for i, size in enumerate(dict.fromkeys(r.size for r in rows)):
        pts = sorted(
            ((r.tokens_per_param, r.best_ratio) for r in rows
             if r.size == size and r.best_ratio.best is not None),
            key=lambda p: p[0],
        )  # fmt: skip
        if not pts:
            continue
        xs, ys = [x for x, _ in pts], [b.best for _, b in pts]
        err = [[y - (b.ci or (y, y))[0] for (_, b), y in zip(pts, ys)],
               [(b.ci or (y, y))[1] - y for (_, b), y in zip(pts, ys)]]  # fmt: skip
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, color=f"C{i}", label=size)
        for side, marker, label in (
            ("upper", "o", "at the sweep's steepest"),
            ("lower", "v", "at the sweep's lowest start"),
        ):
            edge = [(x, y) for (x, b), y in zip(pts, ys) if at_edge(b) == side]
            if edge:
                ax.plot([x for x, _ in edge], [y for _, y in edge], marker=marker, markersize=12,
                        fillstyle="none", linestyle="none", color=f"C{i}",
                        label=f"{size}: {label}")  # fmt: skip
    ax.plot([PAPER_440M.tokens_per_param], [PAPER_BEST], marker="*", markersize=14,
            color="k", linestyle="none", label="paper, 440M")  # fmt: skip
    ax.set_xscale("log")
    lows = [r.best_ratio.lowest_start for r in rows]
    ax.set_ylim(min([1.0, *(v for v in lows if v is not None)]) - 0.05, 2.05)
    ax.set_xlabel("training tokens per parameter")
    ax.set_ylabel("best cosine start ratio (end = 2 − start)")
    ax.set_title("Best taper ratio against training length")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    _save(fig, path)

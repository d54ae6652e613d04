"""The difference against tokens seen: every tapered allocation's paired validation-loss
difference vs uniform at each evaluation during training, and the **crossing point**, where the
taper's advantage ends.

A short run can show an advantage that longer training removes (issue 38: at nano the taper
helps at 0.5 tokens per parameter and not at 2), so a report's single final number can answer
a question of its budget only. From the curves every cell already records (the trainer's
evaluations every `train.eval_every` steps, `CellResult.curve`), per tapered allocation:

- at every tokens value that all paired seeds share: the mean difference (tapered − uniform, the
  same seed = the same data order and init seed) with its 95% Student-t interval
  (`taperlm.analysis.stats.paired_difference`);
- the crossing: the tokens where the mean difference last goes from < 0 to >= 0 and stays >= 0
  to the end of the run, interpolated linearly in log tokens between the two evaluations around
  it; or no crossing, saying on which side the curve ends (below zero at the end: the taper is
  still ahead; never below zero: it never was);
- its interval: the 2.5/97.5 percentiles of the same crossing over `BOOTSTRAP_RESAMPLES`
  resamples of the seeds (with replacement, each resampled seed keeping both arms, so the pairing
  survives), among the resamples that cross, with the shares that do not; the RNG seed is fixed,
  so a report is reproducible to the digit.

Read the crossing for what it is: the points before a run's end are of a model whose lr has not
decayed yet (its cosine schedule spans the whole run), so the crossing within one run is not the
budget at which a run trained *to* that length stops favouring the taper; it tells where, within
the training people would do, the advantage is gone.

`loss_vs_tokens` computes it, `section` renders report.md's lines, `plot` draws the PNG; report.json
holds `LossVsTokens.to_json()` under `REPORT_KEY` (`from_json` reads it back).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from taperlm.analysis import stats
from taperlm.analysis.plots import _figure, _save

if TYPE_CHECKING:
    from taperlm.compare.grid import Grid
    from taperlm.compare.runner import CellResult

REPORT_KEY = "loss_vs_tokens"  # report.json's key
PLOT_FILE = "delta_vs_tokens.png"
# 2,000 resamples put the 2.5/97.5 percentiles' Monte Carlo error well below the seed-to-seed
# spread they measure; the fixed seed makes every report's interval reproducible.
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
TABLE_POINTS = 6  # rows of report.md's table: evaluations spread evenly in log tokens

# How a mean-difference curve relates to zero (`Crossing.kind`).
CROSSED = "crossed"  # below zero, then at or above zero from the crossing to the end
BELOW_AT_END = "below_at_end"  # below zero at the last evaluation: the taper still ahead
NEVER_BELOW = "never_below"  # at or above zero at every evaluation: the taper never ahead
TOO_SHORT = "too_short"  # fewer than 2 shared evaluations: nothing to read
KINDS = (CROSSED, BELOW_AT_END, NEVER_BELOW, TOO_SHORT)


@dataclass(frozen=True)
class DeltaAt:
    """The paired difference at one evaluation during training."""

    tokens: int  # training tokens seen at the evaluation
    tokens_per_param: float  # tokens / the model's parameters
    n: int  # paired seeds
    mean: float  # mean over seeds of tapered − uniform validation loss, nats
    ci: tuple[float, float] | None  # its 95% Student-t interval (None: one seed)
    per_seed: tuple[float, ...]  # the difference of each seed, in `seeds` order

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "tokens_per_param": self.tokens_per_param,
            "n": self.n,
            "mean": self.mean,
            "ci": None if self.ci is None else list(self.ci),
            "per_seed": list(self.per_seed),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DeltaAt:
        ci = data["ci"]
        return cls(
            tokens=int(data["tokens"]),
            tokens_per_param=float(data["tokens_per_param"]),
            n=int(data["n"]),
            mean=float(data["mean"]),
            ci=None if ci is None else (float(ci[0]), float(ci[1])),
            per_seed=tuple(float(x) for x in data["per_seed"]),
        )


@dataclass(frozen=True)
class Crossing:
    """Where a mean-difference curve last crosses from below zero to at or above it."""

    kind: str  # one of KINDS
    tokens: float | None  # the crossing (kind CROSSED), interpolated in log tokens; else None
    recrossed: bool  # the curve went >= 0 earlier and dipped below again before this crossing

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "tokens": self.tokens, "recrossed": self.recrossed}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Crossing:
        tokens = data["tokens"]
        return cls(data["kind"], None if tokens is None else float(tokens), bool(data["recrossed"]))


@dataclass(frozen=True)
class CrossingInterval:
    """The crossing's bootstrap over seeds."""

    resamples: int  # seed resamples drawn
    rng_seed: int  # numpy's default_rng seed (fixed: reproducible reports)
    crossed: int  # resamples whose mean curve crosses
    below_at_end: int  # ... that end below zero
    never_below: int  # ... that are never below zero
    tokens: tuple[float, float] | None  # 2.5/97.5 percentiles among those that cross

    @property
    def share_not_crossing(self) -> float:
        return (self.below_at_end + self.never_below) / self.resamples

    def to_json(self) -> dict[str, Any]:
        return {
            "resamples": self.resamples,
            "rng_seed": self.rng_seed,
            "crossed": self.crossed,
            "below_at_end": self.below_at_end,
            "never_below": self.never_below,
            "tokens": None if self.tokens is None else list(self.tokens),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CrossingInterval:
        t = data["tokens"]
        return cls(
            resamples=int(data["resamples"]),
            rng_seed=int(data["rng_seed"]),
            crossed=int(data["crossed"]),
            below_at_end=int(data["below_at_end"]),
            never_below=int(data["never_below"]),
            tokens=None if t is None else (float(t[0]), float(t[1])),
        )


@dataclass(frozen=True)
class AllocationCurve:
    """One tapered allocation against uniform, during training."""

    name: str  # the allocation's name
    label: str  # its label (tables, plots)
    seeds: tuple[int, ...]  # the seeds with a curve in both arms (the pairing)
    points: tuple[DeltaAt, ...]  # at every shared evaluation, in token order
    crossing: Crossing
    interval: CrossingInterval | None  # None: fewer than 2 seeds

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "seeds": list(self.seeds),
            "points": [p.to_json() for p in self.points],
            "crossing": self.crossing.to_json(),
            "interval": None if self.interval is None else self.interval.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AllocationCurve:
        iv = data["interval"]
        return cls(
            name=data["name"],
            label=data["label"],
            seeds=tuple(int(s) for s in data["seeds"]),
            points=tuple(DeltaAt.from_json(p) for p in data["points"]),
            crossing=Crossing.from_json(data["crossing"]),
            interval=None if iv is None else CrossingInterval.from_json(iv),
        )


@dataclass(frozen=True)
class LossVsTokens:
    """report.json's `loss_vs_tokens`: every tapered allocation's difference against tokens."""

    params: int  # the model's parameters (every allocation's: equal budgets)
    eval_tokens: int | None  # validation tokens per curve point (not the table's final ones)
    allocations: tuple[AllocationCurve, ...]  # in the grid's order, uniform left out

    def to_json(self) -> dict[str, Any]:
        """report.json's object; each allocation also gets its crossing and interval in tokens
        per parameter (`crossing_tokens_per_param`, `interval_tokens_per_param`: derived, for
        the reader; `from_json` recomputes them from `params`)."""
        allocations = []
        for a in self.allocations:
            entry = a.to_json()
            c, iv = a.crossing.tokens, a.interval and a.interval.tokens
            entry["crossing_tokens_per_param"] = None if c is None else c / self.params
            entry["interval_tokens_per_param"] = (
                None if not iv else [iv[0] / self.params, iv[1] / self.params]
            )
            allocations.append(entry)
        return {"params": self.params, "eval_tokens": self.eval_tokens, "allocations": allocations}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LossVsTokens:
        et = data["eval_tokens"]
        return cls(
            params=int(data["params"]),
            eval_tokens=None if et is None else int(et),
            allocations=tuple(AllocationCurve.from_json(a) for a in data["allocations"]),
        )


# ----------------------------------------------------------------------------------------------
# the computation


def crossing_of(tokens: Sequence[float], delta: Sequence[float]) -> Crossing:
    """The last crossing from < 0 to >= 0 after which `delta` stays >= 0, interpolated
    linearly in log tokens (`tokens` increasing and > 0)."""
    if len(tokens) != len(delta):
        raise ValueError("crossing_of: tokens and delta differ in length")
    if len(delta) < 2:
        return Crossing(TOO_SHORT, None, False)
    below = [i for i, d in enumerate(delta) if d < 0]
    if not below:
        return Crossing(NEVER_BELOW, None, False)
    last = below[-1]
    if last == len(delta) - 1:
        return Crossing(BELOW_AT_END, None, _went_up_before(delta, last))
    d0, d1 = float(delta[last]), float(delta[last + 1])
    x0, x1 = math.log(tokens[last]), math.log(tokens[last + 1])
    at = x0 + (0.0 - d0) / (d1 - d0) * (x1 - x0)  # d1 >= 0 > d0: d1 - d0 > 0
    return Crossing(CROSSED, math.exp(at), _went_up_before(delta, last))


def _went_up_before(delta: Sequence[float], last_below: int) -> bool:
    """Whether the curve was >= 0 somewhere after first being < 0 and before `last_below`."""
    first = next(i for i, d in enumerate(delta) if d < 0)
    return any(d >= 0 for d in delta[first:last_below])


def paired_curves(
    tapered: Mapping[int, Sequence[Sequence[float]]],
    uniform: Mapping[int, Sequence[Sequence[float]]],
) -> tuple[tuple[int, ...], tuple[int, ...], np.ndarray]:
    """(seeds, tokens, differences): the seeds with a curve in both arms, the tokens at which
    every one of them evaluated both, and per seed (rows) the tapered − uniform loss there."""
    seeds = tuple(sorted(s for s in set(tapered) & set(uniform) if tapered[s] and uniform[s]))
    if not seeds:
        return (), (), np.zeros((0, 0))
    by_seed = [
        ({int(t): float(v) for t, v in tapered[s]}, {int(t): float(v) for t, v in uniform[s]})
        for s in seeds
    ]
    shared = set.intersection(*(set(a) & set(b) for a, b in by_seed))
    tokens = tuple(sorted(t for t in shared if t > 0))
    diffs = np.array([[a[t] - b[t] for t in tokens] for a, b in by_seed], dtype=float)
    return seeds, tokens, diffs.reshape(len(seeds), len(tokens))


def bootstrap_crossing(
    tokens: Sequence[float],
    diffs: np.ndarray,
    resamples: int = BOOTSTRAP_RESAMPLES,
    rng_seed: int = BOOTSTRAP_SEED,
) -> CrossingInterval:
    """The crossing over `resamples` resamples of the seeds (rows of `diffs`)."""
    n = diffs.shape[0]
    rng = np.random.default_rng(rng_seed)
    rows = rng.integers(0, n, size=(resamples, n))
    means = diffs[rows].mean(axis=1)  # (resamples, points)
    counts = dict.fromkeys(KINDS, 0)
    crossed: list[float] = []
    for curve in means:
        c = crossing_of(tokens, curve.tolist())
        counts[c.kind] += 1
        if c.tokens is not None:
            crossed.append(math.log(c.tokens))
    tail = 100.0 * (1.0 - CONFIDENCE) / 2.0
    interval = None
    if crossed:
        lo, hi = np.percentile(crossed, [tail, 100.0 - tail])
        interval = (math.exp(float(lo)), math.exp(float(hi)))
    return CrossingInterval(
        resamples=resamples,
        rng_seed=rng_seed,
        crossed=counts[CROSSED],
        below_at_end=counts[BELOW_AT_END],
        never_below=counts[NEVER_BELOW],
        tokens=interval,
    )


def allocation_curve(
    name: str,
    label: str,
    tapered: Mapping[int, Sequence[Sequence[float]]],
    uniform: Mapping[int, Sequence[Sequence[float]]],
    params: int,
) -> AllocationCurve:
    """One allocation's difference against tokens, its crossing and the crossing's interval,
    from per-seed curves ([[tokens, val_loss], ...]) of it and of uniform."""
    seeds, tokens, diffs = paired_curves(tapered, uniform)
    points = []
    for j, t in enumerate(tokens):
        col = diffs[:, j].tolist()
        d = stats.paired_difference(dict(zip(seeds, col)), dict.fromkeys(seeds, 0.0), CONFIDENCE)
        points.append(
            DeltaAt(
                tokens=t,
                tokens_per_param=t / params,
                n=d.n,
                mean=d.mean,
                ci=d.ci,
                per_seed=tuple(col),
            )
        )
    crossing = crossing_of(tokens, [p.mean for p in points])
    interval = bootstrap_crossing(tokens, diffs) if len(seeds) >= 2 and tokens else None
    return AllocationCurve(name, label, seeds, tuple(points), crossing, interval)


def loss_vs_tokens(grid: Grid, results: Mapping[str, CellResult]) -> LossVsTokens:
    """Every tapered allocation of `grid` against uniform, from its cells' curves."""
    uniform = next(a for a in grid.allocations if a.is_uniform)
    curves: dict[str, dict[int, list[list[float]]]] = {a.name: {} for a in grid.allocations}
    for c in grid.cells:
        r = results.get(c.name)
        if r is not None and r.curve:
            curves[c.allocation.name][int(r.seed)] = r.curve
    params = int(grid.budget[uniform.name]["params"])
    return LossVsTokens(
        params=params,
        eval_tokens=int(grid.base.train.eval_tokens),
        allocations=tuple(
            allocation_curve(a.name, a.label, curves[a.name], curves[uniform.name], params)
            for a in grid.allocations
            if not a.is_uniform
        ),
    )


# ----------------------------------------------------------------------------------------------
# report.md and the PNG


def fmt_tokens(tokens: float) -> str:
    """1,234,567 -> 1.23M (tables and lines)."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if tokens >= scale:
            return f"{tokens / scale:.3g}{unit}"
    return f"{tokens:.0f}"


def crossing_text(curve: AllocationCurve, params: int) -> str:
    """One sentence: where the advantage ends (with its interval), or why nothing crosses."""
    c, iv = curve.crossing, curve.interval
    if c.kind == TOO_SHORT:
        return "fewer than 2 evaluations shared by every seed: no curve to read"
    end = curve.points[-1]
    if c.kind == CROSSED:
        assert c.tokens is not None
        text = (
            f"the mean difference crosses zero at **{fmt_tokens(c.tokens)} tokens = "
            f"{c.tokens / params:.2f} tokens/param** and stays at or above it to the end "
            f"({fmt_tokens(end.tokens)} = {end.tokens_per_param:.2f} tokens/param)"
        )
        if c.recrossed:
            text += "; it had been at or above zero before and dipped below again"
    elif c.kind == BELOW_AT_END:
        text = (
            "no crossing within the run: the mean difference is below zero at the end "
            f"({end.mean:+.4f} at {end.tokens_per_param:.2f} tokens/param), the taper still ahead"
        )
    else:
        text = (
            "no crossing within the run: the mean difference is at or above zero at every "
            "evaluation, the taper never ahead"
        )
    if iv is None:
        return text + " (one seed: no interval)"
    share = f"{100 * iv.share_not_crossing:.1f}%"
    detail = f"below zero at the end in {iv.below_at_end}, never below in {iv.never_below}"
    if not iv.share_not_crossing:
        detail = "every resample crosses"
    if iv.tokens is None:
        return text + f"; no bootstrap resample of the seeds crosses ({detail})"
    lo, hi = iv.tokens
    return text + (
        f"; 95% bootstrap interval over seeds {lo / params:.2f}–{hi / params:.2f} tokens/param "
        f"({fmt_tokens(lo)}–{fmt_tokens(hi)} tokens); {share} of {iv.resamples:,} resamples "
        f"without a crossing ({detail})"
    )


def table_rows(curve: AllocationCurve, k: int = TABLE_POINTS) -> list[DeltaAt]:
    """`k` evaluations spread evenly in log tokens, the first and the last among them."""
    pts = curve.points
    if len(pts) <= k:
        return list(pts)
    logs = np.log([p.tokens for p in pts])
    targets = np.linspace(logs[0], logs[-1], k)
    picked = sorted({int(np.argmin(np.abs(logs - x))) for x in targets})
    return [pts[i] for i in picked]


def _ci_text(p: DeltaAt) -> str:
    if p.ci is None:
        return f"{p.mean:+.4f}"
    return f"{p.mean:+.4f} [{p.ci[0]:+.4f}, {p.ci[1]:+.4f}]"


def section(data: LossVsTokens) -> list[str]:
    """report.md's section: per tapered allocation a table at a few evaluations and the
    crossing line."""
    if not data.allocations:
        return []
    evals = "" if data.eval_tokens is None else f" (each on {data.eval_tokens:,} val tokens)"
    lines = [
        "## Difference against tokens seen",
        "",
        f"The paired difference tapered − uniform at the evaluations during training{evals}, "
        "mean over seeds with its 95% Student-t interval; the crossing is where the mean "
        "difference last goes from below zero to at or above it and stays there (interpolated "
        f"in log tokens), its interval the 2.5–97.5 percentiles over {BOOTSTRAP_RESAMPLES:,} "
        "bootstrap resamples of the seeds. Points before the end are of runs whose lr has not "
        "decayed yet, so the crossing is not the budget at which a run trained to that length "
        f"stops favouring the taper. Every evaluation is in report.json (`{REPORT_KEY}`) and "
        f"drawn in {PLOT_FILE}.",
        "",
    ]
    for a in data.allocations:
        lines += [f"**{a.label}** ({len(a.seeds)} seeds): {crossing_text(a, data.params)}.", ""]
        rows = [
            [f"{p.tokens:,}", f"{p.tokens_per_param:.2f}", _ci_text(p), _better(p)]
            for p in table_rows(a)
        ]
        if rows:
            lines += _md_table(
                ["tokens", "tokens/param", "Δ loss, nats [95% CI]", "seeds taper better"], rows
            )
            lines.append("")
    return lines


def _better(p: DeltaAt) -> str:
    return f"{sum(d < 0 for d in p.per_seed)}/{p.n}"


def _md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def headline(
    data: LossVsTokens,
    final: Mapping[str, stats.PairedDifference | None],
    settled: Mapping[str, str] | None = None,
) -> list[str]:
    """report.md's first section: per tapered allocation the verdict at the end of the run
    (`final`: allocation name -> its `paired_difference` of the final validation loss, the
    table's) and where its advantage ends. `settled`: allocation label -> a verdict the stop
    rule reached (`sequential.Stopping.settled_verdicts`: "no practical difference"), said instead."""
    if not data.allocations:
        return []
    lines = ["## Verdict", ""]
    for a in data.allocations:
        d = final.get(a.name)
        end = a.points[-1] if a.points else None
        at = (
            ""
            if end is None
            else f" at {end.tokens:,} tokens ({end.tokens_per_param:.2f} tokens/param)"
        )
        if d is None or d.mean is None:
            verdict = "no finished pair of runs yet"
        elif settled and a.label in settled:
            verdict = settled[a.label]
        else:
            verdict = _verdict(d)
        lines.append(
            f"- **{a.label} vs uniform{at}: {verdict}.** {_cap(crossing_text(a, data.params))}."
        )
    lines.append("")
    return lines


def _verdict(d: stats.PairedDifference) -> str:
    m, ci = d.mean, d.ci
    assert m is not None  # headline() reports a missing mean before asking for a verdict
    better = sum(x < 0 for x in d.per_seed)
    seeds = f", taper better in {better} of {d.n} seeds"
    if ci is None:
        return f"Δ {m:+.4f} nats (one seed, no interval)"
    span = f"Δ {m:+.4f} nats [{ci[0]:+.4f}, {ci[1]:+.4f}]{seeds}"
    if ci[1] < 0:
        return f"the taper is better, {span}"
    if ci[0] > 0:
        return f"the taper is WORSE than uniform, {span}"
    return f"no difference decided, {span}"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def plot(data: LossVsTokens, path: Path) -> bool:
    """The PNG: per tapered allocation the mean difference with its 95% band against tokens per
    parameter (log axis), the zero line, and the crossing with its interval; False when no
    allocation has two shared evaluations."""
    drawn = [a for a in data.allocations if len(a.points) >= 2]
    if not drawn:
        return False
    fig, (ax,) = _figure()
    for i, a in enumerate(drawn):
        color = f"C{i}"
        x = np.array([p.tokens_per_param for p in a.points])
        y = np.array([p.mean for p in a.points])
        ax.plot(
            x, y, color=color, marker="o", markersize=3, label=f"{a.label} ({len(a.seeds)} seeds)"
        )
        band = [p.ci for p in a.points]
        if all(b is not None for b in band):
            ax.fill_between(x, [b[0] for b in band], [b[1] for b in band], color=color, alpha=0.2)
        c, iv = a.crossing, a.interval
        if c.tokens is not None:
            ax.axvline(c.tokens / data.params, color=color, linestyle="--", linewidth=1)
            if iv is not None and iv.tokens is not None:
                lo, hi = (t / data.params for t in iv.tokens)
                ax.axvspan(lo, hi, color=color, alpha=0.08)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens per parameter (log)")
    ax.set_ylabel("val loss − uniform's, nats (lower: taper better)")
    ax.set_title(
        "Paired difference vs uniform during training\n(mean, 95% band over seeds;\n"
        "dashed: the crossing, shaded: its 95% bootstrap interval)"
    )
    ax.legend(fontsize=8)
    _save(fig, path)
    return True

"""Sequential seeds: a comparison adds seeds in order and stops as soon as its question is
settled, with an error rate that holds however often it looks (`--stop`, `--stop-alpha`,
`--min-seeds`, `--stop-on`; the cap is `--seeds`).

After every completed seed n (all of its cells done) the paired differences of the question's
comparisons over seeds 0..n-1 get their anytime-valid confidence sequence
(`taperlm.analysis.stats.confidence_sequence`: valid at every n at once, so stopping on it keeps its
level). The rule:

- `fixed`: every seed up to the cap (the design before this module: the sequence is still
  reported);
- `decided`: stop at the first n >= --min-seeds where every comparison's interval excludes 0;
- `half-width:X`: stop at the first n >= --min-seeds where every comparison's half-width <= X;
- `equivalent[:M]`: stop at the first n >= --min-seeds where every comparison's interval lies
  inside (-M, +M) nats: "no practical difference" (M = 0.02 unless given);
- `decided+equivalent[:M]`: stop at the first n >= --min-seeds where every comparison is settled
  either way: its interval excludes 0 or lies inside (-M, +M) (whichever comes first);
- and always at the cap.

A true difference of at least M in size lies outside (-M, +M), so the interval lies inside only
when it misses the truth: the false "no practical difference" rate is at most --stop-alpha
however often it is looked at, as the false "decided" rate is (tests/compare/test_sequential.py
simulates both, and a naive fixed-n t interval that fails).

The question (`--stop-on`): `each` = every allocation vs uniform; `best` = the comparisons the
lowest-loss allocation rests on: it vs uniform and vs its neighbours in the allocation list
(`--paper scaling`: the ratios on either side of the best, which the fitted parabola rests on).

Determinism: the decision at n reads ONLY seeds 0..n-1 and is taken at the first such n, in
order, never at "whichever cells finished first"; cells of later seeds that were already running
stop at their next step with a checkpoint (or, done first, stay cached) and take no part
(`truncated`: the grid the report describes). So the
same command gives the same stop on any number of workers, under any load and after any
interruption, and a stopped comparison resumed with a tighter rule continues from its cache.

`Monitor` is what the executor consults (`taperlm.compare.executor.run_grid`); `record` is
report.json's `stopping`; `section` and `with_plot` its part of report.md and `sequence.png`.
Every stage that trains reported seeds goes through `taperlm.compare.executor.train_reported`,
which ties these together, so a new compare mode that does the same stops the same way.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taperlm.analysis import stats
from taperlm.analysis.plots import plot_interval_series
from taperlm.compare.grid import Grid
from taperlm.compare.options import EQUIVALENCE_KINDS, STOP_QUESTIONS, Stop, StopKind
from taperlm.compare.report import md_table
from taperlm.errors import ConfigError

if TYPE_CHECKING:
    from taperlm.compare.runner import Results

QUESTIONS = STOP_QUESTIONS
SEQUENCE_PLOT = "sequence.png"


@dataclass(frozen=True)
class StopRule:
    """When a comparison stops adding seeds (see the module docstring)."""

    kind: StopKind
    half_width: float | None = None  # nats, for half-width
    alpha: float = 0.05  # the error rate of each comparison's confidence sequence
    min_seeds: int = 3
    question: str = "each"  # each | best
    margin: float | None = None  # nats, for equivalent and decided+equivalent

    @property
    def text(self) -> str:
        if self.kind in EQUIVALENCE_KINDS:
            return f"{self.kind}:{self.margin:g}"
        return f"half-width:{self.half_width:g}" if self.kind == "half-width" else self.kind


def parse_rule(stop: Stop | str, alpha: float, min_seeds: int, question: str) -> StopRule:
    """The rule of --stop/--stop-alpha/--min-seeds/--stop-on; ConfigError on a bad value. `stop`
    is parsed already where the options were read (`CompareOptions.stop`); a text is parsed here
    (a replay of finished reports, benchmarks/sequential_replay.py)."""
    if not 0.0 < alpha < 1.0:
        raise ConfigError(f"--stop-alpha must be in (0, 1), e.g. 0.05; got {alpha:g}")
    if min_seeds < 1:
        raise ConfigError(f"--min-seeds must be >= 1, got {min_seeds}")
    if question not in QUESTIONS:
        raise ConfigError(f"--stop-on must be one of {', '.join(QUESTIONS)}; got {question!r}")
    rule = stop if isinstance(stop, Stop) else Stop.parse(stop)
    return StopRule(rule.kind, rule.half_width, alpha, min_seeds, question, rule.margin)


def rule_of(opts: Any) -> StopRule:
    """The stop rule of a CompareOptions."""
    return parse_rule(opts.stop, opts.stop_alpha, opts.min_seeds, opts.stop_on)


# ----------------------------------------------------------------------------------------------
# the question: which paired differences must be settled


def _losses(grid: Grid, results: Results, seeds: list[int]) -> dict[str, list[float]]:
    """Allocation name -> validation loss per seed of `seeds`, in their order."""
    return {
        a.name: [results[grid.cell(a.name, s).name].val.loss for s in seeds]
        for a in grid.allocations
    }


def comparisons(grid: Grid, results: Results, n: int, question: str) -> dict[str, list[float]]:
    """The question's paired differences (label -> per-seed differences, seeds 0..n-1 in order)
    from seeds[:n] alone (all of their cells must be in `results`)."""
    seeds = grid.seeds[:n]
    losses = {
        a.label: [results[grid.cell(a.name, s).name].val.loss for s in seeds]
        for a in grid.allocations
    }
    uniform = next(a.label for a in grid.allocations if a.is_uniform)
    return question_diffs(losses, uniform, question)


def question_diffs(
    losses: dict[str, list[float]], uniform: str, question: str
) -> dict[str, list[float]]:
    """The question's paired differences from per-seed losses (label -> values over the same
    seeds, in the allocation list's order; `uniform`: the baseline's label). Losses relative to
    uniform's of the same seed give the same differences (benchmarks/sequential_replay.py)."""
    labels = list(losses)

    def diff(a: str, b: str) -> list[float]:
        return [x - y for x, y in zip(losses[a], losses[b])]

    if question == "each":
        return {a: diff(a, uniform) for a in labels if a != uniform}
    # best: the lowest mean loss over these seeds (first in the list on a tie) and the
    # comparisons it rests on — vs uniform and vs its neighbours in the allocation list
    i = min(range(len(labels)), key=lambda k: (math.fsum(losses[labels[k]]), k))
    best = labels[i]
    others = [uniform] + [labels[k] for k in (i - 1, i + 1) if 0 <= k < len(labels)]
    return {f"{best} − {o}": diff(best, o) for o in others if o != best}


def complete_seeds(grid: Grid, results: Results) -> int:
    """How many leading seeds (0, 1, ... in the grid's order) have all of their cells done."""
    n = 0
    for s in grid.seeds:
        if not all(grid.cell(a.name, s).name in results for a in grid.allocations):
            break
        n += 1
    return n


@dataclass(frozen=True)
class ComparisonState:
    """One comparison's anytime-valid interval after n seeds."""

    n: int  # seeds so far
    mean: float  # the mean paired difference
    half: float  # the interval's half-width (inf while unbounded)
    ci: tuple[float, float]  # (mean - half, mean + half); (-inf, inf) while unbounded
    excludes_zero: bool  # whether the interval excludes 0
    within_margin: bool = False  # whether it lies inside +-margin (rules with a margin only)

    def to_json(self) -> dict[str, Any]:
        """JSON has no infinity: an unbounded interval's half and ci are written as null."""
        bounded = math.isfinite(self.half)
        return {
            "n": self.n,
            "mean": self.mean,
            "half": self.half if bounded else None,
            "ci": list(self.ci) if bounded else None,
            "excludes_zero": self.excludes_zero,
            "within_margin": self.within_margin,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ComparisonState:
        ci = data["ci"]
        unbounded = data["half"] is None
        return cls(
            data["n"],
            data["mean"],
            math.inf if unbounded else data["half"],
            (-math.inf, math.inf) if unbounded else (ci[0], ci[1]),
            data["excludes_zero"],
            bool(data.get("within_margin", False)),  # reports before issue 62 have none
        )


@dataclass(frozen=True)
class SequenceStep:
    """The stop rule's view after n seeds."""

    n: int  # seeds 0..n-1
    comparisons: dict[str, ComparisonState]  # label -> its interval
    stops: bool  # whether the rule stops here

    def to_json(self) -> dict[str, Any]:
        comparisons = {k: v.to_json() for k, v in self.comparisons.items()}
        return {"n": self.n, "comparisons": comparisons, "stops": self.stops}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SequenceStep:
        comparisons = {k: ComparisonState.from_json(v) for k, v in data["comparisons"].items()}
        return cls(data["n"], comparisons, data["stops"])


@dataclass(frozen=True)
class Stopping:
    """When and why a comparison stopped adding seeds (report.json's `stopping`)."""

    rule: str  # --stop as given
    alpha: float  # the error rate per comparison
    confidence: float  # 1 - alpha
    min_seeds: int  # --min-seeds
    stop_on: str  # --stop-on: the comparisons that must be settled
    cap: int  # --seeds: the most seeds
    seeds_used: int  # the seeds the report uses
    stopped_at: int  # the n it stopped at
    reason: str  # the rule's kind that stopped it (`outcome`), or "cap"
    construction: str  # the interval's construction, in words
    sequence: list[SequenceStep]  # per n = 1..stopped_at
    plotted: bool = False  # `with_plot` ran (only then is report.json's `plot` written)
    plot: str | None = None  # sequence.png (None: no bounded interval to draw)

    @property
    def margin(self) -> float | None:
        """The equivalence margin of the rule (nats), None for a rule without one."""
        kind, _, value = self.rule.partition(":")
        return float(value) if kind in EQUIVALENCE_KINDS else None

    def settled_verdicts(self) -> dict[str, str]:
        """label -> the verdict of each comparison settled as "no practical difference" where it
        stopped (report.md's "Verdict" says it in place of the fixed-n reading); {} otherwise."""
        if self.reason not in EQUIVALENCE_KINDS or not self.sequence:
            return {}
        pct, margin = f"{100 * self.confidence:g}%", self.margin
        return {
            label: f"no practical difference (within ±{margin:g} nats), Δ {e.mean:+.4f} nats, "
            f"{pct} anytime-valid interval [{e.ci[0]:+.4f}, {e.ci[1]:+.4f}] after {e.n} seeds"
            for label, e in self.sequence[-1].comparisons.items()
            if e.within_margin
        }

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["sequence"] = [step.to_json() for step in self.sequence]
        del out["plotted"]
        if not self.plotted:
            del out["plot"]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Stopping:
        names = [f.name for f in dataclasses.fields(cls) if f.name not in ("plotted", "plot")]
        out = {k: data[k] for k in names}
        out["sequence"] = [SequenceStep.from_json(step) for step in data["sequence"]]
        return cls(**out, plotted="plot" in data, plot=data.get("plot"))


def _state(rule: StopRule, diffs: dict[str, list[float]]) -> dict[str, ComparisonState]:
    """label -> the confidence sequence's last entry, whether it excludes 0 and (a rule with a
    margin) whether it lies inside (-margin, +margin)."""
    out = {}
    for label, xs in diffs.items():
        last = stats.confidence_sequence(xs, rule.alpha)[-1]
        lo, hi = last.ci
        within = rule.margin is not None and -rule.margin < lo and hi < rule.margin
        out[label] = ComparisonState(
            last.n, last.mean, last.half, last.ci, bool(lo > 0 or hi < 0), within
        )
    return out


def stops_at(rule: StopRule, diffs: dict[str, list[float]]) -> bool:
    """Whether the rule stops after these differences (n = their length; the cap aside)."""
    return stop_reason(rule, diffs) is not None


def stop_reason(rule: StopRule, diffs: dict[str, list[float]]) -> str | None:
    """Why the rule stops after these differences (`outcome`), None where it does not (n =
    their length; the cap aside)."""
    n = min((len(d) for d in diffs.values()), default=0)
    if rule.kind == "fixed" or n < rule.min_seeds:
        return None
    state = _state(rule, diffs)
    return outcome(rule, state) if holds(rule, state) else None


def holds(rule: StopRule, state: dict[str, ComparisonState]) -> bool:
    """Whether the rule stops here (the cap and --min-seeds aside)."""
    if rule.kind == "fixed" or not state:  # nothing to decide: the fixed design
        return False
    if rule.kind == "decided":
        return all(e.excludes_zero for e in state.values())
    if rule.kind == "equivalent":
        return all(e.within_margin for e in state.values())
    if rule.kind == "decided+equivalent":
        return all(e.excludes_zero or e.within_margin for e in state.values())
    return all(e.half <= rule.half_width for e in state.values())


def outcome(rule: StopRule, state: dict[str, ComparisonState]) -> str:
    """Why a rule that holds here stops (report.json's `reason`): its kind; for
    decided+equivalent, `equivalent` when every comparison is inside the margin, `decided` when
    every one excludes 0 (and is not inside the margin), else the two together."""
    if rule.kind != "decided+equivalent":
        return rule.kind
    if all(e.within_margin for e in state.values()):
        return "equivalent"
    if not any(e.within_margin for e in state.values()):
        return "decided"
    return rule.kind


class Monitor:
    """The rule applied as seeds complete: `update(results)` walks n = 1, 2, ... over the
    complete leading seeds and returns True once the rule stops (at `stopped_at`); it never looks
    past the first n at which it stops."""

    def __init__(self, rule: StopRule, grid: Grid) -> None:
        self.rule, self.grid = rule, grid
        self.checked = 0  # seeds 0..checked-1 examined
        self.stopped_at: int | None = None
        self.reason: str | None = None

    def update(self, results: Results) -> bool:
        if self.stopped_at is not None:
            return True
        ready = complete_seeds(self.grid, results)
        cap = len(self.grid.seeds)
        while self.checked < ready:
            n = self.checked = self.checked + 1
            question = self.rule.question
            reason = stop_reason(self.rule, comparisons(self.grid, results, n, question))
            if reason is not None:
                self.stopped_at, self.reason = n, reason
                return n < cap  # at the cap, nothing is left to skip anyway
            if n == cap:
                self.stopped_at, self.reason = n, "cap"
        return False

    def wants(self, seed: int) -> bool:
        """Whether a cell of `seed` should still be started."""
        return self.stopped_at is None or seed in self.grid.seeds[: self.stopped_at]


def truncated(grid: Grid, n: int) -> Grid:
    """The grid of its first n seeds (what a comparison stopped at n reports)."""
    if n >= len(grid.seeds):
        return grid
    keep = set(grid.seeds[:n])
    return Grid(
        grid.allocations,
        grid.seeds[:n],
        [c for c in grid.cells if c.seed in keep],
        grid.base,
        grid.budget,
        grid.paper,
        grid.pilot,
    )


def record(
    rule: StopRule, grid: Grid, results: Results, stopped_at: int, reason: str, cap: int
) -> Stopping:
    """report.json's `stopping`: the rule, where and why it stopped, and every comparison's
    confidence sequence over the seeds used (`best` questions may change their labels with n)."""
    sequence = []
    for n in range(1, stopped_at + 1):
        state = _state(rule, comparisons(grid, results, n, rule.question))
        sequence.append(SequenceStep(n, state, n >= rule.min_seeds and holds(rule, state)))
    return Stopping(
        rule=rule.text,
        alpha=rule.alpha,
        confidence=1.0 - rule.alpha,
        min_seeds=rule.min_seeds,
        stop_on=rule.question,
        cap=cap,
        seeds_used=stopped_at,
        stopped_at=stopped_at,
        reason=reason,
        construction="t-mixture confidence sequence (Lai 1976; Wang & Ramdas 2023), "
        f"mixture precision c = {stats.CS_PRECISION:g}; Gaussian paired differences assumed",
        sequence=sequence,
    )


def why(stopping: Stopping) -> str:
    """One sentence: when and why the comparison stopped."""
    n, cap, pct = stopping.stopped_at, stopping.cap, f"{100 * stopping.confidence:g}%"
    reason = stopping.reason
    if reason == "decided":
        return (
            f"stopped after {n} of at most {cap} seeds: every comparison's {pct} anytime-valid "
            "interval excludes 0 (--stop decided)"
        )
    if reason == "equivalent":
        return (
            f"stopped after {n} of at most {cap} seeds: every comparison's {pct} anytime-valid "
            f"interval lies within ±{stopping.margin:g} nats: no practical difference "
            f"(--stop {stopping.rule})"
        )
    if reason == "decided+equivalent":
        return (
            f"stopped after {n} of at most {cap} seeds: every comparison's {pct} anytime-valid "
            f"interval excludes 0 or lies within ±{stopping.margin:g} nats (--stop "
            f"{stopping.rule})"
        )
    if reason == "half-width":
        return (
            f"stopped after {n} of at most {cap} seeds: every comparison's {pct} anytime-valid "
            f"interval is within ±{stopping.rule.split(':')[1]} nats (--stop {stopping.rule})"
        )
    if stopping.rule == "fixed":
        return f"ran all {cap} seeds (--stop fixed: the fixed design)"
    return (
        f"ran all {cap} seeds (the cap, --seeds) without the rule --stop {stopping.rule} being met"
    )


# ----------------------------------------------------------------------------------------------
# report


def with_plot(stopping: Stopping, out_dir: Path) -> Stopping:
    """`stopping` with `plot` set after drawing sequence.png (each comparison's anytime-valid
    interval against the number of seeds; unbounded ones left out)."""
    series: dict[str, list] = {}
    for step in stopping.sequence:
        for label, e in step.comparisons.items():
            if math.isfinite(e.half):
                series.setdefault(label, []).append((step.n, e.mean, *e.ci))
    if not series:
        return dataclasses.replace(stopping, plotted=True, plot=None)
    plot_interval_series(
        series,
        out_dir / SEQUENCE_PLOT,
        title=f"Anytime-valid {100 * stopping.confidence:g}% interval as seeds are added",
        xlabel="seeds (0..n-1, in order)",
        ylabel="val loss difference, nats (paired)",
    )
    return dataclasses.replace(stopping, plotted=True, plot=SEQUENCE_PLOT)


def section(stopping: Stopping) -> list[str]:
    """report.md's "When it stopped" section."""
    pct = f"{100 * stopping.confidence:g}%"
    labels: list[str] = []
    for step in stopping.sequence:
        labels += [k for k in step.comparisons if k not in labels]
    head = ["seeds", *(f"{k}: Δ nats [{pct} anytime]" for k in labels)]
    rows = []
    for step in stopping.sequence:
        cells = [str(step.n) + (" (stop)" if step.stops else "")]
        for k in labels:
            e = step.comparisons.get(k)
            if e is None:
                cells.append("")
            elif not math.isfinite(e.half):
                cells.append(f"{e.mean:+.4f} (unbounded)")
            else:
                mark = (" *" if e.excludes_zero else "") + (" ≈" if e.within_margin else "")
                cells.append(f"{e.mean:+.4f} [{e.ci[0]:+.4f}, {e.ci[1]:+.4f}]{mark}")
        rows.append(cells)
    lines = [
        "## When it stopped",
        "",
        f"The comparison {why(stopping)}.",
        "",
        f"Rule `--stop {stopping.rule}`, error rate {stopping.alpha:g} per comparison, "
        f"at least {stopping.min_seeds} seeds, at most {stopping.cap} (`--seeds`), "
        f"question `--stop-on {stopping.stop_on}`. Seeds are added in order and the decision "
        "at n uses seeds 0..n-1 only, so the stop is the same on any number of workers; cells "
        "of later seeds that were already running may be in runs/ (checkpointed or done) but "
        f"are not part of this report. The interval is the {pct} {stopping.construction}: it holds at every "
        "n at once, so stopping on it keeps its level. The Student-t intervals of the tables "
        "above are the fixed-n ones at the n it stopped at, shown for comparison with fixed "
        "designs; after a data-dependent stop only the anytime-valid interval keeps its level.",
        "",
        *md_table(head, rows),
        "",
        "`*`: the interval excludes 0."
        + (
            f" `≈`: it lies within ±{stopping.margin:g} nats (no practical difference)."
            if stopping.margin is not None
            else ""
        ),
        "",
    ]
    if stopping.plot:
        lines += [f"![the interval as seeds are added]({stopping.plot})", ""]
    return lines

"""The numbers of a comparison from its cells' results: per allocation, summaries over seeds and
paired differences vs uniform; the difference against tokens seen and its crossing point; and
the sequential rule that decides how many seeds a comparison needs.

Summaries (`summarize`): per allocation, budgets and summaries over seeds (mean, sample std),
paired differences vs uniform with t intervals (`taperlm.analysis.stats`), novelty
correlations, zero-shot rows, the design checks and the comparison with the paper (Spearman rank
correlation between our mean val ppl and the paper's, the fraction of allocation pairs ordered
as in the paper, and for the sweep the paper's two claims).

The difference against tokens seen (`loss_vs_tokens`): A short run can show an advantage that longer training removes (issue 38: at nano the taper
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

Sequential seeds: a comparison adds seeds in order and stops as soon as its question is
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

`Monitor` is what the executor consults (`taperlm.compare.execute.run_grid`); `record` is
report.json's `stopping`. Every stage that trains reported seeds goes through
`taperlm.compare.execute.train_reported`, which ties these together, so a new compare mode that
does the same stops the same way."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from taperlm.analysis import stats
from taperlm.compare.grid import PAPER_BEST_SWEEP_RATIO, PAPER_SWEEP, SWEEP_SCHEDULES, Grid
from taperlm.compare.options import EQUIVALENCE_KINDS, STOP_QUESTIONS, Stop, StopKind, paper_mode
from taperlm.compare.results import (
    AllocationCurve,
    AllocationSummary,
    CellResult,
    ComparisonState,
    ComparisonSummary,
    Crossing,
    CrossingInterval,
    DeltaAt,
    DesignChecks,
    DiffVsUniform,
    Execution,
    ExecutionSetting,
    LossVsTokens,
    NoveltySummary,
    PaperComparison,
    PilotSummary,
    RatioOrdering,
    Results,
    SeedNumbers,
    SequenceStep,
    Stopping,
    SweepClaims,
    ZeroShotColumn,
)
from taperlm.errors import ConfigError
from taperlm.evaluation.suite import at_chance, chance_columns, paper_columns


def _loss(r: CellResult) -> float:
    return r.val.loss


def _ppl(r: CellResult) -> float:
    return r.val.ppl


def _by_seed(results: list[CellResult], get) -> dict[int, float]:
    out = {}
    for r in results:
        v = get(r)
        if v is not None:
            out[int(r.seed)] = float(v)
    return out


def _layer_means(results: list[CellResult], key: str) -> list[float | None]:
    rows = [r.novelty.rho_means(key) for r in results]
    if not rows:
        return []
    out: list[float | None] = []
    for vals in zip(*rows):
        ok = [v for v in vals if v is not None]
        out.append(stats.mean(ok) if ok else None)
    return out


def summarize(grid: Grid, results: dict[str, CellResult]) -> ComparisonSummary:
    """Every number behind the report."""
    uniform = next(a for a in grid.allocations if a.is_uniform)
    per_alloc: dict[str, list[CellResult]] = {a.name: [] for a in grid.allocations}
    for c in grid.cells:
        if c.name in results:
            per_alloc[c.allocation.name].append(results[c.name])

    u_loss = _by_seed(per_alloc[uniform.name], _loss)
    u_ppl = _by_seed(per_alloc[uniform.name], _ppl)
    allocations = [
        _allocation_entry(grid, a, per_alloc[a.name], u_loss, u_ppl) for a in grid.allocations
    ]
    times = {"train_s": 0.0, "val_s": 0.0, "zero_shot_s": 0.0, "novelty_s": 0.0}
    for r in results.values():
        times["train_s"] += r.train.wall_s or 0.0
        for k in ("val_s", "zero_shot_s", "novelty_s"):
            times[k] += (r.times or {}).get(k) or 0.0
    return ComparisonSummary(
        allocations=allocations,
        pilot=_pilot_summary(grid),
        run_times=times,
        execution=execution(grid, results),
        checks=_checks(grid, results),
        paper_comparison=_paper_comparison(allocations, grid),
    )


def _allocation_entry(
    grid: Grid, a, rs: list[CellResult], u_loss: dict[int, float], u_ppl: dict[int, float]
) -> AllocationSummary:
    """Budget, per-seed numbers, summaries over seeds and the paired difference vs uniform of
    one allocation (`rs`: its results)."""
    b = grid.budget[a.name]
    loss_s, ppl_s = _by_seed(rs, _loss), _by_seed(rs, _ppl)
    diff = None
    if not a.is_uniform:
        diff = DiffVsUniform(
            stats.paired_difference(loss_s, u_loss), stats.paired_difference(ppl_s, u_ppl)
        )
    return AllocationSummary(
        name=a.name,
        label=a.label,
        taper=a.spec_string,
        widths=b.widths,
        baseline_width=b.baseline_width,
        heads=b.heads,
        baseline_heads=b.baseline_heads,
        kv_heads=b.kv_heads,
        kv_cache_bytes_per_token_bf16=b.kv_cache_bytes_per_token_bf16,
        widths_by_seed=b.widths_by_seed,
        pilot=a.needs_pilot,
        params=b.params,
        flops_per_token=b.flops_per_token,
        paper_ppl=a.paper_ppl,
        seeds=sorted(loss_s),
        val_loss=stats.summary([loss_s[s] for s in sorted(loss_s)]),
        val_ppl=stats.summary([ppl_s[s] for s in sorted(ppl_s)]),
        tokens_per_s=stats.summary(list(_by_seed(rs, lambda r: r.train.tokens_per_s).values())),
        train_loss=stats.summary(list(_by_seed(rs, lambda r: r.train.train_loss).values())),
        diff_vs_uniform=diff,
        novelty=NoveltySummary(
            pearson_mlp=stats.summary(list(_by_seed(rs, lambda r: r.novelty.pearson_mlp).values())),
            pearson_block=stats.summary(
                list(_by_seed(rs, lambda r: r.novelty.pearson_block).values())
            ),
            rho_mlp_per_layer=_layer_means(rs, "rho_mlp"),
            rho_block_per_layer=_layer_means(rs, "rho_block"),
            tokens=rs[0].novelty.n_tokens if rs else None,
        ),
        zero_shot=_zero_shot_summary(rs),
        per_seed={
            str(r.seed): SeedNumbers(
                val_loss=r.val.loss,
                val_ppl=r.val.ppl,
                val_tokens=r.val.tokens,
                train_loss=r.train.train_loss,
                tokens_per_s=r.train.tokens_per_s,
                train_wall_s=r.train.wall_s,
                pearson_mlp=r.novelty.pearson_mlp,
                data_order_sha256=r.data_order.sha256,
                zero_shot=r.zero_shot.paper_row if r.zero_shot else None,
                times=r.times,
            )
            for r in sorted(rs, key=lambda r: r.seed)
        },
    )


# What a cell's numbers can depend on besides its config: recorded per session, compared here.
EXECUTION_KEYS = ("threads", "torch", "cpu_capability", "device")


def execution(grid: Grid, results: dict[str, CellResult]) -> Execution:
    """How the cells actually ran: every distinct (threads, torch, CPU capability, device) of
    their training and evaluation sessions with the cells (and steps) it covered, and the
    numbers of cells run at a time. `consistent` is False when cells or parts of one cell ran
    with different settings (their numbers may then differ in the last bits from a rerun)."""
    combos: dict[tuple, tuple[list[str], list[int]]] = {}  # key -> (cells, [train steps])
    jobs: set[int] = set()
    for c in grid.cells:
        r = results.get(c.name)
        if r is None:
            continue
        for sess in r.sessions:
            key = tuple(getattr(sess, k) for k in EXECUTION_KEYS)
            cells, steps = combos.setdefault(key, ([], [0]))
            if c.name not in cells:
                cells.append(c.name)
            if sess.phase == "train":
                steps[0] += (sess.to_step or 0) - (sess.from_step or 0)
            if isinstance(sess.jobs, int):
                jobs.add(sess.jobs)
    settings = [
        ExecutionSetting(*key, cells=cells, train_steps=steps[0])
        for key, (cells, steps) in combos.items()
    ]
    return Execution(
        settings=settings,
        jobs=sorted(jobs),
        consistent=len(combos) <= 1,
        single_thread=all(e.threads == 1 for e in settings),
    )


def _pilot_summary(grid: Grid) -> PilotSummary | None:
    """The pilots' cost (novelty:pilot allocations): tokens per pilot, its share of a run's
    tokens, and mean training / novelty seconds per seed."""
    if grid.pilot is None:
        return None
    runs = grid.pilot.per_seed.values()
    train_s = [r.train_s for r in runs if r.train_s is not None]
    novelty_s = [r.novelty_s for r in runs if r.novelty_s is not None]
    return PilotSummary(
        tokens=grid.pilot.tokens,
        fraction_of_run=grid.pilot.tokens / grid.base.train.tokens,
        train_s=stats.summary(train_s),
        novelty_s=stats.summary(novelty_s),
        per_seed={str(seed): run for seed, run in grid.pilot.per_seed.items()},
    )


def _zero_shot_summary(rs: list[CellResult]) -> dict[str, ZeroShotColumn] | None:
    rows = [r.zero_shot.paper_row for r in rs if r.zero_shot]
    rows = [x for x in rows if x]
    if not rows:
        return None
    out = {}
    for col in rows[0]:
        vals = [x[col] for x in rows if x.get(col) is not None]
        if vals:
            out[col] = ZeroShotColumn(*dataclasses.astuple(stats.summary(vals)))
    _mark_chance(out, rs)
    return out


def _mark_chance(columns: dict[str, ZeroShotColumn], rs: list[CellResult]) -> None:
    """Sets `chance` (the no-skill accuracy, %) and `at_chance` (the mean is not significantly
    above it) of the accuracy columns whose task has a chance level."""
    zs = next((r.zero_shot for r in rs if r.zero_shot and r.zero_shot.chance), None)
    if zs is None:
        return  # results from before chance levels were recorded
    task_of = {col.label: task.name for task, col in paper_columns()}
    for col, chance in chance_columns(zs.chance).items():
        entry = columns.get(col)
        if entry is not None and entry.mean is not None:
            n = zs.tasks[task_of[col]].n
            columns[col] = dataclasses.replace(
                entry, chance=chance, at_chance=at_chance(entry.mean, chance, n)
            )


def _checks(grid: Grid, results: dict[str, CellResult]) -> DesignChecks:
    params = {grid.budget[a.name].params for a in grid.allocations}
    flops = {grid.budget[a.name].flops_per_token for a in grid.allocations}
    order_ok, init_ok = True, True
    for seed in grid.seeds:
        shas = {
            results[c.name].data_order.sha256
            for c in grid.cells
            if c.seed == seed and c.name in results
        }
        order_ok &= len(shas) <= 1
    for c in grid.cells:
        if c.name in results:
            init_ok &= results[c.name].trained_seed == c.seed
    distinct = {
        results[c.name].data_order.sha256
        for c in grid.cells
        if c.allocation.is_uniform and c.name in results
    }
    return DesignChecks(
        equal_params=len(params) == 1,
        equal_flops_per_token=len(flops) == 1,
        same_data_order_within_seed=order_ok,
        distinct_data_order_across_seeds=len(distinct)
        == len([c for c in grid.cells if c.allocation.is_uniform and c.name in results]),
        init_seed_equals_seed=init_ok,
    )


def _paper_comparison(allocations: list[AllocationSummary], grid: Grid) -> PaperComparison | None:
    have = [a for a in allocations if a.paper_ppl is not None and a.val_ppl.mean is not None]
    if len(have) < 2:
        return None
    ours = {a.name: a.val_ppl.mean for a in have}
    ref = {a.name: a.paper_ppl for a in have}
    names = list(ref)
    return PaperComparison(
        allocations=names,
        ours_val_ppl=ours,
        paper_val_ppl=ref,
        spearman=stats.spearman([ours[n] for n in names], [ref[n] for n in names]),
        pairwise=stats.pairwise_agreement(ours, ref),
        best_ours=min(names, key=lambda n: ours[n]),
        best_paper=min(names, key=lambda n: ref[n]),
        sweep_claims=_sweep_claims(have, grid) if _sweep_mode(grid) else None,
    )


def _sweep_mode(grid: Grid) -> bool:
    """Whether `grid` is a --paper mode's whose claims are §4's (the sweep)."""
    mode = paper_mode(grid.paper)
    return mode is not None and mode.sweep_claims


def _sweep_claims(have: list[AllocationSummary], grid: Grid) -> SweepClaims:
    """The paper's §4 claims checked on our numbers (each allocation's specs, as parsed)."""
    specs = {a.name: a.spec for a in grid.allocations}
    table: dict[tuple[float, float], dict[str, float]] = {}
    for a in have:
        spec = specs[a.name]
        if spec.schedule in SWEEP_SCHEDULES:
            table.setdefault((spec.start, spec.end), {})[spec.schedule] = a.val_ppl.mean
    per_ratio = {}
    for ratio in PAPER_SWEEP:
        row = table.get(ratio, {})
        if all(s in row for s in SWEEP_SCHEDULES):
            per_ratio[f"{ratio[0]}->{ratio[1]}"] = RatioOrdering(
                ours=row, ordered=row["cosine"] < row["linear"] < row["sigmoid"]
            )
    cos = {r: t["cosine"] for r, t in table.items() if "cosine" in t}
    best = min(cos, key=lambda r: cos[r]) if cos else None
    return SweepClaims(
        per_ratio=per_ratio,
        ordering_holds_at=sum(v.ordered for v in per_ratio.values()),
        ratios=len(per_ratio),
        best_cosine_ratio_ours=None if best is None else f"{best[0]}->{best[1]}",
        best_cosine_ratio_paper=PAPER_BEST_SWEEP_RATIO,
    )


REPORT_KEY = "loss_vs_tokens"  # report.json's key
# 2,000 resamples put the 2.5/97.5 percentiles' Monte Carlo error well below the seed-to-seed
# spread they measure; the fixed seed makes every report's interval reproducible.
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95

# How a mean-difference curve relates to zero (`Crossing.kind`).
CROSSED = "crossed"  # below zero, then at or above zero from the crossing to the end
BELOW_AT_END = "below_at_end"  # below zero at the last evaluation: the taper still ahead
NEVER_BELOW = "never_below"  # at or above zero at every evaluation: the taper never ahead
TOO_SHORT = "too_short"  # fewer than 2 shared evaluations: nothing to read
KINDS = (CROSSED, BELOW_AT_END, NEVER_BELOW, TOO_SHORT)


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
    params = grid.budget[uniform.name].params
    return LossVsTokens(
        params=params,
        eval_tokens=int(grid.base.train.eval_tokens),
        allocations=tuple(
            allocation_curve(a.name, a.label, curves[a.name], curves[uniform.name], params)
            for a in grid.allocations
            if not a.is_uniform
        ),
    )


QUESTIONS = STOP_QUESTIONS


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

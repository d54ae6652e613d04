"""`taperlm compare --tune-lr`: every allocation at its own best learning rate.

1. Tuning: every allocation is trained at every lr of the grid (`--lr-grid`, default the
   recipe's lr x DEFAULT_LR_FACTORS) on `--tune-seeds` tuning seeds. Tuning cells are ordinary
   cells (cached, resumed, run in parallel like any) named `<allocation>-lr<lr>-s<seed>` in
   OUT/runs.
2. Choice: each allocation's lr is the grid lr with the lowest mean validation loss over the
   tuning seeds (ties: the lr nearer the recipe's, in log distance).
3. Reporting: the reported seeds run each allocation at its chosen lr (cells at the recipe's lr
   are the shared-lr cells themselves, reused). The paired difference at the tuned lrs is
   reported beside the shared-lr one.

No selection bias: the tuning seeds (TUNE_SEED_BASE + i) are disjoint from the reported seeds
(0..N-1), and a seed sets both the init and the data order, so the reported runs are fresh draws
of the chosen configurations: their losses did not take part in the choice. (The validation
tokens are the same fixed text for both; with a handful of lrs per allocation the choice cannot
fit that text measurably, while the seed-to-seed spread it would otherwise pick up is the
report's whole error bar.)

`--lr-grid-extend N`: while an allocation's chosen lr sits at an edge of the grid, the lr one grid
step beyond that edge (x or / the ratio of the grid's two outermost lrs on that side) joins the
grid and the new tuning cells train (the others are reused), at most N times; the report keeps
`at_edge` when the last grid still ends at the choice.

`--tune-lr-scope uniform` tunes the uniform allocation only and trains every allocation at its
lr (the baseline tuned, the others at the same lr): the scaling sweep's choice, at a fraction of
the cost."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from taperlm.analysis import stats
from taperlm.compare.execute import train_cells, train_reported
from taperlm.compare.grid import Allocation, AllocationBudget, Cell, Grid, build_grid
from taperlm.compare.options import DEFAULT_TUNE_SEEDS, TUNE_SCOPES
from taperlm.compare.results import (
    CellResult,
    LrCurve,
    LrPoint,
    LrTuning,
    Results,
    TunedRow,
    TuningCost,
)
from taperlm.compare.statistics import summarize
from taperlm.errors import ConfigError

# Tuning seeds start here: far above any reported seed count, so the two sets never meet.
TUNE_SEED_BASE = 10_000
# The default grid: the recipe's lr x these factors. Powers of two on both sides of the recipe
# (the lr optimum of Adam is flat on a log scale, so steps of 2x resolve it to within ~10% in
# loss terms), two steps up because small models and short runs usually tolerate higher lrs
# than the recipe's compromise, one down to see the other flank of the curve.
DEFAULT_LR_FACTORS = (0.5, 1.0, 2.0, 4.0)


def lr_grid(lrs: Sequence[float] | None, recipe_lr: float) -> list[float]:
    """The sorted lrs to try: --lr-grid's (parsed and checked with the options,
    `taperlm.compare.options.parse_lr_grid`), or the default around `recipe_lr`."""
    if not lrs:
        return sorted(recipe_lr * f for f in DEFAULT_LR_FACTORS)
    return sorted(lrs)


def tuning_seeds(n: int, reported: list[int]) -> list[int]:
    """The tuning seeds: TUNE_SEED_BASE, +1, ...; ConfigError unless disjoint from `reported`."""
    if n < 1:
        raise ConfigError(f"--tune-seeds must be >= 1, got {n}")
    seeds = [TUNE_SEED_BASE + i for i in range(n)]
    if set(seeds) & set(reported):
        raise ConfigError(
            f"the tuning seeds {seeds[0]}..{seeds[-1]} overlap the reported seeds; use fewer "
            f"than {TUNE_SEED_BASE} --seeds"
        )
    return seeds


def lr_tag(lr: float) -> str:
    """Directory-safe text of an lr: 0.002 -> 0.002, 1e-05 -> 1e-05."""
    return re.sub(r"[^A-Za-z0-9.-]", "", f"{lr:g}")


def _at_lr(alloc: Allocation, lr: float, label: bool = True) -> Allocation:
    return dataclasses.replace(
        alloc,
        name=f"{alloc.name}-lr{lr_tag(lr)}",
        label=f"{alloc.label} @ lr {lr:g}" if label else alloc.label,
    )


def _with_lr(grid: Grid, lr_of: dict[str, float]) -> list[Cell]:
    """The grid's cells with each allocation's lr set (after build_grid's checks, which hold
    one lr per grid)."""
    out = []
    for c in grid.cells:
        cfg = copy.deepcopy(c.config)
        cfg.train.lr = lr_of[c.allocation.name]
        out.append(Cell(c.allocation, c.seed, cfg))
    return out


def tuning_grid(
    base, allocs: list[Allocation], seeds: list[int], lrs: list[float], scope: str
) -> tuple[Grid, dict[tuple[str, float], str]]:
    """Every allocation (scope `uniform`: the uniform one) at every lr on the tuning `seeds`;
    returns the grid and (allocation name, lr) -> tuning allocation name."""
    tuned = [a for a in allocs if a.is_uniform] if scope == "uniform" else list(allocs)
    cells: list[Cell] = []
    grid_allocs: list[Allocation] = []
    names: dict[tuple[str, float], str] = {}
    budget: dict[str, AllocationBudget] = {}
    for lr in lrs:
        renamed = [_at_lr(a, lr) for a in tuned]
        cfg = copy.deepcopy(base)
        cfg.train.lr = lr
        g = build_grid(cfg, renamed, seeds)
        cells += g.cells
        grid_allocs += renamed
        budget.update(g.budget)
        for a, r in zip(tuned, renamed):
            names[(a.name, lr)] = r.name
    cells.sort(key=lambda c: seeds.index(c.seed))
    first = next(c.config for c in cells if c.allocation.is_uniform)
    return Grid(grid_allocs, list(seeds), cells, first, budget), names


def choose(
    allocs: list[Allocation],
    lrs: list[float],
    names: dict[tuple[str, float], str],
    grid: Grid,
    results: Results,
    recipe_lr: float,
) -> dict[str, LrCurve]:
    """Per tuned allocation: its loss-vs-lr curve over the tuning seeds (mean, std, 95% CI) and
    the chosen lr (lowest mean; ties to the lr nearest the recipe's), flagged when at the grid's
    edge (the optimum may lie beyond it)."""
    out: dict[str, LrCurve] = {}
    for a in allocs:
        if (a.name, lrs[0]) not in names:
            continue
        curve = []
        for lr in lrs:
            name = names[(a.name, lr)]
            losses = {
                c.seed: results[c.name].val.loss
                for c in grid.cells
                if c.allocation.name == name and c.name in results
            }
            s = stats.summary([losses[k] for k in sorted(losses)])
            per_seed = {str(k): v for k, v in losses.items()}
            curve.append(LrPoint(lr, s, _interval(s), per_seed))
        have = [p for p in curve if p.loss.mean is not None]
        if not have:
            continue
        best = min(have, key=lambda p: (p.loss.mean, abs(math.log(p.lr / recipe_lr))))
        out[a.name] = LrCurve(a.label, curve, best.lr, best.lr in (lrs[0], lrs[-1]))
    return out


def extended_lrs(lrs: list[float], chosen: set[float]) -> list[float] | None:
    """`lrs` with one more lr beyond each edge some allocation's choice (`chosen`) sits at (a
    grid step further: x or / the ratio of the two outermost lrs on that side, 2 for a one-lr
    grid), or None when no choice is at an edge."""
    if len(lrs) == 1:
        up = down = 2.0
    else:
        up, down = lrs[-1] / lrs[-2], lrs[1] / lrs[0]
    more = []
    if lrs[-1] in chosen:
        more.append(lrs[-1] * up)
    if lrs[0] in chosen:
        more.append(lrs[0] / down)
    return sorted([*lrs, *more]) if more else None


def _interval(s: stats.Summary) -> list[float] | None:
    """The 95% Student-t interval of a mean (None below two values)."""
    if s.n < 2 or s.std is None:
        return None
    half = stats.t_quantile(0.975, s.n - 1) * s.std / math.sqrt(s.n)
    return [s.mean - half, s.mean + half]


def tuned_cells(grid: Grid, chosen: dict[str, float], recipe_lr: float) -> Grid:
    """The reported seeds of `grid` with each allocation at its chosen lr; an allocation at the
    recipe's lr keeps its name (its cells are the shared-lr cells, reused), the others are named
    `<allocation>-lr<lr>`."""
    rename = {
        a.name: a if chosen[a.name] == recipe_lr else _at_lr(a, chosen[a.name], label=False)
        for a in grid.allocations
    }
    cells = [
        Cell(rename[c.allocation.name], c.seed, c.config)
        for c in _with_lr(grid, {a.name: chosen[a.name] for a in grid.allocations})
    ]
    budget = {rename[k].name: v for k, v in grid.budget.items()}
    return Grid(
        [rename[a.name] for a in grid.allocations],
        list(grid.seeds),
        cells,
        grid.base,
        budget,
        grid.paper,
        grid.pilot,
    )


def cost_seconds(results: list[CellResult]) -> float:
    """Training + evaluation seconds of these cells (as recorded when each ran)."""
    total = 0.0
    for r in results:
        total += r.train.wall_s or 0.0
        total += sum((r.times or {}).values())
    return total


# ----------------------------------------------------------------------------------------------
# running


def check_tuning_options(opts, reported: list[int], allocs: list[Allocation]) -> None:
    """Tuning options without --tune-lr, or bad ones, fail before any work."""
    given = [
        flag
        for flag, on in (
            ("--lr-grid", opts.lr_grid is not None),
            ("--tune-seeds", opts.tune_seeds is not None),
            ("--tune-lr-scope", opts.tune_scope is not None),
            ("--lr-grid-extend", bool(getattr(opts, "lr_grid_extend", None))),
        )
        if on
    ]
    if not opts.tune_lr:
        if given:
            raise ConfigError(f"{', '.join(given)} belong(s) to --tune-lr; add --tune-lr")
        return
    if (opts.tune_scope or "each") not in TUNE_SCOPES:
        raise ConfigError(
            f"--tune-lr-scope {opts.tune_scope!r} is unknown; choose {' or '.join(TUNE_SCOPES)}"
        )
    tuning_seeds(opts.tune_seeds or DEFAULT_TUNE_SEEDS, reported)
    pilots = [a.label for a in allocs if a.needs_pilot]
    if pilots and (opts.tune_scope or "each") == "each":
        raise ConfigError(
            f"--tune-lr cannot tune {', '.join(pilots)}: its widths come from each reported "
            "seed's pilot, and the tuning seeds have none; use --tune-lr-scope uniform (every "
            "allocation at uniform's tuned lr)"
        )


def run_tuning(opts, base, allocs, seeds, data_dir: Path, settings) -> LrTuning:
    """Train the tuning grid (resumably, in parallel like any grid) and choose each
    allocation's lr; returns report.json's `lr_tuning` (curves, choices, cost so far)."""
    scope = opts.tune_scope or "each"
    recipe = base.train.lr
    lrs = lr_grid(opts.lr_grid, recipe)
    tseeds = tuning_seeds(opts.tune_seeds or DEFAULT_TUNE_SEEDS, seeds)
    extend = getattr(opts, "lr_grid_extend", None) or 0
    extended = 0
    while True:
        grid, names = tuning_grid(base, allocs, tseeds, lrs, scope)
        print(
            f"taperlm compare: --tune-lr: {len(grid.cells)} tuning runs ("
            f"{'every allocation' if scope == 'each' else 'uniform'} x lr "
            f"{', '.join(f'{x:g}' for x in lrs)} x tuning seeds {tseeds})",
            file=sys.stderr,
        )
        results = train_cells(opts, grid, data_dir, settings)
        curves = choose(allocs, lrs, names, grid, results, recipe)
        wider = extended_lrs(lrs, {c.chosen_lr for c in curves.values()})
        if wider is None or extended >= extend:
            break
        lrs, extended = wider, extended + 1
    for c in curves.values():
        print(
            f"taperlm compare: --tune-lr: {c.label}: lr {c.chosen_lr:g}"
            + (" (at the grid's edge)" if c.at_edge else ""),
            file=sys.stderr,
        )
    return LrTuning(
        scope=scope,
        lrs=lrs,
        extended=extended,
        recipe_lr=recipe,
        tuning_seeds=tseeds,
        reported_seeds=list(seeds),
        rule="lowest mean validation loss over the tuning seeds (disjoint from the reported "
        "seeds); ties to the lr nearest the recipe's",
        curves=curves,
        chosen_lr={k: v.chosen_lr for k, v in curves.items()},
        cost=TuningCost(len(grid.cells), cost_seconds(results.values())),
    )


def with_chosen_lr(base, tuning: LrTuning, alloc_name: str):
    """`base` at the lr chosen for `alloc_name` (scope uniform: every allocation's)."""
    cfg = copy.deepcopy(base)
    cfg.train.lr = tuning.chosen_lr[alloc_name]
    return cfg


def run_tuned(
    opts, grid: Grid, results, tuning, data_dir: Path, settings, cap: Grid | None = None
) -> None:
    """Scope `each`: the reported seeds with every allocation at its own chosen lr (cells at the
    recipe's lr are the shared-lr cells, already done); fills `tuning.tuned` and the cost.
    `grid`/`results`: the shared-lr comparison as reported; `cap`: its grid of every seed up to
    --seeds (default `grid`), over which the own-lr comparison adds seeds in order and stops on
    its own question by --stop (`tuning.tuned_stopping`)."""
    recipe = tuning.recipe_lr
    tgrid = tuned_cells(cap or grid, tuning.chosen_lr, recipe)
    tgrid, tres, tuning.tuned_stopping = train_reported(opts, tgrid, data_dir, settings)
    shared = {a.name: a for a in summarize(grid, results).allocations}
    tuned = summarize(tgrid, tres).allocations
    rows = []
    for a, t in zip(grid.allocations, tuned):
        used = {tres[c.name].trained_lr for c in tgrid.cells if c.name in tres}
        s = shared[a.name]
        rows.append(
            TunedRow(
                name=a.name,
                label=a.label,
                lr=tuning.chosen_lr[a.name],
                lr_used=sorted(used),
                runs=t.name,
                shared_loss=s.val_loss,
                tuned_loss=t.val_loss,
                shared_diff=s.diff_vs_uniform and s.diff_vs_uniform.val_loss,
                tuned_diff=t.diff_vs_uniform and t.diff_vs_uniform.val_loss,
                tuned_per_seed={k: v.val_loss for k, v in t.per_seed.items()},
            )
        )
    tuning.tuned = rows
    extra = [tres[c.name] for c in tgrid.cells if c.config.train.lr != recipe]
    tuning.cost.tuned_cells = len(extra)
    tuning.cost.tuned_s = cost_seconds(extra)


def finish_cost(tuning: LrTuning, reported: list[CellResult]) -> None:
    """The cost of the reported grid and the factor tuning multiplied it by."""
    c = tuning.cost
    if c.tuned_cells is None:
        c.tuned_cells = 0
    if c.tuned_s is None:
        c.tuned_s = 0.0
    c.reported_s = cost_seconds(reported)
    c.factor = (c.reported_s + c.tuning_s + c.tuned_s) / max(c.reported_s, 1e-9)

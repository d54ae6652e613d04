"""`taperlm compare`: train a grid of width allocations x seeds at one exact budget, evaluate
each run (validation loss, optional zero-shot suite, layer-wise novelty) and write a report with
paired statistics and plots.

- `job`: the options of `taperlm compare`, the base config, the default corpus, evaluation
  settings, and `run_comparison`, which runs the whole job; `families`: `--paper families`, one
  comparison per family and the family table (`family_table`); `scaling`: `--paper scaling`,
  the cosine ratio sweep at several (size, tokens) points with the fitted best ratio;
  `longrun`: `--paper tokens` / `--paper ratios`, that sweep over tokens per parameter and past
  1.9 -> 0.1, with the trends across tokens per parameter.
- `grid`: allocations (taper specs, paper modes), seeds, the per-cell run configs and the budget
  checks (equal parameters and FLOPs/token; same data order and init seed per seed).
- `runner`: brings one cell to done (train or resume, evaluate, measure), resumably, and records
  how it ran; `scheduler`: runs the grid's cells here one after the other or `--jobs` at a time
  on `workers` (spawned processes, one torch thread each), with progress and Ctrl-C handling.
- `sequential`: seeds added in order until the question is settled (`--stop`), decided from
  seeds 0..n-1 alone; `cells.train_reported` applies it to every stage that reports seeds.
- `summary`: the statistics (mean, std, paired differences with t-based CIs, rank agreement
  with the paper); `plots`: the PNGs; `report`: report.md and report.json.
"""

from taperlm.compare.grid import Allocation, Cell, Grid, build_grid, paper_allocations
from taperlm.stats import paired_difference, t_quantile

__all__ = [
    "Allocation",
    "Cell",
    "Grid",
    "build_grid",
    "paired_difference",
    "paper_allocations",
    "t_quantile",
]

"""`taperlm compare`: train a grid of width allocations x seeds at one exact budget, evaluate
each run (validation loss, optional zero-shot suite, layer-wise novelty) and write a report with
paired statistics and plots.

Every mode is a study: a function of the options returning a `StudyPlan` (its comparisons and
the report that puts them together), declared with its `--paper` name in
`options.PAPER_STUDIES`, registered from there in `studies` and run by one skeleton,
`study.run_plan`. The modules, by what they own:

- the studies: `study` (what a study is: `Part`, `StudyPlan`, `StudyProgress`, and the
  skeleton); `studies` (the registry, built from `options.PAPER_STUDIES`: every mode,
  `run_study`); `job` (one comparison: its checks, `run_comparison` with lr tuning, pilots, the
  grid and its report, the report's meta); `families` + `family_table` (`--paper families`: one
  comparison per family, the family table); `scaling` (`--paper scaling`: the ratio sweep at
  (size, tokens) points, the fitted best ratio, its report); `longrun` (`--paper tokens` /
  `ratios`: that sweep over tokens per parameter and past 1.9 -> 0.1, the trends and trend.md);
  `paper` (the paper's reference numbers and claims every study is set beside).
- the inputs of a comparison: `options` (every option, declared once, and the --paper modes:
  torch-free, for --help), `recipe` (the base config and the precedence of settings), `inputs`
  (the data dir, the default corpus cache, the evaluation settings), `reproduce` (the command
  line that reproduces a comparison).
- the grid: `grid` (allocations, paper grids, seeds, the per-cell configs and the budget
  checks); `pilots` (the novelty:pilot runs, extra cells before the grid); `tuning` (--tune-lr:
  the lr grid as extra cells, the chosen lr).
- running cells: `runner` (one cell to done: train or resume, evaluate, measure, its result,
  `CellResult`, whose `to_json`/`from_json` are result.json; `run_one`, a cell as a worker or
  this process runs it); `executor` (the one executor: a grid's cells `--jobs` at a time on
  workers, or here when one runs at a time, with progress and Ctrl-C; how many at a time; the
  call every stage makes and `train_reported`, which adds seeds by `sequential`'s rule);
  `workers` (the spawned worker processes, whose entry point sets torch's threads before
  importing it); `groups` (--nproc-per-cell: a cell as a torchrun-style group of processes on
  its own devices); `slurm` (--executor slurm: each cell a Slurm job through submitit, the
  output folder as the state); `dryrun` (--dry-run: the cells' GPU-hours before anything is
  spent); `sequential` (--stop: seeds added in order until the question is settled).
- the reading: `summary` (`ComparisonSummary` of `AllocationSummary`s: means, paired differences
  with t-based CIs, agreement with the paper; `to_json` is report.json's part); `report`
  (report.md, report.json: `ComparisonReport`, what a study's report is written from); `plots`;
  `tuning_report` (--tune-lr's section and plot); `crossing` (the paired difference against
  tokens seen during training, where the taper's advantage ends, and its bootstrap interval).
"""

from taperlm.analysis.stats import paired_difference, t_quantile
from taperlm.compare.grid import Allocation, Cell, Grid, build_grid, paper_allocations

__all__ = [
    "Allocation",
    "Cell",
    "Grid",
    "build_grid",
    "paired_difference",
    "paper_allocations",
    "t_quantile",
]

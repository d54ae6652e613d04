"""`taperlm compare`: train a grid of width allocations x seeds at one exact budget, evaluate
each run (validation loss, optional zero-shot suite, layer-wise novelty) and write a report with
paired statistics and plots.

Every mode is a study: a function of the options returning a `StudyPlan` (its comparisons and
the report that puts them together), declared with its `--paper` name in
`options.PAPER_STUDIES` and run by one skeleton, `study.run_plan`. The modules, in the order a
comparison meets them:

- `options`: every option, declared once, and the command line written back (torch-free, for
  --help); `grid`: allocations, cells, budgets, the paper's grids and reference numbers;
- `recipe`: the training recipe and the base config every cell starts from, with the precedence
  of settings (torch-free); `comparison`: one comparison top to bottom (`run_comparison`): the
  checks, the data and evaluation settings, the pilots, the grid, its report;
- `cell`: one cell to done (train or resume, evaluate, measure, result.json); `execute`: a grid's
  cells `--jobs` at a time, the progress display, the sequential stop's seeds; `workers`: the
  worker processes and process groups (torch-free at import); `slurm`: each cell a Slurm job;
  `tuning`: --tune-lr's extra cells and the chosen lr;
- `results`: every typed record (`CellResult`, `ComparisonSummary`, `LossVsTokens`, `Stopping`,
  `LrTuning`, `ComparisonReport` with its `ReportMeta`) and the JSON it is stored as, the one
  place compare's JSON files are read and written; `statistics`: the numbers from
  the cells (summaries and paired differences, the difference against tokens and its crossing,
  the sequential rule); `report`: report.md and the PNGs;
- `study`: what a study is, the registry of modes, the skeleton, --dry-run; one module per
  multi-part study: `families`, `scaling`, `longrun`, `shapes`; and `confirm`: the
  pre-registered checks (`--paper confirm`, `confirm-code`) and the rule that reads them.
"""

from taperlm.analysis.stats import paired_difference, t_quantile
from taperlm.compare.grid import Allocation, Cell, Grid, build_grid

__all__ = [
    "Allocation",
    "Cell",
    "Grid",
    "build_grid",
    "paired_difference",
    "t_quantile",
]

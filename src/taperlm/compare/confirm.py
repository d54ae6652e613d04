"""The confirmatory comparisons (`--paper confirm`, `--paper confirm-code`): the widening lead
(cosine 0.75 -> 1.25 better than uniform at micro, 2 and 10 tokens per parameter, each time one
of six uncorrected intervals on seeds 0-4) checked once, as written down before the first cell
trains (docs/compare.md, "The confirmatory comparison: pre-registered").

Each mode is one comparison of uniform against cosine 0.75 -> 1.25, fixed here so that no run
can drift from the pre-registration: the size, the tokens per parameter, the learning rate (as
tuned at that point, or tuned by the rule `--paper tokens` uses), fresh seeds (from
CONFIRM_FIRST_SEED on: never used at these points; the lr tuning's seeds are 10000 on), the
sequential rule and its error rate, and the seed cap. The run is an ordinary resumable
`taperlm compare` in --out (its report's command names every setting explicitly).

- `confirm`: micro at 10 tokens per parameter on the built-in corpus (bpe:2048), both arms at
  uniform's lr as tuned at `--paper tokens`' micro-10579968 point (0.004).
- `confirm-code`: micro at 2 tokens per parameter on the code corpus (CPython's standard library
  source, prepared at bpe:2048 with the commands of docs/compare.md, given as --data); uniform's
  lr tuned there first as `--paper tokens` tunes each point (`--tune-lr --tune-lr-scope uniform`,
  its grid extended up to LONGRUN_EXTEND times at an edge), both arms at it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from taperlm.compare.longrun import CELL_TOKENS_PER_S, LONGRUN_EXTEND, SIZES, budget_tokens
from taperlm.compare.options import (
    CONFIRM_SEEDS,
    DEFAULT_MIN_SEEDS,
    DEFAULT_STOP_ALPHA,
    CompareOptions,
)
from taperlm.compare.study import COMPARISON, Part, StudyPlan
from taperlm.compare.tuning import DEFAULT_LR_FACTORS
from taperlm.errors import ConfigError

CONFIRM_TAPERS = "uniform;cosine:0.75:1.25"
# Fresh seeds: the token axis's micro points reported seeds 0-4 and tuned on 10000-10001.
CONFIRM_FIRST_SEED = 100
# the cap: seeds 100..114 (CONFIRM_SEEDS, in options: --seeds' default in these modes)
CONFIRM_STOP = "decided"  # stop once the anytime-valid interval excludes 0
CONFIRM_ALPHA = DEFAULT_STOP_ALPHA  # 0.05: the one comparison's error rate, however it stops
CONFIRM_MIN_SEEDS = DEFAULT_MIN_SEEDS  # 3: the interval is unbounded before


@dataclass(frozen=True)
class ConfirmPoint:
    """One pre-registered comparison: where it trains and at which lr."""

    size: str  # a size of the long-training sweeps (`longrun.SIZES`)
    tokens_per_param: float
    lr: float | None  # both arms' peak lr; None: uniform's, tuned first as --paper tokens does
    corpus: str  # "built-in" (no --data) or "code" (--data: the code corpus)
    measured: str  # the exploratory result it checks


CONFIRM_POINTS: dict[str, ConfirmPoint] = {
    "confirm": ConfirmPoint(
        "micro", 10.0, 0.004, "built-in", "micro-10579968: -0.0604 [-0.1084, -0.0124], 5 of 5"
    ),
    "confirm-code": ConfirmPoint(
        "micro", 2.0, None, "code", "micro-2115584 (built-in corpus): -0.0163 [-0.0266, -0.0060]"
    ),
}
CONFIRM_MODES = tuple(CONFIRM_POINTS)  # = options.CONFIRM_MODES (tested)

# What each mode fixes, as (field, the value it must have when given, the option's flag): given
# otherwise, the run would not be the pre-registered one, so it is refused.
_FIXED = (
    ("preset", None, "--preset"),
    ("config", None, "--config"),
    ("tapers", None, "--tapers"),
    ("taper_list", (), "--taper"),
    ("tokens", None, "--tokens"),
    ("preset_size", None, "--preset-size"),
    ("families", None, "--families"),
    ("tune_lr", False, "--tune-lr"),
    ("tune_scope", None, "--tune-lr-scope"),
    ("lr_grid", None, "--lr-grid"),
    ("multiple_of", None, "--multiple-of"),
    ("first_seed", 0, "--first-seed"),
)


def confirm_options(opts: CompareOptions) -> CompareOptions:
    """The one comparison of `opts.paper` (a CONFIRM_MODES mode), with every pre-registered
    setting; ConfigError naming the option that would change one."""
    mode = opts.paper
    point = CONFIRM_POINTS.get(mode or "")
    if point is None:
        raise ConfigError(f"--paper {mode!r}: the confirmatory modes are {CONFIRM_MODES}")
    for name, free, flag in _FIXED:
        if getattr(opts, name) != free:
            raise ConfigError(
                f"--paper {mode} is pre-registered (docs/compare.md, 'The confirmatory "
                f"comparison'): it sets {flag} itself; give no {flag}"
            )
    rule = (opts.stop.as_text(), opts.stop_alpha, opts.min_seeds, opts.stop_on, opts.seeds)
    want = (CONFIRM_STOP, CONFIRM_ALPHA, CONFIRM_MIN_SEEDS, "each", CONFIRM_SEEDS)
    if rule != want:
        raise ConfigError(
            f"--paper {mode} is pre-registered with --stop {CONFIRM_STOP} --stop-alpha "
            f"{CONFIRM_ALPHA:g} --min-seeds {CONFIRM_MIN_SEEDS} --stop-on each --seeds "
            f"{CONFIRM_SEEDS}; give none of them, or exactly these"
        )
    if point.corpus == "code" and opts.data is None:
        raise ConfigError(
            f"--paper {mode} trains on the code corpus: prepare it once (docs/compare.md, "
            "'The confirmatory comparison': CPython's standard library at bpe:2048) and give "
            "it as --data DIR"
        )
    if point.corpus == "built-in" and opts.data is not None:
        raise ConfigError(f"--paper {mode} trains on the built-in corpus; give no --data")
    preset = SIZES[point.size][0]
    overrides = list(opts.overrides)
    if point.lr is not None:
        overrides.append(f"train.lr={point.lr:g}")
    return dataclasses.replace(
        opts,
        paper=None,  # one plain comparison: its report's command names every setting
        preset=preset,
        tapers=CONFIRM_TAPERS,
        tokens=budget_tokens(point.size, point.tokens_per_param),
        first_seed=CONFIRM_FIRST_SEED,
        overrides=overrides,
        tune_lr=point.lr is None,
        tune_scope="uniform" if point.lr is None else None,
        lr_grid_extend=(
            (LONGRUN_EXTEND if opts.lr_grid_extend is None else opts.lr_grid_extend)
            if point.lr is None
            else opts.lr_grid_extend
        ),
    )


def confirm_plan(opts: CompareOptions) -> StudyPlan:
    """`--paper confirm` / `confirm-code`: one comparison, run in --out itself (resumable)."""
    return StudyPlan([Part("", confirm_options(opts))], mode=opts.paper or COMPARISON)


def estimated_hours(
    mode: str, seeds: int = CONFIRM_SEEDS, cores: int = 2, tokens_per_s: float | None = None
) -> float:
    """Hours on `cores` idle cores for `seeds` reported seeds (2 cells each) and, where the lr is
    tuned, the tuning runs (4 lrs x 2 seeds, no extension), at `tokens_per_s` per core (default:
    the sweeps' measured `longrun.CELL_TOKENS_PER_S`); evaluation (~2%) left out."""
    point = CONFIRM_POINTS[mode]
    tokens = budget_tokens(point.size, point.tokens_per_param)
    runs = 2 * seeds + (0 if point.lr is not None else len(DEFAULT_LR_FACTORS) * 2)
    speed = tokens_per_s or CELL_TOKENS_PER_S[point.size]
    return runs * tokens / speed / cores / 3600

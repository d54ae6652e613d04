"""The paper's reference numbers and claims, in one place: what every compare study puts its own
measurements beside (docs/compare.md says where each comes from).

- §3, the controlled experiment, and §4, the schedule x ratio sweep: validation perplexities of
  the 440M Transformer at 30B tokens (`PAPER_CONTROLLED`, `PAPER_SWEEP`, `PAPER_UNIFORM_PPL`),
  and the sweep's claims (cosine < linear < sigmoid at every ratio; the best cosine ratio).
- §6, the family table: 760M parameters, 50B tokens (`PAPER_760M`), and its claim (tapered better
  in every family, single runs).
- The 440M point the scaling and long-training studies extrapolate to (`PAPER_440M`,
  `PAPER_POINT`: its parameters, tokens, two perplexities and best ratio).

The paper's training recipe and token budgets per size are a recipe, not a result:
`taperlm.compare.recipe.PAPER_TRAIN` / `PAPER_TOKENS`.
"""

from __future__ import annotations

import math
from typing import Any

# §3/§4: the 440M Transformer's validation perplexity with uniform widths.
PAPER_UNIFORM_PPL = 16.28

# §3, the controlled experiment: (label, groups multipliers, val ppl of the 440M Transformer).
PAPER_CONTROLLED: list[tuple[str, list[float] | None, float]] = [
    ("uniform", None, PAPER_UNIFORM_PPL),
    ("wider-early", [1.5, 1.0, 0.5], 15.96),
    ("wider-middle", [1.0, 1.5, 0.5], 16.61),
    ("wider-late", [0.5, 1.0, 1.5], 17.29),
]

# §4, the schedule x ratio sweep: (start, end) -> {schedule: val ppl}; 440M Transformer, 30B tokens.
PAPER_SWEEP: dict[tuple[float, float], dict[str, float]] = {
    (1.25, 0.75): {"cosine": 15.18, "linear": 15.96, "sigmoid": 16.44},
    (1.375, 0.625): {"cosine": 14.59, "linear": 15.80, "sigmoid": 16.44},
    (1.5, 0.5): {"cosine": 14.44, "linear": 15.96, "sigmoid": 16.12},
    (1.625, 0.375): {"cosine": 14.59, "linear": 15.64, "sigmoid": 15.96},
    (1.75, 0.25): {"cosine": 15.49, "linear": 16.28, "sigmoid": 17.12},
}
SWEEP_SCHEDULES = ("cosine", "linear", "sigmoid")  # §4's claim: better in this order per ratio
PAPER_SIGMOID_K = 10.0  # the steepness of the sweep's sigmoid schedule
# §4's claim: the best cosine ratio (report.json's sweep_claims.best_cosine_ratio_paper).
PAPER_BEST_SWEEP_RATIO = "1.5->0.5"

# §6, the family table, 760M parameters / 50B tokens: family -> (the paper's name, uniform,
# + tapered), one value per column of PAPER_760M_COLUMNS.
PAPER_760M_COLUMNS = (
    "Wiki ppl",
    "LMB ppl",
    "LMB acc",
    "PIQA",
    "Hella",
    "Wino",
    "ARC-e",
    "ARC-c",
    "SIQA",
    "BoolQ",
    "Avg",
)
PAPER_760M: dict[str, tuple[str, tuple[float, ...], tuple[float, ...]]] = {
    "transformer": (
        "Transformer++",
        (21.86, 22.29, 39.0, 68.7, 46.3, 57.1, 66.8, 35.3, 42.5, 62.3, 52.25),
        (21.42, 21.25, 40.1, 69.3, 47.0, 57.3, 66.7, 35.9, 43.0, 63.4, 52.84),
    ),
    "gated": (
        "Gated Attention",
        (20.74, 21.85, 39.7, 69.2, 46.3, 57.9, 68.4, 35.5, 41.8, 62.1, 52.61),
        (19.98, 21.44, 40.0, 69.3, 46.8, 57.8, 69.1, 35.8, 41.6, 62.6, 52.88),
    ),
    "hope": (
        "Hope-attention",
        (20.62, 21.29, 40.2, 70.1, 50.6, 56.8, 69.9, 37.1, 41.3, 63.5, 53.69),
        (20.50, 21.07, 40.3, 70.7, 51.0, 57.4, 69.2, 38.1, 41.8, 63.9, 54.05),
    ),
    "titans": (
        "Titans",
        (21.58, 23.09, 39.2, 67.7, 50.0, 52.8, 68.0, 35.6, 41.4, 63.7, 52.30),
        (20.77, 22.92, 39.9, 69.0, 51.6, 54.5, 67.9, 36.1, 42.5, 64.8, 53.29),
    ),
}
# §6's claim, quoted beside the family table's tally.
PAPER_760M_CLAIM = "tapered better in every family, single runs"

# The 440M Transformer at 30B tokens (68 tokens per parameter) that the scaling and long-training
# studies extrapolate to: §4's uniform 16.28 and cosine 1.5 -> 0.5 14.44 validation perplexity
# (read from PAPER_SWEEP, not copied); its best ratio is 1.5.
PAPER_440M_PARAMS = 440e6
PAPER_440M_TOKENS = 30e9
PAPER_BEST = 1.5  # the best cosine start ratio at 440M (end = 2 - start)
PAPER_440M: dict[str, Any] = {
    "params": PAPER_440M_PARAMS,
    "tokens_per_param": PAPER_440M_TOKENS / PAPER_440M_PARAMS,
    "ppl": (PAPER_UNIFORM_PPL, PAPER_SWEEP[(1.5, 0.5)]["cosine"]),
}
PAPER_DIFF = math.log(PAPER_440M["ppl"][1]) - math.log(PAPER_440M["ppl"][0])  # -0.1199 nats
# The same point as the scaling report's `paper_point` (the ratio sweep at 440M, docs/compare.md).
PAPER_POINT: dict[str, float] = {
    "params": PAPER_440M_PARAMS,
    "tokens": PAPER_440M_TOKENS,
    "best_start": PAPER_BEST,
}


def paper_760m(family: str) -> dict[str, Any] | None:
    """The paper's 760M rows of `family` (name, uniform and tapered per column, and the changes
    it reports: % for the perplexities, accuracy points for Avg), or None if it has none."""
    row = PAPER_760M.get(family)
    if row is None:
        return None
    name, uniform, tapered = row
    u, t = dict(zip(PAPER_760M_COLUMNS, uniform)), dict(zip(PAPER_760M_COLUMNS, tapered))
    change = {c: 100.0 * (t[c] - u[c]) / u[c] for c in ("Wiki ppl", "LMB ppl")}
    change["Avg"] = t["Avg"] - u["Avg"]  # accuracy points
    return {"name": name, "uniform": u, "tapered": t, "change": change}

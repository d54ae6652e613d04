"""Would `--stop decided+equivalent[:M]` end the main job sooner? A simulation from the main job's
observed numbers, not a measurement.

    python benchmarks/equivalence_estimate.py [--runs N] [--json OUT]

The main job (`taperlm compare`, transformer-nano at 8 tokens per parameter) runs all 7 of its
seeds today (15.9 min on 2 cores: ~0.5 min of corpus and start-up, ~132 s a seed): at that budget
uniform and the taper are close, so `--stop decided` never fires. Its per-seed paired difference
was observed at mean +0.0124 nats (the main job's 7 seeds) and +0.019, sd 0.023 (`--paper
tokens` at 8 tokens per parameter, 5 seeds; docs/compare.md, "The main job"). Per (true mean,
margin) this draws RUNS jobs of Gaussian per-seed differences with that sd, applies the rule
compare applies (each n from --min-seeds 3 on, the t-mixture confidence sequence at alpha 0.05:
stop when it excludes 0 or lies inside +-M), and reports how often it stops within half of
today's time (3 seeds: (15.9 / 2 - 0.5) / 2.2 min a seed), within today's 7, and the median
seeds it needs without a cap (`None` past 60).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from outputs import STAMP, output_file, write_output
from taperlm.analysis import stats

RUNS = 20_000
SEED = 62
ALPHA = 0.05
MIN_SEEDS = 3
TODAY_SEEDS = 7  # the main job's cap, all of which it runs today
HALF_TIME_SEEDS = 3  # seeds that fit in half of today's 15.9 min (module docstring)
HORIZON = 60  # seeds simulated; a median past it is reported as None
SPREAD = 0.023  # sd of the per-seed paired difference at 8 tokens per parameter (nats)
MEANS = (0.0124, 0.019, 0.0)  # observed (main job, --paper tokens), and no difference at all
MARGINS = (0.02, 0.03, 0.05, 0.1)  # nats; 0.02 is the default margin


def estimate(runs: int = RUNS, seed: int = SEED) -> list[dict[str, Any]]:
    """One row per (true mean, margin): the shares of simulated main jobs the combined rule
    settles within HALF_TIME_SEEDS and TODAY_SEEDS seeds, how often as "equivalent", and the
    median seeds it needs."""
    rng = np.random.default_rng(seed)
    rows = []
    for mu in MEANS:
        x = rng.normal(mu, SPREAD, size=(runs, HORIZON))
        means, half = stats.running_halfwidths(x, ALPHA)
        for margin in MARGINS:
            with np.errstate(invalid="ignore"):
                inside = (means - half > -margin) & (means + half < margin)
                settled = inside | (np.abs(means) > half)
            settled[:, : MIN_SEEDS - 1] = False
            inside[:, : MIN_SEEDS - 1] = False
            first = np.where(settled.any(axis=1), settled.argmax(axis=1) + 1, HORIZON + 1)
            equivalent_first = inside[np.arange(runs), np.minimum(first, HORIZON) - 1]
            median = float(np.median(first))
            rows.append(
                {
                    "mean": mu,
                    "sd": SPREAD,
                    "margin": margin,
                    "p_within_half": float(np.mean(first <= HALF_TIME_SEEDS)),
                    "p_within_today": float(np.mean(first <= TODAY_SEEDS)),
                    "p_equivalent_within_today": float(
                        np.mean((first <= TODAY_SEEDS) & equivalent_first)
                    ),
                    "median_seeds": None if median > HORIZON else median,
                }
            )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| true Δ, nats (sd 0.023) | margin, nats | settled by 3 seeds (half of today's time) "
        '| settled by 7 seeds (today\'s cap) | of which "no practical difference" '
        "| median seeds to settle |\n|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {r['mean']:+.4f} | ±{r['margin']:g} | {100 * r['p_within_half']:.1f}% | "
        f"{100 * r['p_within_today']:.1f}% | {100 * r['p_equivalent_within_today']:.1f}% | "
        + (f"{r['median_seeds']:g}" if r["median_seeds"] is not None else f"> {HORIZON}")
        + " |\n"
        for r in rows
    ]
    return head + "".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=RUNS, help=f"simulated jobs per row [{RUNS}]")
    ap.add_argument("--json", type=output_file, help="write the rows here")
    args = ap.parse_args(argv)
    rows = estimate(args.runs)
    print(markdown(rows), end="")
    if args.json:
        doc = {"written_by": STAMP, "args": {**vars(args), "json": str(args.json)}, "rows": rows}
        write_output(args.json, json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What sequential seeds (`taperlm compare --stop`) would have cost on finished fixed-design runs:
a replay of the recorded runs, not a new measurement.

    python benchmarks/sequential_replay.py [REPORT.json ...] [--stop decided] [--json OUT]

With no argument it replays what the repository stores with per-seed numbers:
benchmarks/results/scaling_report.json (`--paper scaling`, every point). It also takes the
report.json of any `taperlm compare` run (the main job, `--paper sweep|controlled`, a family's
`OUT/<family>/report.json`, a `--tune-lr` run) and a `--paper scaling` report.json.

For each comparison it walks the seeds in order with the rule compare uses
(`taperlm.compare.statistics.stops_at` on the per-seed losses) and reports the seeds and the
summed run time of the fixed design (every seed) and of the sequential one (the seeds up to the
stop, plus any fixed stage such as lr tuning), and whether the sequential verdict (each
comparison's sign where its anytime-valid interval excludes 0) agrees with the fixed design's
t-interval verdict and its interval contains the fixed design's estimate.

Run time per seed: a compare report records each run's own seconds (training + validation +
zero-shot + novelty: `per_seed.*.train_wall_s` and `times`), summed over the seed's runs. A
scaling report keeps one sum per point (`run_s`: tuning and reported runs); the replay splits
it evenly over the point's runs (its tuning runs train the same model for the same tokens, at
other learning rates), and keeps the tuning runs as a fixed cost of both designs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from outputs import STAMP, output_file, write_output
from taperlm.analysis import stats
from taperlm.compare import statistics
from taperlm.files.io import read_text

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_INPUTS = [RESULTS / "scaling_report.json"]
MAX_REPORT_BYTES = 256 << 20


def _rule(args: argparse.Namespace, question: str) -> statistics.StopRule:
    return statistics.parse_rule(args.stop, args.alpha, args.min_seeds, question)


def replay(
    name: str,
    losses: dict[str, list[float]],
    uniform: str,
    seed_s: list[float],
    fixed_s: float,
    rule: statistics.StopRule,
) -> dict[str, Any]:
    """One comparison: `losses` label -> per-seed losses (or losses relative to uniform's),
    seeds in order; `seed_s` the recorded run seconds of each seed; `fixed_s` the run seconds
    both designs spend anyway (lr tuning)."""
    cap = min(len(v) for v in losses.values())
    stop, reason = cap, "cap"
    for n in range(1, cap + 1):
        head = {k: v[:n] for k, v in losses.items()}
        why = statistics.stop_reason(rule, statistics.question_diffs(head, uniform, rule.question))
        if why is not None:
            stop, reason = n, why
            break
    full = statistics.question_diffs(losses, uniform, "each")
    used = statistics.question_diffs({k: v[:stop] for k, v in losses.items()}, uniform, "each")
    verdicts = []
    for label, xs in full.items():
        fixed = stats.paired_difference(dict(enumerate(xs)), dict.fromkeys(range(len(xs)), 0.0))
        seq = stats.confidence_sequence(used[label], rule.alpha)[-1]
        lo, hi = seq.ci
        fixed_ci = None if fixed.ci is None else list(fixed.ci)
        fixed_sign = _sign(fixed_ci) if fixed_ci else 0
        verdicts.append(
            {
                "comparison": label,
                "fixed_mean": fixed.mean,
                "fixed_ci": fixed_ci,
                "sequential_mean": seq.mean,
                "sequential_ci": [lo, hi] if math.isfinite(seq.half) else None,
                # a decided sign must be the fixed design's; an undecided one claims nothing
                "same_verdict": _sign([lo, hi]) in (0, fixed_sign),
                "contains_fixed_estimate": lo <= fixed.mean <= hi,
            }
        )
    return {
        "comparison": name,
        "rule": rule.text,
        "stop_on": rule.question,
        "fixed_seeds": cap,
        "sequential_seeds": stop,
        "reason": reason,
        "fixed_run_s": fixed_s + math.fsum(seed_s[:cap]),
        "sequential_run_s": fixed_s + math.fsum(seed_s[:stop]),
        "verdicts": verdicts,
    }


def _sign(ci: list[float]) -> int:
    return 1 if ci[0] > 0 else -1 if ci[1] < 0 else 0


def from_compare_report(name: str, rep: dict[str, Any], args) -> list[dict[str, Any]]:
    """A `taperlm compare` report.json: its allocations' per-seed losses and run seconds."""
    allocs = rep["allocations"]
    seeds = sorted({int(s) for a in allocs for s in a["per_seed"]})
    seeds = [s for s in seeds if all(str(s) in a["per_seed"] for a in allocs)]
    losses = {a["label"]: [a["per_seed"][str(s)]["val_loss"] for s in seeds] for a in allocs}
    uniform = next(a["label"] for a in allocs if a["diff_vs_uniform"] is None)

    def run_s(entry: dict[str, Any]) -> float:
        times = entry.get("times") or {}
        return (entry.get("train_wall_s") or 0.0) + sum(float(v or 0.0) for v in times.values())

    seed_s = [math.fsum(run_s(a["per_seed"][str(s)]) for a in allocs) for s in seeds]
    cost = (rep.get("lr_tuning") or {}).get("cost") or {}
    fixed = float(cost.get("tuning_s", 0.0))
    return [replay(name, losses, uniform, seed_s, fixed, _rule(args, args.stop_on))]


def from_scaling_report(rep: dict[str, Any], args) -> list[dict[str, Any]]:
    """A `--paper scaling` report.json: per point, every ratio's per-seed difference vs uniform
    (losses relative to uniform's give the same paired differences) and the point's run_s."""
    rows = []
    for p in rep["points"]:
        diffs = {k: v for k, v in p["diffs"].items() if v is not None}
        uniform = next(k for k, v in p["diffs"].items() if v is None)
        n = min(len(v["per_seed"]) for v in diffs.values())
        losses = {uniform: [0.0] * n, **{k: v["per_seed"][:n] for k, v in diffs.items()}}
        allocs, tuning_runs = len(losses), args.scaling_tuning_runs
        per_run = p["run_s"] / (allocs * n + tuning_runs)
        for question in ("best", "each"):
            row = replay(
                f"scaling {p['point']}",
                losses,
                uniform,
                [allocs * per_run] * n,
                tuning_runs * per_run,
                _rule(args, question),
            )
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| comparison | --stop-on | fixed: seeds | fixed: run time | sequential: seeds | "
        "sequential: run time | time saved | why it stopped | same verdict, interval holds "
        "the fixed estimate |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        saved = 1 - r["sequential_run_s"] / r["fixed_run_s"]
        ok = all(v["same_verdict"] and v["contains_fixed_estimate"] for v in r["verdicts"])
        lines.append(
            f"| {r['comparison']} | {r['stop_on']} | {r['fixed_seeds']} | "
            f"{r['fixed_run_s'] / 60:.1f} min | {r['sequential_seeds']} | "
            f"{r['sequential_run_s'] / 60:.1f} min | {100 * saved:.0f}% | {r['reason']} | "
            f"{'yes' if ok else 'NO'} |\n"
        )
    return head + "".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="*", type=Path, help="report.json files (default: stored)")
    ap.add_argument("--stop", default="decided", help="the rule, as taperlm compare --stop")
    ap.add_argument("--alpha", type=float, default=0.05, help="as --stop-alpha")
    ap.add_argument("--min-seeds", type=int, default=3, help="as --min-seeds")
    ap.add_argument("--stop-on", default="each", help="as --stop-on (compare reports)")
    ap.add_argument(
        "--scaling-tuning-runs", type=int, default=8, help="tuning runs per scaling point [8]"
    )
    ap.add_argument("--json", type=output_file, help="write the rows here")
    args = ap.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for path in args.reports or DEFAULT_INPUTS:
        rep = json.loads(read_text(path, MAX_REPORT_BYTES, "report"))
        if "points" in rep:
            rows += from_scaling_report(rep, args)
        elif "allocations" in rep:
            rows += from_compare_report(str(path), rep, args)
        else:
            print(f"sequential_replay: {path} is not a compare report; left out", file=sys.stderr)
    print(markdown(rows), end="")
    if args.json:
        doc = {"written_by": STAMP, "args": {**vars(args), "json": str(args.json)}, "rows": rows}
        write_output(args.json, json.dumps(doc, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

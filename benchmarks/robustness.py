"""The main job's verdict under other recipes: one table and one forest plot from the reports of
several `taperlm compare` runs (docs/compare.md, "Robustness").

    python benchmarks/robustness.py RUNS_DIR            # the six runs docs/compare.md names
    python benchmarks/robustness.py --report A=DIR --report B=DIR ... --plot out.png

Each report gives one row per tapered allocation: the paired difference in validation loss
against uniform over its seeds, with the 95% interval the report computed. A `--tune-lr`
report gives two rows: at the recipe's shared lr and with every allocation at its own chosen
lr (both paired over the same reported seeds). Nothing is recomputed: the numbers are the
reports', so the table can be checked against each report.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_json
from outputs import output_file, save_figure

# label -> folder under RUNS_DIR, in the order docs/compare.md lists them
DEFAULT_REPORTS = {
    "built-in docs, init fixed 0.1": "robust-tuned",
    "built-in docs, init fixed 0.02": "robust-fixed002",
    "built-in docs, init fan_in": "robust-fanin",
    "Python stdlib code, init fixed 0.1": "robust-code",
    "Python stdlib code, init fixed 0.02": "robust-code-fixed002",
    "Python stdlib code, init fan_in": "robust-code-fanin",
}


def _init_of(report: dict[str, Any]) -> str:
    model = report["base_config"]["model"]
    if model.get("init", "fixed") == "fixed":
        return f"fixed {model['init_std']:g}"
    return str(model["init"])


def _row(label: str, report: dict[str, Any], name: str, lr: str, diff: dict[str, Any]) -> dict:
    return {
        "report": label,
        "allocation": name,
        "init": _init_of(report),
        "lr": lr,
        "n": diff["n"],
        "mean": diff["mean"],
        "ci": diff["ci"],
        "wins": sum(d < 0 for d in diff["per_seed"]),
        "wall_min": report["meta"]["wall_s"] / 60,
        "command": report["meta"]["command"],
    }


def rows_of(label: str, report: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's tapered allocations vs uniform: at the shared lr, and (a --tune-lr report)
    at each allocation's own chosen lr."""
    rows = []
    lr = f"{report['base_config']['train']['lr']:g}"
    tuning = report.get("lr_tuning") or {}
    tuned = {t["name"]: t for t in tuning.get("tuned", [])}
    chosen = tuning.get("chosen_lr", {})
    for alloc in report["allocations"]:
        diff = alloc.get("diff_vs_uniform")
        if not diff:  # the baseline itself
            continue
        rows.append(_row(label, report, alloc["label"], f"{lr} (shared)", diff["val_loss"]))
        if alloc["name"] in tuned:
            own = f"{chosen[alloc['name']]:g} / {chosen.get('uniform', float('nan')):g} (own)"
            rows.append(
                _row(label, report, alloc["label"], own, tuned[alloc["name"]]["tuned_diff"])
            )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| runs | allocation | init | lr (taper / uniform) | seeds | Δ val loss vs uniform "
        "[95% CI] | seeds better | wall, last invocation |\n|---|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['report']} | {r['allocation']} | {r['init']} | {r['lr']} | {r['n']} | "
        f"{r['mean']:+.4f} [{r['ci'][0]:+.4f}, {r['ci'][1]:+.4f}] | {r['wins']}/{r['n']} | "
        f"{r['wall_min']:.1f} min |\n"
        for r in rows
    )
    return head + body


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Forest plot: one line per row, the mean difference and its interval."""
    import matplotlib  # lazy: only for --plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: only for --plot

    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.6))
    for i, r in enumerate(reversed(rows)):
        lo, hi = r["ci"]
        colour = "tab:blue" if "(own)" not in r["lr"] else "tab:orange"
        ax.plot([lo, hi], [i, i], color=colour, lw=2)
        ax.plot(r["mean"], i, "o", color=colour)
    labels = [f"{r['report']}, lr {r['lr']}" for r in reversed(rows)]
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.axvline(0.0, color="grey", lw=1, ls="--")
    ax.set_xlabel("Δ val loss, tapered − uniform (nats): mean, 95% CI over seeds")
    ax.set_title("cosine 1.5→0.5 vs uniform, transformer-micro, other recipes")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs_dir", nargs="?", type=Path, help="folder holding the default reports")
    ap.add_argument("--report", action="append", default=[], help="LABEL=DIR (repeatable)")
    ap.add_argument("--plot", type=output_file, help="write the forest plot here (PNG)")
    ap.add_argument("--json", type=output_file, help="write the rows here")
    args = ap.parse_args(argv)
    named = [tuple(r.split("=", 1)) for r in args.report]
    if any(len(r) != 2 for r in named):
        ap.error("--report takes LABEL=DIR")
    if args.runs_dir is not None:
        named += [(label, str(args.runs_dir / sub)) for label, sub in DEFAULT_REPORTS.items()]
    if not named:
        ap.error("give RUNS_DIR or --report LABEL=DIR")
    rows, missing = [], []
    for label, folder in named:
        path = Path(folder) / "report.json"
        if not path.is_file():
            missing.append(str(path))
            continue
        rows += rows_of(label, json.loads(path.read_text(encoding="utf-8")))
    for path in missing:
        print(f"robustness: no report at {path} (not run yet?); left out", file=sys.stderr)
    if not rows:
        print("robustness: no report to summarise", file=sys.stderr)
        return 1
    print(markdown(rows), end="")
    if args.plot:
        plot(rows, args.plot)
    if args.json:
        write_json("robustness", {"rows": rows, "missing": missing}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

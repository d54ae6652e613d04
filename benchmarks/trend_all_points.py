"""The reading across every point measured: all sizes and token budgets in one trend report.

Each compare mode fits its trends through its own points: `--paper tokens` at nano has one
size, so it cannot say how the difference moves with size, and its extrapolation to the paper's
440M stops at "one size gives no trend with size". The points of `--paper scaling` (micro, tiny,
small at 0.03-0.31 tokens per parameter) and of every `--paper tokens`/`--paper ratios` trend
report in benchmarks/results together span 0.27M-6.1M parameters and 0.03-32 tokens per
parameter; this script fits the same trends (`taperlm.compare.longrun.trends`) through all of
them and writes

- benchmarks/results/trend_all_points.json and .md (the trend report, `longrun.write_trend`);
- docs/img/all-points-advantage.png and docs/img/all-points-best-ratio.png (its figures).

The points differ in more than size and budget (each size has its own vocabulary and corpus
tokenizer, the scaling points sweep no inverse taper): the docs say how to read the fit.

    python benchmarks/trend_all_points.py           # rewrite the report and figures
    python benchmarks/trend_all_points.py --check   # exit 1 if the JSON differs from the reports
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
IMG = ROOT / "docs" / "img"
OUT_JSON = RESULTS / "trend_all_points.json"
OUT_MD = RESULTS / "trend_all_points.md"
FIGURES = {
    "advantage.png": "all-points-advantage.png",
    "best_ratio.png": "all-points-best-ratio.png",
}
COMMAND = "python benchmarks/trend_all_points.py"


def sources(results: Path = RESULTS) -> list[Path]:
    """The reports read: --paper scaling's, then every --paper tokens/ratios trend report."""
    return [results / "scaling_report.json", *sorted(results.glob("longrun_*.json"))]


def write(out: Path, results: Path = RESULTS) -> tuple[Path, Path]:
    """The combined trend report of `results`' reports, written in `out` (trend.md, trend.json
    and the figures, as a mode writes them)."""
    import json

    from taperlm.compare.longrun import ALL_POINTS, rows_of_reports, write_trend

    paths = sources(results)
    # smallest model first, shortest training first within a size (the table reads down the sizes)
    # a point both long-training modes measured counts once: the ratio axis's wider sweep
    rows = sorted(rows_of_reports(paths, widest=True), key=lambda r: (r.params, r.tokens_per_param))
    done = {r.point for r in rows}
    planned, unlisted = set(done), 0
    for path in paths:
        meta = json.loads(path.read_text(encoding="utf-8"))["meta"]
        points = _planned(path)
        if points is None:  # a report whose plan is not known by name: its own count
            unlisted += meta["total"] - meta["done"]
        else:
            planned |= points
    return write_trend(out, rows, ALL_POINTS, COMMAND, len(done), len(planned) + unlisted)


def _planned(path: Path) -> set[str] | None:
    """The points a long-training report (results/longrun_MODE_SIZE.json) is a run of, by key,
    so that a point planned by both modes counts once; None for another report."""
    from taperlm.compare.longrun import MODES, plan_of

    parts = path.stem.split("_")
    if len(parts) != 3 or parts[0] != "longrun" or parts[1] not in MODES:
        return None
    plan = plan_of(parts[1], (parts[2],))
    return {f"{size.name}-{tokens}" for size in plan.sizes for tokens in size.tokens}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="report drift, change nothing")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        md, js = write(Path(tmp))
        text = js.read_text(encoding="utf-8")
        current = OUT_JSON.read_text(encoding="utf-8") if OUT_JSON.exists() else None
        if args.check:
            if text == current:
                print(f"{OUT_JSON.relative_to(ROOT)} matches the reports")
                return 0
            print(
                f"{OUT_JSON.relative_to(ROOT)} differs from the reports; run {Path(__file__).name}"
            )
            return 1
        OUT_JSON.write_text(text, encoding="utf-8")
        page = md.read_text(encoding="utf-8")
        for name, target in FIGURES.items():  # the report's figures live in docs/img
            page = page.replace(f"]({name})", f"](../../docs/img/{target})")
        OUT_MD.write_text(page, encoding="utf-8")
        for name, target in FIGURES.items():
            if (Path(tmp) / name).exists():
                shutil.copyfile(Path(tmp) / name, IMG / target)
    print(f"{OUT_JSON.relative_to(ROOT)}, {OUT_MD.name} and the figures rewritten from the reports")
    return 0


if __name__ == "__main__":
    sys.exit(main())

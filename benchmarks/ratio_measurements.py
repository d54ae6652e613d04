"""The package's copy of the ratio measurements, written from the reports in benchmarks/results.

`taperlm plan` advises on the taper's ratio from src/taperlm/spec/ratio_measurements.json
(`taperlm.spec.ratio_advice`): the wheel has no benchmarks/, so the points ship with the package.
This script writes that file from the reports the compare modes wrote:

- results/scaling_report.json (`taperlm compare --paper scaling`): each point turned into the
  token axis's row by `taperlm.compare.longrun.trend_rows`, the function the trend reports use;
- every results/longrun_*.json (`--paper tokens` / `--paper ratios` trend reports): their rows
  as they are, one per point (where both modes measured a point, the ratio axis's row: its
  sweep contains the token axis's, `longrun.keep_widest`);
- the paper's 440M point from `taperlm.compare.grid`;
- each pre-registered check whose finished report is committed (`taperlm.compare.confirm`'s
  RESULT_FILES: `--paper confirm` / `confirm-code`), read by its rule (`read_outcome`), as
  `confirmations`: the point it checks, its verdict and interval.

A new measured point is a new or rewritten report followed by this script (and
`python benchmarks/docs_numbers.py --only ratio-measurements` for the docs' table);
tests/compare/test_ratio_advice.py fails while the packaged file differs from the reports.

    python benchmarks/ratio_measurements.py           # rewrite the packaged file
    python benchmarks/ratio_measurements.py --check   # exit 1 if it differs from the reports
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taperlm.compare.longrun import ReportRows

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PACKAGED = ROOT / "src" / "taperlm" / "spec" / "ratio_measurements.json"
SCALING_REPORT = "scaling_report.json"
TREND_REPORTS = "longrun_*.json"


def build(results: Path = RESULTS) -> dict[str, Any]:
    """The packaged file's content, from the reports in `results` (as JSON would read it back)."""
    from taperlm.compare.confirm import RESULT_FILES, read_outcome_file
    from taperlm.compare.grid import PAPER_440M, PAPER_BEST, PAPER_DIFF
    from taperlm.compare.longrun import TrendRow, keep_widest, report_rows

    sources = []
    scaling = report_rows(results / SCALING_REPORT)
    points: list[dict[str, Any]] = [{**row.to_json(), "mode": scaling.mode} for row in scaling.rows]
    sources.append(_source(SCALING_REPORT, scaling))
    measured: list[tuple[TrendRow, str]] = []
    for path in sorted(results.glob(TREND_REPORTS)):
        if not path.is_file():
            continue
        report = report_rows(path)
        measured += [(row, report.mode) for row in report.rows]
        sources.append(_source(path.name, report))
    # a point both long-training modes measured is one point: the ratio axis's wider sweep
    mode_of = {id(row): mode for row, mode in measured}
    kept = keep_widest([row for row, _ in measured])
    points += [{**row.to_json(), "mode": mode_of[id(row)]} for row in kept]
    confirmations = []
    for mode, name in RESULT_FILES.items():
        if (results / name).is_file():
            confirmations.append(read_outcome_file(results / name, mode).to_json())
            sources.append({"file": f"benchmarks/results/{name}", "mode": mode})
    doc = {
        "generated_by": "benchmarks/ratio_measurements.py, from benchmarks/results",
        "sources": sources,
        "points": points,
        "paper": {**PAPER_440M.to_json(), "diff": PAPER_DIFF, "best": PAPER_BEST},
        "confirmations": confirmations,
    }
    return json.loads(json.dumps(doc))  # tuples as lists, as the file reads back


def _source(name: str, report: ReportRows) -> dict[str, Any]:
    return {
        "file": f"benchmarks/results/{name}",
        "mode": report.mode,
        "command": report.command,
        "points_done": report.done,
        "points_total": report.total,
    }


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="report drift, change nothing")
    args = ap.parse_args(argv)
    text = render(build())
    current = PACKAGED.read_text(encoding="utf-8") if PACKAGED.exists() else None
    if text == current:
        print(f"{PACKAGED.relative_to(ROOT)} matches the reports")
        return 0
    if args.check:
        print(f"{PACKAGED.relative_to(ROOT)} differs from the reports; run {Path(__file__).name}")
        return 1
    PACKAGED.write_text(text, encoding="utf-8")
    print(f"{PACKAGED.relative_to(ROOT)} rewritten from the reports")
    return 0


if __name__ == "__main__":
    sys.exit(main())

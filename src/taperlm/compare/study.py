"""What a study is and how one runs. Every mode of `taperlm compare` is a study: a function of
the options returning a `StudyPlan` (the comparisons to run and the report that puts them
together), registered in `taperlm.compare.studies` under its `--paper` name and run by the one
skeleton here, `run_plan`.

A comparison is one `taperlm compare` grid (allocations x seeds at one budget,
`taperlm.compare.job.run_comparison`). A plan of one comparison without a report of its own (the
plain comparison, `--paper controlled`, `--paper sweep`) runs it in --out itself; a plan of
several (`families`, `scaling`, `tokens`, `ratios`) runs each in its own folder under --out,
resumably, and rewrites its report after each.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from taperlm.compare.job import check_options, run_comparison
from taperlm.compare.options import CompareOptions
from taperlm.files.outdirs import check_folder, claim
from taperlm.files.runlock import locked

if TYPE_CHECKING:
    from taperlm.compare.report import ComparisonReport

# The study of `taperlm compare` without --paper.
COMPARISON = "comparison"


@dataclass(frozen=True)
class Part:
    """One comparison of a study: a complete `taperlm compare` with its own options."""

    key: str  # its name in the study's report (a family's preset prefix, a point's SIZE-TOKENS)
    opts: CompareOptions  # its options (its --out: a folder under the study's)
    kind: str = "comparison"  # what the progress line calls it ("family", "point")
    what: str = ""  # how the progress line describes it, before "into OUT"


@dataclass
class StudyProgress:
    """The comparisons of a study done so far: what its report is written from."""

    total: int  # comparisons in the study
    reports: dict[str, ComparisonReport] = field(default_factory=dict)  # key -> its report
    walls: dict[str, float] = field(default_factory=dict)  # key -> seconds its run took here
    t_start: float = field(default_factory=time.perf_counter)  # when the study started
    cpu_start: float = field(default_factory=time.process_time)  # this process's CPU then

    def wall(self) -> float:
        """Seconds since the study started."""
        return time.perf_counter() - self.t_start

    def cpu(self) -> float:
        """CPU seconds of this process since the study started."""
        return time.process_time() - self.cpu_start


# A study's report: from the comparisons done so far, writes OUT/report.md and report.json
# (and whatever else it has), returning their paths.
StudyReport = Callable[[StudyProgress], tuple[Path, Path]]


@dataclass
class StudyPlan:
    """What a study runs: its comparisons, in order, and the report that puts them together
    (None: a single comparison that is its own report, run in --out itself)."""

    parts: list[Part]  # the comparisons, run in this order
    report: StudyReport | None = None  # rewritten after each comparison
    mode: str = COMPARISON  # the --paper name the progress lines show
    folder: str = "study folder"  # what the lock on --out calls the folder


# A study: the options of `taperlm compare` -> its plan.
Study = Callable[[CompareOptions], StudyPlan]


def single(opts: CompareOptions) -> StudyPlan:
    """The study of one comparison, the options as given (its allocations: --tapers, or the
    --paper grid's, `taperlm.compare.grid.paper_allocations`)."""
    return StudyPlan([Part("", opts)], mode=opts.paper or COMPARISON)


def run_plan(opts: CompareOptions, study: Study) -> tuple[Path, Path]:
    """The skeleton every study runs by: plan, check every comparison before any trains, own
    and lock --out, run the comparisons one after the other (each resumable), the study's
    report rewritten after each; returns (report.md, report.json)."""
    progress = StudyProgress(0)
    plan = study(opts)
    if plan.report is None:  # one comparison in --out itself: it owns and locks the folder
        (part,) = plan.parts
        report = run_comparison(part.opts)
        return report.md_path, report.json_path
    progress.total = len(plan.parts)
    for part in plan.parts:  # nothing trains before every comparison is known to be valid
        check_options(part.opts)
    check_folder(opts.out, "compare", "--out")
    claim(opts.out, "compare")  # its own from the first file on: an interrupted study resumes
    with locked(opts.out, plan.folder):  # one study writes a folder at a time
        for i, part in enumerate(plan.parts, 1):
            print(
                f"taperlm compare --paper {plan.mode}: {part.kind} {i}/{len(plan.parts)}: "
                f"{part.what} into {part.opts.out}",
                file=sys.stderr,
            )
            t0 = time.perf_counter()
            progress.reports[part.key] = run_comparison(part.opts)
            progress.walls[part.key] = time.perf_counter() - t0
            md, js_all = plan.report(progress)
    print(f"wrote {md} and {js_all} ({progress.wall() / 60:.1f} min)")
    return md, js_all

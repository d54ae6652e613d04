"""What a study is and how one runs. Every mode of `taperlm compare` is a study: a function of
the options returning a `StudyPlan` (the comparisons to run and the report that puts them
together), registered here (`studies`) under its `--paper` name and run by the one
skeleton here, `run_plan`.

A comparison is one `taperlm compare` grid (allocations x seeds at one budget,
`taperlm.compare.comparison.run_comparison`). A plan of one comparison without a report of its own (the
plain comparison, `--paper controlled`, `--paper sweep`) runs it in --out itself; a plan of
several (`families`, `scaling`, `tokens`, `ratios`) runs each in its own folder under --out,
resumably, and rewrites its report after each.

The registry: every mode is declared with its name in `taperlm.compare.options.PAPER_STUDIES`
(the one list of the modes, torch-free: it is also `--paper`'s choices) or registered with
`@study(NAME)`; `run_study` runs the one asked for. tests/compare/test_compare_studies.py
registers a toy one and runs it.

`--dry-run` (`dry_run`): Lists every comparison's cells with each cell's GPU-hours (the planner's time formula,
`taperlm.training.planner.gpu_hours`, at the MFU docs/scaling.md measured on one H200), the total
of the fixed design (every seed) and the range the sequential stop spans (from --min-seeds
seeds to all of them), and the jobs it would submit. It prepares no data, trains nothing and
creates no file or folder: it reads only the options (and the presets they name)."""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from taperlm.compare.comparison import check_options, reported_seeds, run_comparison
from taperlm.compare.grid import build_grid
from taperlm.compare.options import PAPER_MODES, PAPER_STUDIES, CompareOptions
from taperlm.compare.results import ComparisonReport
from taperlm.errors import ConfigError
from taperlm.files.outdirs import check_folder, claim
from taperlm.files.runlock import locked
from taperlm.training.planner import H100_PEAK_FLOPS, MEASURED_MFU, gpu_hours

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
    # a single comparison's closing reading (a pre-registered rule's): called with its finished
    # report, it may add to report.md and print; None: the report says all there is
    conclude: Callable[[ComparisonReport], None] | None = None


# A study: the options of `taperlm compare` -> its plan.
Study = Callable[[CompareOptions], StudyPlan]


def single(opts: CompareOptions) -> StudyPlan:
    """The study of one comparison, the options as given (its allocations: --tapers, or the
    --paper grid's, `taperlm.compare.options.PaperMode.allocations`)."""
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
        if plan.conclude is not None:
            plan.conclude(report)
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


def _study_at(ref: str) -> Study:
    """The study function a "module:function" reference of `PAPER_STUDIES` names."""
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


# Studies registered with `@study(NAME)`, besides the ones `PAPER_STUDIES` declares.
REGISTERED: dict[str, Study] = {}


def studies() -> dict[str, Study]:
    """name -> study: the plain comparison, the --paper modes in the order --help lists them,
    then any registered with `@study`. Resolved when asked, not at import: the multi-part
    studies' modules import this one."""
    declared = {name: _study_at(mode.study) for name, mode in PAPER_STUDIES.items()}
    return {COMPARISON: single, **declared, **REGISTERED}


def study(name: str) -> Callable[[Study], Study]:
    """Register the decorated function as the study `name` (`--paper NAME`)."""

    def register(fn: Study) -> Study:
        REGISTERED[name] = fn
        return fn

    return register


def run_study(opts: CompareOptions) -> tuple[Path, Path]:
    """Run the study of `opts.paper` (None: the plain comparison); returns (report.md,
    report.json)."""
    name = opts.paper or COMPARISON
    known = studies()
    if name not in known:
        raise ConfigError(f"--paper {name!r} is unknown; choose from {', '.join(PAPER_MODES)}")
    return run_plan(opts, known[name])


def dry_run(opts: CompareOptions) -> str:
    """The dry run's text for the study `opts` name (every comparison of a --paper study)."""
    plan = studies()[opts.paper or COMPARISON](opts)
    lines = [
        f"taperlm compare --dry-run: nothing is trained or written. GPU-hours = tokens x model "
        f"FLOPs/token / ({H100_PEAK_FLOPS / 1e12:.0f} TFLOP/s x {100 * MEASURED_MFU:.1f}% MFU): "
        "the dense bf16 peak of an H100/H200 and the MFU measured for transformer-440m on one "
        "H200 (docs/scaling.md); evaluation, checkpoints and queueing not included."
    ]
    fixed = low = 0.0
    cells = 0
    for part in plan.parts:
        allocs, provisional = check_options(part.opts)
        seeds = reported_seeds(part.opts)
        grid = build_grid(provisional, allocs, seeds, part.opts.paper)
        t = provisional.train
        if len(plan.parts) > 1:
            lines.append(f"\n{part.key}: {part.what} into {part.opts.out}")
        nproc = part.opts.nproc_per_cell
        lines.append(
            f"{len(grid.allocations)} allocations x {len(seeds)} seeds = {len(grid.cells)} cells "
            f"of {t.tokens:,} tokens, {nproc} process(es) each:"
        )
        first = min(len(seeds), max(1, part.opts.min_seeds))
        for cell in grid.cells:
            hours = gpu_hours(cell.config.model, t.tokens, t.seq_len)
            fixed += hours
            low += hours if cell.seed < first else 0.0
            wall = f", {hours / nproc:,.1f} h on {nproc} GPUs" if nproc > 1 else ""
            lines.append(f"  {cell.name}: {hours:,.1f} GPU-hours{wall}")
        cells += len(grid.cells)
        if part.opts.tune_lr:
            lines.append("  (--tune-lr's tuning cells come on top; not counted here)")
        if any(a.needs_pilot for a in allocs):
            lines.append("  (novelty:pilot's pilot runs come on top; not counted here)")
    stop = opts.stop.kind
    lines.append(f"\ntotal, fixed design (every seed): {fixed:,.1f} GPU-hours in {cells} cells")
    if stop != "fixed":
        lines.append(
            f"with --stop {opts.stop.as_text()}: between {low:,.1f} GPU-hours (decided at "
            f"--min-seeds {opts.min_seeds}) and {fixed:,.1f} (never decided: every seed)"
        )
    lines.append("jobs: " + _jobs(opts, cells))
    return "\n".join(lines)


def _jobs(opts: CompareOptions, cells: int) -> str:
    if opts.executor == "slurm":
        from taperlm.compare.slurm import describe_jobs  # lazy: the Slurm executor

        return describe_jobs(opts, cells)
    at = f"--jobs {opts.jobs}" if opts.jobs else "as many as the devices allow"
    return (
        f"{cells} cell(s) on this machine, {at} at a time, each a group of "
        f"{opts.nproc_per_cell} process(es)"
    )

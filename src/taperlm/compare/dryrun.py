"""`taperlm compare --dry-run`: what a comparison would cost before anything is spent.

Lists every comparison's cells with each cell's GPU-hours (the planner's time formula,
`taperlm.training.planner.gpu_hours`, at the MFU docs/scaling.md measured on one H200), the total
of the fixed design (every seed) and the range the sequential stop spans (from --min-seeds
seeds to all of them), and the jobs it would submit. It prepares no data, trains nothing and
creates no file or folder: it reads only the options (and the presets they name).
"""

from __future__ import annotations

from taperlm.compare.grid import build_grid
from taperlm.compare.job import check_options, reported_seeds
from taperlm.compare.options import CompareOptions
from taperlm.compare.studies import STUDIES
from taperlm.compare.study import COMPARISON
from taperlm.training.planner import H100_PEAK_FLOPS, MEASURED_MFU, gpu_hours


def dry_run(opts: CompareOptions) -> str:
    """The dry run's text for the study `opts` name (every comparison of a --paper study)."""
    plan = STUDIES[opts.paper or COMPARISON](opts)
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

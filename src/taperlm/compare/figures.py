"""The PNGs of a comparison report: width (and head) profiles, validation-loss curves, the paired
loss difference vs uniform during training and its crossing (`crossing_plot`), novelty per layer
(averaged over seeds), the sequential stop's confidence sequence (`with_stopping_plot`) and
--tune-lr's loss against lr (`with_tuning_plot`)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from taperlm.analysis import plots as analysis_plots
from taperlm.analysis.novelty import NoveltyResult, TokenStats
from taperlm.analysis.plots import _figure, _save, plot_interval_series
from taperlm.analysis.stats import relative_ppl_change as relative_change
from taperlm.compare.grid import Grid
from taperlm.compare.options import paper_mode
from taperlm.compare.results import (
    CellResult,
    ComparisonSummary,
    LossVsTokens,
    LrCurve,
    LrTuning,
    Results,
    Stopping,
)
from taperlm.spec.taper import TaperSpec

CROSSING_PLOT = "delta_vs_tokens.png"


def crossing_plot(data: LossVsTokens, path: Path) -> bool:
    """The PNG: per tapered allocation the mean difference with its 95% band against tokens per
    parameter (log axis), the zero line, and the crossing with its interval; False when no
    allocation has two shared evaluations."""
    drawn = [a for a in data.allocations if len(a.points) >= 2]
    if not drawn:
        return False
    fig, (ax,) = _figure()
    for i, a in enumerate(drawn):
        color = f"C{i}"
        x = np.array([p.tokens_per_param for p in a.points])
        y = np.array([p.mean for p in a.points])
        ax.plot(
            x, y, color=color, marker="o", markersize=3, label=f"{a.label} ({len(a.seeds)} seeds)"
        )
        band = [p.ci for p in a.points]
        if all(b is not None for b in band):
            ax.fill_between(x, [b[0] for b in band], [b[1] for b in band], color=color, alpha=0.2)
        c, iv = a.crossing, a.interval
        if c.tokens is not None:
            ax.axvline(c.tokens / data.params, color=color, linestyle="--", linewidth=1)
            if iv is not None and iv.tokens is not None:
                lo, hi = (t / data.params for t in iv.tokens)
                ax.axvspan(lo, hi, color=color, alpha=0.08)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens per parameter (log)")
    ax.set_ylabel("val loss − uniform's, nats (lower: taper better)")
    ax.set_title(
        "Paired difference vs uniform during training\n(mean, 95% band over seeds;\n"
        "dashed: the crossing, shaded: its 95% bootstrap interval)"
    )
    ax.legend(fontsize=8)
    _save(fig, path)
    return True


SEQUENCE_PLOT = "sequence.png"


# ----------------------------------------------------------------------------------------------
# report


def with_stopping_plot(stopping: Stopping, out_dir: Path) -> Stopping:
    """`stopping` with `plot` set after drawing sequence.png (each comparison's anytime-valid
    interval against the number of seeds; unbounded ones left out)."""
    series: dict[str, list] = {}
    for step in stopping.sequence:
        for label, e in step.comparisons.items():
            if math.isfinite(e.half):
                series.setdefault(label, []).append((step.n, e.mean, *e.ci))
    if not series:
        return dataclasses.replace(stopping, plotted=True, plot=None)
    plot_interval_series(
        series,
        out_dir / SEQUENCE_PLOT,
        title=f"Anytime-valid {100 * stopping.confidence:g}% interval as seeds are added",
        xlabel="seeds (0..n-1, in order)",
        ylabel="val loss difference, nats (paired)",
    )
    return dataclasses.replace(stopping, plotted=True, plot=SEQUENCE_PLOT)


LR_PLOT = "lr_tuning.png"


def plot_lr_curves(curves: dict[str, LrCurve], recipe_lr: float, path: Path) -> None:
    """Validation loss against lr per allocation (mean over tuning seeds, 95% intervals), the
    chosen lrs marked."""
    series = {}
    for c in curves.values():
        pts = []
        for p in c.curve:
            if p.loss.mean is None:
                continue
            lo, hi = p.ci if p.ci else (None, None)
            pts.append((p.lr, p.loss.mean, lo, hi))
        series[f"{c.label} (best {c.chosen_lr:g})"] = pts
    plot_interval_series(
        series,
        path,
        title=f"Validation loss vs peak lr (tuning seeds; recipe lr {recipe_lr:g})",
        xlabel="peak learning rate",
        ylabel="validation loss (mean, 95% CI)",
        logx=True,
        zero_line=False,
    )


def with_tuning_plot(tuning: LrTuning, out_dir: Path) -> LrTuning:
    """`tuning` with its plot drawn into out_dir (when it has curves)."""
    if not tuning.curves:
        return tuning
    plot_lr_curves(tuning.curves, tuning.recipe_lr, out_dir / LR_PLOT)
    return dataclasses.replace(tuning, plot=LR_PLOT)


PLOTS = {
    "widths": "widths.png",
    "val_loss": "val_loss.png",
    "val_loss_diff": "val_loss_diff.png",
    "novelty": "novelty.png",
    "paper": "paper.png",
    "sweep": "sweep.png",
    "kv_pareto": "kv_pareto.png",
}


def _averaged_novelty(results: list[CellResult], label: str):
    """One NoveltyResult per allocation: per layer, the mean over seeds of each seed's per-layer
    mean, with the sample std over seeds as its `std` (0 for one seed), so that the plot's band
    is the seed-to-seed spread the report's statistics are about (not the spread over tokens)."""
    per_seed = [NoveltyResult.from_dict(r.novelty.to_json()) for r in results]
    first = per_seed[0]

    def over_seeds(key: str) -> list[TokenStats]:
        out = []
        for i in range(first.n_layers):
            means = np.array([getattr(p, key)[i].mean for p in per_seed], dtype=float)
            sd = float(means.std(ddof=1)) if len(means) > 1 else 0.0
            m = float(means.mean())
            out.append(TokenStats(mean=m, std=sd, median=m, p10=m, p90=m, n=len(means)))
        return out

    return first.with_layers(over_seeds("rho_block"), over_seeds("rho_mlp"), name=label)


def _diff_curves(
    curves: dict[int, list[list[float]]], base: dict[int, list[list[float]]]
) -> list[list[list[float]]]:
    """Per seed: [tokens, loss - uniform loss] at the evaluations both runs made."""
    out = []
    for seed, pts in curves.items():
        ref = {t: v for t, v in base.get(seed, [])}
        diff = [[t, v - ref[t]] for t, v in pts if t in ref]
        if diff:
            out.append(diff)
    return out


# The one novelty statistic of plot and report: each seed's Pearson r of its per-layer means
# with depth, then mean ± std over seeds.
R_TITLE = "r with depth: mean ± std over seeds"


def _r_labels(summary: ComparisonSummary, labels) -> dict[str, dict[str, str]]:
    """Legend text per allocation label: the report's r statistics (summary.allocations)."""
    out = {}
    for a in summary.allocations:
        if a.label not in labels:
            continue
        texts = {}
        for key, st in (
            ("pearson_mlp", a.novelty.pearson_mlp),
            ("pearson_block", a.novelty.pearson_block),
        ):
            if st.mean is None:
                texts[key] = "r n/a"
            elif st.std is None:
                texts[key] = f"r={st.mean:+.2f}"
            else:
                texts[key] = f"r={st.mean:+.2f}±{st.std:.2f}"
        out[a.label] = texts
    return out


def _paper_rows(summary: ComparisonSummary):
    """Forest-plot rows (label, our ppl change %, CI) and the paper's change % per label, for
    the allocations the paper reports."""
    allocs = summary.allocations
    u = next((a for a in allocs if a.diff_vs_uniform is None), None)
    if u is None or u.paper_ppl is None:
        return [], {}
    rows, ref = [], {}
    for a in allocs:
        d = a.diff_vs_uniform and a.diff_vs_uniform.val_loss
        if not d or d.mean is None or a.paper_ppl is None:
            continue
        lo, hi = (relative_change(x) for x in d.ci) if d.ci else (None, None)
        rows.append((a.label, relative_change(d.mean), lo, hi))
        ref[a.label] = 100.0 * (a.paper_ppl / u.paper_ppl - 1.0)
    return rows, ref


def write_plots(
    grid: Grid, results: Results, out_dir: Path, summary: ComparisonSummary
) -> dict[str, str]:
    """The PNGs (file names relative to out_dir); `summary` (taperlm.compare.summary) supplies
    the statistics shown in legends, so plots and report.md show the same numbers, and our
    perplexity changes beside the paper's for the allocations it reports (paper.png)."""
    by_alloc = {
        a.name: [results[c.name] for c in grid.cells if c.allocation is a and c.name in results]
        for a in grid.allocations
    }
    written = _width_plot(grid, out_dir)
    written |= _curve_plots(grid, results, by_alloc, out_dir)
    written |= _novelty_plot(grid, by_alloc, summary, out_dir)
    written |= _paper_plots(grid, summary, out_dir)
    if _kv_pareto_plot(summary, out_dir / PLOTS["kv_pareto"]):
        written["kv_pareto"] = PLOTS["kv_pareto"]
    return written


def _width_plot(grid: Grid, out_dir: Path) -> dict[str, str]:
    """widths.png: the MLP width (and query heads, where tapered) per layer of every taper."""
    uniform = next(a for a in grid.allocations if a.is_uniform)
    tapered = [a for a in grid.allocations if not a.is_uniform] or [uniform]
    # a novelty:pilot allocation's widths differ by seed: the plot shows the first seed's
    profiles = {
        a.label + (f" (seed {grid.seeds[0]})" if a.needs_pilot else ""): grid.budget[a.name].widths
        for a in tapered
    }
    heads = {a.label: grid.budget[a.name].heads for a in tapered if not a.head_taper.is_uniform}
    analysis_plots.plot_width_profiles(
        profiles,
        grid.budget[uniform.name].baseline_width,
        out_dir / PLOTS["widths"],
        title="MLP width" + (" and query heads" if heads else "") + " per layer (equal budget)",
        heads=heads or None,
        baseline_heads=grid.budget[uniform.name].baseline_heads,
    )
    return {"widths": PLOTS["widths"]}


def _curve_plots(
    grid: Grid,
    results: Results,
    by_alloc: dict[str, list[CellResult]],
    out_dir: Path,
) -> dict[str, str]:
    """val_loss.png (the curves during training) and val_loss_diff.png (paired vs uniform)."""
    curves = {a.label: [r.curve for r in by_alloc[a.name] if r.curve] for a in grid.allocations}
    curves = {k: v for k, v in curves.items() if v}
    if not curves:
        return {}
    # The curve points are the trainer's evaluations (train.eval_tokens each); the report's
    # final numbers use more tokens, so the last point need not equal the table's loss.
    # One clause per title line, so that no title runs past the figure's edge.
    every = f"each point {grid.base.train.eval_tokens:,} val tokens"
    final = {r.val.tokens for r in results.values()}
    if final:
        every += f";\nthe table's final losses: {'/'.join(f'{n:,}' for n in sorted(final))}"
    analysis_plots.plot_loss_curves(
        curves, out_dir / PLOTS["val_loss"], title=f"Validation loss during training\n({every})"
    )
    written = {"val_loss": PLOTS["val_loss"]}
    uniform = next(a for a in grid.allocations if a.is_uniform)
    base = {r.seed: r.curve for r in by_alloc[uniform.name]}
    diffs = {
        a.label: _diff_curves({r.seed: r.curve for r in by_alloc[a.name]}, base)
        for a in grid.allocations
        if not a.is_uniform
    }
    if any(diffs.values()):
        analysis_plots.plot_paired_differences(
            diffs,
            out_dir / PLOTS["val_loss_diff"],
            title="Paired validation-loss difference vs uniform during training\n"
            f"(mean ± 1 std over seeds; {every})",
        )
        written["val_loss_diff"] = PLOTS["val_loss_diff"]
    return written


def _novelty_plot(
    grid: Grid,
    by_alloc: dict[str, list[CellResult]],
    summary: ComparisonSummary,
    out_dir: Path,
) -> dict[str, str]:
    """novelty.png: layer-wise novelty of every allocation, averaged over seeds."""
    nov = {
        a.label: _averaged_novelty(by_alloc[a.name], a.label)
        for a in grid.allocations
        if by_alloc[a.name]
    }
    if not nov:
        return {}
    n_seeds = max(len(v) for v in by_alloc.values())
    analysis_plots.plot_novelty(
        nov,
        out_dir / PLOTS["novelty"],
        title=f"Layer-wise novelty: per-layer means averaged over {n_seeds} seed(s)",
        band="±1 std over seeds",
        r_labels=_r_labels(summary, nov),
        r_title=R_TITLE,
    )
    return {"novelty": PLOTS["novelty"]}


def _paper_plots(grid: Grid, summary: ComparisonSummary, out_dir: Path) -> dict[str, str]:
    """paper.png (our ppl changes beside the paper's) and, for --paper sweep, sweep.png."""
    written: dict[str, str] = {}
    rows, ref = _paper_rows(summary)
    if len(rows) >= 2:
        analysis_plots.plot_intervals(
            rows,
            out_dir / PLOTS["paper"],
            title="Val ppl change vs uniform: ours and the paper's",
            xlabel="val ppl change vs uniform, % (paper: 440M Transformer, 30B tokens)",
            reference=ref,
            reference_label="paper, 440M / 30B tokens",
        )
        written["paper"] = PLOTS["paper"]
    mode = paper_mode(grid.paper)
    if mode is not None and mode.sweep_claims and rows:
        specs = {a.label: a.spec for a in grid.allocations}
        _sweep_plot(specs, rows, ref, out_dir / PLOTS["sweep"])
        written["sweep"] = PLOTS["sweep"]
    return written


def _kv_pareto_plot(summary: ComparisonSummary, path: Path) -> bool:
    """With KV tapers in the grid: each allocation's paired val-loss difference vs uniform
    (95% interval) against its KV-cache bytes per token (bf16); False when every allocation
    caches the same."""
    allocs = [a for a in summary.allocations if a.kv_cache_bytes_per_token_bf16]
    if len({a.kv_cache_bytes_per_token_bf16 for a in allocs}) < 2:
        return False
    series = {}
    # Allocations with equal bytes are drawn side by side (1.5% of the range apart) so that
    # their intervals do not hide each other; the x axis still reads their bytes.
    xs = [a.kv_cache_bytes_per_token_bf16 for a in allocs]
    gap = 0.015 * (max(xs) - min(xs))
    for a in allocs:
        same = [
            b.label
            for b in allocs
            if b.kv_cache_bytes_per_token_bf16 == a.kv_cache_bytes_per_token_bf16
        ]
        x = a.kv_cache_bytes_per_token_bf16 + gap * (same.index(a.label) - (len(same) - 1) / 2)
        d = a.diff_vs_uniform and a.diff_vs_uniform.val_loss
        if a.diff_vs_uniform is None:
            series[a.label] = [(x, 0.0, None, None)]
        elif d and d.mean is not None:
            lo, hi = d.ci if d.ci else (None, None)
            series[a.label] = [(x, d.mean, lo, hi)]
    analysis_plots.plot_interval_series(
        series,
        path,
        title="Validation loss vs KV cache at equal parameters",
        xlabel="KV-cache bytes per token (bf16, all layers; equal bytes drawn side by side)",
        ylabel="val loss - uniform's (paired, 95% CI; lower is better)",
    )
    return True


def _sweep_plot(specs: dict[str, TaperSpec], rows, ref: dict[str, float], path: Path) -> None:
    """The sweep as the paper draws its claims: ppl change vs uniform against the start ratio,
    one line per schedule (ours with 95% intervals, the paper's dotted; `specs`: each row's
    allocation's MLP taper, by label, as parsed)."""
    series: dict[str, list] = {}
    paper: dict[str, list] = {}
    for label, mean, lo, hi in rows:
        spec = specs[label]
        series.setdefault(spec.schedule, []).append((spec.start, mean, lo, hi))
        paper.setdefault(spec.schedule, []).append((spec.start, ref[label]))
    analysis_plots.plot_interval_series(
        {k: sorted(v) for k, v in series.items()},
        path,
        title="Schedule x ratio sweep: val ppl change vs uniform",
        xlabel="start ratio (end = 2 − start)",
        ylabel="ppl change vs uniform, % (lower is better)",
        reference={k: sorted(v) for k, v in paper.items()},
        reference_label="paper, 440M",
    )

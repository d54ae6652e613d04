"""The report of `taperlm compare --tune-lr` (`taperlm.compare.tuning`): report.md's "Learning
rate tuning" section and lr_tuning.png, from its `LrTuning` (report.json's `lr_tuning`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from taperlm.analysis.plots import plot_interval_series
from taperlm.compare.report import diff_ci, md_table, mean_pm
from taperlm.compare.sequential import why

if TYPE_CHECKING:
    from taperlm.compare.tuning import LrCurve, LrTuning

LR_PLOT = "lr_tuning.png"


def tuning_section(t: LrTuning) -> list[str]:
    """report.md's "Learning rate tuning" section."""
    lrs = t.lrs
    lines = [
        "## Learning rate tuning",
        "",
        f"`--tune-lr`: every {'allocation' if t.scope == 'each' else 'uniform run'} trained "
        f"at lr {', '.join(f'{x:g}' for x in lrs)} on tuning seeds {t.tuning_seeds} "
        f"(disjoint from the reported seeds {t.reported_seeds}); chosen lr = the lowest mean "
        "validation loss over the tuning seeds. "
        + (
            "Every allocation was then trained at uniform's chosen lr: the table above is at "
            "that lr."
            if t.scope == "uniform"
            else "The reported seeds then ran each allocation at its own chosen lr."
        ),
        "",
        *_curves_table(t),
        "",
        "Mean validation loss over the tuning seeds ± the half-width of its 95% t interval. "
        "`(grid edge)`: the best lr is the grid's smallest or largest, so the optimum may lie "
        "beyond it; widen --lr-grid.",
        "",
    ]
    if t.tuned:
        lines += _tuned_table(t)
    if t.tuned_stopping:
        lines += [f"The own-lr comparison {why(t.tuned_stopping)}.", ""]
    c = t.cost
    if c.factor is not None:
        lines += [
            f"Extra cost of tuning: {c.tuning_cells} tuning runs ({c.tuning_s / 60:.1f} min of "
            f"run time) + {c.tuned_cells} reported runs at lrs other than the recipe's "
            f"({c.tuned_s / 60:.1f} min), against {c.reported_s / 60:.1f} min for the "
            f"reported grid itself ({c.factor:.2f}x in all).",
            "",
        ]
    lines += [
        f"![loss vs lr]({t.plot})" if t.plot else "",
        "",
    ]
    return lines


def _curves_table(t: LrTuning) -> list[str]:
    """Mean validation loss of every allocation at every lr of the grid, and the chosen lr."""
    head = ["allocation", *(f"lr {x:g}" for x in t.lrs), "chosen lr"]
    rows = []
    for c in t.curves.values():
        cells = []
        for p in c.curve:
            if p.loss.mean is None:
                cells.append("–")
            elif p.ci is None:
                cells.append(f"{p.loss.mean:.4f}")
            else:
                cells.append(f"{p.loss.mean:.4f} ± {(p.ci[1] - p.ci[0]) / 2:.4f}")
        edge = " (grid edge)" if c.at_edge else ""
        rows.append([c.label, *cells, f"**{c.chosen_lr:g}**{edge}"])
    return md_table(head, rows)


def _tuned_table(t: LrTuning) -> list[str]:
    """Scope `each`: the paired differences vs uniform at the shared lr and at own lrs."""
    rows = [
        [
            a.label,
            f"{t.recipe_lr:g}",
            diff_ci(a.shared_diff, ".4f"),
            f"{a.lr:g}",
            diff_ci(a.tuned_diff, ".4f"),
            mean_pm(a.shared_loss, ".4f"),
            mean_pm(a.tuned_loss, ".4f"),
        ]
        for a in t.tuned
    ]
    head = [
        "allocation",
        "shared lr",
        "Δ loss vs uniform, shared lr [95% CI]",
        "own lr",
        "Δ loss vs uniform, own lrs [95% CI]",
        "val loss, shared lr",
        "val loss, own lr",
    ]
    return [
        *md_table(head, rows),
        "",
        "Both differences are paired over the reported seeds (each allocation minus uniform "
        "of the same seed); at own lrs each side runs at its own chosen lr.",
        "",
    ]


def plot_curves(curves: dict[str, LrCurve], recipe_lr: float, path: Path) -> None:
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


def with_plot(tuning: LrTuning, out_dir: Path) -> LrTuning:
    """`tuning` with its plot drawn into out_dir (when it has curves)."""
    if not tuning.curves:
        return tuning
    plot_curves(tuning.curves, tuning.recipe_lr, out_dir / LR_PLOT)
    return dataclasses.replace(tuning, plot=LR_PLOT)

"""The PNGs of a comparison report: width profiles, validation-loss curves, the paired loss
difference vs uniform during training, and novelty per layer (averaged over seeds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from taperlm.compare.grid import Grid

PLOTS = {
    "widths": "widths.png",
    "val_loss": "val_loss.png",
    "val_loss_diff": "val_loss_diff.png",
    "novelty": "novelty.png",
}


def _averaged_novelty(results: list[dict[str, Any]], label: str):
    """One NoveltyResult per allocation: per-layer statistics averaged over seeds."""
    from taperlm.analysis.novelty import NoveltyResult, TokenStats

    per_seed = [NoveltyResult.from_dict(r["novelty"]) for r in results]
    first = per_seed[0]

    def avg(key: str) -> list[TokenStats]:
        out = []
        for i in range(first.n_layers):
            layer = [getattr(p, key)[i] for p in per_seed]
            out.append(
                TokenStats(
                    mean=float(sum(s.mean for s in layer) / len(layer)),
                    std=float(sum(s.std for s in layer) / len(layer)),
                    median=float(sum(s.median for s in layer) / len(layer)),
                    p10=float(sum(s.p10 for s in layer) / len(layer)),
                    p90=float(sum(s.p90 for s in layer) / len(layer)),
                    n=sum(s.n for s in layer),
                )
            )
        return out

    return first.with_layers(avg("rho_block"), avg("rho_mlp"), name=label)


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


def write_plots(grid: Grid, results: dict[str, dict[str, Any]], out_dir: Path) -> dict[str, str]:
    """The PNGs (file names relative to out_dir)."""
    from taperlm.analysis.plots import (
        plot_loss_curves,
        plot_novelty,
        plot_paired_differences,
        plot_width_profiles,
    )

    written: dict[str, str] = {}
    by_alloc = {
        a.name: [results[c.name] for c in grid.cells if c.allocation is a and c.name in results]
        for a in grid.allocations
    }
    profiles = {
        a.label: grid.budget[a.name]["widths"] for a in grid.allocations if not a.is_uniform
    }
    uniform = next(a for a in grid.allocations if a.is_uniform)
    if not profiles:
        profiles = {uniform.label: grid.budget[uniform.name]["widths"]}
    baseline = grid.budget[uniform.name]["baseline_width"]
    plot_width_profiles(
        profiles, baseline, out_dir / PLOTS["widths"], title="MLP width per layer (equal budget)"
    )
    written["widths"] = PLOTS["widths"]

    curves = {
        a.label: [r["curve"] for r in by_alloc[a.name] if r["curve"]] for a in grid.allocations
    }
    curves = {k: v for k, v in curves.items() if v}
    if curves:
        plot_loss_curves(curves, out_dir / PLOTS["val_loss"], title="Validation loss")
        written["val_loss"] = PLOTS["val_loss"]
        base = {r["seed"]: r["curve"] for r in by_alloc[uniform.name]}
        diffs = {
            a.label: _diff_curves({r["seed"]: r["curve"] for r in by_alloc[a.name]}, base)
            for a in grid.allocations
            if not a.is_uniform
        }
        if any(diffs.values()):
            plot_paired_differences(diffs, out_dir / PLOTS["val_loss_diff"])
            written["val_loss_diff"] = PLOTS["val_loss_diff"]

    nov = {
        a.label: _averaged_novelty(by_alloc[a.name], a.label)
        for a in grid.allocations
        if by_alloc[a.name]
    }
    if nov:
        n_seeds = max(len(v) for v in by_alloc.values())
        plot_novelty(
            nov,
            out_dir / PLOTS["novelty"],
            title=f"Layer-wise novelty (per-layer means averaged over {n_seeds} seed(s))",
        )
        written["novelty"] = PLOTS["novelty"]
    return written

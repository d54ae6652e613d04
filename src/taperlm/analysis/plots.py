"""PNG plots for plan / novelty / compare: width profiles, loss curves, novelty curves.

Figures are drawn with matplotlib's object API on an Agg canvas (`Figure` + `savefig`), never
through pyplot, so no display is needed and the process-wide backend is left untouched.
Every function writes one PNG and returns its path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, MaxNLocator

from taperlm.files.io import atomic_output
from taperlm.files.outfiles import png_metadata

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from taperlm.analysis.novelty import NoveltyResult

# One point of a loss curve: (tokens seen, loss).
CurvePoint = tuple[float, float]


def _figure(ncols: int = 1, width: float = 7.0, height: float = 4.5) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(width, height), dpi=120, layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _save(fig: Figure, path: str | Path) -> Path:
    out = Path(path)
    with atomic_output(out) as tmp:
        fig.savefig(tmp, format="png", metadata=png_metadata())
    return out


def plot_width_profiles(
    profiles: Mapping[str, Sequence[int]],
    baseline: int,
    path: str | Path,
    title: str = "MLP width per layer",
    heads: Mapping[str, Sequence[int]] | None = None,
    baseline_heads: int | None = None,
) -> Path:
    """One line per allocation (label -> per-layer widths), the uniform baseline dashed; with
    `heads` (label -> query heads per layer, a head taper) a second panel shows those beside
    `baseline_heads`."""
    if not profiles:
        raise ValueError("plot_width_profiles needs at least one profile")
    panels = [(profiles, baseline, "MLP intermediate width d_ff")]
    if heads:
        if baseline_heads is None:
            raise ValueError("plot_width_profiles: heads need baseline_heads")
        panels.append((heads, baseline_heads, "attention query heads"))
    fig, axes = _figure(ncols=len(panels), width=7.0 * len(panels))
    for ax, (lines, base, ylabel) in zip(axes, panels):
        _profile_panel(ax, lines, base, ylabel)
    fig.suptitle(title)
    return _save(fig, path)


def _profile_panel(
    ax: Axes, lines: Mapping[str, Sequence[int]], baseline: int, ylabel: str
) -> None:

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    n_max = 0
    for label, values in lines.items():
        n_max = max(n_max, len(values))
        layers = np.arange(len(values))
        ax.plot(layers, list(values), marker="o", markersize=3.5, linewidth=1.6, label=label)
    ax.axhline(baseline, color="0.3", linestyle="--", linewidth=1.2, label=f"baseline ({baseline})")
    ax.set_xlabel("layer (0 = first)")
    ax.set_ylabel(ylabel)
    ax.set_xlim(-0.5, n_max - 0.5)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")


def _is_multi_seed(curve: Any) -> bool:
    """A multi-seed curve is a list of curves (each a list of (tokens, loss) pairs)."""
    if not curve:
        return False
    first = curve[0]
    return len(first) > 0 and isinstance(first[0], (list, tuple))


def _mean_band(runs: Sequence[Sequence[CurvePoint]]) -> tuple[np.ndarray, ...]:
    """Mean and std over seeds on the tokens of the first run, each run interpolated onto that
    grid within the range every run covers (seeds may log at slightly different token counts)."""
    arrays = [np.asarray(r, dtype=float).reshape(-1, 2) for r in runs if len(r)]
    if not arrays:
        return np.empty(0), np.empty(0), np.empty(0)
    lo = max(a[:, 0].min() for a in arrays)
    hi = min(a[:, 0].max() for a in arrays)
    grid = arrays[0][:, 0]
    grid = grid[(grid >= lo) & (grid <= hi)]
    ys = np.stack([np.interp(grid, a[:, 0], a[:, 1]) for a in arrays])
    return grid, ys.mean(axis=0), ys.std(axis=0, ddof=1) if len(arrays) > 1 else np.zeros_like(grid)


def plot_loss_curves(
    curves: Mapping[str, Sequence[CurvePoint] | Sequence[Sequence[CurvePoint]]],
    path: str | Path,
    title: str = "Validation loss",
    ylabel: str = "loss (nats/token)",
) -> Path:
    """Loss vs tokens seen, one line per label. A label's value is either one curve
    [(tokens, loss), ...] or a list of curves, one per seed: then the mean is drawn with a
    ±1 std band (sample std over seeds)."""
    if not curves:
        raise ValueError("plot_loss_curves needs at least one curve")
    fig, (ax,) = _figure()
    any_band = False
    for label, curve in curves.items():
        if _is_multi_seed(curve):
            runs = [list(r) for r in curve]  # type: ignore[arg-type]
            x, mean, std = _mean_band(runs)
            (line,) = ax.plot(x, mean, linewidth=1.6, label=f"{label} (n={len(runs)})")
            if len(runs) > 1:
                ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2)
                any_band = True
        else:
            pts = np.asarray(curve, dtype=float).reshape(-1, 2)
            ax.plot(pts[:, 0], pts[:, 1], linewidth=1.6, label=label)

    ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 2M, 500k: token counts stay readable
    ax.set_xlabel("tokens seen")
    ax.set_ylabel(ylabel)
    ax.set_title(title + (" (mean ± 1 std over seeds)" if any_band else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def plot_paired_differences(
    curves: Mapping[str, Sequence[Sequence[CurvePoint]]],
    path: str | Path,
    title: str = "Paired validation-loss difference vs uniform (mean ± 1 std over seeds)",
    ylabel: str = "val loss − uniform (same seed), nats/token",
) -> Path:
    """Per label, one difference curve per seed [(tokens, loss - baseline loss), ...]: the mean
    over seeds at the token counts every seed has, a ±1 std band (sample std), and 0 dashed."""
    fig, (ax,) = _figure()
    for label, runs in curves.items():
        if not runs:
            continue
        grid = sorted(set.intersection(*(set(t for t, _ in r) for r in runs)))
        ys = np.array([[dict(map(tuple, r))[t] for t in grid] for r in runs])
        mean = ys.mean(axis=0)
        (line,) = ax.plot(grid, mean, linewidth=1.6, label=f"{label} (n={len(runs)})")
        if len(runs) > 1:
            sd = ys.std(axis=0, ddof=1)
            ax.fill_between(grid, mean - sd, mean + sd, color=line.get_color(), alpha=0.2)

    ax.axhline(0.0, color="0.3", linestyle="--", linewidth=1.2, label="uniform")
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.set_xlabel("tokens seen")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def plot_novelty(
    results: Mapping[str, NoveltyResult],
    path: str | Path,
    title: str = "Layer-wise novelty",
    band: bool | str = True,
    r_labels: Mapping[str, Mapping[str, str]] | None = None,
    r_title: str = "r = Pearson with depth",
) -> Path:
    """rho_mlp (left) and rho_block (right) per layer, one line per model, each with a band of
    ±1 `std` of its per-layer statistics: a string `band` says what that std is a spread of
    (default: "±1 std over tokens"; False draws none). The legend gives each model's Pearson r
    with depth, or `r_labels[name]["pearson_mlp" | "pearson_block"]` (e.g. a mean over seeds),
    under `r_title`. Models of different depth are drawn against relative depth l/(L-1)."""
    if not results:
        raise ValueError("plot_novelty needs at least one result")

    band_text = band if isinstance(band, str) else "±1 std over tokens"
    depths = {r.n_layers for r in results.values()}
    relative = len(depths) > 1
    fig, axes = _figure(ncols=2, width=11.0, height=4.5)
    panels = [
        ("rho_mlp", r"$\rho_{\mathrm{mlp}}$", r"$\cos(F_l(z_l),\ h_l)$", "pearson_mlp"),
        ("rho_block", r"$\rho_{\mathrm{block}}$", r"$\cos(h_{l+1} - h_l,\ h_l)$", "pearson_block"),
    ]
    for ax, (key, symbol, formula, r_key) in zip(axes, panels):
        for name, res in results.items():
            stats = getattr(res, key)
            L = len(stats)
            x = np.arange(L) / max(L - 1, 1) if relative else np.arange(L)
            mean = np.array([s.mean for s in stats])
            std = np.array([s.std for s in stats])
            r_text = r_labels[name][r_key] if r_labels else f"r={getattr(res, r_key):+.2f}"
            (line,) = ax.plot(x, mean, marker="o", markersize=3, label=f"{name} ({r_text})")
            if band:
                ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.15)
        ax.axhline(0.0, color="0.4", linewidth=0.8)
        ax.set_xlabel("relative depth l/(L-1)" if relative else "layer l")
        if not relative:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(f"{symbol} = {formula}")
        ax.set_title(f"{symbol} per layer" + (f" (band: {band_text})" if band else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", title=r_title, title_fontsize="small")
    fig.suptitle(title)
    return _save(fig, path)


# One row of a forest plot: (label, estimate, interval low, interval high); None = no interval.
IntervalRow = tuple[str, float, float | None, float | None]


def plot_intervals(
    rows: Sequence[IntervalRow],
    path: str | Path,
    title: str,
    xlabel: str,
    reference: Mapping[str, float] | None = None,
    reference_label: str = "paper",
) -> Path:
    """A forest plot: one row per label, top to bottom, with the estimate as a dot and its
    interval as a bar, zero as a dashed line, and an optional reference value per label (e.g. the
    paper's) as a hollow diamond."""
    if not rows:
        raise ValueError("plot_intervals needs at least one row")
    fig, (ax,) = _figure(height=max(2.5, 0.8 + 0.42 * len(rows)))
    y = np.arange(len(rows))[::-1]
    for yi, (_, est, lo, hi) in zip(y, rows):
        if lo is not None and hi is not None:
            ax.plot([lo, hi], [yi, yi], color="C0", linewidth=2.2, solid_capstyle="butt")
        ax.plot([est], [yi], "o", color="C0", markersize=6)
    ax.plot([], [], "o-", color="C0", label="ours: mean and 95% CI")
    if reference:
        ref = [(yi, reference[label]) for yi, (label, *_) in zip(y, rows) if label in reference]
        if ref:
            ax.plot(
                [v for _, v in ref],
                [yi for yi, _ in ref],
                "D",
                markerfacecolor="none",
                markeredgecolor="C3",
                markersize=7,
                linestyle="none",
                label=reference_label,
            )
    ax.axvline(0.0, color="0.3", linestyle="--", linewidth=1.0)
    ax.set_yticks(y, [label for label, *_ in rows])
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize="small")
    return _save(fig, path)


# One point of a series with its interval: (x, estimate, interval low, interval high).
IntervalPoint = tuple[float, float, float | None, float | None]


def plot_interval_series(
    series: Mapping[str, Sequence[IntervalPoint]],
    path: str | Path,
    title: str,
    xlabel: str,
    ylabel: str,
    reference: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    reference_label: str = "paper",
    logx: bool = False,
    zero_line: bool = True,
) -> Path:
    """One line per label through its estimates, with error bars for the intervals, zero
    dashed (unless `zero_line` is False), and optional reference lines (dotted, same colour)
    under the same labels; `logx`: a logarithmic x axis."""
    if not series:
        raise ValueError("plot_interval_series needs at least one series")
    fig, (ax,) = _figure()
    for i, (label, pts) in enumerate(series.items()):
        color = f"C{i}"
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        err = np.array(
            [
                [y - lo if lo is not None else 0.0 for _, y, lo, _ in pts],
                [hi - y if hi is not None else 0.0 for _, y, _, hi in pts],
            ]
        )
        ax.errorbar(
            xs, ys, yerr=err, color=color, marker="o", capsize=3, linewidth=1.6, label=label
        )
        ref = (reference or {}).get(label)
        if ref:
            ax.plot(
                [x for x, _ in ref],
                [y for _, y in ref],
                color=color,
                linestyle=":",
                marker="D",
                markerfacecolor="none",
                linewidth=1.2,
                label=f"{label} ({reference_label})",
            )
    if zero_line:
        ax.axhline(0.0, color="0.3", linestyle="--", linewidth=1.0)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", ncol=2)
    return _save(fig, path)

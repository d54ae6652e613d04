"""The run's loss curve (train and validation loss vs tokens) as RUN/loss.png (matplotlib Agg)."""

from __future__ import annotations

import math
from pathlib import Path

from taperlm.io import atomic_output
from taperlm.training.metrics import read_metrics


def plot_run(run_dir: str | Path, path: str | Path | None = None) -> Path:
    """Draw RUN/metrics.jsonl into a PNG (default RUN/loss.png) and return its path."""
    import matplotlib  # lazy: heavy, only at the end of a run; the backend precedes pyplot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen

    run = Path(run_dir)
    out = Path(path) if path else run / "loss.png"
    records = read_metrics(run / "metrics.jsonl")
    train = [(r["tokens"], r["loss"]) for r in records if _finite(r.get("loss"))]
    val = [(r["tokens"], r["val_loss"]) for r in records if _finite(r.get("val_loss"))]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if train:
        ax.plot(*zip(*train), label="train loss", lw=1.2)
    if val:
        ax.plot(*zip(*val), "o-", label="validation loss", lw=1.5, ms=3)
    ax.set_xlabel("tokens")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(run.name)
    ax.grid(alpha=0.3)
    if train or val:
        ax.legend()
    fig.tight_layout()
    try:
        with atomic_output(out) as tmp:
            fig.savefig(tmp, dpi=120, format="png")
    finally:
        plt.close(fig)
    return out


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)

"""Draw docs/img/data_flow.png, the data-flow picture of docs/design.md:
`python3 docs/img/data_flow.py` (matplotlib only; rerun it when the flow changes)."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

# name -> (x, y, text): the rooms of the flow, top (the command line) to bottom (what is written)
BOXES = {
    "cli": (0.50, 0.93, "CLI: cli.py -> commands/<name>.py\n(parse, call the library)"),
    "config": (0.22, 0.76, "config: config/ (presets, budget),\nspec/ (tapers, solver),\nfamilies/ (resolved widths)"),
    "plan": (0.78, 0.76, "plan: budgets, FLOPs,\nwidths (no torch)"),
    "model": (0.22, 0.56, "model: models/ (TaperedLM),\nfamilies/ blocks"),
    "data": (0.78, 0.56, "data: data/ prepare -> shards,\ntokenizer, loader"),
    "train": (0.50, 0.38, "training/: loop, optimizer,\ncheckpoints, metrics"),
    "run": (0.50, 0.20, "run dir: config.yaml, metrics.jsonl,\ncheckpoints/, plots"),
    "eval": (0.16, 0.05, "eval: evaluation/\nval ppl, zero-shot, S-NIAH"),
    "compare": (0.50, 0.05, "compare/: grid of runs\nreport.md, report.json, PNGs"),
    "export": (0.84, 0.05, "export: hf/, interop/ (GGUF)\ngenerate, novelty"),
}
ARROWS = [
    ("cli", "config"), ("cli", "plan"), ("cli", "data"), ("config", "model"), ("config", "plan"),
    ("model", "train"), ("data", "train"), ("train", "run"), ("run", "eval"),
    ("run", "compare"), ("run", "export"), ("compare", "train"), ("compare", "eval"),
]  # fmt: skip


def _ends(a: tuple, b: tuple, w: float, h: float) -> tuple[tuple, tuple, str]:
    """Where an arrow from box `a` to box `b` starts and ends, and how it bends: side to side
    within a row, bottom to top down the page, left side to left side back up (compare -> train)."""
    (xa, ya, _), (xb, yb, _) = a, b
    if abs(ya - yb) < 1e-9:
        sign = 1 if xb > xa else -1
        return (xa + sign * w / 2, ya), (xb - sign * w / 2, yb), "arc3"
    if yb > ya:
        return (xa - w / 2, ya), (xb - w / 2, yb), "arc3,rad=-0.5"
    return (xa, ya - h / 2), (xb, yb + h / 2), "arc3"


def draw(path: Path) -> Path:
    fig = Figure(figsize=(9, 7), dpi=110)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.03, 1.04)
    ax.axis("off")
    w, h = 0.25, 0.09
    for x, y, text in BOXES.values():
        box = FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.01",
                             facecolor="#e8eef7", edgecolor="#34495e")  # fmt: skip
        ax.add_patch(box)
        ax.text(x, y, text, ha="center", va="center", fontsize=8)
    for a, b in ARROWS:
        start, end, bend = _ends(BOXES[a], BOXES[b], w, h)
        arrow = FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, color="#34495e",
                                connectionstyle=bend, shrinkA=2, shrinkB=2)  # fmt: skip
        ax.add_patch(arrow)
    ax.text(0.5, 1.03, "taperlm: the data flow", ha="center", va="top", fontsize=11)
    fig.savefig(path)
    return path


if __name__ == "__main__":
    draw(Path(__file__).with_name("data_flow.png"))

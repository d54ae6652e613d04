"""Plots write non-empty PNGs without a display and reject empty input."""

from __future__ import annotations

from pathlib import Path

import pytest

from taperlm.analysis.novelty import NoveltyResult, TokenStats
from taperlm.analysis.plots import plot_loss_curves, plot_novelty, plot_width_profiles

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def is_png(path: Path) -> bool:
    data = Path(path).read_bytes()
    return data[:8] == PNG_MAGIC and len(data) > 5000


def fake_result(name: str, n_layers: int) -> NoveltyResult:
    stats = [TokenStats(0.05 * i, 0.1, 0.05 * i, -0.1, 0.2, 100) for i in range(n_layers)]
    return NoveltyResult(
        name=name,
        rho_block=stats,
        rho_mlp=stats,
        mlp_widths=[None] * n_layers,
        pearson_block=1.0,
        pearson_mlp=1.0,
        n_tokens=100,
        n_windows=1,
        seq_len=101,
        skip_first=True,
        layers_path="blocks",
        mlp_name="mlp",
    )


def test_width_profiles(tmp_path: Path):
    out = plot_width_profiles(
        {"uniform": [352] * 6, "cosine 1.5->0.5": [528, 480, 400, 304, 224, 176]},
        352,
        tmp_path / "sub" / "widths.png",
    )
    assert out == tmp_path / "sub" / "widths.png" and is_png(out)
    both = plot_width_profiles(
        {"cosine": [528, 480, 400, 304, 224, 176]},
        352,
        tmp_path / "heads.png",
        heads={"heads cosine": [6, 6, 5, 3, 2, 2]},
        baseline_heads=4,
    )
    assert is_png(both)
    with pytest.raises(ValueError, match="baseline_heads"):
        plot_width_profiles({"a": [1]}, 1, tmp_path / "x.png", heads={"h": [1]})


def test_loss_curves_single_and_seeds(tmp_path: Path):
    single = [(0, 9.0), (1000, 6.0), (2000, 5.0)]
    seeds = [
        [(0, 9.0), (1000, 6.1), (2000, 5.1)],
        [(0, 9.1), (1000, 5.9), (2100, 4.9)],  # slightly different logging grid
        [(0, 8.9), (1000, 6.0), (2000, 5.0)],
    ]
    out = plot_loss_curves({"uniform": single, "cosine": seeds}, tmp_path / "loss.png")
    assert is_png(out)


def test_novelty_same_and_mixed_depth(tmp_path: Path):
    a = plot_novelty({"a": fake_result("a", 6), "b": fake_result("b", 6)}, tmp_path / "n1.png")
    b = plot_novelty(
        {"gpt2": fake_result("gpt2", 12), "tiny": fake_result("t", 4)},
        tmp_path / "n2.png",
        band=False,
    )
    assert is_png(a) and is_png(b)


def test_empty_inputs_rejected(tmp_path: Path):
    with pytest.raises(ValueError):
        plot_width_profiles({}, 1, tmp_path / "x.png")
    with pytest.raises(ValueError):
        plot_loss_curves({}, tmp_path / "x.png")
    with pytest.raises(ValueError):
        plot_novelty({}, tmp_path / "x.png")

"""Importance of each MLP hidden unit, measured on calibration text: which neurons a pruned
layer keeps.

A SwiGLU layer's hidden unit j computes a_j = silu(gate_j . x) * (up_j . x) and writes
a_j * W_down[:, j] into the residual stream. One pass over the calibration windows records, per
unit, the sums of |a_j|, a_j and a_j^2 (float64) through a hook on each layer's down
projection; every score below is a function of those sums and the layer's weights:

- `act` (activation magnitude, as Minitron's width pruning): mean |a_j| over tokens;
- `flap` (FLAP's fluctuation, An et al. 2024): the sample variance of a_j over tokens times
  ||W_down[:, j]||^2: a unit whose output hardly varies is replaceable by its mean (FLAP adds
  that mean back as a bias; our blocks have no bias, so it is not compensated here);
- `weight_act` (weight magnitude x activation norm, Wanda's product at the unit level):
  sqrt(sum a_j^2) x ||W_down[:, j]||.

benchmarks/prune.py compares them on held-out loss right after pruning (docs/compress.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from taperlm.compress import Score
from taperlm.models.layers import SwiGLU
from taperlm.spec.domains import choices

SCORES = choices(Score)
DEFAULT_SCORE = "weight_act"  # lowest loss right after pruning (docs/compress.md)


@dataclass
class UnitStats:
    """Sums over the calibration tokens of one layer's hidden activations (float64, [width])."""

    abs_sum: torch.Tensor
    sum: torch.Tensor
    sq_sum: torch.Tensor
    count: int = 0

    @classmethod
    def zeros(cls, width: int) -> UnitStats:
        z = torch.zeros(width, dtype=torch.float64)
        return cls(z.clone(), z.clone(), z.clone())

    def add(self, a: torch.Tensor) -> None:
        a = a.detach().reshape(-1, a.shape[-1]).double().cpu()
        self.abs_sum += a.abs().sum(0)
        self.sum += a.sum(0)
        self.sq_sum += (a * a).sum(0)
        self.count += a.shape[0]


def mlps(model: torch.nn.Module) -> list[SwiGLU]:
    """Each block's SwiGLU MLP, in layer order."""
    return [block.mlp for block in model.blocks]


@torch.no_grad()
def collect(model: torch.nn.Module, windows: Iterable[torch.Tensor]) -> list[UnitStats]:
    """Per-layer activation sums of `model` (eval mode) over calibration windows [B, T]."""
    layers = mlps(model)
    stats = [UnitStats.zeros(m.width) for m in layers]
    hooks = [
        m.w_out.register_forward_hook(lambda mod, args, out, s=s: s.add(args[0]))
        for m, s in zip(layers, stats)
    ]
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        for x in windows:
            model(x.to(device))
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    return stats


def unit_scores(stats: UnitStats, mlp: SwiGLU, score: str) -> torch.Tensor:
    """Importance of every hidden unit of one layer by `score` (float64, [width])."""
    n = max(stats.count, 1)
    col_sq = mlp.w_out.weight.detach().double().cpu().pow(2).sum(0)  # ||W_down[:, j]||^2
    if score == "act":
        return stats.abs_sum / n
    if score == "flap":
        mean = stats.sum / n
        var = (stats.sq_sum - n * mean * mean).clamp_min(0) / max(n - 1, 1)
        return var * col_sq
    if score == "weight_act":
        return stats.sq_sum.sqrt() * col_sq.sqrt()
    raise ValueError(f"unknown importance score {score!r}; choose one of {', '.join(SCORES)}")


def top_units(scores: torch.Tensor, keep: int) -> torch.Tensor:
    """Indices of the `keep` highest-scored units in ascending order (ties: the lower index)."""
    if not 0 < keep <= scores.numel():
        raise ValueError(f"cannot keep {keep} of {scores.numel()} units")
    order = torch.sort(scores, descending=True, stable=True).indices  # stable: ties by index
    return order[:keep].sort().values

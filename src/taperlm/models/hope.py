"""Hope-attention (Nested Learning §7.1/§8.3): Transformer++ attention whose MLP is a Continuum
Memory System (CMS), a chain of k SwiGLU levels with their own widths and update periods.

Block: h = x + Attn(norm(x)); u = mlp_norm(h);
    z_0 = u;  z_1 = z_0 + L_1(z_0);  z_i = z_{i-1} + L_i(norm_i(z_{i-1})) for i >= 2;
    CMS(u) = z_k - z_0 = sum_i L_i(.)   (the update added to the residual stream).
Level 1 is normalised by the block's `mlp_norm` (so k = 1 is exactly Transformer++); levels >= 2
have their own RMSNorm. Level widths are `cfg.hope.level_widths[layer]` (the layer's tapered
width split by `level_fractions`, exact sums; see taperlm.families.hope.split_width).

Update periods (the multi-timescale reading; docs/architectures.md): every parameter of level i
(its SwiGLU and its norm; for level 1 also the block's mlp_norm) carries an int attribute
`update_period` = cfg.hope.update_periods[i]. The training loop steps a parameter with period p
only on optimizer steps where (step + 1) % p == 0 and keeps accumulating its gradient otherwise.
Parameters without the attribute have period 1. `periodic_parameters` and `is_due` help;
`tag_update_periods(model)` restores the attributes after a loader replaced the Parameters.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from taperlm.models.layers import Attention, Block, RMSNorm, Rotary, SwiGLU
from taperlm.spec.model_fields import ModelFields


class ContinuumMemory(nn.Module):
    """Sequential CMS: a residual chain of SwiGLU levels; returns the total update."""

    def __init__(self, d_model: int, widths: list[int], periods: list[int], eps: float) -> None:
        super().__init__()
        self.periods = [int(p) for p in periods]
        self.levels = nn.ModuleList(SwiGLU(d_model, w) for w in widths)
        # Level 0 reuses the block's mlp_norm; levels >= 1 own a norm.
        self.norms = nn.ModuleList(RMSNorm(d_model, eps) for _ in widths[1:])
        self.tag_update_periods()

    def tag_update_periods(self) -> None:
        for i, level in enumerate(self.levels):
            set_update_period(level.parameters(), self.periods[i])
            if i:
                set_update_period(self.norms[i - 1].parameters(), self.periods[i])

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        # The sum of the level updates (= z_k - z_0, without the cancellation error of
        # subtracting u, so k = 1 returns exactly the SwiGLU output).
        total = self.levels[0](u)
        z = u + total
        for norm, level in zip(self.norms, self.levels[1:]):
            step = level(norm(z))
            z = z + step
            total = total + step
        return total


def set_update_period(params: Iterable[nn.Parameter], period: int) -> None:
    for p in params:
        p.update_period = int(period)  # type: ignore[attr-defined]


def tag_update_periods(model: nn.Module) -> nn.Module:
    """(Re)set `update_period` on every CMS parameter of `model` (and on the block norms that
    feed level 1). Loaders that replace Parameter objects (e.g. transformers' from_pretrained)
    drop Python attributes; call this after such a load. Returns the model."""
    for module in model.modules():
        if isinstance(module, ContinuumMemory):
            module.tag_update_periods()
        elif isinstance(module, Block) and isinstance(module.mlp, ContinuumMemory):
            set_update_period(module.mlp_norm.parameters(), module.mlp.periods[0])
    return model


def update_period(p: nn.Parameter) -> int:
    return int(getattr(p, "update_period", 1))


def periodic_parameters(model: nn.Module) -> dict[int, list[nn.Parameter]]:
    """Parameters grouped by update period (1 = every optimizer step)."""
    out: dict[int, list[nn.Parameter]] = {}
    for p in model.parameters():
        out.setdefault(update_period(p), []).append(p)
    return dict(sorted(out.items()))


def is_due(p: nn.Parameter, step: int) -> bool:
    """Whether parameter p takes an optimizer step at 0-based optimizer step `step`."""
    return (step + 1) % update_period(p) == 0


def hope_block(cfg: ModelFields, layer: int, rotary: Rotary) -> Block:
    assert cfg.hope.level_widths is not None, "resolve the config first (ModelConfig.resolve())"
    attn = Attention.of_layer(cfg, layer, rotary)
    widths = cfg.hope.level_widths[layer]
    cms = ContinuumMemory(cfg.d_model, widths, cfg.hope.update_periods, cfg.norm_eps)
    block = Block(attn, cms, cfg.d_model, cfg.norm_eps)
    set_update_period(block.mlp_norm.parameters(), cfg.hope.update_periods[0])
    return block

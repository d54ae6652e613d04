"""TaperedLM: embedding -> blocks (each built from its own MLP width) -> norm -> head.

One code path for every allocation: a uniform model is a tapered model whose resolved widths
are all equal. Families differ only in the block factory (`BLOCK_FACTORIES`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from taperlm.config import ModelConfig
from taperlm.errors import ConfigError
from taperlm.models.layers import (
    Attention,
    RMSNorm,
    Rotary,
    SwiGLU,
    cross_entropy,
    init_weights,
)


class Block(nn.Module):
    """Pre-norm residual block: h = x + mixer(norm(x)); out = h + mlp(norm(h))."""

    def __init__(self, mixer: nn.Module, mlp: nn.Module, d_model: int, eps: float) -> None:
        super().__init__()
        self.mixer_norm = RMSNorm(d_model, eps)
        self.mixer = mixer
        self.mlp_norm = RMSNorm(d_model, eps)
        self.mlp = mlp

    def forward(self, x: torch.Tensor, cache: Any = None) -> torch.Tensor:
        normed = self.mixer_norm(x)
        h = x + (self.mixer(normed) if cache is None else self.mixer(normed, cache=cache))
        return h + self.mlp(self.mlp_norm(h))


BlockFactory = Callable[[ModelConfig, int, Rotary], Block]


def _attention_block(cfg: ModelConfig, layer: int, rotary: Rotary) -> Block:
    gate = cfg.gate if cfg.family == "gated" else None
    attn = Attention(cfg.d_model, cfg.n_heads, cfg.kv_heads, rotary, gate=gate)
    assert cfg.mlp_widths is not None
    return Block(attn, SwiGLU(cfg.d_model, cfg.mlp_widths[layer]), cfg.d_model, cfg.norm_eps)


BLOCK_FACTORIES: dict[str, BlockFactory] = {
    "transformer": _attention_block,
    "gated": _attention_block,
}


def register_block_factory(family: str, factory: BlockFactory) -> None:
    BLOCK_FACTORIES[family] = factory


@dataclass
class LMOutput:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


class TaperedLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.mlp_widths is None:
            raise ConfigError("ModelConfig has no resolved mlp_widths; call cfg.resolve() first")
        cfg.validate()
        _load_family_modules()
        if cfg.family not in BLOCK_FACTORIES:
            raise ConfigError(f"model family {cfg.family!r} has no implementation")
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        rotary = Rotary(cfg.head_dim, cfg.context_length, cfg.rope_theta)
        factory = BLOCK_FACTORIES[cfg.family]
        self.blocks = nn.ModuleList(factory(cfg, i, rotary) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        init_weights(self, cfg.init_std, cfg.n_layers)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def new_cache(self) -> list[Any]:
        """Per-layer incremental-decoding state; raises NotImplementedError for mixers without one."""
        caches = []
        for block in self.blocks:
            make = getattr(block.mixer, "new_cache", None)
            if make is None:
                raise NotImplementedError(f"{type(block.mixer).__name__} has no decoding cache")
            caches.append(make())
        return caches

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        cache: list[Any] | None = None,
    ) -> LMOutput:
        if idx.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"token ids must be an integer tensor, got {idx.dtype}")
        x = self.embed(idx)
        for i, block in enumerate(self.blocks):
            x = block(x, None if cache is None else cache[i])
        logits = self.lm_head(self.norm(x))
        loss = None
        if targets is not None:
            loss = cross_entropy(logits, targets)
        return LMOutput(logits=logits, loss=loss)

    def num_params(self) -> int:
        """Unique parameters (a tied head counts once), comparable to budget.total_params."""
        return sum(p.numel() for p in self.parameters())


def _load_family_modules() -> None:
    """Import model modules that register further families (hope, titans) if present."""
    import importlib

    for mod in ("taperlm.models.hope", "taperlm.models.titans"):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as err:
            if err.name != mod:
                raise

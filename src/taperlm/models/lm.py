"""TaperedLM: embedding -> blocks (each built from its own MLP width) -> norm -> head.

One code path for every allocation: a uniform model is a tapered model whose resolved widths
are all equal. Families differ only in their blocks (`taperlm.families`, `Family.build_block`),
which the config hands in (`ModelSpec.build_block`): this module imports no family, budget or
config, so models and families do not import each other back and forth.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from taperlm.errors import ConfigError
from taperlm.models.layers import RMSNorm, Rotary, cross_entropy, init_weights
from taperlm.runtime.device import check_memory
from taperlm.spec.model_fields import ModelSpec


def _check_fits(cfg: ModelSpec) -> None:
    """Refuse, with the numbers, a model whose weights cannot fit where it is about to be built
    (nothing to check on the meta device)."""
    device = torch.empty(0).device
    if device.type == "meta":
        return
    need, detail = cfg.memory_floor()
    check_memory(
        need,
        f"a {cfg.family} model",
        str(device),
        detail,
        "use a smaller model or a machine with more memory",
    )


@dataclass
class LMOutput:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


class TaperedLM(nn.Module):
    def __init__(self, cfg: ModelSpec) -> None:
        super().__init__()
        if cfg.mlp_widths is None:
            raise ConfigError("ModelConfig has no resolved mlp_widths; call cfg.resolve() first")
        # A resolved config (every command's) is used as is; one loaded with its sizes (a run
        # dir, an export) or built in Python is resolved and checked here, once.
        if not cfg.resolved:
            cfg.resolve()
        _check_fits(cfg)
        self.config = cfg
        parts = dict(self.parts(cfg, Rotary.of_model(cfg)))
        self.embed = parts.pop("embed")()
        self.blocks = nn.ModuleList(parts.pop(f"blocks.{i}")() for i in range(cfg.n_layers))
        self.norm = parts.pop("norm")()
        self.lm_head = parts.pop("lm_head")()
        init_weights(self, cfg.init_std, cfg.n_layers, scheme=cfg.init, d_model=cfg.d_model)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    @staticmethod
    def parts(cfg: ModelSpec, rotary: Rotary) -> list[tuple[str, Callable[[], nn.Module]]]:
        """(name, builder) of every top-level part in construction order. Building them in this
        order draws the same random numbers as building the model, which is how a model made on
        the meta device is later filled part by part (training/model.py)."""
        return [
            ("embed", lambda: nn.Embedding(cfg.vocab_size, cfg.d_model)),
            *((f"blocks.{i}", partial(cfg.build_block, i, rotary)) for i in range(cfg.n_layers)),
            ("norm", lambda: RMSNorm(cfg.d_model, cfg.norm_eps)),
            ("lm_head", lambda: nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)),
        ]

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
        logits_to_keep: int = 0,
    ) -> LMOutput:
        """Logits (and the mean loss against `targets`) of token ids `idx` [B, T]. `cache`: state
        from `new_cache()`, advanced in place. `logits_to_keep` = n > 0: logits of the last n
        positions only (generation needs one; saves the [B, T, V] head output)."""
        if idx.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"token ids must be an integer tensor, got {idx.dtype}")
        x = self.embed(idx)
        for i, block in enumerate(self.blocks):
            x = block(x, None if cache is None else cache[i])
        if logits_to_keep > 0:
            if targets is not None:
                raise ValueError("logits_to_keep is for generation; the loss needs every position")
            x = x[:, -logits_to_keep:]
        logits = self.lm_head(self.norm(x))
        loss = None
        if targets is not None:
            loss = cross_entropy(logits, targets)
        return LMOutput(logits=logits, loss=loss)

    def num_params(self) -> int:
        """Unique parameters (a tied head counts once), comparable to budget.total_params."""
        return sum(p.numel() for p in self.parameters())

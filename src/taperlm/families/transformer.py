"""Transformer++ (Llama-style): RoPE attention and a SwiGLU MLP per block, no options."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from taperlm.families.base import Family, ModelFields, attention_params


def attention_block(cfg: ModelFields, layer: int, rotary: Any, gate: str | None = None) -> Any:
    """Attention (with the Gated Attention output gate when `gate` is given) followed by the
    SwiGLU MLP of the layer's own width."""
    from taperlm.models.layers import Attention, Block, SwiGLU  # lazy: plan stays torch-free

    assert cfg.mlp_widths is not None, "resolve the config first (ModelConfig.resolve())"
    attn = Attention.of_layer(cfg, layer, rotary, gate=gate)
    return Block(attn, SwiGLU(cfg.d_model, cfg.mlp_widths[layer]), cfg.d_model, cfg.norm_eps)


def attention_mixer_params(cfg: ModelFields, layer: int) -> dict[str, int]:
    return {**attention_params(cfg, layer), "norms": cfg.d_model}


def _preset(size: str, shape: Mapping[str, int]) -> None:
    return None


FAMILY = Family(
    name="transformer",
    build_block=attention_block,
    mixer_params=attention_mixer_params,
    presets={"transformer": _preset},
)

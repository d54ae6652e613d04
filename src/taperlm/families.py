"""Per-family size resolution and parameter/FLOP formulas (pure Python; no torch).

Every family is a stack of blocks `h = x + mixer(norm(x)); out = h + mlp(norm(h))`. A family
supplies four things, keyed by `ModelConfig.family`:

- `resolve(cfg)`: fill family-specific per-layer sizes (e.g. Hope level widths) from the
  resolved `cfg.mlp_widths`; must be idempotent and never overwrite sizes already present;
- `mixer_params(cfg, layer)` / `mlp_params(cfg, layer)`: exact parameter counts by component,
  equal to `numel` of the built torch modules;
- `mixer_flops(cfg, layer, seq_len)`: forward FLOPs per token of the token mixer that are not
  weight matmuls (attention scores and values, memory updates); weight matmuls are counted from
  the parameter formulas by `taperlm.budget`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from taperlm.config import ModelConfig


@dataclass(frozen=True)
class Family:
    resolve: Callable[[ModelConfig], None]
    mixer_params: Callable[[ModelConfig, int], dict[str, int]]
    mlp_params: Callable[[ModelConfig, int], dict[str, int]]
    mixer_flops: Callable[[ModelConfig, int, int], int]


def swiglu_params(d: int, width: int) -> int:
    """W_gate, W_up: d x width; W_down: width x d; no biases."""
    return 3 * d * width


def attention_params(cfg: ModelConfig) -> dict[str, int]:
    d, hd = cfg.d_model, cfg.head_dim
    return {
        "attn_qkv": d * (cfg.n_heads + 2 * cfg.kv_heads) * hd,
        "attn_out": cfg.n_heads * hd * d,
    }


def attention_flops(cfg: ModelConfig, seq_len: int, window: int | None = None) -> int:
    """Forward FLOPs per token of softmax attention beyond the projections: QK^T and AV,
    2 FLOPs per multiply-add, over the full context (the PaLM convention; no causal halving)."""
    span = seq_len if window is None else min(seq_len, window)
    return 2 * 2 * cfg.n_heads * cfg.head_dim * span


def _no_resolve(cfg: ModelConfig) -> None:
    return None


def _transformer_mixer(cfg: ModelConfig, layer: int) -> dict[str, int]:
    return {**attention_params(cfg), "norms": cfg.d_model}


def _gated_mixer(cfg: ModelConfig, layer: int) -> dict[str, int]:
    gate = cfg.d_model * (cfg.n_heads * cfg.head_dim if cfg.gate == "elementwise" else cfg.n_heads)
    return {**attention_params(cfg), "attn_gate": gate, "norms": cfg.d_model}


def _swiglu_mlp(cfg: ModelConfig, layer: int) -> dict[str, int]:
    assert cfg.mlp_widths is not None
    return {"mlp": swiglu_params(cfg.d_model, cfg.mlp_widths[layer]), "norms": cfg.d_model}


def _attention_flops(cfg: ModelConfig, layer: int, seq_len: int) -> int:
    return attention_flops(cfg, seq_len)


def _pending(name: str) -> Callable:
    def fail(*args, **kwargs):
        raise NotImplementedError(f"the {name} family is not available yet")

    return fail


FAMILIES: dict[str, Family] = {
    "transformer": Family(_no_resolve, _transformer_mixer, _swiglu_mlp, _attention_flops),
    "gated": Family(_no_resolve, _gated_mixer, _swiglu_mlp, _attention_flops),
    "hope": Family(_pending("hope"), _pending("hope"), _pending("hope"), _pending("hope")),
    "titans": Family(
        _pending("titans"), _pending("titans"), _pending("titans"), _pending("titans")
    ),
}


def family(cfg: ModelConfig) -> Family:
    return FAMILIES[cfg.family]


def resolve_family_sizes(cfg: ModelConfig) -> None:
    family(cfg).resolve(cfg)

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
from typing import TYPE_CHECKING

from taperlm.errors import ConfigError, TaperError
from taperlm.taper import TaperSpec, solve_sizes

if TYPE_CHECKING:  # config.py calls into this module to resolve family sizes
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


# ----------------------------------------------------------------------------------------------
# Hope-attention: Transformer++ attention + a Continuum Memory System (chain of SwiGLU levels)


def split_width(width: int, fractions: list[float], multiple_of: int) -> list[int]:
    """Split one layer's CMS width into per-level widths that sum exactly to `width`.

    Levels get whole units of `multiple_of` by largest remainder (ties: earlier level first),
    at least one unit each; a remainder width % multiple_of (only for custom widths that are not
    multiples) goes to level 0. If the width has fewer units than levels, units are abandoned
    and the split is done in steps of 1 instead.
    """
    k = len(fractions)
    m = multiple_of if width // multiple_of >= k else 1
    units, rest = divmod(width, m)
    exact = [f * units for f in fractions]
    out = [max(1, int(e)) for e in exact]
    while sum(out) < units:
        i = max(range(k), key=lambda j: (exact[j] - out[j], -j))
        out[i] += 1
    while sum(out) > units:
        i = max((j for j in range(k) if out[j] > 1), key=lambda j: (out[j] - exact[j], j))
        out[i] -= 1
    widths = [u * m for u in out]
    widths[0] += rest
    return widths


def _hope_resolve(cfg: ModelConfig) -> None:
    if cfg.hope.level_widths is not None:
        return
    assert cfg.mlp_widths is not None
    if any(w < cfg.hope.levels for w in cfg.mlp_widths):
        raise ConfigError(
            f"model.hope.levels = {cfg.hope.levels} but some layer's MLP width is smaller "
            f"({min(cfg.mlp_widths)}); every level needs a width >= 1"
        )
    m = cfg.taper.multiple_of
    cfg.hope.level_widths = [split_width(w, cfg.hope.level_fractions, m) for w in cfg.mlp_widths]


def hope_level_widths(cfg: ModelConfig, layer: int) -> list[int]:
    assert cfg.hope.level_widths is not None, "resolve the config first (ModelConfig.resolve())"
    return cfg.hope.level_widths[layer]


def _hope_mlp(cfg: ModelConfig, layer: int) -> dict[str, int]:
    """Level i: SwiGLU of width h_i; level 0 is normed by the block's mlp_norm, levels >= 1 by
    their own RMSNorm (so k = 1 is exactly Transformer++)."""
    widths = hope_level_widths(cfg, layer)
    out = {f"mlp_level{i}": swiglu_params(cfg.d_model, w) for i, w in enumerate(widths)}
    out["norms"] = cfg.d_model * len(widths)
    return out


# ----------------------------------------------------------------------------------------------
# Titans: neural long-term memory + attention (MAC / MAG / MAL) + SwiGLU MLP


def _titans_resolve(cfg: ModelConfig) -> None:
    t = cfg.titans
    if t.memory_widths is not None:
        return
    spec = TaperSpec.parse(t.memory_taper, t.memory_multiple_of)
    base = t.memory_expansion * t.memory_head_dim
    try:
        t.memory_widths = solve_sizes(spec, cfg.n_layers, base, what="memory width")
    except TaperError as err:
        raise ConfigError(f"model.titans.memory_taper {t.memory_taper!r}: {err}") from None


def memory_mlp_shapes(cfg: ModelConfig, layer: int) -> list[tuple[int, int]]:
    """(in, out) of every layer of one head's memory MLP: d_m -> h -> ... -> h -> d_m."""
    t = cfg.titans
    assert t.memory_widths is not None, "resolve the config first (ModelConfig.resolve())"
    h, dm = t.memory_widths[layer], t.memory_head_dim
    return [(dm, h)] + [(h, h)] * (t.memory_depth - 2) + [(h, dm)]


def memory_state_size(cfg: ModelConfig, layer: int) -> int:
    """Entries of the memory weights M (all heads) = numel of the learned initial state M_0."""
    return cfg.titans.memory_heads * sum(i * o for i, o in memory_mlp_shapes(cfg, layer))


def _titans_mixer(cfg: ModelConfig, layer: int) -> dict[str, int]:
    t = cfg.titans
    d = cfg.d_model
    d_in = t.memory_heads * t.memory_head_dim
    extra_norms = {"mag": 2 * d, "mac": 2 * d, "mal": d}[t.variant]
    return {
        **attention_params(cfg),
        "vector_persistent": t.persistent_tokens * d,
        "memory_qkv": 3 * d * d_in,
        "conv_memory": 3 * t.conv_kernel * d_in,
        "memory_gates": 3 * d * t.memory_heads,
        "bias_memory_gates": 3 * t.memory_heads,
        "vector_memory_init": memory_state_size(cfg, layer),
        "memory_out_gate": d * d_in,
        "memory_out": d_in * d,
        "norms": d + d_in + extra_norms,
    }


def memory_flops(cfg: ModelConfig, layer: int) -> int:
    """Forward FLOPs per token of the memory beyond its projections (2 per multiply-add).

    With S = memory_state_size and S_1 = numel of the first memory layer (all heads):
    retrieval M(q): 2S; inner gradient at the chunk-start weights: forward on k 2S, error
    back-propagation through layers 2..L 2(S - S_1), weight gradients for the two coefficient
    sets (momentum and weights, see models/memory.py) 4S; the per-chunk state update
    (momentum and weight recurrences, ~6 elementwise ops per entry) 6S / chunk_size.
    """
    t = cfg.titans
    S = memory_state_size(cfg, layer)
    S1 = t.memory_heads * t.memory_head_dim * t.memory_widths[layer]  # type: ignore[index]
    return 2 * S + 2 * S + 2 * (S - S1) + 4 * S + (6 * S) // t.chunk_size


def _titans_flops(cfg: ModelConfig, layer: int, seq_len: int) -> int:
    """Attention span: persistent tokens + sliding window (MAG, MAL) or persistent tokens +
    retrieved memory tokens + own segment (MAC); plus memory_flops. MAC also reads the memory
    a second time (queries from the segment input, for the memory tokens) and applies some
    projections to two streams; those repeated weight matmuls are added here because the
    6 x matmul-params rule counts each weight once per token."""
    t = cfg.titans
    d, d_in = cfg.d_model, t.memory_heads * t.memory_head_dim
    if t.variant == "mac":
        span = t.persistent_tokens + 2 * min(seq_len, t.segment_len)
        mem = memory_flops(cfg, layer) + 2 * memory_state_size(cfg, layer)
        # second use of: memory query projection, output gate, output projection (memory-token
        # stream), and the attention K/V projection of the memory tokens
        kv = 2 * cfg.kv_heads * cfg.head_dim
        repeat = 2 * (d * d_in + d * d_in + d_in * d + d * kv)
        return attention_span_flops(cfg, span) + mem + repeat
    span = t.persistent_tokens + min(seq_len, t.window)
    return attention_span_flops(cfg, span) + memory_flops(cfg, layer)


def attention_span_flops(cfg: ModelConfig, span: int) -> int:
    """QK^T and AV for every query against `span` keys (2 FLOPs per multiply-add)."""
    return 2 * 2 * cfg.n_heads * cfg.head_dim * span


FAMILIES: dict[str, Family] = {
    "transformer": Family(_no_resolve, _transformer_mixer, _swiglu_mlp, _attention_flops),
    "gated": Family(_no_resolve, _gated_mixer, _swiglu_mlp, _attention_flops),
    "hope": Family(_hope_resolve, _transformer_mixer, _hope_mlp, _attention_flops),
    "titans": Family(_titans_resolve, _titans_mixer, _swiglu_mlp, _titans_flops),
}


def family(cfg: ModelConfig) -> Family:
    return FAMILIES[cfg.family]


def resolve_family_sizes(cfg: ModelConfig) -> None:
    family(cfg).resolve(cfg)

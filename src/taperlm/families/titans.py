"""Titans (Behrouz et al. 2025): neural long-term memory combined with attention as context (MAC),
gate (MAG) or layer (MAL), followed by the tapered SwiGLU MLP (docs/architectures.md).

A second, optional taper (`titans.memory_taper`) acts on the per-layer hidden width of the
memory MLP, resolved into `titans.memory_widths` at an exact budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from taperlm.errors import ConfigError, TaperError
from taperlm.families.base import (
    Family,
    ModelFields,
    attention_params,
    attention_span_flops,
)
from taperlm.files.io import quoted
from taperlm.spec.domains import (
    MAX_CONTEXT,
    MAX_DEPTH,
    MAX_HEADS,
    MAX_WIDTH,
    choices,
    setting,
    up_to,
)
from taperlm.spec.solver import solve_sizes
from taperlm.spec.taper import TEXT_SPEC, TaperSpec, text_spec

# How the memory combines with attention: as context, as gate, as layer.
Variant = Literal["mac", "mag", "mal"]
VARIANTS = choices(Variant)


@dataclass
class TitansConfig:
    """Titans: neural long-term memory (LMM) combined with attention, followed by a SwiGLU MLP."""

    variant: Variant = setting("mag", Variant)
    """mac (memory as context) | mag (memory as gate) | mal (memory as layer)."""
    memory_heads: int = setting(4, up_to(MAX_HEADS))
    """number of memory heads H_m."""
    memory_head_dim: int = setting(64, up_to(MAX_WIDTH))
    """per-head key/value width d_m of the memory."""
    memory_depth: int = setting(2, up_to(MAX_DEPTH, 2))
    """layers of the memory MLP (>= 2)."""
    memory_expansion: int = setting(2, up_to(MAX_DEPTH))
    """hidden width of the memory MLP as a multiple of memory_head_dim."""
    chunk_size: int = setting(16, up_to(MAX_CONTEXT))
    """tokens per chunk of the chunk-wise parallel update; part of the model."""
    conv_kernel: int = setting(4, up_to(MAX_CONTEXT))
    """kernel of the depthwise convolutions after the q/k/v projections."""
    persistent_tokens: int = setting(4, up_to(MAX_CONTEXT, 0))
    """learned persistent memory tokens N_p."""
    window: int = setting(512, up_to(MAX_CONTEXT))
    """sliding attention window (mag, mal)."""
    segment_len: int = setting(128, up_to(MAX_CONTEXT))
    """segment length of mac."""
    # the inner step on ||M(k)-v||^2 diverges for large values
    max_inner_lr: float = setting(0.1, "(0, 1]")
    """upper bound of the data-dependent inner learning rate theta_t."""
    # 0 turns the clip off
    max_inner_grad_norm: float = setting(1.0, "[0, inf)")
    """every token's inner gradient (what it writes into the memory) is clipped to this norm, so the
    memory cannot blow up within a sequence (0 = no clip).
    """
    memory_taper: TaperSpec = field(
        default_factory=lambda: text_spec("uniform"), metadata=TEXT_SPEC
    )
    """second taper (same language as `model.taper`, e.g. cosine:1.5:0.5) on the per-layer memory
    hidden width; baseline memory_expansion x memory_head_dim; depth 2 only (deeper memories are
    not linear in the width, so a taper would change the budget). Given and written as text,
    parsed once when set (like `model.head_taper`); its step is memory_multiple_of
    (`memory_taper_spec()`).
    """
    memory_multiple_of: int = setting(16, up_to(MAX_WIDTH))
    """every resolved memory width is a multiple of this."""
    memory_widths: list[int] | None = setting(None, up_to(MAX_WIDTH))
    """resolved per-layer memory hidden widths; written by the library."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "memory_taper":
            value = text_spec(value)
        super().__setattr__(name, value)

    def memory_taper_spec(self) -> TaperSpec:
        """`memory_taper` in steps of memory_multiple_of; TaperError for a text that does not
        parse (kept as given), ConfigError for a value that is no spec."""
        spec = self.memory_taper
        if isinstance(spec, str):
            return TaperSpec.parse(spec, self.memory_multiple_of)  # raises its parse error
        if not isinstance(spec, TaperSpec):
            raise ConfigError(f"model.titans.memory_taper must be a string, got {quoted(spec)}")
        spec = dataclasses.replace(spec, multiple_of=self.memory_multiple_of)
        spec.validate()
        return spec


# ----------------------------------------------------------------------------------------------
# options


def _validate(cfg: ModelFields) -> None:
    """Chunking and the memory-width taper (ConfigError names the key); each option's own
    range is its declared domain, checked by ModelConfig.validate."""
    t: TitansConfig = cfg.options
    if t.variant == "mac" and t.segment_len % t.chunk_size:
        raise ConfigError(
            f"model.titans.segment_len ({t.segment_len}) must be a multiple of "
            f"model.titans.chunk_size ({t.chunk_size}) so memory chunks never straddle segments"
        )
    _validate_memory_taper(t, cfg.n_layers)


def _validate_memory_taper(t: TitansConfig, n_layers: int) -> None:
    try:
        spec = t.memory_taper_spec()
    except TaperError as err:
        raise ConfigError(f"model.titans.memory_taper: {err}") from None
    if not spec.is_uniform and t.memory_depth != 2:
        raise ConfigError(
            f"model.titans.memory_taper {t.memory_taper.as_text()!r} needs memory_depth 2 (got "
            f"{t.memory_depth}): deeper memories have width^2 parameters, so a taper would not "
            "keep the budget; use memory_taper: uniform"
        )
    base = t.memory_expansion * t.memory_head_dim
    if t.memory_widths is not None:
        w = t.memory_widths
        if len(w) != n_layers or any(not isinstance(x, int) or x < 1 for x in w):
            raise ConfigError(
                f"model.titans.memory_widths must be {n_layers} positive integers (one per "
                f"layer), got {w}; delete it to re-resolve from memory_taper"
            )
        if sum(w) != n_layers * base:
            raise ConfigError(
                f"model.titans.memory_widths sum to {sum(w)} but the budget is n_layers x "
                f"memory_expansion x memory_head_dim = {n_layers * base}; delete it to re-resolve"
            )


def _resolve(cfg: ModelFields) -> None:
    t: TitansConfig = cfg.options
    if t.memory_widths is not None:
        return
    spec = t.memory_taper_spec()
    base = t.memory_expansion * t.memory_head_dim
    try:
        t.memory_widths = solve_sizes(spec, cfg.n_layers, base, what="memory width")
    except TaperError as err:
        raise ConfigError(
            f"model.titans.memory_taper {t.memory_taper.as_text()!r}: {err}"
        ) from None


def _untapered(t: TitansConfig) -> TitansConfig:
    return dataclasses.replace(t, memory_taper="uniform")


# ----------------------------------------------------------------------------------------------
# sizes


def memory_mlp_shapes(cfg: ModelFields, layer: int) -> list[tuple[int, int]]:
    """(in, out) of every layer of one head's memory MLP: d_m -> h -> ... -> h -> d_m."""
    t: TitansConfig = cfg.options
    assert t.memory_widths is not None, "resolve the config first (ModelConfig.resolve())"
    h, dm = t.memory_widths[layer], t.memory_head_dim
    return [(dm, h)] + [(h, h)] * (t.memory_depth - 2) + [(h, dm)]


def memory_state_size(cfg: ModelFields, layer: int) -> int:
    """Entries of the memory weights M (all heads) = numel of the learned initial state M_0."""
    return cfg.options.memory_heads * sum(i * o for i, o in memory_mlp_shapes(cfg, layer))


def _mixer_params(cfg: ModelFields, layer: int) -> dict[str, int]:
    t: TitansConfig = cfg.options
    d = cfg.d_model
    d_in = t.memory_heads * t.memory_head_dim
    extra_norms = {"mag": 2 * d, "mac": 2 * d, "mal": d}[t.variant]
    return {
        **attention_params(cfg, layer),
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


def memory_flops(cfg: ModelFields, layer: int) -> int:
    """Forward FLOPs per token of the memory beyond its projections (2 per multiply-add).

    With S = memory_state_size and S_1 = numel of the first memory layer (all heads):
    retrieval M(q): 2S; inner gradient at the chunk-start weights: forward on k 2S, error
    back-propagation through layers 2..L 2(S - S_1), weight gradients for the two coefficient
    sets (momentum and weights, see models/memory.py) 4S; the per-chunk state update
    (momentum and weight recurrences, ~6 elementwise ops per entry) 6S / chunk_size.
    """
    t: TitansConfig = cfg.options
    S = memory_state_size(cfg, layer)
    S1 = t.memory_heads * t.memory_head_dim * t.memory_widths[layer]  # type: ignore[index]
    return 2 * S + 2 * S + 2 * (S - S1) + 4 * S + (6 * S) // t.chunk_size


def _mixer_flops(cfg: ModelFields, layer: int, seq_len: int) -> int:
    """Attention span: persistent tokens + sliding window (MAG, MAL) or persistent tokens +
    retrieved memory tokens + own segment (MAC); plus memory_flops. MAC also reads the memory
    a second time (queries from the segment input, for the memory tokens) and applies some
    projections to two streams; those repeated weight matmuls are added here because the
    6 x matmul-params rule counts each weight once per token."""
    t: TitansConfig = cfg.options
    d, d_in = cfg.d_model, t.memory_heads * t.memory_head_dim
    if t.variant == "mac":
        span = t.persistent_tokens + 2 * min(seq_len, t.segment_len)
        mem = memory_flops(cfg, layer) + 2 * memory_state_size(cfg, layer)
        # second use of: memory query projection, output gate, output projection (memory-token
        # stream), and the attention K/V projection of the memory tokens
        kv = 2 * cfg.attention_heads(layer)[1] * cfg.head_dim
        repeat = 2 * (d * d_in + d * d_in + d_in * d + d * kv)
        return attention_span_flops(cfg, layer, span) + mem + repeat
    span = t.persistent_tokens + min(seq_len, t.window)
    return attention_span_flops(cfg, layer, span) + memory_flops(cfg, layer)


def _cached_kv(cfg: ModelFields, layer: int, tokens: int) -> int:
    """Key/value entries per KV head of the decoding cache after `tokens` tokens (models/
    titans.py): MAG/MAL keep the tokens from the start of the block before the newest token's
    block of `window`; MAC keeps its current segment's tokens and as many memory tokens."""
    t: TitansConfig = cfg.options
    if tokens <= 0:
        return 0
    if t.variant == "mac":
        return 2 * ((tokens - 1) % t.segment_len + 1)
    return tokens - max(0, (tokens // t.window - 1) * t.window)


# ----------------------------------------------------------------------------------------------
# blocks, presets, plan


def _block(cfg: ModelFields, layer: int, rotary: Any) -> Any:
    from taperlm.models.titans import titans_block  # lazy: plan stays torch-free

    return titans_block(cfg, layer, rotary)


# Per size: chunk 16 (micro/tiny/small) or 64 (paper sizes, GPU throughput); sliding window 64 /
# 128 / 1024 (MAG, MAL); MAC segments 64 / 128 / 512; persistent tokens 4 (micro/tiny/small) or 16.
_PRESET_SIZES: dict[str, dict[str, int]] = {
    "nano": dict(chunk_size=16, window=64, segment_len=64, persistent_tokens=4),
    "micro": dict(chunk_size=16, window=64, segment_len=64, persistent_tokens=4),
    "tiny": dict(chunk_size=16, window=64, segment_len=64, persistent_tokens=4),
    "small": dict(chunk_size=16, window=128, segment_len=128, persistent_tokens=4),
    "440m": dict(chunk_size=64, window=1024, segment_len=512, persistent_tokens=16),
    "760m": dict(chunk_size=64, window=1024, segment_len=512, persistent_tokens=16),
    "1.3b": dict(chunk_size=64, window=1024, segment_len=512, persistent_tokens=16),
}


def _preset(variant: str):
    """Presets `titans-{variant}-{size}`: memory heads x head dim = the attention's heads and
    head dim, memory depth 2, expansion 2, the per-size settings above."""

    def options(size: str, shape: Mapping[str, int]) -> TitansConfig:
        heads = shape["n_heads"]
        return TitansConfig(
            variant=variant,
            memory_heads=heads,
            memory_head_dim=shape["d_model"] // heads,
            memory_depth=2,
            memory_expansion=2,
            conv_kernel=4,
            max_inner_lr=0.1,
            **_PRESET_SIZES[size],
        )

    return options


def _plan_column(cfg: ModelFields) -> tuple[str, list[str]] | None:
    widths = cfg.options.memory_widths
    return ("memory width", [str(w) for w in widths]) if widths else None


FAMILY = Family(
    name="titans",
    build_block=_block,
    mixer_params=_mixer_params,
    mixer_flops=_mixer_flops,
    cached_kv=_cached_kv,
    options=TitansConfig,
    validate=_validate,
    resolve=_resolve,
    resolved=("memory_widths",),
    untapered=_untapered,
    presets={f"titans-{v}": _preset(v) for v in VARIANTS},
    plan_column=_plan_column,
)

"""The `Family` record and what families share (pure Python; no torch, no taperlm.config).

A model family is one module in `taperlm/families/` that defines a `Family` and is listed in
`taperlm.families.FAMILIES`; nothing else in taperlm names a family. Every family is a stack of
pre-norm residual blocks

    h = x + mixer(mixer_norm(x));   out = h + mlp(mlp_norm(h))

(`taperlm.models.layers.Block`) whose layer-l MLP has the tapered width `mlp_widths[l]`. The
record says how to check and resolve the family's options, how many parameters and FLOPs each
component has, how to build a block, which presets it has and what `taperlm plan` shows for it.
Families read a config through `ModelFields` (`taperlm.spec.model_fields`, which the torch blocks of
`taperlm.models` read it through too) and never import `taperlm.config` (which imports them), so
there is no import circle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from taperlm.spec.model_fields import ModelFields

# (cfg, layer) -> parameter count by component, e.g. {"attn_qkv": ..., "norms": ...}
ComponentParams = Callable[[ModelFields, int], dict[str, int]]
# (size name, shape) -> the family's options for preset `<prefix>-<size>` (None: no options)
PresetOptions = Callable[[str, Mapping[str, int]], Any]


# ----------------------------------------------------------------------------------------------
# shared parameter and FLOP formulas


def swiglu_params(d: int, width: int) -> int:
    """W_gate, W_up: d x width; W_down: width x d; no biases."""
    return 3 * d * width


def swiglu_mlp_params(cfg: ModelFields, layer: int) -> dict[str, int]:
    """The SwiGLU MLP of layer l at its own width, and its norm."""
    assert cfg.mlp_widths is not None, "resolve the config first (ModelConfig.resolve())"
    return {"mlp": swiglu_params(cfg.d_model, cfg.mlp_widths[layer]), "norms": cfg.d_model}


def attention_params(cfg: ModelFields, layer: int) -> dict[str, int]:
    """Q, K, V and output projections of layer l's attention: H_l query heads and H_l / g KV
    heads of the model's head dim (`cfg.attention_heads(layer)`); linear in H_l, so a head
    taper with the same total heads keeps the budget (a KV taper changes only the K/V rows,
    2 d d_h per KV head, which the MLP widths take up: taperlm.config.kv_taper)."""
    d, hd = cfg.d_model, cfg.head_dim
    heads, kv_heads = cfg.attention_heads(layer)
    out = {
        "attn_qkv": d * (heads + 2 * kv_heads) * hd,
        "attn_out": heads * hd * d,
    }
    # Transformer++'s options for imported checkpoints (absent, and not counted, by default)
    bias = getattr(cfg, "attention_bias", "none")
    if bias != "none":
        out["attn_bias"] = (heads + 2 * kv_heads) * hd + (d if bias == "qkvo" else 0)
    if getattr(cfg, "qk_norm", False):
        out["qk_norm"] = 2 * hd
    return out


def attention_span_flops(cfg: ModelFields, layer: int, span: int) -> int:
    """QK^T and AV of layer l's query heads against `span` keys (2 FLOPs per multiply-add);
    linear in the layer's heads at every span."""
    heads, _ = cfg.attention_heads(layer)
    return 2 * 2 * heads * cfg.head_dim * span


def attention_flops(cfg: ModelFields, layer: int, seq_len: int, window: int | None = None) -> int:
    """Forward FLOPs per token of layer l's softmax attention beyond the projections: QK^T and
    AV over the full context (the PaLM convention; no causal halving), or over a sliding
    `window`."""
    return attention_span_flops(cfg, layer, seq_len if window is None else min(seq_len, window))


def full_attention_flops(cfg: ModelFields, layer: int, seq_len: int) -> int:
    """Mixer FLOPs of global softmax attention over `seq_len` tokens."""
    return attention_flops(cfg, layer, seq_len)


# ----------------------------------------------------------------------------------------------
# the record


def _nothing(cfg: ModelFields) -> None:
    return None


def _same(options: Any) -> Any:
    return options


def _no_column(cfg: ModelFields) -> tuple[str, list[str]] | None:
    return None


def _every_token(cfg: ModelFields, layer: int, seq_len: int) -> int:
    return seq_len


@dataclass(frozen=True)
class Family:
    """Everything taperlm knows about one model family."""

    name: str
    """`model.family`; also the YAML section of its options (`model.<name>:`)."""
    build_block: Callable[[ModelFields, int, Any], Any]
    """(cfg, layer, rotary) -> the layer's `Block` (imports torch itself, so that `taperlm plan`
    never does)."""
    mixer_params: ComponentParams
    """exact parameter counts by component of layer l's mixer, equal to `numel` of the built
    modules. Components named `norms*`, `conv*`, `bias*` or `vector*` are not matmul weights
    (`taperlm.config.budget`).
    """
    mlp_params: ComponentParams = swiglu_mlp_params
    """the same for layer l's MLP."""
    mixer_flops: Callable[[ModelFields, int, int], int] = full_attention_flops
    """(cfg, layer, seq_len) -> forward FLOPs per token of the mixer that are not weight matmuls
    (attention scores and values, memory updates).
    """
    options: type | None = None
    """the dataclass of the family's options (None: the family has none). Its fields are typed and
    documented like every config field.
    """
    validate: Callable[[ModelFields], None] = _nothing
    """ConfigError (naming the key and the fix) for bad options; called after the shared checks of
    `ModelConfig.validate`.
    """
    resolve: Callable[[ModelFields], None] = _nothing
    """fill the family's per-layer sizes into its options from `cfg.mlp_widths`; idempotent, never
    overwrites sizes already present (they are authoritative).
    """
    resolved: tuple[str, ...] = ()
    """names of the option fields `resolve` writes (cleared when sizes change)."""
    untapered: Callable[[Any], Any] = _same
    """the options of the uniform baseline (turns off a family's own tapers)."""
    presets: Mapping[str, PresetOptions] = field(default_factory=dict)
    """preset name prefix -> options of `<prefix>-<size>` for every shared size."""
    plan_column: Callable[[ModelFields], tuple[str, list[str]] | None] = _no_column
    """(header, one value per layer) that `taperlm plan` adds, or None."""
    attention: bool = True
    """whether the blocks have softmax attention whose heads follow `cfg.attention_heads(layer)`
    (the head taper); False rejects a head taper.
    """
    cached_kv: Callable[[ModelFields, int, int], int] = _every_token
    """(cfg, layer, tokens) -> key/value entries per KV head that layer l's decoding cache holds
    after `tokens` tokens (every token for global attention; a window or segment for Titans), so
    `taperlm plan`'s cache bytes equal the tensors allocated.
    """

    def fresh_options(self, options: Any) -> Any:
        """A copy of `options` with the resolved sizes cleared (to be re-resolved)."""
        if options is None:
            return None
        return dataclasses.replace(options, **dict.fromkeys(self.resolved))

"""Per-layer widths where engines serve them: the DeciLM / Nemotron-NAS checkpoint format
(`DeciLMForCausalLM`, a Llama whose config.json lists one `block_configs` entry per layer), read
by vLLM and SGLang (`nemotron_nas`), Megatron-Core's heterogeneous layer config, mlx-lm and
llama.cpp's Hugging Face converter (`DeciModel`, GGUF architecture `deci`).

Each entry says, for its layer:
    attention.n_heads_in_group   query heads per KV head (KV heads = num_attention_heads / it);
                                 query heads are num_attention_heads in every layer
    ffn.ffn_mult                 the MLP width as a multiplier: readers compute the width as
                                 find_multiple(int(2 * ffn_mult * hidden_size / 3), 256)
(and `no_op`/`replace_with_linear` false: every layer is a normal block). So the format carries
exactly: MLP widths that are multiples of 256 (we write ffn_mult = 1.5 * width / hidden_size,
which the rule maps back to that width), any KV heads that divide the query heads, and one
query-head count for all layers. Anything else (a head taper, other widths, other families) is
refused by name rather than rounded. The weights use Hugging Face Llama names (`hf.llama`);
RoPE is the rotate-half form both use.
"""

from __future__ import annotations

from typing import Any

from taperlm.errors import ConfigError

WIDTH_MULTIPLE = 256  # readers round the width from ffn_mult up to a multiple of this


def ffn_mult_width(ffn_mult: float, hidden_size: int) -> int:
    """The MLP width a reader computes from `ffn_mult` (the rule of vLLM's nemotron_nas and
    llama.cpp's DeciModel): int(2 * ffn_mult * hidden / 3) rounded up to a multiple of 256."""
    n = int(2 * ffn_mult * hidden_size / 3)
    return n if n % WIDTH_MULTIPLE == 0 else n + WIDTH_MULTIPLE - n % WIDTH_MULTIPLE


def check_supported(cfg: Any) -> None:
    """ConfigError naming what the DeciLM format cannot carry for this model config."""
    where = "the block-configs (DeciLM) format"
    if cfg.family != "transformer":
        raise ConfigError(
            f"{where} describes Llama blocks (Transformer++); model family {cfg.family!r} has "
            "other blocks. Export a Hugging Face directory instead (--format hf)"
        )
    heads = {cfg.attention_heads(i)[0] for i in range(cfg.n_layers)}
    if len(heads) > 1:
        raise ConfigError(
            f"{where} keeps the query heads equal in every layer, but this model's head taper "
            f"{cfg.head_taper.as_text()!r} gives {sorted(heads)}; taper the KV heads (model.kv_taper) or "
            "the MLP widths instead, or export --format hf / gguf"
        )
    bad = [(i, w) for i, w in enumerate(cfg.mlp_widths) if w % WIDTH_MULTIPLE or w <= 0]
    if bad:
        shown = ", ".join(f"layer {i}: {w}" for i, w in bad[:4])
        raise ConfigError(
            f"{where} expresses MLP widths in multiples of {WIDTH_MULTIPLE} only (readers round "
            f"ffn_mult up to one), and this model has {shown}"
            + (f", ... ({len(bad)} layers)" if len(bad) > 4 else "")
            + f"; plan and train it with --multiple-of {WIDTH_MULTIPLE}, or export --format "
            "hf / gguf, which carry any width"
        )


def block_configs(cfg: Any) -> list[dict[str, Any]]:
    """One `block_configs` entry per layer (after `check_supported`)."""
    check_supported(cfg)
    out = []
    for i, width in enumerate(cfg.mlp_widths):
        q, kv = cfg.attention_heads(i)
        mult = 1.5 * width / cfg.d_model
        assert ffn_mult_width(mult, cfg.d_model) == width  # multiples of 256 round-trip
        out.append(
            {
                "attention": {
                    "n_heads_in_group": q // kv,
                    "no_op": False,
                    "replace_with_linear": False,
                    "sparsify": None,
                    "num_sink_tokens": None,
                    "unshifted_sink": False,
                    "use_prefill_window_in_sink_attention": False,
                    "window_length": None,
                },
                "ffn": {
                    "ffn_mult": float(mult),
                    "no_op": False,
                    "replace_with_linear": False,
                    "sparsify": None,
                },
            }
        )
    return out


def llama_shared_config(cfg: Any) -> dict[str, Any]:
    """The config.json keys a Llama block model has whatever its per-layer sizes (shared by the
    plain Llama export and the DeciLM per-layer one)."""
    return {
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.context_length,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": rope_scaling_config(getattr(cfg, "rope_scaling", None)),
        "hidden_act": "silu",
        "attention_bias": getattr(cfg, "attention_bias", "none") == "qkvo",
        "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": "float32",
        "use_cache": True,
    }


def rope_scaling_config(scaling: Any) -> dict[str, Any] | None:
    """A `model.rope_scaling` as config.json's `rope_scaling` (transformers' rope_type and key
    names; read by transformers 4 and, beside the top-level rope_theta, by transformers 5)."""
    if scaling is None:
        return None
    out: dict[str, Any] = {"rope_type": scaling.type, "factor": scaling.factor}
    if scaling.type == "llama3":
        out |= {
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_context,
        }
    return out


def decilm_config(cfg: Any) -> dict[str, Any]:
    """The config.json of a `DeciLMForCausalLM` with this model's per-layer widths and heads;
    ConfigError for attention a DeciLM block does not have (biases, q/k norms, a head dim
    other than d_model / n_heads)."""
    odd = [
        f"model.{name}"
        for name, plain in (("attention_bias", "none"), ("qk_norm", False))
        if getattr(cfg, name, plain) != plain
    ] + (["model.attention_head_dim"] if getattr(cfg, "attention_head_dim", None) else [])
    if odd:
        raise ConfigError(
            f"a DeciLM (block-configs) block is a plain Llama block, without {', '.join(odd)}; "
            "export --format hf or gguf"
        )
    blocks = block_configs(cfg)
    return {
        "architectures": ["DeciLMForCausalLM"],
        "model_type": "nemotron-nas",
        "block_configs": blocks,
        **llama_shared_config(cfg),
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": None,  # per layer, in block_configs
        "intermediate_size": None,  # per layer, in block_configs
    }

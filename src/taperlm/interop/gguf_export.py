"""Export a Transformer++ model with its tokenizer to one GGUF file that llama.cpp runs.

Which llama.cpp architecture:
    - `llama` when every layer has the same MLP width and heads (a uniform model): the most
      widely supported architecture; its loader takes one width and one head count for all
      layers.
    - `deci` otherwise: the same Llama block (RMSNorm, RoPE attention, SwiGLU), and llama.cpp
      builds both its tensors and its compute graph from the per-layer arrays
      `deci.feed_forward_length`, `deci.attention.head_count` and `.head_count_kv`.

Imported checkpoints' attention options: q/k/v (and output) biases become llama.cpp's optional
`attn_q.bias` ... `attn_output.bias` of the `llama` architecture (Q and K biases permuted as
their rows); `linear` RoPE scaling its `rope.scaling.type`/`.factor`; `llama3` RoPE scaling
the `rope_freqs` tensor of per-frequency divisors, as llama.cpp's converter writes Llama 3.x.
Per-head q/k norms (Qwen3) are refused: llama.cpp computes them only in its `qwen3`
architecture, which this export does not write.

A layer of MLP width 0 (attention only, docs/tapers.md "Zero widths") is written as a one-unit
FFN whose gate, up and down projections are zero (`llama_tensors.GGUF_ZERO_WIDTH_UNITS`): that FFN adds exactly 0,
so the layer computes what ours does. Not as llama.cpp's own FFN-free layer
(`feed_forward_length` 0, no `ffn_*` tensors): its `deci` graph leaves such a layer before the
attention's residual add, so the whole layer's output is dropped, and where it is the last layer
llama.cpp aborts (the gather of the output rows is left out of the graph); run by llama.cpp
itself in tests/export/test_gguf_export.py (`-m slow`).

Layout: tensors keep our (out, in) row-major shapes (GGUF stores them reversed, as ggml
expects). Our RoPE rotates the two halves of each head (rotate-half); llama.cpp's `llama`/`deci`
RoPE rotates adjacent pairs, so the rows of Q and K are permuted within each head, as llama.cpp's
own Hugging Face converter does for Llama. The fused QKV and gate/up matrices are split into
llama.cpp's separate tensors. A tied head is left out (llama.cpp reuses token_embd).

Tokenizer: a byte-level BPE whose pre-tokenization llama.cpp reproduces (GPT-2's, as taperlm's
`bpe:N` and GPT-2 style vocab.json + merges.txt; digits alone then GPT-2's, as SmolLM's; Llama
3's and Qwen2's split regexes) becomes
llama.cpp's `gpt2` tokenizer with that pre-tokenizer's name (`taperlm.interop.gguf_tokenizer`);
EOS is also BOS when the tokenizer names no BOS, and nothing is added to a prompt, as in
`taperlm generate`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np

from taperlm.errors import ConfigError
from taperlm.files.io import atomic_output
from taperlm.files.outfiles import GGUF_KEY, WRITTEN_BY
from taperlm.hf import llama_tensors
from taperlm.interop.gguf_tokenizer import gguf_vocab
from taperlm.spec.domains import choices

GGUFDtype = Literal["f16", "f32"]  # the weight matrices' precision (norms stay f32)
DTYPES = choices(GGUFDtype)
# The model families (`model.family`) whose every block is a Llama block (RMSNorm, RoPE
# attention, SwiGLU, no biases): the only ones llama.cpp has an architecture for.
LLAMA_CPP_FAMILIES = ("transformer",)


def check_supported(cfg: Any) -> None:
    """ConfigError unless llama.cpp can run a model of this config (Transformer++ only; biases
    in the uniform `llama` architecture; no q/k norms)."""

    if cfg.family not in LLAMA_CPP_FAMILIES:
        runs = ", ".join(LLAMA_CPP_FAMILIES)
        raise ConfigError(
            f"GGUF export: model family {cfg.family!r} is not supported by llama.cpp (it has no "
            f"architecture for its blocks); only these families run there: {runs}. Export a "
            "Hugging Face directory instead: taperlm export RUN --out DIR"
        )
    if getattr(cfg, "qk_norm", False):
        raise ConfigError(
            "GGUF export: model.qk_norm (Qwen3's per-head q/k norms) is computed by llama.cpp's "
            "qwen3 architecture only, which this export does not write; export --format llama "
            "(a Qwen3ForCausalLM folder) and convert that with llama.cpp's own converter"
        )
    if getattr(cfg, "attention_bias", "none") != "none":
        q_rows = {cfg.attention_heads(i)[0] * cfg.head_dim for i in range(cfg.n_layers)}
        if architecture(cfg) != "llama" or q_rows != {cfg.d_model}:
            raise ConfigError(
                "GGUF export: llama.cpp takes attention biases in its llama architecture, with "
                "the same heads and MLP width in every layer and n_heads x head_dim = d_model; "
                "this model has per-layer sizes or another head dim: export --format hf"
            )


def architecture(cfg: Any) -> str:
    """`llama` for a uniform model, `deci` (per-layer widths and heads) otherwise."""
    shapes = {(w, cfg.attention_heads(i)) for i, w in enumerate(cfg.mlp_widths)}
    return "llama" if len(shapes) == 1 else "deci"


def _permute_rope(w: Any, heads: int) -> Any:
    """Rows of one of Q/K ([heads * head_dim, d]) or of its bias ([heads * head_dim]) from
    rotate-half to adjacent-pair order."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, 2, half, -1).swapaxes(1, 2).reshape(w.shape)


def gguf_widths(cfg: Any) -> list[int]:
    """Each layer's `feed_forward_length` in the file: its MLP width, llama_tensors.GGUF_ZERO_WIDTH_UNITS for 0."""
    return [w or llama_tensors.GGUF_ZERO_WIDTH_UNITS for w in cfg.mlp_widths]


def _zero_width_ffn(t: Any, state: dict[str, Any], wide: Any) -> Any:
    """A tensor of a width-0 layer's one-unit FFN: its norm our layer's (it feeds only the zero
    projections), the projections zero."""
    if t.kind.gain:
        return state[t.names["ours"]].detach().float().cpu().numpy().astype(np.float32)
    return np.zeros(tuple(n or llama_tensors.GGUF_ZERO_WIDTH_UNITS for n in t.shape), dtype=wide)


def gguf_tensors(model: Any, dtype: str = "f16") -> dict[str, Any]:
    """llama.cpp tensor name -> numpy array of every weight of `model` (a Transformer++
    TaperedLM), named and ordered by `taperlm.hf.llama_tensors`; matrices in `dtype`, norms and
    biases in f32 (llama.cpp requires it); a width-0 layer's FFN as `_zero_width_ffn`."""

    cfg = model.config
    wide = np.float16 if dtype == "f16" else np.float32
    state = model.state_dict()
    out = {}
    for t in llama_tensors.tensors(cfg):
        if "gguf" not in t.names:
            if t.kind.ffn and t.kind.gguf and t.layer is not None:  # a width-0 layer's
                out[t.kind.gguf.format(i=t.layer)] = _zero_width_ffn(t, state, wide)
            continue
        if "ours" not in t.names:  # rope_freqs: llama.cpp's form of our llama3 RoPE scaling
            out[t.names["gguf"]] = rope_freq_divisors(
                cfg.head_dim, cfg.rope_theta, cfg.rope_scaling
            )
            continue
        rows = t.rows_of(state[t.names["ours"]]).detach().float().cpu().numpy()
        rows = rows.astype(wide if rows.ndim == 2 else np.float32)
        out[t.names["gguf"]] = (
            _permute_rope(rows, t.shape[0] // cfg.head_dim) if t.kind.rope else rows
        )
    return out


def rope_freq_divisors(head_dim: int, theta: float, scaling: Any) -> Any:
    """llama.cpp's `rope_freqs` (f32, head_dim / 2): the number each plain RoPE frequency
    theta^(-2i/head_dim) is divided by to give the scaled one (`taperlm.models.layers.
    scaled_frequencies`)."""
    import torch  # lazy: the export's model is a torch model anyway

    from taperlm.models.layers import scaled_frequencies  # lazy: torch

    plain = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    return (plain / scaled_frequencies(plain, scaling)).float().numpy()


def write_gguf(
    model: Any,
    tokenizer: Any,
    path: str | Path,
    dtype: str = "f16",
    name: str = "taperlm",
    description: str = "",
) -> Path:
    """Write `model` (a Transformer++ TaperedLM) and its tokenizer to the GGUF file `path`
    (atomically: a temporary file beside it, renamed when complete)."""
    try:
        import gguf
    except ImportError:
        raise ConfigError(
            "GGUF export needs the gguf package: pip install 'taperlm[gguf]'"
        ) from None
    if dtype not in DTYPES:
        raise ConfigError(f"GGUF export: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    cfg = model.config
    check_supported(cfg)
    vocab = gguf_vocab(tokenizer, cfg.vocab_size)
    tensors = gguf_tensors(model, dtype)
    arch = architecture(cfg)
    heads = [cfg.attention_heads(i) for i in range(cfg.n_layers)]
    path = Path(path)
    with atomic_output(path) as tmp:
        w = gguf.GGUFWriter(str(tmp), arch)
        w.add_name(name)
        w.add_string(GGUF_KEY, f"{WRITTEN_BY} export")  # what export --force may replace
        if description:
            w.add_description(description)
        w.add_file_type(
            gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32
        )
        w.add_context_length(cfg.context_length)
        w.add_embedding_length(cfg.d_model)
        w.add_block_count(cfg.n_layers)
        if arch == "llama":
            w.add_feed_forward_length(gguf_widths(cfg)[0])
            w.add_head_count(heads[0][0])
            w.add_head_count_kv(heads[0][1])
        else:
            w.add_feed_forward_length(gguf_widths(cfg))
            w.add_head_count([h for h, _ in heads])
            w.add_head_count_kv([kv for _, kv in heads])
        # The head dim is the model's, not d_model / (layer 0's heads) as llama.cpp would assume.
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
        w.add_rope_dimension_count(cfg.head_dim)
        w.add_rope_freq_base(float(cfg.rope_theta))
        scaling = getattr(cfg, "rope_scaling", None)
        if scaling is not None and scaling.type == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(float(scaling.factor))
        w.add_layer_norm_rms_eps(float(cfg.norm_eps))
        w.add_vocab_size(cfg.vocab_size)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(vocab["pre"])
        w.add_token_list(vocab["tokens"])
        w.add_token_types(vocab["types"])
        w.add_token_merges(vocab["merges"])
        eos = tokenizer.eos_id
        w.add_eos_token_id(eos)
        w.add_bos_token_id(eos if tokenizer.bos_id is None else tokenizer.bos_id)
        w.add_pad_token_id(eos)
        w.add_add_bos_token(False)
        w.add_add_eos_token(False)
        for tensor_name, array in tensors.items():
            w.add_tensor(tensor_name, array)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return path

"""A GGUF file of a Llama-architecture model read as a Transformer++ model: its metadata mapped
to a `ModelConfig` and its tensors dequantized, renamed and fused into a `TaperedLM` state dict,
for `taperlm import FILE.gguf` (`taperlm.interop.importing`). The inverse of `taperlm.interop.gguf_export`.

What carries over exactly: llama.cpp's `llama` architecture, and `deci` (its per-layer MLP
widths, as `taperlm export --format gguf` writes a tapered or pruned model; width 0 a layer
without an FFN) with one head count — RMSNorm (its eps), RoPE (its base,
and `linear` scaling from `rope.scaling.type`/`.factor`; llama.cpp's adjacent-pair RoPE, so the
rows of Q and K, and their biases, are permuted back to rotate-half within each head),
grouped-query attention, a head dim from `attention.key_length`, optional attention biases
(`attn_q.bias` ... `attn_output.bias`), SwiGLU, a tied head (no `output` tensor) or not. Quantized tensors (Q8_0, Q4_K, ...)
are dequantized to float32: the run holds the dequantized values, and which types the file
held is recorded (`quantization`).

Refused by name: another architecture, a file split in parts, a partial rotary dimension, RoPE
scaling other than linear, Llama 3.x `rope_freqs` divisors (import the Hugging Face folder,
whose config states the llama3 parameters), mixture-of-experts keys, per-layer head counts, any
`llama.*` key this reader does not know, and any tensor it does not expect.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from taperlm.config import ModelConfig
from taperlm.config.model import RopeScaling
from taperlm.errors import CheckpointError, ConfigError
from taperlm.hf import llama_tensors
from taperlm.interop.gguf_file import GGUFHeader, read_header, read_tensors
from taperlm.spec.taper import TaperSpec

# llama.cpp's `llama` and `deci` (the same Llama block with per-layer MLP widths, as
# `taperlm.interop.gguf_export` writes a tapered or pruned model; width 0: a layer without an FFN)
ARCHITECTURES = ("llama", "deci")
# The keys of the architecture's namespace that this reader maps (below) or that change nothing
# taperlm computes (`rope.scaling.finetuned`: a note; `expert_*` checked to be absent or 0).
_KNOWN = frozenset(
    {
        "context_length",
        "embedding_length",
        "block_count",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "attention.layer_norm_rms_epsilon",
        "attention.key_length",
        "attention.value_length",
        "rope.freq_base",
        "rope.dimension_count",
        "rope.scaling.type",
        "rope.scaling.factor",
        "rope.scaling.finetuned",
        "vocab_size",
        "expert_count",
        "expert_used_count",
    }
)
# Namespaces that describe the file, its tokenizer or its quantization run, not the model
# (`taperlm.`: which program wrote it, `taperlm.files.outfiles.GGUF_KEY`).
_OTHER_NAMESPACES = ("general.", "tokenizer.", "quantize.", "taperlm.")


def _refuse(path: Path, what: str) -> ConfigError:
    return ConfigError(f"cannot import {path}: {what}; nothing was written")


def _int(path: Path, meta: dict[str, Any], key: str, default: Any = None) -> int:
    value = meta.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise CheckpointError(f"{path}: GGUF key {key} must be a positive integer, got {value!r}")
    return value


def _number(path: Path, meta: dict[str, Any], key: str, default: float) -> float:
    value = meta.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise CheckpointError(f"{path}: GGUF key {key} must be positive, got {value!r}")
    # GGUF stores these as float32: the shortest decimal of that float32 (0.05 read as
    # 0.05000000074505806 is the 0.05 the model was made with; the same float32 either way)
    single = np.float32(value)
    return float(str(single)) if float(single) == value else float(value)


def _check_keys(path: Path, meta: dict[str, Any]) -> str:
    """The architecture's key prefix; refusals for what this reader cannot carry."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise _refuse(
            path,
            f"its architecture is {arch!r} (general.architecture); taperlm imports GGUF files "
            f"of llama.cpp's {' or '.join(map(repr, ARCHITECTURES))} architecture",
        )
    if meta.get("split.count", 1) != 1:
        raise _refuse(path, "it is one part of a split GGUF file; merge the parts first")
    p = f"{arch}."
    unknown = sorted(
        k
        for k in meta
        if not k.startswith(_OTHER_NAMESPACES) and not k.startswith("split.")
        and (not k.startswith(p) or k[len(p) :] not in _KNOWN)
    )  # fmt: skip
    if unknown:
        raise _refuse(
            path,
            f"it has GGUF key(s) {', '.join(unknown[:4])} that taperlm's import does not know "
            "and that may change what the model computes",
        )
    if meta.get(p + "expert_count", 0):
        raise _refuse(path, "it is a mixture of experts (expert_count); taperlm's MLP is dense")
    return p


def _per_layer(path: Path, meta: dict[str, Any], key: str, layers: int, default: Any = None, zero_ok: bool = False) -> list[int]:  # fmt: skip
    value = meta.get(key, default)
    values = value if isinstance(value, list) else [value] * layers
    if len(values) != layers:
        raise CheckpointError(f"{path}: GGUF key {key} lists {len(values)} values, not {layers}")

    def one(v: Any) -> int:
        if zero_ok and isinstance(v, int) and not isinstance(v, bool) and v == 0:
            return 0  # a deci layer without an FFN
        return _int(path, {key: v}, key)

    return [one(v) for v in values]


def _rope(path: Path, header: GGUFHeader, p: str) -> RopeScaling | None:
    meta = header.metadata
    kind = meta.get(p + "rope.scaling.type", "none")
    if "rope_freqs.weight" in header.tensors:
        raise _refuse(
            path,
            "its RoPE frequencies are rescaled per frequency (rope_freqs: Llama 3.x RoPE "
            "scaling); import the Hugging Face folder, whose config states its llama3 "
            "parameters",
        )
    if kind == "none":
        return None
    if kind != "linear":
        raise _refuse(
            path,
            f"its RoPE scaling is {kind!r} (rope.scaling.type); taperlm computes linear scaling "
            "only from a GGUF file",
        )
    return RopeScaling(type="linear", factor=_number(path, meta, p + "rope.scaling.factor", 1.0))


def model_config(path: str | Path, header: GGUFHeader) -> ModelConfig:
    """The resolved `ModelConfig` of the GGUF file `path`; ConfigError naming what it cannot
    carry."""
    path = Path(path)
    meta = header.metadata
    p = _check_keys(path, meta)
    layers = _int(path, meta, p + "block_count")
    d = _int(path, meta, p + "embedding_length")
    heads = set(_per_layer(path, meta, p + "attention.head_count", layers))
    kv = set(_per_layer(path, meta, p + "attention.head_count_kv", layers, min(heads)))
    if len(heads) != 1 or len(kv) != 1:
        raise _refuse(path, "its head counts differ per layer; taperlm imports one head count")
    (h,), (g,) = heads, kv
    head_dim = _int(path, meta, p + "attention.key_length", d // h if d % h == 0 else None)
    if meta.get(p + "attention.value_length", head_dim) != head_dim:
        raise _refuse(path, "its value heads differ in size from its key heads")
    if meta.get(p + "rope.dimension_count", head_dim) != head_dim:
        raise _refuse(
            path,
            f"RoPE rotates {meta[p + 'rope.dimension_count']} of each head's {head_dim} "
            "dimensions (a partial rotary dimension); taperlm's RoPE rotates the whole head",
        )
    widths = _per_layer(path, meta, p + "feed_forward_length", layers, zero_ok=p == "deci.")
    if sum(widths) % layers:
        raise _refuse(path, f"its MLP widths {widths} do not sum to a multiple of {layers}")
    embed = header.tensors.get("token_embd.weight")
    if embed is None or len(embed.shape) != 2 or embed.shape[1] != d:
        raise _refuse(path, "it has no token_embd.weight of [vocab, embedding_length]")
    vocab = embed.shape[0]
    if meta.get(p + "vocab_size", vocab) != vocab:
        raise CheckpointError(f"{path}: {p}vocab_size differs from token_embd's {vocab} rows")
    cfg = ModelConfig(
        family="transformer",
        vocab_size=vocab,
        d_model=d,
        n_layers=layers,
        n_heads=h,
        n_kv_heads=None if g == h else g,
        mlp_width=sum(widths) // layers,
        taper=TaperSpec.parse(
            "uniform" if len(set(widths)) == 1 else "custom:" + ",".join(map(str, widths)),
            multiple_of=1,
        ),
        mlp_widths=widths,
        context_length=_int(path, meta, p + "context_length"),
        rope_theta=_number(path, meta, p + "rope.freq_base", 10000.0),
        rope_scaling=_rope(path, header, p),
        attention_bias=_bias_kind(header),
        attention_head_dim=None if d % h == 0 and head_dim == d // h else head_dim,
        norm_eps=_number(path, meta, p + "attention.layer_norm_rms_epsilon", 1e-5),
        tie_embeddings="output.weight" not in header.tensors,
    )
    try:
        return cfg.resolve()
    except ConfigError as err:
        raise _refuse(path, f"its shape is not one taperlm builds ({err})") from None


def _bias_kind(header: GGUFHeader) -> str:
    names = header.tensors
    if "blk.0.attn_q.bias" not in names:
        return "none"
    return "qkvo" if "blk.0.attn_output.bias" in names else "qkv"


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of Q or K (or their bias) from llama.cpp's adjacent pairs back to rotate-half (the
    inverse of `taperlm.interop.gguf_export._permute_rope`)."""
    rows = w.shape[0]
    half = rows // heads // 2
    return w.reshape(heads, half, 2, -1).transpose(1, 2).reshape(w.shape)


def read_weights(path: str | Path, header: GGUFHeader, cfg: ModelConfig) -> dict[str, torch.Tensor]:  # fmt: skip
    """The file's weights (dequantized to float32) as a `TaperedLM` state dict of `cfg`: every
    tensor present with its shape, nothing unknown."""
    path = Path(path)
    shapes = {n: t.shape for n, t in header.tensors.items()}
    expected = llama_tensors.names(cfg, "gguf")
    bad = llama_tensors.problem(expected, shapes)
    if bad and bad[0] == "names":
        raise _refuse(path, f"its tensors are not a {cfg.n_layers}-layer llama's ({bad[1]})")
    if bad:
        raise _refuse(path, f"its tensors do not have the shapes its metadata gives ({bad[1]})")
    t = read_tensors(path, header, list(expected), convert=torch.from_numpy)
    return llama_tensors.to_ours(cfg, lambda part: _values(part, t, cfg.head_dim), torch.cat)


def _values(
    part: llama_tensors.LlamaTensor, t: dict[str, torch.Tensor], head_dim: int
) -> torch.Tensor:
    """The values of one of our tensors from the file's tensors `t`: Q and K rows (and biases)
    unpermuted; in a layer without an FFN, which the file leaves out, a gain of ones and empty
    matrices (our norm feeds a zero-width MLP: its gain changes nothing)."""
    name = part.source("gguf")
    if name is None:
        return torch.ones(part.shape) if part.kind.gain else torch.zeros(part.shape)
    return _unpermute(t[name], part.shape[0] // head_dim) if part.kind.rope else t[name]


def quantization(header: GGUFHeader) -> dict[str, int]:
    """ggml type name -> how many of the file's tensors have it (F32, F16, Q8_0, ...), most
    first: what the import dequantized."""
    return dict(Counter(t.type_name for t in header.tensors.values()).most_common())


def zero_ffn_layers(path: str | Path, header: GGUFHeader) -> list[int]:
    """The `deci` layers written as taperlm's GGUF export writes a width-0 layer: an FFN of
    `llama_tensors.GGUF_ZERO_WIDTH_UNITS` units whose down projection is all zero (it adds
    exactly 0)."""
    meta = header.metadata
    widths = meta.get("deci.feed_forward_length")
    if meta.get("general.architecture") != "deci" or not isinstance(widths, list):
        return []
    names = {i: f"blk.{i}.ffn_down.weight" for i, w in enumerate(widths)}
    found = [
        i
        for i, w in enumerate(widths)
        if w == llama_tensors.GGUF_ZERO_WIDTH_UNITS and names[i] in header.tensors
    ]
    down = read_tensors(path, header, [names[i] for i in found])  # d_model values each
    return [i for i in found if not np.any(down[names[i]])]


def as_ffn_free(header: GGUFHeader, layers: list[int]) -> GGUFHeader:
    """`header` with each of `layers` an FFN-free layer (width 0, no ffn_* tensors): the model
    the file's one-unit zero FFNs stand for (`zero_ffn_layers`)."""
    if not layers:
        return header
    widths = list(header.metadata["deci.feed_forward_length"])
    dropped = set()
    for i in layers:
        widths[i] = 0
        dropped |= {f"blk.{i}.ffn_{part}.weight" for part in ("norm", "gate", "up", "down")}
    return GGUFHeader(
        {**header.metadata, "deci.feed_forward_length": widths},
        {n: t for n, t in header.tensors.items() if n not in dropped},
    )


def read(path: str | Path) -> tuple[GGUFHeader, ModelConfig]:
    """The checked header and the model config of the GGUF file `path` (its one-unit zero FFNs
    read as the width-0 layers they stand for: `zero_ffn_layers`)."""
    header = read_header(path)
    header = as_ffn_free(header, zero_ffn_layers(path, header))
    return header, model_config(path, header)

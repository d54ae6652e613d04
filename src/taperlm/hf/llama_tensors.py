"""The tensors of a Llama-family model (Transformer++ blocks: RMSNorm, RoPE attention with
optional biases and per-head q/k norms, SwiGLU; a tied or untied head) described once, and their
names in every format that holds them: our `TaperedLM` state dict, a Hugging Face Llama
checkpoint (`taperlm.hf.llama`) and llama.cpp's GGUF (`taperlm.interop.gguf_import`,
`taperlm.interop.gguf_export`).

The table below has one row (`TensorKind`) per kind of tensor, in the order a forward pass
uses them (the order of a GGUF export's tensors): its shape, the config feature that makes a
model have it, and its name in each format (None where a format has no such tensor). A new kind
of tensor (another bias, say) is one new row; `tensors(cfg)` lists a model's tensors from the
rows, and every reader and writer of the three formats goes by that list.

Pure Python (no torch): the GGUF export imports it without loading torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_args

from taperlm.spec.model_fields import ModelSpec

T = TypeVar("T")  # a tensor: torch's or numpy's

# our state-dict keys, a Hugging Face checkpoint's names, llama.cpp's GGUF names
Format = Literal["ours", "hf", "gguf"]
# The sizes a shape is written in: `q` and `kv` are rows of query and key/value heads (heads x
# head dim), `ffn` the layer's MLP width, `half_head` half the head dim (one RoPE frequency each).
Dim = Literal["vocab", "d", "q", "kv", "ffn", "head_dim", "half_head"]
# What a model config must have for a kind of tensor to exist.
Feature = Literal["always", "attention_bias", "output_bias", "qk_norm", "llama3_rope"]

FEATURES: dict[Feature, Callable[[ModelSpec], bool]] = {
    "always": lambda cfg: True,
    "attention_bias": lambda cfg: cfg.attention_bias != "none",  # q/k/v biases
    "output_bias": lambda cfg: cfg.attention_bias == "qkvo",
    "qk_norm": lambda cfg: cfg.qk_norm,
    # llama.cpp's per-frequency RoPE divisors (Llama 3.x); our model computes them
    "llama3_rope": lambda cfg: cfg.rope_scaling is not None and cfg.rope_scaling.type == "llama3",
}


@dataclass(frozen=True)
class TensorKind:
    """One kind of tensor of a Llama-family model; a layer's names hold `{i}`, its index.

    `ours` is the state-dict key of the `TaperedLM` tensor it is rows of: the kinds sharing a
    key are its rows in table order (q, k, v of the fused `qkv`; gate, up of `w_in`)."""

    role: str
    shape: tuple[Dim, ...]
    ours: str | None
    hf: str | None
    gguf: str | None
    needs: Feature = "always"
    # part of a layer's FFN: llama.cpp's `deci` has none of it in a layer of MLP width 0
    ffn: bool = False
    # rows in heads of rotate-half RoPE pairs: llama.cpp's RoPE pairs adjacent rows (permuted)
    rope: bool = False
    # a norm's gain: all ones (the gain that changes nothing) where a format leaves it out
    gain: bool = False
    # the head: with tied embeddings the files hold only the embedding, which it equals
    tied: bool = False

    def name(self, fmt: Format) -> str | None:
        return {"ours": self.ours, "hf": self.hf, "gguf": self.gguf}[fmt]


_L = "model.layers.{i}."  # a Hugging Face layer's prefix
_EMBED = TensorKind("embed", ("vocab", "d"), "embed.weight", "model.embed_tokens.weight",
                    "token_embd.weight")  # fmt: skip
# each layer's, in its order
_LAYER: tuple[TensorKind, ...] = (
    TensorKind("mixer_norm", ("d",), "blocks.{i}.mixer_norm.weight", _L + "input_layernorm.weight",
               "blk.{i}.attn_norm.weight", gain=True),
    TensorKind("q", ("q", "d"), "blocks.{i}.mixer.qkv.weight", _L + "self_attn.q_proj.weight",
               "blk.{i}.attn_q.weight", rope=True),
    TensorKind("k", ("kv", "d"), "blocks.{i}.mixer.qkv.weight", _L + "self_attn.k_proj.weight",
               "blk.{i}.attn_k.weight", rope=True),
    TensorKind("v", ("kv", "d"), "blocks.{i}.mixer.qkv.weight", _L + "self_attn.v_proj.weight",
               "blk.{i}.attn_v.weight"),
    TensorKind("o", ("d", "q"), "blocks.{i}.mixer.out.weight", _L + "self_attn.o_proj.weight",
               "blk.{i}.attn_output.weight"),
    TensorKind("q_bias", ("q",), "blocks.{i}.mixer.qkv.bias", _L + "self_attn.q_proj.bias",
               "blk.{i}.attn_q.bias", needs="attention_bias", rope=True),
    TensorKind("k_bias", ("kv",), "blocks.{i}.mixer.qkv.bias", _L + "self_attn.k_proj.bias",
               "blk.{i}.attn_k.bias", needs="attention_bias", rope=True),
    TensorKind("v_bias", ("kv",), "blocks.{i}.mixer.qkv.bias", _L + "self_attn.v_proj.bias",
               "blk.{i}.attn_v.bias", needs="attention_bias"),
    TensorKind("o_bias", ("d",), "blocks.{i}.mixer.out.bias", _L + "self_attn.o_proj.bias",
               "blk.{i}.attn_output.bias", needs="output_bias"),
    # llama.cpp computes per-head q/k norms in its qwen3 architecture only, not in llama/deci
    TensorKind("q_norm", ("head_dim",), "blocks.{i}.mixer.q_norm.weight",
               _L + "self_attn.q_norm.weight", None, needs="qk_norm", gain=True),
    TensorKind("k_norm", ("head_dim",), "blocks.{i}.mixer.k_norm.weight",
               _L + "self_attn.k_norm.weight", None, needs="qk_norm", gain=True),
    TensorKind("mlp_norm", ("d",), "blocks.{i}.mlp_norm.weight",
               _L + "post_attention_layernorm.weight", "blk.{i}.ffn_norm.weight", ffn=True,
               gain=True),
    TensorKind("gate", ("ffn", "d"), "blocks.{i}.mlp.w_in.weight", _L + "mlp.gate_proj.weight",
               "blk.{i}.ffn_gate.weight", ffn=True),
    TensorKind("up", ("ffn", "d"), "blocks.{i}.mlp.w_in.weight", _L + "mlp.up_proj.weight",
               "blk.{i}.ffn_up.weight", ffn=True),
    TensorKind("down", ("d", "ffn"), "blocks.{i}.mlp.w_out.weight", _L + "mlp.down_proj.weight",
               "blk.{i}.ffn_down.weight", ffn=True),
)  # fmt: skip
# after the layers
_FINAL: tuple[TensorKind, ...] = (
    TensorKind("final_norm", ("d",), "norm.weight", "model.norm.weight", "output_norm.weight",
               gain=True),
    TensorKind("rope_freqs", ("half_head",), None, None, "rope_freqs.weight",
               needs="llama3_rope"),
    TensorKind("head", ("vocab", "d"), "lm_head.weight", "lm_head.weight", "output.weight",
               tied=True),
)  # fmt: skip


@dataclass(frozen=True)
class LlamaTensor:
    """One tensor of a model: its kind, layer (None outside the layers), shape, the rows
    [start, stop) of our tensor it is, and its name in each format that stores it."""

    kind: TensorKind
    layer: int | None
    shape: tuple[int, ...]
    rows: tuple[int, int]
    names: dict[Format, str]

    def source(self, fmt: Format) -> str | None:
        """The name in `fmt` of the tensor holding this one's values: its own, a tied head's
        embedding; None where the format leaves it out (a width-0 layer's FFN in GGUF: a
        neutral value, see `TensorKind.gain`)."""
        if self.kind.tied and fmt not in self.names:
            return _EMBED.name(fmt)
        return self.names.get(fmt)

    def rows_of(self, whole: Any) -> Any:
        """This tensor's rows of our (fused) tensor `whole` (torch or numpy)."""
        start, stop = self.rows
        return whole[start:stop]


# The MLP width taperlm's GGUF export writes a width-0 layer with, its projections zero (an FFN
# that adds exactly 0): llama.cpp's deci graph drops the whole of an FFN-free layer (width 0, no
# ffn_* tensors, as this table describes a GGUF file of such a model), attention included.
# `taperlm.interop.gguf_export` writes it, `taperlm.interop.gguf_import` reads it back as width 0.
GGUF_ZERO_WIDTH_UNITS = 1


def _stored(kind: TensorKind, fmt: Format, cfg: ModelSpec, width: int) -> bool:
    """Whether a `fmt` file holds a tensor of `kind` (all of ours do): never a tied head (the
    embedding stands in), nor a width-0 layer's FFN in GGUF (llama.cpp's deci skips it)."""
    if kind.tied and cfg.tie_embeddings and fmt != "ours":
        return False
    return not (fmt == "gguf" and kind.ffn and width == 0)


def tensors(cfg: ModelSpec) -> list[LlamaTensor]:
    """Every tensor of a Llama-family model of `cfg` (resolved) in the table's order, layer by
    layer: the model's own (which a format may leave out: `LlamaTensor.names`) and GGUF's
    `rope_freqs`."""
    placed: list[tuple[TensorKind, int | None]] = [(_EMBED, None)]
    placed += [(kind, i) for i in range(cfg.n_layers) for kind in _LAYER]
    placed += [(kind, None) for kind in _FINAL]
    hd = cfg.head_dim
    rows_before: dict[str, int] = {}  # our key -> the rows of it listed so far
    out: list[LlamaTensor] = []
    for kind, layer in placed:
        if not FEATURES[kind.needs](cfg):
            continue
        q, kv = (0, 0) if layer is None else cfg.attention_heads(layer)
        width = 0 if layer is None else (cfg.mlp_widths or [])[layer]
        dims = {
            "vocab": cfg.vocab_size,
            "d": cfg.d_model,
            "q": q * hd,
            "kv": kv * hd,
            "ffn": width,
            "head_dim": hd,
            "half_head": hd // 2,
        }
        shape = tuple(dims[d] for d in kind.shape)
        stored: dict[Format, str] = {}
        for fmt in get_args(Format):
            template = kind.name(fmt)
            if template is not None and _stored(kind, fmt, cfg, width):
                stored[fmt] = template.format(i=layer)
        start = rows_before.get(stored.get("ours", ""), 0)
        if "ours" in stored:
            rows_before[stored["ours"]] = start + shape[0]
        out.append(LlamaTensor(kind, layer, shape, (start, start + shape[0]), stored))
    return out


def names(cfg: ModelSpec, fmt: Format) -> dict[str, tuple[int, ...]]:
    """Every tensor a `fmt` file of `cfg` holds, by name, with its shape ((out, in) for a
    matrix: numpy order for GGUF)."""
    return {t.names[fmt]: t.shape for t in tensors(cfg) if fmt in t.names}


def problem(
    expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], shown: int = 4
) -> tuple[str, str] | None:
    """What is wrong with a file's tensors `found` (name -> shape) against `expected` (`names`):
    ("names", "missing [...]; unknown [...]") when the names differ, ("shapes", "name: found vs
    expected; ...") when a shape does (the first `shown` of each), else None. Both importers
    (Hugging Face folders, GGUF files) refuse with it, in their own words."""
    missing, unknown = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    if missing or unknown:
        parts = (("missing", missing), ("unknown", unknown))
        return "names", "; ".join(f"{what} {names[:shown]}" for what, names in parts if names)
    wrong = [f"{k}: {found[k]} vs {v}" for k, v in expected.items() if tuple(found[k]) != v]
    return ("shapes", "; ".join(wrong[:shown])) if wrong else None


def to_ours(
    cfg: ModelSpec, value: Callable[[LlamaTensor], T], cat: Callable[[list[T]], T]
) -> dict[str, T]:
    """A `TaperedLM` state dict of `cfg` (exactly its keys) from another format:
    `value(t)` the values of each of its tensors, the rows of a fused one (q, k, v of `qkv`;
    gate, up of `w_in`) joined by `cat`."""
    rows: dict[str, list[T]] = {}
    for t in tensors(cfg):
        if "ours" in t.names:
            rows.setdefault(t.names["ours"], []).append(value(t))
    return {key: parts[0] if len(parts) == 1 else cat(parts) for key, parts in rows.items()}

"""A Llama-architecture Hugging Face checkpoint folder read as a Transformer++ `TaperedLM`:
its config.json mapped to a `ModelConfig` and its safetensors weights renamed and fused into
ours, for `taperlm import` (`taperlm.interop.importing`).

What carries over exactly: `LlamaForCausalLM`, and the same computation under the names
`Qwen2ForCausalLM`, `Qwen3ForCausalLM` and `MistralForCausalLM` — RMSNorm (its eps), RoPE in
the rotate-half form (the form of both transformers and taperlm, so Q and K rows need no
permutation; its theta, and `linear` or `llama3` scaling as `model.rope_scaling`, read from
`rope_parameters` (transformers 5) or `rope_scaling` and a top-level `rope_theta` (earlier
releases)), SwiGLU with silu, grouped-query attention, a tied or untied head, attention biases
as `model.attention_bias` (Qwen2's q/k/v biases; Llama's and Qwen3's `attention_bias: true`,
q/k/v and output), Qwen3's per-head q/k RMSNorm (`model.qk_norm`) and an explicit `head_dim`
(`model.attention_head_dim`) — and `DeciLMForCausalLM` whose `block_configs` give per-layer
MLP widths (`taperlm.hf.decilm`; plain Llama blocks, one KV head count). The widths become the
run's resolved `mlp_widths` (a uniform taper, or a custom one with the per-layer widths), every
tensor's shape checked against them.

What is refused, by name, because the result would not compute what transformers computes:
RoPE scaling of another type (yarn, longrope, dynamic, ...) or a partial rotary factor, MLP
biases (`mlp_bias`), a sliding window shorter than the context (Mistral, Qwen2's
`use_sliding_window`), an activation other than silu, quantized weights, a folder that ships
its own code (`auto_map`), any config key this reader does not know, and pickle
(`pytorch_model.bin`) weights, which are never opened: loading them runs code.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from taperlm.config import ModelConfig
from taperlm.config.model import RopeScaling
from taperlm.errors import CheckpointError, ConfigError, UnsafeFileError
from taperlm.files.io import quoted, read_text, strict_json_loads
from taperlm.hf import llama_tensors
from taperlm.hf.decilm import ffn_mult_width, llama_shared_config
from taperlm.hf.safetensors_file import read_header, read_tensors
from taperlm.models.layers import Rotary
from taperlm.spec.domains import MAX_CONTEXT, MAX_HEADS, MAX_LAYERS, MAX_VOCAB, MAX_WIDTH
from taperlm.spec.taper import TaperSpec

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
    # Llama blocks with per-layer sizes (`taperlm.hf.decilm`), as `export --format
    # block-configs` writes them
    "DeciLMForCausalLM": "nemotron-nas",
}
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few KiB
MAX_INDEX_BYTES = 64 << 20  # one line per tensor

# Keys that do not change what the model computes at inference (ids, bookkeeping, training-only
# settings taperlm does not have). Every other key is read below or refused.
_IGNORED = frozenset(
    {
        "_name_or_path",
        "architectures",
        "model_type",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "use_cache",
        "initializer_range",
        "pretraining_tp",  # sliced matmuls in old transformers, the same result
        "attention_dropout",  # 0 in every released model; inference has no dropout
        "max_window_layers",  # which layers a Qwen2 sliding window applies to (checked below)
        "output_attentions",
        "output_hidden_states",
        "return_dict",
    }
)
_READ = frozenset(
    {
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "max_position_embeddings",
        "rms_norm_eps",
        "hidden_act",
        "tie_word_embeddings",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "head_dim",
        "attention_bias",
        "mlp_bias",
        "sliding_window",
        "use_sliding_window",
        "layer_types",
        "block_configs",
    }
)
# The largest value of each size read from config.json: the ends of the config domains
# (`taperlm.spec.domains`), checked on the raw JSON value before any per-layer list, table or tensor
# is built from it (a 1 KB config.json with 300 million layers is refused at once).
_SIZE_LIMITS = {
    "hidden_size": MAX_WIDTH,
    "intermediate_size": MAX_WIDTH,
    "num_hidden_layers": MAX_LAYERS,
    "num_attention_heads": MAX_HEADS,
    "num_key_value_heads": MAX_HEADS,
    "vocab_size": MAX_VOCAB,
    "max_position_embeddings": MAX_CONTEXT,
}
NAME_MAX = 255  # bytes of one file name on Linux and macOS file systems


def _refuse(folder: Path, what: str) -> ConfigError:
    return ConfigError(f"cannot import {folder}: {what}; nothing was written")


def folder_file(folder: str | Path, name: str) -> Path:
    """`folder/name`, refused before it is opened when it is a link leading outside the folder
    (its contents, even a number read from them, could end up in a message): a link is followed
    only to a file inside the folder or, for a Hugging Face Hub cache snapshot
    (`.../snapshots/REV`), inside that cache's `blobs` folder, where the Hub keeps the files."""
    folder = Path(folder)
    path = folder / name
    if not path.is_symlink():
        return path
    base = folder.resolve()
    roots = [base, base.parent.parent / "blobs"] if base.parent.name == "snapshots" else [base]
    target = path.resolve()
    if not any(root in target.parents for root in roots):
        raise UnsafeFileError(
            f"{path} is a link to {target}, outside the checkpoint folder {folder} (and not in "
            "a Hugging Face cache's blobs): taperlm reads a checkpoint's files only inside its "
            "folder. Nothing was read from it; copy the file into the folder"
        )
    return path


def read_config(folder: str | Path) -> dict[str, Any]:
    """The folder's config.json, read bounded and parsed strictly (a key given twice is refused)."""
    folder = Path(folder)
    path = folder_file(folder, CONFIG_FILE)
    if not path.exists():  # anything else there (a FIFO, a folder) is refused by read_text
        raise CheckpointError(
            f"{folder} is not a Hugging Face checkpoint folder: it has no {CONFIG_FILE}"
        )
    try:
        data = strict_json_loads(read_text(path, MAX_CONFIG_BYTES, "config.json"), path)
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path} is not valid JSON ({err.msg})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} is not a JSON object")
    return data


def _int(folder: Path, data: dict[str, Any], key: str, default: Any = None) -> int:
    value = data.get(key)
    value = default if value is None else value  # absent, or null as some configs write it
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise CheckpointError(
            f"{folder}/{CONFIG_FILE}: {key} must be a positive integer, got {quoted(value)}"
        )
    if value > _SIZE_LIMITS.get(key, value):
        raise _refuse(
            folder,
            f"its {key} is {value:,}, more than the {_SIZE_LIMITS[key]:,} taperlm builds "
            "(config.json is damaged or crafted, or the model is larger than taperlm supports)",
        )
    return value


# The keys of a RoPE settings object (`rope_parameters`, `rope_scaling`) of each type taperlm
# computes, beyond rope_type/type and rope_theta: required, then optional.
_ROPE_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "llama3": (
        ("factor", "low_freq_factor", "high_freq_factor"),
        ("original_max_position_embeddings",),
    ),
}


def _positive(folder: Path, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise CheckpointError(f"{folder}/{CONFIG_FILE}: {key} must be positive, got {value!r}")
    return float(value)


def _rope(folder: Path, data: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    """(RoPE theta, its scaling) from `rope_parameters` (transformers 5) or `rope_scaling` and a
    top-level `rope_theta` (earlier releases; a `rope_scaling` wins, as in transformers).
    Types other than default, linear and llama3, and a partial rotary factor, are refused by
    name."""
    params = data.get("rope_parameters")
    scaling = data.get("rope_scaling")
    for key, value in (("rope_parameters", params), ("rope_scaling", scaling)):
        if value is not None and not isinstance(value, dict):
            raise CheckpointError(f"{folder}/{CONFIG_FILE}: {key} is not an object")
    theta = data.get("rope_theta", 10000.0)
    if params is not None:
        theta = params.get("rope_theta", theta)
    where, spec = ("rope_scaling", scaling) if scaling else ("rope_parameters", params or {})
    kind = spec.get("rope_type", spec.get("type", "default"))
    if kind not in _ROPE_KEYS:
        raise _refuse(
            folder,
            f"its RoPE is rope_type {kind!r} ({where}); taperlm computes RoPE of type "
            f"{', '.join(_ROPE_KEYS)} only",
        )
    required, optional = _ROPE_KEYS[kind]
    extra = sorted(set(spec) - {"rope_type", "type", "rope_theta", *required, *optional})
    if extra:
        raise _refuse(
            folder,
            f"its RoPE ({where}, rope_type {kind!r}) has {', '.join(extra)}; taperlm's RoPE "
            "rotates the whole head, with no further settings",
        )
    missing = [k for k in required if k not in spec]
    if missing:
        raise CheckpointError(
            f"{folder}/{CONFIG_FILE}: {where} of rope_type {kind!r} lacks {', '.join(missing)}"
        )
    theta = _positive(folder, "rope_theta", theta)
    if kind == "default":
        return theta, None
    values = {k: _positive(folder, f"{where}.{k}", spec[k]) for k in required}
    if kind == "linear":
        return theta, RopeScaling(type="linear", factor=values["factor"])
    context = spec.get("original_max_position_embeddings", data.get("max_position_embeddings"))
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise CheckpointError(
            f"{folder}/{CONFIG_FILE}: {where}.original_max_position_embeddings must be a "
            f"positive integer, got {context!r}"
        )
    return theta, RopeScaling(type="llama3", original_context=context, **values)


def model_config(folder: str | Path, data: dict[str, Any] | None = None) -> ModelConfig:
    """The `ModelConfig` of the checkpoint in `folder` (resolved: uniform widths, written out);
    ConfigError naming what it cannot carry."""
    folder = Path(folder)
    data = read_config(folder) if data is None else data
    archs = data.get("architectures")
    if not (isinstance(archs, list) and len(archs) == 1 and archs[0] in ARCHITECTURES):
        ours = data.get("model_type") == "taperlm"
        raise _refuse(
            folder,
            f"its architectures are {archs!r}; taperlm imports one of {', '.join(ARCHITECTURES)}"
            + (
                " (this is a `taperlm export` folder, which eval, generate and novelty take as "
                "it is; to train on, continue the run it was exported from)"
                if ours
                else ""
            ),
        )
    arch = archs[0]
    if data.get("model_type") not in (None, ARCHITECTURES[arch]):
        raise _refuse(folder, f"model_type {data.get('model_type')!r} is not {arch}'s")
    if "auto_map" in data:
        raise _refuse(
            folder,
            "its config names code of its own (auto_map); taperlm never runs a checkpoint's "
            "code and cannot tell that its weights mean what a built-in architecture's do",
        )
    if "quantization_config" in data:
        raise _refuse(folder, "it is quantized (quantization_config); import the original weights")
    unknown = sorted(set(data) - _IGNORED - _READ)
    if unknown:
        raise _refuse(
            folder,
            f"its config.json has key(s) {', '.join(unknown)} that taperlm's import does not "
            "know and that may change what the model computes",
        )
    d = _int(folder, data, "hidden_size")
    heads = _int(folder, data, "num_attention_heads")
    layers = _int(folder, data, "num_hidden_layers")
    if arch == "DeciLMForCausalLM":
        widths, kv = _decilm_sizes(folder, data, d, heads, layers)
    else:
        if "block_configs" in data:
            raise _refuse(folder, f"block_configs belong to DeciLMForCausalLM, not {arch}")
        kv = _int(folder, data, "num_key_value_heads", heads)
        widths = [_int(folder, data, "intermediate_size")] * layers
    if sum(widths) % layers:
        raise _refuse(
            folder,
            f"its MLP widths {widths} sum to {sum(widths)}, not a multiple of its {layers} "
            "layers; a taperlm model's widths sum to n_layers x a baseline width",
        )
    context = _int(folder, data, "max_position_embeddings")
    act = data.get("hidden_act", "silu")
    if act != "silu":
        raise _refuse(
            folder, f"its activation is {act!r} (hidden_act); taperlm's MLP is SwiGLU with silu"
        )
    if data.get("mlp_bias"):
        raise _refuse(folder, "it has mlp_bias: true; taperlm's MLP has no biases")
    family = ARCHITECTURES[arch]
    bias = _attention_bias(folder, data, family)
    head_dim = data.get("head_dim")
    if head_dim is not None:
        head_dim = _int(folder, data, "head_dim")
        if head_dim % 2:
            raise _refuse(folder, f"its head_dim {head_dim} is odd; RoPE rotates pairs")
        if family == "nemotron-nas" and (d % heads or head_dim != d // heads):
            raise _refuse(
                folder,
                f"its head_dim is {head_dim}, not hidden_size / num_attention_heads = "
                f"{d}/{heads}, which a DeciLM block has",
            )
    explicit_head_dim = (
        None if head_dim is None or (d % heads == 0 and head_dim == d // heads) else head_dim
    )
    _check_window(folder, data, ARCHITECTURES[arch], context)
    eps = data.get("rms_norm_eps", 1e-6)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise CheckpointError(f"{folder}/{CONFIG_FILE}: rms_norm_eps must be positive, got {eps!r}")
    tied = data.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise CheckpointError(f"{folder}/{CONFIG_FILE}: tie_word_embeddings must be true or false")
    theta, rope_scaling = _rope(folder, data)
    cfg = ModelConfig(
        family="transformer",
        vocab_size=_int(folder, data, "vocab_size"),
        d_model=d,
        n_layers=layers,
        n_heads=heads,
        n_kv_heads=None if kv == heads else kv,
        mlp_width=sum(widths) // layers,
        # Multiples of 1: the checkpoint's widths are kept exactly, whatever they divide by.
        taper=TaperSpec.parse(
            "uniform" if len(set(widths)) == 1 else "custom:" + ",".join(map(str, widths)),
            multiple_of=1,
        ),
        mlp_widths=widths,
        context_length=context,
        rope_theta=theta,
        rope_scaling=rope_scaling,
        attention_bias=bias,
        qk_norm=family == "qwen3",
        attention_head_dim=explicit_head_dim,
        norm_eps=float(eps),
        tie_embeddings=tied,
    )
    try:
        cfg = cfg.resolve()
        # the RoPE tables' finiteness over the whole context, as a model built from it checks
        # (the run's step-0 checkpoint is written without building them: generate would refuse)
        Rotary.of_model(cfg)
    except ConfigError as err:
        raise _refuse(folder, f"its shape is not one taperlm builds ({err})") from None
    return cfg


def _attention_bias(folder: Path, data: dict[str, Any], family: str) -> str:
    """`model.attention_bias` of a checkpoint: Qwen2 always has q/k/v biases (no output bias);
    Llama's and Qwen3's `attention_bias: true` adds them to q, k, v and the output; the other
    architectures (Mistral, DeciLM) have none, and an `attention_bias: true` there is refused."""
    flag = data.get("attention_bias", False)
    if not isinstance(flag, bool):
        raise CheckpointError(f"{folder}/{CONFIG_FILE}: attention_bias must be true or false")
    if family == "qwen2":
        return "qkv"
    if not flag:
        return "none"
    if family in ("llama", "qwen3"):
        return "qkvo"
    raise _refuse(
        folder, f"it has attention_bias: true, which a {family} model's attention does not have"
    )


# The only values of a block_configs entry's keys that describe a plain Llama block.
_PLAIN_BLOCK = {
    "attention": {
        "no_op": False,
        "replace_with_linear": False,
        "sparsify": None,
        "num_sink_tokens": None,
        "unshifted_sink": False,
        "use_prefill_window_in_sink_attention": False,
        "window_length": None,
    },
    "ffn": {"no_op": False, "replace_with_linear": False, "sparsify": None},
}


def _decilm_sizes(
    folder: Path, data: dict[str, Any], d: int, heads: int, layers: int
) -> tuple[list[int], int]:
    """(MLP width per layer, KV heads) of a DeciLM config's `block_configs`: each width by the
    readers' rule from ffn_mult; refused by name: a layer that is not a plain Llama block
    (no_op, replace_with_linear, sink or window attention, sparsity), KV heads that differ
    between layers (taperlm keeps a KV taper's parameters whole, which an arbitrary per-layer
    choice need not)."""
    blocks = data.get("block_configs")
    if not isinstance(blocks, list) or len(blocks) != layers:
        raise CheckpointError(
            f"{folder}/{CONFIG_FILE}: block_configs must list one entry per layer ({layers})"
        )
    widths, groups = [], []
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or set(block) - {"attention", "ffn"}:
            raise CheckpointError(f"{folder}/{CONFIG_FILE}: block_configs[{i}] is not a block")
        for part, plain in _PLAIN_BLOCK.items():
            entry = block.get(part)
            if not isinstance(entry, dict):
                raise CheckpointError(
                    f"{folder}/{CONFIG_FILE}: block_configs[{i}].{part} is missing"
                )
            known = {"n_heads_in_group"} if part == "attention" else {"ffn_mult"}
            extra = sorted(set(entry) - set(plain) - known)
            odd = [k for k, v in plain.items() if entry.get(k, v) != v]
            if extra or odd:
                what = ", ".join(f"{k}: {entry[k]!r}" for k in (odd or extra))
                raise _refuse(
                    folder,
                    f"layer {i}'s {part} is not a plain Llama block ({what}); taperlm builds "
                    "every layer as full attention and a SwiGLU MLP",
                )
        group, mult = block["attention"].get("n_heads_in_group"), block["ffn"].get("ffn_mult")
        if not isinstance(group, int) or isinstance(group, bool) or group < 1 or heads % group:
            raise _refuse(
                folder,
                f"layer {i}'s n_heads_in_group is {group!r}, not a divisor of its {heads} heads",
            )
        if isinstance(mult, bool) or not isinstance(mult, (int, float)) or not mult > 0:
            raise _refuse(folder, f"layer {i}'s ffn_mult is {mult!r}, not a positive number")
        if not math.isfinite(mult) or 2 * mult * d / 3 > MAX_WIDTH:  # before int(): inf, 1e308
            raise _refuse(
                folder,
                f"layer {i}'s ffn_mult {mult!r} gives an MLP width above the {MAX_WIDTH:,} "
                "taperlm builds (config.json is damaged or crafted)",
            )
        widths.append(ffn_mult_width(float(mult), d))
        groups.append(group)
    if len(set(groups)) > 1:
        raise _refuse(
            folder,
            f"its KV heads differ per layer (n_heads_in_group {groups}); taperlm imports "
            "per-layer MLP widths with one KV head count",
        )
    return widths, heads // groups[0]


def _check_window(folder: Path, data: dict[str, Any], model_type: str, context: int) -> None:
    """A sliding window that is shorter than the context changes attention: refused."""
    window = data.get("sliding_window")
    types = data.get("layer_types")
    if types is not None and (
        not isinstance(types, list) or any(t != "full_attention" for t in types)
    ):
        raise _refuse(
            folder,
            f"its layer_types are {types!r}; taperlm's attention is full attention in every layer",
        )
    used = model_type == "mistral" or bool(data.get("use_sliding_window"))
    if used and window is not None:
        if isinstance(window, bool) or not isinstance(window, int):
            raise CheckpointError(f"{folder}/{CONFIG_FILE}: sliding_window must be an integer")
        if window < context:
            raise _refuse(
                folder,
                f"it attends through a sliding window of {window} tokens (sliding_window), "
                f"shorter than its context of {context}; taperlm's attention sees the whole context",
            )


# ----------------------------------------------------------------------------------------------
# weights


def _file_name(folder: Path, name: str) -> str:
    """A shard name read from the index: a plain file name of the folder, never a path (no
    separator, no `..`, not absolute), so the index cannot point anywhere the folder's own
    files do not. Links among the folder's files are followed, as for config.json: a Hugging
    Face Hub cache snapshot holds only links into its `../../blobs`."""
    if len(name.encode("utf-8", "surrogatepass")) > NAME_MAX:
        raise UnsafeFileError(
            f"{folder / INDEX_FILE} names a shard of {len(name):,} characters ({quoted(name, 60)}),"
            f" longer than any file name can be ({NAME_MAX} bytes); the index is damaged or "
            "crafted: restore it from a copy you trust"
        )
    if not name or name in (".", "..") or "\x00" in name or Path(name).name != name or "\\" in name:
        shown = name if len(name) <= 200 else name[:200] + "..."
        raise UnsafeFileError(
            f"{folder / INDEX_FILE} names the shard {shown!r}, which is not a file name in "
            "that folder; the index was edited or crafted: restore it from a copy you trust"
        )
    return name


def weight_files(folder: str | Path) -> dict[str, Path]:
    """HF tensor name -> the safetensors file holding it (one file, or the shards that
    model.safetensors.index.json names, each kept inside the folder)."""
    folder = Path(folder)
    if (folder / WEIGHTS_FILE).exists():
        path = folder_file(folder, WEIGHTS_FILE)
        return dict.fromkeys(read_header(path)[0], path)
    if (folder / INDEX_FILE).exists():
        try:
            index_path = folder_file(folder, INDEX_FILE)
            text = read_text(index_path, MAX_INDEX_BYTES, "index")
            index = strict_json_loads(text, index_path, "index")
        except json.JSONDecodeError as err:
            raise CheckpointError(f"{folder / INDEX_FILE} is not valid JSON ({err.msg})") from None
        wmap = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
            raise CheckpointError(f"{folder / INDEX_FILE} has no weight_map of file names")
        out: dict[str, Path] = {}
        headers: dict[str, set[str]] = {}
        for name, file in wmap.items():
            path = folder_file(folder, _file_name(folder, file))
            if not path.exists():
                raise CheckpointError(
                    f"{folder / INDEX_FILE} names the shard {file!r}, which {folder} lacks (an "
                    "interrupted download?): download the checkpoint again, or restore the file"
                )
            if file not in headers:
                headers[file] = set(read_header(path)[0])
            if name not in headers[file]:
                raise CheckpointError(
                    f"{folder / INDEX_FILE} puts {name!r} in {file}, which lacks it"
                )
            out[name] = path
        return out
    pickles = sorted(p.name for p in folder.glob("*.bin")) + sorted(
        p.name for p in folder.glob("*.pt*")
    )
    if pickles:
        raise _refuse(
            folder,
            f"its weights are pickle files ({', '.join(pickles[:3])}), which taperlm never "
            "opens (unpickling runs code); convert them to safetensors with a tool you trust",
        )
    raise CheckpointError(f"{folder} has no {WEIGHTS_FILE} (nor {INDEX_FILE})")


def read_weights(folder: str | Path, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The checkpoint's weights as a `TaperedLM` state dict of `cfg` (fp32): every tensor
    present with its shape, nothing unknown."""
    folder = Path(folder)
    files = weight_files(folder)
    shapes = _file_shapes(files)
    # Old checkpoints saved the RoPE frequencies as a buffer; they are recomputed from theta.
    shapes = {k: v for k, v in shapes.items() if not k.endswith("rotary_emb.inv_freq")}
    expected = llama_tensors.names(cfg, "hf")
    if cfg.tie_embeddings and "lm_head.weight" in shapes:
        expected["lm_head.weight"] = (cfg.vocab_size, cfg.d_model)  # checked equal below
    bad = llama_tensors.problem(expected, shapes)
    if bad and bad[0] == "names":
        raise _refuse(folder, f"its weights are not a {cfg.n_layers}-layer Llama's ({bad[1]})")
    if bad:
        raise _refuse(
            folder, f"its weights do not have the shapes its config.json gives ({bad[1]})"
        )
    hf = _load(files, list(expected))
    tied_head = hf.get("lm_head.weight") if cfg.tie_embeddings else None
    if tied_head is not None and not torch.equal(tied_head, hf["model.embed_tokens.weight"]):
        raise _refuse(
            folder, "tie_word_embeddings is true but lm_head.weight differs from the embedding"
        )
    return to_taperlm(hf, cfg)


def _file_shapes(files: dict[str, Path]) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for path in sorted(set(files.values())):
        header, _ = read_header(path)
        out |= {k: v["shape"] for k, v in header.items() if files.get(k) == path}
    return out


def _load(files: dict[str, Path], names: list[str]) -> dict[str, torch.Tensor]:
    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(files[name], []).append(name)
    out: dict[str, torch.Tensor] = {}
    for path, wanted in by_file.items():
        out |= read_tensors(path, wanted)
    return out


def to_taperlm(hf: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF Llama tensors -> a `TaperedLM` state dict (`taperlm.hf.llama_tensors`): q/k/v
    (weights and biases) fused into `qkv` (rows q, k, v) and gate/up into `w_in` (rows gate,
    up); a tied head is the embedding. Both use rotate-half RoPE, so rows keep their order."""
    return llama_tensors.to_ours(cfg, lambda t: hf[t.source("hf")], torch.cat)  # type: ignore[index]


def from_taperlm(model: Any) -> dict[str, torch.Tensor]:
    """The inverse of `to_taperlm` for a Transformer++ `TaperedLM`: HF Llama tensor names (the
    naming DeciLM / Nemotron-NAS checkpoints use too), contiguous fp32 copies; no lm_head for a
    tied model (transformers ties it to the embedding)."""
    state = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    return {
        t.names["hf"]: t.rows_of(state[t.names["ours"]]).contiguous().clone()
        for t in llama_tensors.tensors(model.config)
        if "hf" in t.names
    }


def llama_config(cfg: ModelConfig) -> dict[str, Any]:
    """The config.json of a plain `LlamaForCausalLM` equal to a uniform Transformer++ model
    (every layer the same MLP width and heads); ConfigError naming what differs otherwise. A
    model with q/k/v biases only is a `Qwen2ForCausalLM`, one with q/k norms a
    `Qwen3ForCausalLM` (the architectures that compute them)."""
    if cfg.family != "transformer":
        raise ConfigError(
            f"a LlamaForCausalLM has Llama blocks (Transformer++); model family {cfg.family!r} "
            "has other blocks: export --format hf"
        )
    shapes = {(w, cfg.attention_heads(i)) for i, w in enumerate(cfg.mlp_widths or [])}
    if len(shapes) != 1:
        raise ConfigError(
            "a LlamaForCausalLM has one MLP width and one head count for all layers, and this "
            f"model's differ per layer (widths {cfg.mlp_widths}); export its per-layer widths "
            "with --format block-configs (DeciLM), or --format hf / gguf"
        )
    ((width, (heads, kv)),) = shapes
    arch, model_type = "LlamaForCausalLM", "llama"
    if cfg.qk_norm:
        if cfg.attention_bias == "qkv":
            raise ConfigError(
                "no transformers architecture has q/k norms and q/k/v biases without an output "
                "bias (Qwen3's attention_bias biases the output too); export --format hf"
            )
        arch, model_type = "Qwen3ForCausalLM", "qwen3"
    elif cfg.attention_bias == "qkv":
        arch, model_type = "Qwen2ForCausalLM", "qwen2"
    out = {
        "architectures": [arch],
        "model_type": model_type,
        **llama_shared_config(cfg),
        "intermediate_size": width,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
    }
    if model_type == "qwen2":
        del out["attention_bias"]  # Qwen2's q/k/v biases are not an option there
    return out

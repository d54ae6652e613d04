"""`taperlm import`: a Llama-architecture Hugging Face checkpoint folder becomes a taperlm run.

The folder is a stranger's: config.json is parsed strictly (`taperlm.hf.llama`), safetensors
headers are bounded and checked before a byte of data is read (`taperlm.hf.safetensors_file`),
tokenizer files are read through `taperlm.files.io.read_text`, a shard name from the index is a plain
file name of the folder, no code is ever run (no `auto_map`, no pickle). The run
(`taperlm.training.run_dir.write_start_run`) is a Transformer++ model whose resolved per-layer
widths are the checkpoint's, whose step-0 checkpoint holds its weights, and whose tokenizer is
the folder's tokenizer.json (when it has one): its logits equal transformers' on the same ids,
and `train --out RUN --data DATA` continues training it.

A GGUF file (`taperlm import model.gguf`) of llama.cpp's llama architecture is read the same
way (`taperlm.interop.gguf_import`: a bounded header, dequantized tensors); its tokenizer is
rebuilt from llama.cpp's vocabulary where `read_gguf_tokenizer` (below) can do that exactly
(byte-level BPE with a known pre-tokenizer), and its `import.json` records the source, which
ggml types (quantizations) its tensors had, and whether (or why not) the run has its tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from taperlm.config import OVERRIDES_ENV, RunConfig, env_overrides, to_dict
from taperlm.config.assembly import Assembly, Layer, Recipe
from taperlm.config.train import TrainConfig
from taperlm.data.tokenizer import Tokenizer
from taperlm.data.tokenizer_bounds import build_backend
from taperlm.errors import ConfigError, DataError
from taperlm.files.io import read_text, strict_json_loads
from taperlm.hf import llama
from taperlm.training.run_dir import write_start_run

MAX_TOKENIZER_BYTES = 256 << 20  # tokenizer.json of a 256k vocabulary is ~20 MiB
MAX_SIDE_FILE_BYTES = 4 << 20  # tokenizer_config.json, special_tokens_map.json


def import_checkpoint(
    folder: str | Path, out: str | Path, overrides: list[str] | None = None
) -> tuple[RunConfig, Tokenizer | None]:
    """Import the checkpoint folder `folder` as run directory `out`; `overrides` (`train.*` and
    `data.*` KEY=VALUE, as `--set`) set how `taperlm train` continues it. Returns the run's
    config and tokenizer (None when the folder has no tokenizer.json)."""
    folder = Path(folder)
    if folder.suffix.lower() == ".gguf" and not folder.is_dir():
        return import_gguf(folder, out, overrides or [])
    data = llama.read_config(folder)
    model = llama.model_config(folder, data)
    run = _run_config(model, overrides or [])
    weights = llama.read_weights(folder, model)
    tokenizer = read_tokenizer(folder, data, model.vocab_size)
    write_start_run(out, run, weights, tokenizer)
    return run, tokenizer


IMPORT_RECORD = "import.json"  # a GGUF import's source and quantization, in the run dir


def import_gguf(
    path: Path, out: str | Path, overrides: list[str]
) -> tuple[RunConfig, Tokenizer | None]:
    """Import the GGUF file `path` as run directory `out`, with the file's tokenizer where it
    can be rebuilt exactly (`read_gguf_tokenizer`); the run's `import.json` names the file,
    the ggml types of its tensors (dequantized to fp32) and why the run has no tokenizer, if so."""
    from taperlm.interop import gguf_import  # lazy: only GGUF imports need the gguf package

    header, model = gguf_import.read(path)
    run = _run_config(model, overrides)
    weights = gguf_import.read_weights(path, header, model)
    tokenizer, why = read_gguf_tokenizer(path, header.metadata, model.vocab_size)
    record = {
        "source": str(path),
        "format": "gguf",
        "architecture": header.metadata.get("general.architecture"),
        "name": header.metadata.get("general.name"),
        "quantization": gguf_import.quantization(header),
        "dequantized_to": "float32",
        "tokenizer": "rebuilt from the file's tokenizer.ggml.* metadata" if tokenizer else None,
    } | ({"no_tokenizer_because": why} if tokenizer is None else {})
    write_start_run(out, run, weights, tokenizer, {IMPORT_RECORD: json.dumps(record, indent=2)})
    return run, tokenizer


def _run_config(model: Any, overrides: list[str]) -> RunConfig:
    """The run's config, by the one assembly (`taperlm.config.assembly`): the checkpoint's model (the
    base layer, as a preset's), the import's recipe (seq_len no longer than the model's context)
    < `overrides` (--set) < $TAPERLM_SET; neither may change the model."""
    env = env_overrides()
    for origin, texts in (("--set", overrides), (OVERRIDES_ENV, env)):
        fixed = [o for o in texts if o.split("=", 1)[0].strip().startswith("model.")]
        if fixed:
            raise ConfigError(
                f"{origin} {fixed[0]}: the model of an imported run is the checkpoint's; set "
                "train.* and data.* only"
            )
    asm = Assembly.of(to_dict(RunConfig(model=model)), "import", Layer.PRESET)
    recipe = Recipe("import", {"train.seq_len": min(TrainConfig().seq_len, model.context_length)})
    asm.assemble((), overrides, recipe)
    asm.refuse_model_settings(
        "the imported run's model is the checkpoint's; set train.* and data.* keys (with their "
        "section) only"
    )
    return asm.resolve()


def _json_file(path: Path) -> dict[str, Any]:
    if not path.exists():  # anything else there (a FIFO, a folder) is refused by read_text
        return {}
    path = llama.folder_file(path.parent, path.name)
    try:
        data = strict_json_loads(read_text(path, MAX_SIDE_FILE_BYTES, path.name), path)
    except json.JSONDecodeError as err:
        raise DataError(f"{path} is not valid JSON ({err.msg})") from None
    return data if isinstance(data, dict) else {}


def _token(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def read_tokenizer(folder: Path, config: dict[str, Any], vocab_size: int) -> Tokenizer | None:
    """The folder's tokenizer.json as a taperlm tokenizer (EOS/BOS from tokenizer_config.json,
    else config.json's eos_token_id/bos_token_id); None when the folder has none. DataError when
    its ids exceed the model's vocabulary or no EOS token is named."""
    path = folder / "tokenizer.json"
    if not path.exists():
        return None
    text = read_text(
        llama.folder_file(folder, "tokenizer.json"), MAX_TOKENIZER_BYTES, "tokenizer.json"
    )
    backend = build_backend(text, path)  # bounded: counts, expansion, regexes (and panics)
    # The largest id, not the count of ids: a vocabulary with a gap ({"a": 0, "b": 5000}) has
    # two ids, and the model must still have a row for 5000 (the embedding would refuse it).
    top = max(backend.get_vocab(with_added_tokens=True).values(), default=-1)
    if top >= vocab_size:
        raise DataError(
            f"{path} has ids up to {top} but the model's vocab_size is {vocab_size} (embedding "
            f"rows 0..{vocab_size - 1}): the tokenizer is not this model's"
        )
    side = _json_file(folder / "tokenizer_config.json")
    special = _json_file(folder / "special_tokens_map.json")

    def named(key: str) -> str | None:
        token = _token(side.get(key)) or _token(special.get(key))
        ids = config.get(f"{key}_id")
        ids = ids[:1] if isinstance(ids, list) else [ids]  # Llama 3 lists several EOS ids
        known = ids and isinstance(ids[0], int) and not isinstance(ids[0], bool)
        if token is None and known and 0 <= ids[0] < vocab_size:  # an id past u32 overflows
            token = backend.id_to_token(ids[0])
        return token if token is not None and backend.token_to_id(token) is not None else None

    eos, bos = named("eos_token"), named("bos_token")
    if eos is None:
        raise DataError(
            f"{folder} names no EOS token that its tokenizer.json has (tokenizer_config.json "
            "eos_token, or config.json eos_token_id); taperlm needs one to separate documents"
        )
    return Tokenizer(backend, kind="import", spec=str(folder), eos_token=eos, bos_token=bos)


# ----------------------------------------------------------------------------------------------
# a GGUF file's tokenizer
#
# The tokenizer a GGUF file holds (llama.cpp's `tokenizer.ggml.*` metadata) as a taperlm
# `Tokenizer` (`read_gguf_tokenizer`), so that an imported run can be evaluated and trained on text tokenized the way the
# model was trained (`taperlm import FILE.gguf`).
#
# Rebuilt: llama.cpp's `gpt2` kind, a byte-level BPE (its tokens are the ids' strings, its merges
# "left right" pairs in rank order), with the pre-tokenizer its `tokenizer.ggml.pre` names, where
# that is one known exactly here:
#
# - `gpt-2` (also `default`, or the key absent): GPT-2's split regex (what `taperlm export --format
#   gguf` writes);
# - `smollm`, `starcoder`, `refact`, `codeshell`: every digit alone first, then GPT-2's regex
#   (llama.cpp splits these with `\\p{N}` before the GPT-2 pattern; SmolLM/SmolLM2's own
#   tokenizer.json is `Digits(individual_digits)` + `ByteLevel`).
#
# Control tokens (token type 3) and user-defined ones (4) are added tokens, as in the tokenizer.json
# the file was converted from: text that spells one is that one id. The JSON built here goes through
# `taperlm.data.tokenizer_bounds.build_backend` like any tokenizer read from a file (entry counts,
# patterns, probes). Any other kind (`llama`: SentencePiece; another pre-tokenizer) gives no
# tokenizer and the reason, which the import states; nothing here guesses.

# llama.cpp's token types (`llama_token_type`): 1 normal, 2 unknown, 3 control, 4 user-defined,
# 5 unused, 6 byte (SentencePiece byte tokens only)
_CONTROL, _USER_DEFINED = 3, 4
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}  # fmt: skip
_DIGITS_THEN_GPT2 = {
    "type": "Sequence",
    "pretokenizers": [{"type": "Digits", "individual_digits": True}, _BYTE_LEVEL],
}
# tokenizer.ggml.pre -> the tokenizers pre-tokenizer that splits text as llama.cpp does
PRE_TOKENIZERS: dict[str, dict[str, Any]] = {
    "default": _BYTE_LEVEL,
    "gpt-2": _BYTE_LEVEL,
    "smollm": _DIGITS_THEN_GPT2,
    "starcoder": _DIGITS_THEN_GPT2,
    "refact": _DIGITS_THEN_GPT2,
    "codeshell": _DIGITS_THEN_GPT2,
}


def _special(meta: dict[str, Any], key: str, tokens: list[str]) -> str | None:
    value = meta.get(f"tokenizer.ggml.{key}_token_id")
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(tokens):
        return tokens[value]
    return None


def _strings(meta: dict[str, Any], key: str) -> list[str] | None:
    value = meta.get(key)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


def gguf_tokenizer_json(meta: dict[str, Any], vocab_size: int) -> tuple[dict[str, Any] | None, str]:
    """The tokenizer.json (as a dict) of the GGUF metadata `meta` for a model of `vocab_size`
    rows, or None and why it cannot be rebuilt exactly."""
    kind = meta.get("tokenizer.ggml.model")
    if kind is None:
        return None, "the file holds no tokenizer (tokenizer.ggml.model)"
    if kind != "gpt2":
        return None, (
            f"its tokenizer is llama.cpp's {kind!r} kind; taperlm rebuilds the 'gpt2' kind "
            "(byte-level BPE) only"
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        return None, (
            f"its pre-tokenizer is {pre!r} (tokenizer.ggml.pre), not one taperlm rebuilds "
            f"exactly ({', '.join(PRE_TOKENIZERS)})"
        )
    tokens, merges = (
        _strings(meta, "tokenizer.ggml.tokens"),
        _strings(meta, "tokenizer.ggml.merges"),
    )
    if tokens is None or merges is None:
        return None, "its tokenizer.ggml.tokens or .merges is not a list of strings"
    if len(tokens) > vocab_size:
        return None, f"it has {len(tokens):,} tokens but the model only {vocab_size:,} rows"
    if len(set(tokens)) != len(tokens):
        return None, "its token list names a token twice"
    if any(m.count(" ") != 1 for m in merges):
        return None, "a merge of its tokenizer.ggml.merges is not two tokens joined by one space"
    types = meta.get("tokenizer.ggml.token_type")
    if not isinstance(types, list) or len(types) != len(tokens):
        types = [1] * len(tokens)
    added = [
        {"id": i, "content": tokens[i], "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": t == _USER_DEFINED, "special": t == _CONTROL}
        for i, t in enumerate(types) if t in (_CONTROL, _USER_DEFINED)
    ]  # fmt: skip
    data = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": [m.split(" ") for m in merges],
        },
    }
    return data, ""


def read_gguf_tokenizer(
    path: str | Path, meta: dict[str, Any], vocab_size: int
) -> tuple[Tokenizer | None, str]:
    """The GGUF file's tokenizer (EOS/BOS from its token ids) and "", or None and why not."""
    data, why = gguf_tokenizer_json(meta, vocab_size)
    if data is None:
        return None, why
    tokens = meta["tokenizer.ggml.tokens"]
    eos = _special(meta, "eos", tokens)
    if eos is None:
        return None, "it names no EOS token (tokenizer.ggml.eos_token_id)"
    try:
        backend = build_backend(json.dumps(data), path)
    except DataError as err:
        return None, f"its tokenizer cannot be built ({err})"
    tokenizer = Tokenizer(
        backend,
        kind="import",
        spec=str(path),
        eos_token=eos,
        bos_token=_special(meta, "bos", tokens),
    )
    return tokenizer, ""

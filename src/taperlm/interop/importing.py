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
rebuilt from llama.cpp's vocabulary where `taperlm.interop.gguf_tokenizer` can do that exactly
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
from taperlm.interop.gguf_tokenizer import read_gguf_tokenizer
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

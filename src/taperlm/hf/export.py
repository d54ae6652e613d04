"""Export a taperlm model to a Hugging Face model directory:

    config.json (model_type "taperlm", auto_map -> the two code files), model.safetensors,
    configuration_taperlm.py / modeling_taperlm.py (thin files importing the installed
    `taperlm` package), tokenizer files, generation_config.json, and the model card README.md
    (widths, heads, budget, training settings: `taperlm.hf.model_card`).

`AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)` loads it anywhere taperlm is
installed; after `import taperlm` no remote code is needed at all.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from safetensors.torch import save_file
from tokenizers import Tokenizer

from taperlm.config import to_dict
from taperlm.errors import DataError
from taperlm.files.io import MAX_RECORD_BYTES, read_json
from taperlm.files.outdirs import install_files
from taperlm.hf.decilm import decilm_config
from taperlm.hf.llama import from_taperlm, llama_config
from taperlm.hf.model_card import model_card

CONFIG_FILE = "configuration_taperlm.py"
MODELING_FILE = "modeling_taperlm.py"
AUTO_MAP = {
    "AutoConfig": "configuration_taperlm.TaperLMConfig",
    "AutoModelForCausalLM": "modeling_taperlm.TaperLMForCausalLM",
}
_CODE = {
    CONFIG_FILE: '"""TaperLM config for transformers; needs `pip install taperlm`."""\n\n'
    "from taperlm.hf.configuration import TaperLMConfig\n\n"
    '__all__ = ["TaperLMConfig"]\n',
    MODELING_FILE: '"""TaperLM causal LM for transformers; needs `pip install taperlm`."""\n\n'
    "from taperlm.hf.modeling import TaperLMForCausalLM\n\n"
    '__all__ = ["TaperLMForCausalLM"]\n',
}


def hf_tokenizer(tokenizer: Any, context_length: int | None = None) -> Any:
    """A transformers fast tokenizer from ours (via `to_hf()`), a `tokenizers.Tokenizer`, or
    one that already is a transformers tokenizer. BOS = EOS (lm-eval's prefix token)."""
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

    if isinstance(tokenizer, PreTrainedTokenizerBase):
        tok = tokenizer
    elif hasattr(tokenizer, "to_hf"):
        tok = tokenizer.to_hf()
    else:
        inner = getattr(tokenizer, "tokenizer", tokenizer)
        if not isinstance(inner, Tokenizer):
            raise DataError(
                f"cannot convert tokenizer {type(tokenizer).__name__} to a Hugging Face tokenizer; "
                "it needs a to_hf() method or a `tokenizers.Tokenizer`"
            )
        eos_id = getattr(tokenizer, "eos_id", None)
        eos = inner.id_to_token(eos_id) if eos_id is not None else None
        tok = PreTrainedTokenizerFast(tokenizer_object=inner, eos_token=eos, bos_token=eos)
    if tok.eos_token is None:
        raise DataError("the tokenizer has no EOS token; taperlm evaluation needs one as prefix")
    if tok.bos_token is None:
        tok.bos_token = tok.eos_token
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "right"
    if context_length:
        tok.model_max_length = context_length
    return tok


def to_hf_model(model: Any) -> Any:
    """Wrap a `TaperedLM` (weights shared, not copied) as a `TaperLMForCausalLM`."""
    from taperlm.hf.configuration import TaperLMConfig  # lazy: the [hf] extra
    from taperlm.hf.modeling import TaperLMForCausalLM  # lazy: the [hf] extra

    cfg = TaperLMConfig(taperlm=to_dict(model.config))
    hf = TaperLMForCausalLM(cfg)
    hf.model = model
    return hf.eval()


def export_model(
    model: Any,
    out_dir: str | Path,
    tokenizer: Any | None = None,
    generation: dict[str, Any] | None = None,
    run_config: Any | None = None,
) -> Path:
    """Write a Hugging Face directory for `model` (a TaperedLM) to `out_dir`; `run_config`
    (the RunConfig it was trained with) adds the training settings to the model card.

    The files are written into a staging folder first; they replace nothing in `out_dir` but
    files an earlier export wrote and nobody changed since (recorded with their sha256 in the
    folder's marker), else ConfigError naming the files and nothing is written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".taperlm-export-tmp-", dir=out))
    try:
        _write(model, staging, out.resolve().name, tokenizer, generation, run_config)
        _default_modes(staging)
        install_files(staging, out, "export", "--out", "export to another folder")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def export_block_configs(model: Any, out_dir: str | Path, tokenizer: Any | None = None) -> Path:
    """Write `model` (a Transformer++ TaperedLM) to `out_dir` as a DeciLM / Nemotron-NAS
    checkpoint (`taperlm.hf.decilm`: config.json with per-layer `block_configs`, weights in
    Hugging Face Llama names in model.safetensors, the tokenizer), replacing only files of an
    earlier export (as `export_model`); ConfigError, before anything is written, for what the
    format cannot carry."""
    return _export_llama_named(model, decilm_config(model.config), out_dir, tokenizer)


def export_llama(model: Any, out_dir: str | Path, tokenizer: Any | None = None) -> Path:
    """Write a uniform Transformer++ TaperedLM to `out_dir` as a plain `LlamaForCausalLM`
    checkpoint (`taperlm.hf.llama.llama_config`), which transformers and every engine load
    without taperlm; ConfigError, before anything is written, for a model with per-layer sizes
    (use `export_block_configs`) or of another family."""
    return _export_llama_named(model, llama_config(model.config), out_dir, tokenizer)


def _export_llama_named(
    model: Any, config: dict[str, Any], out_dir: str | Path, tokenizer: Any | None
) -> Path:
    """config.json, the weights under Llama names and the tokenizer, staged and installed."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".taperlm-export-tmp-", dir=out))
    try:
        save_file(from_taperlm(model), str(staging / "model.safetensors"), {"format": "pt"})
        if tokenizer is not None:
            tok = hf_tokenizer(tokenizer, model.config.context_length)
            config |= {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
            tok.save_pretrained(staging)
        text = json.dumps(config, indent=2) + "\n"
        (staging / "config.json").write_text(text, encoding="utf-8")
        _default_modes(staging)
        install_files(staging, out, "export", "--out", "export to another folder")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _write(
    model: Any,
    out: Path,
    card_name: str,
    tokenizer: Any | None,
    generation: dict[str, Any] | None,
    run_config: Any | None,
) -> None:
    from transformers import GenerationConfig

    hf = to_hf_model(model)
    hf.config.auto_map = dict(AUTO_MAP)
    hf.config.architectures = ["TaperLMForCausalLM"]
    tok = hf_tokenizer(tokenizer, model.config.context_length) if tokenizer is not None else None
    if tok is not None:
        hf.config.eos_token_id = tok.eos_token_id
        hf.config.bos_token_id = tok.bos_token_id
        hf.config.pad_token_id = tok.pad_token_id
    hf.save_pretrained(out, safe_serialization=True)
    for name, code in _CODE.items():
        (out / name).write_text(code, encoding="utf-8")
    gen = {
        "do_sample": False,
        "use_cache": True,
        "max_length": model.config.context_length,
    }
    if tok is not None:
        gen |= {
            "eos_token_id": tok.eos_token_id,
            "bos_token_id": tok.bos_token_id,
            "pad_token_id": tok.pad_token_id,
        }
    gen |= generation or {}
    GenerationConfig(**gen).save_pretrained(out)
    if tok is not None:
        tok.save_pretrained(out)
    # Make sure auto_map survived (older/newer transformers may drop unknown attributes).
    cfg_path = out / "config.json"
    data = read_json(cfg_path, MAX_RECORD_BYTES, "exported config.json")
    if data.get("auto_map") != AUTO_MAP:
        data["auto_map"] = dict(AUTO_MAP)
        cfg_path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    (out / "README.md").write_text(model_card(model.config, run_config, name=card_name), "utf-8")


def _default_modes(folder: Path) -> None:
    """Give every file of `folder` (the staging folder: only files this export wrote) the mode
    of a newly created file (0644 under the usual umask): some writers (safetensors through a
    private temp file) leave theirs at 0600, which breaks sharing an export with other users or
    a serving process."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~umask)

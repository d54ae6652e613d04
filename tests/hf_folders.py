"""A small Llama checkpoint folder written without transformers -- config.json from taperlm's
own Llama exporter, safetensors weights under Hugging Face names (one file or two shards and an
index), a data dir's tokenizer -- the base that the hostile-folder tests edit one way each."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from taperlm.config import ModelConfig
from taperlm.hf import llama, llama_tensors

VOCAB = 320  # the harness tokenizer's 300 ids, padded


def tiny_config(vocab: int = VOCAB) -> ModelConfig:
    return ModelConfig(
        vocab_size=vocab, d_model=16, n_layers=2, n_heads=2, mlp_width=32, context_length=64
    ).resolve()


def make_llama_folder(
    folder: Path, data: Path | None = None, shards: bool = False, seed: int = 0
) -> Path:
    """`folder` holding a random 2-layer LlamaForCausalLM checkpoint (and `data`'s tokenizer
    with an EOS named in tokenizer_config.json); `shards` splits the weights over two files
    named by model.safetensors.index.json."""
    cfg = tiny_config()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(llama.llama_config(cfg)))
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        name: torch.randn(shape, generator=gen) * 0.1
        for name, shape in llama_tensors.names(cfg, "hf").items()
    }
    if shards:
        names = sorted(tensors)
        half = {"model-00001-of-00002.safetensors": names[::2]}
        half["model-00002-of-00002.safetensors"] = names[1::2]
        for file, part in half.items():
            save_file({n: tensors[n] for n in part}, str(folder / file))
        index = {"weight_map": {n: f for f, part in half.items() for n in part}}
        (folder / llama.INDEX_FILE).write_text(json.dumps(index))
    else:
        save_file(tensors, str(folder / llama.WEIGHTS_FILE))
    if data is not None:
        shutil.copy(data / "tokenizer" / "tokenizer.json", folder / "tokenizer.json")
        (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return folder

"""`taperlm import HF_FOLDER --out RUN`: a Llama-architecture Hugging Face checkpoint folder
(LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM; safetensors), or a
GGUF file of llama.cpp's llama architecture, becomes a taperlm run whose logits equal
transformers'; `taperlm train --out RUN --data DATA` continues training it. What the run cannot
carry (yarn RoPE, a sliding window, ...) is refused by name."""

from __future__ import annotations

import argparse
from pathlib import Path

from taperlm.config.assembly import add_set_argument
from taperlm.files.io import read_json
from taperlm.spec.domains import input_path, output_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "folder",
        type=input_path(),
        help="a Hugging Face checkpoint folder (config.json, model.safetensors or its shards, "
        "tokenizer.json), or a .gguf file of llama.cpp's llama architecture (dequantized); "
        "never a Hub name: nothing is downloaded",
    )
    parser.add_argument(
        "--out", type=output_path("dir"), required=True, help="run directory (created)"
    )
    add_set_argument(
        parser,
        "a train.* or data.* setting of the run, for `taperlm train --out RUN` to continue "
        "with (e.g. --set train.lr=1e-4 --set train.tokens=1000000); repeatable; "
        "$TAPERLM_SET applies after",
    )


def run(args: argparse.Namespace) -> int:
    from taperlm.interop.importing import import_checkpoint  # lazy: torch; --help stays torch-free

    run_config, tokenizer = import_checkpoint(args.folder, args.out, args.overrides)
    m = run_config.model
    heads = f"{m.n_heads} heads ({m.kv_heads} KV)"
    widths = m.mlp_widths or []
    mlp = (
        f"MLP width {widths[0]}"
        if len(set(widths)) == 1
        else f"MLP widths {', '.join(map(str, widths))}"
    )
    print(
        f"imported {args.folder} to {args.out}: {m.n_layers} layers, d_model {m.d_model}, "
        f"{mlp}, {heads}, vocab {m.vocab_size}" + (", tied head" if m.tie_embeddings else "")
    )
    record_path = Path(args.out) / "import.json"  # a GGUF import's source and quantization
    record = read_json(record_path, 1 << 20, "import.json") if record_path.is_file() else None
    if record is not None:
        kinds = ", ".join(f"{n} {k}" for k, n in record.get("quantization", {}).items())
        print(
            f"source: a GGUF file whose tensors are {kinds}; dequantized to float32 (import.json)"
        )
    if tokenizer is not None and record is not None:
        print(
            f"tokenizer: rebuilt from the file's vocabulary ({tokenizer.vocab_size} ids, EOS "
            f"{tokenizer.eos_token!r}); prepare data with it: taperlm prepare --tokenizer "
            f"{Path(args.out) / 'tokenizer'} --out DATA"
        )
    if tokenizer is None and record is not None:
        why = record.get("no_tokenizer_because", "")
        print(
            f"note: the run has no tokenizer ({why}); train it on data tokenized with the "
            "model's own tokenizer (`taperlm train --out RUN --data DATA`)"
        )
    elif tokenizer is None:
        print(
            "note: the folder has no tokenizer.json, so the run has no tokenizer; generate and "
            "eval need one: train it on data (`taperlm train --out RUN --data DATA`)"
        )
    print(f"continue training it with: taperlm train --out {args.out} --data DATA")
    return 0

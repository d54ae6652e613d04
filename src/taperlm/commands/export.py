"""`taperlm export RUN --out DIR`: a Hugging Face model directory (config.json with auto_map,
model.safetensors, tokenizer, generation_config.json, thin code files importing taperlm, a model
card README.md); `--format gguf --out FILE.gguf`: one GGUF file for llama.cpp (Transformer++);
`--format block-configs --out DIR`: a DeciLM / Nemotron-NAS checkpoint (per-layer
`block_configs`, Llama weight names) that vLLM, SGLang, mlx-lm and llama.cpp's converter load."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal

from taperlm.errors import ConfigError
from taperlm.files.outdirs import check_folder, claim, kind_of
from taperlm.interop.gguf_export import DTYPES, check_supported, write_gguf
from taperlm.spec.domains import MAX_COUNT, choices, input_path, number, output_path, up_to

# --format: a Hugging Face model dir | one GGUF file | a plain Llama dir | a DeciLM dir
ExportFormat = Literal["hf", "gguf", "llama", "block-configs"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run", type=input_path(), help="run directory of `taperlm train` (or a checkpoint dir)"
    )
    parser.add_argument(
        "--out",
        type=output_path("dir", kind_of=lambda a: "file" if a.format == "gguf" else "dir"),
        required=True,
        help="output directory (--format hf) or .gguf file (--format gguf)",
    )
    parser.add_argument(
        "--format",
        choices=choices(ExportFormat),
        default="hf",
        help="hf: a Hugging Face model directory; gguf: one file for llama.cpp (Transformer++ "
        "models only); llama: a plain LlamaForCausalLM directory that transformers and serving engines load without taperlm (uniform Transformer++ runs); block-configs: a DeciLM / Nemotron-NAS directory (per-layer FFN widths "
        "and KV heads in config.json's block_configs) for engines that serve per-layer widths "
        "(Transformer++, no query-head taper, widths in multiples of 256)",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        help="--format gguf: precision of the weight matrices (default f16; norms stay f32)",
    )
    parser.add_argument(
        "--step",
        type=number(int, up_to(MAX_COUNT, 0)),
        help="export checkpoint STEP (default: newest)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an earlier `taperlm export` at --out: the files it wrote, unchanged since "
        "(--format hf), or a .gguf file it wrote (--format gguf); never a folder or file of "
        "yours, nor one you edited",
    )


def run(args: argparse.Namespace) -> int:
    if args.format == "gguf":
        return _run_gguf(args)
    if args.dtype is not None:
        raise ConfigError("--dtype is for --format gguf; a Hugging Face export keeps fp32 weights")

    out: Path = args.out
    check_folder(out, "export", "--out")  # also under --force: only our own exports
    if out.is_dir() and any(out.iterdir()) and kind_of(out) == "export" and not args.force:
        raise ConfigError(
            f"--out {out} holds an earlier export; add --force to replace it, or choose "
            "another path"
        )
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError("export needs transformers: pip install 'taperlm[hf]'") from None
    from taperlm.checkpoint.loading import load_run  # lazy: torch; --help stays torch-free
    from taperlm.hf.export import export_model  # lazy: torch and the hf extra (checked above)

    model, tokenizer, run_config = load_run(args.run, step=args.step)
    if args.format in ("llama", "block-configs"):
        return _run_llama_named(args, out, model, tokenizer)
    claim(out, "export")
    path = export_model(model, out, tokenizer, run_config=run_config)
    print(f"exported {args.run} to {path}")
    print(
        "load it with: AutoModelForCausalLM.from_pretrained("
        f"{str(path)!r}, trust_remote_code=True)  (needs `pip install taperlm`)"
    )
    return 0


def _run_gguf(args: argparse.Namespace) -> int:
    from taperlm.checkpoint.loading import (  # lazy: torch; --help stays torch-free
        load_run,
        run_root,
    )

    out: Path = args.out  # checked before: new, or an earlier GGUF export under --force
    model, tokenizer, _ = load_run(args.run, step=args.step)
    check_supported(model.config)
    dtype = args.dtype or "f16"
    name = run_root(Path(args.run)).name  # the run's name, also for a checkpoint dir
    path = write_gguf(model, tokenizer, out, dtype=dtype, name=name)
    print(f"exported {args.run} to {path} ({dtype})")
    print(f"run it with llama.cpp: llama-completion -m {path} -no-cnv -p 'The' -n 64")
    return 0


def _run_llama_named(args: argparse.Namespace, out: Path, model, tokenizer) -> int:
    """--format llama | block-configs: Hugging Face Llama-named weights with a LlamaForCausalLM
    or a DeciLMForCausalLM (per-layer block_configs) config."""
    from taperlm.hf import decilm, llama  # lazy: torch and the hf extra
    from taperlm.hf.export import export_block_configs, export_llama  # lazy: as above

    per_layer = args.format == "block-configs"
    # what the format cannot carry, refused before the folder is claimed
    if per_layer:
        decilm.check_supported(model.config)
    else:
        llama.llama_config(model.config)
    claim(out, "export")
    if per_layer:
        path = export_block_configs(model, out, tokenizer)
        print(f"exported {args.run} to {path} (DeciLMForCausalLM, per-layer block_configs)")
        print(f"convert it for llama.cpp with its own converter: convert_hf_to_gguf.py {path}")
    else:
        path = export_llama(model, out, tokenizer)
        print(f"exported {args.run} to {path} (LlamaForCausalLM)")
        print(f"load it with: AutoModelForCausalLM.from_pretrained({str(path)!r})")
    return 0

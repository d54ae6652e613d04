"""`taperlm export RUN --out DIR`: a Hugging Face model directory (config.json with auto_map,
model.safetensors, tokenizer, generation_config.json, thin code files importing taperlm)."""

from __future__ import annotations

import argparse
from pathlib import Path

from taperlm.domains import MAX_COUNT, input_path, number, output_path, up_to
from taperlm.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run", type=input_path(), help="run directory of `taperlm train` (or a checkpoint dir)"
    )
    parser.add_argument("--out", type=output_path("dir"), required=True, help="output directory")
    parser.add_argument(
        "--step",
        type=number(int, up_to(MAX_COUNT, 0)),
        help="export checkpoint STEP (default: newest)",
    )
    parser.add_argument(
        "--force", action="store_true", help="write into --out even if it is not empty"
    )


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not args.force:
        raise ConfigError(
            f"--out {out} exists and is not empty; choose another path or add --force"
        )
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError("export needs transformers: pip install 'taperlm[hf]'") from None
    from taperlm.hf.export import export_model
    from taperlm.loading import load_run

    model, tokenizer, _ = load_run(args.run, step=args.step)
    path = export_model(model, out, tokenizer)
    print(f"exported {args.run} to {path}")
    print(
        "load it with: AutoModelForCausalLM.from_pretrained("
        f"{str(path)!r}, trust_remote_code=True)  (needs `pip install taperlm`)"
    )
    return 0

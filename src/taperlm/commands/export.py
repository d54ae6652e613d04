"""`taperlm export RUN --out DIR`: a Hugging Face model directory (config.json with auto_map,
model.safetensors, tokenizer, generation_config.json, thin code files importing taperlm)."""

from __future__ import annotations

import argparse
from pathlib import Path

from taperlm.domains import input_path, number, output_path
from taperlm.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run", type=input_path(), help="run directory of `taperlm train` (or a checkpoint dir)"
    )
    parser.add_argument("--out", type=output_path("dir"), required=True, help="output directory")
    parser.add_argument(
        "--step", type=number(int, "[0, inf)"), help="export checkpoint STEP (default: newest)"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace the files of an earlier `taperlm export` in --out (never a folder or "
        "file taperlm did not write)",
    )


def run(args: argparse.Namespace) -> int:
    from taperlm.outdirs import check_folder, claim, kind_of

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
    from taperlm.hf.export import export_model
    from taperlm.loading import load_run

    model, tokenizer, _ = load_run(args.run, step=args.step)
    claim(out, "export")
    path = export_model(model, out, tokenizer)
    print(f"exported {args.run} to {path}")
    print(
        "load it with: AutoModelForCausalLM.from_pretrained("
        f"{str(path)!r}, trust_remote_code=True)  (needs `pip install taperlm`)"
    )
    return 0

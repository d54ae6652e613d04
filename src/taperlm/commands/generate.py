"""`taperlm generate RUN --prompt TEXT`: sample text from a run, streamed to stdout."""

from __future__ import annotations

import argparse
import sys

from taperlm.files.io import atomic_write_text
from taperlm.runtime.device import resolve_device
from taperlm.spec.domains import (
    MAX_CONTEXT,
    MAX_COUNT,
    MAX_SEED,
    MAX_VOCAB,
    input_path,
    number,
    output_path,
    up_to,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run", type=input_path(), help="run directory (or checkpoint dir, or `taperlm export` dir)"
    )
    parser.add_argument("--prompt", default="", help="text to continue (default: start from EOS)")
    parser.add_argument("--max-new-tokens", type=number(int, up_to(MAX_CONTEXT, 0)), default=128)
    parser.add_argument(
        "--temperature",
        type=number(float, "[0, inf)"),
        default=0.8,
        help="softmax temperature; 0 = greedy",
    )
    parser.add_argument(
        "--top-k", type=number(int, up_to(MAX_VOCAB)), help="sample from the K most likely tokens"
    )
    parser.add_argument(
        "--top-p", type=number(float, "(0, 1]"), help="nucleus sampling: smallest set with mass P"
    )
    parser.add_argument(
        "--seed", type=number(int, f"[0, {MAX_SEED}]"), help="random seed (same seed, same text)"
    )
    parser.add_argument(
        "--step",
        type=number(int, up_to(MAX_COUNT, 0)),
        help="use checkpoint STEP (default: newest)",
    )
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument(
        "--no-cache", action="store_true", help="recompute the prefix every step (no KV cache)"
    )
    parser.add_argument(
        "--out",
        type=output_path("file"),
        help="also write the text (prompt included) to a new FILE (never replaces a file)",
    )


def run(args: argparse.Namespace) -> int:
    from taperlm.checkpoint.loading import load_any  # lazy: torch; --help stays torch-free
    from taperlm.models.generation import (  # lazy: torch; --help stays torch-free
        SamplingConfig,
        generate_tokens,
        stream_text,
    )

    device = resolve_device(args.device)
    cfg = SamplingConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        use_cache=not args.no_cache,
    )
    cfg.validate()
    model, tokenizer, _ = load_any(args.run, step=args.step, device=device)
    cfg.eos_id = tokenizer.eos_id
    prompt = tokenizer.encode(args.prompt) if args.prompt else []
    if not prompt:
        prompt = [tokenizer.eos_id]
    pieces = [args.prompt] if args.prompt else []
    sys.stdout.write(args.prompt)
    for piece in stream_text(generate_tokens(model, prompt, cfg, device), tokenizer.decode):
        pieces.append(piece)
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    if args.out is not None:
        atomic_write_text(args.out, "".join(pieces) + "\n")
    return 0

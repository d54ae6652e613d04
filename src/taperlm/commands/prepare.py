"""`taperlm prepare`: tokenize a corpus into memory-mapped token shards (see taperlm.data.prepare).

Module-level imports stay light: the pipeline (numpy, tokenizers, multiprocessing) is imported in
`run`.
"""

from __future__ import annotations

import argparse
import os

from taperlm.domains import MAX_SEED, input_path, number, output_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--source",
        type=input_path(text=True),
        default="default",
        help="'default' (Debian documentation corpus), a .txt/.jsonl file or folder, or "
        "hf:NAME[:CONFIG] (streamed; needs internet) [default: default]",
    )
    parser.add_argument(
        "--tokenizer",
        type=input_path(text=True),
        default="bpe:8192",
        help="bpe:N (byte-level BPE trained on the corpus), a folder with vocab.json+merges.txt "
        "or tokenizer.json, a previous data dir, or hf:NAME [default: bpe:8192]",
    )
    parser.add_argument("--out", type=output_path("dir"), required=True, help="output data dir")
    split = parser.add_mutually_exclusive_group()
    split.add_argument(
        "--val-fraction",
        type=number(float, "(0, 0.5]"),
        default=None,
        help="fraction of tokens held out for validation, as whole documents [default: 0.01]",
    )
    split.add_argument(
        "--val-tokens",
        type=number(int, "[2, inf)"),
        default=None,
        help="validation tokens (instead)",
    )
    parser.add_argument(
        "--workers",
        type=number(int, "[1, inf)"),
        default=min(2, os.cpu_count() or 1),
        help="tokenizer processes [default: min(2, CPUs)]",
    )
    parser.add_argument(
        "--max-chars",
        type=number(int, "[1, inf)"),
        default=None,
        help="cap the corpus (characters)",
    )
    parser.add_argument(
        "--seed",
        type=number(int, f"[0, {MAX_SEED}]"),
        default=0,
        help="seed of the validation split",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty folder that is not a previous prepare output",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def run(args: argparse.Namespace) -> int:
    from taperlm.data.prepare import prepare

    meta = prepare(
        args.source,
        args.out,
        args.tokenizer,
        val_fraction=args.val_fraction,
        val_tokens=args.val_tokens,
        workers=args.workers,
        max_chars=args.max_chars,
        seed=args.seed,
        force=args.force,
        progress=not args.no_progress,
    )
    t = meta["_timing"]
    train, val = meta["splits"]["train"], meta["splits"]["val"]
    src = meta["source"]
    seconds = sum(t.values())
    print(
        f"wrote {args.out}: train {train['tokens']:,} tokens ({train['documents']:,} docs), "
        f"val {val['tokens']:,} tokens ({val['documents']:,} docs, {meta['val_split']['mode']} "
        f"split); source {src['documents']:,} docs, {src['chars']:,} chars; tokenizer "
        f"{meta['tokenizer']['spec']} (vocab {meta['vocab_size']:,}, eos {meta['eos_id']}); "
        f"{seconds:.1f} s (read {t['read_s']:.1f}, tokenizer {t['tokenizer_s']:.1f}, tokenize "
        f"{t['tokenize_s']:.1f}, write {t['write_s']:.1f})"
    )
    return 0

"""`taperlm prepare`: tokenize a corpus into a data dir of token shards (see taperlm.data.prepare).

Module-level imports stay light: the pipeline (numpy, tokenizers, multiprocessing) is imported in
`run`.
"""

from __future__ import annotations

import argparse

from taperlm.spec.domains import (
    MAX_COUNT,
    MAX_SEED,
    MAX_TOKENS,
    MAX_WORKERS,
    count,
    input_path,
    number,
    output_path,
    up_to,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_input_arguments(parser)
    _add_split_arguments(parser)
    _add_size_arguments(parser)
    parser.add_argument(
        "--text-field",
        default="text",
        help="JSONL field / Parquet or dataset column holding the text [default: text]",
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
        help="also write into a non-empty folder of yours, beside its files: only when none of "
        "the names prepare writes (meta.json, tokenizer/, train-*.bin, val-*.bin, .prepare*) "
        "is taken there; nothing of yours is ever replaced or deleted",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide progress output")


def _add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """What is read and where it goes: --source, --tokenizer, --out."""
    parser.add_argument(
        "--source",
        type=input_path(text=True),
        default="default",
        help="'default' (Debian documentation corpus); a .txt, .jsonl, .jsonl.gz, .jsonl.zst or "
        ".parquet file, or a folder of them; or hf:NAME[:CONFIG] (streamed; needs internet) "
        "[default: default]",
    )
    parser.add_argument(
        "--tokenizer",
        type=input_path(text=True),
        default="bpe:8192",
        help="bpe:N (byte-level BPE trained on a sample of the corpus), a folder with "
        "vocab.json+merges.txt or tokenizer.json, a previous data dir, or hf:NAME "
        "[default: bpe:8192]",
    )
    parser.add_argument("--out", type=output_path("dir"), required=True, help="output data dir")


def _add_split_arguments(parser: argparse.ArgumentParser) -> None:
    """The validation split and the tokenizer processes: --val-fraction, --val-tokens, --workers."""
    from taperlm.data.prepare import DEFAULT_VAL_FRACTION  # lazy: numpy only when prepare runs

    parser.add_argument(
        "--val-fraction",
        type=number(float, "(0, 0.5]"),
        default=None,
        help="probability that a document is held out for validation (by a seeded hash of its "
        f"text) [default: {DEFAULT_VAL_FRACTION}]",
    )
    parser.add_argument(
        "--val-tokens",
        type=count(up_to(MAX_TOKENS, 2)),
        default=None,
        help="stop picking validation documents once they hold this many tokens; the tail of "
        "the stream makes up any shortfall",
    )
    parser.add_argument(
        "--workers",
        type=number(int, up_to(MAX_WORKERS)),
        default=None,
        help="tokenizer processes; the output is the same for any number [default: the CPUs "
        "available]",
    )


def _add_size_arguments(parser: argparse.ArgumentParser) -> None:
    """How much is read, and the sizes of what is written: --max-chars ... --max-doc-chars."""
    from taperlm.data.prepare import (  # lazy: numpy only when prepare runs
        DEFAULT_MAX_DOC_CHARS,
        DEFAULT_SAMPLE_CHARS,
        DEFAULT_SHARD_TOKENS,
    )

    parser.add_argument(
        "--max-chars",
        type=count(up_to(MAX_COUNT)),
        default=None,
        help="read at most this many characters",
    )
    parser.add_argument(
        "--max-tokens",
        type=count(up_to(MAX_TOKENS, 2)),
        default=None,
        help="stop after this many training tokens (e.g. 30e9 for the first 30B tokens)",
    )
    parser.add_argument(
        "--tokenizer-sample-chars",
        type=count(up_to(MAX_COUNT)),
        default=DEFAULT_SAMPLE_CHARS,
        help=f"bpe:N is trained on the first this many characters of training documents "
        f"[default: {DEFAULT_SAMPLE_CHARS:_}]",
    )
    parser.add_argument(
        "--shard-tokens",
        type=count(up_to(MAX_TOKENS)),
        default=DEFAULT_SHARD_TOKENS,
        help=f"tokens per shard file [default: {DEFAULT_SHARD_TOKENS:_}]",
    )
    parser.add_argument(
        "--max-doc-chars",
        type=count(up_to(MAX_COUNT)),
        default=DEFAULT_MAX_DOC_CHARS,
        help="longer documents (and .txt files) are cut into pieces at paragraph breaks "
        f"[default: {DEFAULT_MAX_DOC_CHARS:_}]",
    )


def run(args: argparse.Namespace) -> int:
    from taperlm.data.prepare import prepare  # lazy: numpy, tokenizers only when prepare runs

    meta = prepare(
        args.source,
        args.out,
        args.tokenizer,
        val_fraction=args.val_fraction,
        val_tokens=args.val_tokens,
        workers=args.workers,
        max_chars=args.max_chars,
        max_tokens=args.max_tokens,
        tokenizer_sample_chars=args.tokenizer_sample_chars,
        shard_tokens=args.shard_tokens,
        max_doc_chars=args.max_doc_chars,
        text_field=args.text_field,
        seed=args.seed,
        force=args.force,
        progress=not args.no_progress,
    )
    t = meta["_timing"]
    train, val = meta["splits"]["train"], meta["splits"]["val"]
    src = meta["source"]
    resumed = meta["_resumed"]
    stages = ", ".join(f"{k.removesuffix('_s')} {v:.1f}" for k, v in t.items())
    print(
        f"wrote {args.out}: train {train['tokens']:,} tokens ({train['documents']:,} docs, "
        f"{len(train['shards'])} shards), val {val['tokens']:,} tokens ({val['documents']:,} "
        f"docs, {meta['val_split']['mode']} split); source {src['documents']:,} docs, "
        f"{src['chars']:,} chars; tokenizer {meta['tokenizer']['spec']} (vocab "
        f"{meta['vocab_size']:,}, eos {meta['eos_id']}); {sum(t.values()):.1f} s ({stages})"
        + (
            f"; resumed after {resumed['documents']:,} docs ({resumed['tokens']:,} tokens)"
            if resumed
            else ""
        )
    )
    return 0

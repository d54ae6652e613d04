"""S-NIAH evaluation speed: items/s per length of `taperlm eval --tasks niah_single_1`.

    python benchmarks/niah_speed.py --presets transformer-tiny,titans-mag-tiny \
        --lengths 256,512,1024 --limit 8 --batch-size 8 --threads 1

Each preset's shape (context_length raised to the longest length) with a random init, a BPE of
the preset's vocabulary size trained on `taperlm eval`'s default S-NIAH haystack (the Python
language reference that ships with Python), and RULER's items for each length through `suite.run_niah` (batched greedy
decoding, 128 new tokens: a random model never emits EOS, so every item decodes all 128 tokens,
the slowest case; a trained model stops at its answer). Prints items/s per preset and length and
how the family decodes (decoding cache or recomputation), and writes benchmarks/results/niah_speed.json.
"""

from __future__ import annotations

import argparse
import time

from common import machine_info, table, write_json
from outputs import output_file


def _tokenizer(vocab_size: int, smoke: bool):
    from taperlm.data.tokenizer import train_bpe
    from taperlm.evaluation.niah import DEFAULT_HAYSTACK, REPEAT_LINE, load_haystack

    hay = load_haystack(DEFAULT_HAYSTACK, None, 200_000 if smoke else 2_000_000)
    words = hay.words
    texts = [" ".join(words[i : i + 200]) for i in range(0, len(words), 200)] + [REPEAT_LINE]
    return train_bpe(texts, vocab_size), hay.source


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="transformer-tiny,titans-mag-tiny")
    ap.add_argument("--lengths", default="256,512,1024")
    ap.add_argument("--limit", type=int, default=8, help="items per length")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="tiny run (tests)")
    ap.add_argument(
        "--json", type=output_file, help="results file (default benchmarks/results/...)"
    )
    args = ap.parse_args(argv)

    import torch

    from taperlm.config.presets import get_preset
    from taperlm.evaluation.niah import parse_lengths
    from taperlm.evaluation.suite import run_niah
    from taperlm.models import TaperedLM

    torch.set_num_threads(args.threads)
    lengths = parse_lengths(args.lengths, "--lengths")
    limit, batch = args.limit, args.batch_size
    if args.smoke:
        lengths, limit, batch = [256], 2, 2
    rows, results = [], {}
    tokenizers: dict[int, tuple] = {}
    for preset in [p.strip() for p in args.presets.split(",") if p.strip()]:
        cfg = get_preset(preset, resolve=False)
        if args.smoke:
            cfg.n_layers, cfg.d_model, cfg.mlp_width = 2, 32, 64
        if cfg.vocab_size not in tokenizers:
            tokenizers[cfg.vocab_size] = _tokenizer(cfg.vocab_size, args.smoke)
        tok, source = tokenizers[cfg.vocab_size]
        cfg.vocab_size = tok.vocab_size
        cfg.context_length = max(lengths)
        torch.manual_seed(0)
        model = TaperedLM(cfg.resolve()).eval()
        t0 = time.perf_counter()
        res = run_niah(
            model, tok, "niah_single_1", lengths, limit=limit, batch_size=batch, progress=False
        )
        results[preset] = {
            "seconds": round(time.perf_counter() - t0, 3),
            "decoding": res.settings["decoding"],
            "lengths": res.settings["lengths"],
            "params": sum(p.numel() for p in model.parameters()),
        }
        for key, info in res.settings["lengths"].items():
            rows.append(
                {
                    "preset": preset,
                    "length": int(key),
                    "items": info["n"],
                    "prompt tokens": info["prompt_tokens"]["mean"],
                    "seconds": info["seconds"],
                    "items/s": info["items_per_s"],
                    "decoding": res.settings["decoding"].split(", ")[-1],
                }
            )
    cols = ["preset", "length", "items", "prompt tokens", "seconds", "items/s", "decoding"]
    print(table(rows, cols))
    data = {
        "machine": machine_info(),
        "settings": {
            "task": "niah_single_1",
            "lengths": lengths,
            "limit": limit,
            "batch_size": batch,
            "max_new_tokens": 128,
            "tokenizer_text": source,
            "smoke": args.smoke,
        },
        "results": results,
    }
    print(f"wrote {write_json('niah_speed', data, args.json)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

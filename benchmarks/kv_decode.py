"""Decoding speed and KV-cache memory of KV-tapered models at long context, side by side.

    nice python benchmarks/kv_decode.py --threads 1            # 1K, 2K, 4K, 8K context
    python benchmarks/kv_decode.py --smoke                      # seconds

Models: the KV-taper measurement shape of docs/compare.md ("KV-cache taper": transformer-micro
with 12 query heads of dim 8 and 4 KV heads, vocabulary 2,048), random weights, one allocation
per contestant, all at equal parameters (`--allocations` as in compare: NAME=kv:SPEC). For each
context C: a prompt of C random tokens is prefilled with the cache, then `--new-tokens` tokens
are decoded greedily one at a time; decode tokens/s = new tokens / process CPU seconds of the
decoding steps (prefill excluded, it is reported apart). Cache bytes = the bytes of the key and
value tensors the caches hold after the last step (batch 1, fp32), checked equal to
`taperlm.config.budget.kv_cache_bytes` (what `taperlm plan` prints); the bf16 figure is half. Peak cache
bytes add the one layer whose cache `torch.cat` copies at a step (old + new tensor alive at
once). Contestants run interleaved over rounds (rotating order); medians and the ratio to the
first contestant are reported.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, median, paired_ratio, table, write_json
from outputs import output_file
from taperlm.compare.grid import parse_allocation
from taperlm.config.budget import kv_cache_bytes, total_params
from taperlm.config.presets import get_preset
from taperlm.models import TaperedLM

ALLOCATIONS = [
    "uniform",
    "halved=kv:groups:0.5",
    "early=kv:custom:4,3,2,1,1,1",
    "late=kv:custom:1,1,1,2,3,4",
]
SHAPE = {"n_heads": 12, "n_kv_heads": 4, "vocab_size": 2048}


def build(text: str, context: int, smoke: bool) -> TaperedLM:
    """The measurement model with allocation `text` (compare's syntax), random weights."""
    base = get_preset("transformer-micro", resolve=False)
    shape = dict(SHAPE, context_length=context)
    if smoke:
        shape |= {"d_model": 48, "mlp_width": 64}
    cfg = dataclasses.replace(base, **shape, mlp_widths=None)
    alloc = parse_allocation(text)
    cfg = cfg.resolve().with_taper(
        alloc.spec, alloc.head_taper, None if alloc.kv_taper.is_uniform else alloc.kv_taper
    )
    torch.manual_seed(0)
    return TaperedLM(cfg).eval()


def cache_bytes(cache: list[Any]) -> list[int]:
    return [sum(t.numel() * t.element_size() for t in (c.k, c.v) if t is not None) for c in cache]


@torch.no_grad()
def decode(model: TaperedLM, prompt: torch.Tensor, n: int) -> dict[str, Any]:
    """Prefill `prompt` [1, C], then n greedy steps; CPU seconds of each phase and the cache."""
    cache = model.new_cache()
    c0 = time.process_time()
    tok = model(prompt, cache=cache, logits_to_keep=1).logits[:, -1].argmax(-1)
    c1 = time.process_time()
    tokens = []
    for _ in range(n):
        tokens.append(int(tok))
        tok = model(tok[:, None], cache=cache, logits_to_keep=1).logits[:, -1].argmax(-1)
    c2 = time.process_time()
    return {"prefill": c1 - c0, "decode": c2 - c1, "bytes": cache_bytes(cache), "tokens": tokens}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--allocations", nargs="*", default=ALLOCATIONS)
    ap.add_argument("--contexts", nargs="*", type=int, default=[1024, 2048, 4096, 8192])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument(
        "--json", type=output_file, help="results file (default results/kv_decode.json)"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    contexts, n, rounds = args.contexts, args.new_tokens, args.rounds
    if args.smoke:
        contexts, n, rounds = [32, 64], 4, 1
    top = max(contexts) + n
    models = {parse_allocation(a).label: build(a, top, args.smoke) for a in args.allocations}
    params = {k: total_params(m.config) for k, m in models.items()}
    if len(set(params.values())) != 1:
        raise SystemExit(f"allocations differ in parameters: {params}")
    rows = []
    names = list(models)
    for C in contexts:
        prompt = torch.randint(
            0, SHAPE["vocab_size"], (1, C), generator=torch.Generator().manual_seed(C)
        )
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
        for r in range(rounds):
            for k in names[r % len(names) :] + names[: r % len(names)]:
                runs[k].append(decode(models[k], prompt, n))
        base = [x["decode"] for x in runs[names[0]]]
        for k in names:
            cfg, held = models[k].config, runs[k][-1]["bytes"]
            if held != kv_cache_bytes(cfg, C + n, 4):
                raise SystemExit(f"{k}: cache tensors {held} != kv_cache_bytes")
            dec = median([x["decode"] for x in runs[k]])
            step = max(held) // (C + n)  # one more token of the largest layer, copied by cat
            rows.append(
                {
                    "context": C,
                    "allocation": k,
                    "kv heads": "/".join(
                        str(cfg.attention_heads(i)[1]) for i in range(cfg.n_layers)
                    ),
                    "decode tokens/s": n / dec,
                    "speed vs " + names[0]: paired_ratio(base, [x["decode"] for x in runs[k]]),
                    "prefill s": median([x["prefill"] for x in runs[k]]),
                    "cache MiB fp32": sum(held) / 2**20,
                    "cache MiB bf16": sum(held) / 2**21,
                    "peak cache MiB fp32": (sum(held) + max(held) - step) / 2**20,
                    "decode_times": [x["decode"] for x in runs[k]],
                }
            )
            print(f"{C} {k}: {n / dec:.1f} tokens/s, {sum(held) / 2**20:.2f} MiB", file=sys.stderr)
    cols = ["context", "allocation", "kv heads", "decode tokens/s", "speed vs " + names[0],
            "prefill s", "cache MiB fp32", "cache MiB bf16", "peak cache MiB fp32"]  # fmt: skip
    print(table(rows, cols))
    out = {
        "machine": machine_info(),
        "params": params,
        "new_tokens": n,
        "rounds": rounds,
        "allocations": args.allocations,
        "rows": rows,
    }
    path = write_json("kv_decode_smoke" if args.smoke else "kv_decode", out, args.json)
    print(f"results: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

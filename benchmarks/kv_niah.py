"""S-NIAH-1 retrieval of KV-tapered models: the recipe of tests/test_eval_niah_trained.py (a
2-layer Transformer++ trained on niah_single_1 items and digit copy drills) for each allocation
of the KV heads at equal parameters, scored by `run_niah` at 256 and 512 tokens.

    nice python benchmarks/kv_niah.py --seeds 1                # 4 allocations, ~minutes each
    python benchmarks/kv_niah.py --smoke                        # seconds (untrained, no score)

Shape: the recipe's depth, MLP width, context and training (900 steps, lr 3e-3, init 0.1), at
d_model 96 with 4 query heads of 24 and 2 KV heads (grouped-query): a head dim divisible by 3
makes the K/V parameters of one KV head (2 x 96 x 24) a whole number of SwiGLU width steps
(3 x 96 x 16), so every allocation below is exactly the uniform model's parameters. The
allocations: uniform 2/2, halved 1/1, early-heavy 2/1, late-heavy 1/2 (compare's syntax).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from common import machine_info, table, write_json
from niah_helpers import copy_drill, digit_pair_tokenizer, needle_example
from taperlm.budget import kv_cache_bytes, total_params
from taperlm.compare.grid import parse_allocation
from taperlm.config import ModelConfig
from taperlm.evaluation.suite import run_niah
from taperlm.models import TaperedLM
from taperlm.taper import TaperSpec
from test_eval_niah_trained import (
    DRILLS,
    LENGTHS,
    LIMIT,
    LR,
    MAX_LINES,
    NEEDLES,
    STEPS,
    _batch,
    _loss,
    _lr,
)

ALLOCATIONS = ["uniform", "halved=kv:groups:0.5", "early=kv:custom:2,1", "late=kv:custom:1,2"]


def model_config(text: str, vocab_size: int) -> ModelConfig:
    base = ModelConfig(
        family="transformer",
        vocab_size=vocab_size,
        d_model=96,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        mlp_width=256,
        taper=TaperSpec(),
        context_length=512,
        init_std=0.1,
    ).resolve()
    a = parse_allocation(text)
    return base.with_taper(a.spec, a.head_taper, None if a.kv_taper == "uniform" else a.kv_taper)


def train(cfg: ModelConfig, tok: Any, seed: int, steps: int) -> TaperedLM:
    """The recipe's loop (tests/test_eval_niah_trained.py `trained`) for `steps` steps."""
    torch.manual_seed(seed)
    model = TaperedLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.0)
    rng = random.Random(1 + seed)
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = _lr(step)
        opt.zero_grad(set_to_none=True)
        _loss(model, _batch([copy_drill(rng) for _ in range(DRILLS)], tok)).backward()
        _loss(
            model, _batch([needle_example(rng, MAX_LINES) for _ in range(NEEDLES)], tok)
        ).backward()
        opt.step()
    return model.eval()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--allocations", nargs="*", default=ALLOCATIONS)
    ap.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 per allocation")
    ap.add_argument("--only-seed", type=int, help="run this one seed (to split a run)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", help="results file (default results/kv_niah.json)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    tok = digit_pair_tokenizer()
    steps, limit = (2, 2) if args.smoke else (STEPS, LIMIT)
    seeds = [args.only_seed] if args.only_seed is not None else list(range(args.seeds))
    rows = []
    params = set()
    for seed in seeds:
        for text in args.allocations:
            cfg = model_config(text, tok.vocab_size)
            params.add(total_params(cfg))
            t0 = time.perf_counter()
            model = train(cfg, tok, seed, steps)
            t1 = time.perf_counter()
            res = run_niah(
                model, tok, "niah_single_1", LENGTHS, limit=limit, batch_size=25, progress=False
            )
            row = {
                "allocation": parse_allocation(text).label,
                "seed": seed,
                "kv heads": "/".join(str(cfg.attention_heads(i)[1]) for i in range(cfg.n_layers)),
                "mlp widths": "/".join(map(str, cfg.mlp_widths or [])),
                "KV B/token bf16": sum(kv_cache_bytes(cfg, 1, 2)),
                **{f"S-NIAH-1 @{n}": res.metrics[str(n)] for n in LENGTHS},
                "train s": t1 - t0,
                "eval s": time.perf_counter() - t1,
            }
            rows.append(row)
            print(row, file=sys.stderr, flush=True)
    if len(params) != 1:
        raise SystemExit(f"allocations differ in parameters: {sorted(params)}")
    cols = ["allocation", "seed", "kv heads", "mlp widths", "KV B/token bf16",
            *(f"S-NIAH-1 @{n}" for n in LENGTHS), "train s", "eval s"]  # fmt: skip
    print(table(rows, cols))
    out = {
        "machine": machine_info(),
        "params": params.pop(),
        "steps": steps,
        "limit": limit,
        "rows": rows,
    }
    name = "kv_niah_smoke" if args.smoke else "kv_niah"
    print(f"results: {write_json(name, out, args.json)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

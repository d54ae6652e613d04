"""S-NIAH-1 retrieval of KV-tapered models: the recipe of tests/evaluation/test_eval_niah_trained.py (a
2-layer Transformer++ trained on niah_single_1 items and digit copy drills) for each allocation
of the KV heads at equal parameters, scored by `run_niah` at 256 and 512 tokens.

    nice python benchmarks/kv_niah.py --seeds 1                # 4 allocations, ~minutes each
    python benchmarks/kv_niah.py --smoke                        # seconds (untrained, no score)

Shape: exactly the recipe's model (d_model 64, 4 heads of 16, 2 layers, MLP 256, context 512,
900 steps at lr 3e-3, init 0.1), whose uniform form — full multi-head attention, 4 KV heads per
layer — is the one the test shows learning S-NIAH-1. One KV head's K/V parameters (2 x 64 x 16)
are 2/3 of a SwiGLU width step (3 x 64 x 16), so a KV taper is exactly the uniform model's
parameters when the KV heads it removes are a multiple of 3: 4,1 and 1,4 (3 removed, 5 of 8 KV
heads cached) and 1,1 (6 removed, multi-query). The allocations: uniform 4/4, early-heavy 4/1,
late-heavy 1/4 (same cache, same MLP widths 272/272: only where the KV heads sit differs), and
multi-query 1/1 (a quarter of the cache). A uniform GQA 2/2 removes 4 heads, which no whole
number of width steps repays: it is not an equal-parameter allocation of this shape (a first run of
it, 254,272 parameters vs the uniform model's 262,464, scored 25% at 256 and 10% at 512 tokens
on 20 items).
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
from outputs import output_file
from taperlm.compare.grid import parse_allocation
from taperlm.config import ModelConfig
from taperlm.config.budget import kv_cache_bytes, total_params
from taperlm.evaluation.suite import run_niah
from taperlm.models import TaperedLM
from taperlm.spec.taper import TaperSpec
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

ALLOCATIONS = ["uniform", "early=kv:custom:4,1", "late=kv:custom:1,4", "mqa=kv:custom:1,1"]


def model_config(text: str, vocab_size: int) -> ModelConfig:
    base = ModelConfig(
        family="transformer",
        vocab_size=vocab_size,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=4,
        mlp_width=256,
        taper=TaperSpec(),
        context_length=512,
        init_std=0.1,
    ).resolve()
    a = parse_allocation(text)
    return base.with_taper(a.spec, a.head_taper, None if a.kv_taper.is_uniform else a.kv_taper)


def train(cfg: ModelConfig, tok: Any, seed: int, steps: int) -> TaperedLM:
    """The recipe's loop (tests/evaluation/test_eval_niah_trained.py `trained`) for `steps` steps."""
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
    ap.add_argument("--json", type=output_file, help="results file (default results/kv_niah.json)")
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

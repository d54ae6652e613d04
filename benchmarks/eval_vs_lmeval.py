"""Eval speed, ours vs lm-evaluation-harness (HFLM), on the same model and items.

    python benchmarks/eval_vs_lmeval.py RUN_OR_EXPORT_DIR --data-dir ../shared/data \
        --tasks piqa,hellaswag,lambada_openai --limit 200 --batch-size 32

Both sides score the same normalized docs (our lm-eval task YAMLs) with the same batch size and
max_length; prints items/s per task and the largest per-item log-likelihood difference.
Threads are pinned to --threads (default 1) so the two numbers are comparable.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--tasks", default="piqa,hellaswag,lambada_openai")
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

    import torch

    torch.set_num_threads(args.threads)
    from taperlm.checkpoint.loading import load_any
    from taperlm.evaluation.harness import make_hflm, run_lm_eval, write_task_dir
    from taperlm.evaluation.registry import load_task
    from taperlm.evaluation.scoring import Scorer
    from taperlm.evaluation.suite import run_task

    model, tok, _ = load_any(args.model)
    L = model.config.context_length
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    scorer = Scorer(model, tok, L, batch_size=args.batch_size, progress=False)
    lm = make_hflm(model, tok, batch_size=args.batch_size)
    print(
        f"model {args.model} ({sum(p.numel() for p in model.parameters()):,} params), "
        f"max_length {L}, batch {args.batch_size}, threads {args.threads}"
    )
    print("| task | items | ours s | ours items/s | lm-eval s | lm-eval items/s | max |dll| |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        task_dir = write_task_dir(tmp, args.data_dir, tasks, limit=args.limit)
        for task in tasks:
            data = load_task(task, args.data_dir, limit=args.limit)
            t0 = time.perf_counter()
            ours = run_task(scorer, data, keep_items=True)
            t_ours = time.perf_counter() - t0
            t0 = time.perf_counter()
            out = run_lm_eval(lm, task_dir, [task], log_samples=True)
            t_theirs = time.perf_counter() - t0  # includes lm-eval's task building
            samples = sorted(out["samples"][f"taperlm_{task}"], key=lambda s: s["doc_id"])
            diff = 0.0
            for s, item in zip(samples, ours.per_item):
                mine = item["lls"] if "lls" in item else [item["ll"]]
                theirs = [
                    float(r[0][0] if isinstance(r[0], (list, tuple)) else r[0]) for r in s["resps"]
                ]
                diff = max(diff, *(abs(a - b) for a, b in zip(mine, theirs)))
            n = ours.n
            print(
                f"| {task} | {n} | {t_ours:.1f} | {n / t_ours:.1f} | {t_theirs:.1f} | "
                f"{n / t_theirs:.1f} | {diff:.2e} |"
            )


if __name__ == "__main__":
    main()

"""A first look at the token axis (issue 38), before `taperlm compare --paper tokens` runs: nano,
uniform vs cosine 1.5 -> 0.5, several budgets in tokens per parameter from one warmup-stable-decay
run per (allocation, seed) (`taperlm.training.cooldowns.train_budgets`), paired differences of the
final validation loss per budget. Compare's CPU recipe (128-token sequences, 1,024-token steps,
init_std 0.1) at one shared, untuned lr; widths step by 8 as in the modes.

    python3 benchmarks/wsd_first_look.py --data DATA --out OUT [--tpp 0.5,2,4] [--seeds 3]
        [--jobs 2] [--lr 2e-3] [--schedule wsd|cosine]

DATA: the built-in corpus at bpe:512 (`taperlm prepare --tokenizer bpe:512 --out DATA`). Writes
OUT/<allocation>-s<seed>/tokens-<N>/ (resumable) and OUT/summary.json; prints the table.
Not a result of the modes: one lr for both arms, few seeds, WSD rather than cosine.

    python3 benchmarks/wsd_first_look.py --side-by-side WSD.json COSINE.json

prints docs/compare.md's table of the two schedules' verdicts per budget (`side_by_side`) from
two summaries of the same settings (benchmarks/results/wsd_first_look.json, _cosine.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from outputs import STAMP, claim_folder, folder_problem, write_output
from taperlm.analysis.stats import paired_difference
from taperlm.config import RunConfig
from taperlm.config.budget import total_params
from taperlm.config.presets import get_preset
from taperlm.spec.taper import TaperSpec

ALLOCATIONS = {"uniform": "uniform", "cosine-1.5-0.5": "cosine:1.5:0.5"}
BATCH = 1024


def run_config(
    data: str, taper: str, seed: int, lr: float, tokens: int, schedule: str = "wsd"
) -> RunConfig:
    model = get_preset("transformer-nano", TaperSpec.parse(taper, 8), resolve=False)
    model.init_std = 0.1
    run = RunConfig(model=model.resolve())
    run.data.dir = data
    t = run.train
    t.seed, t.tokens, t.batch_tokens, t.seq_len, t.micro_batch_size = seed, tokens, BATCH, 128, 8
    t.lr, t.min_lr_ratio, t.schedule, t.decay_fraction = lr, 0.1, schedule, 0.2
    t.warmup_tokens = 8 * BATCH  # fixed: every budget shares the long run's warmup
    t.eval_every, t.eval_tokens, t.log_every = 0, 131_072, 50
    t.checkpoint_every, t.keep_checkpoints, t.device = 0, 1, "cpu"
    return run


def chain(args: tuple[str, str, int, float, list[int], str, str]) -> dict[int, float]:
    """One (allocation, seed): every budget from one WSD run, or (cosine) each on its own."""
    import torch  # lazy: each worker sets its own thread count first

    torch.set_num_threads(1)
    from taperlm.training.cooldowns import budget_dir, train_budgets  # lazy: torch, in the worker
    from taperlm.training.loop import train  # lazy: torch, in the worker

    data, taper, seed, lr, budgets, out, schedule = args
    if schedule == "wsd":
        res = train_budgets(run_config(data, taper, seed, lr, max(budgets)), budgets, out, False)
    else:
        res = {
            t: train(
                run_config(data, taper, seed, lr, t, schedule),
                budget_dir(Path(out), t),
                progress=False,
            )
            for t in budgets
        }
    return {t: r.val_loss for t, r in res.items()}


def verdict(diff: dict) -> str:
    """What a paired difference (taper - uniform) decides: its 95% interval below zero (taper
    better), above (worse), or across it (undecided)."""
    lo, hi = diff["ci"]
    return "taper better" if hi < 0 else "taper worse" if lo > 0 else "undecided"


def side_by_side(wsd: dict, cosine: dict) -> str:
    """The markdown table of two summaries (WSD, cosine) of the same settings: per budget, each
    schedule's Δ [95% CI], seeds with the taper better, and verdict. ValueError unless the two
    differ only in the schedule."""
    same = ("params", "lr", "seeds")
    if any(wsd[k] != cosine[k] for k in same) or wsd["budgets"].keys() != cosine["budgets"].keys():
        raise ValueError("the two summaries differ in more than the schedule (params, lr, seeds "
                         "or budgets)")  # fmt: skip
    if (wsd["schedule"], cosine["schedule"]) != ("wsd", "cosine"):
        raise ValueError("give the WSD summary first, then the cosine one")

    def cells(diff: dict) -> str:
        better = sum(x < 0 for x in diff["per_seed"])
        lo, hi = diff["ci"]
        return f"{diff['mean']:+.4f} [{lo:+.4f}, {hi:+.4f}] | {better}/{diff['n']}"

    rows = [
        "| tokens/param | WSD Δ [95% CI] | WSD seeds taper better | cosine Δ [95% CI] | "
        "cosine seeds taper better | verdict (WSD / cosine) |",
        "|---|---|---|---|---|---|",
    ]
    for tokens, w in wsd["budgets"].items():
        c = cosine["budgets"][tokens]
        a, b = verdict(w["diff"]), verdict(c["diff"])
        same_verdict = a if a == b else f"{a} / {b}"
        rows.append(
            f"| {w['tokens_per_param']:.2g} | {cells(w['diff'])} | {cells(c['diff'])} | "
            f"{same_verdict} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--side-by-side"]:
        if len(argv) != 3:
            sys.exit("usage: wsd_first_look.py --side-by-side WSD.json COSINE.json")
        wsd, cosine = (json.loads(Path(x).read_text(encoding="utf-8")) for x in argv[1:])
        print(side_by_side(wsd, cosine))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True, type=Path, help="folder for the runs (resumable)")
    p.add_argument("--tpp", default="0.5,2,4")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument(
        "--schedule",
        choices=("wsd", "cosine"),
        default="wsd",
        help="wsd: one run per (allocation, seed) with a cooldown branch per budget; cosine: "
        "each budget its own cosine run (to check that both give the same verdict)",
    )
    a = p.parse_args(argv)
    problem = folder_problem(a.out)
    if problem:
        p.error(f"--out {problem}")
    claim_folder(a.out)
    model = get_preset("transformer-nano", resolve=False)
    model.vocab_size = 512
    params = total_params(model.resolve())
    budgets = [max(1, round(float(x) * params / BATCH)) * BATCH for x in a.tpp.split(",")]
    jobs = [
        (
            str(Path(a.data).resolve()),
            spec,
            s,
            a.lr,
            budgets,
            str(a.out / f"{name}-s{s}"),
            a.schedule,
        )
        for s in range(a.seeds)
        for name, spec in ALLOCATIONS.items()
    ]
    with ProcessPoolExecutor(a.jobs) as pool:
        losses = list(pool.map(chain, jobs))
    table = {}
    for tokens in budgets:
        per: dict[str, dict[int, float]] = {name: {} for name in ALLOCATIONS}
        for (_, spec, seed, *_), got in zip(jobs, losses):
            name = next(n for n, v in ALLOCATIONS.items() if v == spec)
            per[name][seed] = got[tokens]
        d = paired_difference(per["cosine-1.5-0.5"], per["uniform"]).to_json()
        table[tokens] = {
            "tokens_per_param": tokens / params,
            "uniform": per["uniform"],
            "cosine-1.5-0.5": per["cosine-1.5-0.5"],
            "diff": d,
        }
        ci = "" if d["ci"] is None else f" [{d['ci'][0]:+.4f}, {d['ci'][1]:+.4f}]"
        print(
            f"{tokens:>11,} tokens ({tokens / params:5.2f}/param): uniform "
            f"{statistics.fmean(per['uniform'].values()):.4f}, cosine 1.5->0.5 "
            f"{statistics.fmean(per['cosine-1.5-0.5'].values()):.4f}, "
            f"diff {d['mean']:+.4f}{ci} ({sum(x < 0 for x in d['per_seed'])}/{d['n']} seeds < 0)"
        )
    summary = {"written_by": STAMP, "params": params, "lr": a.lr, "seeds": a.seeds,
               "schedule": a.schedule, "budgets": table}  # fmt: skip
    write_output(a.out / "summary.json", json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

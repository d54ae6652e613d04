"""How precise is `taperlm compare` for its cost? The search behind compare's defaults.

For each candidate setting (any `taperlm compare` arguments: shape, tokens, learning rate, data,
validation tokens), run uniform vs cosine 1.5 -> 0.5 over N seeds and record:
- the paired difference cosine − uniform of the final validation loss: mean, sample std over
  seeds (sd) and the 95% interval half-width t(0.975, n−1) · sd / √n;
- the cost: CPU seconds of the whole comparison (children included) and per run, the wall time,
  the training throughput per run;
- the prediction for other seed counts: the half-width t(0.975, n'−1) · sd / √n' and the wall
  time of `allocations x n'` runs on `--cores` idle cores (CPU seconds per run / cores).

Results do not depend on machine load (only the times do), so candidates can be screened on a
busy machine; the CPU time per run is the load-robust cost (within ~10% under contention), and
the wall time means something only when the machine was otherwise idle.

    python benchmarks/compare_precision.py --out /tmp/precision --seeds 8 \\
        --candidate "base=--tokens 327680" --candidate "long=--tokens 655360" \\
        --candidate "lr1e-3=--tokens 327680 --set train.lr=1e-3"
    python benchmarks/compare_precision.py --smoke       # the same code at toy size, seconds

Every candidate is a normal, resumable compare folder under --out (rerunning reuses it); the
table goes to stdout and OUT/precision.md, every number to OUT/precision.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from outputs import STAMP, claim_folder, folder_problem, write_output
from taperlm.analysis.stats import t_quantile

TAPERS = "uniform;cosine:1.5:0.5"
TAPERED = "cosine-1.5-0.5"


def child_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def half_width(sd: float, n: int) -> float:
    return t_quantile(0.975, n - 1) * sd / math.sqrt(n)


def run_candidate(
    name: str, args: list[str], out: Path, seeds: int, common: list[str]
) -> dict[str, Any]:
    """Run (or reuse) one candidate's comparison and read its numbers."""
    folder = out / name
    cmd = [sys.executable, "-m", "taperlm.cli", "compare", "--tapers", TAPERS]
    # --stop fixed: the precision at a given number of seeds is the question, so every seed runs
    cmd += ["--seeds", str(seeds), "--stop", "fixed", "--no-progress", *common, *args]
    cmd += ["--out", str(folder)]
    cpu0, t0 = child_cpu_s(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, child_cpu_s() - cpu0
    if proc.returncode != 0:
        raise SystemExit(f"candidate {name} failed ({shlex.join(cmd)}):\n{proc.stderr[-3000:]}")
    report = json.loads((folder / "report.json").read_text())
    return summarize(name, args, report, cpu, wall, "trained" in proc.stderr)


def summarize(
    name: str, args: list[str], report: dict[str, Any], cpu: float, wall: float, fresh: bool
) -> dict[str, Any]:
    allocs = {a["name"]: a for a in report["allocations"]}
    d = allocs[TAPERED]["diff_vs_uniform"]["val_loss"]
    runs = sum(a["val_loss"]["n"] for a in allocs.values())
    s = report["meta"]["settings"]
    tps = [r["tokens_per_s"] for a in allocs.values() for r in a["per_seed"].values()]
    return {
        "name": name,
        "args": shlex.join(args),
        "model": report["meta"]["model"],
        "tokens_per_run": s["tokens"],
        "val_tokens": s["val_tokens"],
        "lr": s["lr"],
        "runs": runs,
        "seeds": d["n"],
        "mean": d["mean"],
        "sd": d["std"],
        "per_seed": d["per_seed"],
        "half_width": None if d["ci"] is None else (d["ci"][1] - d["ci"][0]) / 2,
        "uniform_loss": allocs["uniform"]["val_loss"]["mean"],
        "tokens_per_s": sum(tps) / len(tps) if tps else None,
        # only meaningful when this invocation trained everything (not reused from a cache)
        "cpu_s": cpu if fresh else None,
        "cpu_s_per_run": cpu / runs if fresh else None,
        "wall_s": wall if fresh else None,
    }


def predict(row: dict[str, Any], target: float, cores: int, allocations: int) -> dict[str, Any]:
    """Seeds needed for the target half-width (at this sd) and the idle wall time they take."""
    if not row["sd"] or row["cpu_s_per_run"] is None:
        return {}
    need = next((n for n in range(2, 200) if half_width(row["sd"], n) <= target), None)
    out: dict[str, Any] = {"seeds_for_target": need}
    if need is not None:
        out["wall_min_for_target"] = allocations * need * row["cpu_s_per_run"] / cores / 60
    return out


def table(rows: list[dict[str, Any]], target: float, cores: int, allocations: int) -> str:
    head = (
        "| candidate | arguments | tokens/run | runs | CPU s/run | wall min | mean Δ | sd Δ | "
        f"half-width | seeds for ±{target} | idle min for that ({allocations} alloc., "
        f"{cores} cores) |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        p = r.get("prediction") or {}

        def f(x: Any, fmt: str) -> str:
            return "–" if x is None else format(x, fmt)

        lines.append(
            f"| {r['name']} | `{r['args']}` | {r['tokens_per_run']:,} | {r['runs']} | "
            f"{f(r['cpu_s_per_run'], '.0f')} | {f(r['wall_s'] and r['wall_s'] / 60, '.1f')} | "
            f"{f(r['mean'], '+.4f')} | {f(r['sd'], '.4f')} | {f(r['half_width'], '.4f')} | "
            f"{f(p.get('seeds_for_target'), 'd')} | {f(p.get('wall_min_for_target'), '.1f')} |"
        )
    return "\n".join(lines)


def _smoke_args(root: Path) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """A toy corpus and toy model for --smoke."""
    import random

    from taperlm.data.prepare import prepare

    data = root / "data"
    if not (data / "meta.json").is_file():
        rng = random.Random(0)
        words = "the cat dog runs fast slow over under a bird sings loud tree house".split()
        text = "\n".join(
            " ".join(rng.choice(words) for _ in range(rng.randint(5, 12))) + "." for _ in range(400)
        )
        (root / "text.txt").write_text(text + "\n")
        prepare(str(root / "text.txt"), data, "bpe:300", val_tokens=600, progress=False)
    tiny = "--set model.n_layers=3 --set model.d_model=32 --set model.n_heads=2 "
    tiny += "--set model.mlp_width=64 --set model.context_length=32 --set train.seq_len=32 "
    tiny += "--set train.micro_batch_size=2 --set train.batch_tokens=64 --set train.eval_tokens=64"
    common = [*shlex.split(tiny), "--data", str(data), "--val-tokens", "128"]
    common += ["--novelty-tokens", "96", "--threads", "1"]
    return common, [("short", ["--tokens", "128"]), ("long", ["--tokens", "256"])]


def _earlier_run(folder: Path) -> bool:
    """A folder filled by this script before it claimed its folders: its precision.json."""
    try:
        doc = json.loads((folder / "precision.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and {"candidates", "target"} <= set(doc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="folder for the candidates' comparisons")
    p.add_argument(
        "--candidate",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="a candidate: a name and its `taperlm compare` arguments (repeatable)",
    )
    p.add_argument("--seeds", type=int, default=8, help="seeds per candidate [8]")
    p.add_argument("--common", default="", help="arguments every candidate gets")
    p.add_argument("--target", type=float, default=0.012, help="half-width target [0.012]")
    p.add_argument("--cores", type=int, default=2, help="cores of the predicted machine [2]")
    p.add_argument(
        "--allocations", type=int, default=2, help="allocations of the predicted design [2]"
    )
    p.add_argument("--smoke", action="store_true", help="toy corpus and model, seconds")
    args = p.parse_args(argv)
    problem = folder_problem(args.out, _earlier_run) if args.out else None
    if problem:
        p.error(f"--out {problem}")
    if args.smoke:
        import tempfile

        root = claim_folder(args.out or Path(tempfile.mkdtemp(prefix="precision-smoke-")))
        common, candidates = _smoke_args(root)
        args.out, args.seeds = root, 2
    else:
        if args.out is None or not args.candidate:
            p.error("give --out and at least one --candidate NAME=ARGS (or --smoke)")
        common = shlex.split(args.common)
        candidates = []
        for text in args.candidate:
            name, sep, rest = text.partition("=")
            if not sep or not name.strip():
                p.error(f"--candidate {text!r}: expected NAME=ARGS")
            candidates.append((name.strip(), shlex.split(rest)))
    claim_folder(args.out)
    results_path = args.out / "precision.json"
    old = json.loads(results_path.read_text()) if results_path.is_file() else {}
    rows = []
    for name, cand_args in candidates:
        print(f"candidate {name}: {shlex.join(cand_args)}", file=sys.stderr, flush=True)
        row = run_candidate(name, cand_args, args.out, args.seeds, common)
        if row["cpu_s"] is None and name in old.get("candidates", {}):
            prev = old["candidates"][name]  # keep the cost measured when it was trained
            for key in ("cpu_s", "cpu_s_per_run", "wall_s"):
                row[key] = prev.get(key)
        row["prediction"] = predict(row, args.target, args.cores, args.allocations)
        rows.append(row)
        doc = {
            "host": {"cpus": os.cpu_count(), "load_avg": os.getloadavg()},
            "seeds": args.seeds,
            "target": args.target,
            "candidates": {**old.get("candidates", {}), **{r["name"]: r for r in rows}},
        }
        write_output(results_path, json.dumps({"written_by": STAMP, **doc}, indent=1))
    md = table(rows, args.target, args.cores, args.allocations)
    write_output(args.out / "precision.md", f"<!-- {STAMP} -->\n{md}\n")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

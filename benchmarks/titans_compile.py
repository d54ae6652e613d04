"""Compile (warm-up) time and kernels per training step of Titans' chunk recurrence: this
checkout against a git revision, side by side in one run.

    python benchmarks/titans_compile.py --before main --cases m1-256 b1-256
    # the nested-compile-region experiment of issue 27 (benchmarks/README.md section 9):
    git apply benchmarks/results/titans_nested_region.patch
    python benchmarks/titans_compile.py --before HEAD --cap 420 --eager \
        --json benchmarks/results/titans_compile_nested_region.json
    git apply -R benchmarks/results/titans_nested_region.patch

"before" is the source tree of a git revision (`git archive` into a temporary folder), "after" this
checkout's `src`; every measurement runs in its own process (`PYTHONPATH` = that tree's src), one at
a time, with `OMP_NUM_THREADS` = `--threads`. A case is titans-mag-tiny with `--set`-like changes:
`m<L>-<T>` compiles the whole model (`torch.compile(model)`), `b<L>-<T>` each block's forward
(`--scope blocks`), L layers at T tokens (the chunk is 16 tokens, so T/16 chunk steps per layer).
One step = op_count.py's (forward + loss, backward, clip, fused AdamW, fp32, batch 1); warm-up =
the wall time of the first two steps (Dynamo + Inductor compile included); kernels = op_count.py's
count of the third step. Inductor's and AOTAutograd's caches are off (every run compiles cold,
as a user's first run does). A run past `--cap` seconds is stopped and reported as a lower bound.
`--eager` adds eager tokens/s of the 6-layer preset (forward + backward, batch 4 x 256, median
of `--rounds`), before and after interleaved round by round.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from common import RESULTS_DIR, machine_info, table, write_json  # noqa: E402
from outputs import output_file  # noqa: E402

CASES = ("m1-256", "m1-1024", "b1-256", "m2-256")

CHILD_COMPILE = """
import json, sys, time, dataclasses
from unittest import mock
import torch, torch._inductor.config as ic
from torch.profiler import ProfilerActivity, profile
sys.path.insert(0, {bench!r})
from common import raise_recompile_limit
from op_count import count_kernels, make_step
from taperlm.config.presets import get_preset
raise_recompile_limit(64)
torch.manual_seed(0)
# every per-layer size re-resolved at the cut depth (the preset is uniform: same shapes)
cfg = dataclasses.replace(get_preset("titans-mag-tiny", resolve=False), n_layers={layers},
    context_length={seq}).resolve()
with mock.patch("taperlm.models.cpu_kernels.applies", lambda x: False), \\
        mock.patch.object(ic.cpp, "enable_kernel_profile", True):
    step = make_step(cfg, {seq}, "compile", {scope!r})
    t0 = time.perf_counter(); step(); step(); warm = time.perf_counter() - t0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    kernels, names = count_kernels(prof.events())
print("RESULT", json.dumps({{"warmup_s": warm, "kernels": kernels}}))
"""

CHILD_EAGER = """
import json, sys, time, torch
from taperlm.models import TaperedLM
from taperlm.config.presets import get_preset
torch.manual_seed(0)
cfg = get_preset("titans-mag-tiny")
model = TaperedLM(cfg)
idx = torch.randint(0, cfg.vocab_size, (4, 257))
def step():
    model(idx[:, :-1], targets=idx[:, 1:]).loss.backward()
    model.zero_grad(set_to_none=True)
step()
t0 = time.perf_counter()
for _ in range({steps}):
    step()
print("RESULT", json.dumps({{"tokens_per_s": {steps} * 4 * 256 / (time.perf_counter() - t0)}}))
"""


def export_tree(rev: str, dest: Path) -> Path:
    """`src` of git revision `rev` under dest; returns dest / "src"."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "src"


def run_child(code: str, src: Path, cap: float, threads: int) -> dict[str, Any]:
    """Run `code` with PYTHONPATH=src; its RESULT line, or {"capped": True} past `cap` s."""
    env = {
        **os.environ,
        "PYTHONPATH": str(src),
        "OMP_NUM_THREADS": str(threads),
        "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1",  # a cold compile every time, as a user's first
    }
    t0 = time.perf_counter()
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=cap
        )
    except subprocess.TimeoutExpired:
        return {"capped": True, "wall_s": time.perf_counter() - t0}
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if out.returncode or not lines:
        return {"error": out.stderr[-2000:], "wall_s": time.perf_counter() - t0}
    return {**json.loads(lines[-1][7:]), "wall_s": time.perf_counter() - t0}


def compile_case(case: str, src: Path, args: argparse.Namespace) -> dict[str, Any]:
    scope = "blocks" if case[0] == "b" else "model"
    layers, seq = (int(x) for x in case[1:].split("-"))
    code = CHILD_COMPILE.format(bench=str(HERE), layers=layers, seq=seq, scope=scope)
    res = run_child(code, src, args.cap, args.threads)
    return {"case": case, "scope": scope, "layers": layers, "seq": seq, "chunks": seq // 16, **res}


def cell(r: dict[str, Any], key: str) -> str:
    if r.get("capped"):
        return f"> {r['wall_s']:.0f}" if key == "warmup_s" else "-"
    if "error" in r:
        return "error"
    return f"{r[key]:.0f}" if key == "warmup_s" else f"{r[key]:,}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--before", default="main", help="git revision measured as 'before'")
    p.add_argument("--cases", nargs="+", default=list(CASES))
    p.add_argument("--cap", type=float, default=600.0, help="seconds per compile run")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--eager", action="store_true", help="also eager tokens/s, before vs after")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", choices=["before", "after"], default=None)
    p.add_argument("--json", type=output_file, default=str(RESULTS_DIR / "titans_compile.json"))
    args = p.parse_args(argv)
    rows: list[dict[str, Any]] = []
    data = {"machine": machine_info(), "args": vars(args), "rows": rows}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": export_tree(args.before, Path(tmp)), "after": REPO / "src"}
        if args.only:
            trees = {args.only: trees[args.only]}
        for case in args.cases:
            for label, src in trees.items():
                rows.append({"tree": label, **compile_case(case, src, args)})
                print(json.dumps(rows[-1])[:300], flush=True)
                write_json("titans_compile", data, args.json)
        if args.eager:
            eager = {k: [] for k in trees}
            for _ in range(args.rounds):
                for label, src in trees.items():
                    r = run_child(CHILD_EAGER.format(steps=3), src, args.cap, args.threads)
                    eager[label].append(r.get("tokens_per_s"))
            data["eager_tokens_per_s"] = eager
            print("eager tokens/s", eager, flush=True)
    write_json("titans_compile", data, args.json)
    shown = [
        {
            "case": r["case"],
            "tree": r["tree"],
            "chunk steps/layer": r["chunks"],
            "warm-up s": cell(r, "warmup_s"),
            "kernels": cell(r, "kernels"),
        }
        for r in rows
    ]
    print(table(shown, ["case", "tree", "chunk steps/layer", "warm-up s", "kernels"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""GPU training throughput and MFU of the 440M presets of every family, uniform vs tapered,
eager vs torch.compile, in one command (sized for <= 8 minutes on one H100/H200).

For each family preset (`{family}-440m`), taper (uniform, cosine 1.5 -> 0.5) and mode (eager,
compile) it builds the model on the GPU, runs a few warm-up steps (this is where compilation
happens; its time is reported) and then times training steps: bf16 autocast, fused AdamW,
forward + backward + optimizer step, `torch.cuda.synchronize()` around the timed region.

    MFU = tokens/s x flops_per_token(cfg, seq) / peak     (taperlm.budget.flops_per_token)

with the dense bf16 peak of the GPU (H100/H200 989 TFLOP/s, A100 312; `--peak-tflops` for
others). Configurations run in priority order (transformer first) and the rest are skipped,
with a note, once `--budget-s` is spent, so the command ends in time.

    python benchmarks/gpu.py                         # all families, ~8 minutes on an H100/H200
    python benchmarks/gpu.py --families transformer --modes compile
    python benchmarks/gpu.py --smoke                 # the same code path on CPU, tiny presets

`--smoke` uses the `*-tiny` presets on CPU, bf16 autocast on CPU and Dynamo with the `eager`
backend (tracing without Inductor's C++ build) for the first family only, so it exercises every
branch in seconds.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    add_gpu_benchmark_arguments,
    gpu_or_smoke,
    machine_info,
    raise_recompile_limit,
    table,
    warm_and_time,
    write_json,
)
from taperlm.budget import flops_per_token, total_params
from taperlm.errors import ConfigError, TaperError
from taperlm.presets import get_preset, preset_families
from taperlm.taper import TaperSpec

FAMILIES = tuple(preset_families())  # transformer, gated, hope, titans-mac, ...
# Dense bf16 peak FLOP/s (no sparsity), matched against torch.cuda.get_device_name().
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


def peak_flops(device: torch.device, override_tflops: float | None) -> float | None:
    if override_tflops:
        return override_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def run_config(
    cfg: Any,
    mode: str,
    args: argparse.Namespace,
    device: torch.device,
) -> dict[str, Any]:
    """Build, warm up (compile) and time one configuration; returns its measurements."""
    from taperlm.models import TaperedLM

    torch.manual_seed(0)
    with torch.device(device):
        model = TaperedLM(cfg)
    fwd: Any = model
    if mode == "compile":
        backend = "eager" if args.smoke else "inductor"
        fwd = torch.compile(model, backend=backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    seq = min(args.seq, cfg.context_length)
    x = torch.randint(0, cfg.vocab_size, (args.batch, seq), device=device)
    y = torch.roll(x, -1, dims=1)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = fwd(x, targets=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    warm_s, step_s = warm_and_time(step, args.warmup, args.steps, device)
    tokens = args.batch * seq
    out = {
        "step_ms": 1e3 * step_s,
        "tokens/s": tokens / step_s,
        "warmup_s": warm_s,
        "flops_per_token": flops_per_token(cfg, seq),
        "params_M": total_params(cfg) / 1e6,
        "seq": seq,
    }
    if device.type == "cuda":
        out["peak_GiB"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_gpu_benchmark_arguments(p)
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    p.add_argument("--tapers", nargs="+", default=["uniform", "cosine"])
    p.add_argument("--modes", nargs="+", default=["eager", "compile"], choices=["eager", "compile"])
    args = p.parse_args(argv)
    device = gpu_or_smoke(args, "gpu.py")
    if device is None:
        return 2
    # A compiled block function sees one shape per distinct width (and Dynamo keeps 8 by default).
    raise_recompile_limit(256)
    peak = peak_flops(device, args.peak_tflops)

    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for family in args.families:
        for mode in args.modes:
            for taper in args.tapers:
                label = f"{family}-{args.size} {taper} {mode}"
                if args.smoke and mode == "compile" and family != args.families[0]:
                    continue  # tracing every family takes minutes on CPU; one shows the path
                if time.perf_counter() - start > args.budget_s:
                    notes.append(f"{label}: skipped (time budget {args.budget_s:.0f}s spent)")
                    continue
                try:
                    spec = TaperSpec.parse(taper, multiple_of=args.multiple_of)
                    cfg = get_preset(f"{family}-{args.size}", taper=spec)
                except (ConfigError, TaperError, NotImplementedError) as err:
                    notes.append(f"{label}: skipped ({err})")
                    continue
                print(f"{label} ...", end=" ", flush=True)
                try:
                    r = run_config(cfg, mode, args, device)
                except torch.OutOfMemoryError:
                    notes.append(f"{label}: out of memory at batch {args.batch} x {args.seq}")
                    print("out of memory", flush=True)
                    r = None
                except NotImplementedError as err:
                    notes.append(f"{label}: skipped ({err})")
                    print("not implemented", flush=True)
                    r = None
                finally:
                    gc.collect()
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                    if mode == "compile":
                        torch._dynamo.reset()
                if r is None:
                    continue
                r["mfu_%"] = 100 * r["tokens/s"] * r["flops_per_token"] / peak if peak else None
                row = {"family": family, "taper": taper, "mode": mode, **r}
                rows.append(row)
                print(f"{r['tokens/s']:,.0f} tokens/s", flush=True)
    cols = ["family", "taper", "mode", "params_M", "tokens/s", "step_ms", "mfu_%", "warmup_s"]
    if device.type == "cuda":
        cols.append("peak_GiB")
    if rows:
        # Tapered/uniform ratio of tokens/s beside each tapered row (same family and mode).
        base = {(r["family"], r["mode"]): r["tokens/s"] for r in rows if r["taper"] == "uniform"}
        for r in rows:
            b = base.get((r["family"], r["mode"]))
            r["vs uniform"] = r["tokens/s"] / b if b else None
        print(table(rows, [*cols, "vs uniform"]))
    for n in notes:
        print(n)
    result = {
        "benchmark": "gpu",
        "machine": machine_info(),
        "device": str(device),
        "peak_flops": peak,
        "batch": args.batch,
        "seq": args.seq,
        "multiple_of": args.multiple_of,
        "warmup": args.warmup,
        "steps": args.steps,
        "rows": rows,
        "notes": notes,
        "elapsed_s": time.perf_counter() - start,
    }
    print(f"wrote {write_json('gpu_smoke' if args.smoke else 'gpu', result, args.json)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

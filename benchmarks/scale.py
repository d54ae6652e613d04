"""The scale path on one GPU, in one command (sized for <= 8 minutes on one H100/H200): the
440M transformer and titans-mag presets (cosine taper), built on the meta device, FSDP2 with the
bf16 mixed-precision policy (fp32 reduce), fused AdamW, eager vs per-block (regional)
torch.compile; tokens/s, MFU, peak memory beside the planner's figure, and the time to save and
load a sharded (DCP) checkpoint of the model and optimizer.

    python benchmarks/scale.py                   # the GPU run; writes results/scale.json
    python benchmarks/scale.py --smoke           # the same code on CPU (gloo), tiny presets,
                                                 # rows 1-3, Dynamo with the aot_eager backend

Rows run in priority order and are skipped (with a note) once `--budget-s` is spent:

1. transformer-440m eager (+ DCP save/load)    3. transformer-440m compile
2. titans-mag-440m eager (+ DCP save/load)     4. titans-mag-440m compile
5. transformer-440m uniform compile (the tapered/uniform ratio with 3.)

The micro-batch of each row is the largest of `--batch`, `--batch`/2, ... that the planner
(`taperlm plan --gpus 1`) says fits the GPU. Compiling per block builds one graph per distinct
block shape (benchmarks/recompiles.py), so widths are rounded to multiples of 256 by default
(13 distinct widths for the cosine 440M stack instead of 20 at 128); the compile seconds are
the `warmup_s` column and the graph count `graphs`.

MFU = tokens/s x flops_per_token(cfg, seq) / peak (taperlm.config.budget; H100/H200 989 TFLOP/s dense
bf16, A100 312; `--peak-tflops` for others).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    add_gpu_benchmark_arguments,
    failure_note,
    gpu_or_smoke,
    machine_info,
    raise_recompile_limit,
    sync,
    table,
    warm_and_time,
    write_json,
)
from taperlm.config import TrainConfig
from taperlm.config.budget import flops_per_token
from taperlm.config.presets import get_preset
from taperlm.spec.taper import TaperSpec

ROWS = [
    ("transformer", "cosine", "eager"),
    ("titans-mag", "cosine", "eager"),
    ("transformer", "cosine", "compile"),
    ("titans-mag", "cosine", "compile"),
    ("transformer", "uniform", "compile"),
]


def init_one_rank(device: torch.device) -> Any:
    """A process group of one rank (FSDP2 and DCP need one), nccl on CUDA, gloo on CPU."""
    import torch.distributed as dist

    from taperlm.training import distributed as D

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=0, world_size=1)
    return D.DistInfo(0, 0, 1, device, dist.get_backend())


def pick_batch(cfg: Any, args: argparse.Namespace, memory: int, ac: bool) -> tuple[int, Any]:
    from taperlm.training.planner import plan_training

    batch = args.batch
    while True:
        plan = plan_training(cfg, 1, memory, batch, args.seq, "fsdp", ac)
        if plan.fits or batch == 1:
            return batch, plan
        batch //= 2


def count_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def run_row(
    family: str, taper: str, mode: str, args: argparse.Namespace, device: torch.device, info: Any
) -> dict[str, Any]:
    """Build, shard, warm up (compile) and time one configuration."""
    import torch._dynamo

    from taperlm.checkpoint import dcp
    from taperlm.models.layers import set_activation_checkpointing
    from taperlm.training import distributed as D
    from taperlm.training.model import build_on_meta, materialize
    from taperlm.training.optim import build_optimizer, parameter_periods

    spec = TaperSpec.parse(taper, multiple_of=args.multiple_of)
    cfg = get_preset(f"{family}-{args.size}", taper=spec)
    seq = min(args.seq, cfg.context_length)
    memory = (
        torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 64 << 30
    )
    batch, plan = pick_batch(cfg, args, memory, args.activation_checkpointing)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = build_on_meta(cfg)
    periods = parameter_periods(model)
    set_activation_checkpointing(model, args.activation_checkpointing)
    D.shard_model(model, D.mixed_precision_policy(torch.bfloat16, torch.float32))
    materialize(model, device)
    build_s = time.perf_counter() - t0
    opt = build_optimizer(model, TrainConfig(lr=1e-4), device, periods)
    graphs_before = count_graphs()
    if mode == "compile":
        backend = "aot_eager" if args.smoke else "inductor"
        for block in model.blocks:
            block.forward = torch.compile(block.forward, backend=backend)
    x = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    y = torch.roll(x, -1, dims=1)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(x, targets=y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    warm_s, step_s = warm_and_time(step, args.warmup, args.steps, device)
    tokens = batch * seq
    fpt = flops_per_token(cfg, seq)
    out: dict[str, Any] = {
        "batch": batch,
        "seq": seq,
        "distinct_widths": len(set(cfg.mlp_widths or [])),
        "build_s": build_s,
        "warmup_s": warm_s,
        "step_ms": 1e3 * step_s,
        "tokens/s": tokens / step_s,
        "flops_per_token": fpt,
        "planned_GiB": plan.total / 2**30,
    }
    if mode == "compile":
        out["graphs"] = count_graphs() - graphs_before
    if device.type == "cuda":
        out["peak_GiB"] = torch.cuda.max_memory_allocated(device) / 2**30
    if mode == "eager":  # a sharded checkpoint of model + optimizer: save, then load back
        tmp = Path(tempfile.mkdtemp(prefix="taperlm-scale-", dir=args.tmp))
        try:
            sync(device)
            t0 = time.perf_counter()
            state = dcp.training_state(model, opt, [])
            files = dcp.write_shards(tmp, state).result()
            out["dcp_save_s"] = time.perf_counter() - t0
            out["dcp_GB"] = sum((tmp / f).stat().st_size for f in files) / 1e9
            t0 = time.perf_counter()
            shards = {f: (tmp / f).stat().st_size for f in files}  # what a manifest would list
            dcp.load_training_state(tmp, model, opt, [], shards)
            sync(device)
            out["dcp_load_s"] = time.perf_counter() - t0
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_gpu_benchmark_arguments(p)
    p.set_defaults(multiple_of=256)
    p.add_argument("--rows", type=int, nargs="+", help="row numbers to run (1-based; default all)")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--tmp", default=None, help="where the DCP checkpoint is written")
    args = p.parse_args(argv)
    device = gpu_or_smoke(args, "scale.py")
    if device is None:
        return 2
    raise_recompile_limit(256)
    info = init_one_rank(device)
    from taperlm.training.metrics import peak_flops

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    peak = peak_flops(device.type, name, args.peak_tflops and args.peak_tflops * 1e12)
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    notes: list[str] = []

    def report(rows: list[dict[str, Any]], notes: list[str]) -> Path:
        result = {
            "benchmark": "scale",
            "machine": machine_info(),
            "device": str(device),
            "peak_flops": peak,
            "seq": args.seq,
            "multiple_of": args.multiple_of,
            "activation_checkpointing": args.activation_checkpointing,
            "rows": rows,
            "notes": notes,
            "elapsed_s": time.perf_counter() - start,
        }
        return write_json("scale_smoke" if args.smoke else "scale", result, args.json)

    for number, (family, taper, mode) in enumerate(ROWS, 1):
        label = f"{number}. {family}-{args.size} {taper} {mode}"
        if args.rows and number not in args.rows:
            continue
        if args.smoke and number > 3:
            continue  # tracing Titans or a second stack adds minutes on CPU; rows 1-3 show the path
        if time.perf_counter() - start > args.budget_s:
            notes.append(f"{label}: skipped (time budget {args.budget_s:.0f}s spent)")
            continue
        print(f"{label} ...", end=" ", flush=True)
        try:
            r = run_row(family, taper, mode, args, device, info)
        except torch.OutOfMemoryError:
            notes.append(f"{label}: out of memory")
            print("out of memory", flush=True)
            continue
        except Exception as err:  # a note; the other rows go on
            notes.append(failure_note(label, err))
            print("failed", flush=True)
            continue
        finally:
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            torch._dynamo.reset()
        r["mfu_%"] = 100 * r["tokens/s"] * r["flops_per_token"] / peak if peak else None
        rows.append({"row": number, "family": family, "taper": taper, "mode": mode, **r})
        print(f"{r['tokens/s']:,.0f} tokens/s", flush=True)
        report(rows, notes)  # a kill at the lease's end keeps the rows done
    cols = ["row", "family", "taper", "mode", "batch", "tokens/s", "step_ms", "mfu_%"]
    cols += ["warmup_s", "graphs", "planned_GiB", "peak_GiB", "dcp_save_s", "dcp_load_s", "dcp_GB"]
    if rows:
        print(table(rows, [c for c in cols if any(c in r for r in rows)]))
    for n in notes:
        print(n)
    print(f"wrote {report(rows, notes)}")
    import torch.distributed as dist

    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

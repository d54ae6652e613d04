"""The GPU command: what one H100/H200 measures in at most 8 minutes, in one run.

    python benchmarks/gpu.py                  # one GPU; writes benchmarks/results/gpu.json
    python benchmarks/gpu.py --smoke          # the same code path on CPU, tiny presets, seconds
    python benchmarks/gpu.py --sections mfu --families transformer gated hope --tapers uniform cosine

Sections, in this order (each configuration is skipped, with a note, once `--budget-s` is
spent, so the command ends in time):

1. **mfu**: tokens/s and MFU of transformer-440m and titans-mag-440m (cosine taper), bf16
   autocast, fused AdamW, forward + backward + optimizer step, `torch.compile` (Inductor) then
   eager. Titans' compiled row runs last, after sections 2 and 3: Dynamo unrolls its memory's
   chunk loop (layers x chunks steps in one graph), so it compiles for minutes. A few warm-up steps (where compilation happens; `warmup_s`) precede the timed steps,
   with `torch.cuda.synchronize()` around the timed region. Peak memory of each row.

       MFU = tokens/s x flops_per_token(cfg, seq) / peak     (taperlm.config.budget.flops_per_token)

   with the dense bf16 peak of the GPU (H100/H200 989 TFLOP/s, A100 312; `--peak-tflops`).
2. **memory**: transformer-440m (cosine) the way `taperlm train` shards it (meta init, FSDP2
   over one rank with the bf16 MixedPrecisionPolicy, fused AdamW): the measured peak memory
   beside the planner's figure (`taperlm plan`), and the time to save and load a sharded (DCP)
   checkpoint of model and optimizer (benchmarks/scale.py's first row).
3. **taper**: 50 steps of uniform vs cosine 1.5 -> 0.5 through the trainer itself
   (`taperlm.training.loop.train`: data loader, schedule, bf16, checkpoint), transformer-440m,
   on `--data` (a `taperlm prepare` dir) or, without it, a synthetic corpus prepared on the spot
   (so the run needs no files; its losses say the path works, not which taper is better).
   Loss at steps 1, 10, 25, 50 and tokens/s of each.

4. **cells** (opt-in: `--sections cells`, on a machine of several GPUs): one `taperlm compare`
   cell with as many processes as there are GPUs (`--nproc-per-cell`, the local executor), its
   tokens/s beside `taperlm train` under torchrun with as many processes on the same config.

`--smoke` runs every section on CPU with the `*-tiny` presets, bf16 autocast on CPU, one
warm-up and one timed step, Dynamo with the `eager` backend (tracing without Inductor's C++
build; tests/training/test_gpu_paths.py runs Inductor) for the first family, and 4 taper steps.
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
    failure_note,
    gpu_or_smoke,
    machine_info,
    raise_recompile_limit,
    table,
    warm_and_time,
    write_json,
)
from taperlm.config.budget import flops_per_token, total_params
from taperlm.config.presets import get_preset, preset_families
from taperlm.errors import ConfigError, TaperError
from taperlm.spec.taper import TaperSpec

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


def mfu_section(
    args: argparse.Namespace, device: torch.device, clock: Clock, late: bool = False
) -> list[dict]:
    """Section 1: tokens/s and MFU per (family, mode, taper). The compiled rows of the other
    families are `late`: they run after every other section, since Dynamo unrolls Titans' chunk
    loop (layers x chunks steps in one graph) and its compilation can take minutes."""
    peak = peak_flops(device, args.peak_tflops)
    rows: list[dict[str, Any]] = []
    for family in args.families:
        for mode in args.modes:
            for taper in args.tapers:
                label = f"{family}-{args.size} {taper} {mode}"
                if late != (mode == "compile" and family != args.families[0]):
                    continue
                if args.smoke and late:
                    continue  # tracing every family takes minutes on CPU; one shows the path
                if clock.spent(label):
                    continue
                try:
                    spec = TaperSpec.parse(taper, multiple_of=args.multiple_of)
                    cfg = get_preset(f"{family}-{args.size}", taper=spec)
                except (ConfigError, TaperError, NotImplementedError) as err:
                    clock.notes.append(f"{label}: skipped ({err})")
                    continue
                print(f"{label} ...", end=" ", flush=True)
                try:
                    r = run_config(cfg, mode, args, device)
                except torch.OutOfMemoryError:
                    clock.notes.append(f"{label}: out of memory at batch {args.batch} x {args.seq}")
                    print("out of memory", flush=True)
                    r = None
                except NotImplementedError as err:
                    clock.notes.append(f"{label}: skipped ({err})")
                    print("not implemented", flush=True)
                    r = None
                except Exception as err:  # a note; the other rows go on
                    clock.notes.append(failure_note(label, err))
                    print("failed", flush=True)
                    r = None
                finally:
                    release(device, compiled=mode == "compile")
                if r is None:
                    continue
                r["mfu_%"] = 100 * r["tokens/s"] * r["flops_per_token"] / peak if peak else None
                rows.append({"family": family, "taper": taper, "mode": mode, **r})
                print(f"{r['tokens/s']:,.0f} tokens/s", flush=True)
    return rows


def memory_section(args: argparse.Namespace, device: torch.device, clock: Clock) -> list[dict]:
    """Section 2: peak memory beside the planner's figure and a DCP save + load, through
    benchmarks/scale.py's first row (FSDP2 over one rank, bf16 policy)."""
    import scale

    label = f"transformer-{args.size} cosine FSDP2 eager (memory, DCP)"
    if clock.spent(label):
        return []
    ns = argparse.Namespace(**vars(args))
    ns.activation_checkpointing, ns.tmp = False, args.tmp
    print(f"{label} ...", end=" ", flush=True)
    info = scale.init_one_rank(device)
    try:
        r = scale.run_row("transformer", "cosine", "eager", ns, device, info)
    except torch.OutOfMemoryError:
        clock.notes.append(f"{label}: out of memory")
        print("out of memory", flush=True)
        return []
    finally:
        release(device, compiled=False)
        import torch.distributed as dist

        dist.destroy_process_group()
    if "peak_GiB" in r:
        r["peak / planned"] = r["peak_GiB"] / r["planned_GiB"]
    print(f"planned {r['planned_GiB']:.2f} GiB, DCP save {r['dcp_save_s']:.2f} s", flush=True)
    return [{"preset": f"transformer-{args.size}", **r}]


def synthetic_corpus(path: Path, n_words: int, seed: int = 0) -> None:
    """A text file of `n_words` words drawn from a Zipf law over a fixed made-up vocabulary."""
    import random

    rng = random.Random(seed)
    syllables = ["ka", "to", "ri", "ne", "mu", "sa", "lo", "pe", "di", "va", "gu", "shi"]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(3000)]
    weights = [1.0 / (i + 1) for i in range(len(words))]
    text = rng.choices(words, weights, k=n_words)
    lines = [" ".join(text[i : i + 12]).capitalize() + "." for i in range(0, n_words, 12)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def taper_section(args: argparse.Namespace, device: torch.device, clock: Clock) -> list[dict]:
    """Section 3: `args.taper_steps` steps of uniform vs cosine through the trainer."""
    import shutil
    import tempfile

    from taperlm.cli import main as cli_main
    from taperlm.config import apply_overrides, run_config_from_dict, to_dict
    from taperlm.training.loop import train
    from taperlm.training.metrics import read_metrics

    tmp = Path(tempfile.mkdtemp(prefix="taperlm-gpu-", dir=args.tmp))
    rows: list[dict[str, Any]] = []
    try:
        data = Path(args.data) if args.data else None
        if data is None:
            src = tmp / "corpus.txt"
            synthetic_corpus(src, 5_000 if args.smoke else 300_000)  # epochs repeat it
            data = tmp / "data"
            argv = ["prepare", "--source", str(src), "--tokenizer", "bpe:2048", "--out", str(data)]
            if cli_main([*argv, "--workers", "1", "--no-progress"]) != 0:
                raise RuntimeError("taperlm prepare of the synthetic corpus failed")
        seq = min(args.seq, 256 if args.smoke else 2048)
        batch_tokens = args.batch * seq
        for taper in ("uniform", "cosine:1.5:0.5"):
            label = f"transformer-{args.size} {taper} {args.taper_steps} steps (trainer)"
            if clock.spent(label):
                continue
            model = to_dict(get_preset(f"transformer-{args.size}", resolve=False))
            cfg_dict = {"model": model}
            apply_overrides(
                cfg_dict,
                [
                    f"model.taper={taper}",
                    f"train.seq_len={seq}",
                    f"train.micro_batch_size={args.batch}",
                    f"train.batch_tokens={batch_tokens}",
                    f"train.tokens={batch_tokens * args.taper_steps}",
                    f"train.warmup_tokens={batch_tokens * max(1, args.taper_steps // 10)}",
                    "train.lr=0.001",
                    "train.precision=bf16",
                    f"train.device={device.type}",
                    "train.log_every=1",
                    "train.eval_every=0",
                    "train.eval_tokens=0",
                    "train.checkpoint_every=0",
                ],
            )
            run = run_config_from_dict(cfg_dict).resolve()
            run.data.dir = str(data)
            print(f"{label} ...", end=" ", flush=True)
            t0 = time.perf_counter()
            try:
                result = train(run, tmp / taper.split(":")[0], resume="never", progress=False)
            except torch.OutOfMemoryError:
                clock.notes.append(f"{label}: out of memory at batch {args.batch} x {seq}")
                print("out of memory", flush=True)
                continue
            except Exception as err:  # a note; the other taper still runs
                clock.notes.append(failure_note(label, err))
                print("failed", flush=True)
                continue
            finally:
                release(device, compiled=False)
            losses = [
                x["loss"]
                for x in read_metrics(tmp / taper.split(":")[0] / "metrics.jsonl")
                if "loss" in x
            ]
            at = {f"loss@{s}": losses[s - 1] for s in (1, 10, 25, 50) if s <= len(losses)}
            rows.append(
                {
                    "taper": taper,
                    "steps": result.step,
                    **at,
                    "final loss": losses[-1] if losses else None,
                    "tokens/s": result.tokens_per_s,
                    "wall_s": time.perf_counter() - t0,
                    "losses": losses,
                }
            )
            print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def cells_section(args: argparse.Namespace, device: torch.device, clock: Clock) -> list[dict]:
    """Section 4 (opt-in, `--sections cells`; issue 59): one `taperlm compare` cell with as many
    processes as the machine has GPUs (`--nproc-per-cell`, the local executor), its tokens/s
    beside `taperlm train` under torchrun with as many processes on the cell's own config.yaml.
    With --smoke: 2 gloo processes on CPU, a tiny preset."""
    import json
    import shutil
    import subprocess
    import tempfile

    from taperlm.cli import main as cli_main
    from taperlm.training.metrics import read_metrics

    nproc = 2 if args.smoke else torch.cuda.device_count()
    label = f"compare cell, {nproc} processes, beside taperlm train under torchrun"
    if clock.spent(label):
        return []
    tmp = Path(tempfile.mkdtemp(prefix="taperlm-gpu-cells-", dir=args.tmp))
    try:
        data = Path(args.data) if args.data else None
        if data is None:
            src = tmp / "corpus.txt"
            synthetic_corpus(src, 5_000 if args.smoke else 300_000)
            data = tmp / "data"
            argv = ["prepare", "--source", str(src), "--tokenizer", "bpe:2048", "--out", str(data)]
            if cli_main([*argv, "--workers", "1", "--no-progress"]) != 0:
                raise RuntimeError("taperlm prepare of the synthetic corpus failed")
        seq = min(args.seq, 32 if args.smoke else 2048)  # the smoke corpus's val split: 63
        batch_tokens = args.batch * seq * nproc
        steps = 4 if args.smoke else args.taper_steps
        preset = "transformer-tiny" if args.smoke else f"transformer-{args.size}"
        sets = [f"train.seq_len={seq}", f"train.micro_batch_size={args.batch}",
                f"train.batch_tokens={batch_tokens}", "train.log_every=1",
                f"train.eval_every={steps}", f"train.eval_tokens={seq}",
                f"train.device={device.type}"]  # fmt: skip
        if not args.smoke:
            sets += ["train.precision=bf16", "train.compile=true", "train.parallel=fsdp"]
        cmd = [sys.executable, "-m", "taperlm.cli", "compare", "--preset", preset, "--tapers",
               "uniform", "--seeds", "1", "--stop", "fixed", "--tokens", str(batch_tokens * steps),
               "--nproc-per-cell", str(nproc), "--jobs", "1", "--val-tokens", str(seq),
               "--novelty-tokens", str(seq), "--eval-tasks", "none", "--no-progress",
               "--data", str(data), "--out", str(tmp / "cmp")]  # fmt: skip
        for o in sets:
            cmd += ["--set", o]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"taperlm compare failed: {r.stderr[-2000:]}")
        cell = tmp / "cmp" / "runs" / "uniform-s0"
        result = json.loads((cell / "result.json").read_text())
        rows = [{"what": f"compare cell x {nproc}", "tokens/s": result["train"]["tokens_per_s"],
                 "wall_s": time.perf_counter() - t0}]  # fmt: skip
        t0 = time.perf_counter()
        run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
               str(nproc), "-m", "taperlm.cli", "train", "--config", str(cell / "config.yaml"),
               "--out", str(tmp / "train"), "--no-progress"]  # fmt: skip
        r = subprocess.run(run, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"taperlm train under torchrun failed: {r.stderr[-2000:]}")
        rates = [x["tokens_per_s"] for x in read_metrics(tmp / "train" / "metrics.jsonl")
                 if x.get("tokens_per_s")]  # fmt: skip
        rows.append({"what": f"taperlm train, torchrun x {nproc}",
                     "tokens/s": sum(rates) / len(rates) if rates else None,
                     "wall_s": time.perf_counter() - t0})  # fmt: skip
        for row in rows:
            print(f"{row['what']}: {row['tokens/s'] or 0:,.0f} tokens/s", flush=True)
        return rows
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def merge_rows(rows: list[dict], more: list[dict], args: argparse.Namespace) -> list[dict]:
    """MFU rows in the order of --families, --modes, --tapers, each tapered row with its
    tokens/s ratio to the uniform row of the same family and mode."""
    key = lambda r: (  # noqa: E731
        args.families.index(r["family"]),
        args.modes.index(r["mode"]),
        args.tapers.index(r["taper"]),
    )
    out = sorted(rows + more, key=key)
    base = {(r["family"], r["mode"]): r["tokens/s"] for r in out if r["taper"] == "uniform"}
    for r in out:
        b = base.get((r["family"], r["mode"]))
        r["vs uniform"] = r["tokens/s"] / b if b else None
    return out


class Clock:
    """The command's time budget, and the notes of what it skipped."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s, self.start, self.notes = budget_s, time.perf_counter(), []

    def spent(self, label: str) -> bool:
        if time.perf_counter() - self.start > self.budget_s:
            self.notes.append(f"{label}: skipped (time budget {self.budget_s:.0f}s spent)")
            return True
        return False


def release(device: torch.device, compiled: bool) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if compiled:
        torch._dynamo.reset()


SECTIONS = ("mfu", "memory", "taper", "cells")
DEFAULT_SECTIONS = ("mfu", "memory", "taper")  # cells: opt-in (a machine of several GPUs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_gpu_benchmark_arguments(p)
    p.set_defaults(budget_s=450.0)
    p.add_argument("--sections", nargs="+", default=list(DEFAULT_SECTIONS), choices=SECTIONS)
    p.add_argument("--families", nargs="+", default=["transformer", "titans-mag"], choices=FAMILIES)
    p.add_argument("--tapers", nargs="+", default=["cosine"])
    p.add_argument("--modes", nargs="+", default=["compile", "eager"], choices=["eager", "compile"])
    p.add_argument("--taper-steps", type=int, default=50, help="steps of the taper section")
    p.add_argument("--data", default=None, help="a prepared data dir for the taper section")
    p.add_argument("--tmp", default=None, help="where checkpoints and the corpus are written")
    args = p.parse_args(argv)
    device = gpu_or_smoke(args, "gpu.py")
    if device is None:
        return 2
    if args.smoke:
        args.taper_steps = min(args.taper_steps, 4)
    # A compiled block function sees one shape per distinct width (and Dynamo keeps 8 by default).
    raise_recompile_limit(256)
    clock = Clock(args.budget_s)
    sections = {
        "mfu": mfu_section,
        "memory": memory_section,
        "taper": taper_section,
        "cells": cells_section,
    }
    results: dict[str, list[dict]] = {}

    def run_section(name: str, section: Any, **kw: Any) -> list[dict]:
        """One section; what it raised becomes a note, and the report is rewritten after it,
        so neither an error nor a kill at the lease's end loses the sections before."""
        try:
            rows = section(args, device, clock, **kw)
        except Exception as err:  # reported in the results, the rest goes on
            print("failed", flush=True)
            clock.notes.append(failure_note(f"section {name}", err))
            rows = []
        return rows

    for name in args.sections:
        print(f"== {name}", flush=True)
        results[name] = run_section(name, sections[name])
        write_report(args, device, results, clock)
    if "mfu" in args.sections:
        late = run_section("mfu (late rows)", mfu_section, late=True)
        results["mfu"] = merge_rows(results["mfu"], late, args)
    mfu_cols = ["family", "taper", "mode", "params_M", "tokens/s", "step_ms", "mfu_%"]
    columns = {
        "mfu": [*mfu_cols, "warmup_s", "peak_GiB", "vs uniform"],
        "memory": ["preset", "batch", "seq", "planned_GiB", "peak_GiB", "peak / planned",
                   "dcp_save_s", "dcp_load_s", "dcp_GB"],
        "taper": ["taper", "steps", "loss@1", "loss@10", "loss@25", "loss@50", "final loss",
                  "tokens/s", "wall_s"],
        "cells": ["what", "tokens/s", "wall_s"],
    }  # fmt: skip
    for name, rows in results.items():
        if rows:
            cols = [c for c in columns[name] if any(c in r for r in rows)]
            print(f"\n{name}:\n{table(rows, cols)}")
    for n in clock.notes:
        print(n)
    print(f"wrote {write_report(args, device, results, clock)}")
    return 0


def write_report(
    args: argparse.Namespace, device: torch.device, results: dict[str, list[dict]], clock: Clock
) -> Path:
    """The results so far as `--json` (default benchmarks/results/gpu.json)."""
    result = {
        "benchmark": "gpu",
        "machine": machine_info(),
        "device": str(device),
        "peak_flops": peak_flops(device, args.peak_tflops),
        "batch": args.batch,
        "seq": args.seq,
        "multiple_of": args.multiple_of,
        "warmup": args.warmup,
        "steps": args.steps,
        "rows": results.get("mfu", []),
        "memory": results.get("memory", []),
        "taper": results.get("taper", []),
        "cells": results.get("cells", []),
        "notes": clock.notes,
        "elapsed_s": time.perf_counter() - clock.start,
    }
    return write_json("gpu_smoke" if args.smoke else "gpu", result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())

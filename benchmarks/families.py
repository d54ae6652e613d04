"""Training throughput and peak memory of every family against Transformer++ at the same shape.

    python benchmarks/families.py --sizes tiny small --rounds 5 --threads 1
    python benchmarks/families.py --sizes small --compile --no-memory --families transformer \
        titans-mag titans-mal titans-mac      # torch.compile'd models (compiled vs compiled)
    python benchmarks/families.py ... --compile --compile-scope blocks   # each block's forward
    python benchmarks/families.py ... --profile      # + where each step's time goes
    python benchmarks/families.py --smoke            # seconds

Forward + backward (no optimizer step) on CPU of the `{family}-{size}` presets. Per size the
models run interleaved (A B C ... B C A ...) after one warm-up step, so drift of a shared machine
hits them alike; the table reports the median step time (process CPU seconds, one thread),
tokens/s and the paired ratio to transformer (median over rounds of t_transformer / t_family,
steps measured next to each other). Peak memory: each model runs one step in a fresh subprocess;
"peak" is the growth of the process's peak resident set (VmHWM, reset just before the step) over
the resident set just before it (activations + gradients + allocator overhead; Linux only), and
its ratio to transformer's. That figure depends on the allocator (freed blocks it keeps, when it
returns memory) and varies between runs; "saved MiB" is exact: the bytes of the distinct tensors
autograd keeps for the backward pass during the forward (activations, parameters excluded),
counted with saved-tensor hooks — the part of the peak that grows with batch x sequence.
`--profile` then runs one more step of each model under torch.profiler and splits its CPU time
into batched GEMMs (`bmm`: Titans' memory recurrence), other GEMMs (`mm`), attention, Inductor's
generated kernels and the rest (`op_count.time_by_kind`); with `--compile` the generated code
carries the profiler's kernel markers (`enable_kernel_profile`) in the timed steps too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import interleaved, machine_info, median, paired_ratio, table, write_json
from outputs import output_file

FAMILIES = ["transformer", "hope", "titans-mag", "titans-mal", "titans-mac"]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process (Linux >= 4.0); the peak a
    child inherits from its parent at fork would otherwise hide its own."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _build(name: str, seed: int = 0):
    import torch

    from taperlm.config.presets import get_preset
    from taperlm.models import TaperedLM

    torch.manual_seed(seed)
    cfg = get_preset(name)
    return cfg, TaperedLM(cfg)


def _step(model, idx) -> None:
    out = model(idx[:, :-1], targets=idx[:, 1:])
    out.loss.backward()
    model.zero_grad(set_to_none=True)


def _compiled(model, scope: str):
    """The model as `train.compile` runs it (compiled in the warm-up step): whole (`model`), or
    each block's forward (`blocks`: one graph per distinct layer shape, so Titans' unrolled chunk
    loop compiles once per shape instead of once per layer)."""
    from taperlm.training.model import compile_forward

    shapes = len({(b.__class__, *(p.shape for p in b.parameters())) for b in model.blocks})
    fwd, compiled = compile_forward(model, model, scope, shapes)
    if not compiled:
        raise SystemExit("torch.compile failed (see the warning above); nothing to compare")
    return fwd


def saved_for_backward_bytes(model, idx) -> int:
    """Bytes of the distinct storages autograd saves during one forward (parameters excluded)."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(idx[:, :-1], targets=idx[:, 1:])
    del out
    return sum(seen.values())


def measure_memory(name: str, batch: int, seq: int, threads: int) -> None:
    """Child process: print JSON with the peak-RSS growth of one training step."""
    import torch

    torch.set_num_threads(threads)
    cfg, model = _build(name)
    idx = torch.randint(0, cfg.vocab_size, (batch, seq + 1))
    _step(model, idx)  # first-call allocations (thread pools, kernels) are not the step's
    before = _rss_bytes()
    _reset_peak_rss()
    _step(model, idx)
    peak = _peak_rss_bytes()
    print(json.dumps({"peak_step_bytes": max(0, peak - before), "rss_model_bytes": before}))


def _peak_memory(name: str, args: argparse.Namespace) -> int:
    cmd = [sys.executable, __file__, "--memory-child", name, "--batch", str(args.batch)]
    cmd += ["--seq", str(args.seq), "--threads", str(args.threads)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])["peak_step_bytes"]


def _profile(step: Any) -> dict[str, float]:
    """CPU ms of one more `step` by kind (op_count.time_by_kind)."""
    from torch.profiler import ProfilerActivity, profile

    from op_count import time_by_kind

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return time_by_kind(prof.events())


def run_size(size: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One interleaved comparison of every family at preset size `size`."""
    import torch

    from taperlm.config.budget import flops_per_token, total_params

    steps, cfgs = {}, {}
    for fam in args.families:
        name = f"{fam}-{size}"
        cfg, model = _build(name)
        idx = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1))
        fwd = _compiled(model, args.compile_scope) if args.compile else model
        steps[name], cfgs[name] = (lambda m=fwd, x=idx: _step(m, x)), cfg
    times = interleaved(
        steps,
        args.rounds,
        on_round=lambda r: print(f"{size}: round {r + 1}/{args.rounds}", file=sys.stderr),
    )
    ref = next(iter(steps))
    short = args.families[0]
    peaks = {name: 0 if args.no_memory else _peak_memory(name, args) for name in steps}
    saved = dict.fromkeys(steps, 0)
    for name in [] if args.no_memory else steps:
        cfg, model = _build(name)
        idx = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1))
        saved[name] = saved_for_backward_bytes(model, idx)
    profiles = {name: _profile(step) if args.profile else None for name, step in steps.items()}
    tokens = args.batch * args.seq
    rows = []
    for name, cfg in cfgs.items():
        cpu = median(times[name]["cpu"])
        rows.append(
            {
                "preset": name,
                "params": f"{total_params(cfg) / 1e6:.2f}M",
                "GFLOP/token": flops_per_token(cfg, args.seq) / 1e9,
                "cpu s/step": cpu,
                "tokens/s": tokens / cpu,
                f"speed vs {short}": paired_ratio(times[ref]["cpu"], times[name]["cpu"]),
                f"wall speed vs {short}": paired_ratio(times[ref]["wall"], times[name]["wall"]),
                "peak MiB": peaks[name] / 2**20,
                f"peak vs {short}": peaks[name] / max(1, peaks[ref]),
                "saved MiB": saved[name] / 2**20,
                f"saved vs {short}": saved[name] / max(1, saved[ref]),
                "profile ms": profiles[name],
                "cpu_times": times[name]["cpu"],
                "wall_times": times[name]["wall"],
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="*", default=["tiny"], help="preset sizes (tiny, small)")
    ap.add_argument("--families", nargs="*", default=FAMILIES, help="the first is the reference")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--compile", action="store_true", help="time torch.compile'd models")
    ap.add_argument(
        "--compile-scope",
        choices=["model", "blocks"],
        default="model",
        help="with --compile: the whole model, or each block's forward (train.compile_scope)",
    )
    ap.add_argument("--no-memory", action="store_true", help="skip the peak/saved memory")
    ap.add_argument("--profile", action="store_true", help="split one step's time by kind of op")
    ap.add_argument("--smoke", action="store_true", help="2 families, batch 1 x 32, one round")
    ap.add_argument("--json", type=output_file, help="results file (default results/families.json)")
    ap.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.memory_child:
        measure_memory(args.memory_child, args.batch, args.seq, args.threads)
        return 0
    if args.smoke:
        args.families, args.sizes = [args.families[0], args.families[-1]], args.sizes[:1]
        args.batch, args.seq, args.rounds = 1, 32, 1

    import torch

    torch.set_num_threads(args.threads)
    markers = contextlib.nullcontext()
    if args.profile and args.compile:  # name Inductor's kernels in the profile (changes its code)
        import torch._inductor.config as inductor_config

        markers = mock.patch.object(inductor_config.cpp, "enable_kernel_profile", True)
    with markers:  # restored after, so an in-process caller's later compiles are unchanged
        rows = [row for size in args.sizes for row in run_size(size, args)]
    ref = args.families[0]
    cols = ["preset", "params", "cpu s/step", "tokens/s", f"speed vs {ref}"]
    cols += [f"wall speed vs {ref}", "peak MiB", f"peak vs {ref}", "saved MiB", f"saved vs {ref}"]
    compiled = f", compiled ({args.compile_scope})" if args.compile else ""
    print(
        f"forward+backward{compiled}, batch {args.batch} x seq {args.seq}, {args.threads} "
        f"thread(s), median of {args.rounds} rounds (CPU time); torch {torch.__version__}"
    )
    print(table(rows, cols))
    if args.profile:
        kinds = list(rows[0]["profile ms"])
        print("one profiled step, CPU ms by kind (op_count.time_by_kind)")
        print(table([{"preset": r["preset"], **r["profile ms"]} for r in rows], ["preset", *kinds]))
    if not args.smoke or args.json:
        data = {"machine": machine_info(), "args": vars(args), "rows": rows}
        print(f"results: {write_json('families', data, args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

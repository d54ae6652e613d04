"""Training throughput and peak memory of the tiny presets of every family, side by side.

    python benchmarks/families.py [--batch 4] [--seq 256] [--rounds 5] [--threads 1]

Forward + backward (no optimizer step) on CPU. Models run interleaved (A B C ... A B C ...) after
one warm-up step so drift of a shared machine hits them alike; the table reports the median step
time, tokens/s and the ratio to transformer-tiny at the same shape (d_model, layers, heads,
vocabulary). Peak memory: each model runs one step in a fresh subprocess; "peak" is the growth of
the process's peak resident set (VmHWM, reset just before the step) over the resident set just
before it (activations + gradients + allocator overhead; Linux only).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

PRESETS = [
    "transformer-tiny",
    "hope-tiny",
    "titans-mag-tiny",
    "titans-mal-tiny",
    "titans-mac-tiny",
]


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

    from taperlm.models import TaperedLM
    from taperlm.presets import get_preset

    torch.manual_seed(seed)
    cfg = get_preset(name)
    return cfg, TaperedLM(cfg)


def _step(model, idx) -> None:
    out = model(idx[:, :-1], targets=idx[:, 1:])
    out.loss.backward()
    model.zero_grad(set_to_none=True)


def measure_memory(name: str, batch: int, seq: int, threads: int) -> None:
    """Child process: print JSON with the peak-RSS growth of one training step."""
    import torch

    torch.set_num_threads(threads)
    cfg, model = _build(name)
    idx = torch.randint(0, cfg.vocab_size, (batch, seq + 1))
    before = _rss_bytes()
    _reset_peak_rss()
    _step(model, idx)
    peak = _peak_rss_bytes()
    print(json.dumps({"peak_step_bytes": max(0, peak - before), "rss_model_bytes": before}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--presets", nargs="*", default=PRESETS)
    ap.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        measure_memory(args.memory_child, args.batch, args.seq, args.threads)
        return 0

    import torch

    from taperlm.budget import flops_per_token, total_params

    torch.set_num_threads(args.threads)
    models = {}
    for name in args.presets:
        cfg, model = _build(name)
        idx = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1))
        models[name] = (cfg, model, idx)
        _step(model, idx)  # warm-up
    times: dict[str, list[float]] = {n: [] for n in models}
    for r in range(args.rounds):
        for name, (_, model, idx) in models.items():
            t0 = time.perf_counter()
            _step(model, idx)
            times[name].append(time.perf_counter() - t0)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    memory = {}
    for name in models:
        cmd = [sys.executable, __file__, "--memory-child", name, "--batch", str(args.batch)]
        cmd += ["--seq", str(args.seq), "--threads", str(args.threads)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        memory[name] = json.loads(res.stdout.strip().splitlines()[-1])

    tokens = args.batch * args.seq
    ref = "transformer-tiny" if "transformer-tiny" in models else next(iter(models))
    ref_tps = tokens / statistics.median(times[ref])
    print(
        f"forward+backward, batch {args.batch} x seq {args.seq}, {args.threads} thread(s), "
        f"median of {args.rounds}; torch {torch.__version__}"
    )
    header = (
        f"{'preset':<18}{'params':>9}{'GFLOP/tok*':>11}{'step s':>9}{'tok/s':>9}"
        f"{'vs ' + ref:>22}{'peak MiB':>10}"
    )
    print(header)
    for name, (cfg, _, _) in models.items():
        med = statistics.median(times[name])
        tps = tokens / med
        print(
            f"{name:<18}{total_params(cfg) / 1e6:>8.2f}M{flops_per_token(cfg, args.seq) / 1e9:>11.4f}"
            f"{med:>9.3f}{tps:>9.0f}{tps / ref_tps:>22.3f}"
            f"{memory[name]['peak_step_bytes'] / 2**20:>10.1f}"
        )
    print("* training FLOPs per token from taperlm.budget at this sequence length")
    return 0


if __name__ == "__main__":
    sys.exit(main())

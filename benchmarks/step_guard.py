"""What `train.restore_nonfinite` costs: a training step with and without the step guard.

The guard (training/guard.py) copies the weights and AdamW moments before every optimizer step
and checks them for NaN/inf after it, so that a step that leaves a non-finite value is undone.
For each family the same model is trained two ways side by side (forward + backward + AdamW,
alternating rounds, one process): `plain`, and `guarded` (copy, step, check, as the trainer
does). The ratio guarded/plain is the median over rounds of the paired step times; the guard's
memory is the bytes of its copy buffers (the planner's "step guard" line).

    python benchmarks/step_guard.py                       # *-small presets on CPU, 1 thread
    python benchmarks/step_guard.py --device cuda --preset-size 440m --batch 4 --seq 2048
    python benchmarks/step_guard.py --smoke               # tiny, seconds
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import interleaved, machine_info, median, paired_ratio, table, write_json
from outputs import output_file
from taperlm.config.presets import get_preset, preset_families
from taperlm.runtime.device import resolve_device
from taperlm.training import distributed as D
from taperlm.training.guard import StepGuard
from taperlm.training.model import autocast

FAMILIES = tuple(preset_families())


def make_steps(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str):
    """{plain, guarded}: one optimizer step each, on two copies of `model`."""
    info = D.DistInfo(device=x.device)
    steps = {}
    for name in ("plain", "guarded"):
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.1)
        guard = StepGuard(m, opt, keep_copy=True) if name == "guarded" else None
        params = list(m.parameters())

        def step(m=m, opt=opt, guard=guard, params=params) -> None:
            with autocast(x.device, precision):
                loss = m(x, targets=y).loss
            loss.backward()
            if guard is not None:
                guard.before(params)
            opt.step()
            if guard is not None and guard.check(params, info) is not None:
                guard.undo()
            opt.zero_grad(set_to_none=True)

        steps[name] = (step, guard)
    return steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    p.add_argument("--preset-size", default="small", help="tiny | small | 440m | ...")
    p.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--smoke", action="store_true", help="tiny presets, short sequences, 1 round")
    p.add_argument(
        "--json", type=output_file, default=None, help="results file (default benchmarks/results/)"
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.preset_size, args.batch, args.seq, args.rounds, args.warmup = "tiny", 1, 32, 1, 1
        args.device = "cpu"
    torch.set_num_threads(args.threads)
    device = torch.device(resolve_device(args.device, "--device"))
    precision = args.precision
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"

    rows: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    for family in args.families:
        cfg = get_preset(f"{family}-{args.preset_size}")
        from taperlm.models import TaperedLM

        torch.manual_seed(0)
        model = TaperedLM(cfg).to(device)
        seq = min(args.seq, cfg.context_length)
        x = torch.randint(0, cfg.vocab_size, (args.batch, seq), device=device)
        y = torch.roll(x, -1, dims=1)
        contestants = make_steps(model, x, y, precision)
        del model
        t = interleaved(
            {k: v[0] for k, v in contestants.items()},
            rounds=args.rounds,
            warmup=args.warmup,
            device=device,
        )
        guard = contestants["guarded"][1]
        copy_bytes = sum(b.numel() * b.element_size() for b in guard._copies.values())
        raw[family] = t
        rows.append(
            {
                "family": family,
                "params (M)": sum(p.numel() for p in guard.names) / 1e6,
                "guard copy (MiB)": copy_bytes / 2**20,
                "plain ms": 1e3 * median(t["plain"]["wall"]),
                "guarded ms": 1e3 * median(t["guarded"]["wall"]),
                "ratio (wall)": paired_ratio(t["guarded"]["wall"], t["plain"]["wall"]),
                "ratio (cpu)": paired_ratio(t["guarded"]["cpu"], t["plain"]["cpu"]),
            }
        )
        print(table(rows[-1:], list(rows[-1])), flush=True)
        del contestants
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if rows:
        print(table(rows, list(rows[0])))
    result = {
        "benchmark": "step_guard",
        "machine": machine_info(),
        "device": str(device),
        "precision": precision,
        "preset_size": args.preset_size,
        "batch": args.batch,
        "seq": args.seq,
        "rounds": args.rounds,
        "rows": rows,
        "times_s": raw,
    }
    name = "step_guard" + ("_smoke" if args.smoke else f"_{args.preset_size}_{device.type}")
    print(f"wrote {write_json(name, result, args.json)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Tapered vs uniform step time at an equal budget, for every model family.

For each family and each `multiple_of` (16 and 128 by default) the uniform model and the cosine
tapered model (1.5x -> 0.5x, same parameters and FLOPs) are built from the family's preset and
timed side by side (forward + backward + AdamW, alternating rounds, one process). The ratio
tapered/uniform is the median over rounds of the paired step times; the goal is <= 1.02.

    python benchmarks/taper_overhead.py                       # *-small presets, 1 thread
    python benchmarks/taper_overhead.py --preset-size tiny --families transformer gated
    python benchmarks/taper_overhead.py --smoke               # tiny, seconds

Families that are not importable in this checkout (hope, titans) are skipped with a note.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    interleaved,
    machine_info,
    median,
    paired_ratio,
    raise_recompile_limit,
    table,
    write_json,
)
from outputs import output_file
from taperlm.config import ModelConfig
from taperlm.config.presets import get_preset, preset_families
from taperlm.errors import ConfigError, TaperError
from taperlm.spec.taper import TaperSpec

FAMILIES = tuple(preset_families())  # transformer, gated, hope, titans-mac, ...


def family_config(family: str, size: str, taper: str, multiple_of: int) -> ModelConfig | str:
    """The preset `{family}-{size}` with the given taper, or why it cannot be built."""
    try:
        return get_preset(f"{family}-{size}", taper=TaperSpec.parse(taper, multiple_of=multiple_of))
    except (ConfigError, TaperError, NotImplementedError) as err:
        return str(err)


def build(cfg: ModelConfig) -> torch.nn.Module | None:
    from taperlm.models import TaperedLM

    try:
        return TaperedLM(cfg)
    except (ConfigError, NotImplementedError):
        return None


def make_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)

    def step() -> None:
        model(x, targets=y).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    p.add_argument("--preset-size", default="small", help="tiny | small (CPU-sized presets)")
    p.add_argument("--multiple-of", type=int, nargs="+", default=None, help="default 16 128")
    p.add_argument("--taper", default="cosine", help="taper spec compared with uniform")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--compile", action="store_true", help="torch.compile each model first")
    p.add_argument("--smoke", action="store_true", help="tiny presets, short sequences, 1 round")
    p.add_argument(
        "--json", type=output_file, default=None, help="results file (default benchmarks/results/)"
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.preset_size, args.batch, args.seq, args.rounds, args.warmup = "tiny", 1, 32, 1, 1
        args.multiple_of = args.multiple_of or [16]
    args.multiple_of = args.multiple_of or [16, 128]
    torch.set_num_threads(args.threads)
    if args.compile:
        raise_recompile_limit(256)

    rows: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    skipped: list[str] = []
    for family in args.families:
        for m in args.multiple_of:
            uni = family_config(family, args.preset_size, "uniform", m)
            tap = family_config(family, args.preset_size, args.taper, m)
            if isinstance(uni, str) or isinstance(tap, str):
                skipped.append(f"{family} multiple_of={m}: {uni if isinstance(uni, str) else tap}")
                continue
            torch.manual_seed(0)
            models = {"uniform": build(uni), "tapered": build(tap)}
            if any(v is None for v in models.values()):
                skipped.append(f"{family} (model not implemented)")
                break
            seq = min(args.seq, uni.context_length)
            x = torch.randint(0, uni.vocab_size, (args.batch, seq))
            y = torch.roll(x, -1, dims=1)
            steps = {}
            for name, model in models.items():
                fwd = torch.compile(model) if args.compile else model
                steps[name] = make_step(fwd, x, y)  # type: ignore[arg-type]
            print(f"{family} multiple_of={m}: widths {tap.mlp_widths}", flush=True)
            t = interleaved(steps, rounds=args.rounds, warmup=args.warmup)
            key = f"{family}/m{m}"
            raw[key] = {"uniform_widths": uni.mlp_widths, "tapered_widths": tap.mlp_widths, **t}
            rows.append(
                {
                    "family": family,
                    "multiple_of": m,
                    "distinct widths": len(set(tap.mlp_widths)),
                    "uniform cpu ms": 1e3 * median(t["uniform"]["cpu"]),
                    "tapered cpu ms": 1e3 * median(t["tapered"]["cpu"]),
                    "ratio (cpu)": paired_ratio(t["tapered"]["cpu"], t["uniform"]["cpu"]),
                    "ratio (wall)": paired_ratio(t["tapered"]["wall"], t["uniform"]["wall"]),
                }
            )
    if rows:
        print(table(rows, list(rows[0])))
    for s in skipped:
        print(f"skipped: {s}")
    result = {
        "benchmark": "taper_overhead",
        "machine": machine_info(),
        "preset_size": args.preset_size,
        "taper": args.taper,
        "batch": args.batch,
        "seq": args.seq,
        "compile": args.compile,
        "rounds": args.rounds,
        "rows": rows,
        "skipped": skipped,
        "times_s": raw,
    }
    name = "taper_overhead" + ("_smoke" if args.smoke else f"_{args.preset_size}")
    name += "_compile" if args.compile else ""
    print(f"wrote {write_json(name, result, args.json)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

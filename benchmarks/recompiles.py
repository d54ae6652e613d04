"""How many graphs Dynamo compiles for a tapered stack: whole-model vs per-block (regional)
torch.compile, uniform vs tapered widths, parameter shapes static (Dynamo's default) or allowed
to become dynamic (`force_parameter_static_shapes=False`). Counts only (CPU, the `aot_eager` backend: tracing and autograd without
Inductor's code generation, so it runs in a minute; the graph count is the same with Inductor).

    python benchmarks/recompiles.py [--preset transformer-small] [--json FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import raise_recompile_limit, table, write_json
from outputs import output_file
from taperlm.config.presets import get_preset
from taperlm.models import TaperedLM
from taperlm.spec.taper import TaperSpec


def graphs(preset: str, taper: str, scope: str, dynamic_widths: bool) -> tuple[int, int]:
    """(distinct widths, graphs compiled) for two training steps of `preset`."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch._dynamo.config.force_parameter_static_shapes = not dynamic_widths
    cfg = get_preset(preset, taper=TaperSpec.parse(taper, multiple_of=16))
    torch.manual_seed(0)
    model = TaperedLM(cfg)
    if scope == "blocks":
        for block in model.blocks:
            block.forward = torch.compile(block.forward, backend="aot_eager")
        fwd = model
    else:
        fwd = torch.compile(model, backend="aot_eager")
    x = torch.randint(0, cfg.vocab_size, (2, 32))
    for _ in range(2):
        fwd(x, targets=x).loss.backward()
    return len(set(cfg.mlp_widths or [])), int(counters["stats"]["unique_graphs"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", default="transformer-small")
    p.add_argument("--json", type=output_file, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    raise_recompile_limit(256)
    rows = []
    for taper in ("uniform", "cosine:1.5:0.5"):
        for scope in ("model", "blocks"):
            for dynamic in (False, True):
                widths, n = graphs(args.preset, taper, scope, dynamic)
                rows.append(
                    {
                        "taper": taper,
                        "scope": scope,
                        "parameter shapes": "dynamic" if dynamic else "static",
                        "distinct widths": widths,
                        "graphs": n,
                    }
                )
                print(rows[-1], flush=True)
    print(table(rows, list(rows[0])))
    print(f"wrote {write_json('recompiles', {'preset': args.preset, 'rows': rows}, args.json)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

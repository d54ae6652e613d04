"""Ops per training step of every family, eager and compiled: a machine-independent proxy for GPU
kernel launches.

    python benchmarks/op_count.py --label before        # every family, eager + compile, both shapes
    python benchmarks/op_count.py --shapes tiny --modes eager
    python benchmarks/op_count.py --smoke --modes eager # transformer-tiny, seconds (compile: minutes)

One training step = forward + loss, backward, `clip_grad_norm_` (foreach) and AdamW's step
(`fused=True`, the kernel the trainer uses on CUDA), fp32, batch 1. Shapes: `tiny` is the
`{family}-tiny` preset at its 256-token context; `440m-layer` is one layer of the
`{family}-440m` preset (d_model 1152, 16 heads, vocabulary 32K, the Titans memory and chunk of
that preset) at `--seq` tokens (2048 by default, the context gpu.py trains at). Counts do not
depend on the batch; Titans' counts grow with seq / chunk (one chunk step per 64 tokens).

Two counts per step (the third step; the first two warm up and compile):

- **kernels** (eager and compiled): the ops that do work, read from torch.profiler. An
  Inductor-generated kernel counts one (`torch._inductor.config.cpp.enable_kernel_profile`
  names each); an ATen op counts one when it does work itself, i.e. it is not a view, alias,
  allocation or metadata query (`VIEW_LIKE`, or any op whose schema says it is a view) and no
  ATen op it calls does work. So `linear` is one GEMM, `to` is its `copy_`, `mm` counts once
  although it calls `resolve_conj`, a composite like `rms_norm` counts each of its pointwise ops,
  and a compiled graph counts its fused kernels plus the ATen ops it calls (GEMMs, attention,
  fallbacks) plus everything outside the graph (optimizer, graph breaks). On a GPU each of
  these is (about) one kernel launch. Caveats: Inductor's C++ backend fuses a little more than
  its Triton backend in places, and a foreach / fused optimizer op counts one although CUDA
  launches one kernel per ~chunk of tensors.
- **aten ops** (eager only): every ATen op a TorchDispatchMode sees below autograd, views
  included (the count issue 17 quoted). Compiled code runs eagerly under a dispatch mode, so
  there is no compiled figure of this kind.

The CPU-only hand-written kernels of `taperlm.models.cpu_kernels` are switched off while
counting, so eager counts follow the GPU's code path on every machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, machine_info, raise_recompile_limit, table, write_json
from outputs import output_file
from taperlm.config.presets import get_preset, preset_families

FAMILIES = tuple(preset_families())
SHAPES = ("tiny", "440m-layer")
# ATen ops that launch no kernel: views and aliases, allocations, metadata and host reads.
VIEW_LIKE = frozenset(
    "as_strided view _unsafe_view _reshape_alias reshape t transpose permute expand squeeze "
    "unsqueeze slice select narrow split split_with_sizes chunk unbind alias detach detach_ "
    "resolve_conj resolve_neg empty empty_strided empty_like new_empty new_empty_strided "
    "result_type _local_scalar_dense item lift_fresh size stride is_nonzero numel dim "
    "_has_compatible_shallow_copy_type _version set_ contiguous view_as unflatten flatten "
    "movedim swapaxes diagonal real imag _unsafe_index_put_view".split()
)


# Multi-tensor ops: one kernel (per chunk of tensors) on CUDA, a per-tensor loop on CPU.
UNIT_PREFIXES = ("aten::_foreach_", "aten::_fused_")


def _is_view_like(aten_name: str) -> bool:
    name = aten_name.removeprefix("aten::")
    if name in VIEW_LIKE:
        return True
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return False
    try:
        return any(getattr(packet, o).is_view for o in packet.overloads())
    except (AttributeError, RuntimeError):
        return False


def _is_generated_kernel(name: str) -> bool:
    """An Inductor-generated kernel, as `enable_kernel_profile` (C++) or Triton names it."""
    return "cpp_fused" in name or "triton_" in name or "cpp_kernel" in name


def count_kernels(events: Any) -> tuple[int, dict[str, int]]:
    """(kernels, per-name counts) of profiler `events` (see the module docstring)."""
    view_like: dict[str, bool] = {}
    works_memo: dict[int, bool] = {}
    names: dict[str, int] = {}

    def is_view_like(name: str) -> bool:
        if name not in view_like:
            view_like[name] = _is_view_like(name)
        return view_like[name]

    def works(e: Any) -> bool:  # does e, or an op below it, do work?
        if id(e) not in works_memo:
            works_memo[id(e)] = (
                _is_generated_kernel(e.name)
                or (e.name.startswith("aten::") and not is_view_like(e.name))
                or any(works(c) for c in e.cpu_children)
            )
        return works_memo[id(e)]

    def add(name: str) -> None:
        names[name] = names.get(name, 0) + 1

    def visit(e: Any) -> None:
        if _is_generated_kernel(e.name):
            add("generated kernel")
        elif e.name.startswith(UNIT_PREFIXES):
            add(e.name)  # one multi-tensor kernel; CPU runs it as a per-tensor loop below
        elif e.name.startswith("aten::") and not any(works(c) for c in e.cpu_children):
            if not is_view_like(e.name):
                add(e.name)
        else:
            for c in e.cpu_children:
                visit(c)

    for e in events:
        if e.cpu_parent is None:
            visit(e)
    return sum(names.values()), names


# What a profiled step's time splits into (`time_by_kind`), by the first op on the way down an
# event's callees that names its kind. Batched GEMMs are Titans' memory recurrence (its heads
# batched); the other families' attention runs inside scaled_dot_product_attention.
TIME_KINDS = {
    "bmm": ("aten::bmm", "aten::baddbmm"),
    "mm": ("aten::mm", "aten::addmm", "aten::_addmm_activation"),
    "attention": (
        "aten::_scaled_dot_product",
        "aten::_flash_attention",
        "aten::_efficient_attention",
    ),
}


def time_by_kind(events: Any) -> dict[str, float]:
    """CPU milliseconds of one profiled step by kind: each of TIME_KINDS, "generated" (Inductor's
    kernels, named under `enable_kernel_profile`) and "other" (the rest: pointwise and reduction
    ATen ops, the optimizer, the framework's own time between ops). An event of a kind takes its
    whole time, callees included; any other event keeps its self time and passes the rest down.
    The kinds add up to "total", the time of the top-level events."""
    out = dict.fromkeys([*TIME_KINDS, "generated", "other"], 0.0)

    def visit(e: Any) -> None:
        if _is_generated_kernel(e.name):
            out["generated"] += e.cpu_time_total / 1e3
            return
        for kind, prefixes in TIME_KINDS.items():
            if e.name.startswith(prefixes):
                out[kind] += e.cpu_time_total / 1e3
                return
        children = e.cpu_children
        out["other"] += (e.cpu_time_total - sum(c.cpu_time_total for c in children)) / 1e3
        for c in children:
            visit(c)

    top = [e for e in events if e.cpu_parent is None]
    for e in top:
        visit(e)
    out["total"] = sum(e.cpu_time_total for e in top) / 1e3
    return out


class _AtenCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count += 1
        return func(*args, **(kwargs or {}))


def build(family: str, shape: str, seq: int) -> tuple[Any, int]:
    """(model config, sequence length) of `family` at `shape`."""
    if shape == "tiny":
        cfg = get_preset(f"{family}-tiny")
        return cfg, cfg.context_length
    # Re-resolved at one layer from the unresolved preset, so every per-layer size (MLP width,
    # heads, KV heads, the family's own) is the 440m model's first layer's: the presets are
    # uniform, so one layer of them has the same shapes as each of their 24.
    cfg = dataclasses.replace(get_preset(f"{family}-440m", resolve=False), n_layers=1).resolve()
    return cfg, min(seq, cfg.context_length)


def make_step(cfg: Any, seq: int, mode: str, scope: str) -> Any:
    """One training step of a fresh model (forward, backward, clip, fused AdamW, zero grads)."""
    from taperlm.config import TrainConfig
    from taperlm.models import TaperedLM
    from taperlm.training.optim import build_optimizer

    torch.manual_seed(0)
    model = TaperedLM(cfg)
    # device "cuda" only selects the fused AdamW the trainer uses there (it runs on CPU too)
    opt = build_optimizer(model, TrainConfig(lr=1e-4), torch.device("cuda"))
    fwd: Any = model
    if mode == "compile":
        if scope == "blocks":
            for block in model.blocks:
                block.forward = torch.compile(block.forward)
        else:
            fwd = torch.compile(model)
    idx = torch.randint(0, cfg.vocab_size, (1, seq + 1))

    def step() -> None:
        fwd(idx[:, :-1], targets=idx[:, 1:]).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def measure(family: str, shape: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """Counts of the third step of `family` at `shape` in `mode`."""
    import torch._inductor.config as inductor_config
    from torch.profiler import ProfilerActivity, profile

    cfg, seq = build(family, shape, args.seq)
    with (
        mock.patch("taperlm.models.cpu_kernels.applies", lambda x: False),
        mock.patch.object(inductor_config.cpp, "enable_kernel_profile", True),
    ):
        step = make_step(cfg, seq, mode, args.scope)
        t0 = time.perf_counter()
        step()
        step()
        warm_s = time.perf_counter() - t0
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        kernels, names = count_kernels(prof.events())
        aten = None
        if mode == "eager":
            with _AtenCounter() as counter:
                step()
            aten = counter.count
    if mode == "compile":
        torch._dynamo.reset()
    top = dict(sorted(names.items(), key=lambda kv: -kv[1])[:12])
    return {
        "family": family,
        "shape": shape,
        "mode": mode,
        "seq": seq,
        "kernels": kernels,
        "aten ops": aten,
        "warmup_s": warm_s,
        "top": top,
    }


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """kernels / transformer's kernels at the same shape and mode."""
    ref = {(r["shape"], r["mode"]): r["kernels"] for r in rows if r["family"] == "transformer"}
    for r in rows:
        base = ref.get((r["shape"], r["mode"]))
        r["vs transformer"] = r["kernels"] / base if base else None


def merged(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`old` rows not measured again, then `new`, in table order (shape, mode, family)."""
    done = {(r["family"], r["shape"], r["mode"]) for r in new}
    rows = [r for r in old if (r["family"], r["shape"], r["mode"]) not in done] + new
    order = [(f, s, m) for s in SHAPES for m in ("eager", "compile") for f in FAMILIES]
    return sorted(rows, key=lambda r: order.index((r["family"], r["shape"], r["mode"])))


def save(path: Path, rows: list[dict[str, Any]], args: argparse.Namespace) -> Path:
    add_ratios(rows)
    data = {"machine": machine_info(), "args": vars(args), "rows": rows}
    return write_json(path.stem, data, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES)
    p.add_argument("--modes", nargs="+", default=["eager", "compile"], choices=["eager", "compile"])
    p.add_argument("--scope", default="model", choices=["model", "blocks"], help="compile scope")
    p.add_argument("--seq", type=int, default=2048, help="tokens of the 440m-layer shape")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--label",
        default=None,
        help="results file op_count_<label>.json (default: op_count_latest.json)",
    )
    p.add_argument("--smoke", action="store_true", help="transformer-tiny, eager + compile")
    p.add_argument(
        "--json", type=output_file, default=None, help="results file (overrides --label)"
    )
    p.add_argument(
        "--merge", action="store_true", help="keep the file's other rows (runs done in parts)"
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.families, args.shapes = ["transformer"], ["tiny"]
    torch.set_num_threads(args.threads)
    raise_recompile_limit(64)
    path = Path(args.json) if args.json else RESULTS_DIR / f"op_count_{args.label or 'latest'}.json"
    keep = not args.smoke or args.json  # write results
    old = json.loads(path.read_text("utf-8"))["rows"] if args.merge and path.exists() else []
    rows: list[dict[str, Any]] = []
    for shape in args.shapes:
        for mode in args.modes:
            for family in args.families:
                print(f"{family} {shape} {mode} ...", end=" ", flush=True, file=sys.stderr)
                rows.append(measure(family, shape, mode, args))
                print(f"{rows[-1]['kernels']:,} kernels", flush=True, file=sys.stderr)
                if keep:  # after every row, so a long run keeps what it measured
                    save(path, merged(old, rows), args)
    rows = merged(old, rows)
    add_ratios(rows)
    cols = ["family", "shape", "mode", "seq", "kernels", "vs transformer", "aten ops", "warmup_s"]
    print(
        f"ops per training step (batch 1, fp32, compile scope {args.scope}); torch {torch.__version__}"
    )
    print(table(rows, cols))
    if keep:
        print(f"results: {save(path, rows, args)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Timing helpers shared by the benchmark scripts.

Every comparison runs in one process and interleaves its contestants (A B A B ...) after a
warm-up, so drift of a shared machine's speed hits all of them alike; we report medians.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from outputs import RESULTS_DIR, STAMP, output_file, write_output


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on (CPU model, cores, torch, threads, GPU if any)."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def raise_recompile_limit(limit: int) -> None:
    """Let Dynamo keep `limit` compiled versions per code object (default 8): with per-layer
    widths, a compiled block function sees one shape per distinct width and would otherwise fall
    back to eager silently after the eighth."""
    import torch._dynamo

    for key in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, key):
            setattr(torch._dynamo.config, key, limit)
    for key in ("accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, key):
            setattr(torch._dynamo.config, key, max(limit, getattr(torch._dynamo.config, key)))


def sync(device: torch.device | str) -> None:
    """Wait for queued GPU work so wall-clock timings cover it (no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def add_gpu_benchmark_arguments(p: Any) -> None:
    """The options every GPU benchmark shares (see `gpu_or_smoke` for what --smoke sets)."""
    p.add_argument("--size", default="440m")
    p.add_argument("--multiple-of", type=int, default=128, help="rounding of tapered widths")
    p.add_argument("--batch", type=int, default=8, help="micro-batch (scale.py: the largest tried)")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--budget-s", type=float, default=420.0, help="skip the rest after this")
    p.add_argument("--peak-tflops", type=float, default=None, help="override the peak table")
    p.add_argument("--smoke", action="store_true", help="tiny presets on CPU, seconds")
    p.add_argument(
        "--json", type=output_file, default=None, help="results file (default benchmarks/results/)"
    )


def gpu_or_smoke(args: Any, script: str) -> torch.device | None:
    """The device of a GPU benchmark: the CPU with `--smoke` (tiny presets, one thread, 1 warm-up
    and 1 timed step of batch 2 x 32), else the first GPU with TF32 matmuls, else None (with a
    message saying to use --smoke)."""
    import sys

    if args.smoke:
        args.size, args.batch, args.seq, args.warmup, args.steps = "tiny", 2, 32, 1, 1
        args.multiple_of = 16
        torch.set_num_threads(1)
        return torch.device("cpu")
    if torch.cuda.is_available():
        torch.cuda.set_device(0)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        return torch.device("cuda", 0)
    print(f"{script}: no CUDA device; use --smoke to check the code path on CPU", file=sys.stderr)
    return None


def warm_and_time(
    step: Callable[[], Any], warmup: int, steps: int, device: torch.device
) -> tuple[float, float]:
    """(seconds of `warmup` steps, seconds per step of the next `steps`), synchronised around
    each region; the CUDA peak-memory counter is reset first."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    sync(device)
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return warm_s, (time.perf_counter() - t0) / steps


def interleaved(
    steps: dict[str, Callable[[], Any]],
    rounds: int,
    steps_per_round: int = 1,
    warmup: int = 1,
    device: torch.device | str = "cpu",
    on_round: Callable[[int], None] | None = None,
) -> dict[str, dict[str, list[float]]]:
    """Seconds per step of each contestant, measured in alternating rounds.

    Each round runs every contestant for `steps_per_round` steps (timed together, divided by
    the count) in a rotating order, so no contestant always follows the same one. Returns
    `{name: {"wall": [...], "cpu": [...]}}`: wall-clock and process CPU seconds per step. On a
    shared CPU machine with one torch thread, CPU time is the figure that other processes
    disturb least (wall time also counts the time we were descheduled).
    """
    names = list(steps)
    for _ in range(warmup):
        for name in names:
            steps[name]()
    sync(device)
    times: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(steps_per_round):
                steps[name]()
            sync(device)
            times[name]["wall"].append((time.perf_counter() - t0) / steps_per_round)
            times[name]["cpu"].append((time.process_time() - c0) / steps_per_round)
        if on_round is not None:
            on_round(r)
    return times


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def paired_ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of a[i] / b[i] (pairs measured next to each other)."""
    return statistics.median(x / y for x, y in zip(a, b))


def write_json(name: str, data: dict[str, Any], out: str | Path | None = None) -> Path:
    """Write results to `out` (or benchmarks/results/<name>.json), stamped as ours, and return
    the path; a file that is not ours is refused (`output_problem`)."""
    path = Path(out) if out else RESULTS_DIR / f"{name}.json"
    return write_output(
        path, json.dumps({"written_by": STAMP, **data}, indent=2, default=str) + "\n"
    )


def failure_note(label: str, err: BaseException) -> str:
    """A GPU benchmark's note for a part that raised: the traceback goes to stderr, the note
    (`label: failed (Type: message)`) into the results, and the command goes on with the next
    part. A lease of a GPU is minutes long: one broken part must not cost the others' numbers
    (2026-12-04: a DCP error in gpu.py's memory section lost the mfu rows measured before it)."""
    import sys
    import traceback

    traceback.print_exception(type(err), err, err.__traceback__, file=sys.stderr)
    message = " ".join(str(err).split())[:300]
    return f"{label}: failed ({type(err).__name__}: {message})"


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A plain fixed-width text table of `rows` restricted to `columns`."""

    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths]), *map(line, cells)])

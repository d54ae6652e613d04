"""What a run measures: metrics.jsonl (written and read), the throughput clock, model-FLOPs
utilisation (MFU), the validation loss, and the loss curve drawn as RUN/loss.png.

MFU = tokens_per_s x flops_per_token / (world_size x peak FLOP/s per device), with
flops_per_token from `taperlm.config.budget.flops_per_token` (6N + attention, forward + backward) and the
peak from `PEAK_FLOPS` below: dense bf16 tensor-core throughput per device from the vendors' data
sheets (no sparsity). On CPU there is no meaningful peak, so MFU is null unless
`train.peak_flops` gives one.

The validation loss is the mean next-token loss over the first tokens of a data dir's val split:
one function for the trainer's periodic evaluations and for `taperlm compare`'s final numbers, so
both measure the same thing (non-overlapping windows of `seq_len`, see
`taperlm.data.loader.val_batches`).

Torch-free at import: `taperlm compare` reads metrics.jsonl before it imports torch.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taperlm.config import RunConfig
from taperlm.config.budget import flops_per_token
from taperlm.errors import MalformedFileError, TrainingError
from taperlm.files.io import atomic_output, atomic_write_text, open_append, open_regular, parse_json

if TYPE_CHECKING:
    import torch

# Dense bf16 peak FLOP/s per device, matched as a substring of torch.cuda.get_device_name().
PEAK_FLOPS: dict[str, float] = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
}


def peak_flops(device_type: str, device_name: str | None, override: float | None) -> float | None:
    """Peak FLOP/s of one device: `override` when given, else the table for CUDA, else None."""
    if override:
        return float(override)
    if device_type != "cuda" or not device_name:
        return None
    for key, value in PEAK_FLOPS.items():
        if key.lower() in device_name.lower():
            return value
    return None


def mfu(
    tokens_per_s: float, flops_per_token: int, peak: float | None, world_size: int
) -> float | None:
    """Fraction of the peak achieved (None when the peak is unknown)."""
    if not peak or tokens_per_s <= 0:
        return None
    return tokens_per_s * flops_per_token / (peak * world_size)


def model_flops_per_token(run: RunConfig) -> int | None:
    """Training FLOPs per token of the run's model at its seq_len (None for a family that does
    not count them)."""
    try:
        return flops_per_token(run.model, run.train.seq_len)
    except (NotImplementedError, KeyError):
        return None


class Throughput:
    """Tokens/s of the training steps: per logging window (evaluation and checkpoint time
    excluded) and over the whole run (step time only)."""

    def __init__(self) -> None:
        self.window_start, self.window_tokens = time.perf_counter(), 0
        self.step_seconds, self.step_tokens = 0.0, 0

    def step(self, seconds: float, tokens: int) -> None:
        self.step_seconds += seconds
        self.step_tokens += tokens
        self.window_tokens += tokens

    def window_rate(self) -> float:
        """Tokens/s since the last call (or the start), and start a new window."""
        now = time.perf_counter()
        rate = self.window_tokens / max(now - self.window_start, 1e-9)
        self.window_start, self.window_tokens = now, 0
        return rate

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent in the block does not count against the current window."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.window_start += time.perf_counter() - t0

    def mean_rate(self) -> float:
        return self.step_tokens / self.step_seconds if self.step_seconds > 0 else 0.0


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as strings so a bad step stays visible and parseable."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsWriter:
    """Appends one JSON object per line to RUN/metrics.jsonl (rank 0 only), flushed each line so
    a killed run keeps everything it logged."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps({k: _clean(v) for k, v in record.items()})
        with open_append(self.path, "metrics file") as f:
            f.write(line + "\n")
            f.flush()

    def truncate_after(self, step: int) -> None:
        """Drop lines logged after `step` (work lost by a crash that is being redone on resume),
        rewriting the file atomically. A damaged line other than a torn last one stops with a
        TrainingError naming it: the rewrite would otherwise drop what it cannot read."""
        if not self.path.exists():
            return
        kept = [r for r in read_metrics(self.path, strict=True) if r["step"] <= step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept), fsync=True)


def read_metrics(path: str | Path, strict: bool = False) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl; a torn last line (killed mid-write) is ignored. Other
    lines that are not a JSON object with integer `step` and `tokens` are skipped, or with `strict` raise
    TrainingError naming the line."""
    records = []
    p = Path(path)
    if not p.exists():
        return records
    with open_regular(p, what="metrics file") as f:  # a FIFO there would block the resume
        lines = f.read().split(b"\n")
    last = max((i for i, x in enumerate(lines) if x.strip()), default=-1)
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            record = parse_json(raw.decode("utf-8"), what="the line")
            bad = None if _is_record(record) else "not an object with integer 'step' and 'tokens'"
        except (UnicodeDecodeError, MalformedFileError) as err:
            if number - 1 == last and not raw.endswith(b"}"):
                continue  # torn by a kill in the middle of the write
            bad = f"{type(err).__name__}: {err}"
        if bad is None:
            records.append(record)
        elif strict:
            raise TrainingError(
                f"{p}, line {number}, is damaged ({bad}); resuming rewrites this log and would "
                f"lose it. Fix or delete that line, or move {p.name} aside (the run then starts "
                "a new log), and resume again"
            )
    return records


def _is_record(record: Any) -> bool:
    if not isinstance(record, dict):
        return False
    return all(
        isinstance(record.get(k), int) and not isinstance(record.get(k), bool)
        for k in ("step", "tokens")
    )


def validation_loss(
    model: torch.nn.Module,
    data_dir: str | Path,
    seq_len: int,
    batch_size: int,
    max_tokens: int | None = None,
    precision: str = "fp32",
    device: torch.device | None = None,
) -> tuple[float, int]:
    """(mean loss, tokens scored) over the first `max_tokens` tokens of the val split (None =
    all of it) on `device` (default: the model's); the loss is summed in float64. The model's
    mode (eval/train) is the caller's."""
    import torch  # lazy: this module is read torch-free (see above)

    from taperlm.data.loader import val_batches  # lazy: torch, as above
    from taperlm.training.model import autocast  # lazy: torch, as above

    device = device or next(model.parameters()).device
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in val_batches(data_dir, seq_len, batch_size, max_tokens):
            x, y = x.to(device), y.to(device)
            with autocast(device, precision):
                loss = model(x, targets=y).loss
            total += float(loss.double()) * y.numel()
            count += y.numel()
    return (total / count if count else float("nan")), count


def plot_run(run_dir: str | Path, path: str | Path | None = None) -> Path:
    """Draw RUN/metrics.jsonl (train and validation loss vs tokens) into a PNG (default
    RUN/loss.png, matplotlib Agg) and return its path."""
    import matplotlib  # lazy: heavy, only at the end of a run; the backend precedes pyplot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen

    run = Path(run_dir)
    out = Path(path) if path else run / "loss.png"
    records = read_metrics(run / "metrics.jsonl")
    train = [(r["tokens"], r["loss"]) for r in records if _finite(r.get("loss"))]
    val = [(r["tokens"], r["val_loss"]) for r in records if _finite(r.get("val_loss"))]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if train:
        ax.plot(*zip(*train), label="train loss", lw=1.2)
    if val:
        ax.plot(*zip(*val), "o-", label="validation loss", lw=1.5, ms=3)
    ax.set_xlabel("tokens")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(run.name)
    ax.grid(alpha=0.3)
    if train or val:
        ax.legend()
    fig.tight_layout()
    try:
        with atomic_output(out) as tmp:
            fig.savefig(tmp, dpi=120, format="png")
    finally:
        plt.close(fig)
    return out


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)

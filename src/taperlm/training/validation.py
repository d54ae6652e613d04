"""The validation loss: mean next-token loss over the first tokens of a data dir's val split.

One function for the trainer's periodic evaluations and for `taperlm compare`'s final numbers,
so both measure the same thing (non-overlapping windows of `seq_len`, see
`taperlm.data.loader.val_batches`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from taperlm.data.loader import val_batches


def uses_bf16(device: torch.device, precision: str) -> bool:
    """Whether a run computes in bf16: precision bf16, or auto on CUDA."""
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast for precision bf16, or auto on CUDA; nothing otherwise (fp32)."""
    if uses_bf16(device, precision):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
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
    device = device or next(model.parameters()).device
    total, count = 0.0, 0
    for x, y in val_batches(data_dir, seq_len, batch_size, max_tokens):
        x, y = x.to(device), y.to(device)
        with autocast(device, precision):
            loss = model(x, targets=y).loss
        total += float(loss.double()) * y.numel()
        count += y.numel()
    return (total / count if count else float("nan")), count

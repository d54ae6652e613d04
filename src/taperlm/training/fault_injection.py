"""Fault injection for tests only: `TAPERLM_INJECT_NAN_AT_STEP` makes chosen steps non-finite
(loss and every gradient NaN), so the tests of skipped steps, divergence stops and checkpoints
that refuse NaN can run the real trainer. Unset (always, outside tests) it does nothing."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

NAN_ENV = "TAPERLM_INJECT_NAN_AT_STEP"


def poisoned_steps() -> Callable[[int], bool]:
    """TAPERLM_INJECT_NAN_AT_STEP="3" | "3,5" | "3-" (from step 3 on; 1-based) -> a predicate
    on the 1-based step number."""
    raw = os.environ.get(NAN_ENV, "").strip()
    steps: set[int] = set()
    start = None
    for part in filter(None, (p.strip() for p in raw.split(","))):
        if part.endswith("-"):
            start = int(part[:-1])
        else:
            steps.add(int(part))
    return lambda n: n in steps or (start is not None and n >= start)


def poison(loss_sum: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    """The step's loss as NaN, and NaN in every gradient of `model`."""
    for p in model.parameters():
        if p.grad is not None:
            p.grad.fill_(float("nan"))
    return loss_sum * float("nan")

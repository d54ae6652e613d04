"""AdamW parameter groups, per-parameter update periods (`PeriodicOptimizer`), and the LR
schedules (warmup + cosine, warmup-stable-decay).

Weight decay applies to matrices (parameters with >= 2 dimensions) except embeddings; embeddings,
norm gains, biases and every other 1-D parameter get none. Embedding weights are recognised by
the module that owns them (`nn.Embedding`); a head tied to the embedding shares that parameter and
is therefore not decayed either.

Update periods: a parameter with an integer attribute `update_period > 1` (Hope's CMS levels set
it) is stepped only every `update_period` optimizer steps; in between its gradients keep
accumulating in `.grad` (the sum over the period, as in Nested Learning's multi-timescale
update). Parameters are grouped by (decay, period), and `PeriodicOptimizer` wraps AdamW so that
its `step()` updates only the groups due and leaves the others' gradients accumulating: the
trainer's step is the same for every family.

The attribute lives on the Parameter object, and wrappers replace Parameters (FSDP2's
`fully_shard` swaps in DTensors; loaders build new ones). So the trainer reads the periods *by
name* with `parameter_periods` from the plain model before wrapping it, and groups the wrapped
model's parameters by those names (`param_groups(..., periods=...)`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from taperlm.config import TrainConfig
from taperlm.config.train import LRScheduleName


def update_period(param: nn.Parameter) -> int:
    """The optimizer-step period of a parameter (1 unless it carries `update_period`)."""
    period = getattr(param, "update_period", 1)
    if not isinstance(period, int) or isinstance(period, bool) or period < 1:
        raise ValueError(f"update_period must be a positive int, got {period!r}")
    return period


def _embedding_param_ids(model: nn.Module) -> set[int]:
    return {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}


def parameter_periods(model: nn.Module) -> dict[str, int]:
    """{parameter name: update period} of every parameter whose period is > 1."""
    return {n: update_period(p) for n, p in model.named_parameters() if update_period(p) > 1}


def param_groups(
    model: nn.Module, weight_decay: float, periods: dict[str, int] | None = None
) -> list[dict]:
    """AdamW groups keyed by (decay, period), in a deterministic order.

    `periods`: update periods by parameter name (default: read from the parameters' own
    `update_period`); pass what `parameter_periods` read before the model was wrapped.
    Every group carries `period` (steps between updates) and `decay` (bool) besides the usual
    AdamW keys, so a saved optimizer state names its grouping.
    """
    periods = parameter_periods(model) if periods is None else periods
    embeddings = _embedding_param_ids(model)
    groups: dict[tuple[bool, int], list[nn.Parameter]] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        decay = p.dim() >= 2 and id(p) not in embeddings
        groups.setdefault((decay, periods.get(name, 1)), []).append(p)
    out = []
    for (decay, period), params in sorted(groups.items(), key=lambda kv: (kv[0][1], not kv[0][0])):
        out.append(
            {
                "params": params,
                "weight_decay": weight_decay if decay else 0.0,
                "decay": decay,
                "period": period,
            }
        )
    return out


def build_optimizer(
    model: nn.Module,
    cfg: TrainConfig,
    device: torch.device,
    periods: dict[str, int] | None = None,
) -> torch.optim.AdamW:
    """AdamW over `param_groups` (`periods` as there); the fused kernel on CUDA, the default
    (foreach) one on CPU."""
    kwargs: dict = {}
    if device.type == "cuda":
        kwargs["fused"] = True
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay, periods),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        **kwargs,
    )


class PeriodicOptimizer:
    """An optimizer whose parameter groups take an update every `period` optimizer steps (the
    `period` of each group of `param_groups`; Hope's CMS levels). `due(step)` names the
    parameters optimizer step `step` updates; `step()` then updates only those: the other groups'
    gradients are hidden from the wrapped optimizer meanwhile and keep accumulating, and the due
    groups' gradients are consumed (set to None). With every period 1 it is the wrapped optimizer.
    A group with period p steps after steps p-1, 2p-1, ... (0-based), on p accumulated gradients.
    """

    def __init__(
        self, inner: torch.optim.Optimizer, periodic: list[tuple[str, nn.Parameter]]
    ) -> None:
        self.inner = inner  # the optimizer that updates (AdamW): its state is what checkpoints hold
        # (name, parameter) of every parameter with a period > 1: their gradients still
        # accumulating are part of a checkpoint
        self.periodic = periodic
        self._due: list[dict[str, Any]] = list(inner.param_groups)  # groups of the next `step()`

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @property
    def state(self) -> dict[Any, Any]:
        return self.inner.state

    def due(self, step: int) -> list[torch.Tensor]:
        """The parameters (those with a gradient) that optimizer step `step` (0-based) updates:
        the groups whose period divides step + 1; `step()` updates these."""
        self._due = [g for g in self.param_groups if (step + 1) % g.get("period", 1) == 0]
        return [p for g in self._due for p in g["params"] if p.grad is not None]

    def step(self) -> None:
        """Update the groups `due` named; the others' gradients are left as they were."""
        due = {id(g) for g in self._due}
        hidden = {}
        for g in self.param_groups:
            if id(g) not in due:
                for p in g["params"]:
                    if p.grad is not None:
                        hidden[p] = p.grad
                        p.grad = None
        try:
            self.inner.step()
        finally:
            for p, grad in hidden.items():
                p.grad = grad
        for g in self._due:
            for p in g["params"]:
                p.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every gradient, the accumulating ones included (a skipped step)."""
        self.inner.zero_grad(set_to_none=set_to_none)


# The shape after the warmup, as a checkpoint's provenance names it (`LRSchedule.kind`).
LRKind = Literal["warmup_cosine", "warmup_stable_decay"]
SCHEDULE_KINDS: dict[LRScheduleName, LRKind] = {
    "cosine": "warmup_cosine",
    "wsd": "warmup_stable_decay",
}


@dataclass(frozen=True)
class LRSchedule:
    """Linear warmup from 0 to `lr` over `warmup_steps`, then (`kind` warmup_cosine) cosine
    decay to `min_lr_ratio*lr` at `total_steps`, or (warmup_stable_decay) `lr` held until the
    last `decay_steps`, which decay linearly to `min_lr_ratio*lr` at the last step; flat after.
    A pure function of the step, so resuming needs only the step count; the fields are saved
    for provenance. A WSD schedule's LR before `decay_start` does not depend on `total_steps`:
    a longer run's state there is this run's (`taperlm.training.run_dir.check_branch`)."""

    lr: float
    warmup_steps: int
    total_steps: int
    min_lr_ratio: float
    kind: LRKind = "warmup_cosine"
    decay_steps: int = 0

    @classmethod
    def from_config(cls, cfg: TrainConfig, total_steps: int) -> LRSchedule:
        warmup = min(total_steps, math.ceil(cfg.warmup_tokens / cfg.batch_tokens))
        kind = SCHEDULE_KINDS[cfg.schedule]
        decay = 0
        if cfg.schedule == "wsd":
            # the decay never eats into the warmup: at least one step, at most what follows it
            decay = min(max(1, math.ceil(cfg.decay_fraction * total_steps)), total_steps - warmup)
        return cls(cfg.lr, warmup, total_steps, cfg.min_lr_ratio, kind, max(0, decay))

    @property
    def decay_start(self) -> int:
        """The first step whose LR is below the plateau (cosine: the end of the warmup)."""
        if self.kind == "warmup_stable_decay":
            return self.total_steps - self.decay_steps
        return self.warmup_steps

    def __call__(self, step: int) -> float:
        """LR used by optimizer step `step` (0-based)."""
        if self.warmup_steps > 0 and step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        floor = self.min_lr_ratio * self.lr
        if self.kind == "warmup_stable_decay":
            if step < self.decay_start or self.decay_steps == 0:
                return self.lr
            # step decay_start + k uses (k + 1) / decay_steps of the way down: the last step
            # trains at the floor
            done = min(1.0, (step - self.decay_start + 1) / self.decay_steps)
            return self.lr - (self.lr - floor) * done
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return floor + 0.5 * (self.lr - floor) * (1.0 + math.cos(math.pi * progress))

    def state_dict(self) -> dict:
        out = {
            "kind": self.kind,
            "lr": self.lr,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "min_lr_ratio": self.min_lr_ratio,
        }
        if self.kind == "warmup_stable_decay":
            out["decay_steps"] = self.decay_steps
        return out


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr

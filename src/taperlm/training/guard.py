"""Non-finite weights are never kept: an optimizer step whose loss and gradient were finite can
still leave NaN/inf in the parameters or the optimizer state (a learning rate or weight decay
large enough to overflow, an eps that divides by zero). `StepGuard` copies what a step is about
to change, checks it after the step and puts the copy back when anything is not finite, so the
step is skipped exactly like one with a non-finite loss. Without the copy
(`train.restore_nonfinite: false`) such a step stops the run instead.

`first_nonfinite` is also what the trainer checks before writing a checkpoint, so no non-finite
state is ever saved. Under FSDP every rank checks its own shards and the ranks agree on the
verdict (one all-reduce).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from taperlm.training import distributed as D


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (FSDP2), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _state_tensors(
    optimizer: torch.optim.Optimizer, p: torch.Tensor
) -> Iterator[tuple[str, torch.Tensor]]:
    for key, value in optimizer.state.get(p, {}).items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            yield key, value


def first_nonfinite(
    named: Iterable[tuple[str, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    info: D.DistInfo,
) -> str | None:
    """Name of the first parameter (or `param:state` entry, e.g. `w:exp_avg_sq`) holding a
    NaN or inf on any rank, or None. Collective: every rank must call it."""
    names: list[str] = []
    tensors: list[torch.Tensor] = []
    for name, p in named:
        names.append(name)
        tensors.append(_local(p.detach()))
        for key, value in _state_tensors(optimizer, p):
            if key != "step":  # a counter, not a moment
                names.append(f"{name}:{key}")
                tensors.append(_local(value))
    bad = -1
    if tensors:
        by_device: dict[torch.device, list[int]] = {}
        for i, t in enumerate(tensors):
            if t.numel():
                by_device.setdefault(t.device, []).append(i)
        for idx in by_device.values():
            norms = torch._foreach_norm([tensors[i].float() for i in idx], float("inf"))
            finite = torch.isfinite(torch.stack(norms)).cpu()
            if not bool(finite.all()):
                first = idx[int((~finite).nonzero()[0])]
                bad = first if bad < 0 else min(bad, first)
    if info.enabled:  # every rank's verdict: the smallest bad index anywhere (or none)
        flag = torch.tensor([float(bad if bad >= 0 else len(names))], device=info.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        bad = int(flag.item())
        bad = bad if bad < len(names) else -1
    return names[bad] if bad >= 0 else None


class StepGuard:
    """Copy, check and restore the parameters an optimizer step updates (and their state)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, keep_copy: bool):
        self.optimizer = optimizer
        self.keep_copy = keep_copy
        self.names = {p: n for n, p in model.named_parameters()}
        self._copies: dict[int, torch.Tensor] = {}  # id(live tensor) -> reused buffer
        self._taken: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._fresh: list[torch.Tensor] = []  # params that had no optimizer state yet

    def _buffer(self, owner: object, t: torch.Tensor) -> torch.Tensor:
        """The copy buffer of a persistent tensor object (a parameter, a state entry), reused
        from step to step."""
        buf = self._copies.get(id(owner))
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype or buf.device != t.device:
            buf = self._copies[id(owner)] = torch.empty_like(t)
        return buf

    @torch.no_grad()
    def before(self, params: list[torch.Tensor]) -> None:
        """Copy `params` and their optimizer state (when keeping a copy)."""
        self._taken, self._fresh = [], []
        if not self.keep_copy:
            return
        for p in params:
            owners: list[tuple[object, torch.Tensor]] = [(p, _local(p.detach()))]
            state = self.optimizer.state.get(p)
            if not state:
                self._fresh.append(p)
            else:
                owners += [(v, _local(v)) for v in state.values() if isinstance(v, torch.Tensor)]
            for owner, t in owners:
                buf = self._buffer(owner, t)
                buf.copy_(t)
                self._taken.append((t, buf))

    def check(self, params: list[torch.Tensor], info: D.DistInfo) -> str | None:
        """After the step: the first non-finite parameter or state entry (None if all finite)."""
        return first_nonfinite(((self.names.get(p, "?"), p) for p in params), self.optimizer, info)

    @torch.no_grad()
    def undo(self) -> None:
        """Put back what `before` copied; drop optimizer state the step created."""
        for live, buf in self._taken:
            live.copy_(buf)
        for p in self._fresh:
            self.optimizer.state.pop(p, None)
        self._taken, self._fresh = [], []


def divergence_cause(model: torch.nn.Module, skipped: int, steps: int) -> str:
    """What to change when a run stops on non-finite steps, from what the run shows rather than
    a guess: a non-finite buffer names itself; a loss that was never finite on the untouched
    initial weights (`skipped` >= `steps`) is not the learning rate's doing; otherwise the
    updates diverged."""
    for name, buf in model.named_buffers():
        if buf.is_floating_point() and not bool(torch.isfinite(buf).all()):
            return (
                f"The model's buffer {name} holds NaN/inf (it is computed from the config, "
                "e.g. the RoPE tables from model.rope_theta): fix the model config"
            )
    if skipped >= steps:  # every step skipped: the weights are the initial ones
        return (
            "Every step so far was non-finite on the initial weights (no update was applied, "
            "so train.lr is not the cause): check model.init_std and model.norm_eps, try "
            "train.precision fp32, and check the data"
        )
    return "Lower train.lr, check the data, or raise train.max_bad_steps"

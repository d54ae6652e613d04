"""Process-group setup under torchrun and model wrapping (DDP, FSDP2), plus full (unsharded)
state dicts so checkpoints are portable between 1 process, DDP and FSDP.

torchrun exports RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (also across nodes);
without them the run is a single process and nothing here touches torch.distributed.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import distribute_tensor
from torch.nn.parallel import DistributedDataParallel as DDP

from taperlm.errors import ConfigError
from taperlm.runtime.device import resolve_device


@dataclass
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def pick_device(requested: str, local_rank: int = 0) -> torch.device:
    """`train.device` (checked to exist); on CUDA, the GPU of this local rank."""
    if resolve_device(requested, "train.device") == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))


def init_distributed(requested_device: str) -> DistInfo:
    """Join the torchrun process group if launched by torchrun (nccl on CUDA, gloo on CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(requested_device, local_rank)
    if world <= 1:
        return DistInfo(device=device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        device_id = device if backend == "nccl" else None
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        if attempt is None:
            dist.init_process_group(backend=backend, device_id=device_id)
        else:
            # After `torchrun --max-restarts` restarts the workers, the rendezvous store can still
            # hold the previous attempt's connection keys, and a new rank may read a dead peer's
            # address (gloo: "connectFullMesh ... Connection refused"). Scope every key by attempt.
            store, rank, world = next(dist.rendezvous("env://"))
            store = dist.PrefixStore(f"taperlm/attempt_{attempt}", store)
            dist.init_process_group(
                backend=backend, store=store, rank=rank, world_size=world, device_id=device_id
            )
    return DistInfo(rank, local_rank, world, device, backend)


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def wrap_model(
    model: nn.Module, parallel: str, info: DistInfo, mixed_precision: Any = None
) -> nn.Module:
    """The module to call for training forward passes.

    One process: the model itself. DDP: a DistributedDataParallel wrapper (the model is
    unchanged). FSDP2: `fully_shard` on every block, then on the root, with `mixed_precision`
    (an FSDP `MixedPrecisionPolicy`, or None for fp32); the model is sharded in place (also
    while still on the meta device) and returned.
    """
    if parallel not in ("ddp", "fsdp"):
        raise ConfigError(f"train.parallel {parallel!r} is unknown; choose ddp or fsdp")
    if not info.enabled:
        return model
    if parallel == "ddp":
        ids = [info.device.index] if info.device.type == "cuda" else None
        return DDP(model, device_ids=ids)
    return shard_model(model, mixed_precision)


def shard_model(model: nn.Module, mixed_precision: Any = None) -> nn.Module:
    """FSDP2: `fully_shard` every block, then the root, over the default process group (also a
    group of one rank: the same code path, e.g. for mixed precision on one GPU)."""
    policy = mixed_precision or MixedPrecisionPolicy()
    for block in model.blocks:  # type: ignore[attr-defined]
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def mixed_precision_policy(param_dtype: torch.dtype, reduce_dtype: torch.dtype) -> Any:
    """FSDP2's policy: gather parameters for compute in `param_dtype`, reduce-scatter gradients
    in `reduce_dtype`; the sharded parameters, gradients and optimizer state stay fp32."""
    # None = "as stored" (fp32); a None reduce dtype would follow a bf16 param dtype.
    param = None if param_dtype == torch.float32 else param_dtype
    reduce = None if param is None and reduce_dtype == torch.float32 else reduce_dtype
    return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce)


def no_sync(wrapped: nn.Module, model: nn.Module, sync: bool) -> AbstractContextManager:
    """Skip the gradient all-reduce on accumulation micro-steps that are not the last one."""
    if hasattr(wrapped, "no_sync") and not sync:
        return wrapped.no_sync()  # DDP
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(sync)
    return nullcontext()


def all_reduce_mean(values: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        values /= info.world_size
    return values


def all_reduce_min(values: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.MIN)
    return values


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def broadcast_object(obj, info: DistInfo):
    """rank 0's object on every rank."""
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj, info: DistInfo) -> list:
    """Every rank's object, in rank order (on every rank)."""
    if not info.enabled:
        return [obj]
    out: list = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def _full_options(cpu_offload: bool = True, strict: bool = True):
    return StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload, strict=strict)


def load_full_model_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    set_model_state_dict(model, state, options=_full_options(cpu_offload=False))


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor (FSDP2 shard) gathered to a full tensor; a plain tensor unchanged."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def like_param(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A full tensor laid out like `param` (sharded again when `param` is a DTensor)."""
    if hasattr(param, "device_mesh"):
        return distribute_tensor(full.to(param.device), param.device_mesh, param.placements)
    return full.to(device=param.device, dtype=param.dtype)

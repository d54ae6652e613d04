"""The model a run trains: its memory checked against the device before anything is built, then
built on the meta device and materialised, sharded (FSDP2) or wrapped (DDP), with the weights a
whole CPU build gives for the seed."""

from __future__ import annotations

import torch

from taperlm.budget import memory_floor
from taperlm.config import RunConfig
from taperlm.device import check_memory
from taperlm.models.layers import set_activation_checkpointing
from taperlm.training import distributed as D
from taperlm.training.meta_init import build_on_meta, materialize
from taperlm.training.optim import parameter_periods
from taperlm.training.validation import uses_bf16


def check_training_memory(run: RunConfig, info: D.DistInfo) -> None:
    """The weights, gradients and AdamW state this rank will hold fit on its device, checked
    before anything is built or read (a model of 554B parameters used to allocate GBs
    before failing)."""
    fsdp = run.train.parallel == "fsdp" and info.enabled
    need, detail = memory_floor(run.model, training=True, shards=info.world_size if fsdp else 1)
    check_memory(
        need,
        f"training this {run.model.family} model",
        str(info.device),
        detail,
        "use a smaller model, another device, or shard it (train.parallel fsdp under "
        "torchrun); `taperlm plan --gpus N` estimates a run's memory",
    )


def build_training_model(
    run: RunConfig, info: D.DistInfo
) -> tuple[torch.nn.Module, torch.nn.Module, dict[str, int]]:
    """(model, the module to call, update periods by name). Built on the meta device and
    materialised after sharding (FSDP2) or before wrapping (DDP, one process), with the
    weights a whole CPU build gives for the seed; the periods are read before any wrapper
    can replace the parameters that carry them."""
    cfg = run.train
    paired_seed = cfg.seed if cfg.paired_init else None  # the keyed weight draws' seed
    model = build_on_meta(run.model)
    periods = parameter_periods(model)
    set_activation_checkpointing(model, cfg.activation_checkpointing == "full")
    if cfg.parallel == "fsdp" and info.enabled:
        wrapped = D.wrap_model(model, "fsdp", info, fsdp_mixed_precision(run, info))
        materialize(model, info.device, paired_seed)
    else:
        materialize(model, info.device, paired_seed)
        wrapped = D.wrap_model(model, cfg.parallel, info)
    return model, wrapped, periods


def fsdp_mixed_precision(run: RunConfig, info: D.DistInfo):
    """FSDP2's policy: bf16 compute copies when the run computes in bf16 (configurable)."""
    cfg = run.train
    bf16 = uses_bf16(info.device, cfg.precision)
    param = {"auto": bf16, "bf16": True, "fp32": False}[cfg.fsdp_param_dtype]
    return D.mixed_precision_policy(
        torch.bfloat16 if param else torch.float32,
        torch.bfloat16 if cfg.fsdp_reduce_dtype == "bf16" else torch.float32,
    )

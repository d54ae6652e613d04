"""The model a run trains, and the forward the trainer calls.

- its memory checked against the device before anything is built (`check_training_memory`);
- built on the meta device, sharded (FSDP2) or wrapped (DDP), and materialised with weights
  bitwise equal to `TaperedLM(cfg)` built whole on the CPU after the same seed
  (`build_training_model`, `build_on_meta`, `materialize`; see below);
- the precision it computes in (`uses_bf16`, `autocast`, FSDP2's `fsdp_mixed_precision`);
- its forward, eager or torch.compiled (whole, or each block's forward), which falls back to eager
  when compiling fails at setup or later (`TrainingForward`).

Materialising: `TaperedLM(cfg)` draws its random numbers in two passes: while its parts are constructed
(nn.Linear's and nn.Embedding's default init, Titans' persistent tokens, memory init and conv
kernels) and then in `init_weights` (a normal draw for every matrix, which overwrites the
defaults). `materialize` replays both passes in the same order on the CPU generator:

1. every top-level part (`TaperedLM.parts`: embedding, each block, final norm, head) is built on
   the CPU on its own, and its parameters and buffers are copied into the model's shards; the
   part is then dropped, so at most one block (or the embedding) exists in full at a time;
2. `init_weights` runs over the sharded model with a `normal_` that draws each full matrix on the
   CPU and keeps this rank's rows. A draw for a tensor already written in this pass is made and
   discarded: that is a head tied to the embedding, whose own draw `TaperedLM` also discards.

Peak host memory per rank is its shard plus one part; every rank draws every number (the CPU
generator is sequential), which costs time, not memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import distribute_tensor

from taperlm.config import ModelConfig, RunConfig
from taperlm.config.budget import memory_floor
from taperlm.models import TaperedLM
from taperlm.models.layers import (
    Rotary,
    init_weights,
    keyed_seed,
    paired_init,
    set_activation_checkpointing,
)
from taperlm.runtime.device import check_memory
from taperlm.training import distributed as D
from taperlm.training import warn
from taperlm.training.optim import parameter_periods

# ----------------------------------------------------------------------------------------------
# the model: memory check, build, wrapping


def check_training_memory(run: RunConfig, info: D.DistInfo) -> None:
    """The weights, gradients and AdamW state this rank will hold fit on its device, checked
    before anything is built or read, so a model too large for the device fails at once
    instead of after allocating gigabytes."""
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


# ----------------------------------------------------------------------------------------------
# precision


def uses_bf16(device: torch.device, precision: str) -> bool:
    """Whether a run computes in bf16: precision bf16, or auto on CUDA."""
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast for precision bf16, or auto on CUDA; nothing otherwise (fp32)."""
    if uses_bf16(device, precision):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------------------------
# materialising a model built on the meta device


def build_on_meta(cfg: ModelConfig) -> nn.Module:
    """A TaperedLM whose parameters have shapes but no storage (nothing is drawn)."""
    with torch.device("meta"):
        return TaperedLM(cfg)


def _write(target: torch.Tensor, full: torch.Tensor) -> None:
    """Copy the part of `full` that `target` holds: all of it, or this rank's shard of a DTensor."""
    if hasattr(target, "device_mesh"):
        local = distribute_tensor(
            full.to(target.device), target.device_mesh, target.placements, src_data_rank=None
        ).to_local()
        target.to_local().copy_(local)
    else:
        target.copy_(full)


@torch.no_grad()
def materialize(
    model: nn.Module, device: torch.device, paired_seed: int | None = None
) -> nn.Module:
    """Allocate `model` (built by `build_on_meta`, possibly sharded since) on `device` and fill it
    as `TaperedLM(model.config)` would have been filled after the caller's `torch.manual_seed`.
    With `paired_seed` (train.paired_init), every part is built from its own keyed stream and the
    weight matrices are redrawn by `paired_init`, so models of different widths share every draw
    their shapes allow (the global RNG then ends in a state of its own)."""
    cfg = model.config
    model.to_empty(device=device)
    if cfg.tie_embeddings and model.lm_head.weight is not model.embed.weight:
        model.lm_head.weight = model.embed.weight  # to_empty made each its own tensor
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    filled: set[str] = set()
    rotary = Rotary.of_model(cfg)
    for prefix, build in model.parts(cfg, rotary):
        if paired_seed is not None:
            # each part's construction draws (Titans' persistent tokens, convolutions, memory
            # init) from its own stream, so they do not depend on the widths of earlier parts
            torch.manual_seed(keyed_seed(paired_seed, prefix))
        part = build()
        for name, value in [*part.named_parameters(), *part.named_buffers()]:
            key = f"{prefix}.{name}"
            _write(tensors[key], value.detach())
            filled.add(key)
        del part
    missing = sorted(set(tensors) - filled)
    if missing:
        raise RuntimeError(f"materialize: no part of the model builds {missing[:5]}")

    drawn: set[int] = set()

    def normal_(t: torch.Tensor, mean: float, std: float) -> None:
        full = torch.empty(t.shape, dtype=t.dtype).normal_(mean, std)
        if id(t) not in drawn:
            drawn.add(id(t))
            _write(t, full)

    scheme = {"scheme": cfg.init, "d_model": cfg.d_model}
    init_weights(model, cfg.init_std, cfg.n_layers, normal_=normal_, **scheme)
    if paired_seed is not None:
        paired_init(model, paired_seed, cfg.init_std, cfg.n_layers, write=_write, **scheme)
    return model


# ----------------------------------------------------------------------------------------------
# the forward: eager or compiled


def raise_compile_limits(n_shapes: int) -> None:
    """Each distinct layer width is a new shape for dynamo; allow that many recompiles."""
    import torch._dynamo  # lazy: heavy to import, and only runs with train.compile on

    need = n_shapes + 8
    cfg = torch._dynamo.config
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(cfg, name) and getattr(cfg, name) < need:
            setattr(cfg, name, need)
    for name in ("accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(cfg, name) and getattr(cfg, name) < 8 * need:
            setattr(cfg, name, 8 * need)


class TrainingForward:
    """The forward the trainer calls: `module` (the model, maybe wrapped by DDP or FSDP2) as it
    is, or torch.compiled (`compile_forward`). Compiling happens at the first call of the forward
    and (lazily) of the backward, and again at a recompile; when it fails there, `fall_back`
    makes the forward eager for the rest of the run and the caller redoes its work."""

    def __init__(
        self, model: nn.Module, module: nn.Module, compile: bool, scope: str, n_shapes: int
    ) -> None:
        self.model = model  # the plain model (its blocks are what scope "blocks" compiles)
        self.module = module  # the module to call eagerly: the model, or its DDP/FSDP2 wrapper
        self.call: Callable[..., Any] = module  # what a forward runs now
        self.compiled = False  # whether `call` runs compiled code
        if compile:
            self.call, self.compiled = compile_forward(model, module, scope, n_shapes)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.call(*args, **kwargs)

    def fall_back(self, err: Exception) -> bool:
        """After `err` in a forward or backward: True when it is torch.compile's failure and the
        forward is eager from now on (warned once), False for any other error."""
        if not (self.compiled and is_compile_error(err)):
            return False
        warn(f"torch.compile failed ({type(err).__name__}: {err}); training eagerly")
        uncompile(self.model)
        self.call, self.compiled = self.module, False
        return True


def compile_forward(
    model: torch.nn.Module, module: torch.nn.Module, scope: str, n_shapes: int
) -> tuple[torch.nn.Module, bool]:
    """torch.compile `module` (the model, maybe wrapped) whole, or (scope "blocks") each of
    `model`'s blocks' forward in place (parameter names, FSDP hooks and activation
    checkpointing stay outside the graphs). Returns (the forward to call, whether it is
    compiled); on failure warns and returns `module` eager."""
    raise_compile_limits(n_shapes)
    try:
        if scope == "blocks":
            for block in model.blocks:
                block.forward = torch.compile(block.forward)
            return module, True
        return torch.compile(module), True
    except Exception as err:  # e.g. unsupported platform
        uncompile(model)
        warn(f"torch.compile failed ({type(err).__name__}: {err}); training eagerly")
        return module, False


def uncompile(model: torch.nn.Module) -> None:
    """Every block back to its class's eager forward."""
    for block in model.blocks:
        block.__dict__.pop("forward", None)


def is_compile_error(err: Exception) -> bool:
    mod = type(err).__module__ or ""
    return mod.startswith(("torch._dynamo", "torch._inductor")) or "compile" in str(err).lower()

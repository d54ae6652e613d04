"""Build a model on the meta device, shard it, then fill only the local shards — with weights
bitwise equal to `TaperedLM(cfg)` built whole on the CPU after the same seed.

`TaperedLM(cfg)` draws its random numbers in two passes: while its parts are constructed
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

import torch
from torch import nn
from torch.distributed.tensor import distribute_tensor

from taperlm.config import ModelConfig
from taperlm.models import TaperedLM
from taperlm.models.layers import Rotary, init_weights, keyed_seed, paired_init


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
    rotary = Rotary(cfg.head_dim, cfg.context_length, cfg.rope_theta)
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

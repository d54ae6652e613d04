"""torch.compile for training: of the whole model or of each block's forward, with dynamo's
recompile limits raised to the model's number of layer shapes, and undone (eager again) when
compiling fails at setup or later (the forward or the lazily compiled backward, at the first call
or a recompile: the trainer's `_micro_steps`)."""

from __future__ import annotations

import torch

from taperlm.training.warning import warn


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

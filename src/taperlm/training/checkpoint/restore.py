"""Restoring a checkpoint into a live training run: the model's weights, the optimizer state and
the gradients still accumulating, from DCP shards (format 2, each rank reading its share) or
from a format-1 checkpoint (full weights and optimizer state in one file); returns the small
state (step, tokens, data position, RNG) for the trainer to continue from."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from taperlm.errors import CheckpointError
from taperlm.io import error_text
from taperlm.training import distributed as D
from taperlm.training.checkpoint import store
from taperlm.training.checkpoint.dcp import load_training_state


def restore_training(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    periodic: Iterable[tuple[str, nn.Parameter]],
) -> dict[str, Any]:
    """Load checkpoint `path` (verified on lookup) into `model`, `optimizer` and the pending
    gradients of `periodic`; its `state.pt`. CheckpointError if it does not fit the model."""
    manifest = store.read_manifest(path)
    try:
        if store.is_sharded(manifest):
            load_training_state(path, model, optimizer, periodic, store.shard_sizes(manifest))
            return store.load_train_state(path, manifest)
        return _restore_full(path, model, optimizer)
    except CheckpointError:
        raise
    except (RuntimeError, KeyError, ValueError, TypeError) as err:
        raise CheckpointError(
            f"checkpoint {path} does not fit this model: {error_text(err)}"
        ) from None


def _restore_full(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Resume from a format-1 checkpoint (full weights and optimizer state in one file)."""
    model_state, state, _ = store.load_checkpoint(path, verify=False)  # verified on lookup
    D.load_full_model_state(model, model_state)
    D.load_optimizer_state(model, optimizer, state["optimizer"], full=True)
    params = dict(model.named_parameters())
    for name, g in state.get("pending_grads", {}).items():
        params[name].grad = D.like_param(g, params[name])
    return state

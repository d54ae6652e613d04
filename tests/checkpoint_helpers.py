"""Checkpoint helpers only tests need: a checkpoint of hand-made full weights, the keys a DCP
checkpoint holds, and a trainer's full (unsharded) model and optimizer state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from taperlm.checkpoint import dcp, safe_load, store


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model_state: dict[str, Any],
    train_state: dict[str, Any],
    run_config: dict[str, Any],
    keep: int,
) -> Path:
    """Write a checkpoint of full weights from one process (e.g. a hand-made model): the same
    layout as a training checkpoint, without optimizer state."""
    tmp = store.begin_checkpoint(run_dir, step)
    try:
        written = dcp.write_shards(tmp, {dcp.MODEL_KEY: model_state}).result()
        files = dcp.hash_files(tmp, written)
    except OSError as err:
        store.abort_checkpoint(tmp)
        raise store.write_error(run_dir, step, err) from None
    return store.commit_checkpoint(run_dir, step, tmp, files, train_state, run_config, keep)


def saved_keys(path: Path) -> set[str]:
    """The flattened keys a DCP checkpoint holds (reads only its small `.metadata`)."""
    return set(safe_load.read_metadata(path).state_dict_metadata)


def _full() -> StateDictOptions:
    return StateDictOptions(full_state_dict=True, cpu_offload=True, strict=True)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded fp32 weights on CPU, keyed by plain parameter names."""
    return get_model_state_dict(model, options=_full())


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Optimizer state keyed by parameter names (the layout of a format-1 checkpoint)."""
    return get_optimizer_state_dict(model, optimizer, options=_full())

"""Sharded checkpoints with `torch.distributed.checkpoint` (DCP): every rank writes and reads only
its own part of the model, optimizer and accumulating-gradient state.

What a checkpoint directory holds (the atomic commit, manifest and pruning are `store.py`'s)::

    step_00000100/__0_0.distcp, __1_0.distcp, ...   tensor data, one file per rank that owns data
    step_00000100/.metadata                         DCP's index: every tensor's global shape and
                                                    where each piece of it lives
    step_00000100/state.pt                          small non-tensor state (step, RNG, data position)
    step_00000100/manifest.json                     sha256 + size of every file above, written last

Tensors are stored under `model.<fqn>`, `optimizer.state.<fqn>.<exp_avg|exp_avg_sq|step>`,
`optimizer.param_groups...` and `pending_grads.<fqn>` (the gradients still accumulating for
parameters with an update period > 1), with plain parameter names, so DCP reshards on load: a
checkpoint written by FSDP2 on 8 ranks resumes under DDP, in one process, or on 2 ranks, and
`load_model_state` reads just the model's tensors into one process (what eval and export use).

Hashing is spread over the ranks: after writing, each rank hashes the files it wrote itself
(`__<rank>_*`; rank 0 also `.metadata`), and on resume each rank hashes every W-th file, so no
rank reads the whole checkpoint.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import checkpoint as torch_dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from taperlm.checkpoint import safe_load
from taperlm.errors import CheckpointError
from taperlm.files.io import error_text, sha256_file

MODEL_KEY = "model"
OPTIMIZER_KEY = "optimizer"
PENDING_KEY = "pending_grads"
METADATA_FILE = ".metadata"


# DCP warns on every single-process call that there is no process group; that is intended here.
# A filter rather than catch_warnings: background writes warn from their own thread.
_NO_DIST_WARNING = ".*torch.distributed is disabled, unavailable or uninitialized.*"


def load_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict, full: bool = True
) -> None:
    """Load optimizer state keyed by parameter names: `full` (unsharded tensors, e.g. from a
    format-1 checkpoint) or in this rank's layout (from a sharded checkpoint)."""
    # Not strict: parameters with update_period > 1 have no Adam state until their first update.
    options = StateDictOptions(full_state_dict=full, cpu_offload=False, strict=False)
    set_optimizer_state_dict(model, optimizer, state, options=options)
    # Loading first initialises every parameter's state with a zero-gradient step (step = 1);
    # drop it again for parameters the checkpoint had no state for, so their first real update
    # is Adam step 1, exactly as in the uninterrupted run.
    saved = state.get("state", {})
    for name, p in model.named_parameters():
        if name not in saved:
            optimizer.state.pop(p, None)


@contextlib.contextmanager
def _quiet():
    warnings.filterwarnings("ignore", message=_NO_DIST_WARNING)
    yield


def _no_dist() -> bool:
    return not (dist.is_available() and dist.is_initialized())


# ----------------------------------------------------------------------------------------------
# the state dict DCP saves and loads


def training_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, periodic: Iterable[tuple[str, nn.Parameter]]
) -> dict[str, Any]:
    """Model weights, optimizer state and pending gradients as local shards (DTensors under FSDP2,
    plain tensors otherwise), keyed by plain parameter names."""
    pending = {name: p.grad.detach() for name, p in periodic if p.grad is not None}
    return {
        MODEL_KEY: get_model_state_dict(model),
        OPTIMIZER_KEY: get_optimizer_state_dict(model, optimizer),
        PENDING_KEY: pending,
    }


def _dcp_load(state: dict[str, Any], path: Path, no_dist: bool, shards: dict[str, int]) -> None:
    """`dcp.load` of checkpoint `path` into `state` in place, through the safe reader and
    planner. DCP reports a failure as a `CheckpointException`, a BaseException that escapes
    `except Exception`: it becomes a CheckpointError naming its first cause."""
    try:
        with _quiet():
            torch_dcp.load(
                state,
                storage_reader=safe_load.reader(path, shards),
                planner=safe_load.planner(),
                no_dist=no_dist,
            )
    except CheckpointException as err:
        causes = [f[0] if isinstance(f, tuple) else f for f in err.failures.values()]
        ours = next((c for c in causes if isinstance(c, CheckpointError)), None)
        if ours is not None:
            raise ours from None
        cause = causes[0] if causes else err
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({error_text(cause)}); delete this "
            "checkpoint or resume from an earlier one"
        ) from None


def _saved_optimizer_params(keys: set[str]) -> set[str]:
    prefix = f"{OPTIMIZER_KEY}.state."
    return {k[len(prefix) : k.rfind(".")] for k in keys if k.startswith(prefix)}


def load_training_state(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    periodic: Iterable[tuple[str, nn.Parameter]],
    shards: dict[str, int],
) -> None:
    """Load weights, optimizer state and pending gradients of checkpoint `path` into this rank's
    (possibly sharded) model and optimizer. Every rank reads only the pieces it holds, and only
    from the shard files `shards` (name -> bytes, from the checked manifest) names."""
    meta = safe_load.read_metadata(path).state_dict_metadata
    keys = set(meta)
    model_state = get_model_state_dict(model)
    bad = [
        f"{k}: checkpoint {tuple(getattr(meta.get(f'{MODEL_KEY}.{k}'), 'size', ())) or None} "
        f"vs model {tuple(v.shape)}"
        for k, v in model_state.items()
        if tuple(getattr(meta.get(f"{MODEL_KEY}.{k}"), "size", ())) != tuple(v.shape)
    ]
    if bad:  # another shape or family: say which tensors, before DCP's own error
        more = f"; ... ({len(bad)} in all)" if len(bad) > 4 else ""
        raise ValueError("; ".join(bad[:4]) + more)
    with_state = _saved_optimizer_params(keys)
    # The template: our own (sharded) tensors, loaded in place. Parameters with an update period
    # have no Adam state until their first update; ask only for what the checkpoint holds.
    optim = get_optimizer_state_dict(model, optimizer)
    optim["state"] = {k: v for k, v in optim["state"].items() if k in with_state}
    pending = {name: torch.zeros_like(p) for name, p in periodic if f"{PENDING_KEY}.{name}" in keys}
    state = {MODEL_KEY: model_state, OPTIMIZER_KEY: optim, PENDING_KEY: pending}
    _dcp_load(state, path, no_dist=_no_dist(), shards=shards)
    set_model_state_dict(model, state[MODEL_KEY])
    load_optimizer_state(model, optimizer, state[OPTIMIZER_KEY], full=False)
    params = dict(periodic)
    for name, grad in state[PENDING_KEY].items():
        params[name].grad = grad


def load_model_state(path: Path, shards: dict[str, int]) -> dict[str, torch.Tensor]:
    """Full (unsharded) model weights of checkpoint `path` in one process, on CPU; reads only the
    model's byte ranges of the shards (not the optimizer state), of the files `shards` names."""
    meta = safe_load.read_metadata(path).state_dict_metadata
    prefix = f"{MODEL_KEY}."
    template = {
        k[len(prefix) :]: torch.empty(tuple(v.size), dtype=v.properties.dtype)
        for k, v in meta.items()
        if k.startswith(prefix) and isinstance(v, TensorStorageMetadata)
    }
    state = {MODEL_KEY: template}
    _dcp_load(state, path, no_dist=True, shards=shards)
    return state[MODEL_KEY]


# ----------------------------------------------------------------------------------------------
# writing, synchronously or in the background


def write_shards(
    tmp: Path, state: dict[str, Any], process_group: Any = None, use_async: bool = False
) -> Future:
    """Write `state` into directory `tmp` (every rank its own file), fsynced. Returns a future
    whose result is the sorted list of file names this rank must hash (see `own_files`).

    `use_async`: stage a CPU copy, then write in a background thread (DCP `async_save`, on
    `process_group`, which must not be the one training uses); the caller keeps training and
    commits the checkpoint once every rank's future is done."""
    writer = torch_dcp.FileSystemWriter(str(tmp), sync_files=True)
    no_dist = _no_dist()
    rank = 0 if no_dist else dist.get_rank()
    world = 1 if no_dist else dist.get_world_size()
    if not use_async:
        with _quiet():
            meta = torch_dcp.save(
                state, storage_writer=writer, process_group=process_group, no_dist=no_dist
            )
        done: Future = Future()
        done.set_result(own_files(meta, rank, world, tmp))
        return done
    with _quiet():
        upload = torch_dcp.async_save(
            state, storage_writer=writer, process_group=process_group, no_dist=no_dist
        )
    upload = getattr(upload, "upload_completion", upload)
    result: Future = Future()

    def finished(f: Future) -> None:
        try:
            result.set_result(own_files(f.result(), rank, world, tmp))
        except BaseException as err:  # surfaced by the caller's .result()
            result.set_exception(err)

    upload.add_done_callback(finished)
    return result


def own_files(metadata: Any, rank: int, world: int, root: Path) -> list[str]:
    """Files of a just-written checkpoint that `rank` hashes: those it wrote (`__<rank>_...`),
    plus `.metadata` on rank 0; files of no rank's pattern go round-robin.

    The names come from the metadata `save` returns; where that carries no storage map (torch
    2.11's `save` returned `storage_data=None` on an H200 machine, 2026-12-04), from the data
    files in `root`, which this rank's `save` has finished writing by then."""
    storage = getattr(metadata, "storage_data", None)
    if storage:
        files = sorted({s.relative_path for s in storage.values()})
    else:
        files = sorted(
            p.name for p in Path(root).iterdir() if p.is_file() and p.suffix == ".distcp"
        )
    mine = [f for f in files if f.startswith(f"__{rank}_")]
    orphans = [f for f in files if not any(f.startswith(f"__{r}_") for r in range(world))]
    mine += orphans[rank::world]
    if rank == 0:
        mine.append(METADATA_FILE)
    return sorted(mine)


def hash_files(root: Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """{name: {"sha256", "bytes"}} of files under `root` (each read once)."""
    return {n: {"sha256": sha256_file(root / n), "bytes": (root / n).stat().st_size} for n in names}


class BackgroundHasher:
    """Hashes a rank's files off the training thread once its write has finished."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="taperlm-ckpt")

    def submit(self, root: Path, files: Future) -> Future:
        return self._pool.submit(lambda: hash_files(root, files.result()))

    def close(self) -> None:
        self._pool.shutdown(wait=True)

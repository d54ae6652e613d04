"""The trainer's checkpointer: the checkpoints of a live run, saved and restored.

- saving: every rank writes its DCP shards (`taperlm.checkpoint.dcp`), rank 0 commits the
  directory atomically with its manifest (`taperlm.checkpoint.store`), synchronously or in the background (`ShardedCheckpointer`);
- restoring: the model's weights, the optimizer state and the gradients still accumulating, from
  DCP shards (format 2, each rank reading its share) or from a format-1 checkpoint (full weights
  and optimizer state in one file); the small state (step, tokens, data position, RNG) is
  returned for the trainer to continue from (`restore_training`);
- every random number generator a run draws from (Python, NumPy, torch, CUDA): seeded at the
  start, saved in each checkpoint and restored on resume, so a resumed run draws what an
  uninterrupted one would (`seed_everything`, `rng_state`, `set_rng_state`).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from taperlm.checkpoint import store
from taperlm.checkpoint.dcp import (
    BackgroundHasher,
    hash_files,
    load_optimizer_state,
    load_training_state,
    write_shards,
)
from taperlm.errors import CheckpointError
from taperlm.files.io import error_text
from taperlm.training import distributed as D


class _Pending:
    """An asynchronous save whose shards are still being written (or hashed)."""

    def __init__(self, step: int, tmp: Path, hashes: Future, commit_args: tuple) -> None:
        self.step, self.tmp, self.hashes, self.commit_args = step, tmp, hashes, commit_args


class ShardedCheckpointer:
    """Saves a run's checkpoints as DCP shards from every rank, then commits them atomically on
    rank 0 (`store.commit_checkpoint`). With `use_async`, `save` returns once a CPU copy is
    staged; the write continues in the background and the checkpoint is committed by `poll`
    (called every step) once every rank has finished, or by the next `save` / `finish`."""

    def __init__(self, run_dir: Path, info: Any, use_async: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.info = info
        self.use_async = use_async
        # Background writes run collectives of their own: never on the group training uses.
        self.group = dist.new_group(backend="gloo") if use_async and info.enabled else None
        self.hasher = BackgroundHasher() if use_async else None
        self.pending: _Pending | None = None

    def save(
        self,
        step: int,
        tensors: dict[str, Any],
        train_state: dict[str, Any],
        run_config: dict[str, Any],
        keep: int,
        use_async: bool | None = None,
    ) -> None:
        """Write checkpoint `step`: `tensors` (from `training_state`, this rank's shards) and the
        small `train_state` (rank 0's is written). Collective: every rank calls it."""
        self.finish()
        background = self.use_async if use_async is None else use_async
        tag = D.broadcast_object(os.getpid(), self.info)  # the temp dir is named by rank 0
        err: str | None = None
        if self.info.is_main:
            try:
                store.begin_checkpoint(self.run_dir, step, tag)
            except CheckpointError as e:
                err = str(e)
        self._raise_agreed(err)
        tmp = store.temp_checkpoint_dir(self.run_dir, step, tag)
        commit_args = (step, tmp, train_state, run_config, keep)
        try:
            written = write_shards(tmp, tensors, self.group, background)
        except Exception as e:  # DCP re-raises a rank's write error on every rank
            self._fail(step, tmp, e)
        if background:
            assert self.hasher is not None
            self.pending = _Pending(step, tmp, self.hasher.submit(tmp, written), commit_args)
            return
        try:
            files = hash_files(tmp, written.result())
        except OSError as e:
            files, err = {}, str(store.write_error(self.run_dir, step, e))
        self._raise_agreed(err, step, tmp)
        self._commit(files, *commit_args)

    def poll(self) -> None:
        """Commit a background save if every rank's write is done (collective while pending)."""
        if self.pending is None:
            return
        done = torch.tensor([float(self.pending.hashes.done())], device=self.info.device)
        if float(D.all_reduce_min(done, self.info)[0]) > 0:
            self.finish()

    def finish(self) -> None:
        """Wait for a background save and commit it (collective)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        files: dict = {}
        err = None
        try:
            files = pending.hashes.result()
        except Exception as e:
            err = self._message(pending.step, e)
        self._raise_agreed(err, pending.step, pending.tmp)
        self._commit(files, *pending.commit_args)

    def close(self) -> None:
        """Let a background write end (a normal run has none left: its last save is synchronous).
        It is not committed: after an error, ranks may no longer meet in a collective."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.hashes.exception()  # waits; the temp dir is removed by a later prune
        if self.hasher is not None:
            self.hasher.close()

    # -- helpers -------------------------------------------------------------------------------

    def _commit(
        self,
        files: dict[str, Any],
        step: int,
        tmp: Path,
        train_state: dict[str, Any],
        run_config: dict[str, Any],
        keep: int,
    ) -> None:
        everyone = D.gather_objects(files, self.info)
        err: str | None = None
        if self.info.is_main:
            merged = {k: v for part in everyone for k, v in part.items()}
            try:
                store.commit_checkpoint(
                    self.run_dir, step, tmp, merged, train_state, run_config, keep
                )
            except CheckpointError as e:
                err = str(e)
        self._raise_agreed(err)

    def _message(self, step: int, err: BaseException) -> str:
        os_err = _find_os_error(err)
        if os_err is not None:
            return str(store.write_error(self.run_dir, step, os_err))
        return (
            f"could not write checkpoint {store.checkpoints_dir(self.run_dir)}/"
            f"{store.checkpoint_name(step)}: {type(err).__name__}: {err}"
        )

    def _fail(self, step: int, tmp: Path, err: BaseException) -> None:
        if self.info.is_main:
            store.abort_checkpoint(tmp)
        raise CheckpointError(self._message(step, err)) from None

    def _raise_agreed(self, err: str | None, step: int | None = None, tmp: Path | None = None):
        """Raise CheckpointError on every rank if any rank had an error (collective)."""
        errors = [e for e in D.gather_objects(err, self.info) if e is not None]
        if errors:
            if tmp is not None and self.info.is_main:
                store.abort_checkpoint(tmp)
            raise CheckpointError(errors[0])


def _find_os_error(err: BaseException | None) -> OSError | None:
    """The OSError behind an exception (DCP wraps each rank's failure)."""
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, OSError):
            return err
        for inner in getattr(err, "failures", {}).values():  # DCP's CheckpointException
            found = _find_os_error(inner if isinstance(inner, BaseException) else None)
            if found is not None:
                return found
        err = err.__cause__ or err.__context__
        seen += 1
    return None


# ----------------------------------------------------------------------------------------------
# restoring


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
    load_optimizer_state(model, optimizer, state["optimizer"], full=True)
    params = dict(model.named_parameters())
    for name, g in state.get("pending_grads", {}).items():
        params[name].grad = D.like_param(g, params[name])
    return state


# ----------------------------------------------------------------------------------------------
# random number generators


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """The state of every generator, as a checkpoint's `state.pt` holds it (tensors and lists,
    readable with weights_only=True)."""
    py = random.getstate()
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], n[1].numpy(), *n[2:]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])

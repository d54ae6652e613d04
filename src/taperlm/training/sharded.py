"""Sharded checkpoints with `torch.distributed.checkpoint` (DCP): every rank writes and reads only
its own part of the model, optimizer and accumulating-gradient state.

What a checkpoint directory holds (the atomic commit, manifest and pruning are
`taperlm.training.checkpoint`'s)::

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
from torch import nn

from taperlm.errors import CheckpointError

MODEL_KEY = "model"
OPTIMIZER_KEY = "optimizer"
PENDING_KEY = "pending_grads"
METADATA_FILE = ".metadata"


# DCP warns on every single-process call that there is no process group; that is intended here.
# A filter rather than catch_warnings: background writes warn from their own thread.
_NO_DIST_WARNING = ".*torch.distributed is disabled, unavailable or uninitialized.*"


@contextlib.contextmanager
def _quiet():
    warnings.filterwarnings("ignore", message=_NO_DIST_WARNING)
    yield


def _no_dist() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized())


# ----------------------------------------------------------------------------------------------
# the state dict DCP saves and loads


def training_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, periodic: Iterable[tuple[str, nn.Parameter]]
) -> dict[str, Any]:
    """Model weights, optimizer state and pending gradients as local shards (DTensors under FSDP2,
    plain tensors otherwise), keyed by plain parameter names."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    pending = {name: p.grad.detach() for name, p in periodic if p.grad is not None}
    return {
        MODEL_KEY: get_model_state_dict(model),
        OPTIMIZER_KEY: get_optimizer_state_dict(model, optimizer),
        PENDING_KEY: pending,
    }


def saved_keys(path: Path) -> set[str]:
    """The flattened keys a DCP checkpoint holds (reads only its small `.metadata`)."""
    from torch.distributed.checkpoint import FileSystemReader

    return set(FileSystemReader(str(path)).read_metadata().state_dict_metadata)


def _saved_optimizer_params(keys: set[str]) -> set[str]:
    prefix = f"{OPTIMIZER_KEY}.state."
    return {k[len(prefix) : k.rfind(".")] for k in keys if k.startswith(prefix)}


def load_training_state(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    periodic: Iterable[tuple[str, nn.Parameter]],
) -> None:
    """Load weights, optimizer state and pending gradients of checkpoint `path` into this rank's
    (possibly sharded) model and optimizer. Every rank reads only the pieces it holds."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
    )

    from taperlm.training.distributed import load_optimizer_state

    keys = saved_keys(path)
    with_state = _saved_optimizer_params(keys)
    # The template: our own (sharded) tensors, loaded in place. Parameters with an update period
    # have no Adam state until their first update; ask only for what the checkpoint holds.
    optim = get_optimizer_state_dict(model, optimizer)
    optim["state"] = {k: v for k, v in optim["state"].items() if k in with_state}
    pending = {name: torch.zeros_like(p) for name, p in periodic if f"{PENDING_KEY}.{name}" in keys}
    state = {MODEL_KEY: get_model_state_dict(model), OPTIMIZER_KEY: optim, PENDING_KEY: pending}
    with _quiet():
        dcp.load(state, checkpoint_id=str(path), no_dist=_no_dist())
    set_model_state_dict(model, state[MODEL_KEY])
    load_optimizer_state(model, optimizer, state[OPTIMIZER_KEY], full=False)
    params = dict(periodic)
    for name, grad in state[PENDING_KEY].items():
        params[name].grad = grad


def load_model_state(path: Path) -> dict[str, torch.Tensor]:
    """Full (unsharded) model weights of checkpoint `path` in one process, on CPU; reads only the
    model's byte ranges of the shards (not the optimizer state)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    prefix = f"{MODEL_KEY}."
    template = {
        k[len(prefix) :]: torch.empty(tuple(v.size), dtype=v.properties.dtype)
        for k, v in meta.items()
        if k.startswith(prefix) and isinstance(v, TensorStorageMetadata)
    }
    state = {MODEL_KEY: template}
    with _quiet():
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
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
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    writer = dcp.FileSystemWriter(str(tmp), sync_files=True)
    no_dist = _no_dist()
    rank = 0 if no_dist else dist.get_rank()
    world = 1 if no_dist else dist.get_world_size()
    if not use_async:
        with _quiet():
            meta = dcp.save(
                state, storage_writer=writer, process_group=process_group, no_dist=no_dist
            )
        done: Future = Future()
        done.set_result(own_files(meta, rank, world))
        return done
    with _quiet():
        upload = dcp.async_save(
            state, storage_writer=writer, process_group=process_group, no_dist=no_dist
        )
    upload = getattr(upload, "upload_completion", upload)
    result: Future = Future()

    def finished(f: Future) -> None:
        try:
            result.set_result(own_files(f.result(), rank, world))
        except BaseException as err:  # surfaced by the caller's .result()
            result.set_exception(err)

    upload.add_done_callback(finished)
    return result


def own_files(metadata: Any, rank: int, world: int) -> list[str]:
    """Files of a just-written checkpoint that `rank` hashes: those it wrote (`__<rank>_...`),
    plus `.metadata` on rank 0; files of no rank's pattern go round-robin."""
    files = sorted({s.relative_path for s in metadata.storage_data.values()})
    mine = [f for f in files if f.startswith(f"__{rank}_")]
    orphans = [f for f in files if not any(f.startswith(f"__{r}_") for r in range(world))]
    mine += orphans[rank::world]
    if rank == 0:
        mine.append(METADATA_FILE)
    return sorted(mine)


def hash_files(root: Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """{name: {"sha256", "bytes"}} of files under `root` (each read once)."""
    from taperlm.io import sha256_file

    return {n: {"sha256": sha256_file(root / n), "bytes": (root / n).stat().st_size} for n in names}


class BackgroundHasher:
    """Hashes a rank's files off the training thread once its write has finished."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="taperlm-ckpt")

    def submit(self, root: Path, files: Future) -> Future:
        return self._pool.submit(lambda: hash_files(root, files.result()))

    def close(self) -> None:
        self._pool.shutdown(wait=True)


# ----------------------------------------------------------------------------------------------
# the trainer's checkpointer: write shards on every rank, commit on rank 0


class _Pending:
    """An asynchronous save whose shards are still being written (or hashed)."""

    def __init__(self, step: int, tmp: Path, hashes: Future, commit_args: tuple) -> None:
        self.step, self.tmp, self.hashes, self.commit_args = step, tmp, hashes, commit_args


class ShardedCheckpointer:
    """Saves a run's checkpoints as DCP shards from every rank, then commits them atomically on
    rank 0 (`checkpoint.commit_checkpoint`). With `use_async`, `save` returns once a CPU copy is
    staged; the write continues in the background and the checkpoint is committed by `poll`
    (called every step) once every rank has finished, or by the next `save` / `finish`."""

    def __init__(self, run_dir: Path, info: Any, use_async: bool = False) -> None:
        import torch.distributed as dist

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
        import os

        from taperlm.training import checkpoint as ckpt
        from taperlm.training import distributed as D

        self.finish()
        background = self.use_async if use_async is None else use_async
        tag = D.broadcast_object(os.getpid(), self.info)  # the temp dir is named by rank 0
        err: str | None = None
        if self.info.is_main:
            try:
                ckpt.begin_checkpoint(self.run_dir, step, tag)
            except CheckpointError as e:
                err = str(e)
        self._raise_agreed(err)
        tmp = ckpt.temp_checkpoint_dir(self.run_dir, step, tag)
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
            files, err = {}, str(ckpt._write_error(self.run_dir, step, e))
        self._raise_agreed(err, step, tmp)
        self._commit(files, *commit_args)

    def poll(self) -> None:
        """Commit a background save if every rank's write is done (collective while pending)."""
        if self.pending is None:
            return
        from taperlm.training import distributed as D

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
        from taperlm.training import checkpoint as ckpt
        from taperlm.training import distributed as D

        everyone = D.gather_objects(files, self.info)
        err: str | None = None
        if self.info.is_main:
            merged = {k: v for part in everyone for k, v in part.items()}
            try:
                ckpt.commit_checkpoint(
                    self.run_dir, step, tmp, merged, train_state, run_config, keep
                )
            except CheckpointError as e:
                err = str(e)
        self._raise_agreed(err)

    def _message(self, step: int, err: BaseException) -> str:
        from taperlm.training import checkpoint as ckpt

        os_err = _find_os_error(err)
        if os_err is not None:
            return str(ckpt._write_error(self.run_dir, step, os_err))
        return (
            f"could not write checkpoint {ckpt.checkpoints_dir(self.run_dir)}/"
            f"{ckpt.checkpoint_name(step)}: {type(err).__name__}: {err}"
        )

    def _fail(self, step: int, tmp: Path, err: BaseException) -> None:
        from taperlm.training import checkpoint as ckpt

        if self.info.is_main:
            ckpt.abort_checkpoint(tmp)
        raise CheckpointError(self._message(step, err)) from None

    def _raise_agreed(self, err: str | None, step: int | None = None, tmp: Path | None = None):
        """Raise CheckpointError on every rank if any rank had an error (collective)."""
        from taperlm.training import checkpoint as ckpt
        from taperlm.training import distributed as D

        errors = [e for e in D.gather_objects(err, self.info) if e is not None]
        if errors:
            if tmp is not None and self.info.is_main:
                ckpt.abort_checkpoint(tmp)
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

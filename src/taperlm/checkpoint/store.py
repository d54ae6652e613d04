"""A checkpoint directory on disk: its layout, atomic commit, manifest, verification, lookup,
pruning and reading (the tensors inside are `dcp.py`'s; loading a model for inference is
`taperlm.checkpoint.loading`'s).

Layout of a run directory::

    RUN/config.yaml                       resolved RunConfig (mlp_widths included)
    RUN/metrics.jsonl                     one JSON object per log / eval step
    RUN/checkpoints/step_00000100/        one complete checkpoint
        __0_0.distcp, __1_0.distcp, ...   model, optimizer and pending-gradient shards, one file
                                          per rank (torch.distributed.checkpoint; see dcp.py)
        .metadata                         DCP's index of those shards
        state.pt                          LR schedule, step, tokens, data position, RNG
        manifest.json                     sha256 + size of every file, step, the run config
    RUN/checkpoints/latest                name of the newest complete checkpoint (a hint)

A checkpoint is written into `checkpoints/.tmp-step_XXXXXXXX-<pid>/` (every rank its shards,
fsynced), then rank 0 writes `state.pt` and `manifest.json` last and renames the directory into
place with `os.replace` (atomic on POSIX), so a crash leaves either the complete checkpoint or a
temp dir that is ignored and cleaned up later. Loading verifies sizes and hashes, so truncation or
bit flips are detected; the hashing can be split over ranks (`part`), so no rank reads every shard.

Checkpoints of format version 1 (one `model.safetensors` with full weights, the optimizer inside
`state.pt`) are still read by `taperlm.checkpoint.loading.load_run_model`, `load_model_state` and resume.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from taperlm.errors import CheckpointError, MalformedFileError, TrainingWarning, UnsafeFileError
from taperlm.files.io import (
    MAX_RECORD_BYTES,
    atomic_write_text,
    check_regular,
    check_stored_zip,
    error_text,
    fsync_dir,
    not_a_file,
    open_regular,
    os_error_cause,
    path_inside,
    read_json,
    replace_dir,
    sha256_file,
)
from taperlm.files.runlock import pid_alive

CHECKPOINT_DIR = "checkpoints"
MODEL_FILE = "model.safetensors"  # format version 1 only
STATE_FILE = "state.pt"
MANIFEST_FILE = "manifest.json"
LATEST_FILE = "latest"
FORMAT_VERSION = 2  # 1: full model.safetensors + state.pt; 2: DCP shards + state.pt
_PREFIX = "step_"
_TMP_PREFIX = ".tmp-"


def checkpoint_name(step: int) -> str:
    return f"{_PREFIX}{step:08d}"


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint directory (complete or not), oldest first; temp dirs of
    interrupted writes are not listed."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(_PREFIX):
            try:
                out.append((int(p.name[len(_PREFIX) :]), p))
            except ValueError:
                continue
    return sorted(out)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


# ----------------------------------------------------------------------------------------------
# writing


def _write_state(path: Path, state: dict[str, Any]) -> None:
    import torch  # lazy: this module stays torch-free (the Ctrl-C message lists checkpoints)

    torch.save(state, path)


def temp_checkpoint_dir(run_dir: str | Path, step: int, tag: int | None = None) -> Path:
    """Where checkpoint `step` is assembled before its commit (`tag`: rank 0's pid by default)."""
    tag = os.getpid() if tag is None else tag
    return checkpoints_dir(run_dir) / f"{_TMP_PREFIX}{checkpoint_name(step)}-{tag}"


def write_error(run_dir: str | Path, step: int, err: OSError) -> CheckpointError:
    final = checkpoints_dir(run_dir) / checkpoint_name(step)
    good = [p.name for _, p in list_checkpoints(run_dir) if p != final]
    prev = f"the previous checkpoint {good[-1]} is intact" if good else "no earlier checkpoint"
    where = Path(err.filename) if err.filename else checkpoints_dir(run_dir) / "x"
    return CheckpointError(
        f"could not write checkpoint {final}: {err.strerror or err} "
        f"({type(err).__name__}, errno {err.errno}); {prev}. "
        f"{os_error_cause(err, where)}, then rerun the same command to resume"
    )


def begin_checkpoint(run_dir: str | Path, step: int, tag: int | None = None) -> Path:
    """Create the empty temp dir of checkpoint `step` (one process: rank 0) and return it."""
    tmp = temp_checkpoint_dir(run_dir, step, tag)
    try:
        tmp.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(run_dir, step, err) from None
    return tmp


def abort_checkpoint(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)


def commit_checkpoint(
    run_dir: str | Path,
    step: int,
    tmp: Path,
    files: dict[str, dict[str, Any]],
    train_state: dict[str, Any],
    run_config: dict[str, Any],
    keep: int,
) -> Path:
    """Finish checkpoint `step` whose shards are already in `tmp` (with their hashes in `files`):
    write state.pt and the manifest, rename into place, update `latest`, prune to `keep`.

    Any OSError (disk full, read-only directory, ...) removes the temp dir, leaves every earlier
    checkpoint intact, and raises CheckpointError naming the path and the OS error.
    """
    root = checkpoints_dir(run_dir)
    final = root / checkpoint_name(step)
    try:
        _write_state(tmp / STATE_FILE, train_state)
        _fsync_file(tmp / STATE_FILE)
        files = {
            **files,
            STATE_FILE: {
                "sha256": sha256_file(tmp / STATE_FILE),
                "bytes": (tmp / STATE_FILE).stat().st_size,
            },
        }
        manifest = {
            "format_version": FORMAT_VERSION,
            "format": "dcp",
            "step": step,
            "tokens": train_state.get("tokens"),
            "world_size": train_state.get("world_size", 1),
            "files": dict(sorted(files.items())),
            "run_config": run_config,
        }
        atomic_write_text(tmp / MANIFEST_FILE, json.dumps(manifest, indent=2), fsync=True)
        fsync_dir(tmp)
        replace_dir(tmp, final)  # re-saving a step (the end of a resumed run) swaps it out
        fsync_dir(root)
        atomic_write_text(root / LATEST_FILE, final.name + "\n", fsync=True)
    except OSError as err:
        abort_checkpoint(tmp)
        raise write_error(run_dir, step, err) from None
    prune_checkpoints(run_dir, keep)
    return final


def _temp_owner(name: str) -> int | None:
    """The pid a temp entry's name ends with (`.tmp-step_N-<pid>`, `.tmp-old-step_N-<pid>`)."""
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def prune_checkpoints(run_dir: str | Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints, and stale temp dirs of killed writes.

    A temp entry is stale only when the process named in it is gone: the run's lock (one
    writer per run dir) already keeps other writers out, and this keeps the pruning from ever
    touching another live process's checkpoint in progress even without it."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return
    for p in root.iterdir():
        owner = _temp_owner(p.name)
        if p.name.startswith(_TMP_PREFIX) and (owner is None or not pid_alive(owner)):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    ckpts = list_checkpoints(run_dir)
    for _, p in ckpts[: max(0, len(ckpts) - max(1, keep))]:
        # Rename first (atomic), so a kill mid-delete leaves a temp dir, never a partial checkpoint.
        doomed = root / f"{_TMP_PREFIX}old-{p.name}-{os.getpid()}"
        try:
            p.rename(doomed)
        except OSError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)


# ----------------------------------------------------------------------------------------------
# verifying and reading


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of checkpoint `path`, checked: every file it names is a plain name of a file
    inside the checkpoint (a manifest is a stranger's data: `../step_12/__0_0.distcp` or an
    absolute path would make the checkpoint load files nobody verified with it)."""
    mpath = path / MANIFEST_FILE
    if not mpath.is_file() and not_a_file(mpath) is None:
        raise CheckpointError(
            f"checkpoint {path} is incomplete: {MANIFEST_FILE} is missing (the write was "
            "interrupted); delete it or resume from an earlier checkpoint"
        )
    try:
        manifest = read_json(mpath, MAX_RECORD_BYTES, MANIFEST_FILE)
    except MalformedFileError as err:  # not JSON, too deep, a key twice
        raise CheckpointError(
            f"checkpoint {path}: {MANIFEST_FILE} is corrupt ({err}); delete this "
            "checkpoint or resume from an earlier one"
        ) from None
    except (UnsafeFileError, OSError) as err:  # not a regular file, too large, not UTF-8
        raise CheckpointError(
            f"checkpoint {path}: {_reason(err)}; delete this checkpoint or resume from an "
            "earlier one"
        ) from None
    except ValueError as err:  # JSONDecodeError
        raise CheckpointError(
            f"checkpoint {path}: {MANIFEST_FILE} is corrupt ({error_text(err)}); delete this "
            "checkpoint or resume from an earlier one"
        ) from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"checkpoint {path}: {MANIFEST_FILE} has no file list; it is corrupt")
    files = manifest["files"]
    bad = [n for n, i in files.items() if not isinstance(i, dict) or not _is_file_entry(i)]
    required = (".metadata", STATE_FILE) if is_sharded(manifest) else (MODEL_FILE,)
    missing = [n for n in required if n not in files]
    if bad or missing:
        what = f"entries without sha256 and size: {bad[:4]}" if bad else f"no entry for {missing}"
        raise CheckpointError(
            f"checkpoint {path}: {MANIFEST_FILE} is corrupt ({what[:400]}); delete this "
            "checkpoint or resume from an earlier one"
        )
    for name in files:
        checkpoint_file(path, name)
    return manifest


def checkpoint_file(path: Path, name: str) -> Path:
    """`path / name` for a file name read from checkpoint `path`'s manifest or index: a plain
    name (no folder part) of an entry that stays inside the checkpoint, else CheckpointError."""
    shown = name if len(name) <= 100 else name[:100] + "..."
    if not name or "/" in name or "\\" in name or name in (".", "..") or "\x00" in name:
        raise CheckpointError(
            f"checkpoint {path} names the file {shown!r}, which is not a file of the checkpoint "
            "(taperlm writes plain names inside it): it was edited or crafted; delete this "
            "checkpoint or resume from an earlier one"
        )
    try:
        return path_inside(path, name, "checkpoint file")
    except UnsafeFileError as err:
        raise CheckpointError(f"{err}; or resume from an earlier checkpoint") from None


def shard_sizes(manifest: dict[str, Any]) -> dict[str, int]:
    """{name: bytes} of the tensor shard files a checked manifest names: the only files DCP may
    read (`safe_load.SafeReader`)."""
    skip = {".metadata", STATE_FILE, MANIFEST_FILE}
    return {n: int(i["bytes"]) for n, i in manifest["files"].items() if n not in skip}


def _reason(err: BaseException) -> str:
    if isinstance(err, UnsafeFileError):
        return str(err)
    if isinstance(err, OSError):
        return f"cannot read {err.filename or 'a file'}: {err.strerror or err}"
    return error_text(err)


def _is_file_entry(info: dict[str, Any]) -> bool:
    size = info.get("bytes")
    return isinstance(info.get("sha256"), str) and isinstance(size, int) and size >= 0


Agree = Callable[[Any], list[Any]]  # every rank's value, in rank order (an all-gather)


def _check_files(path: Path, part: tuple[int, int]) -> dict[str, Any]:
    """The manifest of `path` after checking every file's size and this rank's share of hashes
    (every `world`-th file, starting at `rank`); CheckpointError on the first problem."""
    if not path.is_dir():
        raise CheckpointError(
            f"checkpoint {path} does not exist (removed, or pruned by the run since it was "
            "listed); give an existing one, a run's checkpoints/step_NNNNNNNN folder"
        )
    manifest = read_manifest(path)
    rank, world = part
    for i, (name, info) in enumerate(sorted(manifest["files"].items())):
        f = path / name
        kind = not_a_file(f)
        if kind is not None:
            raise CheckpointError(
                f"checkpoint file {f} is {kind}, not a regular file; delete this checkpoint or "
                "resume from an earlier one"
            )
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path} is missing {name}; it is incomplete")
        size = f.stat().st_size
        if size != info.get("bytes"):
            raise CheckpointError(
                f"checkpoint file {f} is truncated or altered: {size} bytes, the manifest says "
                f"{info.get('bytes')}; delete this checkpoint or resume from an earlier one"
            )
        if i % world == rank and _sha256(f) != info.get("sha256"):
            raise CheckpointError(
                f"checkpoint file {f} is corrupted: its sha256 does not match the manifest; "
                "delete this checkpoint or resume from an earlier one"
            )
    return manifest


def _sha256(f: Path) -> str:
    try:
        return sha256_file(f)
    except (UnsafeFileError, OSError) as err:
        raise CheckpointError(
            f"checkpoint file {f} cannot be read: {_reason(err)}; delete this checkpoint or "
            "resume from an earlier one"
        ) from None


def verify_checkpoint(
    path: str | Path, part: tuple[int, int] = (0, 1), agree: Agree | None = None
) -> dict[str, Any]:
    """Check every file against the manifest (size, then sha256); return the manifest.

    Raises CheckpointError saying which file is missing, truncated or corrupted. Under several
    processes pass `part=(rank, world)` and an all-gather `agree`: each rank hashes only its share
    of the files and every rank reaches the same verdict.
    """
    path = Path(path)
    try:
        manifest, problem = _check_files(path, part), None
    except CheckpointError as err:
        manifest, problem = {}, str(err)
    if agree is not None:
        problem = next((p for p in agree(problem) if p is not None), None)
    if problem is not None:
        raise CheckpointError(problem)
    return manifest


def find_checkpoint(
    run_dir: str | Path,
    step: int | None = None,
    part: tuple[int, int] = (0, 1),
    agree: Agree | None = None,
) -> Path | None:
    """The checkpoint to load: `step` exactly (verified, CheckpointError if bad), or the newest
    one that verifies, warning about each newer one that does not (None if there is none).
    `part`/`agree`: see `verify_checkpoint` (every rank must call this together)."""
    ckpts = list_checkpoints(run_dir)
    if step is not None:
        for s, p in ckpts:
            if s == step:
                verify_checkpoint(p, part, agree)
                return p
        have = ", ".join(str(s) for s, _ in ckpts) or "none"
        raise CheckpointError(
            f"run {run_dir} has no checkpoint at step {step} (available steps: {have})"
        )
    for _, p in reversed(ckpts):
        try:
            verify_checkpoint(p, part, agree)
            return p
        except CheckpointError as err:
            if agree is None and _pruned_meanwhile(run_dir, p, ckpts):  # a newer one: look again
                return find_checkpoint(run_dir, None, part, agree)
            if part[0] == 0:
                warnings.warn(
                    f"skipping bad checkpoint: {err}; falling back to an earlier one",
                    TrainingWarning,
                    stacklevel=2,
                )
    return None


def _pruned_meanwhile(run_dir: str | Path, path: Path, listed: list[tuple[int, Path]]) -> bool:
    """Whether checkpoint `path` is gone because the training run pruned it after `listed` was
    taken (pruning renames a checkpoint away only once a newer one is complete)."""
    return not path.exists() and list_checkpoints(run_dir)[-1:] != listed[-1:]


def is_sharded(manifest: dict[str, Any]) -> bool:
    """Whether a checkpoint holds DCP shards (format 2) rather than one model.safetensors."""
    return manifest.get("format") == "dcp"


# Elements checked at once for NaN/inf: a boolean mask this large, never one the size of the
# largest tensor (an embedding of a 256k vocabulary).
_FINITE_CHUNK = 1 << 24


def nonfinite_tensors(named: Iterable[tuple[str, Any]]) -> list[str]:
    """Names of the floating-point tensors of `named` that hold a NaN or inf."""
    bad = []
    for name, t in named:
        if not hasattr(t, "is_floating_point") or not t.is_floating_point():
            continue
        flat = t.detach().reshape(-1)
        if not all(bool(chunk.isfinite().all()) for chunk in flat.split(_FINITE_CHUNK)):
            bad.append(name)
    return bad


def require_finite(named: Iterable[tuple[str, Any]], where: str, fix: str) -> None:
    """Finite or refused: the weights a run starts from (`named`, read from `where`), checked
    before anything is written. A run never keeps a non-finite weight (the trainer refuses to
    checkpoint one), so it never starts from one either: CheckpointError naming the tensors,
    `where`, and `fix`."""
    bad = nonfinite_tensors(named)
    if bad:
        shown = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
        raise CheckpointError(
            f"{where}: {len(bad)} tensor(s) hold NaN or inf ({shown}); a run never starts from "
            f"non-finite weights, so nothing was written. {fix}"
        )


def load_model_state(path: str | Path, verify: bool = True) -> dict[str, Any]:
    """Full (unsharded) weights of one checkpoint directory on CPU, keyed by parameter name,
    converted from the shards in this one process (what eval, export and tests read). Only
    files the manifest names are read (`dcp.load_model_state` holds the index to them)."""
    path = Path(path)
    manifest = verify_checkpoint(path) if verify else read_manifest(path)
    try:
        if not is_sharded(manifest):
            from safetensors.torch import load_file  # lazy: torch-free module (see _write_state)

            weights = check_regular(path / MODEL_FILE, what="checkpoint weights file")
            return load_file(str(weights), device="cpu")
        from taperlm.checkpoint import dcp  # lazy: torch-free module (see _write_state)

        return dcp.load_model_state(path, shard_sizes(manifest))
    except CheckpointError:
        raise  # already says which file and what to do
    except Exception as err:  # safetensors / DCP raise their own error types on bad files
        raise CheckpointError(
            f"checkpoint {path}: the model weights cannot be read ({_reason(err)}); delete this "
            "checkpoint or resume from an earlier one"
        ) from None


def load_train_state(path: str | Path, manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    """The small non-tensor state (`state.pt`) of a checkpoint ({} if absent): a regular file
    of the size its manifest gives, an uncompressed torch archive (a DEFLATE member could
    inflate past any bound while torch reads it), read with `weights_only=True`."""
    import torch  # lazy: torch-free module (see _write_state)

    path = Path(path)
    state_path = path / STATE_FILE
    if not state_path.is_file() and not_a_file(state_path) is None:
        return {}
    manifest = read_manifest(path) if manifest is None else manifest
    info = manifest["files"].get(STATE_FILE)
    size = info["bytes"] if isinstance(info, dict) else None
    try:
        with open_regular(state_path, size, "checkpoint state file") as f:
            check_stored_zip(f, os.fstat(f.fileno()).st_size, f"checkpoint file {state_path}")
            return torch.load(f, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(
            f"checkpoint file {state_path} cannot be read ({_reason(err)}); delete this "
            "checkpoint or resume from an earlier one"
        ) from None


def load_checkpoint(path: str | Path, verify: bool = True) -> tuple[dict, dict, dict]:
    """(model_state, train_state, manifest) of one checkpoint directory, on CPU."""
    path = Path(path)
    manifest = verify_checkpoint(path) if verify else read_manifest(path)
    return load_model_state(path, verify=False), load_train_state(path, manifest), manifest

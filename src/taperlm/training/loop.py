"""The trainer: one code path for 1 process, DDP and FSDP2, CPU and CUDA.

One optimizer step consumes `train.batch_tokens` tokens globally: every rank runs
`accum = batch_tokens / (seq_len x micro_batch_size x world_size)` micro-batches, each loss
scaled by 1/accum, and the gradients are averaged across ranks on the last micro-batch.
`step` counts optimizer steps attempted (skipped non-finite steps included); checkpoints and
metric lines are labelled with the number of steps completed.

Resuming restores the model, the optimizer, the step (the LR schedule is a function of it), the
data position, every RNG and any gradients still accumulating for parameters with
`update_period > 1`, so an interrupted run continues exactly as if it had not stopped (bitwise on
CPU).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from taperlm.config import (
    RUNTIME_KEYS,
    RunConfig,
    TrainConfig,
    load_run_config,
    run_config_from_dict,
    save_yaml,
    to_dict,
)
from taperlm.device import is_out_of_memory, memory_error, out_of_memory
from taperlm.domains import check_output
from taperlm.errors import CheckpointError, ConfigError, DataError, RunInUseError, TrainingError
from taperlm.outdirs import KINDS, check_folder, claim
from taperlm.runlock import LOCK_FILE, RunLock
from taperlm.training import checkpoint as ckpt
from taperlm.training import distributed as D
from taperlm.training.checkpointer import ShardedCheckpointer
from taperlm.training.guard import StepGuard, first_nonfinite
from taperlm.training.loggers import Loggers, layer_grad_norms
from taperlm.training.meta_init import build_on_meta, materialize
from taperlm.training.metrics import MetricsWriter, mfu, peak_flops
from taperlm.training.optim import (
    LRSchedule,
    build_optimizer,
    groups_due,
    parameter_periods,
    set_lr,
)
from taperlm.training.sharded import load_training_state, training_state
from taperlm.training.validation import autocast, uses_bf16, validation_loss

RESUME_MODES = ("auto", "never", "must")
# on_step(completed steps, total steps, loss) -> None | "checkpoint" | "stop"
StepHook = Callable[[int, int, float], "str | None"]
NAN_ENV = "TAPERLM_INJECT_NAN_AT_STEP"


@dataclass
class TrainResult:
    """What a finished (or stopped) run reached."""

    run_dir: Path
    step: int
    tokens: int
    train_loss: float | None
    val_loss: float | None
    tokens_per_s: float
    skipped_steps: int
    total_steps: int

    @property
    def finished(self) -> bool:
        return self.step >= self.total_steps


# ----------------------------------------------------------------------------------------------
# configuration checks


def accumulation_steps(cfg: TrainConfig, world_size: int) -> int:
    """Micro-batches per rank per optimizer step; ConfigError listing valid batch sizes."""
    per_micro = cfg.seq_len * cfg.micro_batch_size * world_size
    if cfg.batch_tokens < per_micro or cfg.batch_tokens % per_micro:
        ok = ", ".join(str(per_micro * k) for k in (1, 2, 4, 8, 16))
        raise ConfigError(
            f"train.batch_tokens ({cfg.batch_tokens}) must be a positive multiple of "
            f"train.seq_len x train.micro_batch_size x world size = {cfg.seq_len} x "
            f"{cfg.micro_batch_size} x {world_size} = {per_micro}; valid values: {ok}, ... "
            "(or change micro_batch_size / seq_len)"
        )
    return cfg.batch_tokens // per_micro


def validate_train_config(run: RunConfig, world_size: int = 1) -> None:
    """Every declared domain (`taperlm.domains`), then the checks between train fields."""
    run.validate()
    t = run.train
    if t.seq_len > run.model.context_length:
        raise ConfigError(
            f"train.seq_len ({t.seq_len}) exceeds model.context_length "
            f"({run.model.context_length}); lower seq_len or raise context_length"
        )
    if t.tokens < t.batch_tokens:
        raise ConfigError(
            f"train.tokens ({t.tokens}) is less than one batch (train.batch_tokens = "
            f"{t.batch_tokens}); raise tokens or lower batch_tokens"
        )
    accumulation_steps(t, world_size)


def resume_conflicts(
    old: RunConfig | dict[str, Any], new: RunConfig | dict[str, Any]
) -> list[tuple[str, Any, Any]]:
    """Differences between a run's saved config and a new one that would change the result
    (RUNTIME_KEYS excluded). A dict (e.g. from result.json) is read as a run config first, so
    configs written by older versions compare by meaning, not by layout."""

    def as_dict(cfg: RunConfig | dict[str, Any]) -> dict[str, Any]:
        return to_dict(cfg if isinstance(cfg, RunConfig) else run_config_from_dict(cfg))

    diffs = ckpt.config_differences(as_dict(old), as_dict(new))
    return [d for d in diffs if d[0] not in RUNTIME_KEYS]


def _prepare_run_dir(
    run: RunConfig, out: Path, resume: str, info: D.DistInfo | None = None
) -> Path | None:
    """Check the run dir against the config and resume mode; return the checkpoint to resume.

    Read-only: every rank calls it and reaches the same verdict (no rank hangs on an error);
    each rank hashes only its share of a checkpoint's files.
    """
    if resume not in RESUME_MODES:
        raise ConfigError(f"--resume {resume!r} is unknown; choose auto, never or must")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder; choose a folder for the run")
    have = ckpt.list_checkpoints(out)
    if resume == "never":
        if have:
            raise ConfigError(
                f"{out} already holds checkpoints (newest: {have[-1][1].name}) and --resume is "
                "never; train into a fresh --out directory, or use --resume auto to continue it"
            )
        return None
    if resume == "must" and not have:
        raise CheckpointError(
            f"--resume must, but {out} has no checkpoint; train it first or use --resume auto"
        )
    if not have:
        return None
    cfg_path = out / "config.yaml"
    if cfg_path.is_file():
        try:
            old = load_run_config(cfg_path).resolve()
        except ConfigError as err:
            raise ConfigError(
                f"cannot resume {out}: its config.yaml is unreadable ({err}); use a fresh --out"
            ) from None
        conflicts = resume_conflicts(old, run)
        if conflicts:
            raise ConfigError(
                f"cannot resume {out} with a different config: "
                + ckpt.format_differences(conflicts, "run", "now")
                + f". Continue it with its own settings (`taperlm train --out {out}`), or train "
                "into a fresh --out directory"
            )
    info = info or D.DistInfo()
    found = ckpt.find_checkpoint(
        out, part=(info.rank, info.world_size), agree=lambda x: D.gather_objects(x, info)
    )
    if found is None:
        # Never silently restart from scratch over a run's (possibly repairable) checkpoints.
        raise CheckpointError(
            f"none of the {len(have)} checkpoint(s) in {ckpt.checkpoints_dir(out)} verifies "
            "(see the warnings above): they are corrupt or incomplete. Restore them from a "
            "backup, delete them to restart this run from step 0, or train into a fresh --out"
        )
    return found


# ----------------------------------------------------------------------------------------------
# helpers


def _rng_state() -> dict[str, Any]:
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


def _set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], n[1].numpy(), *n[2:]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _poisoned_steps():
    """Test hook: TAPERLM_INJECT_NAN_AT_STEP="3" | "3,5" | "3-" (from step 3 on; 1-based) ->
    a predicate on the 1-based step number."""
    raw = os.environ.get(NAN_ENV, "").strip()
    steps: set[int] = set()
    start = None
    for part in filter(None, (p.strip() for p in raw.split(","))):
        if part.endswith("-"):
            start = int(part[:-1])
        else:
            steps.add(int(part))
    return lambda n: n in steps or (start is not None and n >= start)


class _Throughput:
    """Tokens/s of the training steps: per logging window (evaluation and checkpoint time
    excluded) and over the whole run (step time only)."""

    def __init__(self) -> None:
        self.window_start, self.window_tokens = time.perf_counter(), 0
        self.step_seconds, self.step_tokens = 0.0, 0

    def step(self, seconds: float, tokens: int) -> None:
        self.step_seconds += seconds
        self.step_tokens += tokens
        self.window_tokens += tokens

    def window_rate(self) -> float:
        """Tokens/s since the last call (or the start), and start a new window."""
        now = time.perf_counter()
        rate = self.window_tokens / max(now - self.window_start, 1e-9)
        self.window_start, self.window_tokens = now, 0
        return rate

    @contextlib.contextmanager
    def paused(self):
        """Time spent in the block does not count against the current window."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.window_start += time.perf_counter() - t0

    def mean_rate(self) -> float:
        return self.step_tokens / self.step_seconds if self.step_seconds > 0 else 0.0


def _raise_compile_limits(n_shapes: int) -> None:
    """Each distinct layer width is a new shape for dynamo; allow that many recompiles."""
    import torch._dynamo

    need = n_shapes + 8
    cfg = torch._dynamo.config
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(cfg, name) and getattr(cfg, name) < need:
            setattr(cfg, name, need)
    for name in ("accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(cfg, name) and getattr(cfg, name) < 8 * need:
            setattr(cfg, name, 8 * need)


def _flops_per_token(run: RunConfig) -> int | None:
    from taperlm.budget import flops_per_token

    try:
        return flops_per_token(run.model, run.train.seq_len)
    except (NotImplementedError, KeyError):
        return None


def _warn(msg: str) -> None:
    import warnings

    warnings.warn(msg, ckpt.TrainingWarning, stacklevel=3)


# ----------------------------------------------------------------------------------------------
# the trainer


class Trainer:
    """Holds the state of one run; `fit()` trains to the end (or to `stop_after`)."""

    def __init__(self, run: RunConfig, out_dir: str | Path, resume: str = "auto") -> None:
        self._lock: RunLock | None = None
        self._created_out = False
        self._prev_deterministic: bool | None = None
        try:
            with out_of_memory(
                lambda: (
                    f"starting the run on {getattr(self, 'device', 'its device')} (a "
                    f"{run.model.family} model of {_params(run):,} parameters with AdamW state)"
                ),
                "use a smaller model, another device, or shard it (train.parallel fsdp under "
                "torchrun)",
            ):
                self._setup(run, out_dir, resume)
        except BaseException:
            self.close()
            self._discard_unused_run_dir()
            raise

    def _setup(self, run: RunConfig, out_dir: str | Path, resume: str) -> None:
        from taperlm.data.identity import check_run_data, read_record, record_run_data
        from taperlm.data.loader import TokenBatches, check_data_fits, check_vocab

        self.run = run.resolve()
        self.cfg = run.train
        self.out = Path(out_dir)
        self.info = D.init_distributed(self.cfg.device)
        validate_train_config(self.run, self.info.world_size)
        self.accum = accumulation_steps(self.cfg, self.info.world_size)
        self.total_steps = self.cfg.steps
        if self.info.is_main and (note := self.cfg.rounding_note()):
            print(f"taperlm train: note: {note}", file=sys.stderr)
        self.schedule = LRSchedule.from_config(self.cfg, self.total_steps)
        self.device = self.info.device
        self._check_memory()

        data_dir = Path(self.run.data.dir) if self.run.data.dir else None
        if data_dir is None:
            raise ConfigError(
                "no data directory: pass --data DIR (a folder written by `taperlm prepare`) "
                "or set data.dir in the config"
            )
        if not data_dir.is_dir():
            raise DataError(
                f"data directory {data_dir} does not exist; create it with "
                f"`taperlm prepare --source SRC --out {data_dir}`"
            )
        self.data_dir = data_dir
        check_vocab(data_dir, self.run.model.vocab_size)
        # Too little data for one step (or one validation window) fails now, not after steps.
        check_data_fits(
            data_dir, self.cfg.seq_len, self.cfg.batch_tokens // self.cfg.seq_len,
            validate=self.cfg.eval_tokens > 0,
        )  # fmt: skip
        # The run dir can be written (not a file, not under one, not the data dir) before any
        # work starts; the CLI checks --out the same way, this covers in-process callers.
        check_output(self.out, "dir", "the run dir", [("the data dir", data_dir)])

        self._take_run_dir()
        resume_from = _prepare_run_dir(self.run, self.out, resume, self.info)
        if resume_from is not None:
            why = check_run_data(self.out, data_dir, ("train", "val"))
            if why:
                raise DataError(
                    f"cannot resume {self.out}: the data dir {data_dir} is not the data this run "
                    f"was trained on: {why}. Resume with that data (--data or data.dir), or train "
                    "into a fresh --out"
                )

        # Determinism: every rank builds the same initial weights from the same seed.
        self._prev_deterministic = torch.are_deterministic_algorithms_enabled()
        if self.device.type == "cpu":
            torch.use_deterministic_algorithms(True, warn_only=True)
        _seed_everything(self.cfg.seed)
        self.model, self.wrapped, periods = self._build_model()
        self.forward = self.wrapped
        if self.cfg.compile:
            self.forward = self._compile(self.wrapped)
        self.optimizer = build_optimizer(self.model, self.cfg, self.device, periods)
        self.guard = StepGuard(self.model, self.optimizer, self.cfg.restore_nonfinite)
        self._bad_update: str | None = None
        self.periodic = [(n, p) for n, p in self.model.named_parameters() if n in periods]
        self.checkpointer = ShardedCheckpointer(self.out, self.info, self.cfg.async_checkpoint)

        self.batches = TokenBatches(
            data_dir,
            "train",
            self.cfg.seq_len,
            self.cfg.micro_batch_size,
            rank=self.info.rank,
            world_size=self.info.world_size,
            seed=self.cfg.seed,
        )
        self.step = 0
        self.tokens = 0
        self.skipped = 0
        self.bad_streak = 0
        self.last_loss: float | None = None
        self.last_val: float | None = None
        self.metrics = MetricsWriter(self.out / "metrics.jsonl")
        if resume_from is not None:
            self._restore(resume_from)
        # Written only once the resume succeeded, so a failed resume leaves the old config intact.
        err = None
        if self.info.is_main:
            try:
                save_yaml(self.run, self.out / "config.yaml")
                if resume_from is None or read_record(self.out) is None:
                    record_run_data(self.out, data_dir)  # the run's tokenizer and data identity
            except OSError as e:
                err = _os_error_message(Path(e.filename or self.out / "config.yaml"), e, self.out)
        err = D.broadcast_object(err, self.info)
        if err is not None:
            raise CheckpointError(err)
        if self.info.is_main:
            self._guard_metrics(self.metrics.truncate_after, self.step)
        self.loggers = Loggers.open(self.run, self.out, self.info.is_main, self.step)
        self._iter = iter(self.batches)
        self.fpt = _flops_per_token(self.run)
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None
        self.peak = peak_flops(self.device.type, name, getattr(self.cfg, "peak_flops", None))

    # -- setup ---------------------------------------------------------------------------------

    def _check_memory(self) -> None:
        """The weights, gradients and AdamW state this rank will hold fit on its device, checked
        before anything is built or read (a model of 554B parameters used to allocate GBs
        before failing)."""
        from taperlm.budget import memory_floor
        from taperlm.device import check_memory

        fsdp = self.cfg.parallel == "fsdp" and self.info.enabled
        need, detail = memory_floor(
            self.run.model, training=True, shards=self.info.world_size if fsdp else 1
        )
        check_memory(
            need,
            f"training this {self.run.model.family} model",
            str(self.device),
            detail,
            "use a smaller model, another device, or shard it (train.parallel fsdp under "
            "torchrun); `taperlm plan --gpus N` estimates a run's memory",
        )

    def _build_model(self) -> tuple[torch.nn.Module, torch.nn.Module, dict[str, int]]:
        """(model, the module to call, update periods by name). Built on the meta device and
        materialised after sharding (FSDP2) or before wrapping (DDP, one process), with the
        weights a whole CPU build gives for the seed; the periods are read before any wrapper
        can replace the parameters that carry them."""
        from taperlm.models.layers import set_activation_checkpointing

        model = build_on_meta(self.run.model)
        periods = parameter_periods(model)
        set_activation_checkpointing(model, self.cfg.activation_checkpointing == "full")
        if self.cfg.parallel == "fsdp" and self.info.enabled:
            wrapped = D.wrap_model(model, "fsdp", self.info, self._mixed_precision())
            materialize(model, self.device, self._paired_seed())
        else:
            materialize(model, self.device, self._paired_seed())
            wrapped = D.wrap_model(model, self.cfg.parallel, self.info)
        return model, wrapped, periods

    def _paired_seed(self) -> int | None:
        """The seed of the keyed weight draws when train.paired_init is on."""
        return self.cfg.seed if self.cfg.paired_init else None

    def _mixed_precision(self):
        """FSDP2's policy: bf16 compute copies when the run computes in bf16 (configurable)."""
        bf16 = uses_bf16(self.device, self.cfg.precision)
        param = {"auto": bf16, "bf16": True, "fp32": False}[self.cfg.fsdp_param_dtype]
        return D.mixed_precision_policy(
            torch.bfloat16 if param else torch.float32,
            torch.bfloat16 if self.cfg.fsdp_reduce_dtype == "bf16" else torch.float32,
        )

    def _take_run_dir(self) -> None:
        """Create the run dir and take its lock (rank 0, for the whole job): one writer per run
        dir. Every rank gets rank 0's verdict, so no rank hangs on another's error."""
        err: tuple[str, str] | None = None
        if self.info.is_main:
            try:
                self._created_out = not self.out.exists()
                check_folder(self.out, "run", "--out")  # library callers too: never a foreign one
                claim(self.out, "run")
                self._lock = RunLock(self.out).acquire()
            except ConfigError as e:
                err = ("config", str(e))
            except OSError as e:
                path = Path(e.filename) if e.filename else self.out
                err = ("os", _os_error_message(path, e, self.out))
            except RunInUseError as e:
                err = ("busy", str(e))
        err = D.broadcast_object(err, self.info)
        if err is not None:
            kinds = {"busy": RunInUseError, "config": ConfigError}
            raise kinds.get(err[0], CheckpointError)(err[1])

    def _discard_unused_run_dir(self) -> None:
        """After a failed start: remove the run dir this attempt created if nothing but its
        lock file was written (a bad --resume must not leave an empty run behind)."""
        if not self._created_out or not self.out.is_dir():
            return
        if {p.name for p in self.out.iterdir()} <= {LOCK_FILE, KINDS["run"].marker}:
            (self.out / LOCK_FILE).unlink(missing_ok=True)
            (self.out / KINDS["run"].marker).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.out.rmdir()

    def _compile(self, module: torch.nn.Module):
        """torch.compile the whole model, or (compile_scope blocks) each block's forward in place
        (parameter names, FSDP hooks and activation checkpointing stay outside the graphs)."""
        widths = set(self.run.model.mlp_widths or [])
        _raise_compile_limits(len(widths) + 1)
        try:
            if self.cfg.compile_scope == "blocks":
                for block in self.model.blocks:
                    block.forward = torch.compile(block.forward)
                return module
            return torch.compile(module)
        except Exception as err:  # e.g. unsupported platform
            self._uncompile()
            _warn(f"torch.compile failed ({type(err).__name__}: {err}); training eagerly")
            return module

    def _uncompile(self) -> None:
        for block in self.model.blocks:
            block.__dict__.pop("forward", None)  # back to the class's eager forward

    def _forward_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with autocast(self.device, self.cfg.precision):
            try:
                return self.forward(x, targets=y).loss
            except Exception as err:
                if not self.cfg.compile or not _is_compile_error(err):
                    raise
                _warn(f"torch.compile failed ({type(err).__name__}: {err}); training eagerly")
                self._uncompile()
                self.forward = self.wrapped
                return self.forward(x, targets=y).loss

    def _log(self, record: dict[str, Any]) -> None:
        self._guard_metrics(self.metrics.write, record)
        self.loggers.log(record)

    def _log_layer_grads_if_due(self, params: list[torch.Tensor]) -> None:
        """Per-layer gradient norms of the step being taken, every train.log_grads_every steps
        (collective under FSDP2: every rank computes them)."""
        every, step = self.cfg.log_grads_every, self.step + 1
        if not every or step % every:
            return
        due = {id(p) for p in params}
        named = [(n, p) for n, p in self.model.named_parameters() if id(p) in due]
        sharded = self.cfg.parallel == "fsdp" and self.info.enabled
        norms = layer_grad_norms(named, self.run.model.n_layers, sharded)
        if self.info.is_main:
            self._log({"step": step, "tokens": self.tokens + self.cfg.batch_tokens, **norms})

    def _guard_metrics(self, fn, arg) -> None:
        """A failed metrics write (disk full, read-only dir) stops the run with a clear error."""
        try:
            fn(arg)
        except OSError as e:
            raise CheckpointError(_os_error_message(self.metrics.path, e, self.out)) from None

    # -- checkpoints ---------------------------------------------------------------------------

    def _train_state(self) -> dict[str, Any]:
        """The small, non-tensor part of a checkpoint (rank 0's is kept); collective."""
        return {
            "step": self.step,
            "tokens": self.tokens,
            "skipped_steps": self.skipped,
            "bad_streak": self.bad_streak,
            "scheduler": self.schedule.state_dict(),
            "loader": D.gather_objects(self.batches.state_dict(), self.info),
            "rng": _rng_state(),
            "world_size": self.info.world_size,
            "last_loss": self.last_loss,
            "last_val_loss": self.last_val,
        }

    def save(self, use_async: bool | None = None) -> None:
        """Checkpoint the current step: every rank writes its shards (sharded.py), rank 0 commits
        (collective; in the background with train.async_checkpoint). Never a state with a
        NaN/inf in it."""
        bad = first_nonfinite(self.model.named_parameters(), self.optimizer, self.info)
        if bad is not None:
            raise TrainingError(
                f"refusing to checkpoint step {self.step}: {bad} holds NaN/inf; {self._last_good()}"
            )
        tensors = training_state(self.model, self.optimizer, self.periodic)
        self.checkpointer.save(
            self.step,
            tensors,
            self._train_state(),
            to_dict(self.run),
            self.cfg.keep_checkpoints,
            use_async=use_async,
        )

    def _restore(self, path: Path) -> None:
        manifest = ckpt.read_manifest(path)
        try:
            if ckpt.is_sharded(manifest):
                load_training_state(path, self.model, self.optimizer, self.periodic)
                state = ckpt.load_train_state(path)
            else:
                state = self._restore_full(path)
        except (RuntimeError, KeyError, ValueError) as err:
            raise CheckpointError(
                f"checkpoint {path} does not fit this model: {str(err).splitlines()[0]}"
            ) from None
        loaders = state["loader"]
        # The loader's position is a global sample index, so a run may resume on another number
        # of processes: rank 0's state then continues every rank.
        same_world = len(loaders) == self.info.world_size
        try:
            self.batches.load_state_dict(loaders[self.info.rank if same_world else 0])
        except DataError as err:
            raise CheckpointError(f"cannot resume from {path}: {err}") from None
        _set_rng_state(state["rng"])
        self.step = int(state["step"])
        self.tokens = int(state["tokens"])
        self.skipped = int(state.get("skipped_steps", 0))
        self.bad_streak = int(state.get("bad_streak", 0))
        self.last_loss = state.get("last_loss")
        self.last_val = state.get("last_val_loss")

    def _restore_full(self, path: Path) -> dict[str, Any]:
        """Resume from a format-1 checkpoint (full weights and optimizer state in one file)."""
        model_state, state, _ = ckpt.load_checkpoint(path, verify=False)  # verified on lookup
        D.load_full_model_state(self.model, model_state)
        D.load_optimizer_state(self.model, self.optimizer, state["optimizer"], full=True)
        params = dict(self.model.named_parameters())
        for name, g in state.get("pending_grads", {}).items():
            params[name].grad = D.like_param(g, params[name])
        return state

    # -- evaluation ----------------------------------------------------------------------------

    def evaluate(self) -> float | None:
        """Mean validation loss over `eval_tokens` tokens (the same batches on every rank)."""
        if self.cfg.eval_tokens <= 0:
            return None
        self.model.eval()
        try:
            loss, count = validation_loss(
                self.model,
                self.data_dir,
                self.cfg.seq_len,
                self.cfg.micro_batch_size,
                self.cfg.eval_tokens,
                self.cfg.precision,
                self.device,
            )
        finally:
            self.model.train()
        return loss if count else None

    # -- training ------------------------------------------------------------------------------

    def _micro_steps(self, poison: bool) -> torch.Tensor:
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(self.accum):
            x, y = next(self._iter)
            self._check_ids(x, y)
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
            with D.no_sync(self.wrapped, self.model, sync=micro == self.accum - 1):
                loss = self._forward_loss(x, y) / self.accum
                loss.backward()
            loss_sum += loss.detach()
        if poison:
            loss_sum = loss_sum * float("nan")
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.fill_(float("nan"))
        return loss_sum

    def _check_ids(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Ids beyond the embedding would fail deep inside torch; name the problem instead."""
        vocab = self.run.model.vocab_size
        hi = max(int(x.max()), int(y.max()))
        lo = min(int(x.min()), int(y.min()))
        if hi >= vocab or lo < 0:
            bad = hi if hi >= vocab else lo
            raise DataError(
                f"{self.data_dir}: token id {bad} (in the batch of step {self.step + 1}) is "
                f"outside [0, model.vocab_size={vocab}); the data was tokenized with another "
                "vocabulary: re-run `taperlm prepare` or set model.vocab_size to the tokenizer's"
            )

    def _optimizer_step(self) -> tuple[bool, float]:
        """Clip and step the groups due at this step; (finite, grad norm)."""
        due = groups_due(self.optimizer, self.step)
        due_ids = {id(g) for g in due}
        params = [p for g in due for p in g["params"] if p.grad is not None]
        clip = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        self._log_layer_grads_if_due(params)
        norm = torch.nn.utils.clip_grad_norm_(params, clip, foreach=True) if params else None
        gnorm = float(D.full_tensor(norm)) if norm is not None else 0.0
        if not math.isfinite(gnorm):
            return False, gnorm
        # Step only the due groups: params of other groups hide their (accumulating) grads.
        hidden = {}
        for g in self.optimizer.param_groups:
            if id(g) not in due_ids:
                for p in g["params"]:
                    if p.grad is not None:
                        hidden[p] = p.grad
                        p.grad = None
        self.guard.before(params)
        try:
            self.optimizer.step()
            bad = self.guard.check(params, self.info)
        except RuntimeError as err:  # e.g. lr / (1 - beta1^t) beyond float32: half-updated
            if "overflow" not in str(err):
                raise
            bad = f"the optimizer's update ({str(err).splitlines()[0]})"
        for p, grad in hidden.items():
            p.grad = grad
        if bad is not None:
            self._undo_nonfinite_update(bad, gnorm)
            return False, gnorm
        for g in due:
            for p in g["params"]:
                p.grad = None
        return True, gnorm

    def _undo_nonfinite_update(self, bad: str, gnorm: float) -> None:
        """A step with a finite loss and gradient left NaN/inf in `bad`: put the weights and
        optimizer state back (the step then counts as skipped), or stop the run."""
        self._bad_update = f"step {self.step + 1} left NaN/inf in {bad}"
        if self.guard.keep_copy:
            self.guard.undo()
            return
        raise TrainingError(
            f"{self._bad_update} although its loss and gradient norm ({gnorm:.4g}) were finite; "
            f"stopping before it can be saved, {self._last_good()}. Lower train.lr or "
            "train.weight_decay, or set train.restore_nonfinite: true to undo and skip such steps"
        )

    def _last_good(self) -> str:
        good = ckpt.list_checkpoints(self.out)
        return (
            f"the last good checkpoint {good[-1][1]} is intact"
            if good
            else "no checkpoint was written yet"
        )

    def fit(
        self,
        progress: bool = True,
        stop_after: int | None = None,
        on_step: StepHook | None = None,
    ) -> TrainResult:
        """Train to the end (or until `stop_after` completed steps): one optimizer step at a
        time, then logging, evaluation and checkpoints when they are due. `on_step` is told
        of every step (on every rank: under torchrun its answer must be the same on all, as
        `training.interrupt.SignalStop` ensures) and may ask for a checkpoint or a stop."""
        from taperlm.progress import progress_bar

        if progress and self.info.is_main and 0 < self.step < self.total_steps:
            print(
                f"taperlm train: resuming {self.out} from its checkpoint at step {self.step}; "
                f"continuing at step {self.step + 1} of {self.total_steps}",
                file=sys.stderr,
            )
        bar = progress_bar(
            total=self.total_steps * self.cfg.batch_tokens,
            initial=self.tokens,
            unit="tok",
            unit_scale=True,
            dynamic_ncols=True,
            desc=f"train {self.out.name}",
            disable=not (progress and self.info.is_main),
        )
        poisoned = _poisoned_steps()
        clock = _Throughput()
        self.model.train()
        try:
            while self.step < self.total_steps and (stop_after is None or self.step < stop_after):
                t0 = time.perf_counter()
                loss, lr, gnorm = self._step(poison=poisoned(self.step + 1))
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                clock.step(time.perf_counter() - t0, self.cfg.batch_tokens)
                bar.update(self.cfg.batch_tokens)
                bar.set_postfix(loss=f"{loss:.4f}", step=f"{self.step:,}", refresh=False)
                self._stop_if_diverged(loss, gnorm)
                last = self.step == self.total_steps
                self._log_if_due(last, loss, lr, gnorm, clock)
                with clock.paused():
                    self._evaluate_if_due(last)
                action = on_step(self.step, self.total_steps, loss) if on_step else None
                if action not in (None, "checkpoint", "stop"):
                    raise ValueError(
                        f"on_step returned {action!r}; expected None, checkpoint, stop"
                    )
                with clock.paused():
                    self._checkpoint_if_due(last or self.step == stop_after or action is not None)
                if action == "stop":
                    break
        except Exception as err:
            if not is_out_of_memory(err):
                raise
            raise memory_error(
                err,
                f"step {self.step + 1} on {self.device}",
                "lower train.micro_batch_size (gradient accumulation keeps train.batch_tokens) "
                f"or train.seq_len; {self._last_good()}",
            ) from None
        finally:
            bar.close()
        if self.info.is_main and self.step >= self.total_steps:
            self._plot()
        return TrainResult(
            run_dir=self.out,
            step=self.step,
            tokens=self.tokens,
            train_loss=self.last_loss,
            val_loss=self.last_val,
            tokens_per_s=clock.mean_rate(),
            skipped_steps=self.skipped,
            total_steps=self.total_steps,
        )

    def _step(self, poison: bool) -> tuple[float, float, float]:
        """One optimizer step (skipped when the loss or gradient is not finite); (loss, lr,
        grad norm)."""
        lr = self.schedule(self.step)
        set_lr(self.optimizer, lr)
        loss_sum = self._micro_steps(poison)
        loss = float(D.all_reduce_mean(loss_sum.float().reshape(1), self.info)[0])
        if math.isfinite(loss):
            ok, gnorm = self._optimizer_step()
        else:
            ok, gnorm = False, float("nan")
        if not ok:
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped += 1
            self.bad_streak += 1
        else:
            self.bad_streak = 0
            self.last_loss = loss
        self.step += 1
        self.tokens += self.cfg.batch_tokens
        return loss, lr, gnorm

    def _stop_if_diverged(self, loss: float, gnorm: float) -> None:
        if self.bad_streak < self.cfg.max_bad_steps:
            return
        update = f"; the last bad update: {self._bad_update}" if self._bad_update else ""
        raise TrainingError(
            f"{self.bad_streak} consecutive steps (up to step {self.step}) had a "
            f"non-finite loss or gradient norm or left non-finite weights (loss {loss}, grad "
            f"norm {gnorm}{update}); stopping, {self._last_good()}. {self._divergence_cause()}"
        )

    def _divergence_cause(self) -> str:
        """What to change, from what the run shows rather than a guess: a non-finite buffer
        names itself; a loss that was never finite on the untouched initial weights is not the
        learning rate's doing; otherwise the updates diverged."""
        for name, buf in self.model.named_buffers():
            if buf.is_floating_point() and not bool(torch.isfinite(buf).all()):
                return (
                    f"The model's buffer {name} holds NaN/inf (it is computed from the config, "
                    "e.g. the RoPE tables from model.rope_theta): fix the model config"
                )
        if self.skipped >= self.step:  # every step skipped: the weights are the initial ones
            return (
                "Every step so far was non-finite on the initial weights (no update was applied, "
                "so train.lr is not the cause): check model.init_std and model.norm_eps, try "
                "train.precision fp32, and check the data"
            )
        return "Lower train.lr, check the data, or raise train.max_bad_steps"

    def _log_if_due(
        self, last: bool, loss: float, lr: float, gnorm: float, clock: _Throughput
    ) -> None:
        every = self.cfg.log_every
        if not self.info.is_main or not (last or (every and self.step % every == 0)):
            return
        rate = clock.window_rate()
        self._log(
            {
                "step": self.step,
                "tokens": self.tokens,
                "loss": loss,
                "lr": lr,
                "grad_norm": gnorm,
                "tokens_per_s": rate,
                "mfu": mfu(rate, self.fpt or 0, self.peak, self.info.world_size),
                "skipped_steps": self.skipped,
            }
        )

    def _evaluate_if_due(self, last: bool) -> None:
        every = self.cfg.eval_every
        if not (last or (every and self.step % every == 0)):
            return
        val = self.evaluate()
        if val is None:
            return
        self.last_val = val
        if self.info.is_main:
            self._log(
                {
                    "step": self.step,
                    "tokens": self.tokens,
                    "val_loss": val,
                    "val_ppl": math.exp(min(val, 700.0)),
                }
            )

    def _checkpoint_if_due(self, stop: bool) -> None:
        """Commit a finished background save; checkpoint when due (the last one synchronously)."""
        self.checkpointer.poll()
        every = self.cfg.checkpoint_every
        if self.bad_streak == 0 and (stop or (every and self.step % every == 0)):
            self.save(use_async=False if stop else None)

    def _plot(self) -> None:
        from taperlm.training.plots import plot_run

        try:
            plot_run(self.out)
        except Exception as err:  # a plot must never fail a finished run
            _warn(f"could not write {self.out / 'loss.png'}: {err}")

    def close(self) -> None:
        """Finish a background checkpoint, restore the determinism setting and release the run
        dir (idempotent; also after a failed start)."""
        try:
            checkpointer = getattr(self, "checkpointer", None)
            if checkpointer is not None:
                checkpointer.close()
        finally:
            loggers = getattr(self, "loggers", None)
            if loggers is not None:
                loggers.close()
            if self._prev_deterministic is not None:
                torch.use_deterministic_algorithms(self._prev_deterministic)
                self._prev_deterministic = None
            if self._lock is not None:
                self._lock.release()
                self._lock = None


def _params(run: RunConfig) -> int:
    from taperlm.budget import total_params

    try:
        return total_params(run.model)
    except Exception:  # an unresolved or invalid config: the count is only for the message
        return 0


def _os_error_message(path: Path, err: OSError, run_dir: Path) -> str:
    good = ckpt.list_checkpoints(run_dir)
    where = (
        f"the last checkpoint {good[-1][1]} is intact"
        if good
        else "no checkpoint has been written yet"
    )
    from taperlm.io import os_error_cause

    return (
        f"could not write {path}: {err.strerror or err} ({type(err).__name__}, errno "
        f"{err.errno}); {where}. {os_error_cause(err, path)}, then rerun the same "
        "command to resume"
    )


def _is_compile_error(err: Exception) -> bool:
    mod = type(err).__module__ or ""
    return mod.startswith(("torch._dynamo", "torch._inductor")) or "compile" in str(err).lower()


def train(
    run_config: RunConfig,
    out_dir: str | Path,
    resume: str = "auto",
    progress: bool = True,
    stop_after: int | None = None,
    on_step: StepHook | None = None,
) -> TrainResult:
    """Train `run_config` into run directory `out_dir` (resuming per `resume`: auto | never |
    must); returns what was reached. Works in-process and under torchrun. `stop_after` stops
    (with a checkpoint) after that many completed steps, e.g. to split a run into sessions.
    `on_step(step, total_steps, loss)` is called after every step of a single-process run and
    returns None, "checkpoint" (save one now) or "stop" (save one and return unfinished), e.g.
    for progress shown elsewhere and a clean stop on a signal."""
    trainer = Trainer(run_config, out_dir, resume)
    try:
        return trainer.fit(progress=progress, stop_after=stop_after, on_step=on_step)
    finally:
        trainer.close()

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

`Trainer.train_step` is one optimizer step, top to bottom: the step's LR, forward and backward
of its micro-batches (`forward_backward`), the loss, the clipped gradients of the parameters due,
the optimizer step (undone when it left NaN/inf) or a skip. The rest of this module is the loop
around it (logging / validation / checkpoint cadence, resume). What the step calls lives beside
it: the forward, eager or compiled with its fallback to eager, and the model build in `model`;
AdamW, Hope's update periods (`PeriodicOptimizer`, so the step is the same for every family) and
the LR schedule in `optim`; the undo of a non-finite update in `guard`; the run directory's
lifecycle (lock, resume verdict, data identity) in `run_dir`; checkpoints and RNG state in
`checkpoint/`; metrics.jsonl, throughput, MFU and the validation loss in `metrics`.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from taperlm.checkpoint import store as ckpt
from taperlm.checkpoint.dcp import training_state
from taperlm.config import RunConfig, to_dict
from taperlm.config.budget import total_params
from taperlm.data.loader import TokenBatches
from taperlm.errors import CheckpointError, DataError, TrainingError
from taperlm.files.io import error_text
from taperlm.runtime.device import is_out_of_memory, memory_error, out_of_memory
from taperlm.runtime.progress import progress_bar
from taperlm.training import distributed as D
from taperlm.training import run_dir as R
from taperlm.training import warn
from taperlm.training.checkpointer import (
    ShardedCheckpointer,
    restore_training,
    rng_state,
    seed_everything,
    set_rng_state,
)
from taperlm.training.distill import Teacher, check_same_teacher, load_initial_weights
from taperlm.training.guard import StepGuard, divergence_cause, first_nonfinite
from taperlm.training.loggers import Loggers, layer_grad_norms
from taperlm.training.metrics import (
    MetricsWriter,
    Throughput,
    mfu,
    model_flops_per_token,
    peak_flops,
    plot_run,
    validation_loss,
)
from taperlm.training.model import (
    TrainingForward,
    autocast,
    build_training_model,
    check_training_memory,
)
from taperlm.training.optim import LRSchedule, PeriodicOptimizer, build_optimizer, set_lr
from taperlm.training.settings import accumulation_steps, validate_train_config

# on_step(completed steps, total steps, loss) -> None | "checkpoint" | "stop"
StepHook = Callable[[int, int, float], "str | None"]


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
# the trainer


class Trainer:
    """Holds the state of one run; `fit()` trains to the end (or to `stop_after`)."""

    def __init__(
        self,
        run: RunConfig,
        out_dir: str | Path,
        resume: str = "auto",
        branch: tuple[Path, int] | None = None,
    ) -> None:
        self._run_dir: R.RunDir | None = None
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
                self._setup(run, out_dir, resume, branch)
        except BaseException:
            self.close()
            if self._run_dir is not None:
                self._run_dir.discard_if_unused()
            raise

    def _setup(
        self, run: RunConfig, out_dir: str | Path, resume: str, branch: tuple[Path, int] | None
    ) -> None:
        """Check everything, then take the run dir, build the model and optimizer, and restore
        a checkpoint to resume (its own, else `branch`'s: (source run dir, step), a WSD
        cooldown branch, `taperlm.training.run_dir.check_branch`); in an order that fails before
        any work that would be lost."""
        # The commands hand over the config their assembly resolved, used as is; one built in
        # Python is resolved here, once.
        self.run = run if run.model.resolved else run.resolve()
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
        check_training_memory(self.run, self.info)
        self.data_dir = R.check_data_dir(self.run, self.out)
        self._run_dir = R.RunDir(self.out)
        self._run_dir.take(self.info)
        resume_from = R.checkpoint_to_resume(self.run, self.out, resume, self.info)
        R.check_start_tokenizers(self.run, self.data_dir, resume_from is not None)
        if resume_from is not None:
            R.check_resume_data(self.out, self.data_dir)
        elif branch is not None:
            resume_from = R.check_branch(self.run, branch[0], branch[1], self.info)
            R.check_resume_data(Path(branch[0]), self.data_dir)
        self._build()
        # The teacher (one full copy per rank) and, for a new run, the weights it starts from.
        self.teacher = Teacher.load(self.run, self.device) if self.cfg.distill_from else None
        self.init_identity: str | None = None
        if resume_from is None and self.cfg.init_from:
            self.init_identity = load_initial_weights(self.run, self.model)
        self.step = 0
        self.tokens = 0
        self.skipped = 0
        self.bad_streak = 0
        self.last_loss: float | None = None
        self.last_val: float | None = None
        self.metrics = MetricsWriter(self.out / "metrics.jsonl")
        if resume_from is not None:
            self._restore(resume_from)
        R.write_run_record(self.run, self.out, self.data_dir, resume_from is not None, self.info)
        if branch is not None and self.info.is_main:
            R.record_branch(self.out, branch[0], branch[1])
        if self.info.is_main:
            self._guard_metrics(self.metrics.truncate_after, self.step)
        self.loggers = Loggers.open(self.run, self.out, self.info.is_main, self.step)
        self._iter = iter(self.batches)
        self.fpt = model_flops_per_token(self.run)
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None
        self.peak = peak_flops(self.device.type, name, getattr(self.cfg, "peak_flops", None))

    def _build(self) -> None:
        """The model (same initial weights on every rank, from the seed), its forward (compiled
        with train.compile), the optimizer (stepping each group at its update period), the step
        guard, the checkpoint saver and the batches."""
        self._prev_deterministic = torch.are_deterministic_algorithms_enabled()
        if self.device.type == "cpu":
            torch.use_deterministic_algorithms(True, warn_only=True)
        seed_everything(self.cfg.seed)
        self.model, self.wrapped, periods = build_training_model(self.run, self.info)
        n_shapes = len(set(self.run.model.mlp_widths or [])) + 1
        self.forward = TrainingForward(
            self.model, self.wrapped, self.cfg.compile, self.cfg.compile_scope, n_shapes
        )
        periodic = [(n, p) for n, p in self.model.named_parameters() if n in periods]
        self.optimizer = PeriodicOptimizer(
            build_optimizer(self.model, self.cfg, self.device, periods), periodic
        )
        self.guard = StepGuard(self.model, self.optimizer.inner, self.cfg.restore_nonfinite)
        self._bad_update: str | None = None
        self.checkpointer = ShardedCheckpointer(self.out, self.info, self.cfg.async_checkpoint)
        self.batches = TokenBatches(
            self.data_dir,
            "train",
            self.cfg.seq_len,
            self.cfg.micro_batch_size,
            rank=self.info.rank,
            world_size=self.info.world_size,
            seed=self.cfg.seed,
        )

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
            raise CheckpointError(R.os_error_message(self.metrics.path, e, self.out)) from None

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
            "rng": rng_state(),
            "world_size": self.info.world_size,
            "last_loss": self.last_loss,
            "last_val_loss": self.last_val,
            "distill_teacher": None if self.teacher is None else self.teacher.identity,
            "init_from": self.init_identity,
        }

    def save(self, use_async: bool | None = None) -> None:
        """Checkpoint the current step: every rank writes its shards (checkpoint/dcp.py), rank 0 commits
        (collective; in the background with train.async_checkpoint). Never a state with a
        NaN/inf in it."""
        bad = first_nonfinite(self.model.named_parameters(), self.optimizer.inner, self.info)
        if bad is not None:
            raise TrainingError(
                f"refusing to checkpoint step {self.step}: {bad} holds NaN/inf; {self._last_good()}"
            )
        tensors = training_state(self.model, self.optimizer.inner, self.optimizer.periodic)
        self.checkpointer.save(
            self.step,
            tensors,
            self._train_state(),
            to_dict(self.run),
            self.cfg.keep_checkpoints,
            use_async=use_async,
        )

    def _restore(self, path: Path) -> None:
        state = restore_training(path, self.model, self.optimizer.inner, self.optimizer.periodic)
        # finite or refused: a checkpoint this trainer wrote never holds NaN/inf (`save`), one
        # written otherwise (an older import, an edit) is not continued
        bad = first_nonfinite(self.model.named_parameters(), self.optimizer.inner, self.info)
        if bad is not None:
            raise CheckpointError(
                f"checkpoint {path}: {bad} holds NaN or inf (the first such tensor); a run never "
                "starts from non-finite weights, so nothing was written. Delete this checkpoint "
                "to resume from an earlier one"
            )
        try:
            self._continue_from(state, path)
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as err:
            # state.pt is a stranger's data too: a missing or mistyped entry is a damaged
            # checkpoint, not a traceback.
            what = f"has no {err.args[0]!r} entry" if isinstance(err, KeyError) else "is damaged"
            raise CheckpointError(
                f"checkpoint {path}: its {ckpt.STATE_FILE} {what} ({error_text(err)}); it was not "
                "written by this taperlm or was altered. Delete this checkpoint to resume from "
                "an earlier one"
            ) from None

    def _continue_from(self, state: dict[str, Any], path: Path) -> None:
        teacher = None if self.teacher is None else self.teacher.identity
        where = "" if self.teacher is None else str(self.teacher.checkpoint)
        if int(state["step"]) > 0:  # step 0 has made no update: any teacher may continue it
            check_same_teacher(state.get("distill_teacher"), teacher, path, where)
        self.init_identity = state.get("init_from")
        loaders = state["loader"]
        # The loader's position is a global sample index, so a run may resume on another number
        # of processes: rank 0's state then continues every rank.
        same_world = len(loaders) == self.info.world_size
        try:
            self.batches.load_state_dict(loaders[self.info.rank if same_world else 0])
        except DataError as err:
            raise CheckpointError(f"cannot resume from {path}: {err}") from None
        set_rng_state(state["rng"])
        self.step = int(state["step"])
        self.tokens = int(state["tokens"])
        self.skipped = int(state.get("skipped_steps", 0))
        self.bad_streak = int(state.get("bad_streak", 0))
        self.last_loss = state.get("last_loss")
        self.last_val = state.get("last_val_loss")

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

    # -- the training step ---------------------------------------------------------------------

    def train_step(self) -> tuple[float, float, float]:
        """One optimizer step, top to bottom; (loss, lr, grad norm). A step whose loss or gradient
        norm is not finite, or whose update left NaN/inf (undone), is skipped: no update, every
        gradient dropped, counted in `skipped`."""
        # the LR of this step (a function of the step count alone, so a resume needs only it)
        lr = self.schedule(self.step)
        set_lr(self.optimizer, lr)
        # forward, loss and backward of the step's micro-batches, gradients summed in `.grad`
        batches = [next(self._iter) for _ in range(self.accum)]
        try:
            loss_sum = self.forward_backward(batches)
        except Exception as err:
            # torch.compile failed (the forward, the lazily compiled backward, a recompile): the
            # step starts over eagerly on the same micro-batches, from zero gradients (a failed
            # backward may already have accumulated some)
            if not self.forward.fall_back(err):
                raise
            self.optimizer.zero_grad(set_to_none=True)
            loss_sum = self.forward_backward(batches)
        loss = float(D.all_reduce_mean(loss_sum.float().reshape(1), self.info)[0])
        # clip the gradients of the parameters this step updates (Hope: the groups due)
        params: list[torch.Tensor] = []
        updated, gnorm = False, float("nan")
        if math.isfinite(loss):
            params = self.optimizer.due(self.step)
            self._log_layer_grads_if_due(params)
            clip = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
            norm = torch.nn.utils.clip_grad_norm_(params, clip, foreach=True) if params else None
            gnorm = float(D.full_tensor(norm)) if norm is not None else 0.0
        # the optimizer step, guarded: an update that leaves NaN/inf is undone (or stops the run)
        if math.isfinite(gnorm):
            self.guard.before(params)
            try:
                self.optimizer.step()
                bad = self.guard.check(params, self.info)
            except RuntimeError as err:  # e.g. lr / (1 - beta1^t) beyond float32: half-updated
                if "overflow" not in str(err):
                    raise
                bad = f"the optimizer's update ({str(err).splitlines()[0]})"
            if bad is not None:
                self._undo_nonfinite_update(bad, gnorm)
            updated = bad is None
        # the step's bookkeeping
        if updated:
            self.bad_streak = 0
            self.last_loss = loss
        else:
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped += 1
            self.bad_streak += 1
        self.step += 1
        self.tokens += self.cfg.batch_tokens
        return loss, lr, gnorm

    def forward_backward(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Forward, loss and backward of each micro-batch (x, y), each loss scaled by 1/accum;
        the gradients are averaged across ranks on the last one. Returns this rank's loss (the
        sum of the scaled losses)."""
        loss_sum = torch.zeros((), device=self.device)
        for micro, (x, y) in enumerate(batches):
            self._check_ids(x, y)
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
            with D.no_sync(self.wrapped, self.model, sync=micro == len(batches) - 1):
                with autocast(self.device, self.cfg.precision):
                    out = self.forward(x, targets=y)
                    loss = out.loss
                    if self.teacher is not None:
                        loss = self.teacher.loss(out.logits, out.loss, x, y)
                loss = loss / self.accum
                loss.backward()
            loss_sum += loss.detach()
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
        clock = Throughput()
        self.model.train()
        try:
            while self.step < self.total_steps and (stop_after is None or self.step < stop_after):
                t0 = time.perf_counter()
                loss, lr, gnorm = self.train_step()
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

    def _stop_if_diverged(self, loss: float, gnorm: float) -> None:
        if self.bad_streak < self.cfg.max_bad_steps:
            return
        update = f"; the last bad update: {self._bad_update}" if self._bad_update else ""
        raise TrainingError(
            f"{self.bad_streak} consecutive steps (up to step {self.step}) had a "
            f"non-finite loss or gradient norm or left non-finite weights (loss {loss}, grad "
            f"norm {gnorm}{update}); stopping, {self._last_good()}. "
            f"{divergence_cause(self.model, self.skipped, self.step)}"
        )

    def _log_if_due(
        self, last: bool, loss: float, lr: float, gnorm: float, clock: Throughput
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
        try:
            plot_run(self.out)
        except Exception as err:  # a plot must never fail a finished run
            warn(f"could not write {self.out / 'loss.png'}: {err}")

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
            if self._run_dir is not None:
                self._run_dir.release()


def _params(run: RunConfig) -> int:
    try:
        return total_params(run.model)
    except Exception:  # an unresolved or invalid config: the count is only for the message
        return 0


def train(
    run_config: RunConfig,
    out_dir: str | Path,
    resume: str = "auto",
    progress: bool = True,
    stop_after: int | None = None,
    on_step: StepHook | None = None,
    branch: tuple[Path, int] | None = None,
) -> TrainResult:
    """Train `run_config` into run directory `out_dir` (resuming per `resume`: auto | never |
    must; a fresh run dir with `branch` = (run dir, step) starts from that run's checkpoint at
    that step, a WSD cooldown branch: `taperlm.training.run_dir.check_branch`); returns what was
    reached. Works in-process and under torchrun. `stop_after` stops (with a checkpoint) after
    that many completed steps, e.g. to split a run into sessions.
    `on_step(step, total_steps, loss)` is called after every step of a single-process run and
    returns None, "checkpoint" (save one now) or "stop" (save one and return unfinished), e.g.
    for progress shown elsewhere and a clean stop on a signal."""
    trainer = Trainer(run_config, out_dir, resume, branch)
    try:
        return trainer.fit(progress=progress, stop_after=stop_after, on_step=on_step)
    finally:
        trainer.close()

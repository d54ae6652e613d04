"""Ctrl-C during `taperlm train`: stop at the end of the current step with a checkpoint, then say
what was saved and where the same command resumes.

`SignalStop` is the trainer's `on_step` hook. Until the first step ends a signal interrupts at
once (there is nothing to save yet: setting up can be left immediately). After that, SIGINT only
asks for a stop; the hook returns "stop" at the end of the step in progress, and the
trainer checkpoints that step synchronously before returning. Under torchrun every rank must stop
at the same step (the checkpoint is collective), so the ranks agree on the request with one
all-reduce per step. A terminal's Ctrl-C reaches the workers directly and again through torchrun's
agent moments later; a second signal within `SAME_REQUEST_S` counts as the same request, a later
one interrupts at once (the checkpoints already on disk stay intact: they are written atomically).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from taperlm.checkpoint.store import list_checkpoints

SAME_REQUEST_S = 1.0
RETRY_S = 0.1  # an interrupt that arrives during an import is repeated after this long
# SIGINT only: torchrun's agent ends the surviving ranks with SIGTERM when one fails, and a
# checkpoint then would wait on the dead rank's collective (SIGTERM keeps its default: exit now,
# the checkpoints on disk stay intact).
SIGNALS = (signal.SIGINT,)


class SignalStop:
    """Context manager and `on_step` hook; `stopped_at` is the step it stopped the run at."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock  # when a signal arrived (a test passes a fake one)
        self.armed = False  # a step has ended: a signal now means "checkpoint and stop"
        self.requested_at: float | None = None
        self.stopped_at: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> SignalStop:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = self.clock()
        if not self.armed:
            _interrupt_when_safe(signum, frame)
            return
        if self.requested_at is None:
            self.requested_at = now
            sys.stderr.write(
                "\ntaperlm train: stopping after the current step with a checkpoint (press "
                "Ctrl-C again to stop at once)\n"
            )
        elif now - self.requested_at > SAME_REQUEST_S:
            _interrupt_when_safe(signum, frame)

    def __call__(self, step: int, total_steps: int, loss: float) -> str | None:
        self.armed = True
        # Every rank agrees every step, the last included (a stop there would only finish).
        if not _any_rank(self.requested_at is not None) or step >= total_steps:
            return None
        self.stopped_at = step
        return "stop"


def _interrupt_when_safe(signum: int, frame: FrameType | None) -> None:
    """KeyboardInterrupt now, unless the main thread is importing a module: an import cut short
    leaves the module half-initialized, and the cleanup that follows (the trainer restoring
    torch's settings imports torch._inductor, sympy, ...) then fails with an unrelated error.
    The signal is sent again shortly, until the import is done."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            threading.Timer(RETRY_S, os.kill, (os.getpid(), signum)).start()
            return
        frame = frame.f_back
    raise KeyboardInterrupt


def _any_rank(flag: bool) -> bool:
    """True when this or any other process of the job has the flag (every rank calls this)."""
    import torch  # lazy: the CLI imports this module for its Ctrl-C message, torch-free
    import torch.distributed as dist  # lazy: as torch above

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)


def interrupted_message(
    run_dir: Path | None, command: str, stopped_at: int | None = None, total_steps: int = 0
) -> str:
    """What an interrupted run left on disk and where the same command starts: read from the
    run dir, so it is true however the run stopped (`stopped_at`: the step a requested stop
    ended at)."""
    have = list_checkpoints(run_dir) if run_dir is not None else []
    if not have:
        return (
            "taperlm train: interrupted before the first checkpoint; nothing was saved. The same "
            f"command starts again at step 1:\n  {command}"
        )
    step, path = have[-1]
    if step == stopped_at:
        return (
            f"taperlm train: interrupted at step {step} of {total_steps}; saved the checkpoint "
            f"{path} (weights, optimizer, data position). The same command resumes at step "
            f"{step + 1}:\n  {command}"
        )
    return (
        f"taperlm train: interrupted; the newest checkpoint is {path} (step {step}), so the "
        f"same command resumes at step {step + 1}:\n  {command}"
    )

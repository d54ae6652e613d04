"""Training: the trainer and its step (`loop`), the model it trains (`model`), the optimizer,
Hope's update periods and the LR schedule (`optim`), non-finite updates (`guard`), the live
run's checkpoints saved and restored (`checkpointer`; their format on disk is
`taperlm.checkpoint`'s), the run directory (`run_dir`), the train settings' checks
(`settings`), distributed wrapping (`distributed`), metrics and loggers (`metrics`, `loggers`),
Ctrl-C (`interrupt`), start weights and the distillation teacher (`distill`), WSD cooldown
branches (`cooldowns`) and `plan --gpus` (`planner`); loading a trained model for inference is
`taperlm.checkpoint.loading`'s. Import the submodules directly; nothing heavy is imported here (the
warning category, `TrainingWarning`, lives in `taperlm.errors`)."""

from __future__ import annotations

import warnings
from typing import Literal

from taperlm.errors import TrainingWarning

# `taperlm train --resume`: continue from the newest good checkpoint if any | refuse a run dir
# that has one | fail unless there is one (`run_dir.prepare_run_dir`).
ResumeMode = Literal["auto", "never", "must"]


def warn(message: str) -> None:
    """Warn on behalf of the caller's caller (the trainer method that decided to warn)."""
    warnings.warn(message, TrainingWarning, stacklevel=3)

"""The warning category of training: something the user should know that did not stop the run
(a checkpoint fallback, a failed compile, a logger that could not start). `taperlm train` shows
it as one plain line."""

from __future__ import annotations

import warnings


class TrainingWarning(UserWarning):
    """Something the user should know that did not stop the run (checkpoint fallback, compile)."""


def warn(message: str) -> None:
    """Warn on behalf of the caller's caller (the trainer method that decided to warn)."""
    warnings.warn(message, TrainingWarning, stacklevel=3)

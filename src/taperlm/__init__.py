"""taperlm — Tapered Language Models (Bayat, Behrouz, Courville, 2026).

Importing the package is cheap (no torch). Model classes live in `taperlm.models`.
"""

from __future__ import annotations

__version__ = "0.1.0"

from taperlm.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    TaperError,
    TaperlmError,
    TrainingError,
)


def _hf_autoregister() -> None:
    """Arrange for taperlm to register with transformers' Auto classes when (and only if) the
    process imports them; costs nothing here (no transformers or torch import)."""
    try:
        from taperlm.hf.autoregister import install  # lazy: optional, above the root
    except ImportError:  # a trimmed install without taperlm.hf
        return
    install()


_hf_autoregister()

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "TaperError",
    "TaperlmError",
    "TrainingError",
    "__version__",
]

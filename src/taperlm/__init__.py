"""taperlm — Tapered Language Models (Bayat, Behrouz, Courville, 2026).

Importing the package is cheap (no torch). Model classes live in `taperlm.models`.
"""

from __future__ import annotations

__version__ = "0.1.0"

from taperlm.errors import CheckpointError, ConfigError, DataError, TaperError, TaperlmError

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "TaperError",
    "TaperlmError",
    "__version__",
]

"""Hugging Face integration: `TaperLMConfig`, `TaperLMForCausalLM`, `export_model`.

Importing this package is light; the classes (and transformers, torch) load on first access.
`register()` adds model_type "taperlm" to `AutoConfig` / `AutoModelForCausalLM` so exported
directories load without `trust_remote_code`; `import taperlm` arranges for it to happen
automatically when transformers' Auto classes are imported (see `taperlm.hf.autoregister`).
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["TaperLMConfig", "TaperLMForCausalLM", "register", "register_config"]


def __getattr__(name: str) -> Any:
    if name == "TaperLMConfig":
        from taperlm.hf.configuration import TaperLMConfig  # lazy: the [hf] extra

        return TaperLMConfig
    if name == "TaperLMForCausalLM":
        from taperlm.hf.modeling import TaperLMForCausalLM  # lazy: the [hf] extra

        return TaperLMForCausalLM
    raise AttributeError(f"module 'taperlm.hf' has no attribute {name!r}")


def register_config() -> None:
    """Register TaperLMConfig with AutoConfig (cheap: no torch, no modeling code)."""
    from transformers import AutoConfig

    from taperlm.hf.configuration import TaperLMConfig  # lazy: the [hf] extra

    # ValueError: already registered (e.g. by remote code of the same model type).
    with contextlib.suppress(ValueError):
        AutoConfig.register("taperlm", TaperLMConfig)


def register() -> None:
    """Register TaperLMConfig / TaperLMForCausalLM with the transformers Auto classes (idempotent)."""
    from transformers import AutoModelForCausalLM

    from taperlm.hf.configuration import TaperLMConfig  # lazy: the [hf] extra
    from taperlm.hf.modeling import TaperLMForCausalLM  # lazy: the [hf] extra

    register_config()
    with contextlib.suppress(ValueError):
        AutoModelForCausalLM.register(TaperLMConfig, TaperLMForCausalLM)

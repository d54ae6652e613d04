"""Hugging Face integration: `TaperLMConfig`, `TaperLMForCausalLM`, `export_run`.

`register()` adds model_type "taperlm" to `AutoConfig` / `AutoModelForCausalLM` so exported
directories load without `trust_remote_code`. Importing this module imports transformers.
"""

from __future__ import annotations

from taperlm.hf.configuration import TaperLMConfig
from taperlm.hf.modeling import TaperLMForCausalLM

_registered = False


def register() -> None:
    """Register TaperLMConfig / TaperLMForCausalLM with the transformers Auto classes (idempotent)."""
    global _registered
    if _registered:
        return
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        AutoConfig.register("taperlm", TaperLMConfig)
    except ValueError:  # already registered (e.g. by remote code of the same name)
        pass
    try:
        AutoModelForCausalLM.register(TaperLMConfig, TaperLMForCausalLM)
    except ValueError:
        pass
    _registered = True


__all__ = ["TaperLMConfig", "TaperLMForCausalLM", "register"]

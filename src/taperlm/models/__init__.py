"""Model code (torch). `TaperedLM` builds every family from a resolved `ModelConfig`."""

from taperlm.models.lm import Block, LMOutput, TaperedLM, register_block_factory

__all__ = ["Block", "LMOutput", "TaperedLM", "register_block_factory"]

"""Model code (torch). `TaperedLM` builds every family from a resolved `ModelConfig`."""

from taperlm.models.layers import Block
from taperlm.models.lm import LMOutput, TaperedLM

__all__ = ["Block", "LMOutput", "TaperedLM"]

"""`ModelFields`: what the families, the torch blocks and the budget formulas read of a model
config (`taperlm.config.ModelConfig`, documented field by field there).

It sits below both `taperlm.families` and `taperlm.models`, so that the blocks a family builds
never import the families (pure Python, no torch), which import the blocks only in their block
factories: the import graph has no zig-zag between the two (tests/repo/test_structure.py).
"""

from __future__ import annotations

from typing import Any, Protocol

from taperlm.taper import TaperSpec


class ModelFields(Protocol):
    """What a family or a block reads of a `taperlm.config.ModelConfig` (see its fields)."""

    family: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int | None
    mlp_width: int
    taper: TaperSpec
    mlp_widths: list[int] | None
    head_taper: TaperSpec
    layer_heads: list[int] | None
    kv_taper: TaperSpec
    layer_kv_heads: list[int] | None
    context_length: int
    rope_theta: float
    norm_eps: float
    options: Any  # the family's options dataclass (None for families without options)

    @property
    def head_dim(self) -> int: ...

    @property
    def kv_heads(self) -> int: ...

    def attention_heads(self, layer: int) -> tuple[int, int]: ...


__all__ = ["ModelFields"]

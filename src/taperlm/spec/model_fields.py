"""What the families, the torch models and the budget formulas read of a model config
(`taperlm.config.ModelConfig`, documented field by field there): `ModelFields` (a family's and a
block's view) and `ModelSpec` (the whole model's: also its family's block factory).

It sits below `taperlm.families`, `taperlm.config.budget`, `taperlm.config` and `taperlm.models`, so that
the torch models never import a family, the budget or the config (which import the families):
the config hands its family's block factory to `TaperedLM` (`ModelSpec.build_block`), and the
families import the torch blocks only inside their block factories. The import graph has no
zig-zag between models and families (tests/repo/test_structure.py).
"""

from __future__ import annotations

from typing import Any, Protocol

from taperlm.spec.taper import TaperSpec


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
    rope_scaling: Any  # a `taperlm.config.model.RopeScaling`, or None (plain RoPE)
    attention_bias: str
    qk_norm: bool
    norm_eps: float
    options: Any  # the family's options dataclass (None for families without options)

    @property
    def head_dim(self) -> int: ...

    @property
    def kv_heads(self) -> int: ...

    def attention_heads(self, layer: int) -> tuple[int, int]: ...


class ModelSpec(ModelFields, Protocol):
    """What the budget formulas and `TaperedLM` read of a `taperlm.config.ModelConfig` beyond
    `ModelFields`: its initialisation, its resolution, and its family's block factory."""

    tie_embeddings: bool
    init_std: float
    init: str

    @property
    def group_size(self) -> int: ...

    @property
    def resolved(self) -> bool: ...

    def resolve(self) -> Any: ...

    def baseline(self) -> Any: ...

    def head_taper_spec(self) -> TaperSpec: ...

    def kv_taper_spec(self) -> TaperSpec: ...

    def solve_kv_heads(self) -> Any: ...

    def build_block(self, layer: int, rotary: Any) -> Any:
        """Layer `layer`'s torch block, built by the model's family (`Family.build_block`)."""
        ...

    def memory_floor(self) -> tuple[int, str]:
        """(bytes, what they are) the built model's weights need at least (`budget.memory_floor`)."""
        ...


__all__ = ["ModelFields", "ModelSpec"]

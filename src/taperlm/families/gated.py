"""Gated Attention (Qiu et al. 2025): Transformer++ whose attention output is multiplied by a
sigmoid gate of the block input (position G1), elementwise (d x d) or one gate per head (d x H)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from taperlm.errors import ConfigError
from taperlm.families.base import Family, ModelFields, attention_params
from taperlm.families.transformer import attention_block
from taperlm.spec.domains import choices, setting

GateKind = Literal["elementwise", "headwise"]
GATE_KINDS = choices(GateKind)


@dataclass
class GatedConfig:
    """Gated Attention options (`model.gated:`)."""

    gate: GateKind = setting("elementwise", GateKind)
    """elementwise (d x d gate) or headwise (d x H gate)."""


def check_gate(gate: Any, key: str) -> None:
    """ConfigError unless `gate` (read for `key`) is a gate kind."""
    if gate not in GATE_KINDS:
        raise ConfigError(f"{key} {gate!r} is unknown; choose {' or '.join(GATE_KINDS)}")


def _validate(cfg: ModelFields) -> None:
    check_gate(cfg.options.gate, "model.gated.gate")


def _block(cfg: ModelFields, layer: int, rotary: Any) -> Any:
    return attention_block(cfg, layer, rotary, gate=cfg.options.gate)


def _mixer_params(cfg: ModelFields, layer: int) -> dict[str, int]:
    heads, _ = cfg.attention_heads(layer)
    heads_out = heads * cfg.head_dim if cfg.options.gate == "elementwise" else heads
    return {
        **attention_params(cfg, layer),
        "attn_gate": cfg.d_model * heads_out,
        "norms": cfg.d_model,
    }


def _preset(size: str, shape: Mapping[str, int]) -> GatedConfig:
    return GatedConfig(gate="elementwise")


FAMILY = Family(
    name="gated",
    build_block=_block,
    mixer_params=_mixer_params,
    options=GatedConfig,
    validate=_validate,
    presets={"gated": _preset},
)

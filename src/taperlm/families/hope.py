"""Hope-attention (Nested Learning): Transformer++ attention whose MLP is a Continuum Memory System
(CMS), a chain of SwiGLU levels with their own widths and update periods (docs/architectures.md).

The taper acts on each layer's total CMS width `mlp_widths[l]`; `split_width` divides it into
the per-level widths `hope.level_widths[l]` (exact sums), so a Hope model has the same matmul
parameters and FLOPs as the transformer of the same widths, plus one norm per extra level.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from taperlm.errors import ConfigError
from taperlm.families.base import Family, ModelFields, swiglu_params
from taperlm.families.transformer import attention_mixer_params
from taperlm.spec.domains import MAX_COUNT, MAX_DEPTH, MAX_WIDTH, setting, up_to


@dataclass
class HopeConfig:
    """Hope-attention: the MLP of every block is a Continuum Memory System (CMS), a chain of
    `levels` SwiGLU MLPs. Level widths of layer l are `level_fractions` x mlp_widths[l] (resolved
    into `HopeConfig.level_widths` by the model family; see docs/architectures.md). Level i's
    parameters take an optimizer step every `update_periods[i]` optimizer steps, accumulating
    gradients in between (the multi-timescale reading of Nested Learning).
    """

    levels: int = setting(3, up_to(MAX_DEPTH))
    """number of CMS levels k (k = 1 with period 1 is exactly Transformer++)."""
    level_fractions: list[float] = setting([0.5, 0.25, 0.25], "(0, 1]")
    """share of the layer's MLP width given to each level (sums to 1)."""
    update_periods: list[int] = setting([1, 4, 16], up_to(MAX_COUNT))
    """optimizer-step period C_i of each level (1 = every step)."""
    level_widths: list[list[int]] | None = setting(None, up_to(MAX_WIDTH))
    """resolved [layer][level] widths; written by the library, authoritative."""


def split_width(width: int, fractions: list[float], multiple_of: int) -> list[int]:
    """Split one layer's CMS width into per-level widths that sum exactly to `width`.

    Levels get whole units of `multiple_of` by largest remainder (ties: earlier level first),
    at least one unit each; a remainder width % multiple_of (only for custom widths that are not
    multiples) goes to level 0. If the width has fewer units than levels, units are abandoned
    and the split is done in steps of 1 instead.
    """
    k = len(fractions)
    m = multiple_of if width // multiple_of >= k else 1
    units, rest = divmod(width, m)
    exact = [f * units for f in fractions]
    out = [max(1, int(e)) for e in exact]
    while sum(out) < units:
        i = max(range(k), key=lambda j: (exact[j] - out[j], -j))
        out[i] += 1
    while sum(out) > units:
        i = max((j for j in range(k) if out[j] > 1), key=lambda j: (out[j] - exact[j], j))
        out[i] -= 1
    widths = [u * m for u in out]
    widths[0] += rest
    return widths


def _validate(cfg: ModelFields) -> None:
    """One fraction and one period per level; resolved widths split each layer exactly."""
    h: HopeConfig = cfg.options
    for key in ("level_fractions", "update_periods"):
        n = len(getattr(h, key))
        if n != h.levels:
            raise ConfigError(
                f"model.hope.{key} has {n} entries but model.hope.levels is {h.levels}; "
                "give one per level"
            )
    if not abs(sum(h.level_fractions) - 1) <= 1e-6:
        raise ConfigError(
            f"model.hope.level_fractions must be positive and sum to 1, got {h.level_fractions}"
        )
    if h.level_widths is not None:
        _validate_level_widths(h, cfg.n_layers, cfg.mlp_widths)


def _validate_level_widths(h: HopeConfig, n_layers: int, mlp_widths: list[int] | None) -> None:
    rows = h.level_widths or []
    if len(rows) != n_layers or any(len(r) != h.levels for r in rows):
        raise ConfigError(
            f"model.hope.level_widths must be {n_layers} rows of {h.levels} widths; "
            "delete it to re-resolve from level_fractions"
        )
    for i, r in enumerate(rows):
        if mlp_widths is not None and sum(r) != mlp_widths[i]:
            raise ConfigError(
                f"model.hope.level_widths[{i}] = {r} sums to {sum(r)} but mlp_widths[{i}] is "
                f"{mlp_widths[i]}; delete level_widths to re-resolve"
            )


def _resolve(cfg: ModelFields) -> None:
    h: HopeConfig = cfg.options
    if h.level_widths is not None:
        return
    assert cfg.mlp_widths is not None
    if any(w < h.levels for w in cfg.mlp_widths):
        zero = " (a zero MLP width, an attention-only layer, has no CMS to split)"
        raise ConfigError(
            f"model.hope.levels = {h.levels} but some layer's MLP width is smaller "
            f"({min(cfg.mlp_widths)}); every CMS level needs a width >= 1"
            + (zero if min(cfg.mlp_widths) == 0 else "")
            + ": raise the taper's end multiplier or use fewer levels"
        )
    m = cfg.taper.multiple_of
    h.level_widths = [split_width(w, h.level_fractions, m) for w in cfg.mlp_widths]


def level_widths(cfg: ModelFields, layer: int) -> list[int]:
    h: HopeConfig = cfg.options
    assert h.level_widths is not None, "resolve the config first (ModelConfig.resolve())"
    return h.level_widths[layer]


def _mlp_params(cfg: ModelFields, layer: int) -> dict[str, int]:
    """Level i: SwiGLU of width h_i; level 0 is normed by the block's mlp_norm, levels >= 1 by
    their own RMSNorm (so k = 1 is exactly Transformer++)."""
    widths = level_widths(cfg, layer)
    out = {f"mlp_level{i}": swiglu_params(cfg.d_model, w) for i, w in enumerate(widths)}
    out["norms"] = cfg.d_model * len(widths)
    return out


def _block(cfg: ModelFields, layer: int, rotary: Any) -> Any:
    from taperlm.models.hope import hope_block  # lazy: plan stays torch-free

    return hope_block(cfg, layer, rotary)


def _preset(size: str, shape: Mapping[str, int]) -> HopeConfig:
    """All sizes: 3 CMS levels with 1/2, 1/4, 1/4 of the width, periods 1, 4, 16 steps."""
    return HopeConfig(levels=3, level_fractions=[0.5, 0.25, 0.25], update_periods=[1, 4, 16])


def _plan_column(cfg: ModelFields) -> tuple[str, list[str]] | None:
    rows = cfg.options.level_widths
    return ("CMS levels", ["+".join(map(str, w)) for w in rows]) if rows else None


FAMILY = Family(
    name="hope",
    build_block=_block,
    mixer_params=attention_mixer_params,
    mlp_params=_mlp_params,
    options=HopeConfig,
    validate=_validate,
    resolve=_resolve,
    resolved=("level_widths",),
    presets={"hope": _preset},
    plan_column=_plan_column,
)

"""Model families: one module each, registered here (pure Python; no torch).

`FAMILIES` maps `model.family` to its `Family` record (`taperlm.families.base`): options,
validation, sizes and FLOPs, block factory, presets and plan column. Adding a family is one new
module `taperlm/families/<name>.py` defining `FAMILY`, plus its entry in the line below (or
`register(FAMILY)` from outside the package); docs/architectures.md walks through an example.
"""

from __future__ import annotations

from typing import Any

from taperlm.errors import ConfigError
from taperlm.families import gated, hope, titans, transformer
from taperlm.families.base import Family

FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add a family (ValueError if its name or a preset prefix is already taken)."""
    if family.name in FAMILIES:
        raise ValueError(f"model family {family.name!r} is already registered")
    taken = {p for f in FAMILIES.values() for p in f.presets}
    clash = sorted(taken & set(family.presets))
    if clash:
        raise ValueError(f"preset name(s) {', '.join(clash)} of {family.name!r} are taken")
    FAMILIES[family.name] = family
    return family


for _module in (transformer, gated, hope, titans):  # the registry: one entry per family
    register(_module.FAMILY)


def get_family(name: str) -> Family:
    """The family called `name`; ConfigError listing the known ones otherwise."""
    try:
        return FAMILIES[name]
    except (KeyError, TypeError):
        raise ConfigError(
            f"model.family {name!r} is unknown; choose one of {', '.join(FAMILIES)}"
        ) from None


def family(cfg: Any) -> Family:
    """The family of a model config."""
    return get_family(cfg.family)


__all__ = ["FAMILIES", "Family", "family", "get_family", "register"]

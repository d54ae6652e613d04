"""`--set key=value` and $TAPERLM_SET overrides: parsed as YAML, each key and value checked as it is
applied, and resolved per-layer sizes dropped when what they were solved from changes."""

from __future__ import annotations

import os
import shlex
import typing
from typing import Any

from taperlm.config.convert import (
    closest_key,
    coerce_value,
    config_keys,
    section_of,
    text_spec_fields,
    to_dict,
)
from taperlm.config.loading import strict_yaml_load
from taperlm.config.model import ModelConfig
from taperlm.config.train import DataConfig, TrainConfig
from taperlm.errors import ConfigError, MalformedFileError
from taperlm.families import FAMILIES
from taperlm.files.io import YAMLSyntaxError, quoted
from taperlm.spec.domains import check_field


def parse_override(text: str, origin: str = "--set") -> tuple[str, Any]:
    """`model.d_model=512` -> ("model.d_model", 512); the value is parsed as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"{origin} {quoted(text)}: expected key=value, e.g. model.n_layers=12")
    try:
        value = strict_yaml_load(raw, what=f"{origin} {quoted(key.strip())}") if raw.strip() else ""
    except YAMLSyntaxError:
        value = raw  # not YAML: the text itself (a string)
    except MalformedFileError as err:  # a key given twice, too deep, an alias bomb
        raise ConfigError(str(err)) from None
    return key.strip(), value


OVERRIDES_ENV = "TAPERLM_SET"


def env_overrides() -> list[str]:
    """The `key=value` overrides in $TAPERLM_SET (separated by spaces, shell-quoted where a
    value has one), which every command that builds run configs (train, plan, compare) applies
    after its own --set: a way to run any documented command smaller or on other settings
    without editing it (e.g. a quick smoke run of a script)."""
    try:
        return shlex.split(os.environ.get(OVERRIDES_ENV, ""))
    except ValueError as err:
        raise ConfigError(f"{OVERRIDES_ENV}: {err}") from None


def apply_overrides(
    data: dict, overrides: list[str], origin: str = "--set", notes: list[str] | None = None
) -> dict:
    """Apply dotted `key=value` overrides to a nested config dict (in place, returned), in
    order: a later override of a key wins (scripts append to a base list). See `apply_override`."""
    for text in overrides:
        apply_override(data, text, origin, notes)
    return data


def apply_override(
    data: dict, text: str, origin: str = "--set", notes: list[str] | None = None
) -> str:
    """Apply one dotted `key=value` override to a nested config dict (in place); return the
    dotted key it set, with its section (`d_model=512` sets `model.d_model`).

    A key without a section prefix is looked up in model, then train, then data. The key and
    value are checked as they are applied (`_check_override`), so that a typo is blamed on
    `origin` (the option or variable that gave it), not on the config file or preset. A value
    that replaces a different one already in `data` (a config file's, an earlier --set's) is
    appended to `notes` when it is given.
    """
    key, value = parse_override(text, origin)
    parts = key.split(".")
    if parts[0] not in ("model", "data", "train"):
        section = section_of(parts[0])
        if section is None:
            raise ConfigError(
                f"{origin} {quoted(text)}: unknown key {parts[0]!r}; use model.KEY, train.KEY or "
                "data.KEY"
            )
        parts = [section, *parts]
    dotted = ".".join(parts)
    _check_override(data, parts, value, f"{origin} {quoted(text)}")
    node = data
    for p in parts[:-1]:
        if isinstance(node, dict) and node.get(p, 0) is None:
            node[p] = {}  # a null section (model.rope_scaling: plain RoPE) takes its first key
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{origin} {quoted(text)}: {p!r} is not a section")
    old = to_dict(node.get(parts[-1], value))  # a spec an option parsed: as a file writes it
    if notes is not None and old != value:
        notes.append(f"{origin} {dotted}={quoted(value)} replaces {old!r}")
    node[parts[-1]] = value
    if parts[0] == "model" and _affects_sizes(parts[1:]):
        clear_resolved_sizes(data["model"])
    return dotted


def _check_override(data: dict, parts: list[str], value: Any, where: str) -> None:
    """ConfigError naming `where` for an unknown key (with the closest valid one) or a value of
    the wrong type or outside its domain. Keys inside a nested value (a taper mapping) are left
    to the full config check."""
    if parts[0] == "model" and len(parts) > 2 and parts[1] in FAMILIES:
        cls, rest, at = FAMILIES[parts[1]].options, parts[2:], f"model.{parts[1]}"
        if cls is None:
            raise ConfigError(f"{where}: the {parts[1]} family has no options")
    else:
        cls = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig}[parts[0]]
        rest, at = parts[1:], parts[0]
    if len(rest) != 1:
        return
    name = rest[0]
    valid = set(config_keys(cls)) | (set(FAMILIES) if cls is ModelConfig else set())
    if name not in valid:
        close = closest_key(name, valid)
        raise ConfigError(
            f"{where}: unknown key(s) in {at}: {name!r}"
            + (f" (did you mean {close!r}?)" if close else "")
            + f". Valid keys: {', '.join(sorted(valid))}"
        )
    if name in FAMILIES or name in ("taper", "head_taper", "kv_taper"):  # specs: the full check
        return
    # a spec kept as text (a family's taper): a string here, parsed and checked by validate
    hint = str if name in text_spec_fields(cls) else typing.get_type_hints(cls)[name]
    try:
        check_field(cls, name, coerce_value(hint, value, f"{at}.{name}"), f"{at}.{name}")
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


_SIZE_KEYS = {
    *("taper", "mlp_width", "n_layers", "family", "head_taper", "n_heads", "n_kv_heads"),
    "kv_taper",
}


def _affects_sizes(path: list[str]) -> bool:
    """Whether overriding model.<path> changes the resolved per-layer sizes: a taper, a
    baseline size (MLP width, heads), the depth, the family or any family option (except a
    resolved size itself)."""
    if not path or (path[0] not in _SIZE_KEYS and path[0] not in FAMILIES):
        return False
    resolved = {"mlp_widths", "layer_heads", "layer_kv_heads"} | {
        k for fam in FAMILIES.values() for k in fam.resolved
    }
    return path[-1] not in resolved


def clear_resolved_sizes(model: dict) -> None:
    """Drop resolved per-layer sizes from a model dict so `resolve()` recomputes them from the
    (changed) taper; used when the taper, baseline or depth is overridden."""
    model.pop("mlp_widths", None)
    model.pop("layer_heads", None)
    model.pop("layer_kv_heads", None)
    for fam in FAMILIES.values():
        section = model.get(fam.name)
        if isinstance(section, dict):
            for key in fam.resolved:
                section.pop(key, None)

"""Config files: strict, bounded YAML (`taperlm.files.io.parse_yaml`: a key given twice, deep nesting
and alias bombs are errors), load/save/dump of run configs, and
notes on what a file holds that its resolved config does not use."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import yaml

from taperlm.config.convert import from_dict, to_dict
from taperlm.config.model import ModelConfig
from taperlm.config.run import RunConfig
from taperlm.errors import ConfigError, TaperError, UnsafeFileError
from taperlm.families import FAMILIES
from taperlm.files.io import (
    MAX_CONFIG_BYTES,
    atomic_write_text,
    not_a_file,
    parse_yaml,
    read_yaml,
)
from taperlm.spec.solver import solve_sizes


def strict_yaml_load(text: str, name: str | Path | None = None, what: str = "YAML") -> Any:
    """YAML text as `taperlm.files.io.parse_yaml` builds it: bounded depth and alias expansion, a key
    given twice refused (DuplicateKeyError's message, as a MalformedFileError)."""
    return parse_yaml(text, name, what)


def load_yaml(path: str | Path) -> dict:
    p = Path(path)
    kind = not_a_file(p)
    if kind:
        raise ConfigError(f"config file {p} is {kind}, not a file; give a YAML file")
    if not p.is_file():
        raise ConfigError(
            f"config file {p} does not exist; give the path of a YAML file, or a named model with "
            "--preset NAME (`taperlm plan --list-presets` lists them)"
        )
    try:
        data = read_yaml(p, MAX_CONFIG_BYTES, "config file")
    except UnsafeFileError as err:
        raise ConfigError(str(err)) from None
    if data is None:
        raise ConfigError(f"config file {p} is empty")
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {p} must hold a mapping (model:, data:, train:), got {type(data).__name__}"
        )
    return data


def run_config_from_dict(data: dict, source: str = "config") -> RunConfig:
    """A RunConfig from a dict; a bare model mapping (family:, d_model:, ...) is accepted too."""
    if "model" not in data and "family" in data:
        data = {"model": data}
    try:
        return from_dict(RunConfig, data, "")
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def save_yaml(cfg: RunConfig | ModelConfig, path: str | Path) -> None:
    """Write a config as YAML atomically (write to a temporary file, then rename)."""
    p = Path(path)
    atomic_write_text(p, dump_yaml(cfg))


def dump_yaml(cfg: Any) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=None, width=100)


def load_run_config(path: str | Path) -> RunConfig:
    return run_config_from_dict(load_yaml(path), str(path))


def file_notes(data: dict, cfg: RunConfig) -> list[str]:
    """What a config file holds that the resolved `cfg` does not use, as notes: sections of
    other families (kept loadable for 0.1 configs, which carried all of them) and written
    per-layer widths that its taper would not give (written sizes are the authority)."""
    model = data.get("model") if isinstance(data.get("model"), dict) else {}
    notes = [
        f"model.{name}: ignored -- model.family is {cfg.model.family!r} (set model.family: "
        f"{name} to use it)"
        for name in FAMILIES
        if name in model and name != cfg.model.family
    ]
    m = cfg.model
    if model.get("mlp_widths") is not None and not m.taper.needs_pilot:
        with contextlib.suppress(TaperError, ConfigError):
            if solve_sizes(m.taper, m.n_layers, m.mlp_width, zero_ok=True) != m.mlp_widths:
                notes.append(
                    f"model.mlp_widths are used as written, not the widths its taper "
                    f"({m.taper.schedule}) gives; delete mlp_widths to resolve them from it"
                )
    return notes

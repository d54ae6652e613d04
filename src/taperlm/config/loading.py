"""Config files: strict YAML (a key given twice is an error), load/save/dump of run configs, and
notes on what a file holds that its resolved config does not use."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import yaml

from taperlm.config.convert import from_dict, to_dict
from taperlm.config.model import ModelConfig
from taperlm.config.run import RunConfig
from taperlm.errors import ConfigError, TaperError
from taperlm.families import FAMILIES
from taperlm.io import atomic_write_text, not_a_file
from taperlm.solver import solve_sizes


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping that gives one key twice (YAML forbids it; PyYAML keeps the last silently)."""


class StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that rejects a key given twice in one mapping, at every depth: with
    the plain loader a second `train:` replaces the whole first section without a word.
    A key written explicitly may still override one brought in by a `<<:` merge."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:
                    continue  # an unhashable key: the base class reports it
                if first is not key_node:
                    raise DuplicateKeyError(
                        None,
                        None,
                        f"key {key!r} is given twice (first at line {first.start_mark.line + 1}); "
                        "the later one would silently replace the earlier -- keep one",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep=deep)


def strict_yaml_load(text: str) -> Any:
    """`yaml.safe_load` that raises DuplicateKeyError on a key given twice."""
    return yaml.load(text, Loader=StrictLoader)  # a SafeLoader subclass: builds no objects


def load_yaml(path: str | Path) -> dict:
    p = Path(path)
    kind = not_a_file(p)
    if kind:
        raise ConfigError(f"config file {p} is {kind}, not a file; give a YAML file")
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        data = strict_yaml_load(p.read_text(encoding="utf-8"))
    except DuplicateKeyError as err:
        mark = err.problem_mark
        raise ConfigError(f"config file {p}, line {mark.line + 1}: {err.problem}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            f"config file {p} is not valid YAML{where}: {getattr(err, 'problem', err)}"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {p} is not UTF-8 text") from None
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
    p.parent.mkdir(parents=True, exist_ok=True)
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

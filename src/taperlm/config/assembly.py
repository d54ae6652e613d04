"""The one config assembly of every command that builds a run config (plan, train, allocate,
compare): the layers a setting can come from, applied to the run config's dict form (the form of
a config file), and a record of which layer set each key.

Layers, low to high (`Layer`): the dataclasses' defaults < a preset's model < a command's own
recipe (compare's) < the config file < the command's options (`--taper`, `--head-taper`,
`--kv-taper`, `--multiple-of`; compare's `--tokens` and `--data`) < `--set` < $TAPERLM_SET. A key
set by a higher layer keeps its value whatever the order the layers are applied in
(`Assembly.put`), so compare reads which settings the user gave (`Assembly.given`) from the
record instead of re-reading its `--set` list. Options that a command documents as winning over
`--set` are applied as `--set` after it: train's `--logger` (before $TAPERLM_SET), compare's
`--logger` (compare reads $TAPERLM_SET as more `--set`, so its `--logger` wins over both).

Values are typed where a layer has them typed: `--taper` is parsed once into a `TaperSpec` that
the dict carries to `ModelConfig.taper` as is (`from_dict` accepts the spec).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taperlm.config.loading import run_config_from_dict
from taperlm.config.overrides import apply_override, clear_resolved_sizes
from taperlm.config.presets import config_data
from taperlm.config.run import RunConfig
from taperlm.errors import ConfigError
from taperlm.files.io import quoted
from taperlm.spec.taper import TaperSpec


class Layer(enum.IntEnum):
    """Where a setting came from; a higher layer's value wins."""

    DEFAULT = 0  # the config dataclasses' own defaults (keys with no record)
    PRESET = 1  # a named preset's model (`taperlm.config.presets`)
    RECIPE = 2  # a command's own recipe and what it derives (`taperlm.compare.recipe`)
    FILE = 3  # --config FILE, or a continued run's own config.yaml
    OPTIONS = 4  # the command's own options (--taper, --multiple-of, compare's --tokens, ...)
    SET = 5  # --set KEY=VALUE (with what a command appends to it, e.g. --logger)
    ENV = 6  # $TAPERLM_SET (plan, train, allocate; compare reads it as more --set)


@dataclass
class Assembly:
    """A run config being assembled from its layers."""

    data: dict[str, Any]
    """the run config in the dict form of a config file (`model:`, `data:`, `train:`), which each
    layer edits; `build()` reads it into the typed `RunConfig`.
    """
    source: str
    """what the base layer was, for error messages (`preset transformer-tiny`, a path)."""
    origins: dict[str, Layer] = field(default_factory=dict)
    """dotted key (`train.lr`, `model.hope.levels`) -> the layer that set it last; a key without an
    entry has its default (`Layer.DEFAULT`).
    """
    notes: list[str] | None = None
    """what a later layer replaced in a config file the user gave, to print; None when no notes are
    wanted (a preset, a continued run's own config).
    """

    @classmethod
    def start(cls, config: str | Path | None, preset: str | None, notes: bool = False) -> Assembly:
        """The base layer: the config file (`Layer.FILE`) or else the preset's unresolved model
        (`Layer.PRESET`), each of its keys recorded as set by that layer."""
        data, source = config_data(config, preset)
        return cls.of(data, source, Layer.FILE if config else Layer.PRESET, notes)

    @classmethod
    def of(cls, data: dict[str, Any], source: str, layer: Layer, notes: bool = False) -> Assembly:
        """The base layer `data` (a config's dict form, e.g. a run's own config), each of its
        keys recorded as set by `layer`."""
        asm = cls(data, source, notes=[] if notes else None)
        for section, values in data.items():
            for key in values if isinstance(values, dict) else ():
                asm.origins[f"{section}.{key}"] = layer
        return asm

    def layer_of(self, key: str) -> Layer:
        """The layer that set dotted `key` (`Layer.DEFAULT` when none did)."""
        return self.origins.get(key, Layer.DEFAULT)

    def given(self, key: str) -> bool:
        """Whether the user chose dotted `key` (a config file, an option, --set or
        $TAPERLM_SET), which a command's recipe and derived values must not override."""
        return self.layer_of(key) > Layer.RECIPE

    def put(self, key: str, value: Any, layer: Layer) -> bool:
        """Set dotted `section.key` to `value` unless a higher layer set it; whether it did."""
        if self.layer_of(key) > layer:
            return False
        section, name = key.split(".", 1)
        self.data.setdefault(section, {})[name] = value
        self.origins[key] = layer
        return True

    def clear_sizes(self) -> None:
        """Drop the resolved per-layer sizes so that `resolve()` solves them again."""
        clear_resolved_sizes(self.data.setdefault("model", {}))
        self._forget_absent()

    def taper_options(
        self,
        taper: str | None,
        head_taper: str | None,
        kv_taper: str | None,
        multiple_of: int | None,
    ) -> None:
        """--taper, --head-taper, --kv-taper and --multiple-of (`Layer.OPTIONS`): each replaces
        the model's and clears the resolved sizes. --taper is parsed here, once, into the
        `TaperSpec` the model gets; --multiple-of alone re-rounds the base layer's taper."""
        model = self.data.setdefault("model", {})
        if not isinstance(model, dict) and (taper or head_taper or kv_taper or multiple_of):
            raise ConfigError(
                f"{self.source}: model must be a mapping, got {type(model).__name__}: "
                f"{quoted(model)}"
            )
        if self.notes is not None:
            for option, key, value in (
                ("--taper", "taper", taper),
                ("--head-taper", "head_taper", head_taper),
            ):
                if value and key in model:
                    self.notes.append(f"{option} {value} replaces the config file's model.{key}")
            if (taper or head_taper) and "mlp_widths" in model:
                self.notes.append(
                    "the config file's resolved per-layer sizes are re-resolved from the new taper"
                )
        if taper or multiple_of:
            if taper:
                spec = TaperSpec.parse(taper, multiple_of=multiple_of)
            else:
                current = model.get("taper", {"schedule": "uniform"})
                spec = run_config_from_dict({"model": {"taper": current}}, self.source).model.taper
            if multiple_of:
                spec.multiple_of = multiple_of
            self._replace_model("taper", spec)
        if head_taper:
            self._replace_model("head_taper", head_taper)
        if kv_taper:
            self._replace_model("kv_taper", kv_taper)

    def _replace_model(self, key: str, value: Any) -> None:
        self.data.setdefault("model", {})[key] = value
        self.origins[f"model.{key}"] = Layer.OPTIONS
        self.clear_sizes()

    def overrides(self, texts: list[str], layer: Layer, origin: str) -> list[str]:
        """`key=value` overrides in order (a later one of a key wins), each checked as it is
        applied and blamed on `origin` (`--set`, `TAPERLM_SET`); see `apply_override`. Returns
        the dotted key each text set, in order (`d_model=512` -> `model.d_model`)."""
        keys = []
        for text in texts:
            key = apply_override(self.data, text, origin, self.notes)
            self.origins[key] = layer
            self._forget_absent()
            keys.append(key)
        return keys

    def _forget_absent(self) -> None:
        """Drop the record of keys no longer in `data` (resolved sizes an override cleared)."""
        for key in [k for k in self.origins if not self._holds(k)]:
            del self.origins[key]

    def _holds(self, key: str) -> bool:
        node: Any = self.data
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    def build(self) -> RunConfig:
        """The typed run config of `data`, unresolved (ConfigError naming `source`)."""
        return run_config_from_dict(self.data, self.source)

    def resolve(self) -> RunConfig:
        """The typed run config of `data`, resolved (its per-layer sizes solved and checked)."""
        return self.build().resolve()


__all__ = ["Assembly", "Layer"]

"""The one config assembly of every command that builds a run config (plan, train, allocate,
compare, import, prune): the layers a setting can come from, applied to the run config's dict
form (the form of a config file), and a record of which layer set each key.

Layers, low to high (`Layer`): the dataclasses' defaults < a preset's model (or an imported
checkpoint's, a pruned source's) < a named training recipe (`Recipe`: compare's CPU recipe, the
paper's) < the config file < the command's options (`--taper`, `--head-taper`, `--kv-taper`,
`--multiple-of`, `--data`, `--tokens`, `--logger`, `--init-from`, ...) < `--set` <
$TAPERLM_SET. The order is written once, in `Assembly.assemble`, which every command calls. A key
set by a higher layer keeps its value whatever the order the layers are applied in
(`Assembly.put`), so compare reads which settings the user gave (`Assembly.given`) from the
record instead of re-reading its `--set` list.

`--logger` is an option like the others in every command: `--set train.loggers=...` must agree
with it, and $TAPERLM_SET (the top layer, meant for running any documented command smaller)
wins over it, in train as in compare.

An option that sets a config key is declared with that key (`add_setting_argument`), and `--set`
is declared once (`add_set_argument`); an option and a `--set` of its key either agree or the
command refuses, naming both (`check_agreement`, run by the command line for every command and
by `assemble`). A planning input (plan's `--tokens`, `--seq-len`, `--micro-batch`, ...; allocate's
`--strength`) is declared the same way and checked the same way, but does not edit the config:
the command reads it beside the config (`OptionSetting.applies`).

Values are typed where a layer has them typed: `--taper` is parsed once into a `TaperSpec` that
the dict carries to `ModelConfig.taper` as is (`from_dict` accepts the spec).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taperlm.config.convert import section_of, to_dict
from taperlm.config.loading import run_config_from_dict
from taperlm.config.overrides import (
    OVERRIDES_ENV,
    apply_override,
    clear_resolved_sizes,
    env_overrides,
    parse_override,
)
from taperlm.config.presets import config_data
from taperlm.config.run import RunConfig
from taperlm.errors import ConfigError
from taperlm.files.io import quoted
from taperlm.spec.taper import TaperSpec


class Layer(enum.IntEnum):
    """Where a setting came from; a higher layer's value wins."""

    DEFAULT = 0  # the config dataclasses' own defaults (keys with no record)
    PRESET = 1  # a named preset's model (`taperlm.config.presets`)
    RECIPE = 2  # a named training recipe (`Recipe`) and what a command derives
    FILE = 3  # --config FILE, or a continued run's own config.yaml
    OPTIONS = 4  # the command's own options (--taper, --data, --tokens, --logger, ...)
    SET = 5  # --set KEY=VALUE
    ENV = 6  # $TAPERLM_SET (every command that builds a run config)


@dataclass(frozen=True)
class Recipe:
    """A named training recipe: settings (dotted key -> value) that sit between a preset and a
    config file (`Layer.RECIPE`), so each applies only where the user chose nothing."""

    name: str
    """what the record calls it (`compare-cpu`, `paper-440m`, `import`)."""
    settings: dict[str, Any]
    """dotted key (`train.lr`) -> the recipe's value."""

    @classmethod
    def of(cls, name: str, **sections: Any) -> Recipe:
        """The recipe `name` of config dataclasses by section (`train=TrainConfig(...)`): the
        fields where each departs from its class's defaults (`recipe_changes`)."""
        settings = {
            f"{section}.{key}": value
            for section, recipe in sections.items()
            for key, value in recipe_changes(recipe).items()
        }
        return cls(name, settings)


def recipe_changes(recipe: Any) -> dict[str, Any]:
    """The fields where config dataclass `recipe` departs from its class's defaults (what the
    recipe sets); {} for None."""
    if recipe is None:
        return {}
    plain = type(recipe)()
    return {
        f.name: getattr(recipe, f.name)
        for f in dataclasses.fields(recipe)
        if not f.metadata.get("section") and getattr(recipe, f.name) != getattr(plain, f.name)
    }


@dataclass(frozen=True)
class OptionSetting:
    """An option that sets a config key, as a command line gave it."""

    flag: str
    """the option (`--data`)."""
    key: str
    """the dotted config key it sets (`data.dir`)."""
    value: Any
    """its value in the config's form; None: not given."""
    applies: bool = True
    """False: a planning input, read beside the config, not written into it."""


SETTING_KEY = "config_key"  # attributes of an argparse action declared by add_setting_argument
SETTING_VALUE = "config_value"
SETTING_APPLIES = "config_applies"


def add_setting_argument(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    flag: str,
    key: str,
    to_setting: Callable[[Any], Any] | None = None,
    applies: bool = True,
    **kwargs: Any,
) -> argparse.Action:
    """Declare option `flag` as setting config `key` (the one way an option that sets a config
    key is declared): `to_setting` turns its parsed value into the config's form (None: as
    parsed); `applies` False declares a planning input (`OptionSetting.applies`)."""
    action = parser.add_argument(flag, **kwargs)
    setattr(action, SETTING_KEY, key)
    setattr(action, SETTING_VALUE, to_setting)
    setattr(action, SETTING_APPLIES, applies)
    return action


def add_set_argument(parser: argparse.ArgumentParser, help: str) -> None:
    """`--set KEY=VALUE` (repeatable, into `args.overrides`), declared once for every command."""
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help
    )


def setting_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options of `parser` declared as setting a config key (`add_setting_argument`)."""
    return [a for a in parser._actions if getattr(a, SETTING_KEY, None)]


def option_settings(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> list[OptionSetting]:
    """What each option of `parser` that sets a config key was given in `args` (value None: not
    given; a flag's False counts as not given)."""
    out = []
    for action in setting_actions(parser):
        value = getattr(args, action.dest, None)
        if value is False or (value == action.default and action.default is not None):
            value = None  # not given (a store_true flag off, a default left as it is)
        convert = getattr(action, SETTING_VALUE)
        if value is not None and convert is not None:
            value = convert(value)
        out.append(
            OptionSetting(
                action.option_strings[0],
                getattr(action, SETTING_KEY),
                value,
                getattr(action, SETTING_APPLIES),
            )
        )
    return out


def check_agreement(options: Sequence[OptionSetting], sets: Sequence[str]) -> None:
    """ConfigError naming both when an option and a `--set` of its key give different values
    (an option and its `--set` twin either agree or the command refuses: which one to believe
    is the user's to say). Values are compared in the config's typed form (paths resolved)."""
    given = [o for o in options if o.value is not None]
    if not given:
        return
    for text in sets:
        key, value = parse_override(text)
        parts = key.split(".")
        if parts[0] not in ("model", "data", "train"):
            section = section_of(parts[0])
            key = f"{section}.{key}" if section else key
        for option in given:
            if option.key == key and not _same_setting(key, option.value, value):
                raise ConfigError(
                    f"{option.flag} {_shown(option.value)} and --set {text} set {key} to "
                    f"different values; give one of them (or the same value)"
                )


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value)) or "none"
    return str(to_dict(value))


def _same_setting(key: str, a: Any, b: Any) -> bool:
    """Whether `a` and `b` are the same value of dotted config `key` once typed as the config
    types it (a path by the folder it names)."""
    if isinstance(a, Path) or isinstance(b, Path) or key in _PATH_KEYS:
        return _as_path(a) == _as_path(b)
    return _typed_setting(key, a) == _typed_setting(key, b)


_PATH_KEYS = ("data.dir", "train.init_from", "train.distill_from")


def _as_path(value: Any) -> Path | None:
    return Path(str(value)).expanduser().resolve() if value not in (None, "") else None


def _typed_setting(key: str, value: Any) -> Any:
    """`value` as the typed config holds dotted `key` (written back as a file would); the value
    itself where it does not type (the assembly then reports what is wrong with it)."""
    parts = key.split(".")
    nested: Any = value
    for part in reversed(parts[1:]):
        nested = {part: nested}
    try:
        node: Any = getattr(run_config_from_dict({parts[0]: nested}, "--set"), parts[0])
        for part in parts[1:]:
            node = getattr(node, part)
    except (ConfigError, AttributeError, TypeError, ValueError):
        return to_dict(value)
    return to_dict(node)


# the options `Assembly.taper_options` applies, in its arguments' order
TAPER_OPTION_KEYS = ("model.taper", "model.head_taper", "model.kv_taper", "model.taper.multiple_of")


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
    names: dict[Layer, str] = field(default_factory=dict)
    """the name of each named layer applied: the base (`preset transformer-tiny`, `file c.yaml`)
    and the recipe (`recipe compare-cpu`); `where` says which layer, by name, set a key."""

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
        name = f"file {source}" if layer == Layer.FILE else source
        asm = cls(data, source, notes=[] if notes else None, names={layer: name})
        for section, values in data.items():
            for key in values if isinstance(values, dict) else ():
                asm.origins[f"{section}.{key}"] = layer
        return asm

    def layer_of(self, key: str) -> Layer:
        """The layer that set dotted `key` (`Layer.DEFAULT` when none did)."""
        return self.origins.get(key, Layer.DEFAULT)

    def where(self, key: str) -> str:
        """Which layer set dotted `key`, by name where it has one (`recipe compare-cpu`)."""
        layer = self.layer_of(key)
        return self.names.get(layer) or layer.name.lower()

    def assemble(
        self,
        options: Sequence[OptionSetting] = (),
        sets: Sequence[str] = (),
        recipe: Recipe | None = None,
        env: bool = True,
        check: bool = True,
    ) -> Assembly:
        """The layers above the base, in their one order: the command's options (checked
        against `--set` first, `check_agreement`) < `sets` (--set) < $TAPERLM_SET (unless `env`
        is False: a caller that already read it as `sets`). The recipe is applied last, below
        every key set (`put`), so that a `--set` of a whole section (`train={...}`) records only
        the section and the recipe still fills its keys. `check` False: the caller checked the
        options against the user's own --set (`sets` also holds $TAPERLM_SET). Returns self."""
        if check:
            check_agreement(options, sets)
        applied = {o.key: o.value for o in options if o.applies and o.value is not None}
        tapers = [applied.pop(k, None) for k in TAPER_OPTION_KEYS]
        if any(t is not None for t in tapers):
            self.taper_options(*tapers)
        for key, value in applied.items():
            section, name = key.split(".", 1)
            old = (self.data.get(section) or {}).get(name)
            replaced = self.layer_of(key) == Layer.FILE and not _same_setting(key, old, value)
            if self.notes is not None and replaced:  # a config file the user gave: say so
                flag = next(o.flag for o in options if o.key == key)
                self.notes.append(f"{flag} {_shown(value)} replaces {self.source}'s {key} {old}")
            self.put(key, value, Layer.OPTIONS)
        self.overrides(list(sets), Layer.SET, "--set")
        if env:
            self.overrides(env_overrides(), Layer.ENV, OVERRIDES_ENV)
        if recipe is not None:
            self.names[Layer.RECIPE] = f"recipe {recipe.name}"
            for key, value in recipe.settings.items():
                self.put(key, value, Layer.RECIPE)
        return self

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


__all__ = [
    "Assembly",
    "Layer",
    "OptionSetting",
    "Recipe",
    "add_set_argument",
    "add_setting_argument",
    "check_agreement",
    "option_settings",
]

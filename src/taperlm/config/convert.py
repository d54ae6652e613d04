"""dict <-> config dataclass, with specific errors for unknown keys and wrong types."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import types
import typing
from typing import Any

from taperlm.config.model import ModelConfig, check_taper_spec
from taperlm.config.train import DataConfig, TrainConfig
from taperlm.errors import ConfigError, TaperError
from taperlm.families import FAMILIES
from taperlm.families.gated import check_gate
from taperlm.files.io import quoted
from taperlm.spec.domains import check_field
from taperlm.spec.taper import TaperSpec, read_rho_mlp


def to_dict(obj: Any) -> Any:
    """Plain-Python (YAML-safe) form of a config dataclass; a model's options are written as the
    section named after its family."""
    if isinstance(obj, TaperSpec):
        return obj.to_dict()
    if dataclasses.is_dataclass(obj):
        texts = text_spec_fields(type(obj))
        out = {
            name: _text_of(value) if name in texts else to_dict(value)
            for name in config_keys(type(obj))
            for value in (getattr(obj, name),)
        }
        if isinstance(obj, ModelConfig) and obj.options is not None:
            out[obj.family] = to_dict(obj.options)
        return out
    if isinstance(obj, (list, tuple)):
        return [to_dict(x) for x in obj]
    return obj


def text_spec_fields(cls: type) -> set[str]:
    """The fields of `cls` that hold a spec as the user's text (`ModelConfig.head_taper`)."""
    return {f.name for f in dataclasses.fields(cls) if f.metadata.get("text_spec")}


def _text_of(value: Any) -> Any:
    """A text spec's field as a config file writes it: the text it was given."""
    return value.as_text() if isinstance(value, TaperSpec) else value


def config_keys(cls: type) -> list[str]:
    """The keys of config dataclass `cls` in a YAML mapping (a model's options are not one: they
    are the section named after its family)."""
    return [f.name for f in dataclasses.fields(cls) if not f.metadata.get("section")]


def from_dict(cls: type, data: Any, where: str = "") -> Any:
    """Build dataclass `cls` from a dict, rejecting unknown keys and mistyped values by name."""
    if cls is TaperSpec:
        return _taper_from(data, where or "taper")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where or 'config'} must be a mapping, got {type(data).__name__}: {quoted(data)}"
        )
    if cls is ModelConfig:
        return _model_from(data, where)
    return _dataclass_from(cls, data, where)


def _dataclass_from(cls: type, data: dict, where: str, sections: tuple[str, ...] = ()) -> Any:
    hints = typing.get_type_hints(cls)
    names = set(config_keys(cls))
    # key=str: YAML keys may be ints/bools/None (`1: 2`), which neither sort with str nor match.
    unknown = sorted((k for k in data if k not in names), key=str)
    if unknown:
        valid = names | set(sections)
        close = {u: closest_key(str(u), valid) for u in unknown}
        hint = "; ".join(f"{quoted(u)}" + _did_you_mean(u, c, where) for u, c in close.items())
        raise ConfigError(
            f"unknown key(s) in {where or 'config'}: {hint}. Valid keys: {', '.join(sorted(valid))}"
        )
    texts = text_spec_fields(cls)
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if key in texts and not isinstance(value, TaperSpec):  # text, parsed by the config
            kwargs[key] = coerce_value(str, value, path)
            continue
        kwargs[key] = coerce_value(hints[key], value, path)
        check_field(cls, key, kwargs[key], path)
    return cls(**kwargs)


def _did_you_mean(key: Any, close: str | None, where: str) -> str:
    """` (did you mean 'lr'?)`, or for a key of another section ` (it belongs in train:)`."""
    home = (
        section_of(key)
        if isinstance(key, str) and where in ("", "model", "data", "train")
        else None
    )
    if home and not where:
        return f" (it belongs in {home}:)"
    if home and home != where:
        return f" (it belongs in {home}:, not {where}:)"
    return f" (did you mean {close!r}?)" if close else ""


def _model_from(data: dict, where: str) -> ModelConfig:
    """A ModelConfig: the shared keys, plus the section named after its family read into the
    family's options. Sections of other families (every 0.1 config carried all of them) are
    ignored, and keys of older layouts are upgraded first (`upgrade_model`)."""
    at = f"{where}." if where else ""
    family = coerce_value(str, data.get("family", ModelConfig.family), f"{at}family")
    if family not in FAMILIES:
        raise ConfigError(
            f"{at}family {quoted(family)} is unknown; choose one of {', '.join(FAMILIES)}"
        )
    data = upgrade_model(data, where)
    fam = FAMILIES[family]
    for other in FAMILIES.values():
        if other is not fam and other.name in data:
            _check_other_family(other.name, data[other.name], family, at)
    shared = {k: v for k, v in data.items() if k not in FAMILIES}
    cfg = _dataclass_from(ModelConfig, shared, where, (family,) if fam.options else ())
    section = data.get(family, {}) if fam.options is not None else None
    if family in data and fam.options is None:
        raise ConfigError(f"{at}{family}: the {family} family has no options; delete the section")
    cfg.options = None if section is None else from_dict(fam.options, section, f"{at}{family}")
    return cfg


def upgrade_model(model: dict[str, Any], where: str) -> dict[str, Any]:
    """A model dict of an older taperlm layout rewritten to the current one (a copy; `model`
    itself when nothing changes), so that stored configs (run dirs, checkpoints, exports) load
    with the meaning they were written with:

    - taperlm 0.1 wrote `gate:` at the top level of every model (used only by the gated
      family): checked as before, and moved into the `gated:` section of a gated model;
    - a titans section the library wrote (its resolved `memory_widths` are there) before
      `max_inner_grad_norm` existed had no inner-gradient clip: it gets 0 (no clip), so an old
      run resumes, evaluates and exports as the model it trained.
    """
    if "gate" in model:
        model = dict(model)
        gate = model.pop("gate")
        check_gate(gate, f"{where}.gate" if where else "gate")
        section = model.get("gated", {})
        if model.get("family") == "gated" and isinstance(section, dict):
            model["gated"] = {"gate": gate, **section}
    titans = model.get("titans")
    if (
        isinstance(titans, dict)
        and titans.get("memory_widths") is not None
        and "max_inner_grad_norm" not in titans
    ):
        model = {**model, "titans": {**titans, "max_inner_grad_norm": 0.0}}
    return model


def _check_other_family(name: str, section: Any, family: str, at: str) -> None:
    """ConfigError for options of family `name` that differ from its defaults in a model of
    another `family`: they would be dropped without a word, whichever path gave them (a config
    file, --set, $TAPERLM_SET, compare). A section that holds only the defaults is ignored
    (every taperlm 0.1 config carried one for each family); so are resolved sizes."""
    other = FAMILIES[name]
    fix = f"set model.family={name} to use them, or delete model.{name}"
    if other.options is None or section is None or section == {}:
        if section not in (None, {}):
            raise ConfigError(f"{at}{name}: the {name} family has no options; delete the section")
        return
    if not isinstance(section, dict):
        raise ConfigError(f"{at}{name} must be a mapping of {name} options; {fix}")
    try:
        given = to_dict(other.fresh_options(from_dict(other.options, section, f"{at}{name}")))
    except ConfigError as err:
        raise ConfigError(f"{err} (this model is {quoted(family)}: {fix})") from None
    default = to_dict(other.fresh_options(other.options()))
    changed = [k for k in given if given[k] != default.get(k)]
    if changed:
        keys = ", ".join(f"{at}{name}.{k}" for k in changed)
        raise ConfigError(
            f"{keys}: an option of the {name} family, but model.family is {quoted(family)}, which "
            f"would drop it without a word; {fix}"
        )


def _taper_from(data: Any, where: str) -> TaperSpec:
    if isinstance(data, TaperSpec):  # parsed already (an option such as --taper): checked here
        check_taper_spec(data, where)
        return data
    if isinstance(data, str):
        return TaperSpec.parse(data)
    if isinstance(data, dict):
        spec = from_dict_plain(TaperSpec, data, where)
        check_taper_spec(spec, where)
        if spec.measured and not spec.rho_mlp and not spec.needs_pilot:
            # a hand-written mapping may name only the measurement: read it once
            try:
                spec = spec.with_novelty(read_rho_mlp(spec.source))
            except TaperError as err:
                raise ConfigError(f"{where}: {err}") from None
        return spec
    raise ConfigError(
        f"{where} must be a taper spec string (e.g. cosine:1.5:0.5) or a mapping, got {quoted(data)}"
    )


def from_dict_plain(cls: type, data: dict, where: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted((k for k in data if k not in names), key=str)
    if unknown:
        raise ConfigError(
            f"unknown key(s) in {where}: {', '.join(map(repr, unknown))}. Valid keys: {', '.join(sorted(names))}"
        )
    kwargs = {}
    for key, value in data.items():
        kwargs[key] = coerce_value(hints[key], value, f"{where}.{key}")
        check_field(cls, key, kwargs[key], f"{where}.{key}")
    return cls(**kwargs)


def coerce_value(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce_value(a, value, path)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{path}: invalid value {quoted(value)}")
    if origin is typing.Literal:
        # a closed set of strings: read as a string (a YAML boolean is named as such); which
        # strings is the field's domain, checked with the key and the allowed values
        return coerce_value(str, value, path)
    if dataclasses.is_dataclass(tp) or tp is TaperSpec:
        return from_dict(tp, value, path)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path} must be a list, got {type(value).__name__}: {quoted(value)}")
        (inner,) = args
        return [coerce_value(inner, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path} must be true or false, got {quoted(value)}")
    if tp in (int, float) and isinstance(value, str):
        # YAML 1.1 reads `1e-3` and `2e6` as strings; accept numeric strings.
        with contextlib.suppress(ValueError):
            value = float(value.replace("_", ""))
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{path} must be an integer, got {type(value).__name__}: {quoted(value)}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:
                raise ConfigError(
                    f"{path} must be a number a float can hold, got {value}"
                ) from None
        raise ConfigError(f"{path} must be a number, got {type(value).__name__}: {quoted(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        hint = " (YAML reads unquoted yes/no/on/off/true/false as booleans: quote it)"
        raise ConfigError(
            f"{path} must be a string, got {type(value).__name__}: {quoted(value)}"
            + (hint if isinstance(value, bool) else "")
        )
    return value


def closest_key(name: str, options: set[str]) -> str | None:
    m = difflib.get_close_matches(name, sorted(options), n=1, cutoff=0.6)
    return m[0] if m else None


def section_of(key: str) -> str | None:
    """The config section (model, train, data) a bare `--set` key belongs to, if any; a family's
    options section (`hope`, ...) belongs to model."""
    if key in FAMILIES:
        return "model"
    for section, cls in (("model", ModelConfig), ("train", TrainConfig), ("data", DataConfig)):
        if key in config_keys(cls):
            return section
    return None


def config_differences(a: dict, b: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, a's value, b's value) for every leaf that differs between two config dicts."""
    out: list[tuple[str, Any, Any]] = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        path = f"{prefix}{key}"
        if isinstance(va, dict) and isinstance(vb, dict):
            out.extend(config_differences(va, vb, path + "."))
        elif va != vb:
            out.append((path, va, vb))
    return out


def format_differences(diffs: list[tuple[str, Any, Any]], a_name: str, b_name: str) -> str:
    return "; ".join(f"{k}: {va!r} ({a_name}) vs {vb!r} ({b_name})" for k, va, vb in diffs)

"""Closed sets of strings are `Literal` types (issue 40): each is declared once and is at the
same time a config field's type, its domain (the check that names the key and the allowed
values) and a command-line option's choices. Every one is enumerated here, so a new closed set
written any other way, or a Literal whose choices drift from its domain, fails."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from taperlm import compress, training
from taperlm.cli import COMMANDS, build_parser, subcommand_parser
from taperlm.commands import eval as eval_command
from taperlm.commands import export as export_command
from taperlm.commands import novelty as novelty_command
from taperlm.compare import options
from taperlm.config import (
    DataConfig,
    ModelConfig,
    RunConfig,
    TrainConfig,
    apply_overrides,
    dump_yaml,
    load_run_config,
    run_config_from_dict,
    to_dict,
)
from taperlm.config.model import AttentionBias, InitScheme, RopeScaling, RopeType
from taperlm.config.presets import get_preset
from taperlm.config.train import (
    ActivationCheckpointing,
    CompileScope,
    Device,
    FSDPParamDtype,
    FSDPReduceDtype,
    Logger,
    LRScheduleName,
    Parallel,
    Precision,
)
from taperlm.errors import ConfigError
from taperlm.families import FAMILIES
from taperlm.families.gated import GateKind
from taperlm.families.titans import Variant
from taperlm.interop import gguf_export
from taperlm.spec.domains import choices, domain_of, field_domain

pytestmark = pytest.mark.unit

# every config field that is a closed set -> its Literal (all of them, not a sample)
FIELDS: dict[str, Any] = {
    "model.init": InitScheme,
    "model.attention_bias": AttentionBias,
    "model.rope_scaling.type": RopeType,
    "model.gated.gate": GateKind,
    "model.titans.variant": Variant,
    "train.schedule": LRScheduleName,
    "train.precision": Precision,
    "train.compile_scope": CompileScope,
    "train.activation_checkpointing": ActivationCheckpointing,
    "train.parallel": Parallel,
    "train.fsdp_param_dtype": FSDPParamDtype,
    "train.fsdp_reduce_dtype": FSDPReduceDtype,
    "train.device": Device,
    "train.loggers": Logger,
}
# every command-line option with choices -> its Literal, or the registry it lists
OPTIONS: dict[tuple[str, str], Any] = {
    ("plan", "--parallel"): Parallel,
    ("train", "--resume"): training.ResumeMode,
    ("eval", "--source"): eval_command.EvalSource,
    ("eval", "--dtype"): eval_command.EvalDtype,
    ("novelty", "--dtype"): novelty_command.LoadDtype,
    ("allocate", "--dtype"): novelty_command.LoadDtype,  # novelty's measurement options
    ("export", "--format"): export_command.ExportFormat,
    ("export", "--dtype"): gguf_export.GGUFDtype,
    ("prune", "--params-of"): compress.ParamsOf,
    ("prune", "--score"): compress.Score,
    ("compare", "--stop-on"): options.StopQuestion,
    ("compare", "--tune-lr-scope"): options.TuneScope,
    ("compare", "--executor"): options.ExecutorName,
    ("compare", "--paper"): tuple(options.PAPER_STUDIES),  # a registry of studies
}


def _sections() -> dict[str, type]:
    """Section path -> config dataclass: the run's sections and every family's options."""
    out: dict[str, type] = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig}
    out["model.rope_scaling"] = RopeScaling  # a nested section (null by default)
    out.update({f"model.{f.name}": f.options for f in FAMILIES.values() if f.options})
    return out


def _leaf(tp: Any) -> Any:
    """The type inside Optional and list."""
    while typing.get_origin(tp) in (typing.Union, types.UnionType, list):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) != 1:
            return tp
        tp = args[0]
    return tp


def _literal_fields() -> dict[str, tuple[Any, dataclasses.Field]]:
    found = {}
    for where, cls in _sections().items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = _leaf(hints[f.name])
            if typing.get_origin(tp) is typing.Literal:
                found[f"{where}.{f.name}"] = (tp, f)
    return found


def test_every_closed_set_of_the_config_is_a_literal_and_its_domain():
    found = _literal_fields()
    assert set(found) == set(FIELDS)
    for key, (tp, f) in found.items():
        assert tp == FIELDS[key], key
        assert field_domain(f).allowed() == typing.get_args(tp) == choices(tp), key
    # no set of strings written as text: every fixed choice domain is a Literal field's
    for where, cls in _sections().items():
        for f in dataclasses.fields(cls):
            dom = field_domain(f)
            if dom is not None and dom.choices is not None and not callable(dom.choices):
                assert f"{where}.{f.name}" in FIELDS, f"{where}.{f.name}: declare a Literal"


def test_every_option_with_choices_takes_them_from_its_literal():
    parser = build_parser()
    found = {
        (cmd, a.option_strings[0]): tuple(a.choices)
        for cmd in COMMANDS
        for a in subcommand_parser(parser, cmd)._actions
        if a.choices is not None and a.option_strings
    }
    assert set(found) == set(OPTIONS)
    for key, want in OPTIONS.items():
        assert found[key] == (want if isinstance(want, tuple) else choices(want)), key


def test_the_domain_of_a_literal():
    dom = domain_of(Precision)
    assert dom.allowed() == ("auto", "fp32", "bf16") and dom.describe() == "one of auto, fp32, bf16"
    assert dom.contains("bf16") and not dom.contains("fp16") and not dom.contains(True)
    with pytest.raises(TypeError):
        choices(typing.Literal[1, 2])
    with pytest.raises(TypeError):
        choices(str)


def _set(d: dict, key: str, value: Any) -> None:
    section, *path, name = key.split(".")
    node = d[section]
    for part in path:
        if node.get(part) is None:  # a null nested section (model.rope_scaling)
            node[part] = to_dict(RopeScaling()) if part == "rope_scaling" else {}
        node = node[part]
    node[name] = [value] if key == "train.loggers" else value


def _run_dict(key: str) -> dict:
    family = key.split(".")[1] if key.split(".")[1] in FAMILIES else "transformer"
    preset = {"titans": "titans-mag-tiny"}.get(family, f"{family}-tiny")
    return to_dict(RunConfig(model=get_preset(preset)))


@pytest.mark.parametrize("key", sorted(FIELDS))
def test_a_bad_value_names_the_key_and_every_allowed_value(key):
    d = _run_dict(key)
    _set(d, key, "no-such-choice")
    with pytest.raises(ConfigError) as err:
        run_config_from_dict(d).resolve()
    text = str(err.value)
    assert key in text and "no-such-choice" in text, text
    assert all(v in text for v in choices(FIELDS[key])), text
    _set(d, key, True)  # YAML's `yes`: named as a boolean, not a string
    with pytest.raises(ConfigError, match="must be a string, got bool"):
        run_config_from_dict(d)


@pytest.mark.parametrize("key", sorted(FIELDS))
def test_every_allowed_value_round_trips_through_config_yaml(key, tmp_path: Path):
    for value in choices(FIELDS[key]):
        d = _run_dict(key)
        _set(d, key, value)
        path = tmp_path / "config.yaml"
        path.write_text(dump_yaml(run_config_from_dict(d)), encoding="utf-8")
        again = to_dict(load_run_config(path))
        assert again == d, (key, value)


def test_the_memory_taper_is_a_spec_written_as_its_text(tmp_path: Path):
    """`model.titans.memory_taper`, like the head and KV tapers: parsed once when set, written
    back as the text it was given."""
    from taperlm.spec.taper import TaperSpec

    cfg = get_preset("titans-mag-tiny", resolve=False)
    cfg.options = dataclasses.replace(cfg.options, memory_taper="cosine", memory_multiple_of=8)
    assert isinstance(cfg.titans.memory_taper, TaperSpec)
    assert cfg.titans.memory_taper.schedule == "cosine"
    cfg.resolve()
    widths = cfg.titans.memory_widths
    assert len(set(widths)) > 1 and all(w % 8 == 0 for w in widths)
    path = tmp_path / "config.yaml"
    path.write_text(dump_yaml(RunConfig(model=cfg)), encoding="utf-8")
    assert "memory_taper: cosine\n" in path.read_text()
    back = load_run_config(path)
    assert back.model.titans.memory_taper == cfg.titans.memory_taper
    assert to_dict(back) == to_dict(RunConfig(model=cfg))
    assert cfg.baseline().titans.memory_taper.is_uniform
    d = to_dict(RunConfig(model=cfg))
    d["model"]["titans"].update(memory_taper="cosine:x", memory_widths=None)
    with pytest.raises(ConfigError, match=r"model\.titans\.memory_taper: taper 'cosine:x'"):
        run_config_from_dict(d).resolve()
    # through --set: the text replaces the spec; a value that is no text is named by --set
    apply_overrides(d, ["model.titans.memory_taper=linear:1.25:0.75"])
    spec = run_config_from_dict(d).resolve().model.titans.memory_taper
    assert spec.schedule == "linear" and spec.as_text() == "linear:1.25:0.75"
    with pytest.raises(ConfigError, match=r"^--set 'model\.titans\.memory_taper=5': .* string"):
        apply_overrides(d, ["model.titans.memory_taper=5"])


def test_stop_is_parsed_once_where_the_options_are_built(tmp_path: Path):
    from taperlm.compare.options import CompareOptions, Stop

    opts = CompareOptions(out=tmp_path, stop=" half-width:1e-3 ")
    assert opts.stop == Stop("half-width", 1e-3) and opts.stop.as_text() == "half-width:1e-3"
    assert dataclasses.replace(opts, seeds=3).stop is opts.stop  # kept, not parsed again
    assert CompareOptions(out=tmp_path).stop == Stop("decided")
    for bad in ("soon", "half-width:0", "half-width:x"):
        with pytest.raises(ConfigError, match="--stop"):
            CompareOptions(out=tmp_path, stop=bad)

"""Class 5 of issue 26: a config mistake is an error, never silence.

Every way a user's setting could be ignored, overridden or reinterpreted without a word is
enumerated from the configs themselves (every key of every section of a full config, at every
depth) and must end in an error naming the key and its line, or -- where the rewrite is what
the user asked for -- a printed note.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from conftest import assert_naming, raises_naming
from taperlm.cli import main as cli_main
from taperlm.config import (
    DataConfig,
    ModelConfig,
    TrainConfig,
    config_keys,
    load_yaml,
    run_config_from_dict,
    to_dict,
)
from taperlm.config.presets import get_preset
from taperlm.errors import ConfigError


def full_config() -> dict:
    """A run config holding every section (model with a family section and a taper mapping,
    data, train)."""
    return {
        "model": to_dict(get_preset("titans-mag-tiny", resolve=False)),
        "data": to_dict(DataConfig()),
        "train": to_dict(TrainConfig()),
    }


def _key_lines(text: str) -> list[tuple[int, str]]:
    """(line index, key) of every line that starts a mapping key (every depth)."""
    out = []
    for i, line in enumerate(text.splitlines()):
        m = re.match(r"^\s*([A-Za-z_][A-Za-z0-9_]*):", line)
        if m:
            out.append((i, m.group(1)))
    return out


TEXT = yaml.safe_dump(full_config(), sort_keys=False, default_flow_style=False)
KEY_LINES = _key_lines(TEXT)


@pytest.mark.unit
def test_the_walk_sees_every_depth():
    keys = {k for _, k in KEY_LINES}
    assert {"model", "train", "data", "taper", "titans", "schedule", "chunk_size", "lr"} <= keys
    assert len(KEY_LINES) > 60


@pytest.mark.unit
@pytest.mark.parametrize(("line", "key"), KEY_LINES, ids=[f"{k}@{i + 1}" for i, k in KEY_LINES])
def test_duplicate_key_at_any_depth_is_an_error(line, key, tmp_path):
    """The key's line written twice: PyYAML would keep the second silently (a section given
    twice loses the first whole)."""
    lines = TEXT.splitlines()
    lines.insert(line + 1, lines[line])
    path = tmp_path / "c.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as err:
        load_yaml(path)
    assert str(err.value) == (
        f"config file {path}, line {line + 2}: key {key!r} is given twice (first at line "
        f"{line + 1}); the later one would silently replace the earlier -- keep one"
    )


@pytest.mark.unit
def test_duplicate_key_through_the_cli(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  d_model: 64\ntrain:\n  lr: 0.1\ntrain:\n  seq_len: 32\n")
    assert cli_main(["plan", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("taperlm plan: error: ") and err.count("\n") == 1, err
    assert_naming(err, str(path), "line 5", "'train'", "line 3", "keep one")


@pytest.mark.unit
def test_duplicate_key_in_a_set_value_and_a_novelty_json(tmp_path, capsys):
    rc = cli_main(["plan", "--preset", "transformer-tiny", "--set", "model.taper={a: 1, a: 2}"])
    assert rc == 2
    assert_naming(capsys.readouterr().err, "'a'", "twice")
    rho = tmp_path / "rho.json"
    rho.write_text('{"rho_mlp": [0.1, 0.2], "rho_mlp": [0.3, 0.4]}')
    rc = cli_main(["plan", "--preset", "transformer-tiny", "--taper", f"novelty:{rho}"])
    err = capsys.readouterr().err
    assert rc == 2
    assert_naming(err, str(rho), "'rho_mlp'", "twice")


@pytest.mark.unit
def test_a_merge_key_may_still_be_overridden(tmp_path):
    """`<<:` merges are YAML's way to override on purpose: not a duplicate."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "base: &b {lr: 0.1, seq_len: 32}\nmodel: {d_model: 64}\ntrain:\n  <<: *b\n  lr: 0.2\n"
    )
    assert load_yaml(path)["train"] == {"lr": 0.2, "seq_len": 32}


SECTIONS = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig}
WRONG_SECTION = [
    (key, home, other)
    for home, cls in SECTIONS.items()
    for key in config_keys(cls)
    for other in SECTIONS
    if other != home and key not in config_keys(SECTIONS[other])
]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("key", "home", "other"), WRONG_SECTION, ids=[f"{k}-in-{o}" for k, _, o in WRONG_SECTION]
)
def test_key_in_the_wrong_section_names_its_section(key, home, other):
    data = full_config()
    data[other][key] = data[home][key]
    with pytest.raises(ConfigError) as err:
        run_config_from_dict(data, "F")
    assert_naming(str(err.value), f"in {other}: {key!r}", f"{home}:")


@pytest.mark.unit
@pytest.mark.parametrize("section", ["", "model", "model.taper", "model.titans", "train", "data"])
def test_unknown_key_at_every_depth(section):
    data = full_config()
    node = data
    for part in filter(None, section.split(".")):
        node = node[part]
    node["no_such_key"] = 1
    with pytest.raises(ConfigError) as err:
        run_config_from_dict(data, "F")
    assert "no_such_key" in str(err.value) and (section or "config") in str(err.value)


@pytest.mark.unit
def test_top_level_key_names_its_section():
    with raises_naming(ConfigError, "'lr'", "train:"):
        run_config_from_dict({"model": {"d_model": 64}, "lr": 0.1}, "F")


NULLABLE = {
    ("model", "n_kv_heads"),
    ("model", "mlp_widths"),
    ("model", "layer_heads"),
    ("model", "layer_kv_heads"),
    ("model", "rope_scaling"),  # plain RoPE
    ("model", "attention_head_dim"),  # d_model / n_heads
    ("train", "peak_flops"),
}
NULL_CASES = [
    (s, k) for s, cls in SECTIONS.items() for k in config_keys(cls) if (s, k) not in NULLABLE
]


@pytest.mark.unit
@pytest.mark.parametrize(("section", "key"), NULL_CASES, ids=[f"{s}.{k}" for s, k in NULL_CASES])
def test_null_never_silently_means_default(section, key):
    """`key:` with nothing after it reads as null: an error, not the default (only the
    fields whose null has a meaning, such as n_kv_heads, accept it)."""
    data = full_config()
    data[section][key] = None
    with pytest.raises(ConfigError) as err:
        run_config_from_dict(data, "F")
    assert f"{section}.{key}" in str(err.value)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("key", "text", "outcome"),
    [
        ("train.lr", '"1e-3"', 0.001),  # YAML 1.1 reads 1e-3 as a string: a number was meant
        ("train.lr", "1e-3", 0.001),
        ("train.tokens", "1e6", 1_000_000),
        ("train.tokens", "1_000", 1000),
        # an error: the key, the type it takes (or the fix), and what YAML read
        ("train.tokens", "1.5", ("integer", "float: 1.5")),
        ("train.tokens", "true", ("integer", "bool: True")),
        ("train.lr", "yes", ("number", "bool: True")),
        ("train.precision", "no", ("string", "bool: False", "quote it")),
        ("model.tie_embeddings", "yes", True),
        ("model.tie_embeddings", '"yes"', ("true or false", "'yes'")),
        ("model.tie_embeddings", "1", ("true or false", "got 1")),
        ("train.lr", "1" + "0" * 400, ("float",)),
        ("train.seed", "1.0e300", ("<= 4294967295",)),
        ("model.d_model", "[64]", ("integer", "list: [64]")),
        ("model.mlp_widths", "64", ("list", "int: 64")),
    ],
)
def test_type_coercions_are_exact_or_errors(key, text, outcome):
    section, name = key.split(".")
    data = yaml.safe_load(f"{section}:\n  {name}: {text}\n")
    data.setdefault("model", {"d_model": 64})
    if isinstance(outcome, tuple):
        with raises_naming(ConfigError, "F:", key, *outcome):
            run_config_from_dict(data, "F")
    else:
        cfg = run_config_from_dict(data, "F")
        assert getattr(getattr(cfg, section), name) == outcome


TINY = """model:
  family: transformer
  vocab_size: 300
  d_model: 32
  n_layers: 2
  n_heads: 2
  mlp_width: 64
  context_length: 64
train:
  lr: 0.001
"""


def _plan(tmp_path: Path, text: str, *extra: str, capsys) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert cli_main(["plan", "--config", str(path), *extra]) == 0
    return capsys.readouterr().err


@pytest.mark.unit
def test_set_replacing_a_file_value_prints_a_note(tmp_path, capsys):
    err = _plan(
        tmp_path, TINY, "--set", "train.lr=0.01", "--set", "model.rope_theta=5", capsys=capsys
    )
    assert err == "taperlm plan: note: --set train.lr=0.01 replaces 0.001\n"


@pytest.mark.unit
def test_another_familys_section_of_defaults_prints_a_note(tmp_path, capsys):
    """A section that holds only the other family's defaults (as every 0.1 config did) changes
    nothing: a note. One that sets anything is an error (test_other_family_options)."""
    text = TINY.replace(
        "  context_length: 64\n", "  context_length: 64\n  titans: {chunk_size: 16}\n"
    )
    err = _plan(tmp_path, text, capsys=capsys)
    assert_naming(err, "note:", "model.titans", "model.family is 'transformer'")


@pytest.mark.unit
def test_written_widths_that_disagree_with_the_taper_print_a_note(tmp_path, capsys):
    text = TINY.replace("  context_length: 64\n", "  context_length: 64\n  taper: linear:1.5:0.5\n")
    assert _plan(tmp_path, text, capsys=capsys) == ""  # widths resolved from the taper
    err = _plan(tmp_path, text.replace("train:", "  mlp_widths: [64, 64]\ntrain:"), capsys=capsys)
    assert_naming(err, "note:", "model.mlp_widths", "(linear)", "delete mlp_widths")


@pytest.mark.unit
def test_taper_options_replacing_the_files_print_notes(tmp_path, capsys):
    text = TINY.replace(
        "  context_length: 64\n",
        "  context_length: 64\n  taper: linear:1.5:0.5\n  mlp_widths: [80, 48]\n",
    )
    err = _plan(tmp_path, text, "--taper", "cosine", capsys=capsys)
    assert err == (
        "taperlm plan: note: --taper cosine replaces the config file's model.taper\n"
        "taperlm plan: note: the config file's resolved per-layer sizes are re-resolved from "
        "the new taper\n"
    )
    assert _plan(tmp_path, TINY, "--taper", "cosine", capsys=capsys) == ""  # nothing replaced


def test_data_option_replacing_the_files_data_dir_prints_a_note(tmp_path, capsys):
    """`train --config F --data D` where F names another data.dir (the run then fails on the
    missing data; the note comes first)."""
    path = tmp_path / "c.yaml"
    path.write_text(TINY + f"data:\n  dir: {tmp_path / 'old'}\n")
    argv = ["train", "--config", str(path), "--data", str(tmp_path / "new"), "--out",
            str(tmp_path / "run")]  # fmt: skip
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        f"taperlm train: note: --data {tmp_path / 'new'} replaces {path}'s data.dir "
        f"{tmp_path / 'old'}"
    )


# ----------------------------------------------------------------------------------------------
# an option of another family is an error on every path (issue 41, class 6)


def _other_value(cls: type, name: str, default: object) -> object:
    """A valid value of option `name` other than its default."""
    import typing

    from taperlm.spec.domains import domain_of_field

    hint = typing.get_type_hints(cls)[name]
    if hint is bool or isinstance(default, bool):
        return not default
    if isinstance(default, str):
        try:
            choices = domain_of_field(cls, name).allowed()
        except (AttributeError, TypeError):
            return None
        return next((c for c in choices if c != default), None)
    if isinstance(default, int):
        return default * 2 if default else 1
    if isinstance(default, float):
        return default / 2 if default else 0.5
    return None


def _other_family_cases() -> list[tuple[str, str, str, object]]:
    """(model family, other family, option, non-default value) for every option field of every
    family with options, given to every other family."""
    import dataclasses

    from taperlm.families import FAMILIES

    cases = []
    for other in FAMILIES.values():
        if other.options is None:
            continue
        for f in dataclasses.fields(other.options):
            if f.name in other.resolved:
                continue
            value = _other_value(other.options, f.name, getattr(other.options(), f.name))
            if value is None:
                continue
            cases += [(fam, other.name, f.name, value) for fam in FAMILIES if fam != other.name]
    return cases


OTHER_FAMILY_CASES = _other_family_cases()


@pytest.mark.unit
def test_the_other_family_cases_cover_every_family_option():
    from taperlm.families import FAMILIES

    with_options = {f.name for f in FAMILIES.values() if f.options is not None}
    assert {other for _, other, _, _ in OTHER_FAMILY_CASES} == with_options
    assert len(OTHER_FAMILY_CASES) >= 3 * len(with_options)


def _assert_names_the_fix(err: str, fam: str, other: str, key: str) -> None:
    assert f"model.{other}.{key}" in err, err
    assert f"model.family is {fam!r}" in err or f"this model is {fam!r}" in err, err
    assert f"set model.family={other}" in err and f"delete model.{other}" in err, err


@pytest.mark.unit
@pytest.mark.parametrize(
    "fam,other,key,value", OTHER_FAMILY_CASES, ids=lambda v: str(v) if isinstance(v, str) else ""
)
def test_other_family_options_are_an_error_on_every_path(
    fam, other, key, value, tmp_path, monkeypatch, capsys
):
    """`--set model.gated.gate=headwise` on a Transformer++ was dropped without a word unless a
    config file was involved: the same error on --set, $TAPERLM_SET, a config file and
    compare's base config."""
    from taperlm.compare.options import CompareOptions
    from taperlm.compare.recipe import base_config
    from taperlm.config.presets import preset_names

    preset = next(p for p in preset_names() if "tiny" in p and get_preset(p).family == fam)
    shown = str(value).lower() if isinstance(value, bool) else value
    setting = f"model.{other}.{key}={shown}"
    assert cli_main(["plan", "--preset", preset, "--set", setting]) == 2
    _assert_names_the_fix(capsys.readouterr().err, fam, other, key)
    monkeypatch.setenv("TAPERLM_SET", setting)
    assert cli_main(["plan", "--preset", preset]) == 2
    _assert_names_the_fix(capsys.readouterr().err, fam, other, key)
    monkeypatch.delenv("TAPERLM_SET")
    path = tmp_path / "c.yaml"
    data = to_dict_of(preset)
    data["model"][other] = {key: value}
    path.write_text(yaml.safe_dump(data))
    assert cli_main(["plan", "--config", str(path)]) == 2
    _assert_names_the_fix(capsys.readouterr().err, fam, other, key)
    with pytest.raises(ConfigError) as err:
        base_config(
            CompareOptions(out=tmp_path / "cmp", preset=preset, overrides=[setting]), None, None
        )
    _assert_names_the_fix(str(err.value), fam, other, key)


def to_dict_of(preset: str) -> dict:
    from taperlm.config import to_dict

    return {"model": to_dict(get_preset(preset))}

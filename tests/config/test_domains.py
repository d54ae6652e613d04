"""Class 1 of issue 16: every config value and every numeric command-line option has a declared
domain, checked before anything is written.

Nothing here lists fields or options by hand: the config sections are found by walking the
dataclasses reachable from `RunConfig` plus every registered family's options, and the options
by walking the argparse parsers of every subcommand. A new numeric or string field (or numeric
option) without a domain fails `test_every_field_declares_a_domain` /
`test_every_numeric_option_declares_a_domain`; every value just outside a domain must end in exit
code 2 and one line naming the key and the allowed range.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from conftest import assert_own_options
from taperlm.cli import COMMANDS, build_parser, subcommand_parser
from taperlm.cli import main as cli_main
from taperlm.config import ModelConfig, RunConfig, TrainConfig, to_dict
from taperlm.config.presets import get_preset, preset_families, preset_names
from taperlm.errors import ConfigError
from taperlm.families import FAMILIES
from taperlm.spec.domains import Domain, Number, check_domains, field_domain

# ----------------------------------------------------------------------------------------------
# discovery


def _strip(tp: Any) -> tuple[Any, int]:
    """(the scalar type inside Optional/list, list depth)."""
    depth = 0
    while True:
        origin = typing.get_origin(tp)
        if origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp, depth
            tp = args[0]
        elif origin is list:
            (tp,) = typing.get_args(tp)
            depth += 1
        else:
            return tp, depth


def config_sections() -> dict[str, type]:
    """Section path -> config dataclass, for every section reachable from RunConfig (nested
    dataclasses such as model.taper) and every registered family's options (model.<family>)."""
    out: dict[str, type] = {}

    def walk(cls: type, where: str) -> None:
        out[where] = cls
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp, _ = _strip(hints[f.name])
            if dataclasses.is_dataclass(tp) and not f.metadata.get("text_spec"):  # not a text
                walk(tp, f"{where}.{f.name}" if where else f.name)

    walk(RunConfig, "")
    del out[""]
    for fam in FAMILIES.values():
        if fam.options is not None:
            walk(fam.options, f"model.{fam.name}")
    return out


def config_fields() -> list[tuple[str, str, type, int, Domain | None]]:
    """(section, field, scalar type, list depth, domain) of every non-dataclass, non-bool field
    (`options`, the family section, is covered by the family's own entries)."""
    rows = []
    for where, cls in config_sections().items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp, depth = _strip(hints[f.name])
            if f.metadata.get("section") or dataclasses.is_dataclass(tp) or tp is bool:
                continue
            if not f.init:  # not read from a config (TaperSpec.text)
                continue
            if typing.get_origin(tp) is typing.Literal:  # a closed set of strings
                tp = str
            rows.append((where, f.name, tp, depth, field_domain(f)))
    return rows


def numeric_options() -> list[tuple[str, argparse.Action]]:
    parser = build_parser()
    return [
        (cmd, action)
        for cmd in COMMANDS
        for action in subcommand_parser(parser, cmd)._actions
        if action.type in (int, float) or isinstance(action.type, Number)
    ]


@pytest.mark.unit
def test_discovery_finds_every_section_and_option():
    """The walks see what they must (so the tests below cannot pass by seeing nothing)."""
    sections = config_sections()
    assert {"model", "data", "train", "model.taper"} <= set(sections)
    assert {f"model.{f.name}" for f in FAMILIES.values() if f.options} <= set(sections)
    names = {f"{w}.{n}" for w, n, *_ in config_fields()}
    assert {"train.beta2", "train.seed", "model.titans.chunk_size", "model.hope.levels"} <= names
    opts = {(c, a.option_strings[0]) for c, a in numeric_options()}
    assert {("eval", "--max-length"), ("novelty", "--seq-len"), ("eval", "--batch-size")} <= opts
    # `import` has no numeric option (its settings are --set train.*, checked as config fields)
    assert {c for c, _ in opts} == set(COMMANDS) - {"import"}


@pytest.mark.unit
def test_every_field_declares_a_domain():
    missing = [
        f"{where}.{name}"
        for where, name, tp, _, dom in config_fields()
        if dom is None and tp in (int, float, str)
    ]
    assert not missing, (
        f"config fields without a declared domain (taperlm.spec.domains.setting): {missing}"
    )
    typed = [(f"{w}.{n}", tp, d) for w, n, tp, _, d in config_fields() if d is not None]
    wrong = [k for k, tp, d in typed if (tp is str) == d.numeric]
    assert not wrong, f"numeric domain on a string field or the reverse: {wrong}"


@pytest.mark.unit
def test_every_numeric_option_declares_a_domain():
    missing = [
        f"{cmd} {a.option_strings or a.dest}"
        for cmd, a in numeric_options()
        if not isinstance(a.type, Number)
    ]
    assert not missing, f"numeric options without a domain (taperlm.spec.domains.number): {missing}"


# ----------------------------------------------------------------------------------------------
# the domains admit what taperlm itself writes


@pytest.mark.unit
def test_defaults_and_every_preset_are_inside_their_domains():
    RunConfig().validate()
    for where, cls in config_sections().items():
        if dataclasses.is_dataclass(cls) and all(
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            for f in dataclasses.fields(cls)
        ):
            check_domains(cls(), where)
    for name in preset_names():
        cfg = get_preset(name)
        check_domains(cfg, "model")
        check_domains(cfg.taper, "model.taper")
        if cfg.options is not None:
            check_domains(cfg.options, f"model.{cfg.family}")


@pytest.mark.unit
def test_option_defaults_are_inside_their_domains():
    for cmd, a in numeric_options():
        if a.default is not None:
            assert a.type.domain.contains(a.default), (cmd, a.option_strings, a.default)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("spec", "inside", "outside"),
    [
        ("[0, 1)", [0, 0.5, 0.999], [-0.1, 1, 1.5, math.nan, math.inf]),
        ("(0, inf)", [1e-30, 5, 1e300], [0, -1, math.nan, math.inf]),
        ("[1, inf)", [1, 2**40], [0, -3, 0.5]),
        ("{auto, cpu}", ["auto", "cpu"], ["gpu", "", 1]),
        ("text", ["", "x"], [1, 2.5]),
    ],
)
def test_domain_language(spec, inside, outside):
    d = Domain.parse(spec)
    assert all(d.contains(v) for v in inside)
    assert not any(d.contains(v) for v in outside)
    assert True not in [d.contains(v) for v in d.outside(integer=False)]
    with pytest.raises(ValueError):
        Domain.parse("[1, 0]")


# ----------------------------------------------------------------------------------------------
# every value just outside every domain: exit 2, one line naming the key and the range


def _preset_of(section: str) -> str:
    """A tiny preset whose config holds `section` (a family's options need that family)."""
    parts = section.split(".")
    if len(parts) == 2 and parts[0] == "model" and parts[1] in FAMILIES:
        prefix = next(p for p, (fam, _) in preset_families().items() if fam.name == parts[1])
        return f"{prefix}-tiny"
    return "transformer-tiny"


def _yaml(v: Any) -> str:
    if isinstance(v, float) and math.isnan(v):
        return ".nan"
    if isinstance(v, float) and math.isinf(v):
        return ".inf" if v > 0 else "-.inf"
    if isinstance(v, list):
        return "[" + ", ".join(_yaml(x) for x in v) + "]"
    return repr(v) if isinstance(v, str) else str(v)


def _current(preset: str, section: str, name: str) -> Any:
    cfg = get_preset(preset)
    node: Any = {"model": to_dict(cfg), "train": to_dict(TrainConfig()), "data": {"dir": ""}}
    for part in section.split("."):
        node = node.get(part, {}) if isinstance(node, dict) else {}
    return node.get(name) if isinstance(node, dict) else None


def _with_first_leaf(value: Any, depth: int, bad: Any) -> tuple[Any, str]:
    """`value` (a list of `depth` levels, possibly None) with its first element replaced by
    `bad`, and the index suffix the error names (`[0]`, `[0][0]`)."""
    if depth == 0:
        return bad, ""
    inner = value[0] if isinstance(value, list) and value else None
    first, suffix = _with_first_leaf(inner, depth - 1, bad)
    rest = list(value[1:]) if isinstance(value, list) else []
    return [first, *rest], "[0]" + suffix


def _cases() -> list[tuple[str, str, Any, str]]:
    cases = []
    for where, name, tp, depth, dom in config_fields():
        if dom is None or dom.text:
            continue
        for bad in dom.outside(integer=tp is int):
            cases.append((where, name, bad, depth))
    return cases


CASES = _cases()


@pytest.mark.parametrize(
    ("where", "name", "bad", "depth"), CASES, ids=[f"{w}.{n}={b!r}" for w, n, b, _ in CASES]
)
def test_out_of_domain_config_value_is_named(where, name, bad, depth, tmp_path, capsys):
    preset = _preset_of(where)
    value, suffix = _with_first_leaf(_current(preset, where, name), depth, bad)
    key = f"{where}.{name}"
    out = tmp_path / "run"
    argv = ["train", "--preset", preset, "--data", str(tmp_path / "data"), "--out", str(out)]
    rc = cli_main([*argv, "--set", f"{key}={_yaml(value)}", "--no-progress"])
    err = capsys.readouterr().err
    dom = next(d for w, n, _, _, d in config_fields() if (w, n) == (where, name))
    assert rc == 2, err
    assert err.startswith("taperlm train: error: ") and err.count("\n") == 1, err
    assert_own_options("train", err)
    assert f"{key}{suffix}" in err and dom.describe(bad) in err, err
    assert not out.exists() and not (tmp_path / "data").exists()


def _required_argv(cmd: str, tmp: Path) -> list[str]:
    """The positionals and required options of `cmd`, each a (missing) path under `tmp`."""
    argv = [cmd]
    for a in subcommand_parser(build_parser(), cmd)._actions:
        if not a.option_strings and a.dest not in ("help",) and a.nargs != "?":
            argv.append(str(tmp / a.dest))
        elif a.option_strings and a.required:
            argv += [a.option_strings[0], str(tmp / a.dest)]
    return argv


OPTION_CASES = [
    (cmd, a.option_strings[0], bad)
    for cmd, a in numeric_options()
    if isinstance(a.type, Number)
    for bad in a.type.domain.outside(integer=a.type.kind is int)
]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("cmd", "option", "bad"), OPTION_CASES, ids=[f"{c} {o}={b!r}" for c, o, b in OPTION_CASES]
)
def test_out_of_domain_option_is_named(cmd, option, bad, tmp_path, capsys):
    argv = [*_required_argv(cmd, tmp_path / "w"), f"{option}={bad}"]
    with _no_exit():
        rc = cli_main(argv)
    err = capsys.readouterr().err
    domain = next(
        a.type.domain
        for c, a in numeric_options()
        if c == cmd and a.option_strings[0] == option and isinstance(a.type, Number)
    )
    assert rc == 2, err
    assert err == f"taperlm {cmd}: error: {option} must be {domain.describe(bad)}, got {bad!r}\n"
    assert not (tmp_path / "w").exists()


class _no_exit:
    """argparse must not reach the value (a parse error would exit with usage, not one line)."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is SystemExit:
            pytest.fail(f"argparse rejected the value itself (exit {exc.code})")
        return False


@pytest.mark.unit
def test_zero_does_not_silently_mean_default(tmp_path, capsys):
    """The issue's examples: 0 for --seq-len / --batch-size / --max-length used to fall back to
    the default without a word."""
    for argv in (
        ["eval", str(tmp_path / "r"), "--max-length", "0"],
        ["eval", str(tmp_path / "r"), "--batch-size", "0"],
        ["novelty", str(tmp_path / "r"), "--seq-len", "0"],
        ["plan", "--preset", "transformer-tiny", "--seq-len", "0"],
    ):
        assert cli_main(argv) == 2
        assert argv[-2] in capsys.readouterr().err


@pytest.mark.unit
def test_programmatic_configs_are_checked_too():
    """Configs built in Python (not read from YAML) meet the same domains in validate()."""
    cfg = get_preset("titans-mag-tiny")
    cfg.options.max_inner_lr = 2.0
    with pytest.raises(ConfigError, match=r"model\.titans\.max_inner_lr must be in \(0, 1\]"):
        cfg.validate()
    run = RunConfig(model=get_preset("transformer-tiny"), train=TrainConfig(beta2=1.5))
    with pytest.raises(ConfigError, match=r"train\.beta2 must be in \[0, 1\), got 1\.5"):
        run.validate()
    bad = ModelConfig(family="transformer", n_layers=2, mlp_width=64, mlp_widths=[64, -1])
    with pytest.raises(ConfigError, match=r"model\.mlp_widths\[1\] must be >= 0, got -1"):
        bad.validate()


# ----------------------------------------------------------------------------------------------
# issue 41, class 5: advice to set a value never names one outside the value's domain


def _advice_fstrings(source: str) -> list[str]:
    """The literal text before each `{...}` of every f-string in `source` that advises setting a
    config key to a computed value (`set model.vocab_size={vocab}`, `--set train.x={n}`)."""
    import ast
    import re

    advice = re.compile(r"(?:\bset|--set) (?:model|train|data)\.[\w.]+ ?= ?$")
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr):
            for a, b in zip(node.values, node.values[1:]):
                advises = isinstance(a, ast.Constant) and isinstance(b, ast.FormattedValue)
                if advises and advice.search(str(a.value)):
                    found.append(str(a.value))
    return found


# (module, advice text) -> why the value is inside its domain by construction
ADVICE_ALLOWED = {
    ("spec/domains.py", "set "): "set_advice itself: after check_field accepted the value",
    ("spec/domains.py", " (e.g. --set "): "set_advice itself",
    ("config/convert.py", "set model.family="): "a registered family's name",
}


@pytest.mark.unit
def test_every_set_advice_is_checked_against_its_domain():
    """A vocabulary of 10^8 ids was answered with `set model.vocab_size=100000000`, above the
    2^24 the field accepts. Every advice to set a key to a computed value goes through
    `domains.set_advice` (which checks the domain first): the walk fails on any other."""
    src = Path(__file__).resolve().parents[2] / "src" / "taperlm"
    found = {
        (path.relative_to(src).as_posix(), text.strip()[-40:])
        for path in src.rglob("*.py")
        for text in _advice_fstrings(path.read_text(encoding="utf-8"))
    }
    unexplained = {
        (mod, text)
        for mod, text in found
        if not any(mod == m and text.endswith(t.strip()) for m, t in ADVICE_ALLOWED)
    }
    assert not unexplained, f"advice not built by domains.set_advice: {unexplained}"
    assert _advice_fstrings('f"set model.vocab_size={v}"') == ["set model.vocab_size="]


def _config_int_fields() -> list[tuple[type, str, str]]:
    """(config class, field, section) of every field whose domain has a finite upper end."""
    from taperlm.config import DataConfig

    classes = [ModelConfig, TrainConfig, DataConfig]
    return [
        (cls, f.name, section)
        for cls, section in zip(classes, ("model", "train", "data"))
        for f in dataclasses.fields(cls)
        if (dom := field_domain(f)) is not None and dom.hi < math.inf
    ]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("cls", "name", "section"), _config_int_fields(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_set_advice_names_only_values_inside_the_domain(cls, name, section):
    """For every bounded field: one past its upper end is never advised (the advice says no
    setting fits and names the end); its upper end itself is."""
    from taperlm.spec.domains import set_advice

    dom = field_domain(next(f for f in dataclasses.fields(cls) if f.name == name))
    integer = typing.get_type_hints(cls)[name] in (int, int | None)
    top = int(dom.hi) if integer else dom.hi
    key = f"{section}.{name}"
    over = top + 1 if integer else top * 2 + 1
    assert set_advice(cls, name, over, key).startswith(f"no setting of {key} fits it")
    if dom.hi_closed:
        assert set_advice(cls, name, top, key) == f"set {key}={top} (e.g. --set {key}={top})"

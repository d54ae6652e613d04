"""Config parsing, YAML round trip, overrides, and `taperlm plan`."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest

from conftest import assert_naming, raises_naming
from taperlm.cli import main
from taperlm.config import (
    RUNTIME_KEYS,
    ModelConfig,
    RunConfig,
    apply_overrides,
    from_dict,
    load_run_config,
    run_config_from_dict,
    runtime_keys,
    save_yaml,
    to_dict,
)
from taperlm.config import model as model_module
from taperlm.config.presets import get_preset, preset_names
from taperlm.errors import ConfigError
from taperlm.models import TaperedLM
from taperlm.spec.taper import TaperSpec

REPO = Path(__file__).resolve().parents[2]


def test_yaml_round_trip_keeps_resolved_widths(tmp_path):
    cfg = RunConfig(model=get_preset("transformer-tiny", TaperSpec.parse("cosine")))
    save_yaml(cfg, tmp_path / "c.yaml")
    back = load_run_config(tmp_path / "c.yaml")
    assert back.model.mlp_widths == cfg.model.mlp_widths
    assert back.model.taper == cfg.model.taper
    assert to_dict(back) == to_dict(cfg)


def test_loaded_widths_are_authoritative(tmp_path):
    """Widths in a saved config are never recomputed from the schedule on load."""
    cfg = RunConfig(model=get_preset("transformer-tiny", TaperSpec.parse("cosine")))
    d = to_dict(cfg)
    d["model"]["mlp_widths"] = [400, 400, 352, 352, 304, 304]  # same sum, not what cosine gives
    back = run_config_from_dict(d).resolve()
    assert back.model.mlp_widths == [400, 400, 352, 352, 304, 304]


def test_overrides_reresolve_widths_only_when_sizes_change():
    d = to_dict(RunConfig(model=get_preset("transformer-tiny", TaperSpec.parse("cosine"))))
    apply_overrides(d, ["model.context_length=128"])
    assert "mlp_widths" in d["model"]
    apply_overrides(d, ["model.taper=linear:1.5:0.5", "train.lr=1e-3", "n_layers=9"])
    cfg = run_config_from_dict(d).resolve()
    assert cfg.model.n_layers == 9 and len(cfg.model.mlp_widths) == 9
    assert cfg.model.taper.schedule == "linear"
    assert cfg.train.lr == 1e-3


@pytest.mark.parametrize(
    ("data", "named"),
    [
        # the key, the value given, and what is allowed or what fixes it
        ({"model": {"d_modle": 3}}, ("model", "'d_modle'", "'d_model'")),
        ({"model": {"d_model": "wide"}}, ("model.d_model", "integer", "'wide'")),
        ({"model": {"tie_embeddings": "yes"}}, ("model.tie_embeddings", "true", "false", "'yes'")),
        ({"train": {"lr": "fast"}}, ("train.lr", "number", "'fast'")),
        ({"model": {"taper": "cosine:2"}}, ("'cosine:2'", "cosine:START:END")),
        ({"model": {"taper": {"schedule": "cosine", "startt": 1}}}, ("model.taper", "'startt'")),
        ({"model": {"d_model": 30, "n_heads": 4}}, ("model.d_model (30)", "model.n_heads (4)")),
        ({"model": {"n_kv_heads": 3}}, ("model.n_kv_heads (3)", "model.n_heads (4)")),
        ({"model": {"family": "mamba"}}, ("model.family", "'mamba'", "transformer, gated")),
        ({"model": {"gate": "scalar"}}, ("model.gate", "'scalar'", "elementwise", "headwise")),
        (
            {"model": {"mlp_widths": [352, 352]}},
            ("model.mlp_widths", "2 entries", "model.n_layers is 6", "delete mlp_widths"),
        ),
        (
            {"model": {"mlp_widths": [352] * 5 + [368]}},
            ("model.mlp_widths", "2128", "2112", "delete mlp_widths"),
        ),
        ({"model": {"vocab_size": 0}}, ("model.vocab_size", ">= 1", "got 0")),
        ({"modell": {}}, ("'modell'", "'model'")),
        ({"model": {"rope_theta": float("nan")}}, ("model.rope_theta", "> 0", "nan")),
        ({"model": {"norm_eps": 0}}, ("model.norm_eps", "> 0", "got 0")),
    ],
)
def test_bad_config_errors(data, named):
    base = to_dict(RunConfig(model=get_preset("transformer-tiny", resolve=False)))
    for section, values in data.items():
        base.setdefault(section, {})
        if isinstance(base[section], dict):
            base[section].update(values)
    with raises_naming(ConfigError, *named):
        run_config_from_dict(base).resolve()


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("model: [1, 2\n", ("YAML", "line 2")),
        ("", ("empty",)),
        ("- 1\n- 2\n", ("model:", "got list")),
    ],
)
def test_bad_yaml_files(tmp_path, text, named):
    """Each names the file, and where or what is wrong in it."""
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with raises_naming(ConfigError, str(p), *named):
        load_run_config(p)


def test_every_preset_resolves_with_exact_budget():
    from taperlm.config.budget import total_params

    for name in preset_names():
        cfg = get_preset(name, TaperSpec.parse("cosine"))
        assert total_params(cfg) == total_params(cfg.baseline()), name


def test_440m_preset_is_about_440m():
    from taperlm.config.budget import total_params

    n = total_params(get_preset("transformer-440m"))
    assert 420e6 < n < 470e6


def test_plan_json_440m_cosine(capsys):
    assert main(["plan", "--preset", "transformer-440m", "--taper", "cosine", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    widths = [layer["mlp_width"] for layer in out["layers"]]
    base = out["baseline_mlp_width"]
    assert widths[0] == 1.5 * base and widths[-1] == 0.5 * base
    assert all(a >= b for a, b in itertools.pairwise(widths))
    assert out["total_params"] == out["baseline_total_params"]
    assert out["flops_per_token"] == out["baseline_flops_per_token"]
    assert sum(layer["params"] for layer in out["layers"]) == sum(
        layer["baseline_params"] for layer in out["layers"]
    )


def test_plan_table_and_errors(capsys, tmp_path):
    assert main(["plan", "--preset", "gated-tiny", "--taper", "groups:1.5,1.0,0.5"]) == 0
    out = capsys.readouterr().out
    assert "total parameters" in out and "+0" in out
    assert main(["plan", "--preset", "transformer-tiny", "--taper", "cosine:1.5:1.0"]) == 2
    assert "mean multiplier 1.25" in capsys.readouterr().err
    assert main(["plan", "--preset", "no-such"]) == 2
    assert "unknown preset" in capsys.readouterr().err
    cfg = tmp_path / "m.yaml"
    cfg.write_text(
        "model:\n  family: transformer\n  d_model: 64\n  n_layers: 3\n  n_heads: 2\n"
        "  mlp_width: 192\n  vocab_size: 100\n  taper: linear:1.5:0.5\n"
    )
    assert main(["plan", "--config", str(cfg), "--multiple-of", "32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [x["mlp_width"] for x in out["layers"]] == [288, 192, 96]


def test_model_config_defaults_validate():
    ModelConfig().resolve()


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_example_configs_load_and_match_their_presets(path):
    """configs/*.yaml are documented copies of presets: they load and resolve to the same model."""
    cfg = load_run_config(path).resolve()
    preset, taper = path.stem.rsplit("-", 1)
    expected = get_preset(preset, TaperSpec.parse(taper))
    assert to_dict(cfg.model) == to_dict(expected)
    text = path.read_text()
    assert text.count("\n  # ") >= 10  # fields carry their documentation


def test_env_overrides_apply_after_set_and_are_blamed_by_name(monkeypatch, capsys):
    """$TAPERLM_SET (documented: a way to run any command smaller without editing it) applies
    after --set, and a mistake in it names TAPERLM_SET, not --set or the preset."""
    import yaml

    from taperlm.cli import main

    monkeypatch.setenv("TAPERLM_SET", "model.n_layers=3 'train.lr=2e-3'")
    argv = ["plan", "--preset", "transformer-tiny", "--set", "model.n_layers=5", "--dump-config"]
    assert main(argv) == 0
    dumped = yaml.safe_load(capsys.readouterr().out)
    assert dumped["model"]["n_layers"] == 3 and dumped["train"]["lr"] == 2e-3
    monkeypatch.setenv("TAPERLM_SET", "train.tokenz=5")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert_naming(err, "TAPERLM_SET", "'train.tokenz=5'", "'tokenz'", "'tokens'")


def test_runtime_keys_come_from_the_fields_metadata():
    """The settings a resumed run may change are marked where they are declared; the derived
    set is the table the trainer used before (no behaviour change)."""
    train = {
        *("eval_every", "eval_tokens", "checkpoint_every", "keep_checkpoints", "log_every"),
        *("max_bad_steps", "compile", "compile_scope", "activation_checkpointing", "parallel"),
        *("fsdp_param_dtype", "fsdp_reduce_dtype", "async_checkpoint", "device", "precision"),
        *("peak_flops", "restore_nonfinite", "loggers", "log_grads_every", "log_project"),
        *("log_group", "log_name", "distill_from"),
    }
    assert RUNTIME_KEYS == runtime_keys() == {"data.dir"} | {f"train.{k}" for k in train}


def test_each_head_and_kv_spec_is_parsed_once_and_a_resolved_config_validated_once(monkeypatch):
    """The head and KV specs are parsed once, when their text is set (resolve, plan and the
    model card read the spec); resolve() is where a model config is validated, and a resolved
    config is resolved and checked as part of a run config no more until a field is assigned
    (then it is unresolved, and the change is checked)."""
    parsed: list[str] = []
    checks: list[str] = []
    parse = TaperSpec.parse.__func__
    monkeypatch.setattr(
        TaperSpec, "parse", classmethod(lambda cls, t, **k: parsed.append(t) or parse(cls, t, **k))
    )
    real_check = model_module.check_taper_spec
    monkeypatch.setattr(
        model_module, "check_taper_spec", lambda s, w: checks.append(w) or real_check(s, w)
    )
    cfg = ModelConfig(d_model=64, n_layers=4, n_heads=4, n_kv_heads=2, mlp_width=128, vocab_size=64)
    parsed.clear()  # the defaults' "uniform"
    cfg.head_taper, cfg.kv_taper = "cosine:1.5:0.5", "groups:1,0.5"
    assert parsed == ["cosine:1.5:0.5", "groups:1,0.5"] and not cfg.resolved
    cfg.resolve()
    assert cfg.head_taper_spec().multiple_of == 2  # the step of one KV group, not parsed again
    assert to_dict(cfg)["head_taper"] == "cosine:1.5:0.5"
    done = len(checks)
    for again in (cfg.resolve, RunConfig(model=cfg).validate, RunConfig(model=cfg).resolve):
        again()
    assert cfg.resolved and len(checks) == done and len(parsed) == 2
    cfg.mlp_widths = [w + 16 * (i == 0) for i, w in enumerate(cfg.mlp_widths)]  # a change
    assert not cfg.resolved
    with raises_naming(ConfigError, "model.mlp_widths", "delete mlp_widths"):
        cfg.resolve()
    assert len(checks) == done + 1 and not cfg.resolved


def test_tapered_lm_takes_a_resolved_config_and_resolves_a_loaded_one_once(monkeypatch):
    """TaperedLM's contract: a config resolve() wrote is used as is (no second validation); a
    config loaded with its sizes (a run dir, an export) is resolved and validated once; one
    without sizes is refused."""
    checks: list[str] = []
    real_check = model_module.check_taper_spec
    monkeypatch.setattr(
        model_module, "check_taper_spec", lambda s, w: checks.append(w) or real_check(s, w)
    )
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2, mlp_width=64, vocab_size=32).resolve()
    checks.clear()
    TaperedLM(cfg)
    assert checks == []
    loaded = from_dict(ModelConfig, to_dict(cfg))
    assert not loaded.resolved
    TaperedLM(loaded)
    assert loaded.resolved and checks == ["model.taper"]
    with raises_naming(ConfigError, "mlp_widths", "cfg.resolve()"):
        TaperedLM(ModelConfig(d_model=32, n_layers=2, n_heads=2, mlp_width=64))


def test_assembly_records_which_layer_set_each_key():
    """One assembly for every command: a higher layer's value wins whatever the order the
    layers are applied in, and the record says which layer set each key."""
    from taperlm.config.assembly import Assembly, Layer

    asm = Assembly.start(None, "transformer-tiny")
    assert asm.layer_of("model.d_model") is Layer.PRESET and not asm.given("model.d_model")
    asm.taper_options("cosine:1.5:0.5", None, None, 32)
    asm.overrides(["train.lr=1e-3", "n_layers=4"], Layer.SET, "--set")
    asm.overrides(["train.lr=2e-3"], Layer.ENV, "TAPERLM_SET")
    assert asm.layer_of("model.taper") is Layer.OPTIONS
    assert asm.layer_of("model.n_layers") is Layer.SET and asm.layer_of("train.lr") is Layer.ENV
    assert not asm.put("train.lr", 5e-3, Layer.RECIPE)  # below what the user gave
    assert asm.put("train.seq_len", 128, Layer.RECIPE) and not asm.given("train.seq_len")
    cfg = asm.resolve()
    assert cfg.train.lr == 2e-3 and cfg.train.seq_len == 128 and cfg.model.n_layers == 4
    assert cfg.model.taper == TaperSpec.parse("cosine:1.5:0.5", multiple_of=32)
    assert cfg.model.mlp_widths is not None and sum(cfg.model.mlp_widths) == 4 * 352


def test_assemble_applies_the_layers_in_their_one_order(monkeypatch):
    """`Assembly.assemble`, which every command calls: options < --set < $TAPERLM_SET, a named
    recipe below all of them (and above the preset) whatever the order; `where` names it."""
    from taperlm.config.assembly import Assembly, Layer, OptionSetting, Recipe

    monkeypatch.setenv("TAPERLM_SET", "train.lr=3e-3")
    recipe = Recipe("cpu", {"train.lr": 1e-3, "train.seq_len": 64, "model.init_std": 0.1})
    options = [
        OptionSetting("--tokens", "train.tokens", 8192),
        OptionSetting("--logger", "train.loggers", ["tensorboard"]),
        OptionSetting("--multiple-of", "model.taper.multiple_of", 8),
        OptionSetting("--seq-len", "train.seq_len", 512, applies=False),  # a planning input
    ]
    asm = Assembly.start(None, "transformer-tiny")
    asm.assemble(options, ["train.tokens=8192", "train.warmup_tokens=0"], recipe)
    cfg = asm.build()
    assert (cfg.train.tokens, cfg.train.loggers, cfg.train.lr) == (8192, ["tensorboard"], 3e-3)
    assert (
        cfg.train.seq_len == 64 and cfg.model.init_std == 0.1 and cfg.model.taper.multiple_of == 8
    )
    assert asm.layer_of("train.tokens") is Layer.SET and asm.layer_of("train.lr") is Layer.ENV
    assert asm.layer_of("train.loggers") is Layer.OPTIONS
    assert asm.where("train.seq_len") == "recipe cpu"
    assert asm.where("model.d_model") == "preset transformer-tiny"
    assert asm.where("train.lr") == "env" and asm.where("train.eps") == "default"
    monkeypatch.setenv("TAPERLM_SET", "train.loggers=[wandb]")  # above --logger, as everywhere
    asm = Assembly.start(None, "transformer-tiny").assemble(options, [])
    assert asm.build().train.loggers == ["wandb"]
    with raises_naming(ConfigError, "--tokens 8192", "--set train.tokens=4096"):
        Assembly.start(None, "transformer-tiny").assemble(options, ["train.tokens=4096"])


def test_logger_and_taperlm_set_apply_in_one_order_in_train_and_compare(tmp_path, monkeypatch):
    """--logger is an option in both train and compare: $TAPERLM_SET wins over it in both; and
    --set of train.loggers must agree with it in both."""
    from taperlm.cli import build_parser
    from taperlm.commands.train import _resolve_config
    from taperlm.compare.options import CompareOptions
    from taperlm.compare.recipe import base_config

    monkeypatch.setenv("TAPERLM_SET", "train.loggers=[wandb]")
    argv = ["train", "--preset", "transformer-tiny", "--logger", "tensorboard", "--out",
            str(tmp_path / "run")]  # fmt: skip
    args = build_parser(only="train").parse_args(argv)
    assert _resolve_config(args).train.loggers == ["wandb"]
    env = ["train.loggers=[wandb]"]  # as `taperlm compare` adds $TAPERLM_SET to --set
    opts = CompareOptions(out=tmp_path / "c", preset="transformer-tiny", loggers=["tensorboard"],
                          overrides=env)  # fmt: skip
    assert base_config(opts, None, None).train.loggers == ["wandb"]
    monkeypatch.delenv("TAPERLM_SET")
    opts = dataclasses.replace(opts, overrides=["train.loggers=[wandb]"])
    with raises_naming(ConfigError, "--logger tensorboard", "--set train.loggers=[wandb]"):
        base_config(opts, None, None)
    args = build_parser(only="train").parse_args([*argv, "--set", "train.loggers=[wandb]"])
    with raises_naming(ConfigError, "--logger tensorboard", "--set train.loggers=[wandb]"):
        _resolve_config(args)


def test_a_model_changes_family_only_explicitly():
    """Options of another family are refused by name, never swapped for defaults silently."""
    from taperlm.config.presets import get_preset

    hope = get_preset("hope-tiny")
    with raises_naming(ConfigError, "model.family 'transformer'", "HopeConfig"):
        dataclasses.replace(hope, family="transformer").validate()
    plain = hope.as_family("transformer").resolve()
    assert plain.options is None and plain.mlp_widths == hope.mlp_widths
    titans = hope.as_family("titans", None)
    assert type(titans.options).__name__ == "TitansConfig"


def test_a_null_model_section_with_a_taper_option_is_a_config_error(tmp_path, capsys):
    path = tmp_path / "null.yaml"
    path.write_text("model: null\n")
    assert main(["plan", "--config", str(path), "--taper", "cosine"]) == 2
    assert "model must be a mapping, got NoneType" in capsys.readouterr().err

"""Novelty-guided allocation: the rule from per-layer rho_mlp to multipliers, the `novelty:` taper
spec (files, run dirs, pilot), its exact budget, configs, and `taperlm allocate`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint_helpers import save_checkpoint
from conftest import raises_naming, tiny_config
from taperlm.cli import main
from taperlm.config import RunConfig, budget, load_run_config, run_config_from_dict, to_dict
from taperlm.errors import ConfigError, TaperError
from taperlm.files.outfiles import written_by_taperlm
from taperlm.models import TaperedLM
from taperlm.spec.solver import solve_sizes
from taperlm.spec.taper import TaperSpec, multipliers, novelty_multipliers, read_rho_mlp

RHO = [0.15, 0.14, 0.50, 0.50, 0.45, 0.24]  # uniform transformer-tiny, docs/compare.md


def novelty_json(path: Path, rho: list[float]) -> Path:
    """A file in the layout of `taperlm novelty --json` (only what the reader needs)."""
    layers = [{"layer": i, "rho_mlp": {"mean": v, "std": 0.1}} for i, v in enumerate(rho)]
    path.write_text(json.dumps({"name": "pilot", "n_layers": len(rho), "layers": layers}))
    return path


# ----------------------------------------------------------------------------------------------
# the rule


def test_rule_by_hand():
    m = novelty_multipliers(RHO, 0.5)
    mean = sum(RHO) / 6
    spread = max(abs(v - mean) for v in RHO)  # layer 1: 0.14
    assert m == pytest.approx([1 - 0.5 * (v - mean) / spread for v in RHO])
    assert sum(m) / 6 == pytest.approx(1.0, abs=1e-12)
    assert m[1] == pytest.approx(1.5)  # the most novel layer gets 1 + strength
    assert min(m) == pytest.approx(m[2]) == pytest.approx(m[3])  # the most reinforcing, least
    assert novelty_multipliers([0.3] * 4, 0.5) == [1.0] * 4  # no contrast: the uniform model


@settings(max_examples=200, deadline=None)
@given(
    rho=st.lists(st.floats(-1, 1, allow_nan=False), min_size=2, max_size=24),
    strength=st.floats(0.01, 0.99),
    baseline_steps=st.integers(4, 300),
    multiple_of=st.sampled_from([1, 16, 64]),
)
def test_rule_properties_and_exact_budget(rho, strength, baseline_steps, multiple_of):
    m = novelty_multipliers(rho, strength)
    assert sum(m) / len(m) == pytest.approx(1.0, abs=1e-9)
    assert all(1 - strength - 1e-9 <= x <= 1 + strength + 1e-9 for x in m)
    for a, b, x, y in zip(rho, rho[1:], m, m[1:]):  # lower rho, no less width (and vice versa)
        assert (a < b) <= (x >= y) and (a > b) <= (x <= y)
    spec = TaperSpec(schedule="novelty", strength=strength, multiple_of=multiple_of)
    baseline = baseline_steps * multiple_of
    try:
        widths = solve_sizes(spec.with_novelty(rho), len(rho), baseline)
    except TaperError as err:  # only a layer too narrow for one step of multiple_of may fail
        assert "positive width" in str(err) or "without breaking positivity" in str(err)
        return
    assert sum(widths) == len(rho) * baseline  # exact, monotone or not
    assert all(w > 0 and w % multiple_of == 0 for w in widths)


@pytest.mark.parametrize(
    ("rho", "strength", "named"),
    [
        ([0.1, float("nan")], 0.5, ("rho_mlp", "finite", "[0.1, nan]")),
        ([0.1, 0.2], 1.0, ("strength", "(0, 1)", "got 1.0")),
        ([0.1, 0.2], 0.0, ("strength", "(0, 1)", "got 0.0")),
    ],
)
def test_rule_errors(rho, strength, named):
    with raises_naming(TaperError, *named):
        multipliers(TaperSpec(schedule="novelty", strength=strength, rho_mlp=rho), len(rho))


# ----------------------------------------------------------------------------------------------
# the spec


def test_spec_from_files_and_run_dirs(tmp_path):
    f = novelty_json(tmp_path / "n.json", RHO)
    spec = TaperSpec.parse(f"novelty:{f}")
    assert spec.rho_mlp == RHO and spec.strength == 0.5 and spec.source == str(f)
    assert TaperSpec.parse(f"novelty:{f}:0.25").strength == 0.25
    assert TaperSpec.parse(spec.to_string()) == spec
    # a compare cell's result.json, and run dirs holding either file
    cell = tmp_path / "cell"
    cell.mkdir()
    (cell / "result.json").write_text(json.dumps({"novelty": json.loads(f.read_text())}))
    assert TaperSpec.parse(f"novelty:{cell}").rho_mlp == RHO
    run = tmp_path / "run"
    run.mkdir()
    novelty_json(run / "novelty.json", RHO[::-1])
    assert read_rho_mlp(run) == RHO[::-1]
    (tmp_path / "plain.json").write_text(json.dumps({"rho_mlp": [0.1, 0.2, 0.3]}))
    assert read_rho_mlp(tmp_path / "plain.json") == [0.1, 0.2, 0.3]
    pilot = TaperSpec.parse("novelty:pilot:0.3")
    assert pilot.needs_pilot and pilot.strength == 0.3 and not pilot.rho_mlp


@pytest.mark.parametrize(
    ("text", "named"),
    [
        # the source named, and the sources that would do (or the fix)
        ("novelty:", ("'novelty:'", "novelty:novelty.json", "novelty:RUN_DIR", "novelty:pilot")),
        ("novelty:nowhere.json", ("'nowhere.json'", "taperlm novelty --json", "pilot")),
        ("novelty:{tmp}", ("{tmp}", "novelty.json", "result.json", "taperlm novelty {tmp}")),
        ("novelty:{tmp}/bad.json", ("{tmp}/bad.json", "JSON")),
        ("novelty:{tmp}/other.json", ("{tmp}/other.json", "rho_mlp")),
        ("novelty:{tmp}/n.json:1.5", ("strength", "(0, 1)", "got 1.5")),
    ],
)
def test_spec_errors(tmp_path, text, named):
    novelty_json(tmp_path / "n.json", RHO)
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "other.json").write_text('{"loss": 3}')
    with raises_naming(TaperError, *(t.format(tmp=tmp_path) for t in named)):
        TaperSpec.parse(text.format(tmp=tmp_path))


def test_pilot_spec_needs_compare_and_depth_must_match(tmp_path):
    with raises_naming(TaperError, "novelty:pilot", "taperlm compare", "novelty:FILE.json"):
        solve_sizes(TaperSpec.parse("novelty:pilot"), 6, 352)
    spec = TaperSpec.parse(f"novelty:{novelty_json(tmp_path / 'n.json', RHO)}")
    with raises_naming(TaperError, "n.json", "6 layers", "12"):
        solve_sizes(spec, 12, 352)


@pytest.mark.parametrize("family", ["transformer", "gated", "hope", "titans"])
def test_config_budget_and_yaml_round_trip(tmp_path, family):
    spec = TaperSpec.parse(f"novelty:{novelty_json(tmp_path / 'n.json', RHO)}:0.4")
    kw = {"memory_heads": 2, "memory_head_dim": 8} if family == "titans" else {}
    cfg = tiny_config(family, spec, n_layers=6, mlp_width=160, **kw)
    widths = cfg.mlp_widths
    assert widths == [224, 224, 96, 96, 128, 192]  # most novel widest; not monotone
    assert TaperedLM(cfg).num_params() == budget.total_params(cfg)
    assert budget.total_params(cfg) == budget.total_params(cfg.baseline())
    assert budget.flops_per_token(cfg) == budget.flops_per_token(cfg.baseline())
    d = to_dict(RunConfig(model=cfg))
    assert d["model"]["taper"]["rho_mlp"] == RHO and d["model"]["taper"]["strength"] == 0.4
    (tmp_path / "n.json").unlink()  # the config carries its measurement: no file needed
    back = run_config_from_dict(d).resolve()
    assert back.model.taper == cfg.taper and back.model.mlp_widths == widths
    d["model"].pop("mlp_widths")
    assert run_config_from_dict(d).resolve().model.mlp_widths == widths  # re-solved the same


def test_mapping_with_only_a_source_reads_it(tmp_path):
    f = novelty_json(tmp_path / "n.json", RHO)
    cfg = tiny_config(resolve=False, n_layers=6)
    d = to_dict(RunConfig(model=cfg))
    d["model"]["taper"] = {"schedule": "novelty", "source": str(f), "strength": 0.5}
    d["model"].pop("mlp_widths", None)
    got = run_config_from_dict(d).resolve().model
    assert got.taper.rho_mlp == RHO
    d["model"]["taper"]["source"] = str(tmp_path / "missing.json")
    with raises_naming(ConfigError, "model.taper", "missing.json"):
        run_config_from_dict(d)


# ----------------------------------------------------------------------------------------------
# taperlm allocate


def test_allocate_from_a_json_for_a_preset(tmp_path, capsys):
    f = novelty_json(tmp_path / "n.json", RHO)
    out = tmp_path / "widths.yaml"
    argv = ["allocate", "--from", str(f), "--preset", "transformer-tiny", "--out", str(out)]
    assert main([*argv, "--strength", "0.3", "--plot", str(tmp_path / "w.png")]) == 0
    text = capsys.readouterr().out
    assert "rho_mlp read from" in text and "total parameters 3,303,040 (uniform 3,303,040)" in text
    assert (tmp_path / "w.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # both carry taperlm's mark, so a second run replaces them (a user's file it refuses)
    assert written_by_taperlm(out, "yaml") and written_by_taperlm(tmp_path / "w.png", "png")
    cfg = load_run_config(out).resolve()
    expected = solve_sizes(TaperSpec(schedule="novelty", strength=0.3, rho_mlp=RHO), 6, 352)
    assert cfg.model.mlp_widths == expected and cfg.model.taper.source == str(f)
    assert main(["allocate", "--from", str(f), "--preset", "transformer-tiny", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["total_params"] == data["baseline_total_params"]
    assert data["flops_per_token"] == data["baseline_flops_per_token"]
    assert sum(data["mlp_widths"]) == 6 * 352 and data["rho_mlp"] == RHO


def test_allocate_measures_a_run_and_keeps_its_config(tmp_path, capsys):
    import torch

    from taperlm.config import DataConfig, save_yaml
    from taperlm.data.tokenizer import train_bpe

    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat and the dog ran over the hill . " * 40)
    data_dir = tmp_path / "data"
    train_bpe([text.read_text()], vocab_size=200).save(data_dir / "tokenizer")
    model = tiny_config(vocab_size=320, n_layers=4, context_length=32, resolve=False)
    run_cfg = RunConfig(model=model, data=DataConfig(dir=str(data_dir))).resolve()
    run = tmp_path / "pilot"
    save_yaml(run_cfg, run / "config.yaml")
    torch.manual_seed(0)
    state = TaperedLM(run_cfg.model).state_dict()
    save_checkpoint(run, 1, state, {"tokens": 0}, to_dict(run_cfg), keep=1)
    out = tmp_path / "alloc.yaml"
    argv = ["allocate", "--from", str(run), "--data", str(text), "--tokens", "96", "--json"]
    assert main([*argv, "--out", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["how"].startswith("measured on 96 tokens") and len(data["rho_mlp"]) == 4
    cfg = load_run_config(out)
    assert cfg.data.dir == str(data_dir) and cfg.model.d_model == 32  # the pilot's run config
    assert cfg.model.mlp_widths == data["mlp_widths"] and sum(data["mlp_widths"]) == 4 * 64
    # the same numbers as measuring with `taperlm novelty`
    assert main(["novelty", str(run), "--data", str(text), "--tokens", "96", "--json"]) == 0
    measured = json.loads(capsys.readouterr().out)
    assert [x["rho_mlp"]["mean"] for x in measured["layers"]] == data["rho_mlp"]


def test_allocate_errors(tmp_path, capsys):
    f = novelty_json(tmp_path / "n.json", RHO)
    assert main(["allocate", "--from", str(f)]) == 2
    assert "has no config.yaml to allocate; name the model" in capsys.readouterr().err
    assert main(["allocate", "--from", str(f), "--preset", "transformer-small"]) == 2
    assert "has 6 layers but the model has 12" in capsys.readouterr().err


def test_allocate_hint_is_a_command_that_runs(tmp_path, capsys, monkeypatch):
    """The `taperlm train` line allocate prints runs as printed (it used to lack --out); for a
    preset without data it names the missing --data."""
    import shlex

    from taperlm.config import DataConfig, save_yaml

    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat and the dog ran over the hill . " * 200)
    data_dir = tmp_path / "data"
    argv = ["prepare", "--source", str(text), "--tokenizer", "bpe:300", "--val-tokens", "256"]
    assert main([*argv, "--out", str(data_dir)]) == 0
    model = tiny_config(vocab_size=320, n_layers=4, context_length=32, resolve=False)
    run_cfg = RunConfig(model=model, data=DataConfig(dir=str(data_dir))).resolve()
    run = tmp_path / "pilot"
    save_yaml(run_cfg, run / "config.yaml")
    save_checkpoint(run, 1, TaperedLM(run_cfg.model).state_dict(), {}, to_dict(run_cfg), 1)
    out = tmp_path / "widths.yaml"
    argv = ["allocate", "--from", str(run), "--data", str(text), "--tokens", "64"]
    assert main([*argv, "--out", str(out)]) == 0
    hint = capsys.readouterr().out.strip().splitlines()[-1].strip()
    assert hint == f"taperlm train --config {out} --out {tmp_path / 'widths'}"
    small = "train.tokens=256 train.batch_tokens=128 train.seq_len=32 train.micro_batch_size=4"
    monkeypatch.setenv("TAPERLM_SET", small + " train.eval_tokens=64 train.warmup_tokens=0")
    assert main([*shlex.split(hint)[1:], "--no-progress"]) == 0
    assert "done: step 2/2" in capsys.readouterr().out
    f = novelty_json(tmp_path / "n.json", RHO)
    assert (
        main(["allocate", "--from", str(f), "--preset", "transformer-tiny", "--out", str(out)]) == 0
    )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert f"taperlm train --config {out} --data DATA --out {tmp_path / 'widths'}" in last

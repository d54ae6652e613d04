"""`taperlm plan`'s ratio advice from the command line: printed for every model (uniform too),
P the plan's own parameter count, T `--tokens` or the config's train.tokens, and the same advice
under `--json`'s `ratio_advice`. Torch-free, as plan is (but for --gpus's memory plan)."""

from __future__ import annotations

import json

import pytest

from taperlm.cli import main
from taperlm.config import TrainConfig
from taperlm.config.budget import total_params
from taperlm.config.presets import get_preset
from taperlm.spec.ratio_advice import advice, format_advice


def _json(capsys, *argv: str) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.unit
def test_a_uniform_model_gets_the_advice_at_its_train_tokens(capsys):
    assert main(["plan", "--preset", "transformer-micro"]) == 0
    out = capsys.readouterr().out
    params = total_params(get_preset("transformer-micro"))
    tokens = TrainConfig().tokens
    want = format_advice(advice(params, tokens, taper="uniform", family="transformer"))
    assert out.rstrip().endswith(want)
    assert "this model is uniform: every Δ below is a taper's gain over it" in out
    assert out.index("budget matched") < out.index("ratio advice:")
    data = _json(capsys, "--preset", "transformer-micro")["ratio_advice"]
    assert data["run"] == {"params": params, "tokens": tokens, "tokens_per_param": tokens / params,
                           "taper": "uniform", "family": "transformer"}  # fmt: skip


@pytest.mark.unit
def test_tokens_sets_the_runs_t_and_json_carries_the_advice(capsys):
    argv = ["--preset", "transformer-440m", "--taper", "cosine", "--tokens", "30e9"]
    data = _json(capsys, *argv)
    a = data["ratio_advice"]
    assert a["run"]["params"] == data["total_params"] and a["run"]["tokens"] == 30e9
    assert a["run"]["taper"] == "cosine:1.5:0.5" and a["where"] == "outside"
    assert [set(p) >= {"point", "distance_decades", "diff_1.5", "diff_best", "best_ratio", "status"}
            for p in a["nearest"]] == [True] * 3  # fmt: skip
    assert a["advantage_gone_at"] and a["verdict"].startswith("The advantage is gone")
    assert main(["plan", *argv]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the advice's paragraphs are wrapped
    assert "65.8 tokens/param" in out and "decades larger than the largest model measured" in out


def test_the_advice_comes_before_the_memory_plan_and_notes_another_family(capsys):
    """(Not in the unit lane: --gpus's activation trace needs torch.)"""
    argv = ["plan", "--preset", "gated-micro", "--taper", "cosine", "--gpus", "1"]
    assert main([*argv, "--tokens", "1e6"]) == 0
    out = capsys.readouterr().out
    assert out.index("ratio advice:") < out.index("per-GPU memory:")
    assert "measured on Transformer++ only; this model is gated" in out

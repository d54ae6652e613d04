"""The model card (README.md) of `taperlm export`: the widths, heads, budget and training
settings of the exported model, written by `export_model` and by the command."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conftest import tiny_config
from taperlm.config import RunConfig, TrainConfig, budget
from taperlm.hf.model_card import TRAIN_SETTINGS

pytest.importorskip("transformers")


def _model(**kw):
    import torch

    from taperlm.models import TaperedLM

    cfg = tiny_config("transformer", "linear:1.5:0.5", n_layers=4, head_taper="cosine", **kw)
    torch.manual_seed(0)
    return TaperedLM(cfg).eval()


def _run_config(model) -> RunConfig:
    train = dataclasses.replace(TrainConfig(), lr=1.25e-3, tokens=123_456, seed=7, seq_len=48)
    return RunConfig(model=model.config, train=train)


def test_card_states_widths_heads_budget_and_training(tmp_path: Path) -> None:
    from taperlm.hf.export import export_model

    model = _model(n_kv_heads=2)
    cfg, rc = model.config, _run_config(model)
    card = (export_model(model, tmp_path / "tlm", run_config=rc) / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: taperlm\n") and "\n# tlm\n" in card
    heads = [cfg.attention_heads(i) for i in range(cfg.n_layers)]
    assert len(set(cfg.mlp_widths)) > 1 and len({h for h, _ in heads}) > 1
    assert f"- MLP widths: {cfg.mlp_widths}" in card
    assert f"- query heads: {[h for h, _ in heads]}" in card
    assert f"- KV heads: {[kv for _, kv in heads]}" in card
    total = budget.total_params(cfg)
    assert total == model.num_params()
    assert f"{total:,} parameters" in card
    assert f"(uniform baseline {budget.total_params(cfg.baseline()):,})" in card
    assert "linear:1.5:0.5" in card and "cosine 1.5 -> 0.5" in card
    for key in TRAIN_SETTINGS:
        assert f"| train.{key} | {getattr(rc.train, key)} |" in card
    assert "| train.lr | 0.00125 |" in card and "| train.tokens | 123456 |" in card


def test_card_without_a_run_config_has_no_training_section(tmp_path: Path) -> None:
    from taperlm.hf.export import export_model

    card = (export_model(_model(), tmp_path / "m") / "README.md").read_text()
    assert "## Layers and budget" in card and "## Training" not in card


def test_export_command_writes_the_card_with_the_runs_settings(tmp_path: Path, monkeypatch):
    import taperlm.checkpoint.loading
    from eval_helpers import tiny_tokenizer
    from taperlm.cli import main

    tok = tiny_tokenizer()
    model = _model(vocab_size=tok.vocab_size)
    rc = _run_config(model)
    monkeypatch.setattr(
        taperlm.checkpoint.loading, "load_run", lambda run, step=None: (model, tok, rc)
    )
    (tmp_path / "run").mkdir()
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "| train.lr | 0.00125 |" in card and f"{model.config.mlp_widths}" in card

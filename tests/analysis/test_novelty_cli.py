"""`taperlm novelty` end to end on offline tiny models: a saved random GPT-2 dir (as a plain dir
and as hf:DIR), a run dir of ours, the default-data lookup and the user-facing errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checkpoint_helpers import save_checkpoint
from conftest import assert_naming, raises_naming, tiny_config
from taperlm.cli import main
from test_novelty import tiny_gpt2

TEXT = (
    "The quick brown fox jumps over the lazy dog . A tapered model puts more width early and "
    "less width late , at the same budget . Novelty is the cosine between what a layer writes "
    "and the residual stream that enters it .\n"
) * 20


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 3-layer GPT-2 with a 100-word word-level tokenizer, saved like a Hub model."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    out = tmp_path_factory.mktemp("gpt2")
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        [TEXT], trainers.WordLevelTrainer(vocab_size=100, special_tokens=["[UNK]"])
    )
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(
        out
    )
    tiny_gpt2().save_pretrained(out)
    return out


@pytest.fixture()
def text_file(tmp_path: Path) -> Path:
    p = tmp_path / "text.txt"
    p.write_text(TEXT, encoding="utf-8")
    return p


def test_json_and_plot_on_hf_dir(gpt2_dir: Path, text_file: Path, tmp_path: Path, capsys):
    png = tmp_path / "out" / "novelty.png"
    rc = main(
        [
            "novelty",
            str(gpt2_dir),
            "--data",
            str(text_file),
            "--tokens",
            "150",
            "--json",
            "--plot",
            str(png),
            "--batch-size",
            "2",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_layers"] == 3 and out["input_tokens"] == 150
    assert out["seq_len"] == 64 and out["n_windows"] == 3  # 64 + 64 + 22
    assert out["n_tokens"] == 150 - 3 and out["skip_first"] is True
    assert out["layers_path"] == "transformer.h"
    assert [x["mlp_width"] for x in out["layers"]] == [128, 128, 128]
    for layer in out["layers"]:
        for key in ("rho_block", "rho_mlp"):
            s = layer[key]
            assert -1 <= s["p10"] <= s["median"] <= s["p90"] <= 1 and s["n"] == 147
    assert -1 <= out["pearson_mlp"] <= 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_on_hf_prefix_include_first(gpt2_dir: Path, text_file: Path, capsys):
    rc = main(
        [
            "novelty",
            f"hf:{gpt2_dir}",
            "--data",
            str(text_file),
            "--tokens",
            "100",
            "--seq-len",
            "50",
            "--include-first",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "Pearson r with depth" in out and "100 tokens measured per layer" in out
    assert "rho_block mean ± std" in out
    assert len([ln for ln in out.splitlines() if ln.strip().startswith(("0 ", "1 ", "2 "))]) == 3


def test_default_data_from_env(gpt2_dir: Path, tmp_path: Path, monkeypatch, capsys):
    root = tmp_path / "evaldata"
    (root / "wikitext-2").mkdir(parents=True)
    (root / "wikitext-2" / "wiki.test.raw").write_text(TEXT, encoding="utf-8")
    monkeypatch.setenv("TAPERLM_EVAL_DATA", str(root))
    assert main(["novelty", str(gpt2_dir), "--tokens", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["data"].endswith("wiki.test.raw") and out["n_tokens"] == 63


def test_user_errors(gpt2_dir: Path, text_file: Path, tmp_path: Path, capsys):
    assert main(["novelty", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["novelty", str(tmp_path / "empty")]) == 2
    assert "neither a run dir" in capsys.readouterr().err
    assert main(["novelty", str(gpt2_dir), "--data", str(text_file), "--tokens", "100000"]) == 2
    assert "fewer than the 100000" in capsys.readouterr().err
    assert main(["novelty", str(gpt2_dir), "--data", str(text_file), "--seq-len", "65"]) == 2
    assert "exceeds the model's context of 64" in capsys.readouterr().err
    args = ["novelty", str(gpt2_dir), "--data", str(text_file), "--tokens", "64"]
    assert main([*args, "--layers", "transformer.nope"]) == 2
    assert "no submodule" in capsys.readouterr().err


def test_run_dir(tmp_path: Path, text_file: Path, capsys):
    import torch

    from taperlm.config import DataConfig, RunConfig, save_yaml, to_dict
    from taperlm.data.tokenizer import train_bpe
    from taperlm.models import TaperedLM

    data_dir = tmp_path / "data"
    tok = train_bpe([TEXT], vocab_size=300)
    tok.save(data_dir / "tokenizer")
    model_cfg = tiny_config(
        taper="cosine", vocab_size=320, n_layers=3, n_heads=2, context_length=32, resolve=False
    )
    run_cfg = RunConfig(model=model_cfg, data=DataConfig(dir=str(data_dir))).resolve()
    run = tmp_path / "run"
    save_yaml(run_cfg, run / "config.yaml")
    torch.manual_seed(0)
    model = TaperedLM(run_cfg.model)
    save_checkpoint(run, 1, model.state_dict(), {"tokens": 0}, to_dict(run_cfg), keep=1)
    assert main(["novelty", str(run), "--data", str(text_file), "--tokens", "96", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layers_path"] == "blocks" and out["seq_len"] == 32 and out["n_tokens"] == 93
    assert [x["mlp_width"] for x in out["layers"]] == run_cfg.model.mlp_widths


def test_exported_taperlm_dir(tmp_path: Path, text_file: Path, capsys):
    pytest.importorskip("transformers")
    export = pytest.importorskip("taperlm.hf.export")
    import torch

    from taperlm.data.tokenizer import train_bpe
    from taperlm.models import TaperedLM

    cfg = tiny_config(taper="cosine", vocab_size=320, n_layers=3, n_heads=2, context_length=32)
    torch.manual_seed(0)
    export.export_model(TaperedLM(cfg), tmp_path / "hf", train_bpe([TEXT], vocab_size=300))
    argv = ["novelty", str(tmp_path / "hf"), "--data", str(text_file), "--tokens", "64", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layers_path"] == "model.blocks" and out["seq_len"] == 32
    assert [x["mlp_width"] for x in out["layers"]] == cfg.mlp_widths


def test_first_tokens_is_a_prefix_of_the_whole_file(tmp_path: Path):
    from taperlm.analysis.sources import first_tokens
    from taperlm.data.tokenizer import train_bpe
    from taperlm.errors import DataError

    enc = train_bpe([TEXT], vocab_size=300).encode
    p = tmp_path / "t.txt"
    p.write_text(TEXT * 3, encoding="utf-8")
    full = enc(TEXT * 3)
    for n in (10, 700, len(full)):
        assert first_tokens(p, enc, n) == full[:n]
    with raises_naming(DataError, str(p), f"only {len(full)} tokens", "--tokens"):
        first_tokens(p, enc, len(full) + 1)


def test_without_wikitext_a_run_uses_its_validation_split(tmp_path: Path, gpt2_dir: Path, capsys):
    """No --data and no WikiText-2 anywhere (a fresh clone without ../shared): a training run is
    measured on the first tokens of its own validation split, as `taperlm compare` does; a
    model without a run's data still gets the error naming what to pass."""
    import torch

    from taperlm.config import DataConfig, RunConfig, save_yaml, to_dict
    from taperlm.data.identity import record_run_data
    from taperlm.data.loader import open_split
    from taperlm.data.prepare import prepare
    from taperlm.models import TaperedLM

    # no evaluation data anywhere: the suite runs with the lookup off (conftest.py)
    (tmp_path / "corpus.txt").write_text(TEXT * 4, encoding="utf-8")
    data_dir = tmp_path / "data"
    prepare(str(tmp_path / "corpus.txt"), data_dir, "bpe:300", val_tokens=200, progress=False)
    model_cfg = tiny_config(vocab_size=320, n_layers=3, n_heads=2, context_length=32, resolve=False)
    run_cfg = RunConfig(model=model_cfg, data=DataConfig(dir=str(data_dir))).resolve()
    run = tmp_path / "run"
    save_yaml(run_cfg, run / "config.yaml")
    torch.manual_seed(0)
    save_checkpoint(run, 1, TaperedLM(run_cfg.model).state_dict(), {}, to_dict(run_cfg), 1)
    record_run_data(run, data_dir)

    assert main(["novelty", str(run), "--tokens", "64", "--plot", str(tmp_path / "n.png")]) == 0
    captured = capsys.readouterr()
    assert "WikiText-2 test not found" in captured.err and "val.bin" in captured.err
    assert (tmp_path / "n.png").is_file()
    assert main(["novelty", str(run), "--tokens", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["data"] == str(data_dir / "val.bin") and out["input_tokens"] == 64
    # the same tokens a --data file holding them would give: the val split's first 64
    _, val = open_split(data_dir, "val")
    from taperlm.analysis.sources import first_val_tokens

    assert first_val_tokens(data_dir, 64, "--tokens") == [int(t) for t in val[:64]]

    assert main(["novelty", str(gpt2_dir), "--tokens", "64"]) == 2
    err = capsys.readouterr().err
    assert_naming(err, "WikiText-2", "--data FILE")

    # the run's data dir re-prepared from other text: its val tokens are not the run's any more
    (tmp_path / "corpus.txt").write_text(TEXT[::-1] * 4, encoding="utf-8")
    prepare(str(tmp_path / "corpus.txt"), data_dir, "bpe:300", val_tokens=200, progress=False)
    assert main(["novelty", str(run), "--tokens", "64"]) == 2
    err = capsys.readouterr().err  # another tokenizer: the one refusal (issue 63)
    assert_naming(err, str(data_dir), str(run), "another tokenizer", f"--tokenizer {run}/tokenizer")

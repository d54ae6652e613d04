"""`taperlm export --format block-configs` and `taperlm plan --block-configs`: the DeciLM /
Nemotron-NAS per-layer config (block_configs) and Llama-named weights. The schema is checked
against the readers' rule (vLLM's nemotron_nas and llama.cpp's DeciModel: width =
int(2 * ffn_mult * hidden / 3) rounded up to a multiple of 256; KV heads = num_attention_heads /
n_heads_in_group), the weights are read back into our model (equal logits), and what the format
cannot carry is refused by name. The slow test runs llama.cpp's own converter on the export."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import raises_naming, tiny_config
from eval_helpers import tiny_tokenizer

pytest.importorskip("transformers")

from taperlm.cli import main
from taperlm.errors import ConfigError
from taperlm.hf import llama
from taperlm.hf.decilm import block_configs
from taperlm.hf.export import export_block_configs
from taperlm.hf.safetensors_file import read_tensors
from taperlm.models import TaperedLM


def reader_width(ffn_mult: float, hidden: int) -> int:
    """The readers' rule, written out here independently of taperlm.hf.decilm."""
    n = int(2 * ffn_mult * hidden / 3)
    return -(-n // 256) * 256


def make_model(tied: bool = False, **fields) -> TaperedLM:
    tok = tiny_tokenizer()
    base = dict(d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, mlp_width=512,
                vocab_size=tok.vocab_size, context_length=64, init_std=0.3,
                tie_embeddings=tied)  # fmt: skip
    cfg = tiny_config(taper=fields.pop("taper", "custom:768,512,256"), **{**base, **fields})
    torch.manual_seed(0)
    return TaperedLM(cfg).eval()


@pytest.mark.parametrize("tied", [False, True])
def test_export_schema_and_weights_round_trip(tmp_path: Path, tied: bool) -> None:
    model = make_model(tied)
    cfg = model.config
    out = export_block_configs(model, tmp_path / "x", tiny_tokenizer())
    conf = json.loads((out / "config.json").read_text())
    assert conf["architectures"] == ["DeciLMForCausalLM"]
    assert (conf["hidden_size"], conf["num_attention_heads"], conf["num_hidden_layers"]) == (
        64,
        4,
        3,
    )
    assert (conf["rms_norm_eps"], conf["rope_theta"]) == (cfg.norm_eps, cfg.rope_theta)
    assert conf["tie_word_embeddings"] is tied
    blocks = conf["block_configs"]
    widths = [reader_width(b["ffn"]["ffn_mult"], 64) for b in blocks]
    assert widths == cfg.mlp_widths == [768, 512, 256]
    assert all(isinstance(b["ffn"]["ffn_mult"], float) for b in blocks)  # llama.cpp asserts it
    assert [4 // b["attention"]["n_heads_in_group"] for b in blocks] == [2, 2, 2]
    assert not any(b["attention"]["no_op"] or b["ffn"]["no_op"] for b in blocks)
    # the weights, read back under Llama names into a model of the widths the config gives
    hf = read_tensors(out / "model.safetensors")
    assert ("lm_head.weight" in hf) is not tied
    assert hf["model.layers.0.mlp.gate_proj.weight"].shape == (768, 64)
    assert hf["model.layers.2.self_attn.k_proj.weight"].shape == (2 * 16, 64)
    back = TaperedLM(cfg).eval()
    back.load_state_dict(llama.to_taperlm(hf, cfg))
    ids = torch.randint(0, cfg.vocab_size, (1, 20))
    with torch.no_grad():
        assert torch.equal(back(ids).logits, model(ids).logits)
    assert (out / "tokenizer.json").is_file()


def test_import_takes_the_export_back(tmp_path: Path, capsys) -> None:
    """`taperlm import` of a block-configs export: the per-layer widths as a custom taper and
    the very weights; a DeciLM layer that is not a plain Llama block, or KV heads that differ
    per layer, are refused by name."""
    from taperlm.checkpoint.loading import load_run_model
    from taperlm.interop.importing import import_checkpoint

    model = make_model()
    out = export_block_configs(model, tmp_path / "x", tiny_tokenizer())
    assert main(["import", str(out), "--out", str(tmp_path / "run")]) == 0
    assert "MLP widths 768, 512, 256" in capsys.readouterr().out
    run, tok = import_checkpoint(out, tmp_path / "run2")
    assert run.model.mlp_widths == [768, 512, 256]
    assert run.model.taper.to_string() == "custom:768,512,256"
    back, _ = load_run_model(tmp_path / "run")
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values())
    )
    assert tok.encode("the cat") == tiny_tokenizer().encode("the cat")
    conf = json.loads((out / "config.json").read_text())
    for change, needle in (
        (("ffn", "no_op", True), "layer 1's ffn is not a plain Llama block (no_op: True)"),
        (("attention", "replace_with_linear", True), "replace_with_linear: True"),
        (("attention", "window_length", 16), "window_length: 16"),
        (("attention", "n_heads_in_group", 1), "KV heads differ per layer"),
        (("ffn", "gated", False), "gated: False"),
    ):
        bad = json.loads(json.dumps(conf))
        part, key, value = change
        bad["block_configs"][1][part][key] = value
        (out / "config.json").write_text(json.dumps(bad))
        assert main(["import", str(out), "--out", str(tmp_path / "r2")]) == 2
        err = capsys.readouterr().err
        assert needle in err, err
        assert not (tmp_path / "r2").exists()


def test_what_the_format_cannot_carry_is_refused_by_name(tmp_path: Path) -> None:
    # each names what the format cannot carry, in this model, and the export that can
    with raises_naming(ConfigError, "256", "layer 0: 784", "--multiple-of 256", "--format"):
        block_configs(make_model(taper="custom:784,512,240").config)
    with raises_naming(ConfigError, "'custom:6,4,2'", "[2, 4, 6]", "model.kv_taper", "--format"):
        block_configs(make_model(head_taper="custom:6,4,2", taper="uniform").config)
    gated = tiny_config(family="gated", d_model=64, n_heads=4, mlp_width=512, taper="uniform")
    with raises_naming(ConfigError, "model family 'gated'", "--format hf"):
        block_configs(gated)
    with raises_naming(ConfigError, "layer 0: 784", "--multiple-of 256"):
        export_block_configs(make_model(taper="custom:784,512,240"), tmp_path / "y")
    assert not (tmp_path / "y").exists()


def test_per_layer_kv_heads() -> None:
    """A KV taper at a size where its freed parameters fill whole 256-wide MLP steps: each layer's
    n_heads_in_group gives back its KV heads, the query heads stay uniform."""
    from taperlm.config.presets import get_preset
    from taperlm.spec.taper import TaperSpec

    cfg = get_preset("transformer-440m", resolve=False)
    cfg.taper = TaperSpec.parse("cosine", multiple_of=256)
    cfg.kv_taper = "cosine:1.0:0.25"
    cfg.resolve()
    blocks = block_configs(cfg)
    kv = [cfg.n_heads // b["attention"]["n_heads_in_group"] for b in blocks]
    assert kv == [cfg.attention_heads(i)[1] for i in range(cfg.n_layers)]
    assert len(set(kv)) > 1
    widths = [reader_width(b["ffn"]["ffn_mult"], cfg.d_model) for b in blocks]
    assert widths == cfg.mlp_widths


def test_plan_writes_the_block_configs(tmp_path: Path, capsys) -> None:
    out = tmp_path / "blocks.json"
    argv = ["plan", "--preset", "transformer-tiny", "--set", "model.d_model=256",
            "--set", "model.mlp_width=1024", "--set", "model.n_layers=4",
            "--taper", "linear:1.5:0.5", "--multiple-of", "256", "--block-configs", str(out)]  # fmt: skip
    assert main(argv) == 0
    conf = json.loads(out.read_text())
    widths = [reader_width(b["ffn"]["ffn_mult"], 256) for b in conf["block_configs"]]
    assert (
        sum(widths) == 4 * 1024 and widths == sorted(widths, reverse=True) and len(set(widths)) > 1
    )
    assert "written_by" in conf
    capsys.readouterr()
    argv[argv.index("256", argv.index("--multiple-of"))] = "16"
    argv[argv.index("linear:1.5:0.5")] = "linear:1.3:0.7"
    assert main([*argv[:-1], str(tmp_path / "b.json")]) == 2
    assert "multiples of 256" in capsys.readouterr().err
    assert not (tmp_path / "b.json").exists()


# ----------------------------------------------------------------------------------------------
# llama.cpp's own converter

LLAMA_CPP_ENV = "TAPERLM_LLAMA_CPP_DIR"


def _converter_dir() -> Path | None:
    """The llama.cpp sources (convert_hf_to_gguf.py, conversion/, gguf-py/): $TAPERLM_LLAMA_CPP_DIR,
    else vendor/llama.cpp of a llama-cpp-python sdist unpacked under /tmp/llcpp
    (`pip download --no-deps --no-binary :all: llama-cpp-python -d /tmp/llcpp` and untar)."""
    env = os.environ.get(LLAMA_CPP_ENV)
    found = [Path(env)] if env else sorted(Path("/tmp/llcpp").glob("*/vendor/llama.cpp"))
    return next((p for p in found if (p / "convert_hf_to_gguf.py").is_file()), None)


@pytest.mark.slow
def test_llama_cpp_converter_gives_our_logits(tmp_path: Path, monkeypatch) -> None:
    src = _converter_dir()
    if src is None:
        pytest.skip(
            f"llama.cpp's convert_hf_to_gguf.py not found: set {LLAMA_CPP_ENV} to a llama.cpp "
            "checkout, or unpack the llama-cpp-python sdist under /tmp/llcpp"
        )
    import subprocess

    from test_gguf_export import llama_cpp_logits

    model = make_model()
    out = export_block_configs(model, tmp_path / "x", tiny_tokenizer())
    gguf_path = tmp_path / "x.gguf"
    # The converter's DeciLM vocabulary path picks by vocab size (128256: Llama 3's byte-level
    # BPE; else a SentencePiece Llama tokenizer), and it names a BPE pre-tokenizer by the hash
    # of known tokenizers' output; our byte-level BPE with GPT-2 pre-tokenization takes the
    # former path as `gpt-2` (a wrapper patches only these vocabulary choices, never the weights
    # or hyperparameters).
    wrapper = tmp_path / "convert.py"
    wrapper.write_text(
        "import sys\n"
        f"sys.path[:0] = [{str(src)!r}, {str(src / 'gguf-py')!r}]\n"
        "import convert_hf_to_gguf as c\n"
        "from conversion.deci import DeciModel\n"
        "def set_vocab(self):\n"
        "    tokens, toktypes, tokpre = self.get_vocab_base()\n"
        "    self.gguf_writer.add_tokenizer_model('gpt2')\n"
        "    self.gguf_writer.add_tokenizer_pre(tokpre)\n"
        "    self.gguf_writer.add_token_list(tokens)\n"
        "    self.gguf_writer.add_token_types(toktypes)\n"
        "DeciModel.set_vocab = set_vocab\n"
        "DeciModel.get_vocab_base_pre = lambda self, tokenizer: 'gpt-2'\n"
        "c.main()\n"
    )
    res = subprocess.run(
        [sys.executable, str(wrapper), str(out), "--outfile", str(gguf_path), "--outtype", "f32"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    ids = list(range(5, 29))
    with torch.no_grad():
        ours = model(torch.tensor([ids])).logits[0].double().numpy()
    np.testing.assert_allclose(llama_cpp_logits(gguf_path, ids), ours, atol=2e-4)

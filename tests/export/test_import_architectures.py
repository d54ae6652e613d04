"""`taperlm import` of the architectures people own beyond plain Llama: Llama 3.x RoPE scaling
(`llama3`, and `linear`) in every layout transformers reads (`rope_parameters`; `rope_scaling`
beside a top-level `rope_theta`), attention biases (Qwen2's q/k/v; Llama's and Qwen3's
`attention_bias`, q/k/v and output), Qwen3's per-head q/k RMSNorm with a `head_dim` other than
hidden / heads. Each tiny random model (tied and untied) imports with transformers' logits; the
comparison is shown to see each feature; the run trains, exports back (`--format llama`, which
transformers loads without our code, and `--format hf`), and decodes with its KV cache as
transformers does. What we still cannot compute is refused by name, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import fault_harness as H

transformers = pytest.importorskip("transformers")
transformers.utils.logging.disable_progress_bar()

from taperlm.checkpoint.loading import load_any, load_run_model  # noqa: E402
from taperlm.cli import main  # noqa: E402
from taperlm.config.model import RopeScaling  # noqa: E402
from taperlm.models.layers import Rotary  # noqa: E402

VOCAB = 320
ATOL = 1e-4  # as tests/export/test_import.py: float rounding measured at ~3e-6
CLASSES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
}
# head dim 8, theta 500: wavelengths 6.3, 29.7, 140 and 664 positions. With an original context
# of 32, low 1 and high 4, llama3 keeps the first (< 32/4), blends the second and divides the
# two longest (> 32/1): every branch of the formula is used.
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
# name: (architecture, config keywords, the features the import must carry)
CASES: dict[str, tuple[str, dict[str, Any], set[str]]] = {
    "llama3-rope": ("llama", {"rope_parameters": LLAMA3}, {"rope"}),
    "linear-rope": (
        "llama",
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 500.0, "factor": 4.0}},
        {"rope"},
    ),
    "qwen2-biases": ("qwen2", {}, {"bias"}),
    "llama-attention-bias": ("llama", {"attention_bias": True}, {"bias"}),
    "qwen3": ("qwen3", {"head_dim": 12}, {"qk_norm"}),
    "qwen3-bias-llama3": (
        "qwen3",
        {"head_dim": 12, "attention_bias": True, "rope_parameters": LLAMA3},
        {"qk_norm", "bias", "rope"},
    ),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return H.prepare_data(tmp_path_factory.mktemp("import-arch-data"))


def make(folder: Path, data: Path | None, case: str, tied: bool = False) -> Path:
    """A randomly initialised checkpoint of `case` saved by transformers: norms (q/k norms too)
    away from 1 and biases away from 0, so each one shows in the logits."""
    arch, extra, _ = CASES[case]
    config_cls, model_cls = CLASSES[arch]
    kw: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 40,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "rms_norm_eps": 0.05,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500.0},
        "tie_word_embeddings": tied,
        "initializer_range": 0.3,
    }
    torch.manual_seed(0)
    model = model_cls(config_cls(**(kw | extra))).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    if data is not None:
        shutil.copy(data / "tokenizer" / "tokenizer.json", folder / "tokenizer.json")
        (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return folder


def hf_logits(folder: Path, ids: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(ids).logits


def our_logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def import_(folder: Path, out: Path, *extra: str) -> int:
    return main(["import", str(folder), "--out", str(out), *extra])


def _ids(n: int = 40, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, n), generator=torch.Generator().manual_seed(seed))


def _edit(folder: Path, **changes: Any) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (folder / "config.json").write_text(json.dumps(cfg))


def _without(model: Any, feature: str) -> None:
    """`model` (ours) with one imported feature taken out, in place."""
    with torch.no_grad():
        for block in model.blocks:
            attn = block.mixer
            if feature == "bias":
                for lin in (attn.qkv, attn.out):
                    if lin.bias is not None:
                        lin.bias.zero_()
            elif feature == "qk_norm":
                attn.qk_norm = False
            elif feature == "rope":
                cfg = model.config
                plain = Rotary(cfg.head_dim, cfg.context_length, cfg.rope_theta)
                attn.rotary.inv_freq, attn.rotary.cos, attn.rotary.sin = (
                    plain.inv_freq,
                    plain.cos,
                    plain.sin,
                )


# ----------------------------------------------------------------------------------------------
# logits equal, and the comparison sees each feature


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_imported_logits_equal_transformers(tmp_path, case, tied):
    folder = make(tmp_path / "hf", None, case, tied=tied)
    assert import_(folder, tmp_path / "run") == 0
    ids = _ids()
    theirs = hf_logits(folder, ids)
    assert theirs.abs().max() > 1.0
    model, _ = load_run_model(tmp_path / "run")
    torch.testing.assert_close(our_logits(model, ids), theirs, atol=ATOL, rtol=0)
    cfg = model.config
    arch, extra, features = CASES[case]
    assert cfg.tie_embeddings == tied
    assert cfg.attention_bias == (
        "qkv" if arch == "qwen2" else "qkvo" if extra.get("attention_bias") else "none"
    )
    assert cfg.qk_norm == (arch == "qwen3")
    assert cfg.head_dim == extra.get("head_dim", 8)
    assert cfg.attention_head_dim == extra.get("head_dim")
    rope = extra.get("rope_parameters")
    if rope is None:
        assert cfg.rope_scaling is None
    else:
        assert cfg.rope_scaling.type == rope["rope_type"]
        assert cfg.rope_scaling.factor == rope["factor"]
    for feature in features:  # each one changes the logits well beyond the tolerance
        model, _ = load_run_model(tmp_path / "run")
        _without(model, feature)
        assert (our_logits(model, ids) - theirs).abs().max() > 100 * ATOL, feature


@pytest.mark.parametrize("kind", ["llama3", "linear"])
def test_the_legacy_rope_scaling_layout(tmp_path, kind):
    """Configs of transformers 4 (and most files on the Hub): a top-level `rope_theta` and a
    `rope_scaling` object (`type` or `rope_type`); transformers 5 reads them as it reads
    rope_parameters, and so does the import."""
    case = "llama3-rope" if kind == "llama3" else "linear-rope"
    folder = make(tmp_path / "hf", None, case)
    params = json.loads((folder / "config.json").read_text())["rope_parameters"]
    theta = params.pop("rope_theta")
    legacy = {("type" if kind == "llama3" else "rope_type"): params.pop("rope_type"), **params}
    _edit(folder, rope_parameters=None, rope_theta=theta, rope_scaling=legacy)
    assert import_(folder, tmp_path / "run") == 0
    ids = _ids()
    model, _ = load_run_model(tmp_path / "run")
    assert model.config.rope_theta == theta
    torch.testing.assert_close(our_logits(model, ids), hf_logits(folder, ids), atol=ATOL, rtol=0)


def test_llama3_original_context_defaults_to_the_context(tmp_path):
    """Without original_max_position_embeddings transformers takes max_position_embeddings."""
    folder = make(tmp_path / "hf", None, "llama3-rope")
    params = json.loads((folder / "config.json").read_text())["rope_parameters"]
    del params["original_max_position_embeddings"]
    _edit(folder, rope_parameters=params)
    assert import_(folder, tmp_path / "run") == 0
    model, _ = load_run_model(tmp_path / "run")
    assert model.config.rope_scaling.original_context == 64
    ids = _ids()
    torch.testing.assert_close(our_logits(model, ids), hf_logits(folder, ids), atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------------------------
# refusals, by name, nothing written


REFUSALS = {
    "yarn": (
        "llama",
        {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
        "rope_type 'yarn'",
    ),
    "dynamic-legacy": ("llama", {"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "'dynamic'"),
    "longrope": (
        "llama",
        {"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}},
        "'longrope'",
    ),
    "llama3-incomplete": (
        "llama",
        {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}},
        "lacks low_freq_factor, high_freq_factor",
    ),
    "llama3-extra": (
        "llama",
        {"rope_parameters": {**LLAMA3, "partial_rotary_factor": 0.5}},
        "partial_rotary_factor",
    ),
    "mistral-attention-bias": ("mistral", {"attention_bias": True}, "attention_bias: true"),
    "model_type": ("llama", {"model_type": "gemma"}, "model_type 'gemma'"),
    "architecture": ("llama", {"architectures": ["Gemma2ForCausalLM"]}, "Gemma2ForCausalLM"),
    "mlp_bias": ("llama", {"mlp_bias": True}, "mlp_bias: true"),
    "odd-head-dim": ("qwen3", {"head_dim": 7}, "head_dim 7 is odd"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refusals_by_name(tmp_path, capsys, case):
    arch, changes, needle = REFUSALS[case]
    folder = make(tmp_path / "hf", None, "qwen3" if arch == "qwen3" else "qwen2-biases")
    base = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
    if arch in base:  # a Qwen2 folder renamed: the refusal comes before the weights are read
        _edit(folder, architectures=[base[arch]], model_type=arch)
    _edit(folder, **changes)
    out = tmp_path / "run"
    assert import_(folder, out) == 2
    err = capsys.readouterr().err
    assert err.startswith("taperlm import: error: "), err
    assert needle in err, err
    assert "Traceback" not in err
    assert not out.exists()


def test_the_options_are_transformer_only(capsys):
    """A non-transformer family refuses the attention options by name."""
    from taperlm.config import ModelConfig
    from taperlm.errors import ConfigError

    for option in (
        {"rope_scaling": RopeScaling()},
        {"attention_bias": "qkv"},
        {"qk_norm": True},
        {"attention_head_dim": 16},
    ):
        with pytest.raises(ConfigError, match=f"model.{next(iter(option))} is an option"):
            ModelConfig(family="gated", **option).resolve()
    with pytest.raises(ConfigError, match="high_freq_factor > low_freq_factor"):
        ModelConfig(rope_scaling=RopeScaling(low_freq_factor=4.0, high_freq_factor=4.0)).resolve()


# ----------------------------------------------------------------------------------------------
# train -> export -> transformers, and decoding with the KV cache


EXPORTED_AS = {
    "llama3-rope": "LlamaForCausalLM",
    "qwen2-biases": "Qwen2ForCausalLM",
    "llama-attention-bias": "LlamaForCausalLM",
    "qwen3-bias-llama3": "Qwen3ForCausalLM",
}


@pytest.mark.parametrize("case", list(EXPORTED_AS))
def test_train_export_and_load_in_transformers(tmp_path, data, capsys, case):
    """The imported run trains on (its biases and q/k norms learn), exports as the architecture
    that computes it, which transformers loads without our code to our trained logits, greedy
    decoding with transformers' KV cache and ours agree, `--format hf` loads with our code, and
    the export imports back to the very weights."""
    folder = make(tmp_path / "hf", data, case, tied=case == "qwen2-biases")
    run = tmp_path / "run"
    sets = [x for s in H.TINY_SETS if s.startswith("train.") for x in ("--set", s)]
    assert import_(folder, run, *sets) == 0
    start, _ = load_run_model(run)
    rc = main(["train", "--out", str(run), "--data", str(data), "--stop-after-steps", "2",
               "--no-progress"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    model, _ = load_run_model(run)
    moved = {k for k, v in model.state_dict().items() if not torch.equal(v, start.state_dict()[k])}
    learned = [k for k in moved if k.endswith(("qkv.bias", "out.bias", "q_norm.weight"))]
    assert learned or not (CASES[case][2] & {"bias", "qk_norm"}), sorted(moved)
    ids = _ids()
    ours = our_logits(model, ids)
    out = tmp_path / "llama"
    assert main(["export", str(run), "--format", "llama", "--out", str(out)]) == 0
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(theirs).__name__ == EXPORTED_AS[case]
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, ours, atol=ATOL, rtol=0)
    # decoding: transformers' KV cache and ours give the same greedy tokens
    from taperlm.models.generation import greedy_batch

    prompt = ids[0, :6].tolist()
    with torch.no_grad():
        hf_tokens = theirs.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0
        )[0, len(prompt) :].tolist()
    assert greedy_batch(model, [prompt], max_new_tokens=12)[0] == hf_tokens
    assert main(["export", str(run), "--out", str(tmp_path / "hf-ours")]) == 0
    exported, _, _ = load_any(tmp_path / "hf-ours")
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, ours, atol=ATOL, rtol=0)
    assert import_(out, tmp_path / "back") == 0
    back, _ = load_run_model(tmp_path / "back")
    assert back.config.rope_scaling == model.config.rope_scaling
    a, b = model.state_dict(), back.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_formats_without_the_options_refuse_them_by_name(tmp_path, data, capsys):
    """block-configs (a DeciLM block has no biases or q/k norms) and GGUF (llama.cpp computes
    q/k norms only in its qwen3 architecture) refuse an imported Qwen3, nothing written; a KV
    taper with biases is refused too."""
    from taperlm.config import ModelConfig
    from taperlm.errors import ConfigError

    folder = make(tmp_path / "hf", data, "qwen3-bias-llama3")
    run = tmp_path / "run"
    assert import_(folder, run) == 0
    capsys.readouterr()
    out = tmp_path / "m.gguf"
    assert main(["export", str(run), "--format", "gguf", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "model.qk_norm" in err and "Traceback" not in err, err
    assert not out.exists()
    from taperlm.hf.decilm import decilm_config

    with pytest.raises(ConfigError, match=r"without model\.attention_bias, model\.qk_norm, model"):
        decilm_config(load_run_model(run)[0].config)
    with pytest.raises(ConfigError, match=r"model\.attention_bias with a KV taper"):
        ModelConfig(attention_bias="qkv", n_kv_heads=4, kv_taper="cosine:1.0:0.5").resolve()

"""The one description of a Llama-family model's tensors (`taperlm.hf.llama_tensors`) against
what each format's reader and writer does with it, for models with every feature that adds or
removes a tensor (a tied or untied head, q/k/v and output biases, q/k norms, a layer without an
FFN, per-layer heads, llama3 RoPE): the Hugging Face and GGUF names correspond one to one with
the same element counts, and the model's own state dict is exactly what the conversions cover,
both ways."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from conftest import tiny_config
from eval_helpers import tiny_tokenizer
from taperlm.config import ModelConfig
from taperlm.config.model import RopeScaling
from taperlm.errors import ConfigError
from taperlm.hf import llama, llama_tensors
from taperlm.models import TaperedLM

# (id, model fields)
CONFIGS = {
    "tied": dict(tie_embeddings=True),
    "untied": dict(tie_embeddings=False),
    "qkv-bias-gqa": dict(attention_bias="qkv", n_kv_heads=2),
    "qkvo-bias-tied": dict(attention_bias="qkvo", tie_embeddings=True),
    "qk-norm-qkvo": dict(qk_norm=True, attention_bias="qkvo"),
    "zero-width": dict(taper="cosine:2:0"),  # the last layer attention only
    "per-layer-heads": dict(head_taper="linear:1.5:0.5", n_kv_heads=2, taper="cosine"),
    "llama3-rope": dict(rope_scaling=RopeScaling(factor=8.0, original_context=16)),
}


def _config(name: str, **fields: Any) -> ModelConfig:
    return tiny_config(preset="transformer-tiny", **{**CONFIGS[name], **fields})


def _model(cfg: ModelConfig) -> TaperedLM:
    torch.manual_seed(0)
    model = TaperedLM(cfg).eval()
    with torch.no_grad():  # biases and norm gains start at 0 or 1: values that show a mix-up
        for p in model.parameters():
            p.normal_()
    return model


@pytest.mark.parametrize("name", list(CONFIGS))
def test_hf_and_gguf_names_correspond_one_to_one(name: str) -> None:
    cfg = _config(name)
    hf, gguf = llama_tensors.names(cfg, "hf"), llama_tensors.names(cfg, "gguf")
    pairs = [(t.names.get("hf"), t.names.get("gguf"), t) for t in llama_tensors.tensors(cfg)]
    both = {h: g for h, g, _ in pairs if h and g}
    assert len(set(both.values())) == len(both)  # one to one
    assert all(np.prod(hf[h]) == np.prod(gguf[g]) for h, g in both.items())
    # what only one format holds: GGUF has no per-head q/k norms (llama.cpp's qwen3 has) and
    # no FFN in a width-0 layer (llama.cpp's deci); Hugging Face has no rope_freqs (its config
    # states the llama3 parameters)
    hf_only = {t.kind.role for h, g, t in pairs if h and not g}
    gguf_only = {t.kind.role for h, g, t in pairs if g and not h}
    zero_width = {"mlp_norm", "gate", "up", "down"} if 0 in cfg.mlp_widths else set()
    assert hf_only == ({"q_norm", "k_norm"} if cfg.qk_norm else set()) | zero_width
    assert gguf_only == ({"rope_freqs"} if name == "llama3-rope" else set())
    assert set(hf) == set(both) | {h for h, g, _ in pairs if h and not g}
    assert set(gguf) == set(both.values()) | {g for h, g, _ in pairs if g and not h}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_state_dict_is_exactly_what_the_hf_conversion_covers(name: str) -> None:
    cfg = _config(name)
    model = _model(cfg)
    state = model.state_dict()
    hf = llama.from_taperlm(model)
    assert {k: tuple(v.shape) for k, v in hf.items()} == llama_tensors.names(cfg, "hf")
    back = llama.to_taperlm(hf, cfg)
    assert set(back) == set(state)
    for key, value in state.items():
        torch.testing.assert_close(back[key], value, rtol=0, atol=0, msg=key)
    # every element of ours is in the file once (a tied head is the embedding)
    stored = sum(v.numel() for v in hf.values())
    tied = state["lm_head.weight"].numel() if cfg.tie_embeddings else 0
    assert stored == sum(v.numel() for v in state.values()) - tied


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return tiny_tokenizer()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_state_dict_is_exactly_what_the_gguf_conversion_covers(
    tmp_path: Path, tokenizer: Any, name: str
) -> None:
    pytest.importorskip("gguf")
    from taperlm.interop import gguf_export, gguf_import
    from taperlm.interop.gguf_file import read_header

    cfg = _config(name, vocab_size=tokenizer.vocab_size)
    try:
        gguf_export.check_supported(cfg)
    except ConfigError:
        pytest.skip("llama.cpp's llama/deci cannot carry this model (refused by name elsewhere)")
    model = _model(cfg)
    state = model.state_dict()
    arrays = gguf_export.gguf_tensors(model, "f32")
    # the file is a GGUF of the model whose width-0 layers are one-unit FFNs of zero weights
    # (llama.cpp drops the whole of an FFN-free layer: llama_tensors.GGUF_ZERO_WIDTH_UNITS)
    unit = llama_tensors.GGUF_ZERO_WIDTH_UNITS
    written = dataclasses.replace(cfg, mlp_widths=[w or unit for w in cfg.mlp_widths])
    assert list(arrays) == list(llama_tensors.names(written, "gguf"))  # names and file order
    assert {k: v.shape for k, v in arrays.items()} == llama_tensors.names(written, "gguf")
    path = gguf_export.write_gguf(model, tokenizer, tmp_path / "m.gguf", dtype="f32")
    # read with the model's own config: the import refuses per-layer heads and rope_freqs (by
    # name, before reading tensors), not what it would read of them
    header = read_header(path)
    zero = gguf_import.zero_ffn_layers(path, header)
    assert zero == [i for i, w in enumerate(cfg.mlp_widths) if w == 0]
    back = gguf_import.read_weights(path, gguf_import.as_ffn_free(header, zero), cfg)
    assert set(back) == set(state)
    for i, width in enumerate(cfg.mlp_widths):
        if width == 0:  # the file has no FFN there: the norm before it comes back as ones
            state[f"blocks.{i}.mlp_norm.weight"] = torch.ones(cfg.d_model)
    for key, value in state.items():
        torch.testing.assert_close(back[key], value, rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_files_tensors_are_checked_by_name_then_by_shape(name: str, fmt: str) -> None:
    """`problem`, which both importers refuse with: none for exactly the expected tensors; every
    way the names can differ (one missing, one unknown, both) is a name problem naming them;
    each tensor's wrong shape (a row more) a shape problem naming it; at most `shown` listed."""
    expected = llama_tensors.names(_config(name), fmt)
    assert llama_tensors.problem(expected, dict(expected)) is None
    first, last = sorted(expected)[0], sorted(expected)[-1]
    without = {k: v for k, v in expected.items() if k != first}
    assert llama_tensors.problem(expected, without) == ("names", f"missing [{first!r}]")
    extra = dict(expected) | {"extra.weight": (1,)}
    assert llama_tensors.problem(expected, extra) == ("names", "unknown ['extra.weight']")
    kind, says = llama_tensors.problem(expected, without | {"extra.weight": (1,)})
    assert kind == "names" and says == f"missing [{first!r}]; unknown ['extra.weight']"
    for key, shape in expected.items():
        wrong = dict(expected) | {key: (shape[0] + 1, *shape[1:])}
        assert llama_tensors.problem(expected, wrong) == (
            "shapes", f"{key}: {wrong[key]} vs {shape}"
        )  # fmt: skip
    all_wrong = {k: (v[0] + 1, *v[1:]) for k, v in expected.items()}
    kind, says = llama_tensors.problem(expected, all_wrong, shown=2)
    assert kind == "shapes" and says.count(" vs ") == 2
    assert llama_tensors.problem(expected, {last: expected[last]}, shown=1)[1].count("'") == 2

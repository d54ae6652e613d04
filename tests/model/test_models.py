"""Model construction: exact budgets, per-layer shapes, causality, gradients, caching."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import tiny_config
from taperlm.config import ModelConfig
from taperlm.config.budget import flops_per_token, layer_budgets, total_params
from taperlm.models import TaperedLM

TAPERS = [
    "uniform",
    "cosine",
    "cosine:0.5:1.5",
    "linear:1.625:0.375",
    "sigmoid:1.5:0.5:10",
    "groups:1.5,1.0,0.5",
    "groups:1.0,1.5,0.5",
    "bell:0.8",
    "hourglass:0.8",
]


def tiny(family: str = "transformer", taper: str = "cosine", **kw) -> ModelConfig:
    if family != "gated":
        kw.pop("gate", None)  # an option of the gated family only
    return tiny_config(family, taper, **{"vocab_size": 97, "n_layers": 6, "mlp_width": 96, **kw})


@pytest.mark.parametrize("family", ["transformer", "gated"])
@pytest.mark.parametrize("taper", TAPERS)
def test_numel_equals_formula_and_baseline(family, taper):
    cfg = tiny(family, taper)
    model = TaperedLM(cfg)
    assert model.num_params() == total_params(cfg)
    assert total_params(cfg) == total_params(cfg.baseline())
    assert flops_per_token(cfg) == flops_per_token(cfg.baseline())
    for block, b in zip(model.blocks, layer_budgets(cfg)):
        assert sum(p.numel() for p in block.parameters()) == b.params


@settings(max_examples=25, deadline=None)
@given(
    family=st.sampled_from(["transformer", "gated"]),
    taper=st.sampled_from(TAPERS),
    n_layers=st.integers(3, 9),
    tie=st.booleans(),
    gqa=st.booleans(),
    gate=st.sampled_from(["elementwise", "headwise"]),
)
def test_budget_equality_property(family, taper, n_layers, tie, gqa, gate):
    cfg = tiny(
        family,
        taper,
        n_layers=n_layers,
        tie_embeddings=tie,
        n_kv_heads=2 if gqa else None,
        gate=gate,
    )
    base = cfg.baseline()
    assert total_params(cfg) == total_params(base)
    assert flops_per_token(cfg) == flops_per_token(base)
    assert TaperedLM(cfg).num_params() == total_params(cfg)


def test_widths_differ_and_shapes_follow_them():
    cfg = tiny("transformer", "cosine")
    assert len(set(cfg.mlp_widths)) > 1
    model = TaperedLM(cfg)
    for block, width in zip(model.blocks, cfg.mlp_widths):
        assert block.mlp.w_in.weight.shape == (2 * width, cfg.d_model)
        assert block.mlp.w_out.weight.shape == (cfg.d_model, width)


@pytest.mark.parametrize("family", ["transformer", "gated"])
@pytest.mark.parametrize("gate", ["elementwise", "headwise"])
def test_causality(family, gate):
    torch.manual_seed(0)
    cfg = tiny(family, "cosine", gate=gate, n_kv_heads=2)
    model = TaperedLM(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 20))
    with torch.no_grad():
        ref = model(idx).logits
        for t in (0, 7, 18):
            pert = idx.clone()
            pert[:, t + 1] = (pert[:, t + 1] + 1) % cfg.vocab_size
            out = model(pert).logits
            assert torch.equal(out[:, : t + 1], ref[:, : t + 1])
            assert not torch.allclose(out[:, t + 1 :], ref[:, t + 1 :])


@pytest.mark.parametrize("family", ["transformer", "gated"])
def test_every_parameter_gets_a_gradient(family):
    cfg = tiny(family, "cosine", tie_embeddings=False)
    model = TaperedLM(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    model(idx, targets=idx).loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, name


def test_gate_is_query_dependent_sigmoid_on_sdpa_output():
    """G1 gating: output equals out(SDPA(...) * sigmoid(u W_g)) computed by hand."""
    torch.manual_seed(0)
    cfg = tiny("gated", "uniform", gate="elementwise")
    attn = TaperedLM(cfg).blocks[0].mixer
    u = torch.randn(1, 5, cfg.d_model)
    H, hd = cfg.n_heads, cfg.head_dim
    w = attn.qkv.weight
    q, k, v, g = (u @ w.T).split([H * hd, H * hd, H * hd, H * hd], dim=-1)
    shape = lambda t: t.view(1, 5, H, hd).transpose(1, 2)  # noqa: E731
    q, k = attn.rotary(shape(q)), attn.rotary(shape(k))
    y = torch.nn.functional.scaled_dot_product_attention(q, k, shape(v), is_causal=True)
    y = y.transpose(1, 2) * torch.sigmoid(g.view(1, 5, H, hd))
    expected = attn.out(y.reshape(1, 5, H * hd))
    assert torch.allclose(attn(u), expected, atol=1e-6)


@pytest.mark.parametrize("family", ["transformer", "gated"])
def test_kv_cache_equals_full_forward(family):
    torch.manual_seed(0)
    cfg = tiny(family, "cosine", n_kv_heads=2)
    model = TaperedLM(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 12))
    with torch.no_grad():
        full = model(idx).logits
        cache = model.new_cache()
        parts = [model(idx[:, :5], cache=cache).logits]
        parts += [model(idx[:, t : t + 1], cache=cache).logits for t in range(5, 12)]
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-5)


def test_depth_scaled_init():
    cfg = tiny("transformer", "uniform", n_layers=8, d_model=64, mlp_width=192)
    torch.manual_seed(0)
    model = TaperedLM(cfg)
    std_out = model.blocks[0].mlp.w_out.weight.std().item()
    std_in = model.blocks[0].mlp.w_in.weight.std().item()
    assert std_in == pytest.approx(0.02, rel=0.1)
    assert std_out == pytest.approx(0.02 / 4, rel=0.1)  # 0.02 / sqrt(2 * 8)


def test_tied_embeddings_share_storage():
    model = TaperedLM(tiny(tie_embeddings=True))
    assert model.lm_head.weight is model.embed.weight

"""Hope-attention: CMS chain, exact level-width budgets, k = 1 equals Transformer++, periods."""

from __future__ import annotations

import pytest
import torch

from conftest import raises_naming, tiny_config
from taperlm.config import ModelConfig, budget
from taperlm.config.presets import get_preset, preset_names
from taperlm.errors import ConfigError
from taperlm.families.hope import split_width
from taperlm.models import TaperedLM
from taperlm.models.hope import (
    ContinuumMemory,
    is_due,
    periodic_parameters,
)
from taperlm.spec.taper import TaperSpec


def hope_cfg(taper: str = "uniform", **hope) -> ModelConfig:
    return tiny_config("hope", taper, vocab_size=53, mlp_width=96, **hope)


def test_one_level_period_one_is_exactly_transformer() -> None:
    torch.manual_seed(0)
    hope = hope_cfg("cosine:1.5:0.5", levels=1, level_fractions=[1.0], update_periods=[1])
    tr = hope.as_family("transformer")
    m_h, m_t = TaperedLM(hope), TaperedLM(tr)
    assert m_h.num_params() == m_t.num_params() == budget.total_params(hope)
    assert budget.total_params(hope) == budget.total_params(tr)
    assert budget.flops_per_token(hope) == budget.flops_per_token(tr)
    ph, pt = list(m_h.parameters()), list(m_t.parameters())
    assert [p.shape for p in ph] == [p.shape for p in pt]
    with torch.no_grad():
        for a, b in zip(ph, pt):
            a.copy_(b)
    idx = torch.randint(0, 53, (2, 17))
    assert torch.equal(m_h(idx).logits, m_t(idx).logits)


def test_cms_returns_the_chain_update() -> None:
    torch.manual_seed(1)
    cms = ContinuumMemory(16, [16, 32, 16], [1, 2, 4], 1e-6)
    u = torch.randn(2, 5, 16)
    z = u + cms.levels[0](u)
    for norm, level in zip(cms.norms, cms.levels[1:]):
        z = z + level(norm(z))
    torch.testing.assert_close(cms(u), z - u)


@pytest.mark.parametrize(
    "taper", ["uniform", "cosine:1.5:0.5", "linear:1.25:0.75", "groups:1.5,1,0.5"]
)
def test_level_widths_exact_and_budget_equal(taper: str) -> None:
    cfg = hope_cfg(taper)
    assert cfg.hope.level_widths is not None
    for row, w in zip(cfg.hope.level_widths, cfg.mlp_widths):
        assert sum(row) == w
        assert all(x % cfg.taper.multiple_of == 0 for x in row)
    assert budget.total_params(cfg) == TaperedLM(cfg).num_params()
    base = cfg.baseline()
    assert budget.total_params(base) == budget.total_params(cfg)
    assert budget.flops_per_token(base) == budget.flops_per_token(cfg)
    # per-layer level components are in the plan's components
    comps = budget.layer_budget(cfg, 0).components
    assert (
        sum(v for k, v in comps.items() if k.startswith("mlp.mlp_level"))
        == 3 * 32 * cfg.mlp_widths[0]
    )


def test_split_width_properties() -> None:
    assert split_width(352, [0.5, 0.25, 0.25], 16) == [176, 96, 80]
    assert split_width(100, [0.5, 0.5], 16) == [52, 48]  # remainder 4 goes to level 0
    assert split_width(5, [0.5, 0.25, 0.25], 16) == [3, 1, 1]  # too few units: steps of 1
    for w in range(3, 400, 7):
        parts = split_width(w, [0.6, 0.3, 0.1], 16)
        assert sum(parts) == w and min(parts) >= 1


def test_update_period_attribute_is_set() -> None:
    cfg = hope_cfg(update_periods=[1, 4, 16])
    model = TaperedLM(cfg)
    block = model.blocks[0]
    assert all(p.update_period == 1 for p in block.mlp.levels[0].parameters())
    assert block.mlp_norm.weight.update_period == 1
    assert all(p.update_period == 4 for p in block.mlp.levels[1].parameters())
    assert block.mlp.norms[0].weight.update_period == 4
    assert all(p.update_period == 16 for p in block.mlp.levels[2].parameters())
    groups = periodic_parameters(model)
    assert set(groups) == {1, 4, 16}
    p16 = groups[16][0]
    assert [is_due(p16, s) for s in range(16)] == [False] * 15 + [True]


def test_causal() -> None:
    torch.manual_seed(2)
    model = TaperedLM(hope_cfg("cosine")).eval()
    idx = torch.randint(0, 53, (1, 20))
    with torch.no_grad():
        base = model(idx).logits
        alt = idx.clone()
        alt[:, 11] = (alt[:, 11] + 1) % 53
        out = model(alt).logits
    torch.testing.assert_close(out[:, :11], base[:, :11], rtol=0, atol=1e-6)


def test_kv_cache_decoding_matches_full_forward() -> None:
    torch.manual_seed(3)
    model = TaperedLM(hope_cfg()).eval()
    idx = torch.randint(0, 53, (1, 12))
    with torch.no_grad():
        full = model(idx).logits
        cache = model.new_cache()
        parts = [model(idx[:, :7], cache=cache).logits]
        for t in range(7, 12):
            parts.append(model(idx[:, t : t + 1], cache=cache).logits)
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-5, atol=1e-5)


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match="level_fractions"):
        hope_cfg(levels=2, level_fractions=[0.5, 0.25, 0.25], update_periods=[1, 2])
    with raises_naming(ConfigError, "model.hope.level_fractions", "sum to 1", "[0.5, 0.4]"):
        hope_cfg(levels=2, level_fractions=[0.5, 0.4], update_periods=[1, 2])
    with pytest.raises(ConfigError, match="update_periods"):
        hope_cfg(levels=2, level_fractions=[0.5, 0.5], update_periods=[1, 0])


def test_presets() -> None:
    names = preset_names()
    for size in ("nano", "micro", "tiny", "small", "440m", "760m", "1.3b"):
        assert f"hope-{size}" in names
    cfg = get_preset("hope-tiny")
    assert budget.total_params(cfg) == TaperedLM(cfg).num_params()
    big = get_preset("hope-1.3b", taper=TaperSpec.parse("cosine:1.5:0.5"))
    assert budget.total_params(big) == budget.total_params(big.baseline())
    tr = get_preset("transformer-1.3b")
    # Hope adds (levels - 1) norms per layer on top of the transformer of the same shape.
    assert budget.total_params(big) - budget.total_params(tr) == 2 * tr.d_model * tr.n_layers


def test_export_load_round_trip(tmp_path) -> None:
    """Hugging Face export reloads to identical logits, level widths and update periods."""
    pytest.importorskip("transformers")
    export = pytest.importorskip("taperlm.hf.export")
    from transformers import AutoModelForCausalLM

    torch.manual_seed(4)
    model = TaperedLM(hope_cfg("cosine")).eval()
    export.export_model(model, tmp_path)
    back = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True).eval()
    assert back.model.config.hope.level_widths == model.config.hope.level_widths
    # transformers' loader replaces Parameter objects; from_pretrained re-tags them.
    assert back.model.blocks[0].mlp.levels[2].w_in.weight.update_period == 16
    assert back.model.blocks[0].mlp_norm.weight.update_period == 1
    idx = torch.randint(0, 53, (1, 15))
    with torch.no_grad():
        assert torch.equal(back(idx).logits, model(idx).logits)

"""model.init: `fixed` (one std for every matrix, residual outputs / sqrt(2L)) and `fan_in` (each
matrix's std follows its own fan-in), checked by measuring the initialised models: per-matrix
stds, the per-layer MLP output variance of a tapered model, meta-device and paired init."""

from __future__ import annotations

import math

import pytest
import torch

from taperlm.config import ModelConfig
from taperlm.config.presets import get_preset
from taperlm.errors import ConfigError
from taperlm.models import TaperedLM
from taperlm.models.layers import SwiGLU
from taperlm.spec.taper import TaperSpec
from taperlm.training.model import build_on_meta, materialize

STEEP = "cosine:1.9:0.1"  # widths from ~1.9x to ~0.1x the baseline: a 10x+ spread


def _model(init: str, taper: str = STEEP, preset: str = "transformer-small") -> TaperedLM:
    cfg = get_preset(preset, TaperSpec.parse(taper))
    cfg.init = init
    torch.manual_seed(0)
    return TaperedLM(cfg.resolve())


def _mlp_output_variances(model: TaperedLM) -> tuple[list[int], list[float]]:
    """(width, output variance) of every layer's MLP on the same unit-variance input."""
    d = model.config.d_model
    x = torch.randn(4096, d, generator=torch.Generator().manual_seed(1))
    widths, variances = [], []
    with torch.no_grad():
        for block in model.blocks:
            mlp = block.mlp
            assert isinstance(mlp, SwiGLU)
            widths.append(mlp.width)
            variances.append(mlp(x).var().item())
    return widths, variances


def test_fan_in_mlp_output_variance_does_not_depend_on_width():
    widths, var = _mlp_output_variances(_model("fan_in"))
    assert max(widths) / min(widths) > 8  # the taper really spreads the widths
    assert max(var) / min(var) < 1.3, (widths, var)


def test_fixed_mlp_output_variance_grows_with_width():
    """Today's init: output variance ∝ width (log-log slope ≈ 1)."""
    widths, var = _mlp_output_variances(_model("fixed"))
    lw, lv = torch.tensor(widths).log(), torch.tensor(var).log()
    slope = ((lw - lw.mean()) * (lv - lv.mean())).sum() / ((lw - lw.mean()) ** 2).sum()
    assert slope.item() == pytest.approx(1.0, abs=0.15)


@pytest.mark.parametrize("init", ["fixed", "fan_in"])
def test_every_matrix_has_its_schemes_std(init):
    """Measured std of every weight matrix against the rule (embeddings: init_std in both)."""
    model = _model(init)
    cfg = model.config
    residual = cfg.init_std / math.sqrt(2 * cfg.n_layers)
    checked = 0
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            want = residual if getattr(m, "residual_out", False) else cfg.init_std
            if init == "fan_in":
                want *= math.sqrt(cfg.d_model / m.in_features)
            assert m.weight.std().item() == pytest.approx(want, rel=0.08), name
            checked += 1
        elif isinstance(m, torch.nn.Embedding):
            assert m.weight.std().item() == pytest.approx(cfg.init_std, rel=0.05)
    assert checked > 3 * cfg.n_layers


def test_schemes_share_shapes_and_budget():
    a, b = _model("fixed"), _model("fan_in")
    assert [p.shape for p in a.parameters()] == [p.shape for p in b.parameters()]
    # matrices that read the residual stream draw the same numbers with the same std
    assert torch.equal(a.blocks[0].mlp.w_in.weight, b.blocks[0].mlp.w_in.weight)
    assert not torch.equal(a.blocks[0].mlp.w_out.weight, b.blocks[0].mlp.w_out.weight)


@pytest.mark.parametrize("preset", ["transformer-tiny", "hope-tiny", "titans-mac-tiny"])
def test_fan_in_meta_init_is_bitwise_the_cpu_build(preset):
    """A model built on meta (FSDP2's path) and materialised equals the whole CPU build."""
    cfg = get_preset(preset, TaperSpec.parse("cosine:1.5:0.5"))
    cfg.init = "fan_in"
    torch.manual_seed(5)
    ref = TaperedLM(cfg)
    torch.manual_seed(5)
    model = materialize(build_on_meta(cfg), torch.device("cpu"))
    b = dict(model.named_parameters())
    for k, v in ref.named_parameters():
        assert torch.equal(v, b[k]), k


def test_fan_in_paired_init_scales_the_shared_draws():
    """train.paired_init under fan_in: a narrower layer's down-projection holds the leading
    columns of the wider one's, rescaled by sqrt(wide / narrow) (same normals, its own std)."""

    def paired(taper: str) -> torch.nn.Module:
        cfg = get_preset("transformer-tiny", TaperSpec.parse(taper))
        cfg.init = "fan_in"
        torch.manual_seed(3)
        return materialize(build_on_meta(cfg), torch.device("cpu"), paired_seed=3)

    u, t = paired("uniform"), paired("cosine:1.5:0.5")
    for a, b in zip(u.blocks, t.blocks):
        wa, wb = a.mlp.width, b.mlp.width
        w = min(wa, wb)
        scale = math.sqrt(wa / wb)
        torch.testing.assert_close(b.mlp.w_out.weight[:, :w], a.mlp.w_out.weight[:, :w] * scale)
        assert torch.equal(a.mlp.w_in.weight[:w], b.mlp.w_in.weight[:w])


def test_unknown_init_is_a_config_error():
    cfg = ModelConfig(init="xavier")
    with pytest.raises(ConfigError, match=r"model\.init"):
        cfg.validate()

"""Head taper (`model.head_taper`): per-layer query heads at the model's head dim, KV heads at a
fixed group size; exact parameter (numel) and FLOP (formula) budgets in every family with
attention, causality, KV cache, generation, Hugging Face export, novelty, plan and the config."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from conftest import assert_naming, raises_naming, tiny_config
from taperlm import families
from taperlm.cli import main
from taperlm.config import (
    ModelConfig,
    RunConfig,
    apply_overrides,
    budget,
    run_config_from_dict,
    to_dict,
)
from taperlm.errors import ConfigError
from taperlm.models import TaperedLM

# options of each family's tiny test model, and every attention family / variant
OPTIONS = {
    "transformer": {},
    "gated": {"gate": "elementwise"},
    "hope": {"levels": 2, "level_fractions": [0.5, 0.5], "update_periods": [1, 2]},
    "titans": {
        "variant": "mag", "window": 8, "segment_len": 16, "chunk_size": 8,
        "memory_heads": 2, "memory_head_dim": 8, "persistent_tokens": 2,
    },
}  # fmt: skip
FAMILIES = [
    ("transformer", {}),
    ("gated", {"gate": "elementwise"}),
    ("gated", {"gate": "headwise"}),
    ("hope", {}),
    ("titans", {"variant": "mac"}),
    ("titans", {"variant": "mag"}),
    ("titans", {"variant": "mal"}),
]
IDS = [f"{f}-{next(iter(o.values()), '')}".rstrip("-") for f, o in FAMILIES]
HEAD_TAPERS = ["cosine", "cosine:1.25:0.75", "linear:0.5:1.5", "groups:1.5,1.0,0.5", "custom:2,6,4"]


def headed(
    family: str = "transformer",
    head_taper: str = "cosine",
    taper: str = "cosine",
    n_layers: int = 6,
    resolve: bool = True,
    **kw,
) -> ModelConfig:
    """A small model (4 query heads of dim 8 in the baseline) with tapered heads; keyword
    arguments set model fields (n_kv_heads=2) or the family's options (variant="mac")."""
    return tiny_config(
        family,
        taper,
        n_layers=n_layers,
        head_taper=head_taper,
        resolve=resolve,
        **{**OPTIONS[family], **kw},
    )


def attention_formula(d: int, hd: int, heads: int, kv: int) -> int:
    """Q, K, V and output projections written out independently of the library's formula."""
    return d * heads * hd + 2 * d * kv * hd + heads * hd * d


# ----------------------------------------------------------------------------------------------
# sizes and budgets


def test_gqa_rule_kv_heads_follow_query_heads():
    mha = headed(head_taper="cosine")
    assert mha.layer_heads == [6, 6, 5, 3, 2, 2] and sum(mha.layer_heads) == 6 * 4
    assert [mha.attention_heads(i) for i in range(6)] == [(h, h) for h in mha.layer_heads]
    gqa = headed(head_taper="cosine", n_kv_heads=2)  # group size 2: whole KV groups only
    assert gqa.layer_heads == [6, 6, 4, 4, 2, 2]
    assert [gqa.attention_heads(i)[1] for i in range(6)] == [3, 3, 2, 2, 1, 1]
    uniform = headed(head_taper="uniform")
    assert uniform.layer_heads is None and uniform.attention_heads(3) == (4, 4)
    assert headed(head_taper="cosine:1.25:0.75").layer_heads == [5, 5, 4, 4, 3, 3]


@pytest.mark.parametrize(("family", "options"), FAMILIES, ids=IDS)
@pytest.mark.parametrize("gqa", [False, True])
def test_exact_budget_in_every_attention_family(family, options, gqa):
    cfg = headed(family, n_kv_heads=2 if gqa else None, **options)
    base = cfg.baseline()
    assert base.layer_heads is None and base.head_taper.as_text() == "uniform"
    model = TaperedLM(cfg)
    # parameters: numel of the built model == the formula == the uniform model's
    assert model.num_params() == budget.total_params(cfg) == budget.total_params(base)
    assert TaperedLM(base).num_params() == budget.total_params(base)
    d, hd = cfg.d_model, cfg.head_dim
    for layer, (block, b) in enumerate(zip(model.blocks, budget.layer_budgets(cfg))):
        assert sum(p.numel() for p in block.parameters()) == b.params, layer
        heads, kv = cfg.attention_heads(layer)
        attn = block.mixer.attn if family == "titans" else block.mixer
        built = (attn.H, attn.Hkv) if family == "titans" else (attn.n_heads, attn.n_kv_heads)
        assert built == (heads, kv), layer
        qkv_out = sum(p.numel() for n, p in attn.named_parameters() if "persistent" not in n)
        gate = {"elementwise": d * heads * hd, "headwise": d * heads}.get(options.get("gate"), 0)
        assert qkv_out == attention_formula(d, hd, heads, kv) + gate, layer
    # FLOPs per token at every context (attention work is linear in each layer's heads)
    for T in (1, 7, 16, 64, 1000):
        assert budget.flops_per_token(cfg, T) == budget.flops_per_token(base, T), T


def test_attention_flops_by_formula():
    """A_l(T) = 4 H_l d_h T per layer, so sum_l A_l = 4 (L H) d_h T for any head taper."""
    cfg = headed(head_taper="custom:2,6,4,4,5,3", taper="uniform")
    hd = cfg.head_dim
    for T in (1, 33, 256):
        per_layer = [budget.layer_budget(cfg, i, T) for i in range(6)]
        base = [budget.layer_budget(cfg.baseline(), i, T) for i in range(6)]
        for i, (b, u) in enumerate(zip(per_layer, base)):
            h = cfg.layer_heads[i]
            extra = 6 * (attention_formula(cfg.d_model, hd, h, h) - attention_formula(32, hd, 4, 4))
            assert b.flops_per_token - u.flops_per_token == extra + 3 * 4 * (h - 4) * hd * T
        assert sum(b.flops_per_token for b in per_layer) == sum(u.flops_per_token for u in base)


@pytest.mark.parametrize("spec", HEAD_TAPERS)
def test_every_schedule_resolves_exactly(spec):
    n_layers = 3 if spec.startswith("custom") else 6
    cfg = headed(head_taper=spec, n_layers=n_layers)
    assert sum(cfg.layer_heads) == n_layers * cfg.n_heads
    assert budget.total_params(cfg) == budget.total_params(cfg.baseline())


# ----------------------------------------------------------------------------------------------
# model behaviour


@pytest.mark.parametrize(("family", "options"), FAMILIES, ids=IDS)
def test_causality_and_gradients_with_tapered_heads(family, options):
    torch.manual_seed(0)
    cfg = headed(family, n_layers=4, n_kv_heads=2, **options)
    assert len(set(cfg.layer_heads)) > 1
    model = TaperedLM(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, 20))
    model(idx, targets=idx).loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    with torch.no_grad():
        ref = model(idx).logits
        for t in (0, 9, 18):
            pert = idx.clone()
            pert[:, t + 1] = (pert[:, t + 1] + 1) % cfg.vocab_size
            out = model(pert).logits
            assert torch.equal(out[:, : t + 1], ref[:, : t + 1]), t
            assert not torch.allclose(out[:, t + 1 :], ref[:, t + 1 :]), t


@pytest.mark.parametrize("family", ["transformer", "gated", "hope"])
@pytest.mark.parametrize("gqa", [False, True])
def test_kv_cache_incremental_equals_full(family, gqa):
    torch.manual_seed(0)
    cfg = headed(family, n_kv_heads=2 if gqa else None)
    model = TaperedLM(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 14))
    with torch.no_grad():
        full = model(idx).logits
        cache = model.new_cache()
        parts = [model(idx[:, :5], cache=cache).logits]
        parts += [model(idx[:, t : t + 1], cache=cache).logits for t in range(5, 10)]
        parts.append(model(idx[:, 10:], cache=cache).logits)  # a multi-token step after steps
    for layer, c in enumerate(cache):  # each layer's cache holds its own KV heads
        assert c.k.shape == (2, cfg.attention_heads(layer)[1], 14, cfg.head_dim)
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["transformer", "titans"])
def test_generation_with_tapered_heads(family):
    from taperlm.models.generation import SamplingConfig, generate_tokens

    torch.manual_seed(0)
    cfg = headed(family, n_kv_heads=2)
    model = TaperedLM(cfg).eval()
    prompt = [1, 5, 9, 3]
    greedy = SamplingConfig(max_new_tokens=12, temperature=0)
    cached = list(generate_tokens(model, prompt, greedy))
    plain = list(generate_tokens(model, prompt, dataclasses.replace(greedy, use_cache=False)))
    assert cached == plain and len(cached) == 12
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    assert cached == seq[len(prompt) :]


def test_export_round_trip_keeps_heads(tmp_path):
    transformers = pytest.importorskip("transformers")
    from taperlm.hf.export import export_model

    torch.manual_seed(0)
    cfg = headed("gated", head_taper="cosine", n_kv_heads=2, gate="headwise")
    model = TaperedLM(cfg).eval()
    out = export_model(model, tmp_path / "hf")
    saved = json.loads((out / "config.json").read_text())["taperlm"]
    assert saved["layer_heads"] == cfg.layer_heads and saved["head_taper"] == "cosine"
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    assert [b.mixer.n_heads for b in hf.model.blocks] == cfg.layer_heads
    assert [b.mixer.n_kv_heads for b in hf.model.blocks] == [h // 2 for h in cfg.layer_heads]
    x = torch.randint(0, cfg.vocab_size, (2, 13))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x).logits, atol=1e-5, rtol=0)


def test_novelty_of_a_head_tapered_model():
    from taperlm.analysis.novelty import measure

    torch.manual_seed(0)
    model = TaperedLM(headed(head_taper="cosine", context_length=32))
    result = measure(model, torch.randint(0, 64, (64,)), seq_len=16)
    assert result.n_layers == 6 and result.mlp_widths == model.config.mlp_widths
    assert all(-1 <= s.mean <= 1 for s in result.rho_mlp)


# ----------------------------------------------------------------------------------------------
# config and plan


def test_yaml_round_trip_and_resolved_heads_are_authoritative():
    cfg = headed(head_taper="cosine")
    d = to_dict(RunConfig(model=cfg))
    assert d["model"]["head_taper"] == "cosine" and d["model"]["layer_heads"] == cfg.layer_heads
    back = run_config_from_dict(d).resolve()
    assert to_dict(back) == d
    # hand-edited heads (a valid allocation) are kept, not re-solved from the head taper
    d["model"]["layer_heads"] = [4, 4, 4, 4, 4, 4]
    assert run_config_from_dict(d).resolve().model.layer_heads == [4] * 6
    # --set of the head taper (or of the baseline heads) clears the resolved heads
    apply_overrides(d, ["model.head_taper=cosine:1.25:0.75"])
    assert "layer_heads" not in d["model"]
    assert run_config_from_dict(d).resolve().model.layer_heads == [5, 5, 4, 4, 3, 3]
    d["model"]["layer_heads"] = [5, 5, 4, 4, 3, 3]
    apply_overrides(d, ["model.n_heads=8"])
    assert run_config_from_dict(d).resolve().model.layer_heads == [10, 10, 9, 7, 6, 6]


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        # the key, the numbers that break it, and the fix (re-resolve from the taper)
        (
            {"layer_heads": [4, 4, 4, 4, 4, 5]},
            ("model.layer_heads", "25", "n_layers x n_heads = 24", "model.head_taper"),
        ),
        ({"layer_heads": [4, 4, 4]}, ("model.layer_heads", "6", "= 1", "[4, 4, 4]")),
        (
            {"layer_heads": [5, 3, 4, 4, 4, 4], "n_kv_heads": 2},
            ("model.layer_heads", "= 2", "[5, 3, 4, 4, 4, 4]", "model.head_taper"),
        ),
        ({"layer_heads": [0, 8, 4, 4, 4, 4]}, ("model.layer_heads[0]", ">= 1", "got 0")),
        ({"head_taper": "cosinus"}, ("model.head_taper", "'cosinus'", "uniform, cosine")),
        ({"head_taper": "cosine:1.99:0.01"}, ("model.head_taper", "layer 5", "end multiplier")),
        ({"head_taper": "novelty:pilot"}, ("model.head_taper", "novelty", "cosine:1.25:0.75")),
        (
            {"head_taper": "custom:1,2"},
            ("model.head_taper", "'custom:1,2'", "2 widths", "6 layers"),
        ),
        ({"head_taper": 3}, ("model.head_taper", "string", "got 3")),
    ],
)
def test_bad_heads_are_named(changes, named):
    cfg = dataclasses.replace(
        headed(head_taper="uniform", taper="uniform", resolve=False), **changes
    )
    with raises_naming(ConfigError, *named):
        cfg.resolve()


def test_family_without_attention_rejects_a_head_taper():
    transformer = families.get_family("transformer")
    fam = dataclasses.replace(transformer, name="noattn", presets={}, attention=False)
    families.register(fam)
    try:
        ModelConfig(family="noattn", **_shape()).resolve()
        with raises_naming(ConfigError, "model.head_taper", "noattn", "head_taper: uniform"):
            ModelConfig(family="noattn", head_taper="cosine", **_shape()).resolve()
    finally:
        del families.FAMILIES["noattn"]


def _shape() -> dict:
    return dict(vocab_size=64, d_model=32, n_layers=6, n_heads=4, mlp_width=64, context_length=64)


def test_plan_shows_heads_and_checks_the_budget(capsys, monkeypatch, tmp_path):
    args = ["plan", "--preset", "transformer-tiny", "--taper", "cosine", "--head-taper", "cosine"]
    png = tmp_path / "plan.png"
    assert main([*args, "--set", "model.n_kv_heads=2", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "heads" in out and "6/3" in out and "2/1" in out
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "budget matched (checked)" in out
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["heads"] == [6, 6, 5, 3, 2, 2] and data["kv_heads"] == data["heads"]
    assert data["params_difference"] == 0 and data["flops_difference"] == 0
    assert data["budget_checked_at_contexts"] == [1, 256]
    # a non-linear attention formula (a bug) is caught by plan, not printed as a match
    from taperlm.families import base

    def squared(cfg, layer, span):
        return 4 * cfg.attention_heads(layer)[0] ** 2 * cfg.head_dim * span

    monkeypatch.setattr(base, "attention_span_flops", squared)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert_naming(err, "uniform baseline", "FLOPs/token at context 1")

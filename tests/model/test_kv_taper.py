"""KV taper (`model.kv_taper`): per-layer KV heads (each dividing its layer's query heads) whose
saved K/V parameters go to the MLP widths; exact budgets by numel in every family with
attention (alone and with the MLP and head tapers), FLOPs, causality, caches sized per layer
(equal to recomputation, and to plan's bytes), generation, Hugging Face export and cached
generate, compare's allocation syntax, plan and the config."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch

from conftest import raises_naming, tiny_config
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
from taperlm.config.kv_taper import kv_step, solve_kv_heads
from taperlm.errors import ConfigError, TaperError
from taperlm.models import TaperedLM
from taperlm.spec.taper import TaperSpec
from test_head_taper import FAMILIES, IDS, OPTIONS, attention_formula

# (MLP taper, head taper, KV taper): alone and combined
COMBINATIONS = [
    ("uniform", "uniform", "groups:0.5"),
    ("uniform", "uniform", "cosine:1.0:0.25"),
    ("cosine", "uniform", "linear:0.5:1.5"),
    ("cosine", "cosine:1.25:0.75", "cosine:1.0:0.25"),
    ("uniform", "cosine", "custom:6,3,1,1,1,2"),
]
COMBO_IDS = ["+".join(c) for c in COMBINATIONS]


def kv_model(
    family: str = "transformer",
    kv_taper: str = "cosine:1.0:0.25",
    head_taper: str = "uniform",
    taper: str = "uniform",
    n_layers: int = 6,
    resolve: bool = True,
    **kw,
) -> ModelConfig:
    """The test model of test_head_taper (6 layers, d 32, 4 heads of dim 8) with a KV taper."""
    return tiny_config(
        family,
        taper,
        n_layers=n_layers,
        kv_taper=kv_taper,
        head_taper=head_taper,
        resolve=resolve,
        **{**OPTIONS[family], **kw},
    )


# ----------------------------------------------------------------------------------------------
# the solver


def test_solver_picks_nearest_divisors_at_a_whole_number_of_width_steps():
    spec = TaperSpec.parse("custom:4,3,3,1,1,1", multiple_of=1)
    # d 32, head dim 8, multiple_of 16: 2*32*8 params per KV head, 3*32*16 per width step
    step = kv_step(32, 8, 16)
    assert step == 3
    got = solve_kv_heads(spec, [4] * 6, 1, step)
    # 3 is no divisor of 4: 4 and 2 are as near, ties keep more heads; 24 - 15 = 9 removed
    assert got.asked == [4, 3, 3, 1, 1, 1] and got.counts == [4, 4, 4, 1, 1, 1]
    assert got.notes == [
        f"layer {i}: 3 KV heads asked, 4 used (the nearest divisor of its 4 query heads)"
        for i in (1, 2)
    ]
    # nearest 4,2,2,1,1,1 removes 13 heads, no multiple of 3: the cheapest move is one 1 -> 2
    moved = solve_kv_heads(TaperSpec.parse("custom:4,2,2,1,1,1", 1), [4] * 6, 1, step)
    assert moved.counts == [4, 2, 2, 2, 1, 1] and (24 - sum(moved.counts)) % 3 == 0
    assert moved.notes == [
        "layer 3: 1 KV heads asked, 2 used (not the nearest divisor 1: the heads removed in "
        "total must be a multiple of 3 for the MLP widths to take up their parameters exactly)"
    ]
    assert solve_kv_heads(TaperSpec.parse("custom:4,2,2,1,1,1", 1), [4] * 6, 1, 1).notes == []
    # multipliers scale each layer's default KV heads (H_l / g), here of a head taper
    half = solve_kv_heads(TaperSpec.parse("groups:0.5", 1), [8, 8, 6, 6, 2, 2], 2, 1)
    assert half.asked == [2, 2, 1.5, 1.5, 0.5, 0.5] and half.counts == [2, 2, 2, 2, 1, 1]


@pytest.mark.parametrize(
    ("d", "hd", "m", "step"), [(32, 8, 16, 3), (96, 16, 16, 3), (96, 48, 16, 1), (64, 32, 128, 6)]
)
def test_kv_step_makes_the_saving_a_whole_number_of_width_steps(d, hd, m, step):
    assert kv_step(d, hd, m) == step
    for removed in range(1, 13):
        whole = (2 * d * hd * removed) % (3 * d * m) == 0
        assert whole == (removed % step == 0), removed


# ----------------------------------------------------------------------------------------------
# budgets


@pytest.mark.parametrize(("family", "options"), FAMILIES, ids=IDS)
@pytest.mark.parametrize(("taper", "head_taper", "kv_taper"), COMBINATIONS, ids=COMBO_IDS)
def test_exact_budget_by_numel_in_every_attention_family(
    family, options, taper, head_taper, kv_taper
):
    cfg = kv_model(family, kv_taper, head_taper, taper, **options)
    base = cfg.baseline()
    assert base.layer_kv_heads is None and base.kv_taper.as_text() == "uniform"
    q = [cfg.attention_heads(i)[0] for i in range(6)]
    assert all(h % kv == 0 for h, kv in zip(q, cfg.layer_kv_heads))
    assert cfg.layer_kv_heads != q  # the taper changed something
    model = TaperedLM(cfg)
    assert model.num_params() == budget.total_params(cfg) == budget.total_params(base)
    assert TaperedLM(base).num_params() == budget.total_params(base)
    d, hd = cfg.d_model, cfg.head_dim
    for layer, (block, b) in enumerate(zip(model.blocks, budget.layer_budgets(cfg))):
        assert sum(p.numel() for p in block.parameters()) == b.params, layer
        heads, kv = q[layer], cfg.layer_kv_heads[layer]
        attn = block.mixer.attn if family == "titans" else block.mixer
        built = (attn.H, attn.Hkv) if family == "titans" else (attn.n_heads, attn.n_kv_heads)
        assert built == (heads, kv), layer
        own = sum(p.numel() for n, p in attn.named_parameters() if "persistent" not in n)
        gate = {"elementwise": d * heads * hd, "headwise": d * heads}.get(options.get("gate"), 0)
        assert own == attention_formula(d, hd, heads, kv) + gate, layer
    # the MLP widths took up exactly the K/V parameters saved
    removed = sum(h // cfg.group_size for h in q) - sum(cfg.layer_kv_heads)
    assert 3 * d * (sum(cfg.mlp_widths) - 6 * cfg.mlp_width) == 2 * d * hd * removed
    assert all(w % 16 == 0 for w in cfg.mlp_widths)
    # FLOPs/token: equal at every context, except Titans MAC's second K/V projection
    for T in (1, 7, 64, 1000):
        diff = budget.flops_per_token(cfg, T) - budget.flops_per_token(base, T)
        mac = family == "titans" and options.get("variant") == "mac"
        assert diff == (-3 * 2 * d * 2 * hd * removed if mac else 0), T


def test_gqa_baseline_and_head_taper_combine():
    cfg = kv_model(head_taper="cosine", n_kv_heads=2, kv_taper="groups:0.5")
    assert cfg.layer_heads == [6, 6, 4, 4, 2, 2]
    # defaults 3,3,2,2,1,1 halved -> 1.5,1.5,1,1,.5,.5 -> divisors of 6,6,4,4,2,2
    assert all(h % k == 0 for h, k in zip(cfg.layer_heads, cfg.layer_kv_heads))
    assert budget.total_params(cfg) == budget.total_params(cfg.baseline())
    assert sum(cfg.layer_kv_heads) < 12


# ----------------------------------------------------------------------------------------------
# model behaviour


@pytest.mark.parametrize(("family", "options"), FAMILIES, ids=IDS)
def test_causality_and_gradients_with_tapered_kv_heads(family, options):
    torch.manual_seed(0)
    cfg = kv_model(family, "cosine:1.0:0.25", head_taper="cosine", n_layers=4, **options)
    assert len(set(cfg.layer_kv_heads)) > 1
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


def _cache_tensors(cache) -> list[list[torch.Tensor]]:
    """The key/value tensors each layer's decoding cache holds (attention or Titans)."""
    out = []
    for c in cache:
        attn = getattr(c, "attn", c)
        names = ("k", "v", "kh", "vh")
        out.append([t for t in (getattr(attn, n, None) for n in names) if t is not None])
    return out


@pytest.mark.parametrize(("family", "options"), FAMILIES, ids=IDS)
def test_cached_decoding_equals_recomputation_and_plan_bytes(family, options):
    """Every layer's cache holds its own KV heads; incremental logits equal the full forward;
    the bytes of the cache tensors equal `kv_cache_bytes` (what plan prints) at every length."""
    torch.manual_seed(0)
    cfg = kv_model(family, "custom:4,2,1,1,2,4", head_taper="uniform", **options)
    model = TaperedLM(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 40))
    with torch.no_grad():
        full = model(idx).logits
        cache = model.new_cache()
        parts = [model(idx[:, :13], cache=cache).logits]
        for t in range(13, 40):
            parts.append(model(idx[:, t : t + 1], cache=cache).logits)
            tensors = _cache_tensors(cache)
            for layer, held in enumerate(tensors):
                assert all(x.shape[1] == cfg.layer_kv_heads[layer] for x in held), layer
            allocated = [sum(x.numel() * x.element_size() for x in held) for held in tensors]
            assert allocated == [2 * b for b in budget.kv_cache_bytes(cfg, t + 1, 4)], t
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=0)


def test_bf16_cache_bytes_match_plan():
    torch.manual_seed(0)
    cfg = kv_model(kv_taper="custom:4,2,1,1,2,4")
    model = TaperedLM(cfg).to(torch.bfloat16).eval()
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, cfg.vocab_size, (1, 21)), cache=cache)
    allocated = [sum(x.numel() * x.element_size() for x in h) for h in _cache_tensors(cache)]
    assert allocated == budget.kv_cache_bytes(cfg, 21, 2)
    assert allocated == [2 * 8 * 21 * 2 * k for k in cfg.layer_kv_heads]


@pytest.mark.parametrize("family", ["transformer", "titans"])
def test_generation_with_tapered_kv_heads(family):
    from taperlm.models.generation import SamplingConfig, generate_tokens

    torch.manual_seed(0)
    cfg = kv_model(family, "cosine:1.0:0.25", head_taper="cosine")
    model = TaperedLM(cfg).eval()
    prompt = [1, 5, 9, 3]
    greedy = SamplingConfig(max_new_tokens=12, temperature=0)
    cached = list(generate_tokens(model, prompt, greedy))
    plain = list(generate_tokens(model, prompt, dataclasses.replace(greedy, use_cache=False)))
    assert cached == plain and len(cached) == 12


def test_export_round_trip_and_cached_generate(tmp_path):
    transformers = pytest.importorskip("transformers")
    from taperlm.hf.export import export_model
    from taperlm.models.generation import SamplingConfig, generate_tokens

    torch.manual_seed(0)
    cfg = kv_model("gated", "cosine:1.0:0.25", head_taper="cosine", taper="cosine")
    model = TaperedLM(cfg).eval()
    out = export_model(model, tmp_path / "hf")
    saved = json.loads((out / "config.json").read_text())["taperlm"]
    assert saved["layer_kv_heads"] == cfg.layer_kv_heads
    assert saved["kv_taper"] == "cosine:1.0:0.25" and saved["mlp_widths"] == cfg.mlp_widths
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    assert [b.mixer.n_kv_heads for b in hf.model.blocks] == cfg.layer_kv_heads
    x = torch.randint(0, cfg.vocab_size, (2, 13))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x).logits, atol=1e-5, rtol=0)
    prompt = [1, 5, 9, 3]
    ours = list(generate_tokens(model, prompt, SamplingConfig(max_new_tokens=10, temperature=0)))
    with torch.no_grad():
        theirs = hf.generate(
            torch.tensor([prompt]), max_new_tokens=10, do_sample=False, use_cache=True
        )
    assert theirs[0, len(prompt) :].tolist() == ours


def test_novelty_of_a_kv_tapered_model():
    from taperlm.analysis.novelty import measure

    torch.manual_seed(0)
    model = TaperedLM(kv_model(context_length=32))
    result = measure(model, torch.randint(0, 64, (64,)), seq_len=16)
    assert result.n_layers == 6 and result.mlp_widths == model.config.mlp_widths


# ----------------------------------------------------------------------------------------------
# config, compare and plan


def test_yaml_round_trip_and_resolved_kv_heads_are_authoritative():
    cfg = kv_model(kv_taper="cosine:1.0:0.25")
    d = to_dict(RunConfig(model=cfg))
    assert d["model"]["layer_kv_heads"] == cfg.layer_kv_heads
    back = run_config_from_dict(d).resolve()
    assert to_dict(back) == d
    # hand-written counts are kept (with widths that match them)
    d["model"]["layer_kv_heads"], d["model"]["mlp_widths"] = (
        [4, 4, 4, 1, 1, 1],
        [64, 64, 80, 80, 80, 64],
    )
    assert run_config_from_dict(d).resolve().model.layer_kv_heads == [4, 4, 4, 1, 1, 1]
    # --set of the KV taper (or of the heads) clears the resolved sizes
    apply_overrides(d, ["model.kv_taper=groups:0.5"])
    assert "layer_kv_heads" not in d["model"] and "mlp_widths" not in d["model"]
    assert run_config_from_dict(d).resolve().model.layer_kv_heads == [2] * 6


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        # the key, the numbers that break it, and the fix (re-resolve from the taper)
        (
            {"layer_kv_heads": [3, 4, 4, 4, 4, 4]},
            ("model.layer_kv_heads", "[4, 4, 4, 4, 4, 4]", "[3, 4, 4, 4, 4, 4]", "model.kv_taper"),
        ),
        ({"layer_kv_heads": [4, 4, 4]}, ("model.layer_kv_heads", "6", "[4, 4, 4]")),
        (
            {"layer_kv_heads": [4, 4, 4, 4, 4, 2]},
            ("model.layer_kv_heads", "2 KV heads", "multiple of 3", "multiple_of 16"),
        ),
        (
            {"layer_kv_heads": [4, 4, 4, 4, 1, 1], "mlp_widths": [64] * 6},
            ("model.mlp_widths", "384", "+ 32", "416", "delete mlp_widths"),
        ),
        ({"kv_taper": "cosinus"}, ("model.kv_taper", "'cosinus'", "uniform, cosine")),
        ({"kv_taper": "novelty:pilot"}, ("model.kv_taper", "novelty", "groups:0.5")),
        ({"kv_taper": "custom:1,2"}, ("model.kv_taper", "'custom:1,2'", "2 values", "6 layers")),
        # more KV heads than the default (GQA) take width from the MLP, here all of it
        (
            {"n_kv_heads": 1, "kv_taper": "groups:4", "mlp_width": 16},
            ("multiple_of=16", "-96", "'groups:4'"),
        ),
    ],
)
def test_bad_kv_heads_are_named(changes, named):
    cfg = dataclasses.replace(kv_model(kv_taper="uniform", resolve=False), **changes)
    with raises_naming((ConfigError, TaperError), *named):
        cfg.resolve()


def test_family_without_attention_rejects_a_kv_taper():
    transformer = families.get_family("transformer")
    fam = dataclasses.replace(transformer, name="noattn", presets={}, attention=False)
    families.register(fam)
    try:
        shape = dict(vocab_size=64, d_model=32, n_layers=6, n_heads=4, mlp_width=64)
        with raises_naming(ConfigError, "model.kv_taper", "noattn", "kv_taper: uniform"):
            ModelConfig(family="noattn", kv_taper="groups:0.5", **shape).resolve()
    finally:
        del families.FAMILIES["noattn"]


def test_compare_allocations_with_kv_tapers():
    from taperlm.compare.grid import build_grid, parse_allocations, split_taper_list

    texts = split_taper_list("uniform,kv:custom:4,2,1,1,2,2,cosine+heads:cosine+kv:cosine:1.0:0.25")
    assert texts == ["uniform", "kv:custom:4,2,1,1,2,2", "cosine+heads:cosine+kv:cosine:1.0:0.25"]
    allocs = parse_allocations(texts)
    kv_texts = [a.kv_taper.to_string() for a in allocs]  # parsed once: specs, canonical
    assert kv_texts == ["uniform", "custom:4,2,1,1,2,2", "cosine:1.0:0.25"]
    assert allocs[2].head_taper.to_string() == "cosine:1.5:0.5"
    assert allocs[2].spec.schedule == "cosine"
    assert allocs[2].spec_string == "cosine:1.5:0.5+heads:cosine:1.5:0.5+kv:cosine:1.0:0.25"
    assert not allocs[1].is_uniform and allocs[1].spec.is_uniform
    base = RunConfig(model=kv_model(kv_taper="uniform"))
    grid = build_grid(base, allocs, [0, 1])
    kv = {a.name: grid.budget[a.name].kv_heads for a in allocs}
    assert kv["kv-custom-4-2-1-1-2-2"] == [4, 2, 1, 1, 2, 2] and kv["uniform"] == [4] * 6
    params = {grid.budget[a.name].params for a in allocs}
    assert len(params) == 1
    bytes_ = grid.budget["kv-custom-4-2-1-1-2-2"].kv_cache_bytes_per_token_bf16
    assert bytes_ == 2 * 8 * 2 * 12 and grid.budget["uniform"].kv_cache_bytes_per_token_bf16 == 768
    for bad, named in (
        ("cosine+kv:groups:0.5+kv:groups:0.5", ("+kv:",)),
        ("kv:groups:0.5+heads:cosine", ("+heads:", "+kv:")),
        ("kv:novelty:pilot", ("novelty", "MLP", "KV heads")),
    ):
        with raises_naming(TaperError, "--tapers", repr(bad), *named):
            parse_allocations([bad])


def test_plan_shows_kv_heads_and_cache_bytes(capsys):
    args = ["plan", "--preset", "transformer-tiny", "--taper", "cosine", "--head-taper",
            "cosine:1.25:0.75", "--kv-taper", "cosine:1.0:0.25", "--seq-len", "1024"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "KV taper: cosine 1 -> 0.25" in out and "KV heads asked" in out
    assert "KV cache bf16 @1024 (B)" in out and "KV cache fp32 per token (B)" in out
    assert (
        "parameters matched (checked)" in out and "FLOPs/token equal at context 1, 256, 1024" in out
    )
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    cfg = run_config_from_dict({"model": {**_preset_dict(), "taper": "cosine",
                                          "head_taper": "cosine:1.25:0.75",
                                          "kv_taper": "cosine:1.0:0.25"}}).resolve().model  # fmt: skip
    assert data["kv_heads"] == cfg.layer_kv_heads and data["params_difference"] == 0
    kv = data["kv_cache"]
    assert kv["context"] == 1024
    for dtype, n in (("bf16", 2), ("fp32", 4)):
        assert kv["tapered"][dtype]["bytes_at_context"] == budget.kv_cache_bytes(cfg, 1024, n)
        assert kv["tapered"][dtype]["bytes_per_token"] == [
            2 * 32 * n * k for k in cfg.layer_kv_heads
        ]
    assert kv["uniform"]["fp32"]["bytes_per_token_total"] == 6 * 2 * 4 * 32 * 4
    # the default plan (no KV taper) still asserts matched FLOPs
    assert main(["plan", "--preset", "transformer-tiny"]) == 0
    assert "budget matched (checked)" in capsys.readouterr().out


def _preset_dict() -> dict:
    from taperlm.config.presets import get_preset

    m = to_dict(RunConfig(model=get_preset("transformer-tiny")))["model"]
    m.pop("mlp_widths", None)
    return m


def test_compare_draws_the_kv_pareto_plot_only_with_kv_tapers(tmp_path):
    from types import SimpleNamespace

    from taperlm.analysis.stats import paired_difference
    from taperlm.compare.report import _kv_pareto_plot
    from taperlm.compare.results import DiffVsUniform

    def entry(label, kv_bytes, diff):
        d = None
        if diff is not None:
            pd = paired_difference({0: diff - 0.01, 1: diff + 0.01}, {0: 0.0, 1: 0.0})
            d = DiffVsUniform(val_loss=pd, val_ppl=pd)
        return SimpleNamespace(
            label=label, kv_cache_bytes_per_token_bf16=kv_bytes, diff_vs_uniform=d
        )

    def summary(*entries):  # the part of a ComparisonSummary the plot reads
        return SimpleNamespace(allocations=list(entries))

    png = tmp_path / "kv.png"
    same = summary(entry("uniform", 768, None), entry("cosine", 768, -0.05))
    assert not _kv_pareto_plot(same, png) and not png.exists()
    kv = summary(entry("uniform", 768, None), entry("halved", 384, 0.02))
    assert _kv_pareto_plot(kv, png) and png.read_bytes()[:4] == b"\x89PNG"


def test_every_compare_plot_has_a_caption_in_the_report():
    """report.md lists every PNG compare can write (kv_pareto included) with its caption."""
    from taperlm.compare.report import PLOTS, _plots_section

    settings = SimpleNamespace(eval_tokens=4096, val_tokens=131072)  # what the captions read
    lines = _plots_section(dict(PLOTS), settings)
    for key, file in PLOTS.items():
        assert any(line.startswith("- [") and line.endswith(f"({file})") for line in lines), key
    assert f"![loss vs KV cache]({PLOTS['kv_pareto']})" in lines

"""Titans MAC/MAG/MAL: causality, attention masks against dense references, exact budgets,
stable training."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import raises_naming, tiny_config
from taperlm.config import ModelConfig, budget
from taperlm.config.presets import get_preset, preset_names
from taperlm.errors import ConfigError
from taperlm.models import TaperedLM
from taperlm.models.titans import segment_attention, sliding_window_attention
from taperlm.spec.taper import TaperSpec

VARIANTS = ("mac", "mag", "mal")


def small_cfg(variant: str, taper: str = "uniform", **titans) -> ModelConfig:
    opts = dict(
        variant=variant,
        memory_heads=2,
        memory_head_dim=8,
        memory_expansion=2,
        chunk_size=4,
        window=8,
        segment_len=8,
        persistent_tokens=2,
    )
    opts.update(titans)
    return tiny_config("titans", taper, vocab_size=61, n_layers=3, **opts)


@pytest.mark.parametrize("variant", VARIANTS)
def test_causal_at_token_granularity(variant: str) -> None:
    torch.manual_seed(0)
    model = TaperedLM(small_cfg(variant)).eval()
    T = 27  # not a multiple of chunk (4), window (8) or segment (8)
    idx = torch.randint(0, 61, (2, T))
    with torch.no_grad():
        base = model(idx).logits
        # chunk/segment starts, mid-chunk, last token of a segment, last token
        for p in (1, 3, 4, 6, 7, 8, 13, 16, 23, 26):
            alt = idx.clone()
            alt[:, p] = (alt[:, p] + 7) % 61
            out = model(alt).logits
            torch.testing.assert_close(out[:, :p], base[:, :p], rtol=0, atol=1e-6)
            assert (out[:, p] - base[:, p]).abs().max() > 1e-4


@pytest.mark.parametrize("variant", VARIANTS)
def test_prefix_consistency(variant: str) -> None:
    """Running a prefix alone gives the same logits (what recomputing generation relies on)."""
    torch.manual_seed(1)
    model = TaperedLM(small_cfg(variant)).eval()
    idx = torch.randint(0, 61, (1, 21))
    with torch.no_grad():
        full = model(idx).logits
        for p in (1, 5, 8, 12, 17):
            torch.testing.assert_close(model(idx[:, :p]).logits, full[:, :p], rtol=0, atol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_decoding_cache_equals_full_forward(variant: str) -> None:
    """A batch fed to the decoding cache in pieces (single tokens, and uneven pieces across chunk
    (4), window (8) and segment (8) boundaries) gives the logits of the full forward."""
    torch.manual_seed(6)
    model = TaperedLM(small_cfg(variant)).eval()
    idx = torch.randint(0, 61, (2, 45))
    with torch.no_grad():
        full = model(idx).logits
        for pieces in ([45], [1] * 45, [3, 1, 1, 6, 9, 1, 24], [13, 1, 2, 29]):
            cache = model.new_cache()
            got, p = [], 0
            for n in pieces:
                got.append(model(idx[:, p : p + n], cache=cache).logits)
                p += n
            torch.testing.assert_close(torch.cat(got, 1), full, rtol=0, atol=2e-5)
            assert [c.get_seq_length() for c in cache] == [45] * len(cache)


@pytest.mark.parametrize("variant", VARIANTS)
def test_decoding_cache_select_reorders_the_batch(variant: str) -> None:
    """`select` (beam search, dropping finished rows) keeps the chosen rows' whole state."""
    torch.manual_seed(7)
    model = TaperedLM(small_cfg(variant)).eval()
    idx = torch.randint(0, 61, (3, 30))
    keep = torch.tensor([2, 0])
    with torch.no_grad():
        full = model(idx[keep]).logits
        cache = model.new_cache()
        model(idx[:, :19], cache=cache)
        for c in cache:
            c.select(keep)
        got = model(idx[keep, 19:], cache=cache).logits
    torch.testing.assert_close(got, full[:, 19:], rtol=0, atol=2e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_greedy_generation_equals_recomputation(variant: str) -> None:
    """Greedy tokens with the cache equal recomputing the whole prefix each step, over many
    chunks, windows and segments."""
    from taperlm.models.generation import SamplingConfig, generate_tokens

    torch.manual_seed(8)
    model = TaperedLM(small_cfg(variant)).eval()
    prompt = torch.randint(0, 61, (5,)).tolist()
    runs = [
        list(
            generate_tokens(
                model, prompt, SamplingConfig(max_new_tokens=50, temperature=0, use_cache=c)
            )
        )
        for c in (True, False)
    ]
    assert len(runs[0]) == 50 and runs[0] == runs[1]


def _dense(q, keys, vals, mask):
    return F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask)


def test_mac_mask_equals_dense_reference() -> None:
    torch.manual_seed(2)
    B, H, S, n, Np, hd = 2, 3, 5, 3, 2, 4
    T = S * n
    q, k, v, kh, vh = (torch.randn(B, H, T, hd, dtype=torch.float64) for _ in range(5))
    kp, vp = (torch.randn(H, Np, hd, dtype=torch.float64) for _ in range(2))
    got = segment_attention(q, k, v, kh, vh, kp, vp, S)
    # Dense: keys [persistent | all memory tokens | all tokens]; query t sees persistent tokens,
    # and memory token / token j iff j is in t's segment and j <= t.
    mask = torch.zeros(T, Np + 2 * T, dtype=torch.bool)
    for t in range(T):
        mask[t, :Np] = True
        for j in range(T):
            if j // S == t // S and j <= t:
                mask[t, Np + j] = True
                mask[t, Np + T + j] = True
    keys = torch.cat((kp.expand(B, H, Np, hd), kh, k), 2)
    vals = torch.cat((vp.expand(B, H, Np, hd), vh, v), 2)
    torch.testing.assert_close(got, _dense(q, keys, vals, mask))


@pytest.mark.parametrize("T", [5, 8, 19])
def test_sliding_window_equals_dense_reference(T: int) -> None:
    torch.manual_seed(3)
    B, H, W, Np, hd = 2, 2, 8, 3, 4
    q, k, v = (torch.randn(B, H, T, hd, dtype=torch.float64) for _ in range(3))
    kp, vp = (torch.randn(H, Np, hd, dtype=torch.float64) for _ in range(2))
    got = sliding_window_attention(q, k, v, kp, vp, W, rotary=None)
    mask = torch.zeros(T, Np + T, dtype=torch.bool)
    mask[:, :Np] = True
    for t in range(T):
        for j in range(T):
            mask[t, Np + j] = j <= t and t - j < W
    keys = torch.cat((kp.expand(B, H, Np, hd), k), 2)
    vals = torch.cat((vp.expand(B, H, Np, hd), v), 2)
    torch.testing.assert_close(got, _dense(q, keys, vals, mask))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "taper,memory_taper",
    [("uniform", "uniform"), ("cosine:1.5:0.5", "uniform"), ("linear:1.25:0.75", "cosine")],
)
def test_param_count_equals_formula_and_budget(variant: str, taper: str, memory_taper: str) -> None:
    cfg = small_cfg(variant, taper, memory_taper=memory_taper, memory_multiple_of=4)
    model = TaperedLM(cfg)
    assert budget.total_params(cfg) == model.num_params()
    base = cfg.baseline()
    assert budget.total_params(base) == budget.total_params(cfg)
    assert budget.flops_per_token(base) == budget.flops_per_token(cfg)
    if memory_taper != "uniform":
        assert len(set(cfg.titans.memory_widths)) > 1


def test_memory_taper_changes_widths_at_equal_budget() -> None:
    uni = small_cfg("mag", memory_multiple_of=4)
    tap = small_cfg("mag", memory_taper="cosine:1.5:0.5", memory_multiple_of=4)
    assert tap.titans.memory_widths[0] > tap.titans.memory_widths[-1]
    assert budget.total_params(uni) == budget.total_params(tap)
    assert budget.flops_per_token(uni) == budget.flops_per_token(tap)


def test_memory_depth_three_params_and_taper_rejected() -> None:
    cfg = small_cfg("mal", memory_depth=3)
    assert budget.total_params(cfg) == TaperedLM(cfg).num_params()
    with raises_naming(ConfigError, "model.titans.memory_taper", "memory_depth 2", "uniform"):
        small_cfg("mal", memory_depth=3, memory_taper="cosine")


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match="segment_len"):
        small_cfg("mac", segment_len=6)
    with pytest.raises(ConfigError, match="memory_depth"):
        small_cfg("mag", memory_depth=1)
    with pytest.raises(ConfigError, match="max_inner_lr"):
        small_cfg("mag", max_inner_lr=3.0)


def test_presets_exist_and_budgets_are_exact() -> None:
    names = [n for n in preset_names() if n.startswith("titans-")]
    for v in VARIANTS:
        for size in ("nano", "micro", "tiny", "small", "440m", "760m", "1.3b"):
            assert f"titans-{v}-{size}" in names
    for v in VARIANTS:
        cfg = get_preset(f"titans-{v}-tiny")
        assert cfg.family == "titans" and cfg.titans.variant == v
        assert budget.total_params(cfg) == TaperedLM(cfg).num_params()
        big = get_preset(f"titans-{v}-760m", taper=TaperSpec.parse("cosine:1.5:0.5"))
        assert budget.total_params(big) == budget.total_params(big.baseline())


def test_chunk_size_is_saved_in_config() -> None:
    from taperlm.config import dump_yaml, run_config_from_dict

    cfg = small_cfg("mag", chunk_size=2)
    import yaml

    back = run_config_from_dict(yaml.safe_load(dump_yaml(cfg))).model
    assert back.titans.chunk_size == 2 and back.titans.memory_widths == cfg.titans.memory_widths
    assert dataclasses.asdict(back.titans) == dataclasses.asdict(cfg.titans)


def test_configs_saved_before_the_inner_clip_load_without_it() -> None:
    """A titans section written by an earlier taperlm (resolved widths, no max_inner_grad_norm)
    is the unclipped model it trained; a hand-written section gets the default clip."""
    import yaml

    from taperlm.config import dump_yaml, run_config_from_dict

    saved = yaml.safe_load(dump_yaml(small_cfg("mag")))
    del saved["titans"]["max_inner_grad_norm"]
    assert run_config_from_dict(saved).model.titans.max_inner_grad_norm == 0.0
    del saved["titans"]["memory_widths"]
    assert run_config_from_dict(saved).model.titans.max_inner_grad_norm == 1.0


def _train(variant: str, steps: int) -> list[float]:
    """AdamW on a repeated random pattern with the tiny preset's Titans settings."""
    torch.manual_seed(0)
    cfg = get_preset(f"titans-{variant}-tiny", resolve=False)
    cfg = dataclasses.replace(cfg, vocab_size=64, context_length=64).resolve()
    model = TaperedLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.1)
    pattern = torch.randint(0, 64, (4, 12))
    data = pattern.repeat(1, 6)[:, :65]
    losses = []
    for _ in range(steps):
        out = model(data[:, :-1], targets=data[:, 1:])
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(out.loss.item())
        assert all(torch.isfinite(p).all() for p in model.parameters())
    return losses


@pytest.mark.parametrize("variant", VARIANTS)
def test_short_training_is_finite_and_learns(variant: str) -> None:
    losses = _train(variant, 25)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_long_training_has_no_nan(variant: str) -> None:
    losses = _train(variant, 300)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.1 * losses[0]


def copy_task(variant: str, steps: int, seed: int, seq: int = 256, **titans) -> list[float]:
    """The copy task of the stability report: sequences repeating a fresh random 16-token
    pattern, 2 layers, d_model 64, AdamW lr 3e-3 (weight decay 0.1, grad clip 1.0), batch 8.
    Returns the losses; stops at the first step with a non-finite loss, gradient or weight."""
    cfg = tiny_config(
        preset=f"titans-{variant}-tiny", n_layers=2, d_model=64, mlp_width=176,
        context_length=seq, memory_head_dim=16, **titans,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = TaperedLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    losses = []
    for _ in range(steps):
        data = torch.randint(0, 64, (8, 16)).repeat(1, seq // 16 + 1)[:, : seq + 1]
        loss = model(data[:, :-1], targets=data[:, 1:]).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        finite = torch.isfinite(loss) and torch.isfinite(norm)
        if not (finite and all(torch.isfinite(p).all() for p in model.parameters())):
            break
    return losses


@pytest.mark.parametrize("variant", VARIANTS)
def test_copy_task_short_run_is_finite(variant: str) -> None:
    """A short run of the copy task for every variant (the divergence itself is shown by
    test_memory's unstable inner loop and, over 300 steps, by the slow tests below)."""
    losses = copy_task(variant, 8, seed=1, seq=128)
    assert len(losses) == 8 and all(math.isfinite(x) for x in losses)


@pytest.mark.slow
def test_copy_task_diverges_without_the_clip() -> None:
    """The reported failure, reproduced: MAL (seed 1) goes non-finite at step ~58 with
    max_inner_grad_norm 0, and stays finite with the default clip (~45 s)."""
    unclipped = copy_task("mal", 70, seed=1, max_inner_grad_norm=0.0)
    assert len(unclipped) < 70 or not math.isfinite(unclipped[-1])
    losses = copy_task("mal", 70, seed=1)
    assert len(losses) == 70 and all(math.isfinite(x) for x in losses)


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("seed", [0, 1])
def test_copy_task_trains_every_variant_without_non_finite_values(variant: str, seed: int) -> None:
    """Every Titans variant trains 300 steps of the copy task at lr 3e-3 with finite values
    and learns it (the loss approaches the 16 unpredictable tokens of each sequence)."""
    losses = copy_task(variant, 300, seed)
    assert len(losses) == 300 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-20:]) / 20 < 0.5 * losses[0]


@pytest.mark.parametrize("variant", VARIANTS)
def test_export_load_round_trip(variant: str, tmp_path) -> None:
    """Hugging Face export (config + safetensors) reloads to identical logits."""
    pytest.importorskip("transformers")
    export = pytest.importorskip("taperlm.hf.export")
    from transformers import AutoModelForCausalLM

    torch.manual_seed(5)
    model = TaperedLM(small_cfg(variant, "cosine", memory_taper="cosine", memory_multiple_of=4))
    export.export_model(model.eval(), tmp_path)
    back = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True).eval()
    assert back.model.config.titans == model.config.titans
    idx = torch.randint(0, 61, (1, 19))
    with torch.no_grad():
        torch.testing.assert_close(back(idx).logits, model(idx).logits, rtol=1e-5, atol=1e-6)

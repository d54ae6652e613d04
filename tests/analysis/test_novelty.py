"""Layer-wise novelty: hook-based measurement vs hand computations (TaperedLM, GPT-2), aggregation,
padding, layer discovery and its errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import raises_naming, tiny_config
from taperlm.analysis.novelty import (
    LayerDiscoveryError,
    NoveltyResult,
    TokenStats,
    find_layers,
    measure,
)
from taperlm.analysis.stats import pearson
from taperlm.errors import ConfigError
from taperlm.models import TaperedLM


def tiny_tapered(seed: int = 0) -> TaperedLM:
    cfg = tiny_config(taper="cosine", n_heads=2, context_length=32)
    torch.manual_seed(seed)
    return TaperedLM(cfg)


def hand_tapered(model: TaperedLM, window: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """[L, T] rho_block and rho_mlp of one window, computed by calling the submodules directly."""
    x = model.embed(window[None])
    rb, rm = [], []
    for block in model.blocks:
        h = x
        z = h + block.mixer(block.mixer_norm(h))
        f = block.mlp(block.mlp_norm(z))
        x = z + f
        rb.append(F.cosine_similarity(x - h, h, dim=-1)[0])
        rm.append(F.cosine_similarity(f, h, dim=-1)[0])
    return torch.stack(rb).double().numpy(), torch.stack(rm).double().numpy()


@torch.no_grad()
def test_tapered_matches_hand_computation():
    model = tiny_tapered().eval()
    ids = torch.randint(0, 64, (70,), generator=torch.Generator().manual_seed(1))
    res = measure(model, ids, seq_len=32, batch_size=2, keep_per_token=True)
    # windows 32, 32, 6 -> first token of each excluded
    parts = [hand_tapered(model, w) for w in ids.split(32)]
    hand_b = np.concatenate([b[:, 1:] for b, _ in parts], axis=1)
    hand_m = np.concatenate([m[:, 1:] for _, m in parts], axis=1)
    assert res.n_layers == 4 and res.n_windows == 3 and res.n_tokens == 70 - 3
    assert res.per_token is not None
    np.testing.assert_allclose(res.per_token["rho_block"], hand_b, atol=1e-6, rtol=0)
    np.testing.assert_allclose(res.per_token["rho_mlp"], hand_m, atol=1e-6, rtol=0)
    # Aggregation: mean, sample std, median, p10/p90 over tokens, per layer.
    for layer in range(4):
        for key, hand in (("rho_block", hand_b), ("rho_mlp", hand_m)):
            s = getattr(res, key)[layer]
            v = hand[layer]
            assert s.mean == pytest.approx(v.mean(), abs=1e-6)
            assert s.std == pytest.approx(v.std(ddof=1), abs=1e-6)
            assert s.median == pytest.approx(np.median(v), abs=1e-6)
            assert s.p10 == pytest.approx(np.percentile(v, 10), abs=1e-6)
            assert s.p90 == pytest.approx(np.percentile(v, 90), abs=1e-6)
    assert res.pearson_mlp == pytest.approx(
        np.corrcoef(np.arange(4), hand_m.mean(axis=1))[0, 1], abs=1e-5
    )
    assert res.pearson_block == pytest.approx(
        np.corrcoef(np.arange(4), hand_b.mean(axis=1))[0, 1], abs=1e-5
    )
    assert res.mlp_widths == model.config.mlp_widths
    assert res.layers_path == "blocks" and res.mlp_name == "mlp"


@torch.no_grad()
def test_include_first_token_and_eval_mode_restored():
    model = tiny_tapered().train()
    ids = torch.randint(0, 64, (64,), generator=torch.Generator().manual_seed(2))
    res = measure(model, ids, seq_len=32, skip_first=False, keep_per_token=True)
    assert res.n_tokens == 64 and not res.skip_first
    assert "included" in res.aggregation
    _, m = hand_tapered(model.eval(), ids[:32])
    assert res.per_token is not None
    np.testing.assert_allclose(res.per_token["rho_mlp"][:, :32], m, atol=1e-6, rtol=0)
    model.train()
    measure(model, ids, seq_len=32)
    assert model.training  # restored
    for mod in model.modules():  # hooks removed
        assert not mod._forward_hooks and not mod._forward_pre_hooks


@torch.no_grad()
def test_right_padding_is_excluded():
    model = tiny_tapered()
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randint(0, 64, (20,), generator=gen), torch.randint(0, 64, (12,), generator=gen)
    ids = torch.zeros(2, 20, dtype=torch.long)
    mask = torch.zeros(2, 20, dtype=torch.long)
    ids[0], mask[0] = a, 1
    ids[1, :12], mask[1, :12] = b, 1
    padded = measure(model, ids, attention_mask=mask, keep_per_token=True)
    separate = [measure(model, w, seq_len=32, keep_per_token=True) for w in (a, b)]
    assert padded.n_tokens == 19 + 11
    for key in ("rho_block", "rho_mlp"):
        assert padded.per_token is not None
        expect = np.concatenate([s.per_token[key] for s in separate], axis=1)  # type: ignore[index]
        np.testing.assert_allclose(padded.per_token[key], expect, atol=1e-6, rtol=0)
    left = mask.flip(1)
    with raises_naming(ValueError, "right padding"):  # the one padding it can exclude
        measure(model, ids, attention_mask=left)


@torch.no_grad()
def test_low_precision_model_measured_in_fp32():
    model = tiny_tapered()
    ids = torch.randint(0, 64, (32,), generator=torch.Generator().manual_seed(4))
    ref = measure(model, ids)
    low = measure(model.to(torch.bfloat16), ids)
    for a, b in zip(ref.rho_mlp, low.rho_mlp):
        assert abs(a.mean - b.mean) < 0.05


# ---------------------------------------------------------------- GPT-2 (transformers, offline)


def tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_layer=3,
        n_embd=32,
        n_head=2,
        vocab_size=100,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def gpt2_attention(block, x: torch.Tensor, n_head: int) -> torch.Tensor:
    """GPT-2 causal self-attention written out (c_attn -> softmax(qk^T/sqrt(d)) v -> c_proj)."""
    B, T, D = x.shape
    q, k, v = block.attn.c_attn(block.ln_1(x)).split(D, dim=-1)
    q, k, v = (t.view(B, T, n_head, D // n_head).transpose(1, 2) for t in (q, k, v))
    att = (q @ k.transpose(-1, -2)) / math.sqrt(D // n_head)
    att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
    return block.attn.c_proj(y)


@torch.no_grad()
def test_gpt2_matches_hand_computation():
    model = tiny_gpt2()
    ids = torch.randint(0, 100, (1, 40), generator=torch.Generator().manual_seed(5))
    out = model(ids, output_hidden_states=True)
    hs = (
        out.hidden_states
    )  # hs[l] = input of block l; hs[-1] has ln_f applied (not block 2's output)
    assert len(hs) == 4
    last_out = {}
    handle = model.transformer.h[2].register_forward_hook(
        lambda m, a, o: last_out.setdefault("x", o[0] if isinstance(o, tuple) else o)
    )
    model(ids)
    handle.remove()
    block_outs = [hs[1], hs[2], last_out["x"]]
    assert not torch.allclose(block_outs[2], hs[3])  # ln_f really is applied to hs[-1]
    rb, rm = [], []
    for i, block in enumerate(model.transformer.h):
        h = hs[i]
        z = h + gpt2_attention(block, h, 2)
        f = block.mlp(block.ln_2(z))
        torch.testing.assert_close(z + f, block_outs[i], atol=1e-5, rtol=1e-5)
        rb.append(F.cosine_similarity(block_outs[i] - h, h, dim=-1)[0, 1:])
        rm.append(F.cosine_similarity(f, h, dim=-1)[0, 1:])
    res = measure(model, ids[0], keep_per_token=True)
    assert res.layers_path == "transformer.h" and res.seq_len == 40
    assert res.mlp_widths == [128, 128, 128]
    assert res.per_token is not None
    np.testing.assert_allclose(res.per_token["rho_block"], torch.stack(rb).numpy(), atol=1e-6)
    np.testing.assert_allclose(res.per_token["rho_mlp"], torch.stack(rm).numpy(), atol=1e-6)
    assert res.pearson_mlp == pytest.approx(
        np.corrcoef([0, 1, 2], torch.stack(rm).double().mean(1).numpy())[0, 1], abs=1e-5
    )


@torch.no_grad()
def test_gpt2_right_padding_with_attention_mask():
    model = tiny_gpt2()
    ids = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(6))
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[1, 15:] = 0
    padded = measure(model, ids, attention_mask=mask, keep_per_token=True)
    alone = measure(model, ids[1, :15], keep_per_token=True)
    assert padded.n_tokens == 23 + 14
    assert padded.per_token is not None and alone.per_token is not None
    np.testing.assert_allclose(
        padded.per_token["rho_mlp"][:, 23:], alone.per_token["rho_mlp"], atol=1e-5
    )


def test_llama_style_layers_found():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    res = measure(model, torch.randint(0, 50, (30,)))
    assert res.layers_path == "model.layers" and res.mlp_widths == [48, 48]
    assert res.n_tokens == 29 and all(-1 <= s.mean <= 1 for s in res.rho_mlp)


# ---------------------------------------------------------------- generic fallback and errors


class ToyLayer(nn.Module):
    """A decoder layer that takes hidden_states by keyword and returns a tuple, like older HF."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.mix = nn.Linear(d, d)
        self.feed_forward = nn.Sequential(nn.Linear(d, 3 * d), nn.GELU(), nn.Linear(3 * d, d))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, None]:
        z = hidden_states + self.mix(hidden_states)
        return z + self.feed_forward(z), None


class ToyLM(nn.Module):
    def __init__(self, d: int = 16, n: int = 3) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, d)
        self.stack = nn.ModuleDict({"decoder": nn.ModuleList(ToyLayer(d) for _ in range(n))})
        self.aux = nn.ModuleList([nn.Linear(d, d)])  # a ModuleList without MLPs: not a candidate
        self.head = nn.Linear(d, 30)

    def forward(self, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        x = self.emb(input_ids)
        for layer in self.stack["decoder"]:
            x = layer(hidden_states=x)[0]
        return self.head(x)


@torch.no_grad()
def test_generic_fallback_tuple_outputs_and_kwargs():
    torch.manual_seed(0)
    model = ToyLM()
    ids = torch.randint(0, 30, (12,))
    res = measure(model, ids, keep_per_token=True)
    assert res.layers_path == "stack.decoder" and res.mlp_name == "feed_forward"
    x = model.emb(ids[None])
    for i, layer in enumerate(model.stack["decoder"]):
        z = x + layer.mix(x)
        f = layer.feed_forward(z)
        expect = F.cosine_similarity(f, x, dim=-1)[0, 1:]
        assert res.per_token is not None
        np.testing.assert_allclose(res.per_token["rho_mlp"][i], expect.numpy(), atol=1e-6)
        x = z + f


def test_unfindable_layers_clear_error():
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8))
    with raises_naming(LayerDiscoveryError, "Sequential", "mlp", "layers_path=", "--layers PATH"):
        measure(model, torch.arange(5))
    assert issubclass(LayerDiscoveryError, ConfigError)
    with raises_naming(LayerDiscoveryError, "ToyLM", "'nope'"):
        find_layers(ToyLM(), layers_path="nope")
    with raises_naming(LayerDiscoveryError, "'stack.decoder'", "ToyLM", "mlp"):
        find_layers(ToyLM(), layers_path="stack.decoder", mlp_name="mlp")
    assert find_layers(ToyLM(), layers_path="stack.decoder").mlp_name == "feed_forward"


class SkipsMLP(ToyLM):
    def forward(self, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        x = self.emb(input_ids)
        for layer in self.stack["decoder"]:
            x = x + layer.mix(x)  # calls only a submodule, never the layer: hooks never fire
        return self.head(x)


def test_layers_that_do_not_run_are_reported():
    with raises_naming(LayerDiscoveryError, "[0, 1, 2]", "stack.decoder"):
        measure(SkipsMLP(), torch.arange(6))


# ---------------------------------------------------------------- helpers and serialization


def test_pearson_against_numpy():
    rng = np.random.default_rng(0)
    for n in (2, 5, 24):
        y = rng.normal(size=n)
        assert pearson(range(n), y) == pytest.approx(np.corrcoef(np.arange(n), y)[0, 1])
    assert math.isnan(pearson([0, 1, 2], [1.0, 1.0, 1.0]))
    assert math.isnan(pearson([0], [1.0]))


def test_token_stats_and_roundtrip():
    s = TokenStats.of(np.array([0.1, 0.2, 0.3, 0.4]))
    assert s.mean == pytest.approx(0.25) and s.n == 4 and s.median == pytest.approx(0.25)
    res = measure(tiny_tapered(), torch.randint(0, 64, (40,)))
    d = json.loads(json.dumps(res.to_dict()))
    back = NoveltyResult.from_dict(d)
    assert back.means("rho_mlp") == pytest.approx(res.means("rho_mlp"))
    assert back.pearson_block == pytest.approx(res.pearson_block)
    assert back.mlp_widths == res.mlp_widths and back.n_layers == 4


def test_compiled_wrapper_is_unwrapped():
    model = tiny_tapered()
    ids = torch.randint(0, 64, (32,), generator=torch.Generator().manual_seed(7))
    compiled = torch.compile(model)  # not run: measure() hooks the original module
    assert measure(compiled, ids).means("rho_mlp") == pytest.approx(
        measure(model, ids).means("rho_mlp"), abs=1e-6
    )

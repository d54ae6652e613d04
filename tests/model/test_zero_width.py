"""MLP width 0 as a first-class width: a layer the taper gives no MLP (cosine:2:0's last layer,
a custom width 0) is attention only, at the exact budget, in every family that can carry it (Hope
refuses: its CMS levels each need a width), forward and backward, through init (plain and
paired; fixed and fan-in schemes), checkpoints, resume and the Hugging Face export (GGUF: tests/export/test_gguf_export.py, zero-mlp)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import raises_naming, tiny_config
from taperlm.config.budget import flops_per_token, total_params
from taperlm.errors import ConfigError, TaperError
from taperlm.models import TaperedLM
from taperlm.spec.solver import solve_sizes
from taperlm.spec.taper import TaperSpec

ZERO_FAMILIES = {  # family or preset -> tiny_config arguments
    "transformer": dict(family="transformer"),
    "gated": dict(family="gated"),
    "titans-mag": dict(preset="titans-mag-tiny"),
    "titans-mac": dict(preset="titans-mac-tiny"),
    "titans-mal": dict(preset="titans-mal-tiny"),
}


def test_the_solver_gives_zero_only_where_the_schedule_asks():
    """cosine:2:0 at 4 layers x 64 (steps of 16): 2, 1.5, 0.5, 0 -> 128, 96, 32, 0. A
    multiplier that rounds to 0 steps gives 0 with zero_ok; without (heads, memory) it is
    refused as before; the budget's moves never drop a layer the schedule gave a width to 0."""
    spec = TaperSpec.parse("cosine:2:0")
    assert solve_sizes(spec, 4, 64, zero_ok=True) == [128, 96, 32, 0]
    with raises_naming(TaperError, "layer 3", "end multiplier"):
        solve_sizes(spec, 4, 64)
    # 1.95 -> 0.05 at 64: the last layer's 3.2 rounds to 0 steps of 16
    assert solve_sizes(TaperSpec.parse("cosine:1.95:0.05"), 4, 64, zero_ok=True)[-1] == 0
    # widths given outright: 0 allowed for MLP widths only
    assert solve_sizes(TaperSpec.parse("custom:128,128,0,0"), 4, 64, zero_ok=True)[2:] == [0, 0]
    with pytest.raises(TaperError, match=">= 1"):
        solve_sizes(TaperSpec.parse("custom:128,128,0,0"), 4, 64)
    with pytest.raises(TaperError, match=">= 0"):
        TaperSpec.parse("cosine:2.5:-0.5")
    # a tiny positive multiplier still never moves a positive layer to 0
    for start in (1.5, 1.75, 1.9):
        widths = solve_sizes(TaperSpec.parse(f"cosine:{start}:{2 - start}"), 6, 256, zero_ok=True)
        assert min(widths) > 0 and sum(widths) == 6 * 256


@pytest.mark.parametrize("name", list(ZERO_FAMILIES))
def test_zero_width_layer_is_attention_only_at_the_exact_budget(name: str):
    """Parameters (numel) and FLOPs equal uniform's; the last layer's MLP adds exactly 0 to the
    residual stream; forward and backward are finite and the zero-size weights have (empty)
    gradients; plain and paired init both build it."""
    cfg = tiny_config(taper="cosine:2:0", **ZERO_FAMILIES[name])
    assert cfg.mlp_widths[-1] == 0 and sum(cfg.mlp_widths) == 4 * cfg.mlp_width
    base = cfg.baseline()
    assert total_params(cfg) == total_params(base)
    assert flops_per_token(cfg, 64) == flops_per_token(base, 64)
    torch.manual_seed(0)
    model = TaperedLM(cfg)
    assert sum(p.numel() for p in model.parameters()) == total_params(cfg)
    last = model.blocks[-1].mlp
    assert last.width == 0 and last.w_in.weight.shape == (0, cfg.d_model)
    h = torch.randn(2, 5, cfg.d_model)
    assert torch.equal(last(h), torch.zeros_like(h))
    x = torch.randint(0, cfg.vocab_size, (2, 16))
    out = model(x, targets=x)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert last.w_out.weight.grad is not None and last.w_out.weight.grad.shape == (cfg.d_model, 0)
    assert model.blocks[0].mlp.w_in.weight.grad.abs().sum() > 0
    # the fan-in init scheme has no fan-in to scale a zero-width matrix by: nothing is drawn
    fan_in = TaperedLM(tiny_config(taper="cosine:2:0", init="fan_in", **ZERO_FAMILIES[name]))
    assert fan_in.blocks[-1].mlp.w_out.weight.shape == (cfg.d_model, 0)


def test_hope_refuses_a_zero_width_and_says_why():
    with raises_naming(ConfigError, "model.hope.levels", "(0)", "end multiplier", "fewer levels"):
        tiny_config(family="hope", taper="cosine:2:0")


def test_a_zero_width_model_trains_and_exports(tmp_path: Path):
    """A run with an attention-only last layer trains (paired init), its checkpoint reloads to
    the same logits, and the Hugging Face export gives the same logits."""
    transformers = pytest.importorskip("transformers")
    from eval_helpers import tiny_tokenizer
    from taperlm.hf.export import export_model
    from taperlm.models.layers import paired_init

    tok = tiny_tokenizer()
    cfg = tiny_config(taper="cosine:2:0", vocab_size=tok.vocab_size)
    model = TaperedLM(cfg)
    paired_init(model, 0, 0.1, cfg.n_layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, cfg.vocab_size, (2, 16))
    first = None
    for _ in range(5):
        loss = model(x, targets=x).loss
        first = first if first is not None else float(loss.detach())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0, foreach=True)
        opt.step()
    assert float(loss) < first
    model.eval()
    out = export_model(model, tmp_path / "hf", tok)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    assert [b.mlp.width for b in hf.model.blocks] == cfg.mlp_widths
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x).logits, atol=1e-5, rtol=0)


def test_a_zero_width_run_resumes_exactly(tmp_path: Path):
    """The trainer end to end: a cosine:2:0 run stopped and resumed equals one trained straight
    through (the zero-size tensors go through the checkpoint and the optimizer state)."""
    import fault_harness
    from taperlm.checkpoint import store as ckpt
    from taperlm.cli import main as cli_main
    from taperlm.config import RunConfig, to_dict
    from taperlm.training.loop import train

    src = tmp_path / "corpus.txt"
    src.write_text(fault_harness.corpus_text(6000, 0), encoding="utf-8")
    data = tmp_path / "data"
    assert (
        cli_main(["prepare", "--source", str(src), "--tokenizer", "bpe:512", "--out", str(data)])
        == 0
    )
    model = tiny_config(taper="cosine:2:0", vocab_size=512)
    run = RunConfig(model=model)
    run.data.dir = str(data)
    t = run.train
    t.tokens, t.batch_tokens, t.seq_len, t.micro_batch_size = 6 * 256, 256, 32, 8
    t.warmup_tokens, t.eval_every, t.eval_tokens, t.checkpoint_every = 256, 0, 256, 2
    t.keep_checkpoints, t.log_every, t.lr, t.paired_init = 10, 1, 3e-3, True
    straight = train(run, tmp_path / "a", progress=False)
    part = train(run, tmp_path / "b", progress=False, stop_after=3)
    assert part.step == 3
    resumed = train(run, tmp_path / "b", progress=False)
    assert resumed.train_loss == straight.train_loss
    a = ckpt.load_model_state(tmp_path / "a" / "checkpoints" / ckpt.checkpoint_name(6))
    b = ckpt.load_model_state(tmp_path / "b" / "checkpoints" / ckpt.checkpoint_name(6))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert a["blocks.3.mlp.w_in.weight"].shape == (0, model.d_model)
    assert to_dict(run)["model"]["mlp_widths"][-1] == 0

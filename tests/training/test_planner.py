"""The memory and time planner (`taperlm plan --gpus`, training/planner.py).

Its parameter, gradient and optimizer figures are checked against the tensors FSDP2 allocates
on 2 gloo ranks in tests/training/test_train_distributed.py (and the 440M dry run, docs/scaling.md);
here: one process, the activation trace, the formulas and the command line."""

from __future__ import annotations

import json

import pytest
import torch

from taperlm.cli import main as cli_main
from taperlm.config.presets import get_preset
from taperlm.errors import ConfigError
from taperlm.training import planner as P


def test_parse_bytes():
    assert P.parse_bytes("80GB") == P.parse_bytes("80 GiB") == P.parse_bytes("80") == 80 * P.GiB
    assert P.parse_bytes("40960MB") == 40 * P.GiB
    for bad in ("eighty", "-1GB", "0"):
        with pytest.raises(ConfigError, match="--gpu-memory"):
            P.parse_bytes(bad)


def test_shards_are_padded_like_fsdp2():
    assert P.shard_numel((10, 3), 4) == 3 * 3  # chunks of ceil(10/4) = 3 rows
    assert P.shard_numel((7,), 8) == 1 and P.shard_numel((8, 2), 1) == 16


def test_one_process_matches_the_tensors_it_allocates():
    """gpus=1: parameters, gradients and AdamW state of a real step equal the plan exactly."""
    cfg = get_preset("hope-tiny")
    from taperlm.models import TaperedLM

    model = TaperedLM(cfg)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, cfg.vocab_size, (2, 16))
    model(x, targets=x).loss.backward()
    opt.step()
    from taperlm.training.guard import StepGuard

    guard = StepGuard(model, opt, keep_copy=True)  # what train.restore_nonfinite copies
    guard.before(list(model.parameters()))
    measured = {
        "parameters": sum(p.numel() * 4 for p in model.parameters()),
        "gradients": sum(p.grad.numel() * 4 for p in model.parameters()),
        "optimizer": sum(
            v.numel() * 4 for s in opt.state.values() for k, v in s.items() if k != "step"
        ),
        "step guard": sum(b.numel() * 4 for b in guard._copies.values() if b.dim()),
    }
    plan = P.plan_training(cfg, 1, 80 * P.GiB, 2, 16, parallel="fsdp")
    assert {k: plan.lines[k] for k in measured} == measured
    off = P.plan_training(cfg, 1, 80 * P.GiB, 2, 16, parallel="fsdp", restore_nonfinite=False)
    assert "step guard" not in off.lines
    assert plan.total - off.total >= measured["step guard"]


@pytest.mark.parametrize("preset", ["transformer-tiny", "titans-mac-tiny"])
def test_activation_trace_equals_a_real_bf16_run(preset):
    """The fake-tensor trace counts what a real bf16 block keeps for backward on CPU."""
    cfg = get_preset(preset)
    traced = P.block_activation_bytes(cfg, 0, 2, 64)
    from taperlm.models import TaperedLM

    block = TaperedLM(cfg).blocks[0].to(torch.bfloat16)
    own = {t.untyped_storage().data_ptr() for t in [*block.parameters(), *block.buffers()]}
    kept: dict[int, int] = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in own:
            kept[key] = max(kept.get(key, 0), t.untyped_storage().nbytes())
        return t

    x = torch.randn(2, 64, cfg.d_model, dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    real = sum(kept.values())
    assert abs(traced - real) <= 0.1 * real, (traced, real)


def test_plan_lines_and_what_they_respond_to():
    cfg = get_preset("transformer-440m")
    base = P.plan_training(cfg, 8, 80 * P.GiB, 4, 2048, tokens=10**9, batch_tokens=2**19)
    n = base.params_total
    assert base.lines["optimizer"] == 2 * base.lines["parameters"]
    assert base.lines["step guard"] == 3 * base.lines["parameters"]
    assert abs(base.lines["parameters"] - 4 * n / 8) < 0.01 * 4 * n / 8
    assert base.accumulation == 8 and base.fits
    ddp = P.plan_training(cfg, 8, 80 * P.GiB, 4, 2048, parallel="ddp")
    assert ddp.lines["parameters"] == 4 * n and ddp.lines["gradients"] == 8 * n
    ac = P.plan_training(cfg, 8, 80 * P.GiB, 4, 2048, activation_checkpointing=True, tokens=10**9)
    assert ac.lines["activations"] < 0.2 * base.lines["activations"]
    assert ac.seconds == pytest.approx(base.seconds * 4 / 3)
    double = P.plan_training(cfg, 8, 80 * P.GiB, 8, 2048)
    assert double.lines["activations"] == pytest.approx(2 * base.lines["activations"], rel=0.01)
    # time = tokens x FLOPs/token / (gpus x peak x mfu)
    assert base.seconds == pytest.approx(1e9 * base.flops_per_token / (8 * 989e12 * 0.4))
    assert base.checkpoint_bytes == 12 * n and base.token_disk_bytes == 2 * 10**9
    small = P.plan_training(cfg, 8, 8 * P.GiB, 16, 4096)
    assert not small.fits and "activation-checkpointing" in small.notes[0]


def test_plan_cli(capsys):
    argv = ["plan", "--preset", "transformer-440m", "--taper", "cosine", "--gpus", "8"]
    argv += [
        "--gpu-memory",
        "80GB",
        "--micro-batch",
        "4",
        "--seq-len",
        "2048",
        "--parallel",
        "fsdp",
    ]
    assert cli_main([*argv, "--tokens", "30e9", "--activation-checkpointing"]) == 0
    out = capsys.readouterr().out
    assert "per-GPU memory: transformer, 456.0M parameters, fsdp on 8 GPU(s)" in out
    assert "checkpointed per block" in out and "(x4/3 recompute)" in out
    assert "tokens 60.0 GB; one checkpoint 5.47 GB" in out
    assert cli_main([*argv, "--json", "--parallel", "ddp"]) == 0
    plan = json.loads(capsys.readouterr().out)["memory_plan"]
    assert plan["parallel"] == "ddp" and plan["fits"] is True
    assert cli_main([*argv, "--gpus", "0"]) == 2
    assert "--gpus must be >= 1, got 0" in capsys.readouterr().err

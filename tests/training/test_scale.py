"""The parts of training at scale that one process can prove: sharded (DCP) checkpoints and their
verification, meta-device init, chunked cross-entropy, activation checkpointing, regional
compile, Hope's update periods under a wrapper, and the mixed-precision policy.

Their multi-process counterparts (FSDP2 / DDP on 2 gloo processes) are in
tests/training/test_train_distributed.py; the memory planner's checks in tests/training/test_planner.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from checkpoint_helpers import full_model_state, full_optimizer_state
from conftest import raises_naming
from taperlm.checkpoint import store as ckpt
from taperlm.checkpoint.loading import load_run_model
from taperlm.config.presets import get_preset
from taperlm.errors import ConfigError
from taperlm.models import TaperedLM
from taperlm.models.loss import chunked_cross_entropy
from taperlm.training.loop import Trainer, train
from taperlm.training.model import build_on_meta, fsdp_mixed_precision, materialize, uncompile
from taperlm.training.optim import param_groups, parameter_periods
from test_train import data_dir, losses, tiny_config, weights  # noqa: F401 (fixture)

FAMILIES = ["transformer-tiny", "gated-tiny", "hope-tiny", "titans-mac-tiny", "titans-mal-tiny"]


# ----------------------------------------------------------------------------------------------
# meta-device init


@pytest.mark.parametrize("preset", FAMILIES)
@pytest.mark.parametrize("tied", [False, True])
def test_meta_init_is_bitwise_the_cpu_build(preset, tied):
    """Built on meta and filled part by part: every parameter and buffer equals TaperedLM(cfg)
    built whole after the same seed, and the RNG ends in the same state."""
    cfg = get_preset(preset)
    cfg.tie_embeddings = tied
    torch.manual_seed(5)
    ref = TaperedLM(cfg)
    after_ref = torch.get_rng_state()
    torch.manual_seed(5)
    model = build_on_meta(cfg)
    assert all(p.is_meta for p in model.parameters())
    materialize(model, torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), after_ref)
    a = dict(ref.named_parameters(remove_duplicate=False))
    b = dict(model.named_parameters(remove_duplicate=False))
    a.update(ref.named_buffers())
    b.update(model.named_buffers())
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert (model.lm_head.weight is model.embed.weight) == tied


@pytest.mark.parametrize("preset", FAMILIES)
def test_meta_init_builds_each_layers_own_heads(preset):
    """With a head taper (grouped-query, so KV heads taper too) every layer's attention is built
    on meta at its own shape and materialised bitwise equal to the CPU build."""
    from dataclasses import replace

    base = get_preset(preset)
    cfg = replace(base, n_kv_heads=2).with_taper(base.taper, head_taper="cosine")
    assert len(set(cfg.layer_heads)) > 1
    if preset.startswith("transformer"):  # and per-layer KV heads of their own (a KV taper)
        cfg = cfg.with_taper(cfg.taper, kv_taper="linear:2:0.5")
        assert len(set(cfg.layer_kv_heads)) > 1 and cfg.layer_kv_heads != [
            h // 2 for h in cfg.layer_heads
        ]
    torch.manual_seed(3)
    ref = TaperedLM(cfg)
    torch.manual_seed(3)
    model = build_on_meta(cfg)
    materialize(model, torch.device("cpu"))
    a, b = ref.state_dict(), model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].shape == b[k].shape and torch.equal(a[k], b[k]), k
    assert model.num_params() == ref.num_params() == TaperedLM(cfg.baseline()).num_params()


def test_meta_init_detects_a_part_it_cannot_build(monkeypatch):
    cfg = get_preset("transformer-tiny")
    model = build_on_meta(cfg)
    parts = TaperedLM.parts
    monkeypatch.setattr(TaperedLM, "parts", staticmethod(lambda c, r: parts(c, r)[:-1]))
    with raises_naming(RuntimeError, "['lm_head.weight']"):
        materialize(model, torch.device("cpu"))


# ----------------------------------------------------------------------------------------------
# chunked cross-entropy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_cross_entropy_equals_the_plain_loss(dtype):
    """Value and gradient equal F.cross_entropy on fp32 logits, with ignored (-100) targets and
    chunks that do not divide the rows."""
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(37, 50, generator=g)).to(dtype).requires_grad_()
    targets = torch.randint(0, 50, (37,), generator=g)
    targets[[3, 11, 36]] = -100
    ref_logits = logits.detach().float().requires_grad_()
    ref = F.cross_entropy(ref_logits, targets, ignore_index=-100)
    (ref * 0.7).backward()
    loss = chunked_cross_entropy(logits, targets, chunk_elements=8 * 50)  # 5 chunks of 8 rows
    assert loss.dtype == torch.float32
    (loss * 0.7).backward()
    assert torch.allclose(loss, ref, rtol=1e-6, atol=0)
    assert logits.grad.dtype == dtype
    if dtype == torch.float32:
        assert torch.allclose(logits.grad, ref_logits.grad, rtol=1e-5, atol=1e-8)
    else:  # the fp32 gradient rounded once to bf16
        assert torch.equal(logits.grad, ref_logits.grad.to(torch.bfloat16))
    assert torch.count_nonzero(logits.grad[[3, 11, 36]]) == 0


def test_cross_entropy_uses_the_chunked_loss_for_low_precision_logits(monkeypatch):
    from taperlm.models import layers

    calls = []
    real = layers.chunked_cross_entropy
    monkeypatch.setattr(layers, "chunked_cross_entropy", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(2, 3, 11, dtype=torch.bfloat16, requires_grad=True)
    y = torch.randint(0, 11, (2, 3))
    layers.cross_entropy(x, y).backward()
    assert calls == [1]


# ----------------------------------------------------------------------------------------------
# sharded checkpoints in one process


def test_checkpoint_verification_is_split_over_ranks(data_dir, tmp_path, monkeypatch):  # noqa: F811
    """Each of W ranks hashes every W-th file of a checkpoint (and all of them together hash
    each file once); a corrupt file is reported to every rank through the all-gather."""
    run = tmp_path / "run"
    train(tiny_config(data_dir, "train.tokens=512"), run, progress=False)
    path = ckpt.find_checkpoint(run)
    files = sorted(ckpt.read_manifest(path)["files"])
    hashed: list[str] = []
    real = ckpt.sha256_file
    monkeypatch.setattr(ckpt, "sha256_file", lambda p: hashed.append(p.name) or real(p))
    per_rank = []
    for rank in range(2):
        hashed.clear()
        ckpt.verify_checkpoint(path, part=(rank, 2))
        per_rank.append(sorted(hashed))
    assert per_rank[0] and per_rank[1] and sorted(per_rank[0] + per_rank[1]) == files
    # rank 1 holds the bad file: both ranks raise its message
    bad = path / per_rank[1][0]
    bad.write_bytes(bytes(b ^ 1 for b in bad.read_bytes()[:4]) + bad.read_bytes()[4:])
    verdicts = []
    for rank in range(2):
        mine = None
        try:
            ckpt.verify_checkpoint(path, part=(rank, 2))
        except ckpt.CheckpointError as err:
            mine = str(err)
        verdicts.append(mine)
    assert verdicts[0] is None and "is corrupted" in verdicts[1]
    with raises_naming(ckpt.CheckpointError, "sha256", "delete this checkpoint"):
        ckpt.verify_checkpoint(path, part=(0, 2), agree=lambda _: verdicts)


def test_async_checkpoints_equal_the_synchronous_run(data_dir, tmp_path):  # noqa: F811
    """train.async_checkpoint: shards written in the background, committed at the next step;
    every checkpoint and the losses are bitwise those of the synchronous run."""
    sync, bg = tmp_path / "sync", tmp_path / "async"
    train(tiny_config(data_dir, "train.checkpoint_every=1"), sync, progress=False)
    cfg = tiny_config(data_dir, "train.checkpoint_every=1", "train.async_checkpoint=true")
    train(cfg, bg, progress=False)
    assert losses(bg) == losses(sync)
    assert [s for s, _ in ckpt.list_checkpoints(bg)] == list(range(1, 9))
    for step in (1, 5, 8):
        a, b = weights(bg, step), weights(sync, step)
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert not [p for p in (bg / "checkpoints").iterdir() if p.name.startswith(".tmp")]


def test_format_1_checkpoint_still_loads_and_resumes(data_dir, tmp_path):  # noqa: F811
    """A checkpoint of the earlier single-file format (model.safetensors + optimizer in
    state.pt) is read by load_run_model and resumed exactly."""
    import json

    from safetensors.torch import save_file

    ref = tmp_path / "ref"
    train(tiny_config(data_dir), ref, progress=False)
    run = tmp_path / "old"
    trainer = Trainer(tiny_config(data_dir), run)
    try:
        trainer.fit(progress=False, stop_after=4)
        path = run / "checkpoints" / ckpt.checkpoint_name(4)
        state = ckpt.load_train_state(path)
        state["optimizer"] = full_optimizer_state(trainer.model, trainer.optimizer.inner)
        state["pending_grads"] = {}
        model_state = full_model_state(trainer.model)
    finally:
        trainer.close()
    for f in path.iterdir():
        f.unlink()
    save_file({k: v.contiguous() for k, v in model_state.items()}, str(path / ckpt.MODEL_FILE))
    torch.save(state, path / ckpt.STATE_FILE)
    files = {
        n: {"sha256": ckpt.sha256_file(path / n), "bytes": (path / n).stat().st_size}
        for n in (ckpt.MODEL_FILE, ckpt.STATE_FILE)
    }
    manifest = {"format_version": 1, "step": 4, "files": files}
    (path / ckpt.MANIFEST_FILE).write_text(json.dumps(manifest))
    model, _ = load_run_model(run)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in model_state.items())
    train(tiny_config(data_dir), run, progress=False)
    assert losses(run) == losses(ref)


# ----------------------------------------------------------------------------------------------
# activation checkpointing, regional compile, update periods


def _saved_bytes(model, x) -> int:
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x, targets=x).loss.backward()
    return total


@pytest.mark.parametrize("preset", ["transformer-tiny", "titans-mag-tiny"])
def test_activation_checkpointing_same_losses_less_memory(data_dir, tmp_path, preset):  # noqa: F811
    """train.activation_checkpointing=full: bitwise the same losses and weights, and the
    autograd graph keeps far fewer bytes between forward and backward."""
    from taperlm.models.layers import set_activation_checkpointing

    sets = [f"model.family={preset.split('-')[0]}", "train.tokens=768"]
    plain, ac = tmp_path / "plain", tmp_path / "ac"
    train(tiny_config(data_dir, *sets), plain, progress=False)
    train(tiny_config(data_dir, *sets, "train.activation_checkpointing=full"), ac, progress=False)
    assert losses(ac) == losses(plain)
    a, b = weights(ac, 3), weights(plain, 3)
    assert all(torch.equal(a[k], b[k]) for k in a)
    model = TaperedLM(get_preset(preset))
    x = torch.randint(0, 100, (2, 64))
    full = _saved_bytes(model, x)
    set_activation_checkpointing(model, True)
    assert _saved_bytes(model, x) < 0.5 * full


def test_regional_compile_compiles_each_block(data_dir, tmp_path, monkeypatch):  # noqa: F811
    """compile_scope=blocks compiles every block's forward in place (names unchanged) and trains
    to the eager losses; a compile failure falls back to eager for every block."""
    compiled = []

    def fake_compile(fn, *a, **k):
        compiled.append(fn)
        return fn  # the eager function: same numbers, no C++ build

    monkeypatch.setattr(torch, "compile", fake_compile)
    sets = ["train.compile=true", "train.compile_scope=blocks", "train.tokens=512"]
    trainer = Trainer(tiny_config(data_dir, *sets), tmp_path / "r")
    try:
        names = [n for n, _ in trainer.model.named_parameters()]
        assert len(compiled) == len(trainer.model.blocks)
        assert all("forward" in vars(b) for b in trainer.model.blocks)
        assert trainer.forward.compiled and trainer.forward.call is trainer.wrapped
        uncompile(trainer.model)
        assert not any("forward" in vars(b) for b in trainer.model.blocks)
        assert names == [n for n, _ in trainer.model.named_parameters()]
    finally:
        trainer.close()


def test_update_periods_survive_wrappers():
    """Periods are read by name before wrapping, so a wrapper that replaces the Parameter
    objects (as fully_shard does) keeps Hope's groups; reading them afterwards would not."""
    cfg = get_preset("hope-tiny")
    model = TaperedLM(cfg)
    periods = parameter_periods(model)
    assert set(periods.values()) == {4, 16} and len(periods) == 6 * 6
    for module in model.modules():  # what a wrapper does: new Parameter objects, no attributes
        for name, p in list(module.named_parameters(recurse=False)):
            setattr(module, name, torch.nn.Parameter(p.detach().clone()))
    assert parameter_periods(model) == {}
    groups = {
        (g["decay"], g["period"]): len(g["params"]) for g in param_groups(model, 0.1, periods)
    }
    assert groups == {
        (True, 1): 25,
        (False, 1): 14,
        (True, 4): 12,
        (False, 4): 6,
        (True, 16): 12,
        (False, 16): 6,
    }


def test_mixed_precision_policy_from_config(data_dir, tmp_path):  # noqa: F811
    """fsdp_param_dtype/fsdp_reduce_dtype resolve to FSDP2's policy (auto follows precision)."""
    cases = {
        ("auto", "auto", "fp32"): (None, None),
        ("bf16", "auto", "fp32"): (torch.bfloat16, torch.float32),
        ("fp32", "bf16", "fp32"): (torch.bfloat16, torch.float32),
        ("fp32", "fp32", "bf16"): (None, torch.bfloat16),
        ("bf16", "fp32", "bf16"): (None, torch.bfloat16),
    }
    for (precision, param, reduce), expected in cases.items():
        sets = [
            f"train.precision={precision}",
            f"train.fsdp_param_dtype={param}",
            f"train.fsdp_reduce_dtype={reduce}",
            "train.tokens=256",
        ]
        trainer = Trainer(tiny_config(data_dir, *sets), tmp_path / "-".join((precision, param)))
        try:
            policy = fsdp_mixed_precision(trainer.run, trainer.info)
        finally:
            trainer.close()
        assert (policy.param_dtype, policy.reduce_dtype) == expected, (precision, param, reduce)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("activation_checkpointing", "some"),
        ("compile_scope", "layers"),
        ("fsdp_param_dtype", "fp16"),
        ("fsdp_reduce_dtype", "auto"),
    ],
)
def test_scale_options_are_checked(data_dir, tmp_path, key, value):  # noqa: F811
    with raises_naming(ConfigError, f"train.{key}", f"'{value}'"):
        train(tiny_config(data_dir, f"train.{key}={value}"), tmp_path / "r", progress=False)


# ----------------------------------------------------------------------------------------------
# paired init (train.paired_init): common random numbers across widths


def _paired(preset: str, taper: str, seed: int = 3) -> torch.nn.Module:
    from taperlm.spec.taper import TaperSpec

    torch.manual_seed(seed)
    model = build_on_meta(get_preset(preset, TaperSpec.parse(taper)))
    return materialize(model, torch.device("cpu"), paired_seed=seed)


@pytest.mark.parametrize("preset", ["transformer-tiny", "hope-tiny", "titans-mag-tiny"])
def test_paired_init_shares_every_draw_the_shapes_allow(preset):
    """Uniform and tapered models of one seed: every same-shaped matrix is equal, and each
    layer's MLP (every CMS level for Hope) holds the leading hidden units of the wider one."""
    from taperlm.models.layers import SwiGLU

    u, t = _paired(preset, "uniform"), _paired(preset, "cosine:1.5:0.5")
    pu, pt = dict(u.named_parameters()), dict(t.named_parameters())
    mlps_u = {n: m for n, m in u.named_modules() if isinstance(m, SwiGLU)}
    mlps_t = {n: m for n, m in t.named_modules() if isinstance(m, SwiGLU)}
    assert mlps_u.keys() == mlps_t.keys() and mlps_u
    assert any(a.width != mlps_t[n].width for n, a in mlps_u.items())
    shared = 0
    for name, p in pu.items():
        if p.shape == pt[name].shape and p.dim() == 2:
            assert torch.equal(p, pt[name]), name
            shared += 1
    assert shared > 0
    for name, a in mlps_u.items():
        b = mlps_t[name]
        w = min(a.width, b.width)
        assert torch.equal(a.w_in.weight[:w], b.w_in.weight[:w])  # gate rows
        assert torch.equal(
            a.w_in.weight[a.width : a.width + w], b.w_in.weight[b.width : b.width + w]
        )
        assert torch.equal(a.w_out.weight[:, :w], b.w_out.weight[:, :w])  # down columns
    # another seed draws other weights; the default init draws other weights
    assert not torch.equal(_paired(preset, "uniform", seed=4).lm_head.weight, u.lm_head.weight)
    torch.manual_seed(3)
    plain = materialize(build_on_meta(get_preset(preset)), torch.device("cpu"))
    assert not torch.equal(plain.lm_head.weight, u.lm_head.weight)


def test_paired_init_has_the_default_distribution():
    """Same std per matrix as init_weights (depth-scaled for residual outputs), mean 0."""
    cfg = get_preset("transformer-small")
    torch.manual_seed(0)
    plain = TaperedLM(cfg)
    paired = _paired("transformer-small", "uniform", seed=0)
    for (name, a), (_, b) in zip(plain.named_parameters(), paired.named_parameters()):
        if a.dim() == 2:
            assert b.std().item() == pytest.approx(a.std().item(), rel=0.05), name
            assert abs(b.mean().item()) < 0.1 * a.std().item(), name
        else:
            assert torch.equal(a, b), name  # norms (and other non-matrix parts) untouched


def test_trainer_uses_paired_init(data_dir, tmp_path, monkeypatch):  # noqa: F811
    """train.paired_init reaches the model build (with the run's seed); off by default."""
    import taperlm.training.model as training_model

    seen = []

    def spy(model, device, paired_seed=None):
        seen.append(paired_seed)
        return materialize(model, device, paired_seed)

    monkeypatch.setattr(training_model, "materialize", spy)
    one_step = ("train.tokens=256", "train.eval_every=0", "train.checkpoint_every=0")
    train(tiny_config(data_dir, *one_step), tmp_path / "a", progress=False)
    cfg = tiny_config(data_dir, *one_step, "train.paired_init=true", "train.seed=7")
    train(cfg, tmp_path / "b", progress=False)
    assert seen == [None, 7]

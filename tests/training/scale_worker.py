"""torchrun worker for tests/training/test_train_distributed.py: FSDP2 checks that need several
processes but not a whole training run. Writes one JSON object per rank to argv[1]-<rank>.json.

* meta init: each family's model built on meta, sharded with fully_shard, materialised: every
  gathered parameter equals the whole CPU build after the same seed (bitwise), also with
  per-layer attention heads (a head taper) and per-layer KV heads (a KV taper);
* mixed precision: under the bf16 policy the blocks compute with bf16 weights (seen by a forward
  hook), the sharded parameters and their gradients stay fp32, and the policy's reduce dtype is
  the configured one; under the default policy everything is fp32;
* memory: bytes of the parameter, gradient and AdamW tensors this rank holds after one step,
  beside the planner's per-GPU figures (training/planner.py).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist


def meta_init_checks() -> dict[str, bool]:
    from taperlm.config.presets import get_preset
    from taperlm.models import TaperedLM
    from taperlm.training import distributed as D
    from taperlm.training.model import build_on_meta, materialize

    info = D.DistInfo(dist.get_rank(), dist.get_rank(), dist.get_world_size())
    configs = {}
    for preset in ("transformer-tiny", "hope-tiny", "titans-mac-tiny"):
        for tied in (False, True):
            cfg = get_preset(preset)
            cfg.tie_embeddings = tied
            configs[f"{preset} tied={tied}"] = cfg
    # per-layer heads (head taper, grouped-query): each block sharded at its own shape
    cfg = get_preset("transformer-tiny")
    cfg.n_kv_heads, cfg.head_taper, cfg.layer_heads = 2, "cosine", None
    configs["transformer-tiny head_taper=cosine gqa"] = cfg.resolve()
    assert len(set(cfg.layer_heads)) > 1
    # per-layer KV heads (KV taper) with the head taper: KV projections of their own shapes
    cfg = get_preset("transformer-tiny")
    cfg = cfg.with_taper(cfg.taper, head_taper="cosine", kv_taper="cosine:1.0:0.25")
    configs["transformer-tiny head_taper=cosine kv_taper=cosine:1.0:0.25"] = cfg
    assert len(set(cfg.layer_kv_heads)) > 1
    out = {}
    for name, cfg in configs.items():
        torch.manual_seed(11)
        ref = TaperedLM(cfg)
        torch.manual_seed(11)
        model = build_on_meta(cfg)
        D.wrap_model(model, "fsdp", info)
        materialize(model, torch.device("cpu"))
        sharded = all(hasattr(p, "device_mesh") for p in model.parameters())
        equal = all(
            torch.equal(p.full_tensor(), ref.get_parameter(n)) for n, p in model.named_parameters()
        )
        out[name] = sharded and equal
    return out


def mixed_precision_checks() -> dict[str, object]:
    from taperlm.config.presets import get_preset
    from taperlm.training import distributed as D
    from taperlm.training.model import build_on_meta, materialize

    info = D.DistInfo(dist.get_rank(), dist.get_rank(), dist.get_world_size())
    out: dict[str, object] = {}
    for name, dtypes in {
        "bf16": (torch.bfloat16, torch.float32),
        "fp32": (torch.float32,) * 2,
    }.items():
        torch.manual_seed(0)
        model = build_on_meta(get_preset("transformer-tiny"))
        D.wrap_model(model, "fsdp", info, D.mixed_precision_policy(*dtypes))
        materialize(model, torch.device("cpu"))
        seen: list[str] = []
        model.blocks[0].mlp.w_in.register_forward_pre_hook(
            lambda m, args, seen=seen: seen.append(str(m.weight.dtype))
        )
        x = torch.randint(0, 8192, (2, 16))
        loss = model(x, targets=x).loss
        loss.backward()
        policy = model.blocks[0]._get_fsdp_state()._mp_policy
        out[name] = {
            "compute_dtype": seen[0],
            "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
            "grad_dtypes": sorted({str(p.grad.dtype) for p in model.parameters()}),
            "reduce_dtype": str(policy.reduce_dtype),
            "finite": bool(torch.isfinite(loss)),
        }
    return out


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (FSDP2 keeps a block's gradient shards as
    views of one reduce-scatter output)."""
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in local}
    return sum(storages.values())


def memory_checks() -> dict[str, dict[str, list[int]]]:
    """{preset: {line: [measured, planned]}} for parameters, gradients, optimizer and the step
    guard's copy."""
    from taperlm.config.presets import get_preset
    from taperlm.training import distributed as D
    from taperlm.training.guard import StepGuard
    from taperlm.training.model import build_on_meta, materialize
    from taperlm.training.planner import GiB, plan_training

    info = D.DistInfo(dist.get_rank(), dist.get_rank(), dist.get_world_size())
    out = {}
    for preset in ("transformer-tiny", "hope-tiny", "titans-mag-tiny"):
        cfg = get_preset(preset)
        model = build_on_meta(cfg)
        D.wrap_model(model, "fsdp", info)
        materialize(model, torch.device("cpu"))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randint(0, cfg.vocab_size, (2, 32))
        model(x, targets=x).loss.backward()
        opt.step()
        params = list(model.parameters())
        guard = StepGuard(model, opt, keep_copy=True)  # train.restore_nonfinite's copy
        guard.before(params)
        measured = {
            "parameters": _storage_bytes(params),
            "gradients": _storage_bytes(p.grad for p in params),
            "optimizer": _storage_bytes(
                v for s in opt.state.values() for k, v in s.items() if k != "step"
            ),
            "step guard": _storage_bytes(b for b in guard._copies.values() if b.dim()),
        }
        plan = plan_training(cfg, info.world_size, 80 * GiB, 2, 32, parallel="fsdp")
        out[preset] = {k: [v, plan.lines[k]] for k, v in measured.items()}
    return out


def main() -> int:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    result = {
        "meta_init": meta_init_checks(),
        "mixed_precision": mixed_precision_checks(),
        "memory": memory_checks(),
    }
    with open(f"{sys.argv[1]}-{dist.get_rank()}.json", "w", encoding="utf-8") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

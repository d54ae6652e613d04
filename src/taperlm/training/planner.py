"""Per-GPU memory and wall-clock time of a training run, before it starts (`taperlm plan --gpus`).

Memory per GPU, in bytes (N = parameters, sharded sizes padded as FSDP2 pads them: each tensor's
first dimension is split in `gpus` chunks of ceil(rows / gpus) rows):

| line | FSDP2 (`fully_shard` per block + root) | DDP |
|---|---|---|
| parameters | fp32 shard, 4 x N/G | fp32, 4N |
| gradients | fp32 shard, 4 x N/G | fp32 4N + DDP's reduction buckets 4N |
| optimizer | AdamW exp_avg + exp_avg_sq, 8 x N/G | 8N |
| step guard | `train.restore_nonfinite` (default): the copy of weights and AdamW moments taken before each step (training/guard.py), 12 x N/G | 12N |
| working copies | params gathered in the compute dtype: the root (embedding, head, norm) for the whole step, two blocks at a time (one computing, one prefetched), one block's unsharded gradient | bf16 copies of the weights that autocast keeps for backward, 2N |
| activations | what autograd keeps for backward, per block, measured by running each distinct block once on fake tensors (no memory) in bf16 at the planned micro-batch; with activation checkpointing each block keeps only its input, plus one block recomputed at a time | same |
| logits | bf16 logits and their gradient [B, T, V] (the chunked loss adds one 64 MiB fp32 chunk), the final norm's fp32 input and the head's input | same |
| runtime reserve | CUDA context, NCCL buffers, allocator fragmentation: 2 GiB + 5 % (assumed, not derived) | same |

Time: `tokens x flops_per_token / (gpus x peak x mfu)` with `taperlm.config.budget.flops_per_token`
(6N + attention, model FLOPs); activation checkpointing recomputes the forward pass, so its time
is x4/3 at the same hardware utilisation. Disk: token shards (2 bytes per token for vocabularies
up to 65536, else 4), and a checkpoint = fp32 weights + AdamW moments (12 bytes per parameter).

The parameter, gradient, optimizer and step guard lines are checked against the tensors a CPU
run allocates (tests/training/test_train_distributed.py, 2 gloo ranks, and the 440M dry run in
docs/scaling.md).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from taperlm.config import ModelConfig
from taperlm.config.budget import flops_per_token
from taperlm.errors import ConfigError

GiB = 1 << 30
RESERVE_BYTES = 2 * GiB
RESERVE_FRACTION = 0.05
CHUNK_BYTES = 4 * (1 << 24)  # the chunked loss's fp32 chunk (models/loss.py)
PARALLEL = ("fsdp", "ddp")


def parse_bytes(text: str) -> int:
    """'80GB' | '80GiB' | '80' (GiB) | '81920MB' -> bytes (GB is read as GiB, as GPUs are sold)."""
    s = str(text).strip().upper().replace(" ", "")
    units = {"TIB": 1 << 40, "TB": 1 << 40, "GIB": GiB, "GB": GiB, "MIB": 1 << 20, "MB": 1 << 20}
    for unit, scale in units.items():
        if s.endswith(unit):
            s, mult = s[: -len(unit)], scale
            break
    else:
        mult = GiB
    try:
        value = float(s)
    except ValueError:
        raise ConfigError(
            f"--gpu-memory {text!r} is not a size; write e.g. 80GB, 141GB or 40960MB"
        ) from None
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"--gpu-memory must be positive, got {text!r}")
    return int(value * mult)


@dataclass
class MemoryPlan:
    """What `plan_training` computes; byte figures are per GPU (the largest shard)."""

    family: str
    params_total: int
    gpus: int
    parallel: str
    micro_batch: int
    seq_len: int
    activation_checkpointing: bool
    gpu_memory: int
    lines: dict[str, int] = field(default_factory=dict)
    accumulation: int | None = None
    tokens: int = 0
    flops_per_token: int = 0
    mfu: float = 0.4
    peak_flops: float = 989e12
    seconds: float = 0.0
    token_disk_bytes: int = 0
    checkpoint_bytes: int = 0
    keep_checkpoints: int = 2
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.lines.values())

    @property
    def fits(self) -> bool:
        return self.total <= self.gpu_memory

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total, "fits": self.fits}


# ----------------------------------------------------------------------------------------------
# parameters and their shards


def parameter_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """{name: shape} of every distinct parameter (a tied head counted once), from a model built
    on the meta device (no memory)."""
    from taperlm.training.model import build_on_meta  # lazy: plan stays torch-free

    model = build_on_meta(cfg)
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


def shard_numel(shape: tuple[int, ...], gpus: int) -> int:
    """Elements of the largest FSDP2 shard of a tensor (dim 0 split, padded to equal chunks)."""
    rows = shape[0] if shape else 1
    rest = math.prod(shape[1:]) if len(shape) > 1 else 1
    return math.ceil(rows / gpus) * rest


def _groups(shapes: dict[str, tuple[int, ...]]) -> tuple[int, list[int]]:
    """(parameters of the root group, parameters of each block)."""
    blocks: dict[int, int] = {}
    root = 0
    for name, shape in shapes.items():
        n = math.prod(shape)
        if name.startswith("blocks."):
            i = int(name.split(".")[1])
            blocks[i] = blocks.get(i, 0) + n
        else:
            root += n
    return root, [blocks[i] for i in sorted(blocks)]


# ----------------------------------------------------------------------------------------------
# activations: run each distinct block once on fake tensors and count what autograd keeps


def block_activation_bytes(cfg: ModelConfig, layer: int, batch: int, seq_len: int) -> int:
    """Bytes autograd keeps for the backward pass of block `layer` on a [batch, seq_len] input,
    computing in bf16 (parameters and buffers excluded)."""
    import torch  # lazy: plan stays torch-free (this runs only for memory plans)
    from torch._subclasses.fake_tensor import FakeTensorMode  # lazy: as torch above

    from taperlm.models.layers import Rotary  # lazy: torch
    from taperlm.models.lm import TaperedLM  # lazy: torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # build the block as FSDP2's bf16 policy computes it
    try:
        with torch.device("meta"):
            rotary = Rotary.of_model(cfg, max(cfg.context_length, seq_len))
            block = dict(TaperedLM.parts(cfg, rotary))[f"blocks.{layer}"]()
    finally:
        torch.set_default_dtype(previous)
    kept: dict[int, int] = {}
    with FakeTensorMode(allow_non_fake_inputs=True):
        block.to_empty(device="cpu")
        own = {t.untyped_storage()._cdata for t in [*block.parameters(), *block.buffers()]}

        def pack(t: torch.Tensor) -> torch.Tensor:
            key = t.untyped_storage()._cdata
            if key not in own:
                kept[key] = max(kept.get(key, 0), t.untyped_storage().nbytes())
            return t

        x = torch.empty(batch, seq_len, cfg.d_model, dtype=torch.bfloat16, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            block(x)
    return sum(kept.values())


def activation_bytes(
    cfg: ModelConfig, batch: int, seq_len: int, shapes: dict[str, tuple[int, ...]] | None = None
) -> list[int]:
    """`block_activation_bytes` of every layer (layers of identical parameter shapes traced once)."""
    shapes = parameter_shapes(cfg) if shapes is None else shapes
    cache: dict[str, int] = {}
    out = []
    for layer in range(cfg.n_layers):
        prefix = f"blocks.{layer}."
        key = repr(sorted((n[len(prefix) :], s) for n, s in shapes.items() if n.startswith(prefix)))
        if key not in cache:
            cache[key] = block_activation_bytes(cfg, layer, batch, seq_len)
        out.append(cache[key])
    return out


# ----------------------------------------------------------------------------------------------
# the plan


def plan_training(
    cfg: ModelConfig,
    gpus: int,
    gpu_memory: int,
    micro_batch: int,
    seq_len: int,
    parallel: str = "fsdp",
    activation_checkpointing: bool = False,
    tokens: int = 0,
    batch_tokens: int | None = None,
    mfu: float = 0.4,
    peak_flops: float = 989e12,
    keep_checkpoints: int = 2,
    restore_nonfinite: bool = True,
) -> MemoryPlan:
    """Per-GPU memory and the run's time on `gpus` GPUs (see the module docstring)."""
    for key, value in (("--gpus", gpus), ("--micro-batch", micro_batch), ("--seq-len", seq_len)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    if parallel not in PARALLEL:
        raise ConfigError(f"--parallel {parallel!r} is unknown; choose fsdp or ddp")
    if not 0 < mfu <= 1:
        raise ConfigError(f"--mfu must be in (0, 1], got {mfu}")
    cfg.resolve()
    n, lines = _memory_lines(
        cfg, gpus, micro_batch, seq_len, parallel, activation_checkpointing, restore_nonfinite
    )
    tokens_per_micro = micro_batch * seq_len
    plan = MemoryPlan(
        family=cfg.family,
        params_total=n,
        gpus=gpus,
        parallel=parallel,
        micro_batch=micro_batch,
        seq_len=seq_len,
        activation_checkpointing=activation_checkpointing,
        gpu_memory=gpu_memory,
        lines=lines,
        tokens=tokens,
        flops_per_token=flops_per_token(cfg, seq_len),
        mfu=mfu,
        peak_flops=peak_flops,
        keep_checkpoints=keep_checkpoints,
    )
    per_step = tokens_per_micro * gpus
    if batch_tokens:
        if batch_tokens % per_step:
            plan.notes.append(
                f"train.batch_tokens {batch_tokens:,} is not a multiple of micro-batch x seq-len "
                f"x gpus = {per_step:,}; training would refuse it"
            )
        else:
            plan.accumulation = batch_tokens // per_step
    recompute = 4 / 3 if activation_checkpointing else 1.0
    plan.seconds = tokens * plan.flops_per_token * recompute / (gpus * peak_flops * mfu)
    plan.token_disk_bytes = tokens * (2 if cfg.vocab_size <= 65536 else 4)
    plan.checkpoint_bytes = 12 * n
    _add_fit_notes(plan, activation_checkpointing, restore_nonfinite)
    return plan


# The MFU `taperlm compare --dry-run` assumes: transformer-440m compiled on one H200, bf16, at
# 2K context (docs/scaling.md, "Verified on one H200"), of the dense bf16 peak of an H100/H200.
MEASURED_MFU = 0.395
H100_PEAK_FLOPS = 989e12


def gpu_hours(
    cfg: ModelConfig,
    tokens: int,
    seq_len: int,
    mfu: float = MEASURED_MFU,
    peak_flops: float = H100_PEAK_FLOPS,
) -> float:
    """GPU-hours of training `cfg` on `tokens` tokens: the time formula of `plan_training`
    (the module docstring) times its GPUs, which does not depend on how many there are."""
    return tokens * flops_per_token(cfg, seq_len) / (peak_flops * mfu) / 3600.0


def _memory_lines(
    cfg: ModelConfig,
    gpus: int,
    micro_batch: int,
    seq_len: int,
    parallel: str,
    activation_checkpointing: bool,
    restore_nonfinite: bool,
) -> tuple[int, dict[str, int]]:
    """(parameters in all, per-GPU bytes by line) of a resolved model config."""
    shapes = parameter_shapes(cfg)
    n = sum(math.prod(s) for s in shapes.values())
    sharded = parallel == "fsdp" and gpus > 1
    local = sum(shard_numel(s, gpus) for s in shapes.values()) if sharded else n
    root, blocks = _groups(shapes)
    tokens_per_micro = micro_batch * seq_len
    acts = activation_bytes(cfg, micro_batch, seq_len, shapes)
    if activation_checkpointing:
        act = cfg.n_layers * tokens_per_micro * cfg.d_model * 2 + max(acts)
    else:
        act = sum(acts)
    ddp = parallel == "ddp" and gpus > 1
    lines = {
        "parameters": 4 * local,
        "gradients": 8 * n if ddp else 4 * local,
        "optimizer": 8 * local,
        **({"step guard": 12 * local} if restore_nonfinite else {}),
        "working copies": 2 * (root + 3 * max(blocks)) if sharded else 2 * n,
        "activations": act,
        "logits": tokens_per_micro * (4 * cfg.vocab_size + 6 * cfg.d_model) + CHUNK_BYTES,
    }
    subtotal = sum(lines.values())
    lines["runtime reserve"] = RESERVE_BYTES + int(RESERVE_FRACTION * subtotal)
    return n, lines


def _add_fit_notes(plan: MemoryPlan, activation_checkpointing: bool, restore_nonfinite: bool):
    """What to change when the plan does not fit."""
    if not plan.fits and not activation_checkpointing:
        plan.notes.append("does not fit: add --activation-checkpointing or lower --micro-batch")
    elif not plan.fits:
        plan.notes.append("does not fit: lower --micro-batch or use more GPUs (FSDP)")
    if not plan.fits and restore_nonfinite:
        plan.notes.append(
            "train.restore_nonfinite false drops the step guard's copy (a step that leaves "
            "NaN/inf in the weights then stops the run instead of being skipped)"
        )


def _gib(b: int) -> str:
    return f"{b / GiB:8.2f} GiB"


def _duration(seconds: float) -> str:
    h = seconds / 3600
    return f"{h:,.1f} h ({h / 24:,.2f} days)" if h >= 1 else f"{seconds / 60:,.1f} min"


def format_memory_plan(p: MemoryPlan) -> str:
    compute = "bf16 compute"
    how = {
        "parameters": "fp32" + (", sharded" if p.parallel == "fsdp" and p.gpus > 1 else ""),
        "gradients": "fp32"
        + {True: ", sharded", False: " + DDP buckets" if p.gpus > 1 else ""}[
            p.parallel == "fsdp" and p.gpus > 1
        ],
        "optimizer": "AdamW moments, fp32",
        "step guard": "copy of both for train.restore_nonfinite",
        "working copies": "bf16 gathered / cast weights",
        "activations": "kept for backward"
        + (", checkpointed per block" if p.activation_checkpointing else ""),
        "logits": "bf16 logits + gradient",
        "runtime reserve": "assumed: 2 GiB + 5%",
    }
    out = [
        f"per-GPU memory: {p.family}, {p.params_total / 1e6:,.1f}M parameters, {p.parallel} on "
        f"{p.gpus} GPU(s), micro-batch {p.micro_batch} x {p.seq_len} tokens, {compute}",
    ]
    for key, value in p.lines.items():
        out.append(f"  {key:<17}{_gib(value)}   {how.get(key, '')}")
    verdict = "fits" if p.fits else "DOES NOT FIT"
    out.append(f"  {'total':<17}{_gib(p.total)}   of {p.gpu_memory / GiB:.0f} GiB: {verdict}")
    if p.accumulation is not None:
        out.append(f"gradient accumulation: {p.accumulation} micro-batch(es) per optimizer step")
    if p.tokens:
        out += [
            f"time: {p.tokens:,} tokens x {p.flops_per_token:,} FLOPs/token at {100 * p.mfu:.0f}% "
            f"MFU of {p.gpus} x {p.peak_flops / 1e12:,.0f} TFLOP/s"
            + (" (x4/3 recompute)" if p.activation_checkpointing else "")
            + f": {_duration(p.seconds)}",
            f"disk: tokens {p.token_disk_bytes / 1e9:,.1f} GB; one checkpoint "
            f"{p.checkpoint_bytes / 1e9:,.2f} GB (fp32 weights + AdamW), x{p.keep_checkpoints} kept",
        ]
    out += [f"note: {n}" for n in p.notes]
    return "\n".join(out)

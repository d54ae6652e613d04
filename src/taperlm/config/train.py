"""The data and training sections: `DataConfig` and `TrainConfig`, every field with its domain."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from taperlm.spec.domains import (
    MAX_BATCH,
    MAX_CONTEXT,
    MAX_COUNT,
    MAX_SEED,
    MAX_TOKENS,
    setting,
    up_to,
)

# The closed sets of the train section, each declared once: the field's type, its domain and
# any command-line option's choices (`taperlm.spec.domains.choices`).
LRScheduleName = Literal["cosine", "wsd"]
Precision = Literal["auto", "fp32", "bf16"]
CompileScope = Literal["model", "blocks"]
ActivationCheckpointing = Literal["none", "full"]
Parallel = Literal["ddp", "fsdp"]
FSDPParamDtype = Literal["auto", "bf16", "fp32"]
FSDPReduceDtype = Literal["fp32", "bf16"]
Device = Literal["auto", "cpu", "cuda"]
Logger = Literal["tensorboard", "wandb"]


@dataclass
class DataConfig:
    """Where training tokens come from."""

    dir: str = setting("", "text", runtime=True)
    """folder written by `taperlm prepare` (shards, meta.json, tokenizer/); a resumed run may read
    the same data from another folder (`runtime=True`).
    """


@dataclass
class TrainConfig:
    """The training loop.

    Every field declares its allowed values beside it (`taperlm.spec.domains.setting`), and a field
    marked `runtime=True` may change when a run is resumed: it affects speed, logging or where
    things run, not which updates are made (up to floating-point reordering).
    """

    seed: int = setting(0, f"[0, {MAX_SEED}]")
    """seed of init, data order and dropout-free RNG streams."""
    paired_init: bool = False
    """draw every weight matrix from its own stream keyed by (seed, parameter name), the SwiGLU MLPs
    in blocks of 16 hidden units, instead of one sequential stream: the same distribution, but
    models that differ only in per-layer widths start from the same weights wherever their shapes
    agree (the common random numbers of a paired comparison: `--set train.paired_init=true` in
    `taperlm compare`).
    """
    tokens: int = setting(62 * 16384, up_to(MAX_TOKENS))  # ~1M: whole steps of the default batch
    """total training tokens; the run makes tokens / batch_tokens optimizer steps, rounded up to a
    whole step (the trainer says so when it rounds).
    """
    batch_tokens: int = setting(16384, up_to(MAX_TOKENS))
    """global batch in tokens per optimizer step (across ranks and micro-batches)."""
    micro_batch_size: int = setting(8, up_to(MAX_BATCH))
    """sequences per forward pass per rank (accumulation fills the global batch)."""
    seq_len: int = setting(256, up_to(MAX_CONTEXT))
    """training sequence length (<= model.context_length)."""
    lr: float = setting(4e-4, "(0, inf)")
    """peak learning rate."""
    schedule: LRScheduleName = setting("cosine", LRScheduleName)
    """the LR schedule after the linear warmup: cosine (decay from lr to min_lr_ratio x lr over the
    rest of the run) | wsd (warmup-stable-decay: lr held until the last decay_fraction of the
    steps, then a linear decay to min_lr_ratio x lr; the LR before the decay does not depend on
    train.tokens, so a checkpoint of a longer run taken before this run's decay starts is this
    run's own state there: one run serves several budgets, each a short cooldown branch,
    `taperlm.training.run_dir`).
    """
    decay_fraction: float = setting(0.2, "(0, 1]")
    """wsd: the share of the steps in the final decay (rounded up to whole steps)."""
    min_lr_ratio: float = setting(0.1, "[0, 1]")
    """the decay's floor as a fraction of lr."""
    warmup_tokens: int = setting(100_000, up_to(MAX_TOKENS, 0))
    """linear warmup length in tokens."""
    weight_decay: float = setting(0.1, "[0, inf)")
    """AdamW decay on matrices (embeddings, norms and biases get none)."""
    beta1: float = setting(0.9, "[0, 1)")
    """AdamW's decay of the gradient's running mean (first moment)."""
    beta2: float = setting(0.95, "[0, 1)")
    """AdamW's decay of the squared gradient's running mean (second moment)."""
    eps: float = setting(1e-8, "(0, inf)")
    """AdamW's epsilon added to the second moment's square root."""
    grad_clip: float = setting(1.0, "[0, inf)")
    """max global grad norm (0 disables)."""
    precision: Precision = setting("auto", Precision, runtime=True)
    """auto | fp32 | bf16 (auto = bf16 autocast on CUDA, fp32 on CPU)."""
    compile: bool = field(default=False, metadata={"runtime": True})
    """compile the model with torch.compile (see compile_scope)."""
    compile_scope: CompileScope = setting("model", CompileScope, runtime=True)
    """model (one graph for the whole model) | blocks (each block compiled on its own, "regional":
    faster to compile, one recompile per distinct block shape).
    """
    activation_checkpointing: ActivationCheckpointing = setting(
        "none", ActivationCheckpointing, runtime=True
    )
    """none | full (keep only each block's input for backward and recompute the block; same losses,
    less activation memory, ~1/3 more compute).
    """
    parallel: Parallel = setting("ddp", Parallel, runtime=True)
    """ddp | fsdp (under torchrun; ignored for one process)."""
    fsdp_param_dtype: FSDPParamDtype = setting("auto", FSDPParamDtype, runtime=True)
    """auto | bf16 | fp32: dtype FSDP2 gathers parameters in for compute (auto = bf16 when the run
    computes in bf16, else fp32). Sharded weights, gradients and optimizer state stay fp32.
    """
    fsdp_reduce_dtype: FSDPReduceDtype = setting("fp32", FSDPReduceDtype, runtime=True)
    """fp32 | bf16: dtype FSDP2 reduce-scatters gradients in."""
    async_checkpoint: bool = field(default=False, metadata={"runtime": True})
    """write checkpoint shards in a background thread while training goes on (committed once every
    rank has written; the final checkpoint is synchronous).
    """
    device: Device = setting("auto", Device, runtime=True)
    """auto | cpu | cuda."""
    eval_every: int = setting(50, up_to(MAX_COUNT, 0), runtime=True)
    """steps between validation-loss evaluations (0 = only at the end)."""
    eval_tokens: int = setting(65536, up_to(MAX_TOKENS, 0), runtime=True)
    """validation tokens per evaluation (0 = no validation)."""
    checkpoint_every: int = setting(100, up_to(MAX_COUNT, 0), runtime=True)
    """steps between checkpoints (0 = only at the end)."""
    keep_checkpoints: int = setting(2, up_to(MAX_COUNT), runtime=True)
    """keep the newest k checkpoints."""
    log_every: int = setting(10, up_to(MAX_COUNT, 0), runtime=True)
    """steps between metric lines (0 = only at the end)."""
    max_bad_steps: int = setting(5, up_to(MAX_COUNT), runtime=True)
    """consecutive non-finite steps tolerated before the run stops."""
    peak_flops: float | None = setting(None, "(0, inf)", runtime=True)
    """peak FLOP/s of one device for MFU (null = the built-in table on CUDA, no MFU on CPU)."""
    restore_nonfinite: bool = field(default=True, metadata={"runtime": True})
    """keep a copy of the weights and optimizer state from before each step, so that a step that
    leaves a NaN/inf in them (with a finite loss) is undone and skipped like a non-finite loss
    (one more copy of both in device memory); false: such a step stops the run instead. Either
    way no non-finite state is checkpointed.
    """
    loggers: list[Logger] = setting([], Logger, runtime=True)
    """live loggers beside RUN/metrics.jsonl: any of tensorboard (RUN/tensorboard), wandb (Weights &
    Biases; offline without credentials or with WANDB_MODE=offline); rank 0 only; a failing
    logger is a warning, never a stop (docs/training.md).
    """
    log_grads_every: int = setting(100, up_to(MAX_COUNT, 0), runtime=True)
    """steps between per-layer gradient norms in metrics.jsonl and the loggers (0 = never)."""
    log_project: str = setting("taperlm", "text", runtime=True)
    """the W&B project."""
    log_group: str = setting("", "text", runtime=True)
    """the W&B group of the run (empty = none; `taperlm compare` groups its cells)."""
    log_name: str = setting("", "text", runtime=True)
    """the logged run's name (empty = the run dir's name)."""
    init_from: str = setting("", "text")
    """a run dir or checkpoint whose weights the run starts from instead of the seed's
    initialisation (e.g. a model written by `taperlm prune`); its model config must equal this
    run's. Read at step 0 only (a resume reads its own checkpoint).
    """
    distill_from: str = setting("", "text", runtime=True)
    """a teacher to distil from (a run dir, its newest checkpoint, or a checkpoint dir) with the
    same vocabulary; empty = plain language-model loss. The loss is distill_mix x T^2 x
    KL(teacher || student, both at temperature T = distill_temperature) + (1 - distill_mix) x the
    LM loss, on the same tokens; the teacher runs in eval mode without gradients, one copy per
    rank. The path may change between resumes (`runtime=True`); the teacher's identity (the
    sha256 of its checkpoint's manifest, which pins every file) is saved in each checkpoint and a
    resume with another teacher is refused.
    """
    distill_temperature: float = setting(1.0, "[0.01, 100]")
    """T of the distillation loss (both distributions softened by T; the KL term is scaled by T^2 so
    its gradient keeps its size as T changes). Distillation uses T of about 1 to 20; far outside
    [0.01, 100] the loss leaves fp32 (T = 1e30 makes T^2 infinite, T = 1e-30 the logits / T), and
    the run would stop on a NaN loss blaming the weights.
    """
    distill_mix: float = setting(0.5, "[0, 1]")
    """weight of the KL term, in [0, 1] (1 = distillation only, 0 = LM loss only)."""

    @property
    def steps(self) -> int:
        """Optimizer steps: `tokens / batch_tokens` rounded up to a whole step, so a run trains
        at least the tokens asked for (40,960 tokens in batches of 16,384 = 3 steps, 49,152)."""
        return max(1, -(-int(self.tokens) // int(self.batch_tokens)))

    def rounding_note(self) -> str | None:
        """What rounding `tokens` up to whole steps changed, or None when nothing was."""
        trained = self.steps * self.batch_tokens
        if trained == self.tokens:
            return None
        return (
            f"train.tokens {self.tokens:,} is not a whole number of steps of train.batch_tokens "
            f"{self.batch_tokens:,}: training {self.steps} steps = {trained:,} tokens (rounded up)"
        )

"""A run's settings before anything is built: the checks between its train fields and the world
size (every declared domain, seq_len within the model's context, at least one batch, a batch that
splits into whole micro-batches on every rank), and the key-by-key differences between two
configs that a resume, a cooldown branch or a checkpoint load compare, in one wording.

Torch-free: `taperlm compare` checks a job and words its conflicts before it imports torch."""

from __future__ import annotations

from taperlm.config import RunConfig, TrainConfig
from taperlm.errors import ConfigError


def accumulation_steps(cfg: TrainConfig, world_size: int) -> int:
    """Micro-batches per rank per optimizer step; ConfigError listing valid batch sizes."""
    per_micro = cfg.seq_len * cfg.micro_batch_size * world_size
    if cfg.batch_tokens < per_micro or cfg.batch_tokens % per_micro:
        ok = ", ".join(str(per_micro * k) for k in (1, 2, 4, 8, 16))
        raise ConfigError(
            f"train.batch_tokens ({cfg.batch_tokens}) must be a positive multiple of "
            f"train.seq_len x train.micro_batch_size x world size = {cfg.seq_len} x "
            f"{cfg.micro_batch_size} x {world_size} = {per_micro}; valid values: {ok}, ... "
            "(or change micro_batch_size / seq_len)"
        )
    return cfg.batch_tokens // per_micro


def validate_train_config(run: RunConfig, world_size: int = 1) -> None:
    """Every declared domain (`taperlm.spec.domains`), then the checks between train fields."""
    run.validate()
    t = run.train
    if t.seq_len > run.model.context_length:
        raise ConfigError(
            f"train.seq_len ({t.seq_len}) exceeds model.context_length "
            f"({run.model.context_length}); lower seq_len or raise context_length"
        )
    if t.tokens < t.batch_tokens:
        raise ConfigError(
            f"train.tokens ({t.tokens}) is less than one batch (train.batch_tokens = "
            f"{t.batch_tokens}); raise tokens or lower batch_tokens"
        )
    accumulation_steps(t, world_size)

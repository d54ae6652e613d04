"""Training from another model's weights: the start (`train.init_from`) and the teacher of a
distilled run (`train.distill_from`), each loaded from a run dir or a checkpoint dir, with the
identity of the checkpoint read (the sha256 of its manifest, which lists the sha256 of every
file in it), so that a resume can refuse a different teacher.

The teacher is one full copy per rank (never sharded or wrapped), in eval mode with gradients
off; its logits on the student's own micro-batch give the KL term of the loss
(`taperlm.models.loss.distillation_kl`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from taperlm.checkpoint import store
from taperlm.checkpoint.loading import load_run_model
from taperlm.config import (
    ModelConfig,
    RunConfig,
    config_differences,
    format_differences,
    from_dict,
    to_dict,
)
from taperlm.errors import CheckpointError, ConfigError
from taperlm.files.io import sha256_file
from taperlm.models.loss import distillation_kl
from taperlm.training import distributed as D


def resolve_checkpoint(path: str | Path, what: str) -> Path:
    """The checkpoint directory that `path` names: itself, or a run dir's newest complete one."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"{what} {p} does not exist; give a run dir or a checkpoint dir")
    if (p / store.MANIFEST_FILE).is_file():
        return p
    found = store.find_checkpoint(p)
    if found is None:
        raise CheckpointError(f"{what} {p} has no usable checkpoint; give a trained run dir")
    return found


def checkpoint_identity(ckpt: Path) -> str:
    """sha256 of a checkpoint's manifest (the manifest pins every file by its own sha256)."""
    return sha256_file(ckpt / store.MANIFEST_FILE)


@dataclass
class Teacher:
    """The model distilled from, its checkpoint, identity, and the loss's settings."""

    model: torch.nn.Module
    checkpoint: Path
    identity: str
    temperature: float
    mix: float

    @classmethod
    def load(cls, run: RunConfig, device: torch.device) -> Teacher:
        """The teacher of `run` (train.distill_from) on `device`, checked against the student."""
        cfg = run.train
        ckpt = resolve_checkpoint(cfg.distill_from, "train.distill_from")
        model, teacher_run = load_run_model(ckpt, device=str(device))
        if teacher_run.model.vocab_size != run.model.vocab_size:
            raise ConfigError(
                f"train.distill_from {cfg.distill_from}: the teacher's vocabulary "
                f"({teacher_run.model.vocab_size}) is not the student's "
                f"({run.model.vocab_size}); distil from a model of the same tokenizer"
            )
        store.require_finite(
            model.state_dict().items(),
            f"train.distill_from {ckpt}",
            "Distil from another checkpoint of that run",
        )
        model.eval().requires_grad_(False)
        return cls(model, ckpt, checkpoint_identity(ckpt), cfg.distill_temperature, cfg.distill_mix)

    @torch.no_grad()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).logits

    def loss(
        self, student_logits: torch.Tensor, lm_loss: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        """mix x T^2 KL(teacher || student) + (1 - mix) x LM loss on micro-batch (x, y)."""
        kl = distillation_kl(student_logits, self.logits(x), y, self.temperature)
        if self.mix == 1.0:  # no LM term at all (0 x a non-finite LM loss would be NaN)
            return kl
        return self.mix * kl + (1.0 - self.mix) * lm_loss


def check_same_teacher(saved: str | None, now: str | None, path: Path, where: str) -> None:
    """CheckpointError when checkpoint `path` was trained with another teacher (or none) than
    the one this run now has (`now`; None: no teacher)."""
    if saved == now:
        return
    before = f"teacher {saved[:12]}" if saved else "no teacher"
    after = f"the teacher {where} ({now[:12]})" if now else "no teacher"
    raise CheckpointError(
        f"cannot resume from {path}: it was trained with {before}, but this run now has "
        f"{after}; resume with the same train.distill_from checkpoint, or train into a fresh "
        "--out"
    )


def load_initial_weights(run: RunConfig, model: torch.nn.Module) -> str:
    """Load train.init_from's weights into `model` (any wrapping: full state, every rank);
    returns the identity of the checkpoint read. Its model config must equal the run's."""
    ckpt = resolve_checkpoint(run.train.init_from, "train.init_from")
    manifest = store.verify_checkpoint(ckpt)
    saved = (manifest.get("run_config") or {}).get("model")
    if saved is None:
        raise CheckpointError(f"train.init_from {ckpt}: its manifest names no model config")
    theirs = to_dict(from_dict(ModelConfig, saved, "model").resolve())
    diffs = config_differences(theirs, to_dict(run.model), "model.")
    if diffs:
        raise ConfigError(
            f"train.init_from {ckpt} is another model: "
            + format_differences(diffs, "init_from", "run")
            + "; train with its own model config (`--init-from` alone uses it)"
        )
    state: dict[str, Any] = store.load_model_state(ckpt, verify=False)
    store.require_finite(
        state.items(), f"train.init_from {ckpt}", "Start from another checkpoint of that run"
    )
    D.load_full_model_state(model, state)
    return checkpoint_identity(ckpt)

"""A run that starts from given weights rather than from an initialisation: its directory holds
what `taperlm train` writes for a run at step 0 — config.yaml, a checkpoint `step_00000000`
(the weights, a fresh AdamW with no moments yet, the data position at the first sample, the
generators as the seed sets them) and the tokenizer the weights were trained with, in
`RUN/tokenizer/` — so `eval`, `export`, `generate` and `novelty` load it like any run, and
`taperlm train --out RUN --data DATA` continues training it from those weights (deterministically:
everything it resumes from is a function of the config). Used by `taperlm import`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from taperlm.config import RunConfig, save_yaml, to_dict
from taperlm.data.identity import TOKENIZER_COPY
from taperlm.errors import CheckpointError
from taperlm.models import TaperedLM
from taperlm.outdirs import KINDS
from taperlm.runlock import LOCK_FILE
from taperlm.training import distributed as D
from taperlm.training.checkpoint import store
from taperlm.training.checkpoint.dcp import training_state
from taperlm.training.checkpoint.saver import ShardedCheckpointer
from taperlm.training.optim import LRSchedule, build_optimizer, parameter_periods
from taperlm.training.rng_state import rng_state, seed_everything, set_rng_state
from taperlm.training.run_dir import RunDir
from taperlm.training.train_checks import validate_train_config


def write_start_run(
    out: str | Path,
    run: RunConfig,
    weights: dict[str, torch.Tensor],
    tokenizer: Any | None = None,
) -> Path:
    """Write run directory `out` (new, or empty) whose step-0 checkpoint holds `weights` (a
    `TaperedLM` state dict of `run.model`, loaded strictly) and whose tokenizer is `tokenizer`.
    Takes the run's lock while writing; a failure removes what this call wrote (and the folder,
    when it created it), so no half-written run is left behind."""
    out = Path(out)
    run = run.resolve()
    validate_train_config(run, 1)  # what `train` would refuse when it continues, refused now
    # Built without drawing an initialisation (the weights replace it; a 7B draw takes minutes
    # and would move the caller's generators): on the meta device, then given storage. Only the
    # persistent tensors matter here (they are what the checkpoint holds), and `weights` fills
    # every one of them (a strict load).
    with torch.device("meta"):
        model = TaperedLM(run.model)
    model.to_empty(device="cpu")
    if run.model.tie_embeddings:
        model.lm_head.weight = model.embed.weight  # to_empty made each its own tensor
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:
        raise CheckpointError(
            f"the weights do not fit the model: {str(err).splitlines()[0]}"
        ) from None
    info = D.DistInfo()
    before = {p.name for p in out.iterdir()} if out.is_dir() else set()
    run_dir = RunDir(out)
    run_dir.take(info)
    try:
        if store.list_checkpoints(out):
            raise CheckpointError(f"{out} already holds checkpoints; choose a new --out folder")
        periods = parameter_periods(model)
        optimizer = build_optimizer(model, run.train, torch.device("cpu"), periods)
        periodic = [(n, p) for n, p in model.named_parameters() if n in periods]
        caller = rng_state()
        seed_everything(run.train.seed)  # what a fresh run's generators start from
        seeded = rng_state()
        set_rng_state(caller)  # the caller's generators are left as they were
        state = {
            "step": 0,
            "tokens": 0,
            "skipped_steps": 0,
            "bad_streak": 0,
            "scheduler": LRSchedule.from_config(run.train, run.train.steps).state_dict(),
            # The first sample of the seed's order; the loader checks split, seed and seq_len
            # against the data it is given when the run continues.
            "loader": [
                {
                    "split": "train",
                    "seed": run.train.seed,
                    "seq_len": run.train.seq_len,
                    "sample": 0,
                }
            ],
            "rng": seeded,
            "world_size": 1,
            "last_loss": None,
            "last_val_loss": None,
        }
        tensors = training_state(model, optimizer, periodic)
        # DCP's state dict fills an empty optimizer by one step at lr 0 (zero moments, but
        # `step` 1, which would shrink the first real update through Adam's bias correction);
        # step 0 with zero moments is exactly the state a fresh AdamW makes at its first step.
        for param_state in tensors["optimizer"]["state"].values():
            for key in ("exp_avg", "exp_avg_sq", "step"):
                if isinstance(param_state.get(key), torch.Tensor):
                    param_state[key].zero_()
        saver = ShardedCheckpointer(out, info)
        saver.save(
            0,
            tensors,
            state,
            to_dict(run),
            run.train.keep_checkpoints,
        )
        saver.finish()
        if tokenizer is not None:
            tokenizer.save(out / TOKENIZER_COPY)
        save_yaml(run, out / "config.yaml")
    except BaseException:
        for name in (store.CHECKPOINT_DIR, TOKENIZER_COPY, "config.yaml"):
            path = out / name
            if name not in before and path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            elif name not in before:
                path.unlink(missing_ok=True)
        run_dir.release()
        if not before:  # the folder was new or empty: it is left as it was
            (out / LOCK_FILE).unlink(missing_ok=True)
            (out / KINDS["run"].marker).unlink(missing_ok=True)
        run_dir.discard_if_unused()
        raise
    run_dir.release()
    return out

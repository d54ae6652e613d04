"""Cooldown branches of a warmup-stable-decay run: one long run serves several token budgets.

Under `train.schedule: wsd` the LR of every step before a run's decay (`LRSchedule.decay_start`)
is the warmup's or the plateau's, whatever `train.tokens` is; the data order and every RNG do
not depend on it either. So the state of a longer run R at step k is, bit for bit, the state a
run B of fewer tokens (and otherwise the same config) would reach at step k, as long as k is at
or before B's decay start (and R's). A branch is B started from R's checkpoint at such a step:
it restores the model, optimizer, data position and RNGs from it and trains only B's decay
(and any plateau steps between k and B's decay start) into its own run dir, which then resumes
from its own checkpoints like any run. `tests/test_wsd.py` shows a branch equals B trained from
step 0.

The branch's metrics.jsonl starts at step k (the steps before are R's); `branch.json` in its run
dir names R and k.
"""

from __future__ import annotations

from pathlib import Path

from taperlm.config import RunConfig, load_run_config
from taperlm.errors import CheckpointError, ConfigError
from taperlm.io import atomic_write_json
from taperlm.training import distributed as D
from taperlm.training.checkpoint import store as ckpt
from taperlm.training.config_diff import format_differences
from taperlm.training.optim import LRSchedule
from taperlm.training.run_dir import resume_conflicts

BRANCH_FILE = "branch.json"


def schedule_of(run: RunConfig) -> LRSchedule:
    return LRSchedule.from_config(run.train, run.train.steps)


def branch_step(run: RunConfig) -> int:
    """The last step at which a longer WSD run's checkpoint can start `run` as a branch: its
    decay start (ConfigError unless train.schedule is wsd)."""
    if run.train.schedule != "wsd":
        raise ConfigError(
            f"a cooldown branch needs train.schedule: wsd (this run's is "
            f"{run.train.schedule!r}: its LR before the end depends on train.tokens)"
        )
    return schedule_of(run).decay_start


def check_branch(run: RunConfig, source: Path, step: int, info: D.DistInfo | None = None) -> Path:
    """The verified checkpoint of run dir `source` at `step` from which `run` starts as a
    branch, after checking that it is `run`'s own state there: both WSD, the same config but
    for train.tokens, the same warmup, and `step` at or before both runs' decay start."""
    info = info or D.DistInfo()
    source = Path(source)
    if not (source / "config.yaml").is_file():
        raise ConfigError(f"branch source {source} is no run dir (it has no config.yaml)")
    try:
        src = load_run_config(source / "config.yaml").resolve()
    except ConfigError as err:
        raise ConfigError(
            f"branch source {source}: its config.yaml is unreadable ({err})"
        ) from None
    mine = branch_step(run)
    theirs = branch_step(src)
    conflicts = [d for d in resume_conflicts(src, run) if d[0] != "train.tokens"]
    if conflicts:
        raise ConfigError(
            f"cannot branch from {source}: its config differs in more than train.tokens: "
            + format_differences(conflicts, "source", "branch")
        )
    a, b = schedule_of(src), schedule_of(run)
    if a.warmup_steps != b.warmup_steps:
        raise ConfigError(
            f"cannot branch from {source}: the warmups differ ({a.warmup_steps} vs "
            f"{b.warmup_steps} steps; a warmup longer than a run is cut to it): give both runs "
            "train.warmup_tokens shorter than the shorter run"
        )
    if step > min(mine, theirs) or step < 0:
        raise ConfigError(
            f"cannot branch at step {step}: the branch's decay starts at step {mine} and the "
            f"source's at step {theirs}; a branch starts at a step <= both"
        )
    found = ckpt.find_checkpoint(
        source, step, part=(info.rank, info.world_size), agree=lambda x: D.gather_objects(x, info)
    )
    if found is None:  # find_checkpoint raises for a missing step; kept for the type checker
        raise CheckpointError(f"{source} has no checkpoint at step {step}")
    return found


def record_branch(out: Path, source: Path, step: int) -> None:
    """branch.json: which run and step this run branched from (provenance)."""
    atomic_write_json(out / BRANCH_FILE, {"source": str(Path(source).resolve()), "step": step})

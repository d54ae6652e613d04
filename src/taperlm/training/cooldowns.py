"""Several token budgets from one warmup-stable-decay run: `train_budgets`.

The longest budget is trained as one WSD run (OUT/tokens-<longest>); every shorter budget B is a
cooldown branch (`taperlm.training.run_dir.check_branch`) started from that run's checkpoint at B's decay
start, trained into OUT/tokens-<B>. The long run is stopped at each branch step in turn (it saves
a checkpoint there), the branch is trained, and the long run continues; so its checkpoint at a
branch step is its newest until the branch has started, and `train.keep_checkpoints` never prunes
it first. The cost is the longest run plus each shorter budget's decay (and the plateau steps
between its branch step and its decay start, none when they coincide).

Resumable: a finished budget is skipped; a branch with its own checkpoints resumes from them;
otherwise the long run must still be at (or reach) the branch step. Each budget's result equals
that budget trained from step 0 with the same config (tests/training/test_wsd.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from taperlm.config import RunConfig
from taperlm.errors import CheckpointError, ConfigError
from taperlm.training.checkpoint import store as ckpt
from taperlm.training.loop import TrainResult, train
from taperlm.training.run_dir import branch_step


def budget_config(run: RunConfig, tokens: int) -> RunConfig:
    """`run` with train.tokens = `tokens` (everything else, the warmup included, kept)."""
    return dataclasses.replace(run, train=dataclasses.replace(run.train, tokens=tokens))


def budget_dir(out: Path, tokens: int) -> Path:
    return Path(out) / f"tokens-{tokens}"


def train_budgets(
    run: RunConfig, budgets: list[int], out: str | Path, progress: bool = True
) -> dict[int, TrainResult]:
    """Train every budget (tokens) in `budgets` with one WSD run and a cooldown branch per
    shorter budget; returns {tokens: its result}. ConfigError unless train.schedule is wsd and
    the warmup ends before the shortest budget's decay."""
    if not budgets or min(budgets) < 1:
        raise ConfigError("train_budgets needs >= 1 token budget, each >= 1")
    out = Path(out)
    longest = max(budgets)
    long_cfg = budget_config(run, longest)
    long_dir = budget_dir(out, longest)
    branch_step(long_cfg)  # ConfigError naming train.schedule unless wsd
    results: dict[int, TrainResult] = {}
    for tokens in sorted(set(budgets) - {longest}):
        cfg = budget_config(run, tokens)
        step = branch_step(cfg)
        here = budget_dir(out, tokens)
        if ckpt.list_checkpoints(here):  # started (or finished): it resumes from its own
            results[tokens] = train(cfg, here, progress=progress)
            continue
        at = _newest_step(long_dir)
        if at < step:
            train(long_cfg, long_dir, progress=progress, stop_after=step)
        elif step not in {s for s, _ in ckpt.list_checkpoints(long_dir)}:
            raise CheckpointError(
                f"budget {tokens:,}: the long run {long_dir} is past its branch step {step} "
                f"(at {at}) and no longer has that checkpoint; train this budget on its own, "
                "or keep more checkpoints (train.keep_checkpoints) in the long run"
            )
        results[tokens] = train(cfg, here, progress=progress, branch=(long_dir, step))
    results[longest] = train(long_cfg, long_dir, progress=progress)
    return results


def _newest_step(run_dir: Path) -> int:
    have = ckpt.list_checkpoints(run_dir)
    return have[-1][0] if have else 0

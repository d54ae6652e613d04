"""Cooldown branches of warmup-stable-decay runs: `train_branch` (one budget from a WSD run's
checkpoint, what `taperlm train --branch-from RUN --tokens N` runs) and `train_budgets` (several
budgets from one WSD run, each shorter one a branch).

A branch of budget B trains B's config (the source run's, with train.tokens = B) into its own run
dir, starting from the source's newest checkpoint at or before B's decay start
(`taperlm.training.run_dir.check_branch` says why that state is B's own there, bit for bit); it
trains the plateau steps from that checkpoint to B's decay start, then B's decay. The source run
dir is only read. Refused with a ConfigError naming the option and the fix: a source that is not
WSD, a config that differs from the source's in more than train.tokens, a budget shorter than
the warmup, a budget whose decay would start after the source's (past its stable phase), and a
source with no checkpoint at or before the budget's decay start.

`train_budgets`: the longest budget is trained as one WSD run (OUT/tokens-<longest>); every shorter
budget B is a branch of it trained into OUT/tokens-<B>. The long run is stopped at each branch step
in turn (it saves a checkpoint there), the branch is trained, and the long run continues; so its
checkpoint at a branch step is its newest until the branch has started, and
`train.keep_checkpoints` never prunes it first. The cost is the longest run plus each shorter
budget's decay.

Resumable: a branch with its own checkpoints resumes from them (a finished one trains nothing);
otherwise it starts from the source as above. Each budget's result equals that budget trained
from step 0 with the same config (tests/training/test_wsd.py, tests/training/test_branch_cli.py).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from taperlm.checkpoint import store as ckpt
from taperlm.config import RunConfig, format_differences
from taperlm.errors import ConfigError, MalformedFileError
from taperlm.files.io import read_json
from taperlm.training.loop import StepHook, TrainResult, train
from taperlm.training.run_dir import (
    BRANCH_FILE,
    branch_source_config,
    branch_step,
    resume_conflicts,
    schedule_of,
)

# How the refusals name the source and the budget: a library call's own terms by default, the
# command line's options from `taperlm train`.
LIBRARY_NAMES = ("branch source", "train.tokens")
CLI_NAMES = ("--branch-from", "--tokens")


def budget_config(run: RunConfig, tokens: int) -> RunConfig:
    """`run` with train.tokens = `tokens` (everything else, the warmup included, kept)."""
    return dataclasses.replace(run, train=dataclasses.replace(run.train, tokens=tokens))


def budget_dir(out: Path, tokens: int) -> Path:
    return Path(out) / f"tokens-{tokens}"


def branch_start(run: RunConfig, source: str | Path, names: tuple[str, str] = LIBRARY_NAMES) -> int:
    """The step of run dir `source` from which `run` starts as a cooldown branch: the source's
    newest checkpoint at or before `run`'s decay start. Read-only; ConfigError (naming
    `names` = (the source's option, the budget's option) and the fix) when it cannot be one."""
    src_opt, budget_opt = names
    source = Path(source)
    src = branch_source_config(source, src_opt)
    if src.train.schedule != "wsd":
        raise ConfigError(
            f"{src_opt} {source}: a cooldown branch needs a warmup-stable-decay source, and this "
            f"run was trained with train.schedule {src.train.schedule!r} (its LR before the end "
            "depends on its length, so no checkpoint of it is a shorter run's state); train the "
            "long run with --set train.schedule=wsd, or train this budget as its own run"
        )
    conflicts = [d for d in resume_conflicts(src, run) if d[0] != "train.tokens"]
    if conflicts:
        raise ConfigError(
            f"{src_opt} {source}: a branch is the source's config with only train.tokens "
            "changed, and this one differs in more: "
            + format_differences(conflicts, "source", "branch")
            + f"; drop the options that set these (--preset, --config, --taper, --set), and "
            f"give the budget with {budget_opt}"
        )
    warmup = schedule_of(src).warmup_steps
    if schedule_of(run).warmup_steps != warmup:  # a run shorter than the warmup cuts it
        raise ConfigError(
            f"{budget_opt} {run.train.tokens:,}: shorter than the source's warmup "
            f"({warmup:,} steps of {run.train.batch_tokens:,} tokens), which a branch shares; "
            f"give {budget_opt} at least {warmup * run.train.batch_tokens:,}"
        )
    mine, theirs = branch_step(run), branch_step(src)
    if mine > theirs:
        raise ConfigError(
            f"{budget_opt} {run.train.tokens:,}: its decay would start at step {mine:,}, after "
            f"the source's stable phase ends (step {theirs:,} of {src.train.steps:,}, "
            f"train.tokens {src.train.tokens:,}); a branch cools down from the source's plateau: "
            f"give {budget_opt} at most {src.train.tokens:,}, or train this budget as its own run"
        )
    have = [s for s, _ in ckpt.list_checkpoints(source)]
    usable = [s for s in have if s <= mine]
    if not usable:
        if not have:
            raise ConfigError(
                f"{src_opt} {source} has no checkpoint yet; train it (`taperlm train --out "
                f"{source}`) at least to step {mine:,}, where this budget's decay starts"
            )
        raise ConfigError(
            f"{src_opt} {source} has no checkpoint at or before step {mine:,}, where the budget "
            f"{budget_opt} {run.train.tokens:,} starts its decay (its checkpoints: steps "
            f"{', '.join(f'{s:,}' for s in have)}; the older ones were pruned by "
            "train.keep_checkpoints): give a larger budget, or train this one as its own run; "
            "a long run meant for branches keeps more checkpoints (train.checkpoint_every, "
            "train.keep_checkpoints)"
        )
    return usable[-1]


def train_branch(
    run: RunConfig,
    source: str | Path,
    out: str | Path,
    *,
    resume: str = "auto",
    progress: bool = True,
    stop_after: int | None = None,
    on_step: StepHook | None = None,
    names: tuple[str, str] = LIBRARY_NAMES,
) -> TrainResult:
    """Train `run` into run dir `out` as a cooldown branch of WSD run dir `source` (never written
    to); `out` with checkpoints of its own continues them (it must be a branch of `source`).
    The rest as `taperlm.training.loop.train`."""
    source, out = Path(source), Path(out)
    if ckpt.list_checkpoints(out):
        _check_own_branch(out, source, names[0])
        return train(run, out, resume, progress, stop_after, on_step)
    step = branch_start(run, source, names)
    if progress and os.environ.get("RANK", "0") == "0":
        print(
            f"taperlm train: note: a cooldown branch of {source} from its checkpoint at step "
            f"{step:,}; the branch's decay starts at step {branch_step(run):,} of "
            f"{schedule_of(run).total_steps:,}",
            file=sys.stderr,
        )
    return train(run, out, resume, progress, stop_after, on_step, branch=(source, step))


def _check_own_branch(out: Path, source: Path, src_opt: str) -> None:
    """A run dir with checkpoints continues as a branch only of the source it branched from."""
    try:
        recorded = read_json(out / BRANCH_FILE, what="branch record")["source"]
    except FileNotFoundError:
        raise ConfigError(
            f"{out} already holds a run that is not a cooldown branch (no {BRANCH_FILE}); "
            f"give a new --out for the branch, or continue that run without {src_opt}"
        ) from None
    except (MalformedFileError, KeyError, TypeError) as err:
        raise ConfigError(
            f"{out}/{BRANCH_FILE} does not say which run it branched from ({err}); continue "
            f"the run without {src_opt}, or give a new --out"
        ) from None
    if not isinstance(recorded, str):
        raise ConfigError(
            f"{out}/{BRANCH_FILE} does not say which run it branched from; continue the run "
            f"without {src_opt}, or give a new --out"
        )
    if Path(recorded).resolve() != source.resolve():
        raise ConfigError(
            f"{out} is a cooldown branch of {recorded}, not of {source}; continue it with "
            f"{src_opt} {recorded} (or without {src_opt}), or give a new --out"
        )


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
        here = budget_dir(out, tokens)
        step = branch_step(cfg)
        if not ckpt.list_checkpoints(here) and _newest_step(long_dir) < step:
            train(long_cfg, long_dir, progress=progress, stop_after=step)
        results[tokens] = train_branch(cfg, long_dir, here, progress=progress)
    results[longest] = train(long_cfg, long_dir, progress=progress)
    return results


def _newest_step(run_dir: Path) -> int:
    have = ckpt.list_checkpoints(run_dir)
    return have[-1][0] if have else 0

"""`taperlm train`: pretrain a model into a run directory, single process or under torchrun.

    taperlm train --preset transformer-tiny --taper cosine:1.5:0.5 --data DATA --out RUN
    torchrun --nproc_per_node 8 -m taperlm.cli train --config run.yaml --data DATA --out RUN
    taperlm train --preset transformer-tiny --data DATA --out RUN --logger tensorboard
    taperlm train --branch-from LONG --tokens 2e6 --out RUN   # a WSD run's cooldown at 2M tokens

Config precedence (`taperlm.config.assembly`): preset / config file < the options (--taper,
--multiple-of, --data, --tokens, --logger, --init-from, --distill-from) < --set < $TAPERLM_SET;
an option and a --set of its key must agree. Without --preset or --config, an existing RUN/config.yaml is used (so `taperlm
train --out RUN` continues a run); with --branch-from LONG, LONG's
(`taperlm.training.cooldowns.train_branch`).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

from taperlm.commands.common import (
    add_logger_argument,
    add_model_arguments,
    build_run_config,
    resume_command,
)
from taperlm.config import TrainConfig
from taperlm.config.assembly import add_setting_argument
from taperlm.errors import ConfigError, TrainingWarning
from taperlm.spec.domains import (
    MAX_COUNT,
    choices,
    count,
    domain_of_field,
    input_path,
    number,
    output_path,
    up_to,
)
from taperlm.training import ResumeMode
from taperlm.training.interrupt import SignalStop, interrupted_message


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_setting_argument(
        parser,
        "--data",
        "data.dir",
        _resolved,
        type=input_path(),
        help="data dir written by `taperlm prepare`",
    )
    add_setting_argument(
        parser,
        "--init-from",
        "train.init_from",
        _resolved,
        type=input_path(),
        help="start from the weights of this run dir or checkpoint (e.g. `taperlm prune`'s); "
        "without --preset/--config its config is the model's (train.init_from)",
    )
    add_setting_argument(
        parser,
        "--distill-from",
        "train.distill_from",
        _resolved,
        type=input_path(),
        help="distil from this teacher (a run dir or checkpoint of the same vocabulary): "
        "train.distill_mix x KL at train.distill_temperature + the rest LM loss "
        "(train.distill_from)",
    )
    parser.add_argument(
        "--branch-from",
        type=input_path(),
        metavar="RUN",
        help="train a cooldown branch of warmup-stable-decay run RUN at the budget --tokens: "
        "RUN's config with only train.tokens changed, started from RUN's newest checkpoint at or "
        "before the budget's decay start, into --out (RUN is only read)",
    )
    add_setting_argument(
        parser,
        "--tokens",
        "train.tokens",
        type=count(domain_of_field(TrainConfig, "tokens")),
        metavar="N",
        help="training tokens (train.tokens, e.g. 2e6); with --branch-from, the "
        "branch's budget (required there)",
    )
    parser.add_argument(
        "--out", type=output_path("dir"), required=True, help="run directory (created)"
    )
    parser.add_argument(
        "--resume",
        choices=choices(ResumeMode),
        default="auto",
        help="auto (default): continue from the newest good checkpoint in --out if there is one; "
        "never: refuse a run dir that has checkpoints; must: fail unless there is one",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--stop-after-steps",
        type=number(int, up_to(MAX_COUNT)),
        metavar="N",
        help="stop (with a checkpoint) once N steps are done; rerun to continue",
    )
    add_logger_argument(parser)


def _resolved(path: Path) -> str:
    """A path option's value as the config holds it: absolute, so that a run dir's config names
    the same folder from anywhere."""
    return str(path.resolve())


def _resolve_config(args: argparse.Namespace):
    branch = getattr(args, "branch_from", None)
    if branch is not None and getattr(args, "tokens", None) is None:
        raise ConfigError(
            f"--branch-from {branch} needs --tokens N, the branch's budget (at most the "
            "source's train.tokens): e.g. --tokens 2e6"
        )
    if branch is not None and not args.preset and not args.config:
        from taperlm.training.run_dir import branch_source_config  # lazy: torch

        branch_source_config(branch, "--branch-from")  # a clear refusal of a folder without one
        args.config = branch / "config.yaml"  # the branch's config is its source's
        args.implicit_config = True
    elif not args.preset and not args.config:
        saved = args.out / "config.yaml"
        start = args.init_from and _run_root(args.init_from) / "config.yaml"
        if not saved.is_file() and start and start.is_file():
            saved = start  # a new run from another run's weights: its model and settings
        elif not saved.is_file():
            raise ConfigError(
                f"give a model with --preset NAME or --config FILE ({saved} does not exist, so "
                "there is no run to continue)"
            )
        args.config = saved
        args.implicit_config = True  # the run's own config: the resume checks report changes
    cfg = build_run_config(args)  # the options, --set and $TAPERLM_SET: taperlm.config.assembly
    if cfg.data.dir:
        cfg.data.dir = str(Path(cfg.data.dir).expanduser())
    return cfg


def _run_root(path: Path) -> Path:
    """The run dir of RUN or of its checkpoint RUN/checkpoints/step_N."""
    return path.parent.parent if path.parent.name == "checkpoints" else path


def run(args: argparse.Namespace) -> int:
    from taperlm.training import distributed as D  # lazy: the CLI's parser stays torch-free
    from taperlm.training.cooldowns import CLI_NAMES, train_branch  # lazy: as above
    from taperlm.training.loop import train  # lazy: the CLI's parser stays torch-free

    def show(message, category, filename, lineno, file=None, line=None):  # no source lines
        print(f"taperlm train: warning: {message}", file=sys.stderr)

    cfg = _resolve_config(args)
    rank = int(os.environ.get("RANK", "0"))
    # Plain one-line warnings for this command only; catch_warnings restores the global hooks.
    with warnings.catch_warnings(), SignalStop() as stop:
        warnings.simplefilter("always", TrainingWarning)
        warnings.showwarning = show  # type: ignore[assignment]
        try:
            common = {
                "resume": args.resume,
                "progress": not args.no_progress,
                "stop_after": args.stop_after_steps,
                "on_step": stop,
            }
            if getattr(args, "branch_from", None) is not None:
                result = train_branch(cfg, args.branch_from, args.out, names=CLI_NAMES, **common)
            else:
                result = train(cfg, args.out, **common)
        finally:
            D.shutdown(D.DistInfo(world_size=int(os.environ.get("WORLD_SIZE", "1"))))
    if stop.stopped_at is not None:
        if rank == 0:
            command = resume_command("train", getattr(args, "_argv", sys.argv[1:]))
            print(
                interrupted_message(args.out, command, result.step, result.total_steps),
                file=sys.stderr,
            )
        return 130
    if rank == 0:
        val = f"val loss {result.val_loss:.4f}" if result.val_loss is not None else "no val loss"
        train_loss = f"{result.train_loss:.4f}" if result.train_loss is not None else "n/a"
        state = "done" if result.finished else "stopped"
        print(
            f"{state}: step {result.step}/{result.total_steps}, {result.tokens:,} tokens, "
            f"train loss {train_loss}, {val}, {result.tokens_per_s:,.0f} tokens/s, "
            f"{result.skipped_steps} skipped steps; run dir {result.run_dir}"
        )
    return 0

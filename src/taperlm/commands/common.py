"""The argument group shared by the commands that take a model config (plan, train, compare,
allocate): `--preset NAME | --config FILE`, `--taper SPEC`, `--head-taper SPEC`, `--kv-taper
SPEC`, `--multiple-of N`, `--set key=value`, and the config assembly of plan, train and allocate
(`build_run_config`, through `taperlm.config.assembly`). No torch import."""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys

from taperlm.config import RunConfig, file_notes
from taperlm.config.assembly import (
    Assembly,
    OptionSetting,
    Recipe,
    add_set_argument,
    add_setting_argument,
    option_settings,
)
from taperlm.config.train import Logger
from taperlm.errors import ConfigError
from taperlm.spec.domains import choices, domain_of_field, input_path, number
from taperlm.spec.taper import TaperSpec


def add_model_arguments(
    parser: argparse.ArgumentParser, taper: bool = True, default_preset: str | None = None
) -> None:
    """--preset | --config, --taper and --head-taper (unless `taper` is False: compare takes
    lists of allocations), --multiple-of and --set. `default_preset` is named in the help as
    what the command uses when neither --preset nor --config is given."""
    src = parser.add_mutually_exclusive_group()
    default = f"default {default_preset}; " if default_preset else "e.g. transformer-440m; "
    src.add_argument(
        "--preset", help=f"named model preset ({default}see `taperlm plan --list-presets`)"
    )
    src.add_argument("--config", type=input_path(), help="YAML config file (model:, data:, train:)")
    if taper:
        add_setting_argument(
            parser,
            "--taper",
            "model.taper",
            help="taper spec: uniform | cosine[:START:END] | linear[:START:END] | "
            "sigmoid[:START:END[:K]] | groups:R1,R2,.. | custom:W1,W2,.. | "
            "novelty:SOURCE[:STRENGTH] (default: the config's)",
        )
        add_setting_argument(
            parser,
            "--head-taper",
            "model.head_taper",
            help="taper of the attention query heads per layer, same spec language (e.g. "
            "cosine:1.25:0.75; KV heads follow at the model's group size) (default: the config's)",
        )
        add_setting_argument(
            parser,
            "--kv-taper",
            "model.kv_taper",
            help="taper of the KV heads per layer: multipliers of each layer's default KV heads "
            "(e.g. cosine:1.0:0.25, groups:0.5; custom integers are counts), the nearest "
            "divisors of its query heads; the MLP widths take up the parameters saved "
            "(default: the config's)",
        )
    add_setting_argument(
        parser,
        "--multiple-of",
        "model.taper.multiple_of",
        type=number(int, domain_of_field(TaperSpec, "multiple_of")),
        help="round every width to a multiple of N (default 16, as in the paper)",
    )
    add_set_argument(
        parser,
        "override a config value, e.g. --set model.n_layers=12 or --set train.lr=1e-3 "
        "(repeatable; a later --set of the same key wins; with --config, each value it replaces "
        "is printed as a note; $TAPERLM_SET, e.g. 'train.tokens=8192 model.n_layers=2', "
        "applies after)",
    )


def command_settings(args: argparse.Namespace) -> list[OptionSetting]:
    """What the options of `args`' command that set a config key were given (`taperlm.config.assembly
    .option_settings`), derived from the command's own declarations."""
    if getattr(args, "_settings", None) is not None:  # read once by `taperlm.cli.main`
        return args._settings
    command = getattr(args, "_command", None)
    if not command:
        return []
    # the command's own declarations, by name as `taperlm.cli` loads them (the CLI imports this
    # module, so not through it)
    parser = argparse.ArgumentParser(add_help=False)
    importlib.import_module(f"taperlm.commands.{command}").add_arguments(parser)
    return option_settings(parser, args)


def build_run_config(
    args: argparse.Namespace,
    options: list[OptionSetting] | None = None,
    recipe: Recipe | None = None,
) -> RunConfig:
    """The run config of the command line, resolved once, by the one assembly
    (`taperlm.config.assembly.Assembly.assemble`): --preset or --config < the command's options
    (`options`, else the declared ones of `args`' command) < --set < $TAPERLM_SET."""
    # Notes for what replaces a config file the user gave (not a continued run's own config,
    # whose changes the resume checks report).
    from_file = bool(getattr(args, "config", None)) and not getattr(args, "implicit_config", False)
    asm = Assembly.start(getattr(args, "config", None), getattr(args, "preset", None), from_file)
    if options is None:
        options = command_settings(args)
    asm.assemble(options, args.overrides, recipe)
    cfg = asm.resolve()
    notes = asm.notes or []
    if from_file:
        notes += file_notes(asm.data, cfg)
    print_notes(args, notes)
    return cfg


def print_notes(args: argparse.Namespace, notes: list[str]) -> None:
    """`taperlm CMD: note: ...` on stderr, once (rank 0 under torchrun)."""
    if os.environ.get("RANK", "0") != "0":
        return
    for note in notes:
        print(f"taperlm {getattr(args, '_command', '')}: note: {note}", file=sys.stderr)


def _logger_list(text: str) -> list[str]:
    names_ok = choices(Logger)
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    for name in names:
        if name not in (*names_ok, "none"):
            raise argparse.ArgumentTypeError(
                f"unknown logger {name!r}; choose {', '.join(names_ok)} or none"
            )
    return names


def add_logger_argument(parser: argparse.ArgumentParser) -> None:
    """--logger NAME[,NAME] (repeatable): train.loggers, beside metrics.jsonl."""
    add_setting_argument(
        parser,
        "--logger",
        "train.loggers",
        logger_names,
        dest="loggers",
        type=_logger_list,
        action="append",
        metavar="NAME",
        help="log live to tensorboard (RUN/tensorboard) and/or wandb (Weights & Biases), beside "
        "metrics.jsonl; repeatable or comma-separated; none = no logger (default: the config's "
        "train.loggers)",
    )


def logger_names(values: list[list[str]] | None) -> list[str] | None:
    """The loggers --logger asks for (each once, in order), [] for `none`, None when not given."""
    if values is None:
        return None
    names = [n for group in values for n in group]
    if "none" in names and len(set(names)) > 1:
        raise ConfigError("--logger none turns the loggers off; give it alone")
    return list(dict.fromkeys(n for n in names if n != "none"))


def resume_command(command: str, argv: list[str]) -> str:
    """The command line that continues an interrupted `command` (`--resume never` would refuse
    the saved checkpoints, so it becomes `auto`); under torchrun, the same torchrun line."""
    argv = list(argv)
    for i, arg in enumerate(argv[:-1]):
        if arg == "--resume" and argv[i + 1] == "never":
            argv[i + 1] = "auto"
    argv = [a if a != "--resume=never" else "--resume=auto" for a in argv]
    if "LOCAL_RANK" in os.environ:  # under torchrun: its own options are not ours to know
        return "torchrun <the same options> -m taperlm.cli " + shlex.join(argv)
    return shlex.join(["taperlm", *argv])

"""The `taperlm` command line: parses arguments and dispatches to one module per subcommand.

Each subcommand lives in `taperlm.commands.<name>` and exposes two functions:
`add_arguments(parser)` and `run(args) -> int`. Modules are imported only when their
subcommand runs, so `taperlm plan` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from taperlm import __version__
from taperlm.commands.common import resume_command
from taperlm.config.assembly import check_agreement, option_settings
from taperlm.errors import TaperlmError
from taperlm.files.io import bounded_message
from taperlm.runtime.device import is_out_of_memory, memory_error
from taperlm.spec.domains import check_arguments
from taperlm.training.interrupt import interrupted_message

# name -> one-line help; the module taperlm.commands.<name> implements it.
COMMANDS: dict[str, str] = {
    "plan": "show per-layer widths, parameters and FLOPs of a taper beside its uniform baseline",
    "prepare": "tokenize a corpus into memory-mapped token shards",
    "train": "pretrain a model (single process or under torchrun)",
    "eval": "evaluate a run on validation perplexity and the paper's zero-shot suite",
    "import": "import a Llama-architecture Hugging Face checkpoint folder as a run",
    "export": "export a run as a Hugging Face model directory",
    "generate": "sample text from a run",
    "novelty": "layer-wise novelty (rho_block, rho_mlp) of a model",
    "allocate": "MLP widths from a pilot's measured novelty, at the same budget",
    "prune": "prune a trained model's MLP widths to a smaller tapered, uniform or novelty shape",
    "compare": "train and compare tapers at one budget over seeds (the main job)",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with `only`, just that subcommand's arguments are imported and added
    (so one command's module is the only one loaded when it runs)."""
    parser = argparse.ArgumentParser(
        prog="taperlm",
        description="Tapered Language Models: build, train, evaluate and study depth-tapered LMs.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_command=name)
        if only is None or only == name:
            _module(name).add_arguments(p)
    return parser


def subcommand_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of subcommand `name` inside the full parser."""
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise KeyError(name)


def _module(name: str):
    return importlib.import_module(f"taperlm.commands.{name}")


def _version() -> str:
    return f"taperlm {__version__}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    first = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only=first if first in COMMANDS else "")
    args = parser.parse_args(argv)
    if not getattr(args, "_command", None):
        parser.print_help()
        return 2
    args._argv = argv  # for messages that repeat the command (resume_command)
    try:
        # Every numeric option's declared domain (taperlm.spec.domains), before the command runs.
        command_parser = subcommand_parser(parser, args._command)
        check_arguments(command_parser, args)
        # Every option that sets a config key against a --set of that key, for every command,
        # from the declarations (`taperlm.config.assembly.add_setting_argument`): agree or refuse.
        args._settings = option_settings(command_parser, args)
        check_agreement(args._settings, getattr(args, "overrides", None) or [])
        status = int(_module(args._command).run(args) or 0)
        # what is still buffered goes out here, where a closed pipe is caught below, not in the
        # interpreter's final flush ("Exception ignored ... BrokenPipeError" on a block-buffered
        # stdout, the default when PYTHONUNBUFFERED is not set)
        sys.stdout.flush()
        return status
    except TaperlmError as err:
        print(f"taperlm {args._command}: error: {bounded_message(str(err))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading: not an error
        # (before `except Exception`, which would re-raise it); stdout goes to /dev/null so that
        # the interpreter's final flush does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as err:  # an allocation anywhere: one line, not torch's traceback
        if not is_out_of_memory(err):
            raise
        hint = "ask for less (a smaller --batch-size, model or input) or use another --device"
        print(f"taperlm {args._command}: error: {memory_error(err, '', hint)}",
              file=sys.stderr)  # fmt: skip
        return 2
    except KeyboardInterrupt:
        if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, one message
            print(_interrupted(args, argv), file=sys.stderr)
        return 130


# Commands whose work survives an interrupt (checkpoints, finished cells) and continues when the
# same command runs again.
RESUMABLE = ("train", "compare")


def _interrupted(args: argparse.Namespace, argv: list[str]) -> str:
    """The Ctrl-C message; for resumable commands it says what is saved and names the exact
    command that continues."""
    command = args._command
    if command not in RESUMABLE:
        return f"taperlm {command}: interrupted"
    if command == "train":
        return interrupted_message(getattr(args, "out", None), resume_command(command, argv))
    return (
        f"taperlm {command}: interrupted; the work done so far is saved. To continue, run the "
        f"same command again:\n  {resume_command(command, argv)}"
    )


if __name__ == "__main__":
    sys.exit(main())

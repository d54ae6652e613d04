"""An option and its `--set` twin agree or the command refuses, naming both (issue 60): for every
option of every command that sets a config key, found from the declarations themselves
(`taperlm.config.assembly.add_setting_argument`), so a new option is covered without a list to keep.
For each (command, option): the option alone and the --set alone are accepted, the two with the
same value (in another spelling) are accepted, and with different values the command refuses
before any work, naming the option and the key."""

from __future__ import annotations

import functools

import pytest

from taperlm.cli import COMMANDS, build_parser, subcommand_parser
from taperlm.cli import main as cli_main
from taperlm.config.assembly import check_agreement, option_settings, setting_actions
from taperlm.errors import ConfigError

pytestmark = pytest.mark.unit

# config key -> (the option's text, a --set value that agrees, a --set value that differs);
# None: a flag without a value. {tmp} is the test's folder (the working folder too: a relative
# path and its absolute spelling name the same folder).
SAMPLES: dict[str, tuple[str | None, str, str]] = {
    "model.taper": ("cosine:1.5:0.5", "{schedule: cosine, start: 1.5, end: 0.5}", "linear"),
    "model.head_taper": ("cosine:1.25:0.75", "cosine:1.25:0.75", "linear:1.25:0.75"),
    "model.kv_taper": ("cosine:1.0:0.5", "cosine:1.0:0.5", "groups:0.5"),
    "model.taper.multiple_of": ("8", "8", "32"),
    "model.taper.strength": ("0.3", "0.3", "0.4"),
    "data.dir": ("a", "{tmp}/a", "{tmp}/b"),
    "train.init_from": ("a", "{tmp}/a", "{tmp}/b"),
    "train.distill_from": ("a", "{tmp}/a", "{tmp}/b"),
    "train.tokens": ("8192", "8192", "16384"),
    "train.loggers": ("tensorboard", "[tensorboard]", "[wandb]"),
    "train.seq_len": ("128", "128", "256"),
    "train.micro_batch_size": ("4", "4", "8"),
    "train.parallel": ("fsdp", "fsdp", "ddp"),
    "train.activation_checkpointing": (None, "full", "none"),
    "train.peak_flops": ("500", "5.0e+14", "1.0e+15"),
}
# the commands that build a run config, and options each must declare with their key (so that
# the enumeration below cannot pass by finding nothing)
AT_LEAST = {
    "train": {"--taper", "--head-taper", "--kv-taper", "--multiple-of", "--data", "--tokens"}
    | {"--logger", "--init-from", "--distill-from"},
    "plan": {"--taper", "--multiple-of", "--tokens", "--micro-batch", "--parallel"},
    "compare": {"--data", "--tokens", "--logger", "--multiple-of"},
    "allocate": {"--multiple-of", "--strength"},
    "prune": {"--data"},
    "import": set(),  # no option sets a key: its model is the checkpoint's
}


@functools.cache
def _parser():
    return build_parser()


def _twins() -> list[tuple[str, str, str]]:
    """(command, option, key) for every option of every command declared with a config key."""
    return [
        (command, action.option_strings[0], action.config_key)
        for command in COMMANDS
        for action in setting_actions(subcommand_parser(_parser(), command))
    ]


def _required(command: str, tmp) -> list[str]:
    """What `command` needs to parse: its positionals (an existing folder) and required
    options (a folder to write)."""
    argv = []
    for action in subcommand_parser(_parser(), command)._actions:
        if not action.option_strings and action.dest not in ("help", "command"):
            (tmp / "src").mkdir(exist_ok=True)
            argv.append(str(tmp / "src"))
        elif action.required:
            argv += [action.option_strings[0], str(tmp / f"new{len(argv)}")]
    return argv


def _argv(command, flag, key, tmp, option: bool, set_value: str | None) -> list[str]:
    text = SAMPLES[key][0]
    argv = [command, *_required(command, tmp)]
    if option:
        argv += [flag] if text is None else [flag, text]
    if set_value is not None:
        argv += ["--set", f"{key}={set_value.replace('{tmp}', str(tmp))}"]
    return argv


def _check(argv: list[str]) -> None:
    """The command line's agreement check (`taperlm.cli.main`'s), on the parsed `argv`."""
    args = _parser().parse_args(argv)
    settings = option_settings(subcommand_parser(_parser(), argv[0]), args)
    check_agreement(settings, args.overrides)


def test_every_command_that_builds_a_config_declares_its_options_keys():
    found: dict[str, set[str]] = {}
    for command, flag, key in _twins():
        found.setdefault(command, set()).add(flag)
        assert key in SAMPLES, f"{command} {flag} sets {key}: add a sample of it to SAMPLES"
    for command, flags in AT_LEAST.items():
        assert flags <= found.get(command, set()), (command, flags - found.get(command, set()))


@pytest.mark.parametrize(("command", "flag", "key"), _twins())
def test_an_option_and_its_set_twin_agree_or_are_refused(command, flag, key, tmp_path,
                                                         monkeypatch, capsys):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    _, same, other = SAMPLES[key]
    _check(_argv(command, flag, key, tmp_path, True, None))  # the option alone
    _check(_argv(command, flag, key, tmp_path, False, other))  # the --set alone
    _check(_argv(command, flag, key, tmp_path, True, same))  # both, the same value
    argv = _argv(command, flag, key, tmp_path, True, other)
    with pytest.raises(ConfigError) as err:
        _check(argv)
    assert flag in str(err.value) and f"--set {key}=" in str(err.value), err.value
    # the command itself refuses, before any work, with the same one line
    assert cli_main(argv) == 2
    _, stderr = capsys.readouterr()
    assert stderr == f"taperlm {command}: error: {err.value}\n", stderr
    assert not (tmp_path / "new2").exists()

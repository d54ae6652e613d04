"""Options declared once: every option of every command either sets a config field, and then
takes its type, range or choices from that field's declared domain (`taperlm.spec.domains`), or is
named here as the command's own. A new option that is neither fails this test."""

from __future__ import annotations

import argparse
import functools

import pytest

from taperlm.cli import build_parser, subcommand_parser
from taperlm.commands.common import _logger_list
from taperlm.config import DataConfig, ModelConfig, TrainConfig
from taperlm.spec.domains import Number, PathArg, domain_of_field
from taperlm.spec.taper import TaperSpec

pytestmark = pytest.mark.unit

_MODEL = {
    "--taper": (ModelConfig, "taper"),
    "--head-taper": (ModelConfig, "head_taper"),
    "--kv-taper": (ModelConfig, "kv_taper"),
    "--multiple-of": (TaperSpec, "multiple_of"),
}
_MEASURE = {"--data", "--tokens", "--seq-len", "--batch-size", "--include-first", "--step"}
_MEASURE |= {"--device", "--dtype", "--layers", "--mlp", "--trust-remote-code"}

# option -> the config field it sets (the value the field's domain checks)
CONFIG_OPTIONS: dict[str, dict[str, tuple[type, str]]] = {
    "train": {
        **_MODEL,
        "--data": (DataConfig, "dir"),
        "--logger": (TrainConfig, "loggers"),
        "--init-from": (TrainConfig, "init_from"),
        "--distill-from": (TrainConfig, "distill_from"),
        "--tokens": (TrainConfig, "tokens"),
    },
    "prune": {"--taper": (ModelConfig, "taper"), "--data": (DataConfig, "dir")},
    "plan": {
        **_MODEL,
        "--seq-len": (TrainConfig, "seq_len"),
        "--micro-batch": (TrainConfig, "micro_batch_size"),
        "--parallel": (TrainConfig, "parallel"),
        "--activation-checkpointing": (TrainConfig, "activation_checkpointing"),
        "--tokens": (TrainConfig, "tokens"),
        "--peak-tflops": (TrainConfig, "peak_flops"),
    },
    "allocate": {
        "--multiple-of": (TaperSpec, "multiple_of"),
        "--strength": (TaperSpec, "strength"),
    },
    "prepare": {},
    "generate": {},
    "export": {},
    "import": {},  # its --set takes train.*/data.* KEY=VALUE, checked as config fields
    "novelty": {},
    "eval": {},  # its options configure the evaluation runner, not a run config
}
# the command's own options (no config dataclass field behind them)
COMMAND_OPTIONS: dict[str, set[str]] = {
    "train": {"--preset", "--config", "--set", "--out", "--resume", "--no-progress"}
    | {"--stop-after-steps", "--branch-from"},
    "plan": {"--preset", "--config", "--set", "--json", "--plot", "--dump-config"}
    | {"--list-presets", "--gpus", "--gpu-memory", "--mfu", "--block-configs"},
    "allocate": {"--from", "--preset", "--config", "--set", "--out", "--json", "--plot"} | _MEASURE,
    "prepare": {"--source", "--tokenizer", "--out", "--val-fraction", "--val-tokens"}
    | {"--workers", "--max-chars", "--max-tokens", "--tokenizer-sample-chars", "--shard-tokens"}
    | {"--max-doc-chars", "--text-field", "--seed", "--force", "--no-progress"},
    "generate": {"run", "--prompt", "--max-new-tokens", "--temperature", "--top-k", "--top-p"}
    | {"--seed", "--step", "--device", "--no-cache", "--out"},
    "export": {"run", "--out", "--format", "--dtype", "--step", "--force"},
    "import": {"folder", "--out", "--set"},
    "prune": {"source", "--out", "--params", "--params-of", "--score", "--calibration-tokens"}
    | {"--step", "--device", "--set", "--json"},
    "novelty": {"model", "--json", "--plot", "--out"} | _MEASURE,
    "eval": {"run", "--tasks", "--data-dir", "--source", "--limit", "--niah-lengths"}
    | {"--niah-haystack", "--niah-extrapolate", "--batch-size", "--max-length", "--step"}
    | {"--device", "--dtype", "--json", "--out", "--samples", "--write-lm-eval-tasks"},
}


@functools.cache
def _parser() -> argparse.ArgumentParser:
    return build_parser()


def _options(command: str) -> dict[str, argparse.Action]:
    parser = subcommand_parser(_parser(), command)
    return {
        (a.option_strings[0] if a.option_strings else a.dest): a
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction)
    }


@pytest.mark.parametrize("command", sorted(CONFIG_OPTIONS))
def test_every_option_is_a_config_field_or_the_commands_own(command):
    options = set(_options(command))
    declared = set(CONFIG_OPTIONS[command]) | COMMAND_OPTIONS[command]
    assert options == declared, (options - declared, declared - options)
    assert not set(CONFIG_OPTIONS[command]) & COMMAND_OPTIONS[command]


@pytest.mark.parametrize("command", sorted(c for c in CONFIG_OPTIONS if CONFIG_OPTIONS[c]))
def test_a_config_option_takes_its_fields_domain(command):
    actions = _options(command)
    for option, (cls, name) in CONFIG_OPTIONS[command].items():
        action = actions[option]
        if cls is ModelConfig and name in ("taper", "head_taper", "kv_taper"):  # TaperSpecs
            assert action.type is None, option
            continue
        domain = domain_of_field(cls, name)
        if isinstance(action.type, Number):  # the same range: the same messages
            assert action.type.domain == domain, option
        elif action.choices is not None:
            assert set(action.choices) == set(domain.allowed()), option
        elif action.type is _logger_list:  # --logger NAME: checked against train.loggers
            with pytest.raises(argparse.ArgumentTypeError, match=", ".join(domain.allowed())):
                _logger_list("nope")
        elif isinstance(action, argparse._StoreTrueAction):  # a flag sets one of the choices
            assert action.dest.replace("_", "-") == option[2:] and "full" in domain.allowed()
        else:  # text: a spec or a path, parsed by its own reader
            assert domain.text and (action.type is None or isinstance(action.type, PathArg))

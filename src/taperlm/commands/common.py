"""Argument groups and config assembly shared by the commands that take a model config
(plan, train, compare): `--preset NAME | --config FILE`, `--taper SPEC`, `--multiple-of N`,
`--set key=value`. No torch import."""

from __future__ import annotations

import argparse
from pathlib import Path

from taperlm.config import (
    RunConfig,
    apply_overrides,
    clear_resolved_sizes,
    load_yaml,
    run_config_from_dict,
    to_dict,
)
from taperlm.errors import ConfigError
from taperlm.presets import get_preset
from taperlm.taper import TaperSpec


def add_model_arguments(parser: argparse.ArgumentParser, default_preset: str | None = None) -> None:
    src = parser.add_mutually_exclusive_group()
    src.add_argument(
        "--preset",
        default=default_preset,
        help="named preset, e.g. transformer-440m (see `taperlm plan --list-presets`)",
    )
    src.add_argument("--config", type=Path, help="YAML config file (model:, data:, train:)")
    parser.add_argument(
        "--taper",
        help="taper spec: uniform | cosine[:START:END] | linear[:START:END] | "
        "sigmoid[:START:END[:K]] | groups:R1,R2,.. | custom:W1,W2,.. (default: the config's)",
    )
    parser.add_argument(
        "--multiple-of",
        type=int,
        help="round every width to a multiple of N (default 16, as in the paper)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set model.n_layers=12 (repeatable)",
    )


def build_run_config(args: argparse.Namespace) -> RunConfig:
    """preset/config file < --taper/--multiple-of < --set, resolved (widths computed)."""
    if getattr(args, "config", None):
        data = load_yaml(args.config)
        if "model" not in data and "family" in data:
            data = {"model": data}
        source = str(args.config)
    elif getattr(args, "preset", None):
        data = {"model": to_dict(get_preset(args.preset, resolve=False))}
        source = f"preset {args.preset}"
    else:
        raise ConfigError("give a model with --preset NAME or --config FILE")
    model = data.setdefault("model", {})
    if args.taper or args.multiple_of:
        current = model.get("taper", {"schedule": "uniform"})
        if args.taper:
            spec = TaperSpec.parse(args.taper, multiple_of=args.multiple_of)
        else:
            spec = run_config_from_dict({"model": {"taper": current}}, source).model.taper
        if args.multiple_of:
            spec.multiple_of = args.multiple_of
        model["taper"] = spec.to_dict()
        clear_resolved_sizes(model)
    apply_overrides(data, args.overrides)
    return run_config_from_dict(data, source).resolve()

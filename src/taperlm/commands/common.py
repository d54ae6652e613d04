"""The argument group shared by the commands that take a model config (plan, train, compare):
`--preset NAME | --config FILE`, `--taper SPEC`, `--head-taper SPEC`, `--kv-taper SPEC`,
`--multiple-of N`,
`--set key=value`, and the config assembly of plan and train. No torch import."""

from __future__ import annotations

import argparse

from taperlm.config import RunConfig, apply_overrides, clear_resolved_sizes, run_config_from_dict
from taperlm.domains import input_path, number
from taperlm.presets import config_data
from taperlm.taper import TaperSpec


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
        parser.add_argument(
            "--taper",
            help="taper spec: uniform | cosine[:START:END] | linear[:START:END] | "
            "sigmoid[:START:END[:K]] | groups:R1,R2,.. | custom:W1,W2,.. | "
            "novelty:SOURCE[:STRENGTH] (default: the config's)",
        )
        parser.add_argument(
            "--head-taper",
            help="taper of the attention query heads per layer, same spec language (e.g. "
            "cosine:1.25:0.75; KV heads follow at the model's group size) (default: the config's)",
        )
        parser.add_argument(
            "--kv-taper",
            help="taper of the KV heads per layer: multipliers of each layer's default KV heads "
            "(e.g. cosine:1.0:0.25, groups:0.5; custom integers are counts), the nearest "
            "divisors of its query heads; the MLP widths take up the parameters saved "
            "(default: the config's)",
        )
    parser.add_argument(
        "--multiple-of",
        type=number(int, "[1, inf)"),
        help="round every width to a multiple of N (default 16, as in the paper)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set model.n_layers=12 or --set train.lr=1e-3 "
        "(repeatable)",
    )


def build_run_config(args: argparse.Namespace) -> RunConfig:
    """preset/config file < --taper/--multiple-of < --set, resolved (widths computed)."""
    data, source = config_data(getattr(args, "config", None), getattr(args, "preset", None))
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
    if getattr(args, "head_taper", None):
        model["head_taper"] = args.head_taper
        clear_resolved_sizes(model)
    if getattr(args, "kv_taper", None):
        model["kv_taper"] = args.kv_taper
        clear_resolved_sizes(model)
    apply_overrides(data, args.overrides)
    return run_config_from_dict(data, source).resolve()

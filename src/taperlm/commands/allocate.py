"""`taperlm allocate --from SOURCE`: MLP widths from a pilot's measured novelty, at the budget.

    taperlm allocate --from runs/pilot --out widths.yaml           # measure, allocate, write
    taperlm train --config widths.yaml --out runs/novelty           # train the allocation
    taperlm allocate --from novelty.json --preset transformer-small --strength 0.3

SOURCE is a novelty measurement (the JSON of `taperlm novelty --json`, a compare cell's
result.json, or a run dir holding either), or a model to measure first with the options of
`taperlm novelty` (a run dir, a Hugging Face model dir, hf:NAME). The per-layer mean rho_mlp
becomes multipliers by the novelty rule (`taperlm.spec.taper.novelty_multipliers`: more width where
a layer writes new directions, less where it reinforces; `--strength` = the largest change of a
layer's width), and the exact-budget solver turns them into widths (monotone not required).
The target model is `--preset`/`--config`, else the run's own config; `--out` writes it as a
run config whose `model.taper` records the rule, its strength, source and rho values.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

from taperlm.commands.common import add_model_arguments, build_run_config, command_settings
from taperlm.commands.novelty import add_measure_arguments, measure_model
from taperlm.config import dump_yaml, load_run_config, to_dict
from taperlm.config.assembly import Assembly, Layer, add_setting_argument
from taperlm.config.budget import plan
from taperlm.errors import ConfigError
from taperlm.files.io import atomic_write_text
from taperlm.files.outfiles import R_FILE, yaml_mark
from taperlm.spec.domains import domain_of_field, input_path, number, output_path
from taperlm.spec.taper import DEFAULT_STRENGTH, TaperSpec, describe, multipliers, read_rho_mlp


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from",
        dest="source",
        type=input_path(text=True),
        required=True,
        metavar="SOURCE",
        help="a novelty JSON (`taperlm novelty --json`, a compare result.json), a run dir "
        "holding one, or a model to measure: a run dir, a Hugging Face model dir, hf:NAME",
    )
    add_setting_argument(  # read beside the config: the allocation's spec replaces model.taper
        parser,
        "--strength",
        "model.taper.strength",
        applies=False,
        type=number(float, domain_of_field(TaperSpec, "strength")),
        help="largest change of a layer's width as a fraction of the baseline, in (0, 1) "
        "[default 0.5: widths within 0.5x..1.5x, the paper's cosine range]",
    )
    add_model_arguments(parser, taper=False)
    parser.add_argument(
        "--out",
        type=output_path("file"),
        help="write the allocated run config (YAML) here" + R_FILE,
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--plot",
        type=output_path("file"),
        help="write the allocated widths beside the uniform ones as a PNG" + R_FILE,
    )
    group = parser.add_argument_group("measuring a model (as `taperlm novelty`)")
    add_measure_arguments(group)


def run(args: argparse.Namespace) -> int:
    rho, how = _rho_mlp(args)
    spec = TaperSpec(
        schedule="novelty",
        strength=DEFAULT_STRENGTH if args.strength is None else args.strength,
        source=str(args.source),
    )
    cfg = _target(args)
    if args.multiple_of:
        spec.multiple_of = args.multiple_of
    else:
        spec.multiple_of = cfg.model.taper.multiple_of
    spec = spec.with_novelty(rho)
    cfg.model = cfg.model.with_taper(spec)
    p = plan(cfg.model, cfg.train.seq_len)  # asserts the budget (parameters and FLOPs/token)
    if args.out:
        atomic_write_text(args.out, yaml_mark(dump_yaml(cfg), "allocate"))
    if args.json:
        print(json.dumps(_as_dict(cfg, p, how, args.out), indent=2))
    else:
        print(_format(cfg, p, how, args.out))
    if args.plot:
        from taperlm.analysis.plots import plot_width_profiles  # lazy: numpy, only for --plot

        m = cfg.model
        path = plot_width_profiles(
            {describe(m.taper): list(m.mlp_widths or [])},
            m.mlp_width,
            args.plot,
            title="Novelty-guided MLP widths (equal budget)",
        )
        if not args.json:
            print(f"width profile written to {path}")
    return 0


def _rho_mlp(args: argparse.Namespace) -> tuple[list[float], str]:
    """Per-layer rho_mlp of SOURCE (read, or measured), and how it was obtained."""
    path = Path(args.source)
    if path.is_file() or (path.is_dir() and _has_measurement(path)):
        return read_rho_mlp(path), f"read from {path}"
    result, data, n_ids = measure_model(args.source, args, progress=not args.json)
    return result.means("rho_mlp"), f"measured on {n_ids} tokens of {data}"


def _has_measurement(path: Path) -> bool:
    return any((path / name).is_file() for name in ("novelty.json", "result.json"))


def _target(args: argparse.Namespace):
    """The run config to allocate: --preset/--config (with --set), else SOURCE's own."""
    args.taper, args.head_taper, args.kv_taper = None, None, None
    if args.preset or args.config:
        return build_run_config(args)
    own = Path(args.source) / "config.yaml"
    if not own.is_file():
        raise ConfigError(
            f"--from {args.source} has no config.yaml to allocate; name the model with "
            "--preset NAME or --config FILE"
        )
    asm = Assembly.of(to_dict(load_run_config(own)), str(own), Layer.FILE)
    return asm.assemble(command_settings(args), args.overrides).resolve()


def _as_dict(cfg, p, how: str, out: Path | None) -> dict[str, Any]:
    m = cfg.model
    return {
        "source": m.taper.source,
        "rho_mlp": m.taper.rho_mlp,
        "how": how,
        "strength": m.taper.strength,
        "multipliers": multipliers(m.taper, m.n_layers),
        "mlp_widths": m.mlp_widths,
        "baseline_mlp_width": m.mlp_width,
        "taper": m.taper.to_dict(),
        "total_params": p.total_params,
        "baseline_total_params": p.baseline_total_params,
        "flops_per_token": p.flops_per_token,
        "baseline_flops_per_token": p.baseline_flops_per_token,
        "out": None if out is None else str(out),
    }


def _format(cfg, p, how: str, out: Path | None) -> str:
    m = cfg.model
    mult = multipliers(m.taper, m.n_layers)
    lines = [
        f"novelty allocation of {m.family} ({m.n_layers} layers, baseline MLP width "
        f"{m.mlp_width}): rho_mlp {how}",
        f"rule: r_l = 1 - {m.taper.strength:g} * (rho_l - mean rho) / max |rho - mean rho|, "
        f"then the exact-budget solver (multiple_of {m.taper.multiple_of})",
        "",
        f"{'layer':>5} {'rho_mlp':>8} {'multiplier':>10} {'width':>7}",
    ]
    for i, (r, x, w) in enumerate(zip(m.taper.rho_mlp, mult, m.mlp_widths or [])):
        lines.append(f"{i:>5} {r:>+8.3f} {x:>10.3f} {w:>7}")
    lines += [
        "",
        f"total parameters {p.total_params:,} (uniform {p.baseline_total_params:,}); training "
        f"FLOPs/token @{p.seq_len} {p.flops_per_token:,} (uniform {p.baseline_flops_per_token:,})",
    ]
    if out is not None:
        lines.append(f"run config written to {out}; train it with:\n  {train_command(cfg, out)}")
    return "\n".join(lines)


def train_command(cfg, out: Path) -> str:
    """The complete `taperlm train` line for the written config: its run dir beside it (the
    config's name without .yaml), and --data when the config names no data dir."""
    words = ["taperlm", "train", "--config", str(out)]
    if not cfg.data.dir:
        words += ["--data", "DATA"]  # no data known: the user's prepared folder
    words += ["--out", str(out.with_suffix("")) if out.suffix else f"{out}-run"]
    line = shlex.join(words)
    return line + ("   # DATA: a folder written by `taperlm prepare`" if not cfg.data.dir else "")

"""`taperlm prune SOURCE --out RUN`: prune a trained model's MLP widths to a smaller, tapered
(or uniform, or novelty-shaped) model; the result is a normal run dir.

    taperlm prune runs/base --out runs/pruned --params 0.5 --taper cosine:1.5:0.5
    taperlm prune runs/base --out runs/pruned --params 0.75 --params-of non-embedding --taper novelty
    taperlm train --init-from runs/pruned --distill-from runs/base --out runs/healed

`--params` is the target size: a fraction (< 1) of the source's parameters, or a count;
`--params-of non-embedding` counts parameters without the embedding and output head (only MLP
units are pruned; attention, norms and embeddings stay). The taper's exact solver gives the
per-layer widths at the target's budget; `novelty` shapes them by the source's own layer-wise
novelty measured on the calibration text (as `taperlm allocate`). Each layer keeps its
highest-scored units by `--score`, measured on `--calibration-tokens` tokens of the data's
train split (docs/compress.md compares the scores).
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

from taperlm.commands.common import command_settings
from taperlm.compress import ParamsOf, Score
from taperlm.config import OVERRIDES_ENV, env_overrides, to_dict
from taperlm.config.assembly import Assembly, Layer, add_set_argument, add_setting_argument
from taperlm.errors import ConfigError
from taperlm.files.io import atomic_write_text
from taperlm.spec.domains import (
    MAX_COUNT,
    MAX_TOKENS,
    choices,
    input_path,
    number,
    output_path,
    up_to,
)
from taperlm.spec.taper import DEFAULT_STRENGTH, TaperSpec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source", type=input_path(), help="the trained model: a run dir or a checkpoint dir"
    )
    parser.add_argument(
        "--out", type=output_path("dir"), required=True, help="the pruned run dir (created)"
    )
    parser.add_argument(
        "--params",
        type=number(float, "(0, inf)"),
        default=0.5,
        help="target size: a fraction (< 1) of the source's parameters, or a count [0.5]",
    )
    parser.add_argument(
        "--params-of",
        choices=choices(ParamsOf),
        default="total",
        help="what --params counts: total (default) or non-embedding (without the embedding "
        "and output head)",
    )
    parser.add_argument(
        "--taper",
        default="uniform",
        help="shape of the pruned widths: any taper spec (cosine:1.5:0.5, linear, groups:...), "
        "uniform (default), or novelty (the source's measured layer-wise novelty; "
        "novelty:FILE[:STRENGTH] reads a measurement)",
    )
    parser.add_argument(
        "--score",
        choices=choices(Score),
        default="weight_act",
        help="importance of a unit on the calibration text: weight_act (activation norm x "
        "output-weight norm, default), act (mean |activation|), flap (activation variance x "
        "squared output-weight norm)",
    )
    parser.add_argument(
        "--calibration-tokens",
        type=number(int, up_to(MAX_TOKENS)),
        default=None,
        help="train-split tokens the importance (and novelty) is measured on, at most the "
        "split's [65536, or the whole split when smaller]",
    )
    add_setting_argument(
        parser,
        "--data",
        "data.dir",
        str,
        type=input_path(),
        help="data dir of the calibration and of the pruned run (default: the source run's "
        "data.dir)",
    )
    parser.add_argument(
        "--step", type=number(int, up_to(MAX_COUNT, 0)), help="source checkpoint STEP (newest)"
    )
    parser.add_argument("--device", default="cpu", help="cpu | cuda | auto [cpu]")
    add_set_argument(
        parser,
        "override a train/data setting of the pruned run's config (e.g. train.tokens=65536); "
        "$TAPERLM_SET applies after",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _source(args: argparse.Namespace):
    """(model, run config) of SOURCE (newest checkpoint, or --step).

    The one place a source is read: a Hugging Face Llama-architecture folder will be imported
    into a run here first (`taperlm import`), then pruned like any run."""
    from taperlm.checkpoint.loading import load_run_model  # lazy: torch; --help stays torch-free

    return load_run_model(args.source, step=args.step, device=args.device)


def _run_root(path: Path) -> Path:
    return path.parent.parent if path.parent.name == "checkpoints" else path


def _spec(text: str) -> TaperSpec | None:
    """The taper; None for bare `novelty` (measured on the source below)."""
    if text == "novelty":
        return None
    try:
        return TaperSpec.parse(text)
    except Exception as err:  # TaperError: a bad spec
        raise ConfigError(f"--taper {text!r}: {err}") from None


def _pruned_settings(args: argparse.Namespace, src_run) -> Assembly:
    """The pruned run's train: and data: settings, by the one assembly (`taperlm.config.assembly`): the
    source's config < --data < --set < $TAPERLM_SET; the model section is the pruned one (set
    after the pruning). The calibration reads the data.dir assembled here, so the pruned run's
    config names the data it was calibrated on."""
    asm = Assembly.of(to_dict(src_run), "taperlm prune", Layer.FILE)
    # the pruned model is a new start: not the source's start weights or teacher (a healed
    # source names both); --set may still name them
    for key in ("train.init_from", "train.distill_from"):
        asm.put(key, "", Layer.OPTIONS)
    asm.assemble(command_settings(args), args.overrides)
    for key, layer in asm.origins.items():  # a bare key (`d_model=64`) looked up in model
        if key.startswith("model.") and layer >= Layer.SET:
            origin = "--set" if layer == Layer.SET else OVERRIDES_ENV
            raise ConfigError(
                f"{origin} changed {key}: the pruned model's shape comes from --params and "
                "--taper; --set may change the pruned run's train: and data: settings only"
            )
    return asm


def run(args: argparse.Namespace) -> int:
    import torch  # lazy: --help stays torch-free

    from taperlm.analysis.novelty import measure as measure_novelty  # lazy: torch
    from taperlm.checkpoint.loading import check_tokenizer, require_data_dir  # lazy: torch
    from taperlm.checkpoint.store import require_finite  # lazy: as above
    from taperlm.compress import prune as P  # lazy: torch
    from taperlm.runtime.device import resolve_device  # lazy: as above
    from taperlm.training.metrics import validation_loss  # lazy: torch

    args.device = resolve_device(args.device)
    spec = _spec(args.taper)
    for origin, texts in (("--set", args.overrides), (OVERRIDES_ENV, env_overrides())):
        model_keys = [o for o in texts if o.split("=", 1)[0].strip().startswith("model.")]
        if model_keys:
            raise ConfigError(
                f"{origin} {model_keys[0]}: the pruned model's shape comes from --params and "
                "--taper; --set may change the pruned run's train: and data: settings only"
            )
    model, src_run = _source(args)
    require_finite(
        model.state_dict().items(), f"the source {args.source}", "Prune another checkpoint (--step)"
    )
    P.check_prunable(src_run.model, model)
    width = P.target_width(src_run.model, args.params, args.params_of)
    # a shape given outright is checked before any measuring (novelty needs the measurement)
    target = None if spec is None else P.pruned_config(src_run.model, width, spec)
    asm = _pruned_settings(args, src_run)
    if asm.layer_of("data.dir") > Layer.FILE:  # --data, --set or $TAPERLM_SET: that folder
        data_dir = Path(asm.data["data"]["dir"]).expanduser()
    else:
        data_dir = require_data_dir(_run_root(Path(args.source)), src_run)
        asm.put("data.dir", str(data_dir), Layer.FILE)
    check_tokenizer(args.source, data_dir)  # calibration ids must mean what the source learned
    seq_len = src_run.train.seq_len
    args.calibration_tokens = P.calibration_budget(data_dir, seq_len, args.calibration_tokens)
    stats = P.measure(model, data_dir, seq_len, args.calibration_tokens)
    if target is None:
        windows = torch.cat(list(P.calibration_windows(data_dir, seq_len, args.calibration_tokens)))
        rho = measure_novelty(model, windows, seq_len=seq_len).means("rho_mlp")
        spec = TaperSpec(schedule="novelty", strength=DEFAULT_STRENGTH, source=str(args.source))
        target = P.pruned_config(src_run.model, width, spec.with_novelty(rho))
    pruned = P.prune(model, target, stats, args.score)

    asm.data["model"] = to_dict(target)
    run_cfg = asm.resolve()
    P.write_run(copy.deepcopy(run_cfg), args.out, pruned.model)
    cfg = run_cfg.train
    device = torch.device(args.device)
    before = validation_loss(model, data_dir, seq_len, cfg.micro_batch_size, cfg.eval_tokens)[0]
    pruned.model.to(device)
    after = validation_loss(pruned.model, data_dir, seq_len, cfg.micro_batch_size, cfg.eval_tokens)[
        0
    ]
    how = {
        "params": args.params,
        "params_of": args.params_of,
        "score": args.score,
        "calibration_tokens": args.calibration_tokens,
        "source_val_loss": before,
        "val_loss": after,
        "val_tokens": cfg.eval_tokens,
        "source_total_params": P.total_params(src_run.model),
    }
    record = P.prune_record(str(args.source), args.step, pruned, how)
    atomic_write_text(args.out / "prune.json", json.dumps(record, indent=2) + "\n")
    if args.json:
        print(json.dumps({k: v for k, v in record.items() if k != "kept_units"}, indent=2))
    else:
        print(_format(record, args.out))
    return 0


def _format(r: dict, out: Path) -> str:
    n, src = r["total_params"], r["source_total_params"]
    return "\n".join(
        [
            f"pruned {r['source']} ({src:,} parameters) to {n:,} ({n / src:.3f}x): taper "
            f"{r['taper']}, baseline MLP width {r['mlp_width']}",
            f"MLP widths per layer: {r['mlp_widths']}",
            f"units kept by score {r['score']} on {r['calibration_tokens']:,} calibration tokens",
            f"validation loss on {r['val_tokens']:,} tokens: {r['source_val_loss']:.4f} -> "
            f"{r['val_loss']:.4f}",
            f"run dir {out}; heal it by distillation (the source's training settings; "
            "--set train.tokens=N says how long) with:",
            f"  taperlm train --init-from {out} --distill-from {r['source']} --out {out}-healed",
        ]
    )

"""`taperlm plan`: per-layer widths, parameters and FLOPs of a taper beside its uniform baseline;
with `--gpus N`, also the per-GPU memory and the time of the run (training/planner.py); and the
ratio advice for the run's parameters and training tokens (ratio_advice.py: what the packaged
measurements say about the taper's ratio, and how sure)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import textwrap

from taperlm.commands.common import add_model_arguments, build_run_config
from taperlm.config import TrainConfig, dump_yaml
from taperlm.config.assembly import add_setting_argument
from taperlm.config.budget import format_plan, plan, plan_to_dict, total_params
from taperlm.config.presets import get_preset, preset_names
from taperlm.config.train import Parallel
from taperlm.files.io import atomic_write_json
from taperlm.files.outfiles import R_FILE, json_mark
from taperlm.hf.decilm import decilm_config
from taperlm.spec.domains import MAX_BATCH, choices, domain_of_field, number, output_path, up_to
from taperlm.spec.ratio_advice import advice, format_advice
from taperlm.training.planner import format_memory_plan, parse_bytes, plan_training


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_setting_argument(  # a planning input: beside the config, not written into it
        parser,
        "--seq-len",
        "train.seq_len",
        applies=False,
        type=number(int, domain_of_field(TrainConfig, "seq_len")),
        help="context for the attention FLOPs and the KV-cache totals (default: the model's)",
    )
    add_setting_argument(  # a planning input: beside the config, not written into it
        parser,
        "--tokens",
        "train.tokens",
        applies=False,
        type=number(float, domain_of_field(TrainConfig, "tokens")),
        help="training tokens T of the planned run: the ratio advice reads the measurements "
        "nearest its parameters and tokens per parameter; with --gpus, the time plan too "
        "(default: train.tokens)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--plot",
        type=output_path("file"),
        help="write the width profile (and the heads, with a head taper) as a PNG" + R_FILE,
    )
    parser.add_argument(
        "--block-configs",
        type=output_path("file"),
        metavar="OUT.json",
        help="write the planned model's per-layer config as a DeciLM / Nemotron-NAS config.json "
        "(block_configs: FFN width and KV heads per layer), the schema of Megatron-Core's "
        "heterogeneous layers, NeMo and the engines that serve Nemotron-NAS models; widths must "
        "be multiples of 256 (--multiple-of 256)" + R_FILE,
    )
    parser.add_argument("--dump-config", action="store_true", help="print the resolved YAML")
    parser.add_argument("--list-presets", action="store_true", help="list preset names and exit")
    g = parser.add_argument_group("memory and time plan (with --gpus)")
    g.add_argument(
        "--gpus",
        type=number(int, up_to(MAX_BATCH)),
        help="GPUs of the run: print per-GPU memory and time",
    )
    g.add_argument("--gpu-memory", default="80GB", help="memory of one GPU (default 80GB)")
    add_setting_argument(
        g,
        "--micro-batch",
        "train.micro_batch_size",
        applies=False,
        type=number(int, domain_of_field(TrainConfig, "micro_batch_size")),
        help="sequences per GPU per forward pass",
    )
    add_setting_argument(
        g,
        "--parallel",
        "train.parallel",
        applies=False,
        choices=choices(Parallel),
        help="default: the config's",
    )
    add_setting_argument(
        g,
        "--activation-checkpointing",
        "train.activation_checkpointing",
        _checkpointing,
        applies=False,
        action="store_true",
        help="recompute each block in backward",
    )
    g.add_argument(
        "--mfu", type=number(float, "(0, 1]"), default=0.4, help="assumed MFU (default 0.4)"
    )
    add_setting_argument(
        g,
        "--peak-tflops",
        "train.peak_flops",
        _tflops,
        applies=False,
        type=number(float, domain_of_field(TrainConfig, "peak_flops")),
        default=989.0,
        help="dense bf16 peak of one GPU (H100: 989)",
    )


def _checkpointing(on: bool) -> str:
    """--activation-checkpointing as train.activation_checkpointing."""
    return "full" if on else "none"


def _tflops(tflops: float) -> float:
    """--peak-tflops (TFLOP/s) as train.peak_flops (FLOP/s)."""
    return tflops * 1e12


def run(args: argparse.Namespace) -> int:
    if args.list_presets:
        _list_presets()
        return 0
    cfg = build_run_config(args)
    if args.dump_config:
        print(dump_yaml(cfg), end="")
        return 0
    if args.block_configs:
        config = decilm_config(cfg.model)  # refuses what the format cannot carry, first
        atomic_write_json(args.block_configs, json_mark(config, "plan"), indent=2)
    p = plan(cfg.model, args.seq_len)
    memory = _memory_plan(args, cfg) if args.gpus is not None else None
    tokens = args.tokens if args.tokens is not None else cfg.train.tokens
    m = cfg.model
    # Always, uniform models too: whether to taper at all is the first thing it answers.
    ratio = advice(
        total_params(m),
        tokens,
        taper="uniform" if m.taper.is_uniform else m.taper.to_string(),
        family=m.family,
    )
    if args.json:
        out = plan_to_dict(p)
        if memory is not None:
            out["memory_plan"] = memory.to_dict()
        out["ratio_advice"] = ratio
        print(json.dumps(out, indent=2))
    else:
        print(format_plan(p))
        print()
        print(format_advice(ratio))
        if memory is not None:
            print()
            print(format_memory_plan(memory))
    if args.plot:
        from taperlm.analysis.plots import plot_width_profiles  # lazy: numpy, only for --plot

        heads = [m.attention_heads(i)[0] for i in range(m.n_layers)]
        path = plot_width_profiles(
            {m.taper.to_string(): list(m.mlp_widths or [])},
            m.mlp_width,
            args.plot,
            heads={m.head_taper.as_text(): heads} if m.layer_heads is not None else None,
            baseline_heads=m.n_heads,
        )
        if not args.json:
            print(f"width profile written to {path}")
    if args.block_configs and not args.json:
        print(f"per-layer config (DeciLM block_configs) written to {args.block_configs}")
    return 0


def _memory_plan(args: argparse.Namespace, cfg):
    t = cfg.train
    return plan_training(
        cfg.model,
        gpus=args.gpus,
        gpu_memory=parse_bytes(args.gpu_memory),
        micro_batch=args.micro_batch if args.micro_batch is not None else t.micro_batch_size,
        seq_len=args.seq_len if args.seq_len is not None else t.seq_len,
        parallel=args.parallel or t.parallel,
        activation_checkpointing=args.activation_checkpointing
        or t.activation_checkpointing == "full",
        tokens=int(args.tokens) if args.tokens is not None else t.tokens,
        batch_tokens=t.batch_tokens,
        mfu=args.mfu,
        peak_flops=args.peak_tflops * 1e12,
        keep_checkpoints=t.keep_checkpoints,
        restore_nonfinite=t.restore_nonfinite,
    )


def _list_presets() -> None:
    print(
        f"{'preset':<22}{'layers':>7}{'d_model':>9}{'mlp_width':>11}{'vocab':>8}{'params':>10}"
        f"{'non-emb':>10}"
    )
    for name in preset_names():
        c = get_preset(name)
        params = total_params(c)
        # Parameters per vocabulary entry (the embedding row, and the output row when untied).
        per_token = total_params(dataclasses.replace(c, vocab_size=c.vocab_size + 1)) - params
        print(
            f"{name:<22}{c.n_layers:>7}{c.d_model:>9}{c.mlp_width:>11}{c.vocab_size:>8,}"
            f"{params / 1e6:>9.2f}M{(params - per_token * c.vocab_size) / 1e6:>9.2f}M"
        )
    print()
    note = (
        "params count the embeddings of the preset's vocab; with other data the same preset "
        "has another total: `taperlm compare` sizes the vocabulary to its data's tokenizer "
        "(its built-in corpus: 2,048 tokens), `train` takes --set model.vocab_size=N. non-emb "
        "(everything but the embedding and output rows) is the same for every vocabulary; "
        "`taperlm plan --preset NAME --set model.vocab_size=N` gives the exact count."
    )
    print(textwrap.fill(note, width=100))

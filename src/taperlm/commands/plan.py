"""`taperlm plan`: per-layer widths, parameters and FLOPs of a taper beside its uniform baseline;
with `--gpus N`, also the per-GPU memory and the time of the run (training/planner.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import textwrap

from taperlm.budget import plan, total_params
from taperlm.commands.common import add_model_arguments, build_run_config
from taperlm.config import TrainConfig, dump_yaml
from taperlm.domains import MAX_BATCH, domain_of_field, number, output_path, up_to
from taperlm.errors import TaperError
from taperlm.families import family
from taperlm.kv_taper import CACHE_DTYPE_BYTES
from taperlm.outfiles import R_FILE
from taperlm.presets import get_preset, preset_names
from taperlm.taper import describe
from taperlm.training.planner import format_memory_plan, parse_bytes, plan_training


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument(
        "--seq-len",
        type=number(int, domain_of_field(TrainConfig, "seq_len")),
        help="context for the attention FLOPs and the KV-cache totals (default: the model's)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--plot",
        type=output_path("file"),
        help="write the width profile (and the heads, with a head taper) as a PNG" + R_FILE,
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
    g.add_argument(
        "--micro-batch",
        type=number(int, domain_of_field(TrainConfig, "micro_batch_size")),
        help="sequences per GPU per forward pass",
    )
    g.add_argument("--parallel", choices=("fsdp", "ddp"), help="default: the config's")
    g.add_argument(
        "--activation-checkpointing", action="store_true", help="recompute each block in backward"
    )
    g.add_argument(
        "--tokens",
        type=number(float, domain_of_field(TrainConfig, "tokens")),
        help="training tokens (default: train.tokens)",
    )
    g.add_argument(
        "--mfu", type=number(float, "(0, 1]"), default=0.4, help="assumed MFU (default 0.4)"
    )
    g.add_argument(
        "--peak-tflops",
        type=number(float, domain_of_field(TrainConfig, "peak_flops")),
        default=989.0,
        help="dense bf16 peak of one GPU (H100: 989)",
    )


def run(args: argparse.Namespace) -> int:
    if args.list_presets:
        _list_presets()
        return 0
    cfg = build_run_config(args)
    if args.dump_config:
        print(dump_yaml(cfg), end="")
        return 0
    p = plan(cfg.model, args.seq_len)
    memory = _memory_plan(args, cfg) if args.gpus is not None else None
    if args.json:
        out = plan_to_dict(p)
        if memory is not None:
            out["memory_plan"] = memory.to_dict()
        print(json.dumps(out, indent=2))
    else:
        print(format_plan(p))
        if memory is not None:
            print()
            print(format_memory_plan(memory))
    if args.plot:
        from taperlm.analysis.plots import plot_width_profiles  # lazy: numpy, only for --plot

        m = cfg.model
        heads = [m.attention_heads(i)[0] for i in range(m.n_layers)]
        path = plot_width_profiles(
            {m.taper.to_string(): list(m.mlp_widths or [])},
            m.mlp_width,
            args.plot,
            heads={m.head_taper: heads} if m.layer_heads is not None else None,
            baseline_heads=m.n_heads,
        )
        if not args.json:
            print(f"width profile written to {path}")
    return 0


def _memory_plan(args: argparse.Namespace, cfg):
    t = cfg.train
    return plan_training(
        cfg.model,
        gpus=args.gpus,
        gpu_memory=parse_bytes(args.gpu_memory),
        micro_batch=args.micro_batch if args.micro_batch is not None else t.micro_batch_size,
        seq_len=args.seq_len if args.seq_len is not None else t.seq_len,
        parallel=args.parallel or ("fsdp" if t.parallel == "fsdp" else "ddp"),
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


def plan_to_dict(p) -> dict:
    cfg = p.config
    total_flops = sum(b.flops_per_token for b in p.layers)
    return {
        "family": cfg.family,
        "taper": cfg.taper.to_dict(),
        "taper_spec": cfg.taper.to_string(),
        "n_layers": cfg.n_layers,
        "d_model": cfg.d_model,
        "baseline_mlp_width": cfg.mlp_width,
        "mlp_widths": list(cfg.mlp_widths or []),
        "head_taper": cfg.head_taper,
        "baseline_heads": cfg.n_heads,
        "baseline_kv_heads": cfg.kv_heads,
        "heads": [b.heads for b in p.layers],
        "kv_heads": [b.kv_heads for b in p.layers],
        "kv_taper": cfg.kv_taper,
        "seq_len": p.seq_len,
        "budget_checked_at_contexts": p.checked_contexts,
        "flops_per_token_at_contexts": {
            str(c): {"tapered": a, "uniform": b} for c, (a, b) in p.flops_at_contexts.items()
        },
        "kv_cache": _kv_cache_dict(p),
        "layers": [
            {
                "layer": b.layer,
                "mlp_width": b.mlp_width,
                "multiplier": b.multiplier,
                "heads": b.heads,
                "kv_heads": b.kv_heads,
                "params": b.params,
                "mixer_params": b.mixer_params,
                "mlp_params": b.mlp_params,
                "baseline_params": bb.params,
                "flops_per_token": b.flops_per_token,
                "flops_share": b.flops_per_token / total_flops,
                "components": b.components,
            }
            for b, bb in zip(p.layers, p.baseline_layers)
        ],
        "total_params": p.total_params,
        "baseline_total_params": p.baseline_total_params,
        "params_difference": p.total_params - p.baseline_total_params,
        "flops_per_token": p.flops_per_token,
        "baseline_flops_per_token": p.baseline_flops_per_token,
        "flops_difference": p.flops_per_token - p.baseline_flops_per_token,
    }


def _kv_cache_dict(p) -> dict:
    """Per-layer and total KV-cache bytes per token and at the plan's context, bf16 and fp32."""
    out: dict = {"context": p.seq_len}
    for name, entries in (("tapered", p.kv_entries), ("uniform", p.baseline_kv_entries)):
        out[name] = {
            dtype: {
                "bytes_per_token": [e * n for e, _ in entries],
                "bytes_per_token_total": sum(e for e, _ in entries) * n,
                "bytes_at_context": [e * t * n for e, t in entries],
                "bytes_at_context_total": sum(e * t for e, t in entries) * n,
            }
            for dtype, n in CACHE_DTYPE_BYTES.items()
        }
    return out


def _kv_lines(p) -> list[str]:
    """The KV-cache summary of `format_plan`: bytes per token and at the context, both dtypes."""
    kv = _kv_cache_dict(p)
    lines = []
    for dtype in CACHE_DTYPE_BYTES:
        a, b = kv["tapered"][dtype], kv["uniform"][dtype]
        for label, key in (
            ("per token", "bytes_per_token_total"),
            (f"@{p.seq_len}", "bytes_at_context_total"),
        ):
            lines.append(
                f"{'KV cache ' + dtype + ' ' + label + ' (B)':<28}{a[key]:>16,}{b[key]:>16,}"
                f"{a[key] - b[key]:>+14,}"
            )
    return lines


def format_plan(p) -> str:
    cfg = p.config

    total_flops = sum(b.flops_per_token for b in p.layers)
    lines = [
        f"{cfg.family} model: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads, "
        f"vocab {cfg.vocab_size}, context {cfg.context_length}",
        f"taper: {describe(cfg.taper)} (multiple_of {cfg.taper.multiple_of}); "
        f"baseline mlp_width {cfg.mlp_width}",
        f"head taper: {describe(cfg.head_taper_spec())} (in steps of one KV group of "
        f"{cfg.group_size} query head{'s' if cfg.group_size > 1 else ''}, head dim "
        f"{cfg.head_dim}); baseline {_heads(cfg.n_heads, cfg.kv_heads)} heads per layer",
        f"KV taper: {describe(cfg.kv_taper_spec())}"
        + (
            " (each layer's KV heads divide its query heads; the MLP widths take up the "
            "K/V parameters saved)"
            if cfg.layer_kv_heads is not None
            else ""
        ),
        *(f"  {note}" for note in (cfg.solve_kv_heads().notes if _kv_from_spec(cfg) else [])),
        "",
        f"{'layer':>5} {'width':>7} {'x base':>7} {'heads':>7} {'params':>12} {'baseline':>12} "
        f"{'diff':>10} {'FLOPs share':>11} {'KV B/tok bf16':>13}",
    ]
    column = family(cfg).plan_column(cfg)
    extra_name, extra = column if column else ("", [])
    if extra_name:
        lines[-1] += f"  {extra_name}"
    for b, bb in zip(p.layers, p.baseline_layers):
        lines.append(
            f"{b.layer:>5} {b.mlp_width:>7} {b.multiplier:>7.3f} {_heads(b.heads, b.kv_heads):>7} "
            f"{b.params:>12,} {bb.params:>12,} "
            f"{b.params - bb.params:>+10,} {100 * b.flops_per_token / total_flops:>10.2f}%"
            f" {p.kv_entries[b.layer][0] * 2:>13,}" + (f"  {extra[b.layer]}" if extra_name else "")
        )
    mean = sum(cfg.mlp_widths or []) / cfg.n_layers
    lines += [
        "",
        f"mean width {mean:g} (baseline {cfg.mlp_width})",
        f"{'':<28}{'tapered':>16}{'uniform':>16}{'difference':>14}",
        f"{'total parameters':<28}{p.total_params:>16,}{p.baseline_total_params:>16,}"
        f"{p.total_params - p.baseline_total_params:>+14,}",
        f"{'training FLOPs/token @' + str(p.seq_len):<28}{p.flops_per_token:>16,}"
        f"{p.baseline_flops_per_token:>16,}{p.flops_per_token - p.baseline_flops_per_token:>+14,}",
        *_kv_lines(p),
        "",
    ]
    if cfg.layer_kv_heads is None:
        lines.append(
            "budget matched (checked): total parameters, and training FLOPs/token at context "
            + ", ".join(map(str, p.checked_contexts))
            + " (MLP parameters are linear in the width; attention parameters and score work in "
            "each layer's heads, at every context)"
        )
        return "\n".join(lines)
    diffs = {c: a - b for c, (a, b) in p.flops_at_contexts.items()}
    flops = (
        "equal at context "
        + ", ".join(map(str, diffs))
        + " (score/value work depends on the query heads only)"
        if not any(diffs.values())
        else "differ by "
        + ", ".join(f"{d:+,} at context {c}" for c, d in diffs.items())
        + " (this family repeats K/V projections beyond one per token)"
    )
    lines.append(
        "parameters matched (checked): the K/V parameters the KV taper saves went to the MLP "
        f"widths; training FLOPs/token {flops}; the KV cache is what changes"
    )
    return "\n".join(lines)


def _kv_from_spec(cfg) -> bool:
    """Whether the config's KV heads are the KV taper's solution (then its notes apply)."""
    if cfg.layer_kv_heads is None or cfg.kv_taper_spec().is_uniform:
        return False
    try:
        return cfg.solve_kv_heads().counts == cfg.layer_kv_heads
    except TaperError:  # a spec that no longer fits (the counts were written by hand)
        return False


def _heads(heads: int, kv_heads: int) -> str:
    """`4` for multi-head attention, `8/2` (query/KV) for grouped-query attention."""
    return str(heads) if heads == kv_heads else f"{heads}/{kv_heads}"

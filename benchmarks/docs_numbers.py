"""Numbers in the docs that the code computes, written into the docs by this script.

Each generated block sits between `<!-- docs_numbers:NAME -->` and `<!-- /docs_numbers:NAME -->`
in its page and is rendered here from the code (parameter counts, FLOPs, `taperlm plan`'s
memory and time plans), so it cannot drift from the code: tests/repo/test_docs_numbers.py fails when a
page's block differs from its rendering (the planner blocks in a `slow` test: the activation
trace of a 440M Titans plan takes ~20 s).

    python benchmarks/docs_numbers.py            # rewrite every block that drifted
    python benchmarks/docs_numbers.py --check    # exit 1 naming each block that drifted
    python benchmarks/docs_numbers.py --only scaling-plan-440m
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30

# The recipe of docs/scaling.md: transformer-440m, 30B tokens, 8 GPUs.
RECIPE = [
    "--preset", "transformer-440m", "--taper", "cosine", "--gpus", "8", "--gpu-memory", "80GB",
    "--micro-batch", "8", "--seq-len", "4096", "--parallel", "fsdp", "--tokens", "30e9",
    "--set", "train.batch_tokens=524288",
]  # fmt: skip


def plan_output(argv: list[str]) -> str:
    """What `taperlm plan ARGV` prints (run in this process)."""
    from taperlm.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["plan", *argv])
    if rc not in (0, None):
        raise RuntimeError(f"taperlm plan {' '.join(argv)} exited {rc}")
    return out.getvalue()


def plan_json(argv: list[str]) -> dict:
    return json.loads(plan_output([*argv, "--json"]))["memory_plan"]


def _with(argv: list[str], **changes: str) -> list[str]:
    """`argv` with option values replaced (`micro_batch="4"` -> --micro-batch 4); a value of
    "" drops the option, a flag given as True is appended."""
    out = list(argv)
    for key, value in changes.items():
        opt = "--" + key.replace("_", "-")
        if opt in out:
            i = out.index(opt)
            del out[i : i + 2]
        if value is True:
            out.append(opt)
        elif value:
            out += [opt, value]
    return out


# ----------------------------------------------------------------------------------------------
# blocks


def scaling_plan_block() -> str:
    text = plan_output(RECIPE)
    memory = text[text.index("per-GPU memory:") :].rstrip("\n")
    return f"```\n{memory}\n```"


SETTINGS = [
    ("FSDP2, micro-batch 8 (above)", {}, ""),
    ("DDP, micro-batch 8", {"parallel": "ddp"}, " (grads include DDP's buckets)"),
    ("FSDP2, micro-batch 8, `--activation-checkpointing`",
     {"activation_checkpointing": True}, ""),
    ("transformer-1.3b, FSDP2, micro-batch 4, 100B tokens",
     {"preset": "transformer-1.3b", "micro_batch": "4", "tokens": "100e9"}, ""),
    ("titans-mag-440m ({params}M parameters), FSDP2, micro-batch 8",
     {"preset": "titans-mag-440m"}, ""),
]  # fmt: skip


def scaling_settings_table() -> str:
    rows = [
        "| setting | params + grads + AdamW | step guard | activations | total per GPU |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, changes, note in SETTINGS:
        p = plan_json(_with(RECIPE, **changes))
        lines = p["lines"]
        state = (lines["parameters"] + lines["gradients"] + lines["optimizer"]) / GiB
        total = f"{p['total'] / GiB:.1f} GiB"
        if changes.get("activation_checkpointing"):
            total += " (time x4/3)"
        if "tokens" in changes:
            hours = p["seconds"] / 3600
            total += f"; {hours:.1f} h ({hours / 24:.1f} days) at {100 * p['mfu']:.0f}% MFU"
        if not p["fits"]:
            total += (
                f" of {p['gpu_memory'] / GiB:.0f}: does not fit; use "
                "`--activation-checkpointing` and/or micro-batch 1-2"
            )
        name = label.format(params=f"{p['params_total'] / 1e6:.0f}")
        rows.append(
            f"| {name} | {state:.2f} GiB{note} | "
            f"{lines['step guard'] / GiB:.2f} GiB | {lines['activations'] / GiB:.1f} GiB | {total} |"
        )
    return "\n".join(rows)


def scaling_recipe_numbers() -> str:
    """The recipe's time and checkpoint paragraphs (from the same plan)."""
    p = plan_json(RECIPE)

    def hours(mfu: float, peak: float) -> float:
        return p["tokens"] * p["flops_per_token"] / (p["gpus"] * peak * mfu) / 3600

    ckpt = p["checkpoint_bytes"]
    return (
        f"**Expected time**: {p['tokens'] / 1e9:.0f}B tokens x {p['flops_per_token'] / 1e9:.2f} "
        f"GFLOPs/token (6N + attention at 4K context) / ({p['gpus']} x "
        f"{p['peak_flops'] / 1e12:.0f} TFLOP/s x {100 * p['mfu']:.0f}% MFU) = "
        f"**{p['seconds'] / 3600:.1f} hours** on 8 H100/H200 (an assumed MFU: see below; at 30% "
        f"MFU {hours(0.3, p['peak_flops']):.1f} h; on A100s at 312 TFLOP/s and 40%, "
        f"{hours(0.4, 312e12):.0f} h).\n\n"
        f"**Checkpoints**: 12 bytes per parameter (fp32 weights 4 + AdamW moments 8) = "
        f"**{ckpt / 1e9:.2f} GB** per\ncheckpoint for {p['params_total'] / 1e6:.0f}M parameters "
        f"(plus a few kB of `state.pt` and manifest), one shard file per rank\n"
        f"(~{ckpt / p['gpus'] / 1e9:.2f} GB each on {p['gpus']} GPUs); `keep_checkpoints: 3` keeps "
        f"{3 * ckpt / 1e9:.1f} GB. `eval`, `export` and `generate`\nread a checkpoint's full "
        f"weights ({p['params_total'] * 4 / 1e9:.1f} GB) by converting the shards in one process."
    )


SIZES = ("micro", "tiny", "small", "440m", "760m", "1.3b")
ARCH_FAMILIES = ("transformer", "hope", "titans-mac", "titans-mag", "titans-mal")


def architectures_params_table() -> str:
    from taperlm.config.budget import total_params
    from taperlm.config.presets import get_preset

    rows = [
        "| size | " + " | ".join(ARCH_FAMILIES) + " |",
        "|---|" + "---|" * len(ARCH_FAMILIES),
    ]
    for size in SIZES:
        cells = [f"{total_params(get_preset(f'{f}-{size}')) / 1e6:.2f}M" for f in ARCH_FAMILIES]
        rows.append(f"| {size} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def architectures_flops_table() -> str:
    from taperlm.config.budget import flops_per_token
    from taperlm.config.presets import get_preset

    head = ["transformer GFLOP/tok", *ARCH_FAMILIES[1:]]
    rows = ["| size | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for size in ("440m", "760m", "1.3b"):
        cells = [f"{flops_per_token(get_preset(f'{f}-{size}')) / 1e9:.3f}" for f in ARCH_FAMILIES]
        rows.append(f"| {size} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def tapers_presets_table() -> str:
    from taperlm.config.budget import total_params
    from taperlm.config.presets import get_preset

    rows = [
        "| preset | layers | d_model | heads | mlp_width | params |",
        "|---|---|---|---|---|---|",
    ]
    for fam in ("transformer", "gated"):
        for size in ("440m", "760m", "1.3b"):
            c = get_preset(f"{fam}-{size}")
            rows.append(
                f"| {fam}-{size} | {c.n_layers} | {c.d_model} | {c.n_heads} | {c.mlp_width} | "
                f"{total_params(c) / 1e6:.1f}M |"
            )
    return "\n".join(rows)


def ratio_measurements_table() -> str:
    """The measured points `taperlm plan`'s ratio advice reads (the packaged file)."""
    from taperlm.spec.ratio_advice import load_measurements, points_markdown

    return points_markdown(load_measurements())


# The paper's run: transformer-440m at its 30B tokens (68 tokens per parameter).
ADVICE_440M = ["--preset", "transformer-440m", "--taper", "cosine", "--tokens", "30e9"]


def ratio_advice_block() -> str:
    text = plan_output(ADVICE_440M)
    return f"```\n{text[text.index('ratio advice:') :].rstrip()}\n```"


def gpu_measurements_table() -> str:
    """What the one GPU lease measured (benchmarks/results/gpu.json and scale.json)."""
    gpu = json.loads((ROOT / "benchmarks/results/gpu.json").read_text(encoding="utf-8"))
    scale = json.loads((ROOT / "benchmarks/results/scale.json").read_text(encoding="utf-8"))
    m = gpu["machine"]
    lines = [
        f"{m['gpu']}, torch {m['torch']}, batch {gpu['batch']} x {gpu['seq']}, bf16 autocast, "
        "fused AdamW (`benchmarks/results/gpu.json`, `scale.json`):",
        "",
        "| setup | preset | taper | compiled | tokens/s | MFU | peak GiB | planned GiB "
        "| compile s | DCP save / load s (GB) |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---|",
    ]

    def row(setup: str, r: dict, compiled: str, cache: str = "") -> str:
        planned = f"{r['planned_GiB']:.1f}" if "planned_GiB" in r else "-"
        dcp = (
            f"{r['dcp_save_s']:.1f} / {r['dcp_load_s']:.1f} ({r['dcp_GB']:.2f})"
            if "dcp_save_s" in r
            else "-"
        )
        warm = f"{r['warmup_s']:.1f}{cache}" if r["mode"] == "compile" else "-"
        return (
            f"| {setup} | {r['family']}-440m | {r['taper']} | {compiled} | {r['tokens/s']:,.0f} "
            f"| {r['mfu_%']:.1f} % | {r['peak_GiB']:.1f} | {planned} | {warm} | {dcp} |"
        )

    for r in gpu["rows"]:
        compiled = "whole model" if r["mode"] == "compile" else "no"
        # The plain-module rows were timed in a second invocation, with Inductor's cache warm.
        setup = f"plain module, widths x {gpu['multiple_of']}"
        lines.append(row(setup, r, compiled, " (cached)"))
    for r in scale["rows"]:
        n = r.get("graphs", 0)
        compiled = f"per block ({n} graph{'s' * (n != 1)})" if r["mode"] == "compile" else "no"
        lines.append(row(f"FSDP2 on 1 rank, widths x {scale['multiple_of']}", r, compiled))
    return "\n".join(lines)


@dataclass(frozen=True)
class Block:
    page: str
    render: Callable[[], str]
    planner: bool  # rendered by `taperlm plan --gpus` (slow: the activation trace)


BLOCKS = {
    "scaling-plan-440m": Block("docs/scaling.md", scaling_plan_block, True),
    "scaling-plan-settings": Block("docs/scaling.md", scaling_settings_table, True),
    "scaling-recipe-numbers": Block("docs/scaling.md", scaling_recipe_numbers, True),
    "scaling-gpu-measured": Block("docs/scaling.md", gpu_measurements_table, False),
    "architectures-params": Block("docs/architectures.md", architectures_params_table, False),
    "architectures-flops": Block("docs/architectures.md", architectures_flops_table, False),
    "tapers-presets": Block("docs/tapers.md", tapers_presets_table, False),
    "ratio-measurements": Block("docs/compare.md", ratio_measurements_table, False),
    "ratio-advice-440m": Block("docs/compare.md", ratio_advice_block, False),
}


def _pattern(name: str) -> re.Pattern:
    return re.compile(
        rf"(<!-- docs_numbers:{re.escape(name)} -->\n)(.*?)(\n<!-- /docs_numbers:{re.escape(name)} -->)",
        re.S,
    )


def current(name: str, root: Path = ROOT) -> str:
    """The block's text as the page holds it now (KeyError-like ValueError when no markers)."""
    page = (root / BLOCKS[name].page).read_text(encoding="utf-8")
    m = _pattern(name).search(page)
    if m is None:
        raise ValueError(f"{BLOCKS[name].page} has no <!-- docs_numbers:{name} --> block")
    return m.group(2)


def write(name: str, text: str, root: Path = ROOT) -> bool:
    """Put `text` into the page's block; whether it changed."""
    path = root / BLOCKS[name].page
    page = path.read_text(encoding="utf-8")
    new = _pattern(name).sub(lambda m: m.group(1) + text + m.group(3), page, count=1)
    if new != page:
        path.write_text(new, encoding="utf-8")
    return new != page


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="report drift, change nothing")
    ap.add_argument("--only", action="append", choices=sorted(BLOCKS), help="these blocks only")
    args = ap.parse_args(argv)
    drift = []
    for name in args.only or BLOCKS:
        text = BLOCKS[name].render()
        if text != current(name):
            drift.append(name)
            if not args.check:
                write(name, text)
    verb = "drifted" if args.check else "rewritten"
    print(f"{verb}: {', '.join(drift)}" if drift else "every block matches the code")
    return 1 if drift and args.check else 0


if __name__ == "__main__":
    sys.exit(main())

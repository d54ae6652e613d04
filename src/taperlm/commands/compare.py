"""`taperlm compare`: train width allocations x seeds at one budget and report the difference.

    taperlm compare --out cmp                                   # defaults: see docs/compare.md
    taperlm compare --preset transformer-small --tapers 'uniform;cosine:1.5:0.5' --seeds 5 \\
        --tokens 2000000 --data data/default --out cmp-small
    taperlm compare --paper controlled --out cmp-paper          # PAPER.md §3 grid

Precedence of training settings: compare's defaults < the config file's train: section <
--tokens < --set. Without --data the default corpus is prepared once into the cache
($TAPERLM_CACHE, else $XDG_CACHE_HOME/taperlm, else ~/.cache/taperlm) and reused.
Module-level imports stay light (no torch).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

# Defaults chosen so that 3 allocations x 5 seeds finish within about 15 minutes on 2 idle CPU
# cores, data preparation included (measurements in docs/compare.md). Five seeds rather than
# three: the paired 95% interval uses t(0.975, 4) = 2.78 instead of t(0.975, 2) = 4.30.
DEFAULT_PRESET = "transformer-tiny"
DEFAULT_SEEDS = 5
DEFAULT_TOKENS = 327_680  # 160 steps of 2,048 tokens
DEFAULT_VAL_TOKENS = 32768
DEFAULT_NOVELTY_TOKENS = 2048
DEFAULT_EVAL_LIMIT = 200
DEFAULT_THREADS = 2
COMPARE_TRAIN_DEFAULTS: dict[str, Any] = {
    "seq_len": 128,
    "micro_batch_size": 16,
    "batch_tokens": 2048,
    "lr": 2e-3,
    "min_lr_ratio": 0.1,
    "eval_tokens": 4096,
    "keep_checkpoints": 1,
    "log_every": 4,
}
# Derived from train.tokens unless given explicitly (config file or --set).
WARMUP_FRACTION = 0.05
CURVE_POINTS = 16
CHECKPOINTS_PER_RUN = 4
DEFAULT_CORPUS_TOKENIZER = "bpe:8192"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group()
    src.add_argument(
        "--preset",
        help=f"named model preset (default {DEFAULT_PRESET}; see `taperlm plan --list-presets`)",
    )
    src.add_argument("--config", type=Path, help="YAML config (model:, train:, data:)")
    parser.add_argument(
        "--tapers",
        help="allocations to compare, e.g. 'uniform;cosine:1.5:0.5;groups:1.5,1.0,0.5' "
        "(separate with ';', or with ',' when no spec holds commas; NAME=SPEC names one; "
        "uniform is always added) [default: uniform;cosine:1.5:0.5;cosine:0.5:1.5]",
    )
    parser.add_argument(
        "--taper",
        dest="taper_list",
        action="append",
        default=[],
        metavar="SPEC",
        help="one allocation (repeatable; alternative to --tapers)",
    )
    parser.add_argument(
        "--paper",
        choices=("controlled", "sweep"),
        help="the paper's grids: controlled = uniform / wider-early / wider-middle / wider-late "
        "(3 equal groups, §3); sweep = cosine/linear/sigmoid x 5 ratios + uniform (§4)",
    )
    parser.add_argument("--multiple-of", type=int, help="round widths to multiples of N (16)")
    parser.add_argument(
        "--seeds", type=int, default=DEFAULT_SEEDS, help=f"seeds 0..N-1 [{DEFAULT_SEEDS}]"
    )
    parser.add_argument(
        "--tokens", type=int, help=f"training tokens per run [default {DEFAULT_TOKENS:,}]"
    )
    parser.add_argument(
        "--data",
        type=Path,
        help="data dir from `taperlm prepare` (default: the built-in corpus, prepared once into "
        "the cache)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value for every run, e.g. --set train.lr=1e-3 (repeatable)",
    )
    parser.add_argument(
        "--val-tokens",
        type=int,
        default=DEFAULT_VAL_TOKENS,
        help=f"validation tokens for the final loss/ppl (0 = whole val split) [{DEFAULT_VAL_TOKENS}]",
    )
    parser.add_argument(
        "--eval-tasks",
        default="none",
        help="zero-shot tasks after training: none (default), paper (all nine), or a list such "
        "as wikitext,lambada_openai,piqa",
    )
    parser.add_argument(
        "--eval-limit",
        type=int,
        default=DEFAULT_EVAL_LIMIT,
        help=f"first N items per zero-shot task (0 = all) [{DEFAULT_EVAL_LIMIT}]",
    )
    parser.add_argument(
        "--eval-data",
        type=Path,
        help="folder laid out like ../shared/data (default: $TAPERLM_EVAL_DATA or ../shared/data)",
    )
    parser.add_argument(
        "--novelty-tokens",
        type=int,
        default=DEFAULT_NOVELTY_TOKENS,
        help=f"tokens for the novelty measurement [{DEFAULT_NOVELTY_TOKENS}]",
    )
    parser.add_argument(
        "--novelty-data",
        type=Path,
        help="text file for novelty (default: WikiText-2 test from ../shared/data, else the "
        "val split)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help=f"torch CPU threads [{DEFAULT_THREADS}]; use 1 on a machine shared with other jobs",
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder (resumable)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


# ----------------------------------------------------------------------------------------------
# configuration


def _allocations(args: argparse.Namespace):
    from taperlm.compare.grid import (
        DEFAULT_TAPERS,
        paper_allocations,
        parse_allocations,
        split_taper_list,
    )
    from taperlm.errors import ConfigError

    if args.paper and (args.tapers or args.taper_list):
        raise ConfigError("give either --paper MODE or --tapers/--taper, not both")
    if args.paper:
        return paper_allocations(args.paper, args.multiple_of)
    texts: list[str] = []
    if args.tapers is not None:
        texts += split_taper_list(args.tapers)
        if not texts:
            raise ConfigError("--tapers is empty; give e.g. --tapers 'uniform;cosine:1.5:0.5'")
    texts += [t.strip() for t in args.taper_list]
    return parse_allocations(texts or list(DEFAULT_TAPERS), args.multiple_of)


def _explicit_keys(args: argparse.Namespace, file_data: dict[str, Any]) -> set[str]:
    import dataclasses

    from taperlm.config import DataConfig, ModelConfig, TrainConfig, parse_override

    sections = {
        name: {f.name for f in dataclasses.fields(cls)}
        for name, cls in (("model", ModelConfig), ("train", TrainConfig), ("data", DataConfig))
    }

    keys = {f"train.{k}" for k in (file_data.get("train") or {})}
    keys |= {f"model.{k}" for k in (file_data.get("model") or {})}
    for text in args.overrides:
        key, _ = parse_override(text)
        parts = key.split(".")
        if parts[0] not in ("model", "train", "data"):
            owner = next((s for s, names in sections.items() if parts[0] in names), "?")
            parts = [owner, *parts]
        keys.add(".".join(parts[:2]))
    return keys


def build_base_config(args: argparse.Namespace, data_dir: Path | None, data_vocab: int | None):
    """The uniform run config every cell starts from (before taper and seed)."""
    from taperlm.config import (
        apply_overrides,
        clear_resolved_sizes,
        load_yaml,
        run_config_from_dict,
        to_dict,
    )
    from taperlm.errors import ConfigError
    from taperlm.presets import get_preset

    file_data: dict[str, Any] = {}
    if args.config:
        file_data = load_yaml(args.config)
        if "model" not in file_data and "family" in file_data:
            file_data = {"model": file_data}
        source = str(args.config)
        model = dict(file_data.get("model") or {})
    else:
        name = args.preset or DEFAULT_PRESET
        model = to_dict(get_preset(name, resolve=False))
        source = f"preset {name}"
    clear_resolved_sizes(model)
    model.pop("taper", None)
    explicit = _explicit_keys(args, file_data)
    train = {**COMPARE_TRAIN_DEFAULTS, **(file_data.get("train") or {})}
    data = dict(file_data.get("data") or {})
    if args.tokens is not None:
        if args.tokens < 1:
            raise ConfigError(f"--tokens must be >= 1, got {args.tokens}")
        train["tokens"] = args.tokens
        explicit.add("train.tokens")
    train.setdefault("tokens", DEFAULT_TOKENS)
    if data_dir is not None:
        data["dir"] = str(data_dir)
    if data_vocab is not None and not args.config and "model.vocab_size" not in explicit:
        model["vocab_size"] = data_vocab  # a preset follows the data's tokenizer
    cfg_data = {"model": model, "data": data, "train": train}
    apply_overrides(cfg_data, args.overrides)
    t = cfg_data["train"]
    tokens = int(float(t["tokens"]))
    batch = int(float(t.get("batch_tokens", 16384)))
    steps = max(1, tokens // batch)
    if "train.warmup_tokens" not in explicit:
        t["warmup_tokens"] = int(WARMUP_FRACTION * tokens) // batch * batch
    if "train.eval_every" not in explicit:
        t["eval_every"] = max(1, steps // CURVE_POINTS)
    if "train.checkpoint_every" not in explicit:
        t["checkpoint_every"] = max(1, steps // CHECKPOINTS_PER_RUN)
    cfg = run_config_from_dict(cfg_data, source)
    if cfg.model.taper.schedule != "uniform":
        raise ConfigError(
            "the config's model.taper must be uniform here; list tapers with --tapers"
        )
    if cfg.train.eval_tokens < 1:
        raise ConfigError("train.eval_tokens must be >= 1 for the loss curves")
    return cfg.resolve()


def cache_root() -> Path:
    env = os.environ.get("TAPERLM_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "taperlm"


def default_corpus_dir(progress: bool) -> Path:
    """The default corpus, prepared once into the cache (atomic: a temp dir renamed into place,
    so concurrent or interrupted runs never see a half-written data dir)."""
    import shutil

    from taperlm.data.prepare import META_FILE, prepare

    target = cache_root() / f"default-{DEFAULT_CORPUS_TOKENIZER.replace(':', '')}"
    if (target / META_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".tmp-{target.name}-{os.getpid()}")
    print(
        f"taperlm compare: preparing the default corpus into {target} (once; ~1 min)",
        file=sys.stderr,
    )
    try:
        prepare("default", tmp, DEFAULT_CORPUS_TOKENIZER, workers=2, progress=progress)
        if target.exists() and not (target / META_FILE).is_file():
            shutil.rmtree(target)  # an incomplete leftover
        if not target.exists():
            os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _eval_settings(args: argparse.Namespace, data_dir: Path):
    from taperlm.compare.runner import EvalSettings
    from taperlm.errors import ConfigError, DataError
    from taperlm.evaluation.tasks import TASKS

    tasks: list[str] = []
    for t in (x.strip() for x in args.eval_tasks.split(",")):
        if not t or t in ("none", "val"):
            continue
        for name in TASKS if t in ("paper", "all") else [t]:
            if name not in TASKS:
                raise ConfigError(
                    f"--eval-tasks: unknown task {name!r}; choose none, paper or from "
                    f"{', '.join(TASKS)}"
                )
            if name not in tasks:
                tasks.append(name)
    if args.eval_limit < 0:
        raise ConfigError(f"--eval-limit must be >= 0, got {args.eval_limit}")
    eval_data = None
    if tasks:
        from taperlm.evaluation.locate import eval_data_dir

        eval_data = args.eval_data or eval_data_dir()
        if eval_data is None or not Path(eval_data).is_dir():
            raise DataError(
                f"--eval-tasks {','.join(tasks)} needs the evaluation files: pass --eval-data DIR "
                "(laid out like ../shared/data) or set TAPERLM_EVAL_DATA, or use --eval-tasks none"
            )
    if args.novelty_tokens < 2:
        raise ConfigError(f"--novelty-tokens must be >= 2, got {args.novelty_tokens}")
    if args.val_tokens < 0:
        raise ConfigError(f"--val-tokens must be >= 0, got {args.val_tokens}")
    novelty_text = None
    if args.novelty_data is not None:
        if not args.novelty_data.is_file():
            raise DataError(f"--novelty-data {args.novelty_data} is not a file")
        novelty_text = str(args.novelty_data.resolve())
    else:
        from taperlm.evaluation.locate import wikitext_test

        try:
            novelty_text = str(wikitext_test())
        except DataError:
            novelty_text = None  # fall back to the val split
    return EvalSettings(
        val_tokens=args.val_tokens or None,
        eval_tasks=tasks,
        eval_limit=args.eval_limit or None,
        eval_data=None if eval_data is None else str(Path(eval_data).resolve()),
        novelty_tokens=args.novelty_tokens,
        novelty_text=novelty_text,
    )


def canonical_command(args: argparse.Namespace, grid, data_dir: Path) -> str:
    """A command line that reproduces this comparison (every choice explicit)."""
    parts = ["taperlm", "compare"]
    if args.config:
        parts += ["--config", str(args.config)]
    else:
        parts += ["--preset", args.preset or DEFAULT_PRESET]
    if grid.paper:
        parts += ["--paper", grid.paper]
    else:
        specs = [
            a.spec_string if a.label == a.spec_string else f"{a.name}={a.spec_string}"
            for a in grid.allocations
        ]
        parts += ["--tapers", ";".join(specs)]
    if args.multiple_of:
        parts += ["--multiple-of", str(args.multiple_of)]
    parts += ["--seeds", str(len(grid.seeds)), "--tokens", str(grid.base.train.tokens)]
    if args.data is not None:
        parts += ["--data", str(args.data)]
    for o in args.overrides:
        parts += ["--set", o]
    parts += ["--val-tokens", str(args.val_tokens), "--eval-tasks", args.eval_tasks]
    if args.eval_tasks not in ("none", ""):
        parts += ["--eval-limit", str(args.eval_limit)]
    parts += ["--novelty-tokens", str(args.novelty_tokens)]
    if args.novelty_data is not None:
        parts += ["--novelty-data", str(args.novelty_data)]
    parts += ["--threads", str(args.threads), "--out", str(args.out)]
    return shlex.join(parts)


# ----------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    from taperlm.errors import ConfigError

    t_start = time.perf_counter()
    cpu_start = time.process_time()
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    if args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    allocations = _allocations(args)

    import torch

    from taperlm.compare.grid import build_grid
    from taperlm.compare.report import write_report
    from taperlm.compare.runner import run_grid
    from taperlm.data.loader import load_meta
    from taperlm.training.loop import validate_train_config

    torch.set_num_threads(args.threads)
    seeds = list(range(args.seeds))
    # Validate everything that does not need the data before preparing it.
    provisional = build_base_config(args, None, None)
    build_grid(provisional, allocations, seeds, args.paper)
    validate_train_config(provisional)

    progress = not args.no_progress
    if args.data is not None:
        data_dir = args.data.expanduser().resolve()
        load_meta(data_dir)  # DataError naming `taperlm prepare` when missing or incomplete
    elif provisional.data.dir:
        data_dir = Path(provisional.data.dir).expanduser().resolve()
        load_meta(data_dir)
    else:
        data_dir = default_corpus_dir(progress)
    meta = load_meta(data_dir)
    base = build_base_config(args, data_dir, int(meta["vocab_size"]))
    grid = build_grid(base, allocations, seeds, args.paper)
    settings = _eval_settings(args, data_dir)

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    command = canonical_command(args, grid, data_dir)
    print(
        f"taperlm compare: {len(grid.allocations)} allocations x {len(seeds)} seeds = "
        f"{len(grid.cells)} runs of {base.train.tokens:,} tokens "
        f"({grid.budget[grid.allocations[0].name]['params']:,} params each) into {out}",
        file=sys.stderr,
    )

    def report_meta(results: dict[str, Any]) -> dict[str, Any]:
        first = next(iter(results.values()))
        m = base.model
        t = base.train
        return {
            "title": _title(args, grid),
            "command": command,
            "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "taperlm_version": _version(),
            "torch_version": torch.__version__,
            "threads": args.threads,
            "paper_mode": args.paper,
            "cells": len(grid.cells),
            "wall_s": time.perf_counter() - t_start,
            "cpu_s": time.process_time() - cpu_start,
            "model": {
                "family": m.family,
                "n_layers": m.n_layers,
                "d_model": m.d_model,
                "n_heads": m.n_heads,
                "mlp_width": m.mlp_width,
                "vocab_size": m.vocab_size,
            },
            "settings": {
                "tokens": t.tokens,
                "steps": t.tokens // t.batch_tokens,
                "batch_tokens": t.batch_tokens,
                "seq_len": t.seq_len,
                "lr": t.lr,
                "warmup_tokens": t.warmup_tokens,
                "eval_every": t.eval_every,
                "eval_tokens": t.eval_tokens,
                "seeds": seeds,
                "data_dir": str(data_dir),
                "train_tokens": int(meta["splits"]["train"]["tokens"]),
                "val_tokens": first["val"]["tokens"],
                "eval_tasks": settings.eval_tasks,
                "eval_limit": settings.eval_limit,
                "novelty_text": settings.novelty_text or f"{data_dir}/val.bin",
                "novelty_tokens": settings.novelty_tokens,
            },
        }

    def partial(results: dict[str, Any]) -> None:
        meta = report_meta(results)
        meta["title"] += f" (PARTIAL: {len(results)}/{len(grid.cells)} runs done)"
        write_report(grid, results, out, meta)

    results = run_grid(grid, out, data_dir, settings, progress=progress, on_seed_done=partial)
    md, js = write_report(grid, results, out, report_meta(results))
    print(f"wrote {md} and {js} ({(time.perf_counter() - t_start) / 60:.1f} min)")
    return 0


def _title(args: argparse.Namespace, grid) -> str:
    model = str(args.config) if args.config else (args.preset or DEFAULT_PRESET)
    mode = f"paper {grid.paper}" if grid.paper else f"{len(grid.allocations)} allocations"
    return f"{model}, {mode}, {len(grid.seeds)} seeds, {grid.base.train.tokens:,} tokens/run"


def _version() -> str:
    from taperlm import __version__

    return __version__

"""The comparison job (`taperlm compare`): its options, the base config every cell starts from,
the allocations, the default corpus (prepared once into a cache), how cells are evaluated, and
`run_comparison`, which ties grid, runner and report together.

Precedence of training settings: compare's defaults < the config file's train: section <
`tokens` < `overrides` (`--set`). Without a data dir the default corpus is prepared once into the
cache ($TAPERLM_CACHE, else $XDG_CACHE_HOME/taperlm, else ~/.cache/taperlm) and reused.
Module-level imports stay light (no torch).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taperlm.errors import ConfigError, DataError
from taperlm.runlock import locked

# Defaults chosen by measurement (docs/compare.md, "Precision of the main job") so that uniform vs
# cosine 1.5 -> 0.5 over DEFAULT_SEEDS seeds finishes within 15 minutes on 2 idle CPU cores, data
# preparation included, with a paired 95% interval of about +-0.012 nats. What made it precise:
# runs past the unigram plateau (320 steps of 1,024 tokens instead of 160 of 2,048; the gap
# between two allocations opens while they leave it, and its size varies from seed to seed), an
# init of about 1/sqrt(d_model) for these small widths (GPT-2's 0.02 suits d_model ~768+; at
# 128 it kept the models on the plateau longer and less predictably), validation on ~all of the
# built-in corpus's val split, and the cheaper 2,048-token vocabulary (more seeds per minute).
DEFAULT_PRESET = "transformer-micro"
DEFAULT_SEEDS = 15
# --paper grids (4 to 16 allocations, or a table of families) default to fewer seeds per allocation
PAPER_MODE_SEEDS = 5
# --paper scaling fits a curve per point, from 5 allocations: more seeds (~2.7 h on 2 cores)
SCALING_SEEDS = 8
DEFAULT_TOKENS = 327_680  # 320 steps of 1,024 tokens
DEFAULT_VAL_TOKENS = 131_072  # the built-in corpus's val split has 134,528 at bpe:2048
DEFAULT_NOVELTY_TOKENS = 2048
DEFAULT_EVAL_LIMIT = 200
DEFAULT_THREADS = 1  # torch threads per cell (worker); cells run in parallel instead
COMPARE_TRAIN_DEFAULTS: dict[str, Any] = {
    "seq_len": 128,
    "micro_batch_size": 8,
    "batch_tokens": 1024,
    "lr": 2e-3,
    "min_lr_ratio": 0.1,
    "eval_tokens": 4096,
    "keep_checkpoints": 1,
    "log_every": 4,
}
# Model settings of compare's CPU recipe for a preset of a small size (micro, tiny, small); a config
# file's model section and --set win. Not applied at the paper's sizes (their init is the paper's).
COMPARE_MODEL_DEFAULTS: dict[str, Any] = {"init_std": 0.1}
# A preset of one of the paper's sizes trains with the paper's recipe instead (its training recipe:
# AdamW, peak lr 4e-4, weight decay 0.1, cosine decay, 0.5M-token batches of 4K-token
# sequences, 30B/50B/100B tokens), so that the same command runs the paper's experiment on GPUs.
# micro_batch_size 4 (16 accumulation steps) fits a 1.3B model at 4K context on an 80 GB GPU
# with bf16 autocast; raise it where memory allows (--set train.micro_batch_size=N).
PAPER_TRAIN_DEFAULTS: dict[str, Any] = {
    "seq_len": 4096,
    "micro_batch_size": 4,
    "batch_tokens": 524_288,
    "lr": 4e-4,
    "min_lr_ratio": 0.1,
    "weight_decay": 0.1,
    "eval_tokens": 524_288,
    "keep_checkpoints": 2,
    "log_every": 10,
}
PAPER_TOKENS = {"440m": 30_000_000_000, "760m": 50_000_000_000, "1.3b": 100_000_000_000}
# Derived from train.tokens unless given explicitly (config file or --set).
WARMUP_FRACTION = 0.05
CURVE_POINTS = 16
CHECKPOINTS_PER_RUN = 4
DEFAULT_CORPUS_TOKENIZER = "bpe:2048"
# novelty:pilot allocations: the pilot trains this fraction of a run's tokens (whole batches).
PILOT_FRACTION = 0.25


@dataclass
class CompareOptions:
    """What to compare and how (the options of `taperlm compare`, named as its arguments)."""

    out: Path
    preset: str | None = None  # None (and no config): DEFAULT_PRESET
    config: Path | None = None
    tapers: str | None = None  # a list, see taperlm.compare.grid.split_taper_list
    taper_list: list[str] = field(default_factory=list)  # one allocation each
    paper: str | None = None  # controlled | sweep | families
    preset_size: str | None = None  # --paper families: the size of every family's preset
    families: str | None = None  # --paper families: preset prefixes (None: the default list)
    multiple_of: int | None = None
    seeds: int | None = None  # None: DEFAULT_SEEDS, or PAPER_MODE_SEEDS with --paper
    tokens: int | None = None
    data: Path | None = None
    overrides: list[str] = field(default_factory=list)
    val_tokens: int = DEFAULT_VAL_TOKENS
    eval_tasks: str = "none"
    eval_limit: int = DEFAULT_EVAL_LIMIT
    eval_data: Path | None = None
    eval_niah_lengths: str = ""  # empty: each cell's context_length
    novelty_tokens: int = DEFAULT_NOVELTY_TOKENS
    novelty_data: Path | None = None
    threads: int = DEFAULT_THREADS
    jobs: int | None = None  # cells at a time; None: as many as idle cores allow
    no_progress: bool = False
    pilot_tokens: int | None = None  # None: PILOT_FRACTION of a run (novelty:pilot only)
    loggers: list[str] | None = None  # train.loggers of every cell (None: the config's)
    tune_lr: bool = False  # each allocation at its own best lr (taperlm.compare.tuning)
    lr_grid: str | None = None  # None: the recipe's lr x tuning.DEFAULT_LR_FACTORS
    tune_seeds: int | None = None  # None: tuning.DEFAULT_TUNE_SEEDS
    tune_scope: str | None = None  # each (None) | uniform

    def __post_init__(self) -> None:
        if self.seeds is None:
            self.seeds = PAPER_MODE_SEEDS if self.paper else DEFAULT_SEEDS
            self.seeds = SCALING_SEEDS if self.paper == "scaling" else self.seeds


# ----------------------------------------------------------------------------------------------
# configuration


def allocations(opts: CompareOptions):
    """The allocations to compare (uniform always included, paper numbers attached)."""
    from taperlm.compare.grid import (
        DEFAULT_TAPERS,
        paper_allocations,
        parse_allocations,
        split_taper_list,
    )

    if opts.paper and (opts.tapers or opts.taper_list):
        raise ConfigError("give either --paper MODE or --tapers/--taper, not both")
    if opts.paper:
        return paper_allocations(opts.paper, opts.multiple_of)
    if opts.preset_size or opts.families:
        raise ConfigError(
            "--preset-size and --families belong to --paper families; for one model give "
            "--preset FAMILY-SIZE (e.g. --preset gated-small)"
        )
    texts: list[str] = []
    if opts.tapers is not None:
        texts += split_taper_list(opts.tapers)
        if not texts:
            raise ConfigError("--tapers is empty; give e.g. --tapers 'uniform;cosine:1.5:0.5'")
    texts += [t.strip() for t in opts.taper_list]
    return parse_allocations(texts or list(DEFAULT_TAPERS), opts.multiple_of)


def _explicit_keys(opts: CompareOptions, file_data: dict[str, Any]) -> set[str]:
    """`section.key` of every setting the user gave (config file or --set), which compare's
    defaults and derived values must not override."""
    from taperlm.config import parse_override, section_of

    keys = {f"train.{k}" for k in (file_data.get("train") or {})}
    keys |= {f"model.{k}" for k in (file_data.get("model") or {})}
    for text in opts.overrides:
        key, _ = parse_override(text)
        parts = key.split(".")
        if parts[0] not in ("model", "train", "data"):
            parts = [section_of(parts[0]) or "?", *parts]
        keys.add(".".join(parts[:2]))
    return keys


def base_config(
    opts: CompareOptions,
    data_dir: Path | None,
    data_vocab: int | None,
    notes: list[str] | None = None,
):
    """The uniform run config every cell starts from (before taper and seed); what it had to
    change (train.tokens rounded up to whole steps) is appended to `notes`."""
    from taperlm.config import apply_overrides, clear_resolved_sizes, run_config_from_dict
    from taperlm.presets import config_data

    loaded, source = config_data(opts.config, opts.preset or DEFAULT_PRESET)
    file_data = loaded if opts.config else {}  # a preset's values are no choice of the user's
    model = {**(loaded.get("model") or {}), **_model_defaults(opts)}
    clear_resolved_sizes(model)
    model.pop("taper", None)
    explicit = _explicit_keys(opts, file_data)
    train = {**_train_defaults(opts, model.get("family")), **(file_data.get("train") or {})}
    data = dict(file_data.get("data") or {})
    if opts.tokens is not None:
        if opts.tokens < 1:
            raise ConfigError(f"--tokens must be >= 1, got {opts.tokens}")
        train["tokens"] = opts.tokens
        explicit.add("train.tokens")
    train.setdefault("tokens", DEFAULT_TOKENS)
    if data_dir is not None:
        data["dir"] = str(data_dir)
    if data_vocab is not None and not opts.config and "model.vocab_size" not in explicit:
        model["vocab_size"] = data_vocab  # a preset follows the data's tokenizer
    cfg_data = {"model": model, "data": data, "train": train}
    apply_overrides(cfg_data, opts.overrides)
    _set_loggers(cfg_data["train"], opts, explicit)
    note = _derive_schedule(cfg_data["train"], explicit)
    if note and notes is not None:
        notes.append(note)
    cfg = run_config_from_dict(cfg_data, source)
    if cfg.model.taper.schedule != "uniform":
        raise ConfigError(
            "the config's model.taper must be uniform here; list tapers with --tapers"
        )
    if cfg.train.eval_tokens < 1:
        raise ConfigError("train.eval_tokens must be >= 1 for the loss curves")
    return cfg.resolve()


def _set_loggers(train: dict[str, Any], opts: CompareOptions, explicit: set[str]) -> None:
    """--logger, and one logged group for the comparison's runs (each run is named after its
    folder: allocation-sSEED), unless the user named the group."""
    if opts.loggers is not None:
        train["loggers"] = opts.loggers
    if train.get("loggers") and "train.log_group" not in explicit:
        where = opts.out.resolve()
        digest = hashlib.sha1(str(where).encode()).hexdigest()[:6]
        train["log_group"] = f"{where.name}-{digest}"  # unique per comparison folder


def _preset_size(opts: CompareOptions) -> str | None:
    """The size of the model's preset (`tiny`, `440m`, ...); None for a config file."""
    return None if opts.config else (opts.preset or DEFAULT_PRESET).rpartition("-")[2]


def _train_defaults(opts: CompareOptions, family_name: str | None) -> dict[str, Any]:
    """Compare's CPU defaults (with the family's own learning rate where it has one), or the
    paper's recipe for a preset of one of its sizes."""
    from taperlm.families import get_family

    size = _preset_size(opts)
    if size in PAPER_TOKENS:
        return {**PAPER_TRAIN_DEFAULTS, "tokens": PAPER_TOKENS[size]}
    lr = get_family(family_name or "transformer").compare_lr
    return {**COMPARE_TRAIN_DEFAULTS, **({"lr": lr} if lr is not None else {})}


def _model_defaults(opts: CompareOptions) -> dict[str, Any]:
    """Compare's model settings for a preset of a small size; none for a config file (its model
    section is the user's) or a preset of the paper's sizes."""
    size = _preset_size(opts)
    return {} if size is None or size in PAPER_TOKENS else dict(COMPARE_MODEL_DEFAULTS)


def _derive_schedule(train: dict[str, Any], explicit: set[str]) -> str | None:
    """Whole steps (train.tokens rounded up, said once here rather than by every cell), then
    warmup, evaluation and checkpoint intervals from them, unless given."""
    from taperlm.config import TrainConfig

    tokens = int(float(train["tokens"]))
    batch = int(float(train.get("batch_tokens", TrainConfig.batch_tokens)))
    rounding = TrainConfig(tokens=tokens, batch_tokens=max(1, batch))
    steps = rounding.steps
    note = rounding.rounding_note() if tokens >= batch >= 1 else None
    if note:
        train["tokens"] = tokens = steps * batch
    if "train.warmup_tokens" not in explicit:
        train["warmup_tokens"] = int(WARMUP_FRACTION * tokens) // batch * batch
    if "train.eval_every" not in explicit:
        train["eval_every"] = max(1, steps // CURVE_POINTS)
    if "train.checkpoint_every" not in explicit:
        train["checkpoint_every"] = max(1, steps // CHECKPOINTS_PER_RUN)
    return note


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

    from taperlm.data.corpus import default_corpus_identity
    from taperlm.data.prepare import META_FILE, PIPELINE_VERSION, prepare

    # Keyed by what it is built from (the installed files, the pipeline): an upgraded package
    # or taperlm gets a fresh corpus rather than a stale one under the same name.
    inputs = json.dumps([PIPELINE_VERSION, default_corpus_identity()]).encode()
    digest = hashlib.sha256(inputs).hexdigest()[:12]
    target = cache_root() / f"default-{DEFAULT_CORPUS_TOKENIZER.replace(':', '')}-{digest}"
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


def eval_settings(opts: CompareOptions):
    """How every cell is evaluated (zero-shot tasks, their data, novelty text and tokens)."""
    from taperlm.compare.runner import EvalSettings
    from taperlm.evaluation.locate import eval_data_dir, wikitext_test
    from taperlm.evaluation.niah import DEFAULT_HAYSTACK, parse_lengths
    from taperlm.evaluation.niah import TASKS as NIAH_TASKS
    from taperlm.evaluation.registry import zero_shot_tasks
    from taperlm.evaluation.suite import parse_task_list

    suite = tuple(zero_shot_tasks())
    groups = {"paper": suite, "niah": NIAH_TASKS, "all": (*suite, *NIAH_TASKS)}
    tasks = parse_task_list(
        opts.eval_tasks, groups["all"], "--eval-tasks", skip=("none", "val"), groups=groups
    )
    if opts.eval_limit < 0:
        raise ConfigError(f"--eval-limit must be >= 0, got {opts.eval_limit}")
    niah_lengths = None
    if opts.eval_niah_lengths.strip():
        niah_lengths = parse_lengths(opts.eval_niah_lengths, "--eval-niah-lengths")
    eval_data = None
    # Files of the zero-shot tasks (the NIAH tasks need none: their prose ships with Python).
    if [t for t in tasks if t not in NIAH_TASKS]:
        eval_data = opts.eval_data or eval_data_dir()
        if eval_data is None or not Path(eval_data).is_dir():
            raise DataError(
                f"--eval-tasks {','.join(tasks)} needs the evaluation files: pass --eval-data DIR "
                "(laid out like ../shared/data) or set TAPERLM_EVAL_DATA, or use --eval-tasks none"
            )
    if opts.novelty_tokens < 2:
        raise ConfigError(f"--novelty-tokens must be >= 2, got {opts.novelty_tokens}")
    if opts.val_tokens < 0:
        raise ConfigError(f"--val-tokens must be >= 0, got {opts.val_tokens}")
    novelty_text = None
    if opts.novelty_data is not None:
        if not opts.novelty_data.is_file():
            raise DataError(f"--novelty-data {opts.novelty_data} is not a file")
        novelty_text = str(opts.novelty_data.resolve())
    else:
        try:
            novelty_text = str(wikitext_test())
        except DataError:
            novelty_text = None  # fall back to the val split
    return EvalSettings(
        val_tokens=opts.val_tokens or None,
        eval_tasks=tasks,
        eval_limit=opts.eval_limit or None,
        eval_data=None if eval_data is None else str(Path(eval_data).resolve()),
        niah_lengths=niah_lengths,
        # in the cache key: cells evaluated on another prose (WikiText before) are re-evaluated
        niah_haystack=DEFAULT_HAYSTACK if {"niah_single_2", "niah_single_3"} & set(tasks) else None,
        novelty_tokens=opts.novelty_tokens,
        novelty_text=novelty_text,
    )


def _check_niah_lengths(settings, context: int) -> None:
    """Refuse before training when every NIAH length would be skipped (longer than the cells'
    context); longer lengths among shorter ones are skipped per cell, with the reason."""
    from taperlm.evaluation.niah import TASKS as NIAH_TASKS

    lengths = settings.niah_lengths
    if lengths and any(t in NIAH_TASKS for t in settings.eval_tasks) and min(lengths) > context:
        raise ConfigError(
            f"--eval-niah-lengths {','.join(map(str, lengths))}: every length is longer than the "
            f"models' context_length {context}; give lengths <= {context}"
        )


def canonical_command(opts: CompareOptions, grid) -> str:
    """A command line that reproduces this comparison (every choice explicit)."""
    parts = ["taperlm", "compare"]
    if opts.config:
        parts += ["--config", str(opts.config)]
    else:
        parts += ["--preset", opts.preset or DEFAULT_PRESET]
    if grid.paper:
        parts += ["--paper", grid.paper]
    else:
        specs = [
            a.spec_string if a.label == a.spec_string else f"{a.name}={a.spec_string}"
            for a in grid.allocations
        ]
        parts += ["--tapers", ";".join(specs)]
    if opts.multiple_of:
        parts += ["--multiple-of", str(opts.multiple_of)]
    pilot = grid.pilot and grid.pilot["tokens"]
    return shlex.join(parts + run_arguments(opts, len(grid.seeds), grid.base.train.tokens, pilot))


def run_arguments(
    opts: CompareOptions, seeds: int, tokens: int, pilot: int | None = None
) -> list[str]:
    """The arguments after the model and allocations in a reproducing command line (`pilot`:
    the pilot runs' tokens, when the grid has novelty:pilot allocations)."""
    parts = ["--seeds", str(seeds), "--tokens", str(tokens)]
    if opts.data is not None:
        parts += ["--data", str(opts.data)]
    for o in opts.overrides:
        parts += ["--set", o]
    parts += ["--val-tokens", str(opts.val_tokens), "--eval-tasks", opts.eval_tasks]
    if opts.eval_tasks not in ("none", ""):
        parts += ["--eval-limit", str(opts.eval_limit)]
    if opts.eval_niah_lengths.strip():
        parts += ["--eval-niah-lengths", opts.eval_niah_lengths]
    parts += ["--novelty-tokens", str(opts.novelty_tokens)]
    if opts.novelty_data is not None:
        parts += ["--novelty-data", str(opts.novelty_data)]
    if pilot is not None:
        parts += ["--pilot-tokens", str(pilot)]
    if opts.tune_lr:
        from taperlm.compare.tuning import DEFAULT_TUNE_SEEDS, lr_grid

        parts.append("--tune-lr")
        if opts.lr_grid is not None:  # else each model's default grid, around its recipe's lr
            parts += ["--lr-grid", ",".join(f"{x:g}" for x in lr_grid(opts.lr_grid, 1.0))]
        parts += ["--tune-seeds", str(opts.tune_seeds or DEFAULT_TUNE_SEEDS)]
        parts += ["--tune-lr-scope", opts.tune_scope or "each"]
    parts += ["--out", str(opts.out)]  # --jobs/--threads change the speed, never the numbers
    return parts


# ----------------------------------------------------------------------------------------------
# the comparison


def run_comparison(opts: CompareOptions) -> tuple[Path, Path]:
    """Validate, prepare the data if needed, train and evaluate every cell (resumably) and write
    the report; returns (report.md, report.json). `--paper families` is one comparison per
    family: `taperlm.compare.families.run_families` (which calls this for each)."""
    if opts.paper == "families":
        raise ConfigError(
            "--paper families runs one comparison per family: call "
            "taperlm.compare.families.run_families (what `taperlm compare` does)"
        )
    if opts.paper == "scaling":
        raise ConfigError(
            "--paper scaling runs one comparison per (size, tokens): call "
            "taperlm.compare.scaling.run_scaling (what `taperlm compare` does)"
        )
    t_start, cpu_start = time.perf_counter(), _cpu_seconds()
    allocs, provisional = check_options(opts)

    from taperlm.compare.grid import build_grid
    from taperlm.compare.report import write_report
    from taperlm.compare.runner import SharedInputs
    from taperlm.compare.scheduler import run_grid
    from taperlm.data.loader import load_meta
    from taperlm.outdirs import check_folder, claim

    seeds = list(range(opts.seeds))
    data_dir = _data_dir(opts, provisional)
    meta = load_meta(data_dir)
    notes: list[str] = []
    base = base_config(opts, data_dir, int(meta["vocab_size"]), notes)
    for note in notes:
        print(f"taperlm compare: note: {note}", file=sys.stderr)
    settings = eval_settings(opts)
    _check_niah_lengths(settings, base.model.context_length)
    SharedInputs(data_dir, settings).load()  # inputs too small for the job: fail before any work

    check_folder(opts.out, "compare", "--out")
    claim(opts.out, "compare")
    with locked(opts.out, "comparison folder"):  # one comparison writes a folder at a time
        tuning = None
        if opts.tune_lr:
            from taperlm.compare import tuning as tune

            def jobs_for(g) -> int:
                return choose_jobs(opts, g, opts.out / "runs", settings)

            tuning = tune.run_tuning(opts, base, allocs, seeds, data_dir, settings, jobs_for)
            if tuning["scope"] == "uniform":  # every allocation at uniform's tuned lr
                uniform = next(a for a in allocs if a.is_uniform)
                base = tune.with_chosen_lr(base, tuning, uniform.name)
        pilot = None
        if any(a.needs_pilot for a in allocs):
            pilot = run_pilots(opts, base, seeds, data_dir, int(meta["vocab_size"]), settings)
        grid = build_grid(base, allocs, seeds, opts.paper, pilot and pilot.pop("rho_mlp"))
        grid.pilot = pilot
        command = canonical_command(opts, grid)
        print(
            f"taperlm compare: {len(grid.allocations)} allocations x {len(seeds)} seeds = "
            f"{len(grid.cells)} runs of {base.train.tokens:,} tokens "
            f"({grid.budget[grid.allocations[0].name]['params']:,} params each) into {opts.out}",
            file=sys.stderr,
        )

        jobs = choose_jobs(opts, grid, opts.out / "runs", settings)

        def report_meta(results: dict[str, Any]) -> dict[str, Any]:
            return _report_meta(opts, grid, results, command, data_dir, meta, settings) | {
                "wall_s": time.perf_counter() - t_start,
                "cpu_s": _cpu_seconds() - cpu_start,
                "jobs": jobs,
            }

        def report(results: dict[str, Any], meta: dict[str, Any]) -> tuple[Path, Path]:
            extra = None
            if tuning:  # report.json's `lr_tuning`, its section and lr_tuning.png
                from taperlm.compare import tuning_report as tr

                extra = ("lr_tuning", tr.with_plot(tuning, opts.out), tr.tuning_section)
            return write_report(grid, results, opts.out, meta, extra)

        def partial(results: dict[str, Any]) -> None:
            meta = report_meta(results)
            meta["title"] += f" (PARTIAL: {len(results)}/{len(grid.cells)} runs done)"
            report(results, meta)

        results = run_grid(
            grid,
            opts.out,
            data_dir,
            settings,
            progress=not opts.no_progress,
            on_seed_done=partial,
            jobs=jobs,
            threads=opts.threads,
        )
        if tuning:
            if tuning["scope"] == "each":
                tune.run_tuned(opts, grid, results, tuning, data_dir, settings, jobs_for)
            tune.finish_cost(tuning, list(results.values()))
        md, js = report(results, report_meta(results))
    print(f"wrote {md} and {js} ({(time.perf_counter() - t_start) / 60:.1f} min)")
    return md, js


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished worker processes."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def choose_jobs(opts: CompareOptions, grid, runs: Path, settings) -> int:
    """--jobs, else as many cells at a time as idle cores allow at --threads each (at least
    one, at most the cells left to run); says what it chose and why."""
    from taperlm.compare.runner import cell_state
    from taperlm.cpus import idle_cpus, usable_cpus

    todo = sum(cell_state(c, runs / c.name, settings.to_dict())[0] != "cached" for c in grid.cells)
    if todo == 0:
        return 1
    if opts.jobs is not None:
        jobs, usable = opts.jobs, usable_cpus()
        why = f"--jobs {jobs}; {usable} usable CPU(s)"
        if jobs * opts.threads > usable:
            why += f", OVERSUBSCRIBED: {jobs * opts.threads} threads (slower, same numbers)"
    else:
        idle, usable, busy = idle_cpus()
        jobs = max(1, min(todo, idle // opts.threads))
        why = f"{usable} usable CPU(s), {busy:.1f} busy with other processes; --jobs N to override"
    print(
        f"taperlm compare: {todo} cell(s) to run, {min(jobs, todo)} at a time with "
        f"{opts.threads} torch thread(s) each ({why})",
        file=sys.stderr,
    )
    return jobs


def pilot_tokens(opts: CompareOptions, base) -> int:
    """Training tokens of a pilot: --pilot-tokens, else PILOT_FRACTION of a run, in whole
    batches (at least one)."""
    batch = base.train.batch_tokens
    if opts.pilot_tokens is not None:
        if opts.pilot_tokens < batch:
            raise ConfigError(
                f"--pilot-tokens must be at least one batch ({batch:,} tokens), got "
                f"{opts.pilot_tokens:,}"
            )
        return opts.pilot_tokens // batch * batch
    return max(batch, int(PILOT_FRACTION * base.train.tokens) // batch * batch)


def run_pilots(opts: CompareOptions, base, seeds: list[int], data_dir: Path, vocab: int, settings):
    """Train (or reuse) the pilot of every seed, a short uniform run, and measure its novelty
    like any cell; returns {"tokens", "per_seed": {seed: cost}, "rho_mlp": {seed: [...]}}."""
    from taperlm.compare.grid import Grid, pilot_cells
    from taperlm.compare.scheduler import run_grid
    from taperlm.taper import rho_mlp_of

    tokens = pilot_tokens(opts, base)
    pilot_base = base_config(dataclasses.replace(opts, tokens=tokens), data_dir, vocab)
    cells = pilot_cells(pilot_base, seeds)
    print(
        f"taperlm compare: novelty:pilot allocations: first {len(cells)} uniform pilot run(s) of "
        f"{tokens:,} tokens (one per seed)",
        file=sys.stderr,
    )
    pilots = Grid([cells[0].allocation], list(seeds), cells, pilot_base)
    # a pilot needs its novelty (and gets a val loss); zero-shot tasks would be wasted on it
    quiet = dataclasses.replace(settings, eval_tasks=[])
    jobs = choose_jobs(opts, pilots, opts.out / "runs", quiet)
    results = run_grid(
        pilots,
        opts.out,
        data_dir,
        quiet,
        progress=not opts.no_progress,
        jobs=jobs,
        threads=opts.threads,
    )
    out: dict[str, Any] = {"tokens": tokens, "per_seed": {}, "rho_mlp": {}}
    for c in cells:
        r = results[c.name]
        rho = rho_mlp_of(r["novelty"])
        if rho is None or len(rho) != base.model.n_layers:
            raise ConfigError(f"pilot {c.name} has no per-layer rho_mlp in its result.json")
        out["rho_mlp"][c.seed] = rho
        out["per_seed"][str(c.seed)] = {
            "run": f"runs/{c.name}",
            "tokens": r["train"]["tokens"],
            "train_s": r["train"].get("wall_s"),
            "novelty_s": (r.get("times") or {}).get("novelty_s"),
            "val_loss": r["val"]["loss"],
            "rho_mlp": rho,
        }
    return out


def check_options(opts: CompareOptions):
    """Validate everything that does not need the data (so that nothing is prepared or trained
    for a comparison that cannot run); returns (allocations, provisional base config)."""
    from taperlm.compare.grid import build_grid
    from taperlm.device import resolve_device
    from taperlm.training.train_checks import validate_train_config

    if opts.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {opts.seeds}")
    if opts.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {opts.threads}")
    if opts.jobs is not None and opts.jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {opts.jobs}")
    from taperlm.compare.tuning import check_tuning_options

    allocs = allocations(opts)
    check_tuning_options(opts, list(range(opts.seeds)), allocs)
    provisional = base_config(opts, None, None)
    build_grid(provisional, allocs, list(range(opts.seeds)), opts.paper)
    validate_train_config(provisional)
    resolve_device(provisional.train.device, "train.device")  # there, before any work
    pilot_tokens(opts, provisional)  # a bad --pilot-tokens fails before any work
    return allocs, provisional


def _data_dir(opts: CompareOptions, provisional) -> Path:
    """--data, else the config's data.dir, else the default corpus (prepared once)."""
    from taperlm.data.loader import load_meta

    if opts.data is not None:
        data_dir = opts.data.expanduser().resolve()
    elif provisional.data.dir:
        data_dir = Path(provisional.data.dir).expanduser().resolve()
    else:
        target = default_corpus_dir(not opts.no_progress)
        print(_default_corpus_note(target), file=sys.stderr)
        return target
    load_meta(data_dir)  # DataError naming `taperlm prepare` when missing or incomplete
    return data_dir


def _default_corpus_note(target: Path) -> str:
    """Which data a compare without --data trains on, and the prepared folders it leaves alone
    (its own corpus keeps the main job's numbers reproducible: another tokenizer would change
    the models' size)."""
    from taperlm.data.prepare import META_FILE

    here = sorted(str(p.parent) for p in Path("data").glob(f"*/{META_FILE}"))[:3]
    other = f"; {', '.join(here)} (prepared here) is used only with --data" if here else ""
    return (
        f"taperlm compare: data: the built-in corpus (Debian's Python, Perl and Linux "
        f"documentation) with its {DEFAULT_CORPUS_TOKENIZER} tokenizer, cached in {target}; "
        f"--data DIR trains on other data{other}"
    )


def _report_meta(opts, grid, results, command, data_dir, meta, settings) -> dict[str, Any]:
    import torch

    from taperlm import __version__

    first = next(iter(results.values()))
    m, t = grid.base.model, grid.base.train
    return {
        "title": _title(opts, grid),
        "command": command,
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "taperlm_version": __version__,
        "torch_version": torch.__version__,
        "threads": opts.threads,
        "jobs": opts.jobs,
        "paper_mode": opts.paper,
        "cells": len(grid.cells),
        "wall_s": 0.0,
        "cpu_s": 0.0,
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
            "steps": t.steps,
            "batch_tokens": t.batch_tokens,
            "seq_len": t.seq_len,
            "lr": t.lr,
            "warmup_tokens": t.warmup_tokens,
            "eval_every": t.eval_every,
            "eval_tokens": t.eval_tokens,
            "seeds": grid.seeds,
            "data_dir": str(data_dir),
            "train_tokens": int(meta["splits"]["train"]["tokens"]),
            "val_tokens": first["val"]["tokens"],
            "eval_tasks": settings.eval_tasks,
            "eval_limit": settings.eval_limit,
            "novelty_text": settings.novelty_text or f"the val split of {data_dir}",
            "novelty_tokens": settings.novelty_tokens,
        },
    }


def _title(opts: CompareOptions, grid) -> str:
    model = str(opts.config) if opts.config else (opts.preset or DEFAULT_PRESET)
    mode = f"paper {grid.paper}" if grid.paper else f"{len(grid.allocations)} allocations"
    return f"{model}, {mode}, {len(grid.seeds)} seeds, {grid.base.train.tokens:,} tokens/run"

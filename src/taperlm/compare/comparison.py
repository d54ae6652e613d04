"""One comparison top to bottom (`taperlm compare`): the checks that run before any work,
what every cell reads, the novelty pilots, the grid, its training and its report;
`run_comparison` reads in that order. The base config every cell starts from, and the order in
which settings reach it, is `taperlm.compare.recipe`'s.

The data every cell trains on, the vocabulary and the evaluation all come from the one assembled
`data.dir` (`data_dir_of`): without --data, the built-in corpus, prepared once into the cache
($TAPERLM_CACHE, else $XDG_CACHE_HOME/taperlm, else ~/.cache/taperlm).

novelty:pilot allocations: a short uniform pilot run per seed, whose measured novelty sets the
widths of that seed's pilot allocations, runs before the grid (`run_pilots`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from taperlm import __version__
from taperlm.compare.cell import EvalSettings, SharedInputs
from taperlm.compare.execute import PendingCells, choose_jobs, train_cells, train_reported
from taperlm.compare.grid import (
    DEFAULT_TAPERS,
    Allocation,
    Grid,
    PilotRun,
    Pilots,
    build_grid,
    complete_allocations,
    parse_allocations,
    pilot_cells,
)
from taperlm.compare.options import (
    FLAG_KEY,
    GRID_MODES,
    CompareOptions,
    canonical_command,
    check_option_ranges,
    model_preset,
    paper_mode,
    width_step,
)
from taperlm.compare.recipe import base_config
from taperlm.compare.report import with_stopping_plot, with_tuning_plot, write_report
from taperlm.compare.results import (
    ComparisonReport,
    LrTuning,
    ModelMeta,
    ReportMeta,
    Results,
    SettingsMeta,
    Stopping,
)
from taperlm.compare.statistics import rule_of
from taperlm.compare.tuning import (
    check_tuning_options,
    finish_cost,
    run_tuned,
    run_tuning,
    with_chosen_lr,
)
from taperlm.config import RunConfig
from taperlm.data import corpus as data_corpus
from taperlm.data import prepare as data_prepare
from taperlm.data.loader import load_meta
from taperlm.errors import ConfigError, DataError
from taperlm.evaluation.locate import eval_data_dir, wikitext_test
from taperlm.evaluation.niah import DEFAULT_HAYSTACK
from taperlm.evaluation.niah import TASKS as NIAH_TASKS
from taperlm.evaluation.registry import needs_haystack, task_names, zero_shot_tasks
from taperlm.evaluation.suite import parse_task_list
from taperlm.files.outdirs import check_folder, claim
from taperlm.files.runlock import locked
from taperlm.runtime.device import resolve_device
from taperlm.spec.domains import MAX_SEED
from taperlm.training.settings import validate_train_config

DEFAULT_CORPUS_TOKENIZER = "bpe:2048"
# A preset size whose own vocabulary is smaller reads the built-in corpus through its own
# tokenizer: nano's 512 tokens (at bpe:2048 its embeddings would be 2/3 of the model). At bpe:512
# the corpus has 13.1M training tokens: nano's 68 tokens per parameter (18.1M) is 1.4 epochs.
SIZE_CORPUS_TOKENIZERS = {"nano": "bpe:512"}


def corpus_tokenizer(opts: CompareOptions) -> str:
    """The tokenizer of the built-in corpus for `opts`' preset (its size's own, else the
    default)."""
    preset = model_preset(opts)
    size = None if preset is None else preset.rpartition("-")[2]
    return SIZE_CORPUS_TOKENIZERS.get(size or "", DEFAULT_CORPUS_TOKENIZER)


def cache_root() -> Path:
    env = os.environ.get("TAPERLM_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "taperlm"


def default_corpus_dir(progress: bool, tokenizer: str = DEFAULT_CORPUS_TOKENIZER) -> Path:
    """The default corpus at `tokenizer`, prepared once into the cache (atomic: a temp dir
    renamed into place, so concurrent or interrupted runs never see a half-written data dir)."""
    meta_file = data_prepare.META_FILE
    # Keyed by what it is built from (the installed files, the pipeline): an upgraded package
    # or taperlm gets a fresh corpus rather than a stale one under the same name.
    inputs = json.dumps([data_prepare.PIPELINE_VERSION, data_corpus.default_corpus_identity()])
    digest = hashlib.sha256(inputs.encode()).hexdigest()[:12]
    target = cache_root() / f"default-{tokenizer.replace(':', '')}-{digest}"
    if (target / meta_file).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".tmp-{target.name}-{os.getpid()}")
    print(
        f"taperlm compare: preparing the default corpus into {target} (once; ~1 min)",
        file=sys.stderr,
    )
    try:
        data_prepare.prepare("default", tmp, tokenizer, workers=2, progress=progress)
        if target.exists() and not (target / meta_file).is_file():
            shutil.rmtree(target)  # an incomplete leftover
        if not target.exists():
            os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def data_dir_of(opts: CompareOptions, provisional: RunConfig) -> Path:
    """The assembled data.dir of the provisional base config (--data, a config file's, --set or
    $TAPERLM_SET: `taperlm.compare.recipe.base_config`), else the default corpus (prepared
    once). The one folder the cells train on and the vocabulary and evaluation are read from."""
    if provisional.data.dir:
        data_dir = Path(provisional.data.dir).expanduser().resolve()
    else:
        tokenizer = corpus_tokenizer(opts)
        target = default_corpus_dir(not opts.no_progress, tokenizer)
        print(default_corpus_note(target, tokenizer), file=sys.stderr)
        return target
    load_meta(data_dir)  # DataError naming `taperlm prepare` when missing or incomplete
    return data_dir


def default_corpus_note(target: Path, tokenizer: str = DEFAULT_CORPUS_TOKENIZER) -> str:
    """Which data a compare without --data trains on, and the prepared folders it leaves alone
    (its own corpus keeps the main job's numbers reproducible: another tokenizer would change
    the models' size)."""
    here = sorted(str(p.parent) for p in Path("data").glob(f"*/{data_prepare.META_FILE}"))[:3]
    other = f"; {', '.join(here)} (prepared here) is used only with --data" if here else ""
    return (
        f"taperlm compare: data: the built-in corpus (Debian's Python, Perl and Linux "
        f"documentation) with its {tokenizer} tokenizer, cached in {target}; "
        f"--data DIR trains on other data{other}"
    )


def compare_task_groups() -> dict[str, list[str]]:
    """--eval-tasks groups, from the task registry: `paper` (the zero-shot suite), `niah`, and
    `all` = those, then every other registered task (a task registered later is a compare
    option as it is an `eval` one). `val` is not among them: compare always measures it."""
    suite, needles = zero_shot_tasks(), task_names("niah")
    others = [t for t in task_names() if t not in ("val", *suite, *needles)]
    return {"paper": suite, "niah": needles, "all": [*suite, *needles, *others]}


def eval_settings(opts: CompareOptions) -> EvalSettings:
    """How every cell is evaluated (zero-shot tasks, their data, novelty text and tokens); the
    options' ranges are checked by `check_option_ranges`."""
    groups = compare_task_groups()
    tasks = parse_task_list(
        opts.eval_tasks, groups["all"], "--eval-tasks", skip=("none", "val"), groups=groups
    )
    return EvalSettings(
        val_tokens=opts.val_tokens or None,
        eval_tasks=tasks,
        eval_limit=opts.eval_limit or None,
        eval_data=_eval_data(opts, tasks),
        niah_lengths=list(opts.eval_niah_lengths) or None,
        # in the cache key: cells evaluated on another prose (WikiText before) are re-evaluated
        niah_haystack=DEFAULT_HAYSTACK if any(needs_haystack(t) for t in tasks) else None,
        novelty_tokens=opts.novelty_tokens,
        novelty_text=_novelty_text(opts),
    )


def _eval_data(opts: CompareOptions, tasks: list[str]) -> str | None:
    """The folder of the zero-shot tasks' files (the NIAH tasks need none: their prose ships
    with Python)."""
    if not [t for t in tasks if t not in NIAH_TASKS]:
        return None
    eval_data = opts.eval_data or eval_data_dir()
    if eval_data is None or not Path(eval_data).is_dir():
        raise DataError(
            f"--eval-tasks {','.join(tasks)} needs the evaluation files: pass --eval-data DIR "
            "(laid out like ../shared/data) or set TAPERLM_EVAL_DATA, or use --eval-tasks none"
        )
    return str(Path(eval_data).resolve())


def _novelty_text(opts: CompareOptions) -> str | None:
    """--novelty-data, else WikiText-2's test split where it is, else None (the val split)."""
    if opts.novelty_data is not None:
        if not opts.novelty_data.is_file():
            raise DataError(
                f"--novelty-data {opts.novelty_data} is not a file; give a UTF-8 text file, or "
                "leave the option out to measure on WikiText-2's test split (or the val split)"
            )
        return str(opts.novelty_data.resolve())
    try:
        return str(wikitext_test())
    except DataError:
        return None  # fall back to the val split


def check_niah_lengths(settings: EvalSettings, context: int) -> None:
    """Refuse before training when every NIAH length would be skipped (longer than the cells'
    context); longer lengths among shorter ones are skipped per cell, with the reason."""
    lengths = settings.niah_lengths
    if lengths and any(t in NIAH_TASKS for t in settings.eval_tasks) and min(lengths) > context:
        raise ConfigError(
            f"--eval-niah-lengths {','.join(map(str, lengths))}: every length is longer than the "
            f"models' context_length {context}; give lengths <= {context}"
        )


# The pilot trains this fraction of a run's tokens (whole batches).
PILOT_FRACTION = 0.25


def pilot_tokens(opts: CompareOptions, base: RunConfig) -> int:
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


def run_pilots(
    opts: CompareOptions,
    base: RunConfig,
    seeds: list[int],
    data_dir: Path,
    vocab: int,
    settings: EvalSettings,
) -> Pilots:
    """Train (or reuse) the pilot of every seed, a short uniform run, and measure its novelty
    like any cell."""
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
    results = train_cells(opts, pilots, data_dir, dataclasses.replace(settings, eval_tasks=[]))
    per_seed: dict[int, PilotRun] = {}
    for c in cells:
        r = results[c.name]
        rho = [math.nan if v is None else v for v in r.novelty.rho_means("rho_mlp")]
        if len(rho) != base.model.n_layers:
            raise ConfigError(f"pilot {c.name} has no per-layer rho_mlp in its result.json")
        per_seed[c.seed] = PilotRun(
            run=f"runs/{c.name}",
            tokens=r.train.tokens,
            train_s=r.train.wall_s,
            novelty_s=(r.times or {}).get("novelty_s"),
            val_loss=r.val.loss,
            rho_mlp=rho,
        )
    return Pilots(tokens, per_seed)


def allocations(opts: CompareOptions) -> list[Allocation]:
    """The allocations to compare (uniform always included, paper numbers attached)."""
    if opts.paper and (opts.tapers or opts.taper_list):
        raise ConfigError("give either --paper MODE or --tapers/--taper, not both")
    if opts.paper:
        mode = paper_mode(opts.paper)
        if mode is None or mode.allocations is None:
            # the modes that are one comparison's allocations (the others are studies)
            raise ConfigError(
                f"--paper {opts.paper!r} is unknown; choose {' or '.join(GRID_MODES)}"
            )
        return mode.allocations(opts.multiple_of)
    if opts.preset_size or opts.families:
        raise ConfigError(
            "--preset-size and --families belong to --paper families; for one model give "
            "--preset FAMILY-SIZE (e.g. --preset gated-small)"
        )
    if opts.tapers == ():
        raise ConfigError("--tapers is empty; give e.g. --tapers 'uniform;cosine:1.5:0.5'")
    step = width_step(opts)
    given = [a.at_step(step) for a in (*(opts.tapers or ()), *opts.taper_list)]
    return (
        complete_allocations(given, step)
        if given
        else parse_allocations(list(DEFAULT_TAPERS), step)
    )


def reported_seeds(opts: CompareOptions) -> list[int]:
    """The reported seeds, in order: --first-seed, +1, ... (--seeds of them)."""
    last = opts.first_seed + opts.seeds - 1
    if last > MAX_SEED:
        raise ConfigError(
            f"--first-seed {opts.first_seed} with --seeds {opts.seeds} reaches seed {last}, "
            f"beyond the largest seed {MAX_SEED}; use a smaller --first-seed"
        )
    return list(range(opts.first_seed, opts.first_seed + opts.seeds))


def check_options(opts: CompareOptions) -> tuple[list[Allocation], RunConfig]:
    """Validate everything that does not need the data (so that nothing is prepared or trained
    for a comparison that cannot run); returns (allocations, provisional base config)."""
    check_option_ranges(opts)
    check_executor_options(opts)
    rule_of(opts)  # a bad --stop fails before any work
    allocs = allocations(opts)
    seeds = reported_seeds(opts)
    check_tuning_options(opts, seeds, allocs)
    provisional = base_config(opts, None, None)
    build_grid(provisional, allocs, seeds, opts.paper)
    validate_train_config(provisional)
    resolve_device(provisional.train.device, "train.device")  # there, before any work
    pilot_tokens(opts, provisional)  # a bad --pilot-tokens fails before any work
    return allocs, provisional


def executor_only_options(opts: CompareOptions) -> list[str]:
    """The Slurm executor's options (--slurm-*, --wait) that `opts` set to other than their
    defaults: every field whose flag names the executor, found from the fields themselves so
    that a new --slurm-* option is covered without a list to keep."""
    given = []
    for f in dataclasses.fields(opts):
        if (f.name.startswith("slurm_") or f.name == "wait") and getattr(opts, f.name) != f.default:
            given.append(f.metadata[FLAG_KEY])
    return given


def check_executor_options(opts: CompareOptions) -> None:
    """The Slurm executor's options mean nothing on this machine: given without
    `--executor slurm`, they are refused rather than silently ignored."""
    if opts.executor == "slurm":
        return
    given = executor_only_options(opts)
    if given:
        raise ConfigError(
            f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for --executor slurm, "
            f"but this comparison runs with --executor {opts.executor}: add --executor slurm "
            "to run its cells as Slurm jobs, or drop the option"
        )


@dataclass
class Inputs:
    """What every cell of a comparison shares: the data and how cells are evaluated."""

    data_dir: Path
    meta: dict[str, Any]
    settings: EvalSettings


def run_comparison(opts: CompareOptions) -> ComparisonReport:
    """Validate, prepare the data if needed, train and evaluate every cell (resumably) and write
    the report; returns it (its report.md and report.json: `md_path`, `json_path`). A study of several comparisons (`--paper
    families`, ...) calls this for each: `taperlm.compare.study.run_study`."""
    mode = paper_mode(opts.paper)
    if mode is not None and mode.one_per is not None:
        raise ConfigError(
            f"--paper {opts.paper} runs one comparison per {mode.one_per}: call "
            "taperlm.compare.study.run_study (what `taperlm compare` does)"
        )
    clock = _Clock()
    allocs, provisional = check_options(opts)
    if opts.executor == "slurm":  # a cluster that refuses the jobs: before any work
        from taperlm.compare.slurm import SlurmSettings, check_cluster  # lazy: optional extra

        check_cluster(SlurmSettings.from_options(opts))
    seeds = reported_seeds(opts)
    data_dir = data_dir_of(opts, provisional)
    meta = load_meta(data_dir)
    notes: list[str] = []
    base = base_config(opts, data_dir, int(meta["vocab_size"]), notes)
    for note in notes:
        print(f"taperlm compare: note: {note}", file=sys.stderr)
    inputs = Inputs(data_dir, meta, eval_settings(opts))
    check_niah_lengths(inputs.settings, base.model.context_length)
    SharedInputs(data_dir, inputs.settings).load()  # inputs too small for the job: fail first

    check_folder(opts.out, "compare", "--out")
    claim(opts.out, "compare")
    with locked(opts.out, "comparison folder"):  # one comparison writes a folder at a time
        report = _run_locked(opts, base, allocs, seeds, inputs, clock)
    print(f"wrote {report.md_path} and {report.json_path} ({clock.wall() / 60:.1f} min)")
    return report


def _run_locked(
    opts: CompareOptions,
    base: RunConfig,
    allocs: list[Allocation],
    seeds: list[int],
    inputs: Inputs,
    clock: _Clock,
) -> ComparisonReport:
    """The comparison in its locked folder: lr tuning, pilots, the grid, the report."""
    data_dir, settings = inputs.data_dir, inputs.settings
    tuning = None
    if opts.tune_lr:
        tuning = run_tuning(opts, base, allocs, seeds, data_dir, settings)
        if tuning.scope == "uniform":  # every allocation at uniform's tuned lr
            uniform = next(a for a in allocs if a.is_uniform)
            base = with_chosen_lr(base, tuning, uniform.name)
    pilot = None
    if any(a.needs_pilot for a in allocs):
        pilot = run_pilots(opts, base, seeds, data_dir, int(inputs.meta["vocab_size"]), settings)
    grid = build_grid(base, allocs, seeds, opts.paper, pilot and pilot.rho_mlp)
    grid.pilot = pilot
    print(
        f"taperlm compare: {len(grid.allocations)} allocations x {len(seeds)} seeds = "
        f"{len(grid.cells)} runs of {base.train.tokens:,} tokens "
        f"({grid.budget[grid.allocations[0].name].params:,} params each) into {opts.out}",
        file=sys.stderr,
    )
    jobs = choose_jobs(opts, grid, opts.out / "runs", settings, reported=True)
    stopping: Stopping | None = None
    report = _reporter(opts, grid, inputs, clock, jobs, tuning, lambda: stopping)

    def partial(results: Results) -> None:
        report(grid, results, f" (PARTIAL: {len(results)}/{len(grid.cells)} runs done)")

    cap_grid = grid
    try:
        grid, results, stopping = train_reported(
            opts, grid, data_dir, settings, jobs=jobs, on_seed_done=partial
        )
    except PendingCells as pending:  # cells still queued on a cluster: the report so far
        done = {c.seed for c in grid.cells if c.name in pending.results}
        done -= {c.seed for c in grid.cells if c.name not in pending.results}
        kept = {c.name: pending.results[c.name] for c in grid.cells if c.seed in done}
        if kept:  # the seeds whose every cell is done, as a seed's end writes it
            partial(kept)
        raise
    if tuning:
        if tuning.scope == "each":
            run_tuned(opts, grid, results, tuning, data_dir, settings, cap_grid)
        finish_cost(tuning, list(results.values()))
    return report(grid, results, "")


def _reporter(
    opts: CompareOptions,
    grid: Grid,
    inputs: Inputs,
    clock: _Clock,
    jobs: int,
    tuning: LrTuning | None,
    stopping: Callable[[], Stopping | None],
) -> Callable[[Grid, Results, str], ComparisonReport]:
    """report(grid, results, title suffix): writes report.md / report.json for the results so
    far: with --tune-lr report.json's `lr_tuning`, its section and lr_tuning.png; once the seeds
    are settled (`stopping()`), `stopping`, its section and sequence.png."""
    command = canonical_command(opts, grid)

    def report(used: Grid, results: Results, suffix: str) -> ComparisonReport:
        meta = _report_meta(opts, used, results, command, inputs, suffix, clock, jobs)
        stop = stopping()
        return write_report(
            used,
            results,
            opts.out,
            meta,
            stopping=None if stop is None else with_stopping_plot(stop, opts.out),
            lr_tuning=with_tuning_plot(tuning, opts.out) if tuning else None,
        )

    return report


class _Clock:
    """Wall time and CPU time (this process and its finished worker processes) since made."""

    def __init__(self) -> None:
        self.t_start, self.cpu_start = time.perf_counter(), _cpu_seconds()

    def wall(self) -> float:
        return time.perf_counter() - self.t_start

    def cpu(self) -> float:
        return _cpu_seconds() - self.cpu_start


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished worker processes."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _report_meta(
    opts: CompareOptions,
    grid: Grid,
    results: Results,
    command: str,
    inputs: Inputs,
    suffix: str,
    clock: _Clock,
    jobs: int,
) -> ReportMeta:
    m = grid.base.model
    return ReportMeta(
        title=_title(opts, grid) + suffix,
        command=command,
        created=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        taperlm_version=__version__,
        torch_version=torch.__version__,
        threads=opts.threads,
        jobs=jobs,
        paper_mode=opts.paper,
        cells=len(grid.cells),
        wall_s=clock.wall(),
        cpu_s=clock.cpu(),
        model=ModelMeta(
            family=m.family,
            n_layers=m.n_layers,
            d_model=m.d_model,
            n_heads=m.n_heads,
            mlp_width=m.mlp_width,
            vocab_size=m.vocab_size,
        ),
        settings=_settings_meta(grid, results, inputs),
    )


def _settings_meta(grid: Grid, results: Results, inputs: Inputs) -> SettingsMeta:
    """report.json's meta.settings: the training recipe, the data and the evaluation."""
    first = next(iter(results.values()))
    t, settings = grid.base.train, inputs.settings
    return SettingsMeta(
        tokens=t.tokens,
        steps=t.steps,
        batch_tokens=t.batch_tokens,
        seq_len=t.seq_len,
        lr=t.lr,
        warmup_tokens=t.warmup_tokens,
        eval_every=t.eval_every,
        eval_tokens=t.eval_tokens,
        seeds=grid.seeds,
        data_dir=str(inputs.data_dir),
        train_tokens=int(inputs.meta["splits"]["train"]["tokens"]),
        val_tokens=first.val.tokens,
        eval_tasks=settings.eval_tasks,
        eval_limit=settings.eval_limit,
        novelty_text=settings.novelty_text or f"the val split of {inputs.data_dir}",
        novelty_tokens=settings.novelty_tokens,
    )


def _title(opts: CompareOptions, grid: Grid) -> str:
    model = str(opts.config) if opts.config else model_preset(opts)
    mode = f"paper {grid.paper}" if grid.paper else f"{len(grid.allocations)} allocations"
    return f"{model}, {mode}, {len(grid.seeds)} seeds, {grid.base.train.tokens:,} tokens/run"

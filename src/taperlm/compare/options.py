"""The options of `taperlm compare`, declared once: each field of `CompareOptions` carries its
flag, help, domain and default, from which `add_option_arguments` builds the command line and
`check_option_ranges` checks a value given through the Python API (pure Python; no torch).

An option given as text in a small language of its own (a list of allocations, lrs, lengths or
names; a --stop rule) is parsed once, into a typed value, when `CompareOptions` is made
(`__post_init__`); every consumer reads that value, and the reproducing command writes it back
(`list_text`, `Stop.as_text`).

The model options (--preset, --config, --multiple-of, --set) and --logger are the shared ones of
`taperlm.commands.common`; their fields carry no flag here. An option that sets a config key
(--tokens: train.tokens, --data: data.dir) names it (`option(..., key=...)`): it is declared
with `taperlm.config.assembly.add_setting_argument`, like every command's, and is a layer of the base
config's assembly (`taperlm.compare.recipe.base_config`).

The command line written back: `canonical_command` is the command that reproduces a comparison,
every choice explicit (report.json's `command`); `run_arguments` are its run arguments, which
the multi-part studies reuse per comparison."""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from taperlm.compare.grid import (
    Allocation,
    Grid,
    controlled_allocations,
    families_allocations,
    parse_allocation,
    split_taper_list,
    sweep_allocations,
)
from taperlm.config.assembly import OptionSetting, add_setting_argument
from taperlm.errors import ConfigError
from taperlm.evaluation.niah import parse_lengths
from taperlm.spec.domains import (
    DOMAIN_KEY,
    MAX_COUNT,
    MAX_SEED,
    MAX_TOKENS,
    MAX_WORKERS,
    choices,
    domain_of,
    input_path,
    number,
    output_path,
    up_to,
)

# The main job: `taperlm compare` naming no model (no --preset, --config or --paper). It runs where
# its answer holds for training as people do it, not only early in training (issue 38): at
# nano, the taper's advantage over uniform is -0.043 nats at 0.5 tokens per parameter, gone at 2
# (-0.003 [-0.021, +0.015]) and reversed at 8 (every seed worse), the paired difference during
# training crossing zero near 1.8 tokens per parameter (docs/compare.md, "--paper tokens"). So
# the main job trains transformer-nano to 8 tokens per parameter, its report leading with the
# difference at the end and the crossing (`taperlm.compare.crossing`), with the settings of the
# `--paper tokens` point there (benchmarks/results/longrun_tokens_nano/nano-2134016): the built-in
# corpus at bpe:512 (compare.inputs.SIZE_CORPUS_TOKENIZERS), widths in steps of 8, and
# uniform's lr tuned at that budget, 4e-3 (lrs 1e-3/2e-3/4e-3/8e-3 on 2 tuning seeds: mean val
# loss 2.961/2.825/2.754/2.755), for both arms.
DEFAULT_PRESET = "transformer-nano"  # 266,816 parameters at its 512-token vocabulary
DEFAULT_TOKENS = 2_134_016  # 8 tokens per parameter: 2,084 steps of 1,024 tokens
MAIN_LR = 4e-3  # uniform's tuned peak lr at DEFAULT_TOKENS (above)
MAIN_MULTIPLE_OF = 8  # nano's width step (at 16 its steep tapers collapse into one another)
# The curve the crossing is read from: an evaluation every 2,084 // 32 = 65 steps (0.25 tokens
# per parameter; the crossing sits near 1.8) on 8,192 val tokens (4,096 left per-seed differences
# with an evaluation noise of sd 0.010-0.018 nats, as large as the seed-to-seed spread).
MAIN_CURVE_POINTS = 32
MAIN_EVAL_TOKENS = 8192
# Seeds: sized so that the worst case (no early stop) fits the 13-18 minutes of a main job on 2
# cores, corpus preparation included. Timed on a fresh clone (docs/compare.md, "The main job"):
# 7 seeds took 15.9 min, of which the bpe:512 corpus 28 s and the grid 924 s (~132 s a seed: two
# cells of 2,134,016 tokens at ~17,500 tokens/s each, side by side, plus their 33 evaluations);
# 8 seeds would be ~18 min.
DEFAULT_SEEDS = 7
# A comparison of a named --preset or --config trains with compare's general recipe
# (`taperlm.compare.recipe`: RECIPE_TOKENS per run), at most MODEL_SEEDS seeds (15 micro seeds fit
# 15 minutes on 2 idle cores); --paper controlled and sweep without --preset train
# PAPER_MODE_PRESET.
MODEL_SEEDS = 15
RECIPE_TOKENS = 327_680  # 320 steps of 1,024 tokens
PAPER_MODE_PRESET = "transformer-micro"
# --paper grids (4 to 16 allocations, a table of families, the scaling sweep's 6 points) default
# to fewer seeds per allocation (the scaling sweep: ~3.6 h on 2 idle cores at 5)
PAPER_MODE_SEEDS = 5
DEFAULT_VAL_TOKENS = 131_072  # the built-in corpus's val split has 134,528 at bpe:2048
DEFAULT_NOVELTY_TOKENS = 2048
DEFAULT_EVAL_LIMIT = 200
DEFAULT_THREADS = 1  # torch threads per cell (worker); cells run in parallel instead


@dataclass(frozen=True)
class PaperMode:
    """A --paper mode: where its study lives and what the rest of `taperlm compare` asks of it,
    answered here, where the mode is declared (`PAPER_STUDIES`), so that no other module
    compares a mode's name (tests/compare/test_compare_options.py checks)."""

    # "module:function", a function of the options returning a `StudyPlan`, imported by name
    # (`taperlm.compare.study.studies`) so that this module (`taperlm compare --help`) stays
    # torch-free
    study: str
    # the paper's allocations its one comparison trains (`taperlm.compare.grid`), given the
    # width step; None: it has no grid of its own
    allocations: Callable[[int | None], list[Allocation]] | None = None
    # a study of several comparisons, each its own `run_comparison`: what it runs one per
    # (None: not such a study, or one that hands its comparisons their own options)
    one_per: str | None = None
    sweep_claims: bool = False  # §4's claims checked on its grid (sweep_claims, sweep.png)
    confirm: bool = False  # a pre-registered confirmatory comparison (CONFIRM_SEEDS seeds)


# Every --paper mode, in the order --help lists them: its name -> the mode. The one declaration
# of the modes (`taperlm.compare.study.studies` registers each study from it).
_LONGRUN, _CONFIRM = "taperlm.compare.longrun:longrun_plan", "taperlm.compare.confirm:confirm_plan"
PAPER_STUDIES: dict[str, PaperMode] = {
    # §3's grid, one comparison
    "controlled": PaperMode("taperlm.compare.study:single", controlled_allocations),
    # §4's grid, one comparison
    "sweep": PaperMode("taperlm.compare.study:single", sweep_allocations, sweep_claims=True),
    # §6's table: one comparison per family
    "families": PaperMode(
        "taperlm.compare.families:families_plan", families_allocations, one_per="family"
    ),
    # the ratio sweep at (size, tokens) points
    "scaling": PaperMode("taperlm.compare.scaling:scaling_plan", one_per="(size, tokens)"),
    # that sweep (and below uniform: inverse tapers) over tokens per parameter
    "tokens": PaperMode(_LONGRUN),
    "ratios": PaperMode(_LONGRUN),  # that sweep past 1.9 -> 0.1 and below 1
    # the pre-registered check of the widening lead: micro 10 (built-in) and micro 2 (code)
    "confirm": PaperMode(_CONFIRM, confirm=True),
    "confirm-code": PaperMode(_CONFIRM, confirm=True),
    # bell / hourglass against uniform and the monotone tapers at nano 8, 32 and micro 2
    "shapes": PaperMode("taperlm.compare.shapes:shapes_plan", one_per="(size, tokens)"),
}
# --paper confirm / confirm-code: the pre-registered seed cap (taperlm.compare.confirm)
CONFIRM_SEEDS = 15
CONFIRM_MODES = tuple(name for name, mode in PAPER_STUDIES.items() if mode.confirm)
PAPER_MODES = tuple(PAPER_STUDIES)  # --paper's choices
# the modes whose one comparison trains a grid of the paper's (the others are studies)
GRID_MODES = tuple(name for name, mode in PAPER_STUDIES.items() if mode.allocations)


def paper_mode(name: str | None) -> PaperMode | None:
    """The --paper mode `name` declares (None: no --paper, or a study registered elsewhere)."""
    return None if name is None else PAPER_STUDIES.get(name)


# --paper families: the families compared (taperlm.compare.families)
DEFAULT_FAMILIES = ("transformer", "gated", "hope", "titans-mag")
# Sequential seeds (taperlm.compare.sequential; docs/compare.md, "Stopping when decided"): the
# default stops a comparison as soon as its anytime-valid 95% interval excludes 0 — the sign it
# is run for (the former main job's, at 0.31 tokens per parameter: decided at 4 of 15 seeds in a
# replay of its recorded runs) — and never later than --seeds; --stop fixed is the fixed design.
DEFAULT_STOP = "decided"
DEFAULT_STOP_ALPHA = 0.05
DEFAULT_MIN_SEEDS = 3
# --stop-on: the comparisons that must be settled (taperlm.compare.statistics.comparisons)
StopQuestion = Literal["each", "best"]
STOP_QUESTIONS = choices(StopQuestion)
# --tune-lr (taperlm.compare.tuning): tuning seeds per (allocation, lr), and the scopes
DEFAULT_TUNE_SEEDS = 2
TuneScope = Literal["each", "uniform"]
TUNE_SCOPES = choices(TuneScope)
StopKind = Literal["fixed", "decided", "half-width", "equivalent", "decided+equivalent"]
# --stop equivalent[:M]: "no practical difference" once a comparison's anytime-valid interval
# lies inside +-M nats. 0.02 nats is a 2% change of perplexity, below the seed-to-seed spread of
# the main job's paired difference (sd 0.023 nats at 8 tokens per parameter) and below every
# effect this project reports as decided (docs/compare.md, "Deciding no difference").
DEFAULT_EQUIVALENCE_MARGIN = 0.02
EQUIVALENCE_KINDS = ("equivalent", "decided+equivalent")
# --executor: where cells run (taperlm.compare.execute.EXECUTORS)
ExecutorName = Literal["local", "slurm"]
EXECUTOR_NAMES = choices(ExecutorName)


@dataclass(frozen=True)
class Stop:
    """--stop: when a comparison stops adding seeds (`taperlm.compare.sequential`), parsed once
    from its text (`Stop.parse`: fixed | decided | half-width:X | equivalent[:M] |
    decided+equivalent[:M])."""

    kind: StopKind
    half_width: float | None = None  # nats, for half-width
    text: str = field(default="", compare=False)  # as given (the report's reproducing command)
    margin: float | None = None  # nats, for equivalent and decided+equivalent

    @classmethod
    def parse(cls, text: str) -> Stop:
        """The rule `text` names; ConfigError naming --stop and the forms it takes."""
        given = text.strip()
        if given in ("fixed", "decided"):
            return cls(given, None, given)
        kind, _, value = given.partition(":")
        if kind in EQUIVALENCE_KINDS:
            try:
                margin = float(value) if value else DEFAULT_EQUIVALENCE_MARGIN
            except ValueError:
                margin = math.nan
            if not (math.isfinite(margin) and margin > 0):
                raise ConfigError(
                    f"--stop {text!r}: the equivalence margin must be a positive number of "
                    f"nats, e.g. {kind}:{DEFAULT_EQUIVALENCE_MARGIN:g}"
                )
            return cls(kind, None, given, margin)  # type: ignore[arg-type]
        if given.startswith("half-width:"):
            try:
                width = float(given.split(":", 1)[1])
            except ValueError:
                width = math.nan
            if not (math.isfinite(width) and width > 0):
                raise ConfigError(
                    f"--stop {text!r}: the half-width must be a positive number of nats, e.g. "
                    "half-width:0.01"
                )
            return cls("half-width", width, given)
        raise ConfigError(
            f"--stop must be fixed, decided, half-width:X, equivalent[:M] or "
            f"decided+equivalent[:M] (X, M in nats, e.g. half-width:0.01, equivalent:"
            f"{DEFAULT_EQUIVALENCE_MARGIN:g}); got {text!r}"
        )

    def as_text(self) -> str:
        """The rule as text: as given, else `half-width:X` / `KIND:M` (as %g) or the kind."""
        if self.text:
            return self.text
        if self.kind in EQUIVALENCE_KINDS:
            return f"{self.kind}:{self.margin:g}"
        return f"half-width:{self.half_width:g}" if self.kind == "half-width" else self.kind


def list_items(text: str) -> tuple[str, ...]:
    """The items of a comma list, stripped; empty items are left out."""
    return tuple(part for part in (p.strip() for p in text.split(",")) if part)


def list_text(values: Iterable[object]) -> str:
    """A list option written back as text (the reproducing command): its items joined by ',',
    a float as %g where that reads back as the same float, else in full (`repr`), so the
    command reproduces exactly the values it ran (0.00123456789 stays itself)."""
    return ",".join(_float_text(v) if isinstance(v, float) else str(v) for v in values)


def _float_text(x: float) -> str:
    short = f"{x:g}"
    return short if float(short) == x else repr(x)


def parse_tapers(text: str) -> tuple[Allocation, ...]:
    """--tapers: its allocations, split as `taperlm.compare.grid.split_taper_list` says, each
    parsed once into its specs (`parse_allocations`)."""
    return parse_allocations(split_taper_list(text))


def parse_allocations(specs: Iterable[str | Allocation]) -> tuple[Allocation, ...]:
    """Allocations from specs given as text (the command line, a study's own list) or parsed
    already (kept as they are): an allocation stays its parsed specs from here on. The width
    step is the comparison's (`taperlm.compare.comparison.allocations` applies it)."""
    return tuple(a if isinstance(a, Allocation) else parse_allocation(a.strip()) for a in specs)


def parse_preset_sizes(text: str) -> tuple[str, ...] | None:
    """--preset-size: the sizes listed (which are known depends on the --paper mode: its study
    checks them); '' = the mode's default (None); ConfigError for a text that lists none."""
    if not text:
        return None
    sizes = list_items(text)
    if not sizes:
        raise ConfigError(
            f"--preset-size {text!r} names no size; give one, e.g. --preset-size micro, or a "
            "list such as micro,tiny (--paper scaling)"
        )
    return sizes


def parse_niah_lengths(text: str) -> tuple[int, ...]:
    """--eval-niah-lengths: positive whole numbers of tokens, in the order given (ConfigError
    naming the option otherwise); blank = () (each cell's context_length)."""
    return tuple(parse_lengths(text, "--eval-niah-lengths")) if text.strip() else ()


def parse_lr_grid(text: str) -> tuple[float, ...] | None:
    """--lr-grid (`1e-3,2e-3,...`): at least two distinct positive lrs, sorted; blank = None
    (the default grid around the recipe's lr, `taperlm.compare.tuning.lr_grid`)."""
    if not text.strip():
        return None
    out: list[float] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            lr = float(part)
        except ValueError:
            raise ConfigError(
                f"--lr-grid: {part!r} is not a number; give e.g. 1e-3,2e-3,4e-3"
            ) from None
        if not (math.isfinite(lr) and lr > 0):
            raise ConfigError(f"--lr-grid: every lr must be > 0, got {part}")
        if lr in out:
            raise ConfigError(f"--lr-grid lists {part} twice")
        out.append(lr)
    if len(out) < 2:
        raise ConfigError("--lr-grid needs at least two lrs to choose from, e.g. 1e-3,2e-3,4e-3")
    return tuple(sorted(out))


def _typed(value: Any, parse: Callable[[str], Any]) -> Any:
    """An option's value as its type: text parsed by `parse`; a value given typed (the Python
    API, `dataclasses.replace`) kept, a list made a tuple (the options' values do not change)."""
    if isinstance(value, str):
        return parse(value)
    return tuple(value) if isinstance(value, list) else value


FLAG_KEY = "flag"  # the dataclasses.field metadata key of an option's command-line flag
ARGPARSE_KEY = "argparse"  # further add_argument keywords (action, choices, metavar, ...)
CONFIG_KEY = "config_key"  # the dotted run-config key an option sets (`data.dir`), if any


def option(
    flag: str,
    help: str,
    default: Any = None,
    domain: str | None = None,
    type: Any = None,
    kind: type = int,
    key: str | None = None,
    **argparse_kwargs: Any,
) -> Any:
    """A `CompareOptions` field and its command-line option: `domain` (a range of `kind`, int
    unless said) makes the option's type `number(kind, domain)` and is checked by
    `check_option_ranges`; `key` names the run-config key the option sets."""
    if domain is not None:
        type = number(kind, domain)
    kwargs = {"help": help, **argparse_kwargs}
    if type is not None:
        kwargs["type"] = type
    metadata = {FLAG_KEY: flag, ARGPARSE_KEY: kwargs}
    if key is not None:
        metadata[CONFIG_KEY] = key
    if domain is not None:
        metadata[DOMAIN_KEY] = domain_of(domain)
    if isinstance(default, list):
        return field(default_factory=list, metadata=metadata)
    if default is dataclasses.MISSING:
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(kw_only=True)
class CompareOptions:
    """What to compare and how (the options of `taperlm compare`, named as its arguments, in the
    order of its --help)."""

    # the shared model options (taperlm.commands.common.add_model_arguments)
    preset: str | None = None  # None (and no config): DEFAULT_PRESET
    config: Path | None = None
    multiple_of: int | None = None
    overrides: list[str] = field(default_factory=list)
    # --tapers: its allocations in order, each parsed once into its specs (parse_tapers; None:
    # not given, () given empty); their width step is the comparison's (--multiple-of, the
    # model's), which a study's comparisons change (dataclasses.replace): applied there
    tapers: tuple[Allocation, ...] | None = option(
        "--tapers",
        "allocations to compare, e.g. 'uniform;cosine:1.5:0.5;groups:1.5,1.0,0.5' "
        "(separate with ';', or with ',' when no spec holds commas; NAME=SPEC names one; "
        "uniform is always added); SPEC+heads:HEAD_SPEC or heads:HEAD_SPEC also tapers the "
        "attention heads; +kv:KV_SPEC (or kv:KV_SPEC alone) the KV heads per layer; "
        "novelty:pilot[:STRENGTH] takes widths from a short uniform pilot run "
        "of each seed [default: uniform;cosine:1.5:0.5]",
    )
    taper_list: tuple[Allocation, ...] = option(  # one allocation each, after --tapers'
        "--taper",
        "one allocation (repeatable; alternative to --tapers)",
        default=[],
        action="append",
        metavar="SPEC",
    )
    paper: str | None = option(
        "--paper",
        "the paper's grids: controlled = uniform / wider-early / wider-middle / wider-late "
        "(3 equal groups, §3); sweep = cosine/linear/sigmoid x 5 ratios + uniform (§4); "
        "families = uniform vs cosine 1.5->0.5 for every family's preset, reported like the "
        "paper's 760M table (§6); scaling = the cosine ratio sweep at 3 sizes x 2 token budgets, "
        "each at its uniform model's tuned lr, with the fitted best ratio per point "
        "(docs/compare.md); tokens = that sweep, with the inverse tapers 0.75->1.25 and "
        "0.5->1.5 below uniform, at nano (0.5-68 tokens/param) and micro (0.5-10): does the "
        "advantage survive long training (estimated ~24 h on 2 idle cores at 5 seeds, from "
        "measured per-run speed); ratios = that sweep and past 1.9->0.1 (1.95->0.05, 2.0->0.0) "
        "at nano 0.5/8/68 and micro 0.5/10 (estimated ~23 h; ~4 h after "
        "tokens, in a copy of its finished --out: the cells both sweep are reused); both "
        "write trend.md with the fitted trends (docs/compare.md, 'Long training'); confirm = "
        "the pre-registered check of the widening lead: uniform vs cosine 0.75->1.25 at micro, "
        "10 tokens/param, lr 0.004, fresh seeds 100-114, --stop decided (~1.5-7.5 h on 2 idle "
        "cores); confirm-code = the same pair at micro, 2 tokens/param, on the code corpus "
        "(--data), uniform's lr tuned first (~0.7-1.9 h) (docs/compare.md, 'The confirmatory "
        "comparison'); shapes = hourglass 1/0.5, uniform, bell 0.5/1 and the monotone cosine "
        "1.5->0.5, 0.75->1.25 and OpenELM's linear 2/9->16/9 at nano 8 and 32 tokens/param and "
        "micro 2, each point at uniform's tuned lr, with the fitted best bell/hourglass "
        "strength (~6.5 h on 2 idle cores at 5 seeds) (docs/compare.md, 'Shapes beyond "
        "monotone')",
        choices=PAPER_MODES,
    )
    # --paper families / scaling / tokens / ratios: the size(s) of the presets, as listed
    # (parse_preset_sizes; None: the mode's default); the mode's study checks them
    preset_size: tuple[str, ...] | None = option(
        "--preset-size",
        "--paper families: size of every family's preset (micro, tiny, small, 440m, 760m, 1.3b; "
        "the paper's sizes train with its recipe) [micro]; --paper scaling: a list of sizes "
        "[micro,tiny,small] (440m,760m,1.3b: the GPU experiment, at half and all of the "
        "paper's tokens); --paper tokens/ratios/shapes: nano, micro or both [nano,micro]",
    )
    # --paper families: the preset prefixes listed (list_items; None: DEFAULT_FAMILIES; ()
    # given empty), checked by taperlm.compare.families.family_presets
    families: tuple[str, ...] | None = option(
        "--families",
        "--paper families: preset families to compare "
        f"[{','.join(DEFAULT_FAMILIES)}; also titans-mac, titans-mal]",
    )
    # None: DEFAULT_SEEDS for the main job, MODEL_SEEDS with --preset/--config, PAPER_MODE_SEEDS
    # with --paper
    seeds: int | None = option(
        "--seeds",
        f"N seeds (from --first-seed), the most trained: --stop may stop sooner [{DEFAULT_SEEDS}; "
        f"{MODEL_SEEDS} with --preset/--config; {PAPER_MODE_SEEDS} with --paper]",
        domain=up_to(MAX_COUNT),
    )
    first_seed: int = option(  # seeds first_seed..first_seed+N-1: fresh seeds for a replication
        "--first-seed",
        "the first seed: the seeds are N..N+--seeds-1, in order (fresh seeds for a "
        "confirmatory comparison; --paper confirm uses 100) [0]",
        default=0,
        domain=up_to(MAX_SEED // 2, 0),
    )
    stop: Stop = option(  # given as text, parsed once (__post_init__): Stop.parse
        "--stop",
        "when to stop adding seeds (in order; the decision at n reads the first n seeds only): "
        "decided = when every comparison's anytime-valid interval excludes 0; half-width:X = "
        "when every one is within +-X nats; equivalent[:M] = when every one lies inside +-M "
        f"nats, 'no practical difference' [M = {DEFAULT_EQUIVALENCE_MARGIN:g}]; "
        "decided+equivalent[:M] = when every one is either; fixed = all --seeds. Always at "
        f"--seeds [{DEFAULT_STOP}]",
        default=DEFAULT_STOP,
    )
    stop_alpha: float = option(  # the error rate of each comparison's confidence sequence
        "--stop-alpha",
        "--stop: error rate of each comparison's anytime-valid interval, however often it is "
        f"looked at [{DEFAULT_STOP_ALPHA:g}]",
        default=DEFAULT_STOP_ALPHA,
        domain="(0, 1)",
        kind=float,
    )
    min_seeds: int = option(  # no stop before this many seeds
        "--min-seeds",
        f"--stop: never stop before N seeds [{DEFAULT_MIN_SEEDS}]",
        default=DEFAULT_MIN_SEEDS,
        domain=up_to(MAX_COUNT),
    )
    stop_on: StopQuestion = option(  # taperlm.compare.statistics.comparisons
        "--stop-on",
        "--stop: the comparisons that must be settled: each = every allocation vs uniform "
        "(default); best = the lowest-loss allocation vs uniform and vs its neighbours in the "
        "list (--paper scaling's points)",
        default="each",
        choices=STOP_QUESTIONS,
    )
    tokens: int | None = option(
        "--tokens",
        f"training tokens per run [default {DEFAULT_TOKENS:,}, 8 tokens per parameter of "
        f"{DEFAULT_PRESET}; with --preset/--config/--paper {RECIPE_TOKENS:,}]",
        domain=up_to(MAX_TOKENS),
        key="train.tokens",
    )
    data: Path | None = option(
        "--data",
        "data dir from `taperlm prepare` (default: the built-in corpus, prepared once into "
        "the cache)",
        type=input_path(),
        key="data.dir",
    )
    val_tokens: int = option(
        "--val-tokens",
        f"validation tokens for the final loss/ppl (0 = whole val split) [{DEFAULT_VAL_TOKENS}]",
        default=DEFAULT_VAL_TOKENS,
        domain=up_to(MAX_TOKENS, 0),
    )
    # the task and group names listed (list_items; none and val: no task), each group expanded
    # and every name checked against the task registry by taperlm.compare.comparison.eval_settings
    eval_tasks: tuple[str, ...] = option(
        "--eval-tasks",
        "tasks after training: none (default), paper (the nine zero-shot tasks), niah "
        "(S-NIAH-1/2/3 at --eval-niah-lengths), all, or a list such as wikitext,piqa,niah_single_1",
        default="none",
    )
    eval_limit: int = option(
        "--eval-limit",
        f"first N items per zero-shot task (0 = all) [{DEFAULT_EVAL_LIMIT}]",
        default=DEFAULT_EVAL_LIMIT,
        domain=up_to(MAX_COUNT, 0),
    )
    # parse_niah_lengths; (): each cell's context_length
    eval_niah_lengths: tuple[int, ...] = option(
        "--eval-niah-lengths",
        "NIAH lengths in tokens for --eval-tasks niah (default: each cell's context_length)",
        default="",
    )
    eval_data: Path | None = option(
        "--eval-data",
        "folder laid out like ../shared/data (default: $TAPERLM_EVAL_DATA or ../shared/data)",
        type=input_path(),
    )
    novelty_tokens: int = option(
        "--novelty-tokens",
        f"tokens for the novelty measurement [{DEFAULT_NOVELTY_TOKENS}]",
        default=DEFAULT_NOVELTY_TOKENS,
        domain=up_to(MAX_TOKENS, 2),
    )
    novelty_data: Path | None = option(
        "--novelty-data",
        "text file for novelty (default: WikiText-2 test from ../shared/data, else the val split)",
        type=input_path(),
    )
    jobs: int | None = option(  # cells at a time; None: as many as idle cores allow
        "--jobs",
        "cells trained at a time, each in its own worker process (default: as many as "
        "there are idle CPU cores for --threads each; 1 = in this process). Changes the speed, "
        "never the numbers",
        domain=up_to(MAX_WORKERS),
    )
    threads: int = option(
        "--threads",
        f"torch CPU threads per cell [{DEFAULT_THREADS}]; more only helps when there are "
        "more idle cores than cells",
        default=DEFAULT_THREADS,
        domain=up_to(MAX_WORKERS),
    )
    pilot_tokens: int | None = option(  # None: PILOT_FRACTION of a run (novelty:pilot only)
        "--pilot-tokens",
        "training tokens of each novelty:pilot pilot run [default: a quarter of --tokens]",
        domain=up_to(MAX_TOKENS),
    )
    tune_lr: bool = option(  # each allocation at its own best lr (taperlm.compare.tuning)
        "--tune-lr",
        "each allocation at its own best peak lr: every allocation trained at every "
        "--lr-grid lr on --tune-seeds tuning seeds (disjoint from the reported ones), the lowest "
        "mean val loss chosen, then the reported seeds run at the chosen lrs; reported beside "
        "the shared-lr difference (docs/compare.md)",
        default=False,
        action="store_true",
    )
    # parse_lr_grid: sorted; None: the recipe's lr x tuning.DEFAULT_LR_FACTORS
    lr_grid: tuple[float, ...] | None = option(
        "--lr-grid",
        "--tune-lr: the peak lrs to try, e.g. 1e-3,2e-3,4e-3,8e-3 [the recipe's lr x 0.5, 1, 2, 4]",
    )
    lr_grid_extend: int | None = option(  # None: 0 (--paper tokens/ratios: LONGRUN_EXTEND)
        "--lr-grid-extend",
        "--tune-lr: when an allocation's chosen lr is at the grid's edge, add the lr one grid "
        "step beyond that edge and tune again, at most N times (the optimum lr moves with the "
        "budget) [0; --paper tokens/ratios: 3]",
        domain=up_to(MAX_COUNT, 0),
    )
    tune_seeds: int | None = option(  # None: tuning.DEFAULT_TUNE_SEEDS
        "--tune-seeds",
        f"--tune-lr: tuning seeds per allocation and lr [{DEFAULT_TUNE_SEEDS}]",
        domain=up_to(MAX_COUNT),
    )
    tune_scope: TuneScope | None = option(  # None: each
        "--tune-lr-scope",
        "--tune-lr: each = every allocation tuned, reported at its own lr beside the "
        "shared lr (default); uniform = only uniform tuned, every allocation trained at its lr",
        choices=TUNE_SCOPES,
    )
    out: Path = option(
        "--out",
        "output folder (resumable)",
        default=dataclasses.MISSING,
        type=output_path("dir"),
        required=True,
    )
    no_progress: bool = option(
        "--no-progress", "no progress bars", default=False, action="store_true"
    )
    # Where and how cells run (issue 59): processes per cell, the executor, the cost first.
    nproc_per_cell: int = option(
        "--nproc-per-cell",
        "processes per cell: each cell trains as a torchrun-style group of N processes on its "
        "own devices (N GPUs, or N gloo processes on CPU), DDP or FSDP2 as train.parallel says; "
        "--jobs then defaults to the devices available / N [1]",
        default=1,
        domain=up_to(MAX_WORKERS),
    )
    executor: ExecutorName = option(
        "--executor",
        "where cells run: local = this machine; slurm = each cell a Slurm job (submitit; "
        "docs/cluster.md) [local]",
        default="local",
        choices=EXECUTOR_NAMES,
    )
    dry_run: bool = option(
        "--dry-run",
        "list the cells, each cell's GPU-hours from the planner, the total for the fixed design "
        "and the range with the sequential stop, and the jobs it would submit; trains nothing "
        "and creates nothing",
        default=False,
        action="store_true",
    )
    wait: bool = option(
        "--wait",
        "--executor slurm: wait until every cell is done, then write the report (default: "
        "submit what is missing, show every cell's state and return; rerun to update)",
        default=False,
        action="store_true",
    )
    slurm_partition: str | None = option("--slurm-partition", "Slurm partition of the jobs")
    slurm_account: str | None = option("--slurm-account", "Slurm account charged")
    slurm_qos: str | None = option("--slurm-qos", "Slurm QOS of the jobs")
    slurm_time: str | None = option(
        "--slurm-time",
        "time limit of each cell's job (Slurm's format, e.g. 12:00:00 or 2-00:00:00); a cell "
        "that runs out of time is requeued and resumes from its last checkpoint",
    )
    slurm_nodes: int = option(
        "--slurm-nodes",
        "nodes per cell (its --nproc-per-cell processes are split evenly across them) [1]",
        default=1,
        domain=up_to(MAX_WORKERS),
    )
    slurm_gpus_per_node: int | None = option(
        "--slurm-gpus-per-node",
        "GPUs per node of a cell's job [its processes per node on CUDA; 0 on CPU]",
        domain=up_to(MAX_WORKERS, 0),
    )
    slurm_constraint: str | None = option(
        "--slurm-constraint", "Slurm node features the jobs need (e.g. h100)"
    )
    slurm_extra: str = option(
        "--slurm-extra",
        "further sbatch arguments for every job, e.g. '--mem=0 --exclusive'",
        default="",
    )
    loggers: list[str] | None = None  # train.loggers of every cell (None: the config's)

    def __post_init__(self) -> None:
        # the options given as text (the command line; the Python API may give either), each
        # parsed once, here: a bad value fails before any work, naming its option
        self.stop = _typed(self.stop, Stop.parse)
        self.tapers = self.tapers if self.tapers is None else _allocations(self.tapers)
        self.taper_list = _allocations(_typed(self.taper_list, lambda t: (t,)))
        self.preset_size = _typed(self.preset_size, parse_preset_sizes)
        self.families = _typed(self.families, list_items)
        self.eval_tasks = _typed(self.eval_tasks, list_items)
        self.eval_niah_lengths = _typed(self.eval_niah_lengths, parse_niah_lengths)
        self.lr_grid = _typed(self.lr_grid, parse_lr_grid)
        if self.seeds is None:
            self.seeds = (
                CONFIRM_SEEDS
                if self.paper in CONFIRM_MODES
                else PAPER_MODE_SEEDS
                if self.paper
                else DEFAULT_SEEDS
                if is_main_job(self)
                else MODEL_SEEDS
            )


def _allocations(value: str | Iterable[str | Allocation]) -> tuple[Allocation, ...]:
    """--tapers' (or --taper's) allocations: text parsed (`parse_tapers`), typed kept (the same
    tuple when every item is parsed already: a `dataclasses.replace` parses nothing again)."""
    if isinstance(value, str):
        return parse_tapers(value)
    if isinstance(value, tuple) and all(isinstance(a, Allocation) for a in value):
        return value
    return parse_allocations(value)


def is_main_job(opts: CompareOptions) -> bool:
    """Whether `opts` name no model and no --paper mode: the main job, with its own defaults
    (DEFAULT_PRESET at DEFAULT_TOKENS, MAIN_LR, ...) on top of compare's recipe."""
    return opts.preset is None and opts.config is None and not opts.paper


def width_step(opts: CompareOptions) -> int | None:
    """The allocations' width step: --multiple-of, else the main job's MAIN_MULTIPLE_OF (None:
    the taper's default)."""
    if opts.multiple_of is not None:
        return opts.multiple_of
    return MAIN_MULTIPLE_OF if is_main_job(opts) else None


def model_preset(opts: CompareOptions) -> str | None:
    """The preset `opts` compare (None: a --config file's model): --preset, else the main job's
    DEFAULT_PRESET, or PAPER_MODE_PRESET in a --paper mode."""
    if opts.config is not None:
        return None
    return opts.preset or (PAPER_MODE_PRESET if opts.paper else DEFAULT_PRESET)


def declared_options() -> list[dataclasses.Field]:
    """The fields of `CompareOptions` that are options of this command (not the shared ones)."""
    return [f for f in dataclasses.fields(CompareOptions) if FLAG_KEY in f.metadata]


def add_option_arguments(parser: argparse.ArgumentParser) -> None:
    """compare's own options, in declaration order, from `CompareOptions`' fields."""
    for f in declared_options():
        kwargs = dict(f.metadata[ARGPARSE_KEY])
        if f.name != f.metadata[FLAG_KEY][2:].replace("-", "_"):
            kwargs["dest"] = f.name
        if f.default is not dataclasses.MISSING and f.default is not None:
            kwargs["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kwargs["default"] = f.default_factory()
        if CONFIG_KEY in f.metadata:
            add_setting_argument(parser, f.metadata[FLAG_KEY], f.metadata[CONFIG_KEY], **kwargs)
        else:
            parser.add_argument(f.metadata[FLAG_KEY], **kwargs)


def _setting(value: Any) -> Any:
    """An option's value in the run config's form: a path absolute (the folder it names from
    anywhere, as every cell's config holds it)."""
    return str(value.expanduser().resolve()) if isinstance(value, Path) else value


def option_settings_of(opts: CompareOptions) -> list[OptionSetting]:
    """What `opts` give the options that set a run-config key (compare's own, by their
    declared key, and the shared --logger), as the assembly takes them."""
    out = [
        OptionSetting(f.metadata[FLAG_KEY], f.metadata[CONFIG_KEY], _setting(getattr(opts, f.name)))
        for f in declared_options()
        if CONFIG_KEY in f.metadata
    ]
    return [
        *out,
        OptionSetting("--logger", "train.loggers", opts.loggers),
        # the cells' width step (`width_step`), not the base config's taper
        OptionSetting("--multiple-of", "model.taper.multiple_of", opts.multiple_of, False),
    ]


def options_from(args: argparse.Namespace) -> CompareOptions:
    """The `CompareOptions` of parsed arguments."""
    return CompareOptions(
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(CompareOptions)}
    )


def check_option_ranges(opts: CompareOptions) -> None:
    """ConfigError naming the flag for the first value outside its declared domain (what the
    command line checks on parsing; here for options built in Python)."""
    for f in declared_options():
        domain = f.metadata.get(DOMAIN_KEY)
        if domain is not None:
            domain.check(getattr(opts, f.name), f.metadata[FLAG_KEY])


def canonical_command(opts: CompareOptions, grid: Grid) -> str:
    """A command line that reproduces this comparison (every choice explicit)."""
    parts = ["taperlm", "compare"]
    if opts.config:
        parts += ["--config", str(opts.config)]
    else:
        parts += ["--preset", str(model_preset(opts))]
    if grid.paper:
        parts += ["--paper", grid.paper]
    else:
        specs = [
            a.spec_string if a.label == a.spec_string else f"{a.name}={a.spec_string}"
            for a in grid.allocations
        ]
        parts += ["--tapers", ";".join(specs)]
    step = width_step(opts)
    if step:
        parts += ["--multiple-of", str(step)]
    pilot = grid.pilot and grid.pilot.tokens
    args = run_arguments(opts, len(grid.seeds), grid.base.train.tokens, pilot)
    if is_main_job(opts):
        # the main job's own recipe, which a named --preset does not get: said as --set (before
        # the user's own, which the values already include)
        t = grid.base.train
        main = [f"train.lr={t.lr:g}", f"train.eval_tokens={t.eval_tokens}"]
        main.append(f"train.eval_every={t.eval_every}")
        at = args.index("--tokens") + 2
        args[at:at] = [x for o in main for x in ("--set", o)]
    return shlex.join(parts + args)


def run_arguments(
    opts: CompareOptions, seeds: int, tokens: int, pilot: int | None = None
) -> list[str]:
    """The arguments after the model and allocations in a reproducing command line (`pilot`:
    the pilot runs' tokens, when the grid has novelty:pilot allocations)."""
    parts = ["--seeds", str(seeds), "--tokens", str(tokens)]
    if opts.first_seed:
        parts[2:2] = ["--first-seed", str(opts.first_seed)]
    if opts.data is not None:
        parts += ["--data", str(opts.data)]
    for o in opts.overrides:
        parts += ["--set", o]
    parts += ["--val-tokens", str(opts.val_tokens), "--eval-tasks", list_text(opts.eval_tasks)]
    if opts.eval_tasks not in ((), ("none",)):
        parts += ["--eval-limit", str(opts.eval_limit)]
    if opts.eval_niah_lengths:
        parts += ["--eval-niah-lengths", list_text(opts.eval_niah_lengths)]
    parts += ["--novelty-tokens", str(opts.novelty_tokens)]
    if opts.novelty_data is not None:
        parts += ["--novelty-data", str(opts.novelty_data)]
    if pilot is not None:
        parts += ["--pilot-tokens", str(pilot)]
    if opts.tune_lr:
        parts.append("--tune-lr")
        if opts.lr_grid is not None:  # else each model's default grid, around its recipe's lr
            parts += ["--lr-grid", list_text(opts.lr_grid)]
        parts += ["--tune-seeds", str(opts.tune_seeds or DEFAULT_TUNE_SEEDS)]
        parts += ["--tune-lr-scope", opts.tune_scope or "each"]
        if opts.lr_grid_extend:
            parts += ["--lr-grid-extend", str(opts.lr_grid_extend)]
    parts += ["--stop", opts.stop.as_text(), "--stop-alpha", f"{opts.stop_alpha:g}"]
    parts += ["--min-seeds", str(opts.min_seeds), "--stop-on", opts.stop_on]
    if opts.nproc_per_cell > 1:  # the order of a step's sums: the last bits of the numbers
        parts += ["--nproc-per-cell", str(opts.nproc_per_cell)]
    parts += ["--out", str(opts.out)]  # --jobs/--threads change the speed, never the numbers
    return parts

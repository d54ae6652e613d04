"""The training recipe of `taperlm compare` and the base config every cell starts from
(torch-free: `taperlm compare --help` and the option checks read it).

The base config is assembled like every command's (`taperlm.config.assembly.Assembly.assemble`):
compare's recipe (a named `Recipe`: `compare-cpu`, `compare-main`, the paper's `paper-SIZE`) and
what it derives (whole steps, warmup, evaluation and checkpoint intervals, the data's
vocabulary, the logged group) are the `Layer.RECIPE` between the preset and the user's settings,
so each applies only where the user chose nothing: recipe < the config file < `--tokens`,
`--data`, `--logger` < `--set` < $TAPERLM_SET. Which keys the user gave is read from the
assembly's record (`Assembly.given`). The data every cell trains on, the vocabulary and the
evaluation all come from the one assembled `data.dir`
(`taperlm.compare.comparison.data_dir_of`)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from taperlm.compare.options import (
    DEFAULT_TOKENS,
    MAIN_CURVE_POINTS,
    MAIN_EVAL_TOKENS,
    MAIN_LR,
    RECIPE_TOKENS,
    CompareOptions,
    is_main_job,
    model_preset,
    option_settings_of,
)
from taperlm.config import ModelConfig, RunConfig, TrainConfig, env_overrides
from taperlm.config.assembly import Assembly, Layer, Recipe, check_agreement
from taperlm.errors import ConfigError

# Compare's CPU recipe (docs/compare.md, "Precision of the main job"). What made the main job
# precise: runs past the unigram plateau (320 steps of 1,024 tokens instead of 160 of 2,048; the
# gap between two allocations opens while they leave it, and its size varies from seed to seed),
# an init of about 1/sqrt(d_model) for these small widths (GPT-2's 0.02 suits d_model ~768+; at
# 128 it kept the models on the plateau longer and less predictably), validation on ~all of the
# built-in corpus's val split, and the cheaper 2,048-token vocabulary (more seeds per minute).
# Only the fields it sets differ from TrainConfig's defaults; a family's FAMILY_LR replaces lr.
# The main job (no model named: `compare.options.is_main_job`) trains longer, at its own lr and
# with a finer curve (`_train_recipe`; why: compare.options).
COMPARE_TRAIN = TrainConfig(
    tokens=RECIPE_TOKENS,
    seq_len=128,
    micro_batch_size=8,
    batch_tokens=1024,
    lr=2e-3,
    min_lr_ratio=0.1,
    eval_tokens=4096,
    keep_checkpoints=1,
    log_every=4,
)
# Peak learning rate of the CPU recipe for a family (by `model.family`) that the recipe's own lr
# does not train stably. Titans: at 2e-3, titans-mag-tiny tapered 1.5 -> 0.5 diverged (NaN loss
# from step ~17 of 64, seed 0; measured before max_inner_grad_norm existed) while its uniform
# twin trained; at 1e-3 both train (docs/compare.md).
FAMILY_LR: dict[str, float] = {"titans": 1e-3}
# Model settings of compare's CPU recipe for a preset of a small size (micro, tiny, small); a config
# file's model section and --set win. Not applied at the paper's sizes (their init is the paper's).
COMPARE_MODEL = ModelConfig(init_std=0.1)
# A preset of one of the paper's sizes trains with the paper's recipe instead (its training recipe:
# AdamW, peak lr 4e-4, weight decay 0.1, cosine decay, 0.5M-token batches of 4K-token
# sequences, 30B/50B/100B tokens), so that the same command runs the paper's experiment on GPUs.
# micro_batch_size 4 (16 accumulation steps) fits a 1.3B model at 4K context on an 80 GB GPU
# with bf16 autocast; raise it where memory allows (--set train.micro_batch_size=N).
PAPER_TRAIN = TrainConfig(
    seq_len=4096,
    micro_batch_size=4,
    batch_tokens=524_288,
    lr=4e-4,
    min_lr_ratio=0.1,
    weight_decay=0.1,
    eval_tokens=524_288,
    keep_checkpoints=2,
    log_every=10,
)
PAPER_TOKENS = {"440m": 30_000_000_000, "760m": 50_000_000_000, "1.3b": 100_000_000_000}
# Derived from train.tokens unless given explicitly (config file or --set).
WARMUP_FRACTION = 0.05
CURVE_POINTS = 16
CHECKPOINTS_PER_RUN = 4


def base_config(
    opts: CompareOptions,
    data_dir: Path | None,
    data_vocab: int | None,
    notes: list[str] | None = None,
) -> RunConfig:
    """The uniform run config every cell starts from (before taper and seed); what it had to
    change (train.tokens rounded up to whole steps) is appended to `notes`. `data_dir` is the
    folder `data_dir_of` found for this config (None: not looked up yet), the same folder as the
    assembled data.dir whenever one is given: it is written here resolved."""
    asm = Assembly.start(opts.config, model_preset(opts))
    family = (asm.data.get("model") or {}).get("family")  # the recipe's: before any --set
    # Compare reads the model, data and train sections only; every cell gets its own taper.
    asm.data = {key: dict(asm.data.get(key) or {}) for key in ("model", "data", "train")}
    asm.data["model"].pop("taper", None)
    asm.clear_sizes()
    # $TAPERLM_SET is already among opts.overrides, after --set (`taperlm.commands.compare`): an
    # option is checked against the user's own --set only, as on every command's command line.
    options = option_settings_of(opts)
    env = set(env_overrides())
    check_agreement(options, [o for o in opts.overrides if o not in env])
    recipe = compare_recipe(opts, family)
    asm.assemble(options, opts.overrides, recipe, env=False, check=False)
    if data_dir is not None:  # the assembled folder (resolved), or the default corpus
        asm.put("data.dir", str(data_dir), max(asm.layer_of("data.dir"), Layer.RECIPE))
    if data_vocab is not None and not opts.config:
        asm.put("model.vocab_size", data_vocab, Layer.RECIPE)  # a preset follows the data's
    cfg = asm.build()
    if cfg.train.loggers and not asm.given("train.log_group"):
        cfg.train.log_group = _log_group(opts.out)
    points = MAIN_CURVE_POINTS if is_main_job(opts) else CURVE_POINTS
    note = _derive_schedule(cfg.train, asm, points)
    if note and notes is not None:
        notes.append(note)
    if cfg.model.taper.schedule != "uniform":
        raise ConfigError(
            "the config's model.taper must be uniform here; list tapers with --tapers"
        )
    if cfg.train.eval_tokens < 1:
        raise ConfigError("train.eval_tokens must be >= 1 for the loss curves")
    return cfg.resolve()


def compare_recipe(opts: CompareOptions, family_name: str | None) -> Recipe:
    """The named training recipe of a comparison: the paper's at one of its sizes
    (`paper-440m`), the main job's (`compare-main`), or compare's CPU recipe (`compare-cpu`,
    `compare-cpu-titans` with a family's own lr)."""
    size = _preset_size(opts)
    if size in PAPER_TOKENS:
        name = f"paper-{size}"
    elif is_main_job(opts):
        name = "compare-main"
    elif (family_name or "transformer") in FAMILY_LR:
        name = f"compare-cpu-{family_name}"
    else:
        name = "compare-cpu"
    return Recipe.of(name, model=_model_recipe(opts), train=_train_recipe(opts, family_name))


def _log_group(out: Path) -> str:
    """One logged group for the comparison's runs (each run is named after its folder:
    allocation-sSEED), unique per comparison folder."""
    where = out.resolve()
    digest = hashlib.sha1(str(where).encode()).hexdigest()[:6]
    return f"{where.name}-{digest}"


def _preset_size(opts: CompareOptions) -> str | None:
    """The size of the model's preset (`tiny`, `440m`, ...); None for a config file."""
    preset = model_preset(opts)
    return None if preset is None else preset.rpartition("-")[2]


def _train_recipe(opts: CompareOptions, family_name: str | None) -> TrainConfig:
    """Compare's CPU recipe (with the family's own learning rate where it has one; the main
    job's budget, lr and curve), or the paper's recipe for a preset of one of its sizes."""
    size = _preset_size(opts)
    if size in PAPER_TOKENS:
        return dataclasses.replace(PAPER_TRAIN, tokens=PAPER_TOKENS[size])
    if is_main_job(opts):
        return dataclasses.replace(
            COMPARE_TRAIN, tokens=DEFAULT_TOKENS, lr=MAIN_LR, eval_tokens=MAIN_EVAL_TOKENS
        )
    lr = FAMILY_LR.get(family_name or "transformer", COMPARE_TRAIN.lr)
    return dataclasses.replace(COMPARE_TRAIN, lr=lr)


def _model_recipe(opts: CompareOptions) -> ModelConfig | None:
    """Compare's model settings for a preset of a small size; none for a config file (its model
    section is the user's) or a preset of the paper's sizes."""
    size = _preset_size(opts)
    return None if size is None or size in PAPER_TOKENS else COMPARE_MODEL


def _derive_schedule(train: TrainConfig, asm: Assembly, points: int = CURVE_POINTS) -> str | None:
    """Whole steps (train.tokens rounded up, said once here rather than by every cell), then
    warmup, evaluation (`points` per run) and checkpoint intervals from them, unless given."""
    tokens, batch = int(train.tokens), int(train.batch_tokens)
    rounding = TrainConfig(tokens=tokens, batch_tokens=max(1, batch))
    steps = rounding.steps
    note = rounding.rounding_note() if tokens >= batch >= 1 else None
    if note:
        train.tokens = tokens = steps * batch
    if not asm.given("train.warmup_tokens"):
        train.warmup_tokens = int(WARMUP_FRACTION * tokens) // batch * batch
    if not asm.given("train.eval_every"):
        train.eval_every = max(1, steps // points)
    if not asm.given("train.checkpoint_every"):
        train.checkpoint_every = max(1, steps // CHECKPOINTS_PER_RUN)
    return note

"""The training recipe of `taperlm compare` and the base config every cell starts from.

Precedence of settings: compare's recipe < the config file's train: section < `--tokens` <
`--set` (`overrides`) < `--logger`. The user's settings are read as the config file's sections
(the config module's dict form, as `--set` edits it); compare's recipe and what it derives (whole
steps, warmup, evaluation and checkpoint intervals, the data's vocabulary, the logged group) are
then applied to the typed config, each only where the user chose nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any, TypeVar

from taperlm.compare.options import DEFAULT_PRESET, DEFAULT_TOKENS, CompareOptions
from taperlm.config import (
    ModelConfig,
    RunConfig,
    TrainConfig,
    apply_overrides,
    clear_resolved_sizes,
    parse_override,
    run_config_from_dict,
    section_of,
)
from taperlm.errors import ConfigError
from taperlm.families import get_family
from taperlm.presets import config_data

# Compare's CPU recipe (docs/compare.md, "Precision of the main job"). What made the main job
# precise: runs past the unigram plateau (320 steps of 1,024 tokens instead of 160 of 2,048; the
# gap between two allocations opens while they leave it, and its size varies from seed to seed),
# an init of about 1/sqrt(d_model) for these small widths (GPT-2's 0.02 suits d_model ~768+; at
# 128 it kept the models on the plateau longer and less predictably), validation on ~all of the
# built-in corpus's val split, and the cheaper 2,048-token vocabulary (more seeds per minute).
# Only the fields it sets differ from TrainConfig's defaults; a family's compare_lr replaces lr.
COMPARE_TRAIN = TrainConfig(
    tokens=DEFAULT_TOKENS,
    seq_len=128,
    micro_batch_size=8,
    batch_tokens=1024,
    lr=2e-3,
    min_lr_ratio=0.1,
    eval_tokens=4096,
    keep_checkpoints=1,
    log_every=4,
)
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

Section = TypeVar("Section", ModelConfig, TrainConfig)


def base_config(
    opts: CompareOptions,
    data_dir: Path | None,
    data_vocab: int | None,
    notes: list[str] | None = None,
) -> RunConfig:
    """The uniform run config every cell starts from (before taper and seed); what it had to
    change (train.tokens rounded up to whole steps) is appended to `notes`."""
    loaded, source = config_data(opts.config, opts.preset or DEFAULT_PRESET)
    file_data = loaded if opts.config else {}  # a preset's values are no choice of the user's
    explicit = _explicit_keys(opts, file_data)
    cfg = run_config_from_dict(_user_settings(opts, loaded, file_data), source)
    family = (loaded.get("model") or {}).get("family")  # the recipe's: before any --set
    cfg.model = with_recipe(cfg.model, _model_recipe(opts), explicit, "model")
    cfg.train = with_recipe(cfg.train, _train_recipe(opts, family), explicit, "train")
    if data_dir is not None and "data.dir" not in explicit:
        cfg.data.dir = str(data_dir)
    if data_vocab is not None and not opts.config and "model.vocab_size" not in explicit:
        cfg.model.vocab_size = data_vocab  # a preset follows the data's tokenizer
    if cfg.train.loggers and "train.log_group" not in explicit:
        cfg.train.log_group = _log_group(opts.out)
    note = _derive_schedule(cfg.train, explicit)
    if note and notes is not None:
        notes.append(note)
    if cfg.model.taper.schedule != "uniform":
        raise ConfigError(
            "the config's model.taper must be uniform here; list tapers with --tapers"
        )
    if cfg.train.eval_tokens < 1:
        raise ConfigError("train.eval_tokens must be >= 1 for the loss curves")
    return cfg.resolve()


def _user_settings(opts: CompareOptions, loaded: dict, file_data: dict) -> dict[str, Any]:
    """The settings the user chose, in the config's dict form: the preset's (or file's) model,
    the file's data and train sections, --tokens, --set, then --logger."""
    model = dict(loaded.get("model") or {})
    clear_resolved_sizes(model)
    model.pop("taper", None)
    train = dict(file_data.get("train") or {})
    if opts.tokens is not None:
        train["tokens"] = opts.tokens
    settings = {"model": model, "data": dict(file_data.get("data") or {}), "train": train}
    apply_overrides(settings, opts.overrides)
    if opts.loggers is not None:
        settings["train"]["loggers"] = opts.loggers
    return settings


def _explicit_keys(opts: CompareOptions, file_data: dict[str, Any]) -> set[str]:
    """`section.key` of every setting the user gave (config file, --tokens or --set), which
    compare's recipe and derived values must not override."""
    keys = {f"train.{k}" for k in (file_data.get("train") or {})}
    keys |= {f"model.{k}" for k in (file_data.get("model") or {})}
    if opts.tokens is not None:
        keys.add("train.tokens")
    for text in opts.overrides:
        key, _ = parse_override(text)
        parts = key.split(".")
        if parts[0] not in ("model", "train", "data"):
            parts = [section_of(parts[0]) or "?", *parts]
        keys.add(".".join(parts[:2]))
    return keys


def with_recipe(cfg: Section, recipe: Section | None, explicit: set[str], section: str) -> Section:
    """`cfg` with every field where `recipe` departs from its class's defaults, unless the user
    set that field (`section.field` in `explicit`)."""
    if recipe is None:
        return cfg
    plain = type(recipe)()
    changes = {
        f.name: getattr(recipe, f.name)
        for f in dataclasses.fields(recipe)
        if not f.metadata.get("section")
        and getattr(recipe, f.name) != getattr(plain, f.name)
        and f"{section}.{f.name}" not in explicit
    }
    return dataclasses.replace(cfg, **changes)


def _log_group(out: Path) -> str:
    """One logged group for the comparison's runs (each run is named after its folder:
    allocation-sSEED), unique per comparison folder."""
    where = out.resolve()
    digest = hashlib.sha1(str(where).encode()).hexdigest()[:6]
    return f"{where.name}-{digest}"


def _preset_size(opts: CompareOptions) -> str | None:
    """The size of the model's preset (`tiny`, `440m`, ...); None for a config file."""
    return None if opts.config else (opts.preset or DEFAULT_PRESET).rpartition("-")[2]


def _train_recipe(opts: CompareOptions, family_name: str | None) -> TrainConfig:
    """Compare's CPU recipe (with the family's own learning rate where it has one), or the
    paper's recipe for a preset of one of its sizes."""
    size = _preset_size(opts)
    if size in PAPER_TOKENS:
        return dataclasses.replace(PAPER_TRAIN, tokens=PAPER_TOKENS[size])
    lr = get_family(family_name or "transformer").compare_lr
    return dataclasses.replace(COMPARE_TRAIN, lr=COMPARE_TRAIN.lr if lr is None else lr)


def _model_recipe(opts: CompareOptions) -> ModelConfig | None:
    """Compare's model settings for a preset of a small size; none for a config file (its model
    section is the user's) or a preset of the paper's sizes."""
    size = _preset_size(opts)
    return None if size is None or size in PAPER_TOKENS else COMPARE_MODEL


def _derive_schedule(train: TrainConfig, explicit: set[str]) -> str | None:
    """Whole steps (train.tokens rounded up, said once here rather than by every cell), then
    warmup, evaluation and checkpoint intervals from them, unless given."""
    tokens, batch = int(train.tokens), int(train.batch_tokens)
    rounding = TrainConfig(tokens=tokens, batch_tokens=max(1, batch))
    steps = rounding.steps
    note = rounding.rounding_note() if tokens >= batch >= 1 else None
    if note:
        train.tokens = tokens = steps * batch
    if "train.warmup_tokens" not in explicit:
        train.warmup_tokens = int(WARMUP_FRACTION * tokens) // batch * batch
    if "train.eval_every" not in explicit:
        train.eval_every = max(1, steps // CURVE_POINTS)
    if "train.checkpoint_every" not in explicit:
        train.checkpoint_every = max(1, steps // CHECKPOINTS_PER_RUN)
    return note

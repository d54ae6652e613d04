"""The main job's defaults (`taperlm compare` naming no model): transformer-nano trained to 8
tokens per parameter with the settings of the `--paper tokens` point measured there, so that
its answer is the one for trained models and its curve spans the crossing; a named model and
the --paper modes keep compare's general recipe; the report's command reproduces the main job."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from taperlm.cli import build_parser
from taperlm.compare import comparison
from taperlm.compare.comparison import corpus_tokenizer
from taperlm.compare.grid import build_grid
from taperlm.compare.options import (
    DEFAULT_PRESET,
    DEFAULT_TOKENS,
    MAIN_CURVE_POINTS,
    MAIN_EVAL_TOKENS,
    MAIN_LR,
    MAIN_MULTIPLE_OF,
    PAPER_MODE_PRESET,
    RECIPE_TOKENS,
    CompareOptions,
    canonical_command,
    options_from,
)
from taperlm.compare.recipe import COMPARE_TRAIN, base_config
from taperlm.config import to_dict
from taperlm.config.budget import total_params
from taperlm.config.loading import run_config_from_dict

ROOT = Path(__file__).resolve().parents[2]
# a reported cell of the --paper tokens point at 8 tokens per parameter (uniform's tuned lr)
MEASURED = ROOT / "benchmarks/results/longrun_tokens_nano/nano-2134016/runs/uniform-s0/result.json"
NANO_VOCAB = 512  # compare.comparison.SIZE_CORPUS_TOKENIZERS: nano reads bpe:512


def _main(tmp_path: Path, **kw) -> CompareOptions:
    return CompareOptions(out=tmp_path / "out", **kw)


def test_main_job_trains_nano_to_8_tokens_per_parameter(tmp_path):
    opts = _main(tmp_path)
    cfg = base_config(opts, None, NANO_VOCAB)
    t = cfg.train
    assert DEFAULT_PRESET == "transformer-nano" and corpus_tokenizer(opts) == "bpe:512"
    assert t.tokens == DEFAULT_TOKENS and t.tokens % t.batch_tokens == 0
    assert t.tokens / total_params(cfg.model) == pytest.approx(8.0, abs=t.batch_tokens / 2e5)
    assert (t.lr, t.eval_tokens) == (MAIN_LR, MAIN_EVAL_TOKENS)
    assert t.eval_every == t.steps // MAIN_CURVE_POINTS
    allocs, _ = comparison.check_options(opts)
    grid = build_grid(cfg, allocs, [0], None)
    widths = grid.budget[allocs[1].name].widths
    assert all(w % MAIN_MULTIPLE_OF == 0 for w in widths) and widths[0] > widths[-1]


def test_main_job_trains_as_the_measured_point(tmp_path):
    """Every training setting but the curve's cadence is the measured --paper tokens point's
    (its lr is uniform's tuned lr there), so its runs are that measurement's runs."""
    raw = json.loads(MEASURED.read_text())["config"]
    assert raw["train"]["lr"] == MAIN_LR
    # read as compare reads a kept cell's config (by meaning: a field added since has its default)
    kept = to_dict(run_config_from_dict(raw))
    cfg = to_dict(base_config(_main(tmp_path), None, NANO_VOCAB))
    for section in ("model", "train"):
        differ = {
            k
            for k in set(cfg[section]) | set(kept[section])
            if cfg[section].get(k) != kept[section].get(k)
        }
        # the cell's own taper is set per cell; the curve: a finer cadence on more tokens
        assert differ <= {"taper", "eval_every", "eval_tokens", "log_group", "loggers"}, differ
    assert kept["model"]["taper"]["multiple_of"] == MAIN_MULTIPLE_OF


def test_named_models_and_paper_modes_keep_the_general_recipe(tmp_path):
    nano = base_config(_main(tmp_path, preset="transformer-nano"), None, NANO_VOCAB).train
    assert (nano.tokens, nano.lr, nano.eval_tokens) == (
        RECIPE_TOKENS,
        COMPARE_TRAIN.lr,
        COMPARE_TRAIN.eval_tokens,
    )
    sweep = _main(tmp_path, paper="sweep")
    cfg = base_config(sweep, None, 2048)
    assert cfg.train.tokens == RECIPE_TOKENS and cfg.train.lr == COMPARE_TRAIN.lr
    assert PAPER_MODE_PRESET == "transformer-micro" and cfg.model.d_model == 96
    assert corpus_tokenizer(sweep) == "bpe:2048"
    # --set still wins in the main job
    opts = _main(tmp_path, overrides=["train.lr=1e-3", "train.eval_every=7"])
    t = base_config(opts, None, NANO_VOCAB).train
    assert (t.lr, t.eval_every) == (1e-3, 7)


@pytest.mark.parametrize("extra", [[], ["train.lr=1e-3"]])
def test_the_reported_command_reproduces_the_main_job(tmp_path, extra):
    opts = _main(tmp_path, overrides=extra)
    allocs, _ = comparison.check_options(opts)
    cfg = base_config(opts, None, NANO_VOCAB)
    grid = build_grid(cfg, allocs, list(range(opts.seeds)), None)
    command = canonical_command(opts, grid)
    assert "--preset transformer-nano" in command and "--multiple-of 8" in command
    again = options_from(build_parser(only="compare").parse_args(shlex.split(command)[1:]))
    assert again.preset == "transformer-nano"  # named now: the general recipe, unless said
    cfg2 = base_config(again, None, NANO_VOCAB)
    assert to_dict(cfg2) == to_dict(cfg)
    grid2 = build_grid(cfg2, comparison.allocations(again), list(range(again.seeds)), None)
    assert [grid2.budget[a.name].widths for a in grid2.allocations] == [
        grid.budget[a.name].widths for a in grid.allocations
    ]
    assert canonical_command(again, grid2) == command

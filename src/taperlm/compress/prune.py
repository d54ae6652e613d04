"""Width pruning of a trained model to a target size and per-layer shape.

The shape: the target's baseline MLP width W is the whole multiple of `multiple_of` whose
uniform model is nearest the asked size (attention, norms and embeddings are kept, so only the
MLP parameters move); the taper's exact solver (`ModelConfig.resolve`) then gives the per-layer
widths, which sum to n_layers x W: the pruned model has exactly the parameters of the uniform
model of width W whatever its shape. The units kept in each layer are the top-scored ones by a
measured importance (`taperlm.compress.importance`); their rows of the fused gate/up matrix and
columns of the down projection are copied exactly, everything else unchanged.

The result is written as a normal run dir (config.yaml with the resolved widths, a verified
step-0 checkpoint written by the trainer's own saver, the data record) so eval, export,
generate, novelty and train read it like any run: `taperlm train --out RUN` continues it, and
`taperlm train --init-from RUN --distill-from SOURCE` heals it into a new run.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from taperlm.compress import ParamsOf
from taperlm.compress.importance import UnitStats, collect, mlps, top_units, unit_scores
from taperlm.config import ModelConfig, RunConfig
from taperlm.config.budget import embedding_params, head_params, total_params
from taperlm.data.loader import TokenBatches, open_split
from taperlm.errors import ConfigError, DataError, TaperError
from taperlm.families import get_family
from taperlm.models import TaperedLM
from taperlm.models.layers import SwiGLU
from taperlm.spec.domains import choices
from taperlm.spec.taper import TaperSpec
from taperlm.training.loop import Trainer

# What `--params` is a fraction or a count of.
PARAMS_OF = choices(ParamsOf)


def check_prunable(cfg: ModelConfig, model: torch.nn.Module) -> None:
    """Only families whose every block has a SwiGLU MLP of `mlp_widths[l]` units and no other
    per-layer size derived from it (transformer, gated) can be width-pruned here."""
    fam = get_family(cfg.family)
    if fam.resolved or not all(isinstance(m, SwiGLU) for m in mlps(model)):
        raise ConfigError(
            f"taperlm prune prunes SwiGLU MLP widths of transformer and gated models; a "
            f"{cfg.family} model's other per-layer sizes ({', '.join(fam.resolved) or 'its MLPs'})"
            " follow its widths and are not pruned"
        )


def counted_params(cfg: ModelConfig, of: str) -> int:
    """Parameters of `cfg` as `--params` counts them: all, or all but the embedding and head."""
    if of not in PARAMS_OF:
        raise ConfigError(f"--params-of {of!r} is unknown; choose {' or '.join(PARAMS_OF)}")
    n = total_params(cfg)
    return n if of == "total" else n - embedding_params(cfg) - head_params(cfg)


def _uniform(cfg: ModelConfig, width: int) -> ModelConfig:
    spec = TaperSpec(schedule="uniform", multiple_of=cfg.taper.multiple_of)
    return dataclasses.replace(cfg, mlp_width=width, taper=spec, mlp_widths=None).resolve()


def target_width(source: ModelConfig, params: float, of: str = "total") -> int:
    """The baseline MLP width W of the pruned model: the multiple of multiple_of whose uniform
    model has the counted parameters nearest the target (`params` < 1: that fraction of the
    source's counted parameters; else a count). ConfigError when no width reaches it."""
    m = source.taper.multiple_of
    have = counted_params(source, of)
    target = params * have if params < 1 else params
    if not 0 < target < have:
        raise ConfigError(
            f"--params {params:g} asks for {target:,.0f} {of} parameters; a pruned model must "
            f"have fewer than the source's {have:,} and more than 0"
        )
    one, two = counted_params(_uniform(source, m), of), counted_params(_uniform(source, 2 * m), of)
    slope = two - one  # parameters per step of m in the baseline width (linear in it)
    steps = round((target - (one - slope)) / slope)
    if steps < 1:
        raise ConfigError(
            f"--params {params:g} ({target:,.0f} {of} parameters) is below the smallest model "
            f"this one prunes to ({one:,}: attention, norms{' and embeddings' if of == 'total' else ''}"
            f" are kept, and every layer keeps at least {m} MLP units); ask for more, or count "
            "--params-of non-embedding"
        )
    return steps * m


def pruned_config(source: ModelConfig, width: int, spec: TaperSpec) -> ModelConfig:
    """The source's config at baseline MLP width `width`, with the taper `spec`'s widths solved
    at that budget (attention, heads and everything else unchanged). ConfigError when a layer
    would need more units than the source has."""
    spec = dataclasses.replace(spec, multiple_of=source.taper.multiple_of)
    try:
        cfg = dataclasses.replace(source, mlp_width=width, taper=spec, mlp_widths=None).resolve()
    except TaperError as err:
        raise ConfigError(f"--taper {spec.to_string()} at baseline width {width}: {err}") from None
    have = source.mlp_widths or []
    over = [(i, w, h) for i, (w, h) in enumerate(zip(cfg.mlp_widths or [], have)) if w > h]
    if over:
        i, w, h = over[0]
        raise ConfigError(
            f"--taper {spec.to_string()} at this size gives layer {i} {w} MLP units, but the "
            f"source has {h} there (pruning only removes units); use a gentler taper or a "
            "smaller --params"
        )
    return cfg


def pruned_state(
    state: dict[str, torch.Tensor], keep: list[torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The source's weights with layer l's MLP reduced to the units `keep[l]`: those rows of
    both halves (gate, up) of w_in and those columns of w_out; every other tensor as it is."""
    out = dict(state)
    for layer, idx in enumerate(keep):
        w_in = state[f"blocks.{layer}.mlp.w_in.weight"]
        gate, up = w_in.chunk(2, dim=0)
        out[f"blocks.{layer}.mlp.w_in.weight"] = torch.cat((gate[idx], up[idx])).contiguous()
        w_out = state[f"blocks.{layer}.mlp.w_out.weight"]
        out[f"blocks.{layer}.mlp.w_out.weight"] = w_out[:, idx].contiguous()
    return out


DEFAULT_CALIBRATION_TOKENS = 65536


def _check_budget(data_dir: Path, seq_len: int, tokens: int, windows: int) -> None:
    """DataError when `tokens` asks for more windows than the train split holds: the batches
    cycle, so the same windows would be counted again (1e9 tokens of a 180k-token split would
    run for hours and measure nothing new)."""
    if max(1, tokens // seq_len) > windows:
        held = windows * seq_len
        raise DataError(
            f"--calibration-tokens {tokens:,} asks for more than the train split of {data_dir} "
            f"holds ({windows:,} windows of {seq_len} tokens = {held:,} tokens); give "
            f"--calibration-tokens {held} or fewer, or prepare more data"
        )


def calibration_budget(data_dir: Path, seq_len: int, tokens: int | None) -> int:
    """The calibration tokens to measure on: `tokens` as given (DataError past the train
    split), or with None the default capped at the split."""
    _, stream = open_split(data_dir, "train", verify=False)
    windows = (len(stream) - 1) // seq_len
    if tokens is None:
        return max(1, min(DEFAULT_CALIBRATION_TOKENS, windows * seq_len))
    _check_budget(data_dir, seq_len, tokens, windows)
    return tokens


def calibration_windows(
    data_dir: Path, seq_len: int, tokens: int, batch_size: int = 8, seed: int = 0
) -> Iterator[torch.Tensor]:
    """Windows [B, seq_len] of the train split (shuffled by `seed`) holding `tokens` tokens."""
    batches = TokenBatches(data_dir, "train", seq_len, batch_size, seed=seed)
    _check_budget(data_dir, seq_len, tokens, batches.n_windows)
    left = max(1, tokens // seq_len)
    while left > 0:
        x, _ = next(batches)
        yield x[:left]
        left -= x.shape[0]


@dataclass
class Pruned:
    """A pruned model, how it was chosen, and what the importance pass measured."""

    model: TaperedLM
    config: ModelConfig
    keep: list[torch.Tensor]
    scores: list[torch.Tensor]


def prune(
    source: torch.nn.Module,
    target: ModelConfig,
    stats: list[UnitStats],
    score: str,
) -> Pruned:
    """`source` (a TaperedLM) pruned to `target`'s widths, keeping each layer's top units by
    `score` over the calibration `stats`."""
    widths = target.mlp_widths or []
    layers = mlps(source)
    scores = [unit_scores(s, m, score) for s, m in zip(stats, layers)]
    keep = [top_units(sc, w) for sc, w in zip(scores, widths)]
    state = {k: v.detach().cpu() for k, v in source.state_dict().items()}
    model = TaperedLM(copy.deepcopy(target))
    model.load_state_dict(pruned_state(state, keep))
    return Pruned(model.eval(), target, keep, scores)


def measure(
    source: torch.nn.Module, data_dir: Path, seq_len: int, tokens: int, seed: int = 0
) -> list[UnitStats]:
    """The importance pass: activation sums of `source` over `tokens` calibration tokens."""
    return collect(source, calibration_windows(data_dir, seq_len, tokens, seed=seed))


def write_run(run: RunConfig, out: Path, model: torch.nn.Module) -> None:
    """Write `model` as run dir `out` of config `run`: the trainer creates and locks it, writes
    config.yaml and the data record, and checkpoints step 0 with these weights (a fresh
    optimizer), exactly as a run it started itself."""
    trainer = Trainer(run, out, resume="never")
    try:
        with torch.no_grad():
            trainer.model.load_state_dict(model.state_dict())
        trainer.save(use_async=False)
    finally:
        trainer.close()


def prune_record(
    source: str, step: int | None, pruned: Pruned, how: dict[str, Any]
) -> dict[str, Any]:
    """prune.json: the source, the shape, and the units kept in every layer."""
    cfg = pruned.config
    return {
        "source": source,
        "source_step": step,
        **how,
        "taper": cfg.taper.to_string(),
        "mlp_width": cfg.mlp_width,
        "mlp_widths": cfg.mlp_widths,
        "total_params": total_params(cfg),
        "kept_units": [k.tolist() for k in pruned.keep],
    }

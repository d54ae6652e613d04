"""novelty:pilot allocations: a short uniform pilot run per seed, whose measured novelty sets
the widths of that seed's pilot allocations."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from taperlm.compare.executor import train_cells
from taperlm.compare.grid import Grid, PilotRun, Pilots, pilot_cells
from taperlm.compare.options import CompareOptions
from taperlm.compare.recipe import base_config
from taperlm.compare.runner import EvalSettings
from taperlm.config import RunConfig
from taperlm.errors import ConfigError
from taperlm.spec.taper import rho_mlp_of

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
        rho = rho_mlp_of(r.novelty)
        if rho is None or len(rho) != base.model.n_layers:
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

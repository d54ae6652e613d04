"""Named model presets `{family}-{size}` and their training defaults (pure Python; no torch).

Shapes follow the model family the paper builds on (its training recipe; fla/flame and Atlas Table 7):
SwiGLU width = 256 * ceil((8d/3) / 256), Llama-2 32K vocabulary, 4K context, untied embeddings.
Sizes name the total parameter count *with* embeddings (input embedding + untied head), as the
paper's 440M/760M/1.3B naming does:

| size  | layers | d_model | heads (d_h) | mlp_width | transformer total |
|-------|--------|---------|-------------|-----------|-------------------|
| 440m  | 24     | 1152    | 16 (72)     | 3072      | 455.9M            |
| 760m  | 24     | 1536    | 16 (96)     | 4096      | 777.9M            |
| 1.3b  | 24     | 2048    | 16 (128)    | 5632      | 1364.3M           |

440m: the family's 24-layer depth (divisible by 3 for the paper's three-group experiment) with
d_model raised from 1024 (374M) to 1152, the nearest width with a whole head dim that reaches
~440M. Gated Attention adds its gate (d x d per layer) on top of the same shape rather than
shrinking the MLP, as in Qiu et al.; the options of each family's presets (Hope levels, Titans
memory) are defined by the family (`Family.presets` in `taperlm.families`).

The small sizes train on 2 CPU cores in minutes: `*-nano` (4 layers, d_model 64, 2 heads of 32,
SwiGLU width 176 = 8d/3 rounded up to 16, a 512-token vocabulary: 0.27M parameters, sized so that
a run of 68 tokens per parameter, the paper's 440M regime, takes ~17 minutes on one core
(measured: docs/compare.md, "--paper tokens"); its comparisons read the built-in corpus at
bpe:512, `taperlm.compare.comparison`), `*-micro` (6 layers, d_model 96, 3 heads of 32,
SwiGLU width 256; `transformer-micro` is the default of `taperlm compare`, about 1.5x cheaper per
token than tiny), `*-tiny` (6 layers, d_model 128, 4 heads) and `*-small` (12 layers, d_model 192,
about 2.3x slower than tiny); all with an 8K BPE vocabulary (a run follows its data's tokenizer)
and 256 context.
"""

from __future__ import annotations

from pathlib import Path

from taperlm.config import ModelConfig, load_yaml, to_dict
from taperlm.errors import ConfigError
from taperlm.families import FAMILIES, Family
from taperlm.families.base import PresetOptions
from taperlm.spec.taper import TaperSpec

PAPER_SHAPES: dict[str, dict] = {
    "440m": dict(n_layers=24, d_model=1152, n_heads=16, mlp_width=3072),
    "760m": dict(n_layers=24, d_model=1536, n_heads=16, mlp_width=4096),
    "1.3b": dict(n_layers=24, d_model=2048, n_heads=16, mlp_width=5632),
}
PAPER_COMMON = dict(vocab_size=32000, context_length=4096, tie_embeddings=False)

SMALL_SHAPES: dict[str, dict] = {
    "nano": dict(
        n_layers=4, d_model=64, n_heads=2, mlp_width=176, vocab_size=512, context_length=256
    ),
    "micro": dict(
        n_layers=6, d_model=96, n_heads=3, mlp_width=256, vocab_size=8192, context_length=256
    ),
    "tiny": dict(
        n_layers=6, d_model=128, n_heads=4, mlp_width=352, vocab_size=8192, context_length=256
    ),
    "small": dict(
        n_layers=12, d_model=192, n_heads=4, mlp_width=512, vocab_size=8192, context_length=256
    ),
}


def preset_families() -> dict[str, tuple[Family, PresetOptions]]:
    """Preset name prefix (`transformer`, `titans-mac`, ...) -> its family and options."""
    return {
        prefix: (fam, options)
        for fam in FAMILIES.values()
        for prefix, options in fam.presets.items()
    }


def _all_sizes() -> list[str]:
    return [*SMALL_SHAPES, *PAPER_SHAPES]


def preset_names() -> list[str]:
    return [f"{prefix}-{size}" for prefix in preset_families() for size in _all_sizes()]


def get_preset(name: str, taper: TaperSpec | None = None, resolve: bool = True) -> ModelConfig:
    """A fresh ModelConfig for preset `name`, optionally with a taper, resolved by default."""
    prefixes = preset_families()
    prefix, _, size = name.rpartition("-")
    if prefix not in prefixes or size not in _all_sizes():
        raise ConfigError(
            f"unknown preset {name!r}; run `taperlm plan --list-presets` to see them "
            f"(families: {', '.join(prefixes)}; sizes: {', '.join(_all_sizes())})"
        )
    shape: dict = {}
    if size in PAPER_SHAPES:
        shape.update(PAPER_COMMON, **PAPER_SHAPES[size])
    else:
        shape.update(SMALL_SHAPES[size])
    fam, options = prefixes[prefix]
    cfg = ModelConfig(family=fam.name, options=options(size, shape), **shape)
    if taper is not None:
        cfg.taper = taper
    return cfg.resolve() if resolve else cfg


def config_data(config: str | Path | None, preset: str | None) -> tuple[dict, str]:
    """The run-config dict (model:, data:, train:) of a YAML file (a bare model mapping is
    accepted), else of a preset's unresolved model; and its name for error messages."""
    if config:
        data = load_yaml(config)
        if "model" not in data and "family" in data:
            data = {"model": data}
        return data, str(config)
    if preset:
        return {"model": to_dict(get_preset(preset, resolve=False))}, f"preset {preset}"
    raise ConfigError("give a model with --preset NAME or --config FILE")

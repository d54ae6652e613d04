"""Presets of the Hope-attention and Titans families (registered with taperlm.presets).

Names: `hope-{size}`, `titans-{mac,mag,mal}-{size}` for size in tiny, small, 440m, 760m, 1.3b.
Shapes (layers, d_model, heads, mlp_width, vocabulary, context) are the shared ones of
`taperlm.presets`; the family options below are our choices (docs/architectures.md lists them with
the parameter totals):

- Hope: 3 CMS levels with 1/2, 1/4, 1/4 of the layer's width, update periods 1, 4, 16 steps.
- Titans: memory heads x head dim = d_model (the attention's heads and head dim), memory depth 2,
  expansion 2; chunk 16 (tiny/small) or 64 (paper sizes, GPU throughput); sliding window 64 / 128
  / 1024 (MAG, MAL); MAC segments 64 / 128 / 512; persistent tokens 4 (tiny/small) or 16.
"""

from __future__ import annotations

from taperlm.presets import PAPER_SHAPES, SMALL_SHAPES, register_family

_TITANS_SIZES: dict[str, dict] = {
    "tiny": dict(chunk_size=16, window=64, segment_len=64, persistent_tokens=4),
    "small": dict(chunk_size=16, window=128, segment_len=128, persistent_tokens=4),
    "440m": dict(chunk_size=64, window=1024, segment_len=512, persistent_tokens=16),
    "760m": dict(chunk_size=64, window=1024, segment_len=512, persistent_tokens=16),
    "1.3b": dict(chunk_size=64, window=1024, segment_len=512, persistent_tokens=16),
}


def _shape(size: str) -> dict:
    return {**SMALL_SHAPES, **PAPER_SHAPES}[size]


def hope_extras(size: str) -> dict:
    return {
        "family": "hope",
        "hope": {"levels": 3, "level_fractions": [0.5, 0.25, 0.25], "update_periods": [1, 4, 16]},
    }


def titans_extras(variant: str):
    def extras(size: str) -> dict:
        shape = _shape(size)
        heads = shape["n_heads"]
        head_dim = shape["d_model"] // heads
        return {
            "family": "titans",
            "titans": {
                "variant": variant,
                "memory_heads": heads,
                "memory_head_dim": head_dim,
                "memory_depth": 2,
                "memory_expansion": 2,
                "conv_kernel": 4,
                "max_inner_lr": 0.1,
                **_TITANS_SIZES[size],
            },
        }

    return extras


register_family("hope", hope_extras)
for _variant in ("mac", "mag", "mal"):
    register_family(f"titans-{_variant}", titans_extras(_variant))

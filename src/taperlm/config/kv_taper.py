"""Per-layer key/value heads (`model.kv_taper`): the nearest valid KV head counts, the MLP width
that takes up the parameters they save, and the KV cache they hold (pure Python; no torch, no
taperlm.config).

The rule (docs/tapers.md, "tapering the KV cache"): layer l has H_l query heads (the head
taper's, or n_heads) and by default H_l / g KV heads (g = the model's group size). A KV taper
multiplies that default by r_l (the same spec language as the MLP taper; custom integers are
counts), and the solver picks for each layer the divisor of H_l nearest to r_l H_l / g, so
every layer groups its query heads evenly over its own KV heads. Its K and V projections then
hold 2 d d_h fewer parameters per KV head removed; the MLP widths take them up (3 d per unit
of SwiGLU width), so the model keeps its uniform baseline's parameters exactly. That needs the
total of KV heads removed to be a multiple of `kv_step` (2 d d_h K = 3 d m W for whole steps
of multiple_of m); among all choices of divisors meeting it, the solver takes the one nearest
to the asked counts (least total distance; ties keep more KV heads) and says where it moved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from taperlm.errors import TaperError
from taperlm.families.base import swiglu_params
from taperlm.spec.model_fields import ModelFields
from taperlm.spec.taper import TaperSpec, multipliers

# Bytes per cached key/value entry by dtype (what `taperlm plan` reports).
CACHE_DTYPE_BYTES = {"bf16": 2, "fp32": 4}


def divisors(n: int) -> list[int]:
    """The divisors of n >= 1, ascending."""
    return [k for k in range(1, n + 1) if n % k == 0]


def kv_params_per_head(d_model: int, head_dim: int) -> int:
    """Parameters of one KV head: its rows of the K and V projections (d x d_h each)."""
    return 2 * d_model * head_dim


def kv_step(d_model: int, head_dim: int, multiple_of: int) -> int:
    """The total of KV heads removed must be a multiple of this for the parameters it saves to
    be a whole number of MLP width steps (multiple_of units of 3 d parameters each)."""
    width_step = swiglu_params(d_model, 1) * multiple_of
    per_head = kv_params_per_head(d_model, head_dim)
    return width_step // math.gcd(per_head, width_step)


@dataclass
class KVHeads:
    """A KV taper resolved: the counts, what was asked, and notes where they differ."""

    counts: list[int]
    asked: list[float]
    notes: list[str]


def kv_targets(spec: TaperSpec, query_heads: list[int], group_size: int) -> list[float]:
    """The KV heads each layer asks for: r_l x its default H_l / g, or custom counts."""
    n = len(query_heads)
    if spec.measured:
        raise TaperError(
            "novelty allocations act on MLP widths (rho_mlp measures the MLP); give the KV "
            "heads a schedule such as cosine:1.0:0.5 or groups:0.5"
        )
    counts = spec.given_sizes()
    if counts is not None:
        if len(counts) != n:
            raise TaperError(
                f"{spec.schedule} KV heads have {len(counts)} values but the model has {n} "
                "layers; give exactly one per layer"
            )
        return [float(v) for v in counts]
    r = multipliers(spec, n)
    return [x * q / group_size for x, q in zip(r, query_heads)]


def solve_kv_heads(spec: TaperSpec, query_heads: list[int], group_size: int, step: int) -> KVHeads:
    """The KV heads per layer nearest to the spec's that divide each layer's query heads and
    remove a multiple of `step` heads in total (see the module docstring)."""
    asked = kv_targets(spec, query_heads, group_size)
    defaults = [q // group_size for q in query_heads]
    # Dynamic programme over layers: removed-heads residue mod step -> (distance, counts).
    best: dict[int, tuple[float, list[int]]] = {0: (0.0, [])}
    for q, want, default in zip(query_heads, asked, defaults):
        nxt: dict[int, tuple[float, list[int]]] = {}
        for residue, (dist, counts) in best.items():
            for c in divisors(q):
                key = (residue + default - c) % step
                cand = (round(dist + abs(c - want), 9), [*counts, c])
                old = nxt.get(key)
                if old is None or (cand[0], [-x for x in cand[1]]) < (old[0], [-x for x in old[1]]):
                    nxt[key] = cand
        best = nxt
    counts = best[0][1]
    notes = []
    nearest = [
        min(divisors(q), key=lambda c, w=w: (abs(c - w), -c)) for q, w in zip(query_heads, asked)
    ]
    for layer, (q, want, c, near) in enumerate(zip(query_heads, asked, counts, nearest)):
        if abs(c - want) > 1e-9:
            why = (
                f"the nearest divisor of its {q} query heads"
                if c == near
                else (
                    f"not the nearest divisor {near}: the heads removed in total must be a multiple "
                    f"of {step} for the MLP widths to take up their parameters exactly"
                )
            )
            notes.append(f"layer {layer}: {want:g} KV heads asked, {c} used ({why})")
    return KVHeads(counts, asked, notes)


def kv_heads_removed(cfg: ModelFields) -> int:
    """KV heads the KV taper removes in total from the default H_l / g per layer (negative when
    it adds heads)."""
    if cfg.layer_kv_heads is None:
        return 0
    g = cfg.n_heads // cfg.kv_heads
    q = cfg.layer_heads or [cfg.n_heads] * cfg.n_layers
    return sum(h // g for h in q) - sum(cfg.layer_kv_heads)


def mlp_width_credit(cfg: ModelFields) -> int:
    """Total MLP width that takes up the parameters the KV taper saves (its K/V projections'
    parameters over 3 d per unit of width); 0 without a KV taper. An integer whenever the
    heads removed are a multiple of `kv_step` (ModelConfig.validate checks it)."""
    saved = kv_heads_removed(cfg) * kv_params_per_head(cfg.d_model, cfg.head_dim)
    return saved // swiglu_params(cfg.d_model, 1)


def kv_cache_bytes_per_token(cfg: ModelFields, layer: int, dtype_bytes: int) -> int:
    """Bytes that one cached token holds in layer l's attention: its keys and values."""
    _, kv = cfg.attention_heads(layer)
    return 2 * kv * cfg.head_dim * dtype_bytes

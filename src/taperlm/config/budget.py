"""Parameter and FLOP accounting per layer and in total (pure Python; no torch).

Parameters are counted exactly (the built model's `numel` equals `total_params`). Training FLOPs
per token follow the usual convention (Kaplan et al.; PaLM appendix B):

    flops_per_token = 6 * N_matmul + 3 * sum_l A_l(seq_len)

N_matmul counts every weight that takes part in a matrix multiply per token: all block
projections and the output head (also when it is tied to the embedding, since the head matmul is
still computed); the embedding lookup and the norm gains are not matmuls. 6 = 2 FLOPs per
multiply-add x (1 forward + 2 backward). A_l is the forward FLOPs per token of layer l's mixer
beyond its weights (attention: 2*2*H*d_h*T for QK^T and AV over a context of T tokens, no causal
halving; memory families add their inner-loop work), tripled for the backward pass.

Because MLP parameters are linear in the width, a taper with the same total width has the same
N_matmul and the same FLOPs per token as its uniform baseline. The same holds for a head taper
(`model.head_taper`): a layer's attention projections (d x (H_l + 2 H_l/g) x d_h and
H_l d_h x d) and its score/value work A_l(T) = 4 H_l d_h T are both linear in its query heads
H_l at *every* context T, so equal total heads give equal parameters and equal FLOPs per token
at every T (and an equal KV cache in total, though not per layer). `check_matched` asserts it.

A KV taper (`model.kv_taper`) moves the K/V projection parameters it saves (2 d d_h per KV head)
into the MLP widths (3 d per unit), so total parameters and N_matmul stay exactly equal; the
score/value work A_l(T) depends on the query heads only (grouped-query attention computes every
query head against its group's keys), so training FLOPs/token are equal at every context too,
for every family whose K/V projections run once per token. Titans MAC projects its memory
tokens' keys and values a second time (counted in its mixer FLOPs), so its FLOPs/token change by
that repeated projection; `plan` then reports the difference instead of asserting equality.
The KV cache (`kv_cache_entries`) is what a KV taper changes on purpose.

The formulas read a `taperlm.config.ModelConfig` through `taperlm.spec.model_fields.ModelSpec`, so the
config (which offers the model's weight floor, `ModelConfig.memory_floor`) may import this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from taperlm.config.kv_taper import CACHE_DTYPE_BYTES
from taperlm.errors import TaperError, TaperlmError
from taperlm.families import family
from taperlm.spec.model_fields import ModelSpec
from taperlm.spec.taper import describe


@dataclass
class LayerBudget:
    layer: int
    mlp_width: int
    heads: int  # query heads (with the KV heads below: the layer's attention)
    kv_heads: int
    multiplier: float
    params: int
    mixer_params: int
    mlp_params: int
    matmul_params: int
    flops_per_token: int
    components: dict[str, int]


def embedding_params(cfg: ModelSpec) -> int:
    return cfg.vocab_size * cfg.d_model


def head_params(cfg: ModelSpec) -> int:
    """Output head parameters that are not shared with the embedding."""
    return 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model


def layer_budget(cfg: ModelSpec, layer: int, seq_len: int | None = None) -> LayerBudget:
    assert cfg.mlp_widths is not None, "resolve the config first (ModelConfig.resolve())"
    fam = family(cfg)
    mixer = fam.mixer_params(cfg, layer)
    mlp = fam.mlp_params(cfg, layer)
    components = {f"mixer.{k}": v for k, v in mixer.items()} | {
        f"mlp.{k}": v for k, v in mlp.items()
    }
    params = sum(components.values())
    # Norm gains, conv kernels and other per-channel vectors are not matmul weights.
    non_matmul = sum(v for k, v in components.items() if _is_vector(k))
    matmul = params - non_matmul
    T = seq_len or cfg.context_length
    flops = 6 * matmul + 3 * fam.mixer_flops(cfg, layer, T)
    heads, kv_heads = cfg.attention_heads(layer)
    return LayerBudget(
        layer=layer,
        mlp_width=cfg.mlp_widths[layer],
        heads=heads,
        kv_heads=kv_heads,
        multiplier=cfg.mlp_widths[layer] / cfg.mlp_width,
        params=params,
        mixer_params=sum(mixer.values()),
        mlp_params=sum(mlp.values()),
        matmul_params=matmul,
        flops_per_token=flops,
        components=components,
    )


def _is_vector(component: str) -> bool:
    name = component.split(".", 1)[1]
    return name.startswith(("norms", "conv", "bias", "vector"))


def layer_budgets(cfg: ModelSpec, seq_len: int | None = None) -> list[LayerBudget]:
    return [layer_budget(cfg, i, seq_len) for i in range(cfg.n_layers)]


def total_params(cfg: ModelSpec) -> int:
    """Every parameter of the model, embeddings included (final norm included)."""
    body = sum(b.params for b in layer_budgets(cfg))
    return embedding_params(cfg) + head_params(cfg) + body + cfg.d_model


FP32 = 4
TRAIN_BYTES_PER_PARAM = 16  # fp32 weight + gradient + AdamW's two moments
ROPE_PREBUILT = 1 << 16  # RoPE positions a model builds at first (`models.layers.Rotary`)


def memory_floor(cfg: ModelSpec, training: bool = False, shards: int = 1) -> tuple[int, str]:
    """(bytes, what they are) a model built from `cfg` needs at least on one device: its fp32
    weights and RoPE tables, and with `training` its gradients and AdamW state, each divided
    over `shards` (FSDP). A floor (activations and workspace come on top), so a device with
    less memory cannot hold the model at all; computed from the config, nothing allocated."""
    params = total_params(cfg)
    per_param = TRAIN_BYTES_PER_PARAM if training else FP32
    rope = 2 * min(cfg.context_length, ROPE_PREBUILT) * cfg.head_dim * FP32  # models.Rotary
    need = params * per_param // shards + rope
    what = (
        f"{params / 1e9:,.2f}B parameters x {per_param} bytes"
        + (" (weight, gradient, AdamW moments)" if training else " (fp32 weights)")
        + (f" / {shards} shards" if shards > 1 else "")
        + f" + {rope / 2**20:,.0f} MiB RoPE tables"
    )
    return need, what


def matmul_params(cfg: ModelSpec) -> int:
    return sum(b.matmul_params for b in layer_budgets(cfg)) + cfg.vocab_size * cfg.d_model


def flops_per_token(cfg: ModelSpec, seq_len: int | None = None) -> int:
    """Training FLOPs per token (forward + backward), see the module docstring."""
    layers = layer_budgets(cfg, seq_len)
    head = 6 * cfg.vocab_size * cfg.d_model
    return sum(b.flops_per_token for b in layers) + head


@dataclass
class Plan:
    """A config's budget beside its uniform baseline (what `taperlm plan` prints)."""

    config: ModelSpec
    baseline: ModelSpec
    layers: list[LayerBudget]
    baseline_layers: list[LayerBudget]
    total_params: int
    baseline_total_params: int
    flops_per_token: int
    baseline_flops_per_token: int
    seq_len: int
    checked_contexts: list[int]  # context lengths at which FLOPs/token were checked equal
    # context -> (FLOPs/token, baseline's): checked equal unless the KV heads are tapered
    flops_at_contexts: dict[int, tuple[int, int]]
    # per layer: (values per cached token, cached tokens at seq_len), as kv_cache_entries
    kv_entries: list[tuple[int, int]]
    baseline_kv_entries: list[tuple[int, int]]


class BudgetMismatch(TaperlmError):
    """A tapered model does not have its uniform baseline's parameters or FLOPs (a bug in a
    size formula or a non-linear component, never expected for a valid config)."""


def check_matched(cfg: ModelSpec, base: ModelSpec, contexts: list[int], flops: bool = True) -> None:
    """BudgetMismatch unless `cfg` and its baseline have equal total parameters and (unless
    `flops` is False) equal training FLOPs per token at every context in `contexts`."""
    problems = []
    if total_params(cfg) != total_params(base):
        problems.append(f"parameters {total_params(cfg):,} vs {total_params(base):,}")
    for T in contexts if flops else []:
        a, b = flops_per_token(cfg, T), flops_per_token(base, T)
        if a != b:
            problems.append(f"FLOPs/token at context {T}: {a:,} vs {b:,}")
    if problems:
        raise BudgetMismatch(
            "the tapered model does not match its uniform baseline: " + "; ".join(problems)
        )


def kv_cache_entries(cfg: ModelSpec, layer: int, tokens: int) -> tuple[int, int]:
    """(values per cached token, cached tokens) of layer l's decoding cache after `tokens`
    tokens: 2 x KV heads x head dim (keys and values), and the tokens its family keeps. Their
    product times the bytes per value is the layer's KV cache."""
    _, kv = cfg.attention_heads(layer)
    return 2 * kv * cfg.head_dim, family(cfg).cached_kv(cfg, layer, tokens)


def kv_cache_bytes(cfg: ModelSpec, tokens: int, dtype_bytes: int) -> list[int]:
    """Bytes of every layer's decoding KV cache after `tokens` tokens (batch 1)."""
    out = []
    for layer in range(cfg.n_layers):
        per_token, cached = kv_cache_entries(cfg, layer, tokens)
        out.append(per_token * cached * dtype_bytes)
    return out


def plan(cfg: ModelSpec, seq_len: int | None = None) -> Plan:
    """The budget of `cfg` beside its uniform baseline, checked equal (parameters, and FLOPs
    per token at context 1, `seq_len` and the model's context; BudgetMismatch otherwise). With
    a KV taper the FLOPs are reported at those contexts, not asserted (module docstring)."""
    cfg.resolve()
    base = cfg.baseline()
    T = seq_len or cfg.context_length
    contexts = sorted({1, T, cfg.context_length})
    kv_tapered = cfg.layer_kv_heads is not None
    check_matched(cfg, base, contexts, flops=not kv_tapered)
    return Plan(
        config=cfg,
        baseline=base,
        layers=layer_budgets(cfg, T),
        baseline_layers=layer_budgets(base, T),
        total_params=total_params(cfg),
        baseline_total_params=total_params(base),
        flops_per_token=flops_per_token(cfg, T),
        baseline_flops_per_token=flops_per_token(base, T),
        seq_len=T,
        checked_contexts=contexts,
        flops_at_contexts={
            c: (flops_per_token(cfg, c), flops_per_token(base, c)) for c in contexts
        },
        kv_entries=[kv_cache_entries(cfg, i, T) for i in range(cfg.n_layers)],
        baseline_kv_entries=[kv_cache_entries(base, i, T) for i in range(cfg.n_layers)],
    )


# The plan as JSON and as the table `taperlm plan` prints (and the model card embeds).


def plan_to_dict(p) -> dict:
    cfg = p.config
    total_flops = sum(b.flops_per_token for b in p.layers)
    return {
        "family": cfg.family,
        "taper": cfg.taper.to_dict(),
        "taper_spec": cfg.taper.to_string(),
        "n_layers": cfg.n_layers,
        "d_model": cfg.d_model,
        "baseline_mlp_width": cfg.mlp_width,
        "mlp_widths": list(cfg.mlp_widths or []),
        "head_taper": cfg.head_taper.as_text(),
        "baseline_heads": cfg.n_heads,
        "baseline_kv_heads": cfg.kv_heads,
        "heads": [b.heads for b in p.layers],
        "kv_heads": [b.kv_heads for b in p.layers],
        "kv_taper": cfg.kv_taper.as_text(),
        "seq_len": p.seq_len,
        "budget_checked_at_contexts": p.checked_contexts,
        "flops_per_token_at_contexts": {
            str(c): {"tapered": a, "uniform": b} for c, (a, b) in p.flops_at_contexts.items()
        },
        "kv_cache": _kv_cache_dict(p),
        "layers": [
            {
                "layer": b.layer,
                "mlp_width": b.mlp_width,
                "multiplier": b.multiplier,
                "heads": b.heads,
                "kv_heads": b.kv_heads,
                "params": b.params,
                "mixer_params": b.mixer_params,
                "mlp_params": b.mlp_params,
                "baseline_params": bb.params,
                "flops_per_token": b.flops_per_token,
                "flops_share": b.flops_per_token / total_flops,
                "components": b.components,
            }
            for b, bb in zip(p.layers, p.baseline_layers)
        ],
        "total_params": p.total_params,
        "baseline_total_params": p.baseline_total_params,
        "params_difference": p.total_params - p.baseline_total_params,
        "flops_per_token": p.flops_per_token,
        "baseline_flops_per_token": p.baseline_flops_per_token,
        "flops_difference": p.flops_per_token - p.baseline_flops_per_token,
    }


def _kv_cache_dict(p) -> dict:
    """Per-layer and total KV-cache bytes per token and at the plan's context, bf16 and fp32."""
    out: dict = {"context": p.seq_len}
    for name, entries in (("tapered", p.kv_entries), ("uniform", p.baseline_kv_entries)):
        out[name] = {
            dtype: {
                "bytes_per_token": [e * n for e, _ in entries],
                "bytes_per_token_total": sum(e for e, _ in entries) * n,
                "bytes_at_context": [e * t * n for e, t in entries],
                "bytes_at_context_total": sum(e * t for e, t in entries) * n,
            }
            for dtype, n in CACHE_DTYPE_BYTES.items()
        }
    return out


def _kv_lines(p) -> list[str]:
    """The KV-cache summary of `format_plan`: bytes per token and at the context, both dtypes."""
    kv = _kv_cache_dict(p)
    lines = []
    for dtype in CACHE_DTYPE_BYTES:
        a, b = kv["tapered"][dtype], kv["uniform"][dtype]
        for label, key in (
            ("per token", "bytes_per_token_total"),
            (f"@{p.seq_len}", "bytes_at_context_total"),
        ):
            lines.append(
                f"{'KV cache ' + dtype + ' ' + label + ' (B)':<28}{a[key]:>16,}{b[key]:>16,}"
                f"{a[key] - b[key]:>+14,}"
            )
    return lines


def format_plan(p) -> str:
    cfg = p.config

    total_flops = sum(b.flops_per_token for b in p.layers)
    lines = [
        f"{cfg.family} model: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads, "
        f"vocab {cfg.vocab_size}, context {cfg.context_length}",
        f"taper: {describe(cfg.taper)} (multiple_of {cfg.taper.multiple_of}); "
        f"baseline mlp_width {cfg.mlp_width}",
        f"head taper: {describe(cfg.head_taper_spec())} (in steps of one KV group of "
        f"{cfg.group_size} query head{'s' if cfg.group_size > 1 else ''}, head dim "
        f"{cfg.head_dim}); baseline {_heads(cfg.n_heads, cfg.kv_heads)} heads per layer",
        f"KV taper: {describe(cfg.kv_taper_spec())}"
        + (
            " (each layer's KV heads divide its query heads; the MLP widths take up the "
            "K/V parameters saved)"
            if cfg.layer_kv_heads is not None
            else ""
        ),
        *(f"  {note}" for note in (cfg.solve_kv_heads().notes if _kv_from_spec(cfg) else [])),
        "",
        f"{'layer':>5} {'width':>7} {'x base':>7} {'heads':>7} {'params':>12} {'baseline':>12} "
        f"{'diff':>10} {'FLOPs share':>11} {'KV B/tok bf16':>13}",
    ]
    column = family(cfg).plan_column(cfg)
    extra_name, extra = column if column else ("", [])
    if extra_name:
        lines[-1] += f"  {extra_name}"
    for b, bb in zip(p.layers, p.baseline_layers):
        lines.append(
            f"{b.layer:>5} {b.mlp_width:>7} {b.multiplier:>7.3f} {_heads(b.heads, b.kv_heads):>7} "
            f"{b.params:>12,} {bb.params:>12,} "
            f"{b.params - bb.params:>+10,} {100 * b.flops_per_token / total_flops:>10.2f}%"
            f" {p.kv_entries[b.layer][0] * 2:>13,}" + (f"  {extra[b.layer]}" if extra_name else "")
        )
    mean = sum(cfg.mlp_widths or []) / cfg.n_layers
    lines += [
        "",
        f"mean width {mean:g} (baseline {cfg.mlp_width})",
        f"{'':<28}{'tapered':>16}{'uniform':>16}{'difference':>14}",
        f"{'total parameters':<28}{p.total_params:>16,}{p.baseline_total_params:>16,}"
        f"{p.total_params - p.baseline_total_params:>+14,}",
        f"{'training FLOPs/token @' + str(p.seq_len):<28}{p.flops_per_token:>16,}"
        f"{p.baseline_flops_per_token:>16,}{p.flops_per_token - p.baseline_flops_per_token:>+14,}",
        *_kv_lines(p),
        "",
    ]
    if cfg.layer_kv_heads is None:
        lines.append(
            "budget matched (checked): total parameters, and training FLOPs/token at context "
            + ", ".join(map(str, p.checked_contexts))
            + " (MLP parameters are linear in the width; attention parameters and score work in "
            "each layer's heads, at every context)"
        )
        return "\n".join(lines)
    diffs = {c: a - b for c, (a, b) in p.flops_at_contexts.items()}
    flops = (
        "equal at context "
        + ", ".join(map(str, diffs))
        + " (score/value work depends on the query heads only)"
        if not any(diffs.values())
        else "differ by "
        + ", ".join(f"{d:+,} at context {c}" for c, d in diffs.items())
        + " (this family repeats K/V projections beyond one per token)"
    )
    lines.append(
        "parameters matched (checked): the K/V parameters the KV taper saves went to the MLP "
        f"widths; training FLOPs/token {flops}; the KV cache is what changes"
    )
    return "\n".join(lines)


def _kv_from_spec(cfg) -> bool:
    """Whether the config's KV heads are the KV taper's solution (then its notes apply)."""
    if cfg.layer_kv_heads is None or cfg.kv_taper_spec().is_uniform:
        return False
    try:
        return cfg.solve_kv_heads().counts == cfg.layer_kv_heads
    except TaperError:  # a spec that no longer fits (the counts were written by hand)
        return False


def _heads(heads: int, kv_heads: int) -> str:
    """`4` for multi-head attention, `8/2` (query/KV) for grouped-query attention."""
    return str(heads) if heads == kv_heads else f"{heads}/{kv_heads}"

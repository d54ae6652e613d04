"""Building blocks shared by every family: RMSNorm, RoPE, SwiGLU, (gated) causal attention and
the pre-norm residual `Block`.

Conventions: no biases (except attention's optional ones, `model.attention_bias`, for imported
checkpoints); row-major `nn.Linear`; attention through
`F.scaled_dot_product_attention`, which picks flash / memory-efficient kernels on GPU. In fp32
on CPU in eager mode, RMSNorm and the training loss run on the hand-written kernels of
`taperlm.models.cpu_kernels` (fewer passes over memory; the same function, tested).
"""

from __future__ import annotations

import hashlib
import math
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from taperlm.errors import ConfigError
from taperlm.models import cpu_kernels
from taperlm.models.loss import chunked_cross_entropy
from taperlm.spec.model_fields import ModelFields


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain, computed in fp32 for stability under autocast."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if cpu_kernels.applies(x) and self.weight.dtype == torch.float32:
            return cpu_kernels.rms_norm(x, self.weight, self.eps)
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).type_as(x)


class Rotary(nn.Module):
    """Rotary position embedding (rotate-half form) with cached cos/sin tables.

    `cos`/`sin` are [positions, head_dim] with the half-width frequency table already repeated
    (cat done once here, not on every call); buffers are `inv_freq`, `cos`, `sin`.
    """

    # Positions built at construction: the context length, up to this many; further ones as a
    # forward reaches them. A model claiming a 16M-token context (imported, or a config) would
    # otherwise hold gigabytes of tables to generate two tokens.
    PREBUILT = 1 << 16

    def __init__(
        self, head_dim: int, max_len: int, theta: float = 10000.0, scaling: Any = None
    ) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        if scaling is not None:
            inv_freq = scaled_frequencies(inv_freq, scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.theta = theta
        self._build(min(max_len, self.PREBUILT))
        if max_len > self.PREBUILT and inv_freq.device.type != "meta":
            # the last position's angles, computed as _build computes them (fp32 products):
            # finite here means finite tables up to max_len, without building them
            last = torch.tensor([float(max_len - 1)]) * inv_freq.cpu()
            if not bool(torch.isfinite(last).all()):
                self._refuse(max_len)

    def _build(self, length: int) -> None:
        t = torch.arange(length, dtype=torch.float32, device=self.inv_freq.device)
        freqs = torch.outer(t, self.inv_freq)
        freqs = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)
        # Every loss would be NaN, and the divergence stop would blame the learning rate. Checked
        # eagerly (the build in __init__ covers the context length); a table grown inside a
        # compiled forward is not checked: the check reads a tensor, a graph break per call.
        checkable = freqs.device.type != "meta" and not torch.compiler.is_compiling()
        if checkable and not bool(torch.isfinite(self.cos).all()):
            self._refuse(length)

    def _refuse(self, length: int) -> None:
        raise ConfigError(
            f"model.rope_theta = {self.theta!r} gives non-finite RoPE tables (head dim "
            f"{2 * self.inv_freq.numel()}, {length} positions in fp32); use a base such as "
            "10000 (Llama 2) or 500000 (Llama 3)"
        )

    @classmethod
    def of_model(cls, cfg: ModelFields, max_len: int | None = None) -> Rotary:
        """The RoPE of model `cfg` (its head dim, theta and scaling), tables for `max_len`
        positions (default: its context)."""
        length = cfg.context_length if max_len is None else max_len
        return cls(cfg.head_dim, length, cfg.rope_theta, getattr(cfg, "rope_scaling", None))

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """x: [B, H, T, D] -> rotated x, positions start..start+T-1."""
        T = x.shape[-2]
        if start + T > self.cos.shape[0]:
            self._build(max(start + T, 2 * self.cos.shape[0]))
        cos = self.cos[start : start + T].to(x.dtype)
        sin = self.sin[start : start + T].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def scaled_frequencies(inv_freq: torch.Tensor, scaling: Any) -> torch.Tensor:
    """RoPE frequencies rescaled by `scaling` (a `RopeScaling`), the formulas of transformers'
    rope types of the same names: `linear` divides each by the factor; `llama3` divides those
    whose wavelength 2 pi / f exceeds original_context / low_freq_factor, keeps those below
    original_context / high_freq_factor, and in between blends f / factor and f with the weight
    s = (original_context / wavelength - low) / (high - low) on the unscaled one."""
    if scaling.type == "linear":
        return inv_freq / scaling.factor
    if scaling.type != "llama3":
        raise ConfigError(f"model.rope_scaling.type {scaling.type!r} is not linear or llama3")
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    context = scaling.original_context
    wavelength = 2 * math.pi / inv_freq
    long_waves = wavelength > context / low
    short_waves = wavelength < context / high
    scaled = torch.where(long_waves, inv_freq / factor, inv_freq)
    smooth = (context / wavelength - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    return torch.where(~long_waves & ~short_waves, blended, scaled)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (fp32) over targets != -100; logits [..., V], targets [...].

    Uses the fused CPU kernel when training in fp32 on CPU in eager mode, else the chunked loss
    of models/loss.py (no fp32 copy of the whole logits: bf16 logits on GPU)."""

    flat = logits.reshape(-1, logits.shape[-1])
    tgt = targets.reshape(-1)
    if cpu_kernels.applies(flat) and torch.is_grad_enabled() and flat.requires_grad:
        n_valid = int((tgt != -100).sum())
        if n_valid > 0:
            return cpu_kernels.cross_entropy(flat, tgt, n_valid)
    if flat.dtype == torch.float32 and flat.device.type == "cpu":
        return F.cross_entropy(flat, tgt, ignore_index=-100)  # eval on CPU: no copy to avoid
    return chunked_cross_entropy(flat, tgt)


class SwiGLU(nn.Module):
    """SwiGLU MLP of one layer's own width: down(silu(gate(x)) * up(x)).

    The gate and up projections are one fused [2*width, d] matrix (one matmul instead of two);
    its first half is the gate. Width 0 (a layer the taper gives no MLP, docs/tapers.md) keeps
    the same two parameters with zero rows / columns, so every layer has the same keys in a
    checkpoint: the update it returns is exactly 0, through the same code path.
    """

    def __init__(self, d_model: int, width: int) -> None:
        super().__init__()
        self.width = width
        with warnings.catch_warnings():
            if width == 0:  # torch warns that initializing a zero-element tensor does nothing
                warnings.filterwarnings("ignore", "Initializing zero-element tensors")
            self.w_in = nn.Linear(d_model, 2 * width, bias=False)
            self.w_out = nn.Linear(width, d_model, bias=False)
        self.w_out.residual_out = True  # type: ignore[attr-defined]  # depth-scaled init

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w_in(x).chunk(2, dim=-1)
        return self.w_out(F.silu(gate) * up)


class KVCache:
    """Keys and values of past positions of one attention layer (incremental decoding).

    The interface attention layers use, `get_seq_length()` and `update(k, v) -> (all keys, all
    values)`, is the one of a transformers cache layer, so the exported model can also decode
    with a transformers `DynamicCache`."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def get_seq_length(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k is None:
            self.k, self.v = k, v
        else:
            self.k = torch.cat((self.k, k), dim=-2)
            self.v = torch.cat((self.v, v), dim=-2)
        return self.k, self.v  # type: ignore[return-value]

    def select(self, index: torch.Tensor) -> None:
        """Keep/reorder the batch rows `index` (beam search, batch selection)."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)  # type: ignore[union-attr]


class Attention(nn.Module):
    """Causal multi-head (or grouped-query) attention with RoPE and an optional G1 output gate.

    `n_heads` query heads and `n_kv_heads` KV heads of `head_dim` each (default d_model /
    n_heads); with a head taper a layer's heads times head_dim differ from d_model, so Q and the
    output projection are d x (n_heads * head_dim). `Attention.of_layer` builds layer l's.

    gate = None: Transformer++ attention.
    gate = "elementwise" | "headwise": Gated Attention (Qiu et al. 2025, position G1): the SDPA
    output of each head is multiplied by sigmoid(u W_g), with u the same normalized input that
    produces Q/K/V; W_g is d x (H*d_h) (elementwise) or d x H (headwise). W_g is fused into the
    QKV projection as extra output rows (the same function as a separate linear, one matmul).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int,
        rotary: Rotary,
        gate: str | None = None,
        head_dim: int | None = None,
        bias: str = "none",
        qk_norm_eps: float | None = None,
    ) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = head_dim or d_model // n_heads
        self.gate = gate
        hd = self.head_dim
        self.gate_dim = {None: 0, "elementwise": n_heads * hd, "headwise": n_heads}[gate]
        qkv_rows = (n_heads + 2 * n_kv_heads) * hd + self.gate_dim
        self.qkv = nn.Linear(d_model, qkv_rows, bias=bias in ("qkv", "qkvo"))
        self.out = nn.Linear(n_heads * hd, d_model, bias=bias == "qkvo")
        self.out.residual_out = True  # type: ignore[attr-defined]
        self.rotary = rotary
        # Qwen3's per-head RMSNorm of queries and keys (one gain of head_dim each), before RoPE
        self.qk_norm = qk_norm_eps is not None
        if self.qk_norm:
            self.q_norm = RMSNorm(hd, qk_norm_eps)  # type: ignore[arg-type]
            self.k_norm = RMSNorm(hd, qk_norm_eps)  # type: ignore[arg-type]

    @classmethod
    def of_layer(
        cls, cfg: ModelFields, layer: int, rotary: Rotary, gate: str | None = None
    ) -> Attention:
        """Layer l's attention: its own query/KV heads (`cfg.attention_heads`), the model's
        head dim."""
        heads, kv_heads = cfg.attention_heads(layer)
        return cls(
            cfg.d_model,
            heads,
            kv_heads,
            rotary,
            gate=gate,
            head_dim=cfg.head_dim,
            bias=getattr(cfg, "attention_bias", "none"),
            qk_norm_eps=cfg.norm_eps if getattr(cfg, "qk_norm", False) else None,
        )

    def new_cache(self) -> KVCache:
        return KVCache()

    def forward(self, x: torch.Tensor, cache: KVCache | Any = None) -> torch.Tensor:
        """`cache`: a KVCache, or any object with its two methods (a transformers cache layer)."""
        B, T, _ = x.shape
        H, Hkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
        proj = self.qkv(x)
        q, k, v, g = proj.split([H * hd, Hkv * hd, Hkv * hd, self.gate_dim], dim=-1)
        q = q.view(B, T, H, hd).transpose(1, 2)
        k = k.view(B, T, Hkv, hd).transpose(1, 2)
        v = v.view(B, T, Hkv, hd).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        start = cache.get_seq_length() if cache is not None else 0
        q, k = self.rotary(q, start), self.rotary(k, start)
        if cache is not None:
            k, v = cache.update(k, v)
        if start == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hkv != H)
        else:
            # New queries sit at positions start..start+T-1 and see every cached key up to them.
            mask = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(start)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=Hkv != H)
        y = y.transpose(1, 2)  # B, T, H, hd
        if self.gate is not None:
            g = g.view(B, T, H, -1)  # [.., hd] elementwise, [.., 1] headwise
            y = y * torch.sigmoid(g)
        return self.out(y.reshape(B, T, H * hd))


class Block(nn.Module):
    """Pre-norm residual block: h = x + mixer(norm(x)); out = h + mlp(norm(h)). Every family is
    a stack of these; `mlp` returns exactly the update added to the residual stream."""

    checkpoint_activations = False  # recompute in backward (set_activation_checkpointing)

    def __init__(self, mixer: nn.Module, mlp: nn.Module, d_model: int, eps: float) -> None:
        super().__init__()
        self.mixer_norm = RMSNorm(d_model, eps)
        self.mixer = mixer
        self.mlp_norm = RMSNorm(d_model, eps)
        self.mlp = mlp

    def forward(self, x: torch.Tensor, cache: Any = None) -> torch.Tensor:
        if self.checkpoint_activations and cache is None and torch.is_grad_enabled():
            return checkpoint(self._forward, x, None, use_reentrant=False)
        return self._forward(x, cache)

    def _forward(self, x: torch.Tensor, cache: Any) -> torch.Tensor:
        normed = self.mixer_norm(x)
        h = x + (self.mixer(normed) if cache is None else self.mixer(normed, cache=cache))
        return h + self.mlp(self.mlp_norm(h))


def set_activation_checkpointing(model: nn.Module, enabled: bool) -> None:
    """Per-block activation checkpointing: keep only each block's input for the backward pass
    and recompute the block there. Inside the block's forward, so parameter names, FSDP's hooks
    and per-block compilation are unchanged."""
    for m in model.modules():
        if isinstance(m, Block):
            m.checkpoint_activations = enabled


INIT_SCHEMES = ("fixed", "fan_in")


def matrix_std(
    std: float, n_layers: int, residual: bool, fan_in: int, scheme: str = "fixed", d_model: int = 0
) -> float:
    """The init std of one matrix (model.init): `fixed` = std (residual output projections
    std / sqrt(2 * n_layers)); `fan_in` = that times sqrt(d_model / fan_in), so a matrix reading
    a narrower (wider) input starts larger (smaller) and its output variance does not depend on
    its input width. Matrices reading the residual stream (fan_in = d_model) agree in both."""
    s = std / math.sqrt(2 * n_layers) if residual else std
    if scheme == "fan_in":
        s *= math.sqrt(d_model / fan_in)
    elif scheme != "fixed":
        raise ValueError(f"model.init {scheme!r} is unknown; choose {' or '.join(INIT_SCHEMES)}")
    return s


def init_weights(
    module: nn.Module,
    std: float,
    n_layers: int,
    normal_=nn.init.normal_,
    scheme: str = "fixed",
    d_model: int = 0,
) -> None:
    """Normal(0, std) for matrices and embeddings; residual output projections get
    std / sqrt(2 * n_layers) so the residual stream's variance does not grow with depth;
    `scheme` (model.init) scales each matrix by its fan-in (`matrix_std`).
    `normal_(tensor, mean, std)` draws the values (a sharded model passes its own, which draws
    the full tensor and keeps its shard)."""
    for m in module.modules():
        if isinstance(m, nn.Linear) and m.weight.numel() == 0:
            continue  # a zero-width MLP's matrices: nothing to draw (and no fan-in to scale by)
        if isinstance(m, nn.Linear):
            residual = getattr(m, "residual_out", False)
            s = matrix_std(std, n_layers, residual, m.in_features, scheme, d_model)
            normal_(m.weight, 0.0, s)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            normal_(m.weight, 0.0, std)


# Units (SwiGLU hidden units) per keyed draw of `paired_init`: widths are multiples of 16.
PAIRED_UNITS = 16


def keyed_seed(seed: int, key: str) -> int:
    """A seed derived from (seed, key): streams of different keys are independent."""

    digest = hashlib.blake2b(f"{seed}/{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def _stream(seed: int, key: str) -> torch.Generator:
    """A CPU generator keyed by (seed, key), independent of everything drawn before."""
    return torch.Generator().manual_seed(keyed_seed(seed, key))


def _unit_blocks(seed: int, key: str, units: int, d: int, std: float) -> torch.Tensor:
    """[units, d] Normal(0, std) rows, drawn in keyed blocks of PAIRED_UNITS rows, so the first
    rows agree for every `units`."""
    blocks = []
    for b in range(0, units, PAIRED_UNITS):
        n = min(PAIRED_UNITS, units - b)
        blocks.append(torch.randn(n, d, generator=_stream(seed, f"{key}/{b}")) * std)
    return torch.cat(blocks)


@torch.no_grad()
def paired_init(
    module: nn.Module,
    seed: int,
    std: float,
    n_layers: int,
    write=None,
    scheme: str = "fixed",
    d_model: int = 0,
) -> None:
    """`init_weights`' distribution (the same matrices with the same std) drawn from streams
    keyed by (seed, module name) instead of one sequential stream: models that differ only in
    their per-layer widths start from the same weights wherever their shapes agree. Every
    same-shaped matrix (embeddings, attention, head) is identical, and a SwiGLU of width w holds
    the first w hidden units (gate and up rows, down-projection columns) of any wider one: the
    common random numbers of a paired comparison. `write(tensor, full)` stores a draw (a sharded
    model passes its own); the default copies."""
    write = write or (lambda t, full: t.copy_(full))
    done: set[int] = set()
    for name, m in module.named_modules():
        if isinstance(m, SwiGLU) and m.width == 0:  # zero rows: nothing drawn
            done |= {id(m.w_in.weight), id(m.w_out.weight)}
        elif isinstance(m, SwiGLU):
            d = m.w_in.weight.shape[1]
            s_in = matrix_std(std, n_layers, False, d, scheme, d_model)
            gate = _unit_blocks(seed, f"{name}.gate", m.width, d, s_in)
            up = _unit_blocks(seed, f"{name}.up", m.width, d, s_in)
            write(m.w_in.weight, torch.cat([gate, up]).to(m.w_in.weight.dtype))
            s_out = matrix_std(std, n_layers, True, m.width, scheme, d_model)
            down = _unit_blocks(seed, f"{name}.down", m.width, d, s_out).t().contiguous()
            write(m.w_out.weight, down.to(m.w_out.weight.dtype))
            done |= {id(m.w_in.weight), id(m.w_out.weight)}
    for name, m in module.named_modules():
        if isinstance(m, (nn.Linear, nn.Embedding)) and id(m.weight) not in done:
            if isinstance(m, nn.Linear):
                res = getattr(m, "residual_out", False)
                s = matrix_std(std, n_layers, res, m.in_features, scheme, d_model)
            else:
                s = std
            full = torch.randn(tuple(m.weight.shape), generator=_stream(seed, name)) * s
            write(m.weight, full.to(m.weight.dtype))
            done.add(id(m.weight))

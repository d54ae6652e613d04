"""Building blocks shared by every family: RMSNorm, RoPE, SwiGLU, (gated) causal attention.

Conventions: no biases; row-major `nn.Linear`; attention through
`F.scaled_dot_product_attention`, which picks flash / memory-efficient kernels on GPU.

Speed notes (measured in benchmarks/README.md): on CPU in eager mode, RMSNorm and the training
cross-entropy use hand-written autograd functions (`rms_norm_fp32`, `cross_entropy`) that make
fewer passes over memory than the composite ATen ops; on GPU and under `torch.compile` the plain
ops are used, since fused kernels / Inductor already do better there. Both paths compute the
same function (tests compare them).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _eager_cpu(x: torch.Tensor) -> bool:
    """Whether the hand-written CPU kernels apply: fp32 on CPU, outside torch.compile tracing."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and not torch.compiler.is_compiling()


class _RMSNormFn(torch.autograd.Function):
    """y = x * rstd * w with rstd = 1/sqrt(mean(x^2) + eps), saving only x_hat and rstd.

    ATen's CPU rms_norm is composite (pow, mean, add, rsqrt, mul, mul), and autograd then keeps
    and replays every intermediate; the closed-form backward below needs two reductions."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # type: ignore[override]
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add_(eps))
        x_hat = x * rstd
        ctx.save_for_backward(x_hat, rstd, weight)
        return x_hat * weight

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x_hat, rstd, weight = ctx.saved_tensors
        grad_w = (
            (grad * x_hat).reshape(-1, x_hat.shape[-1]).sum(0) if ctx.needs_input_grad[1] else None
        )
        gw = grad * weight
        # d/dx of x_hat * w: rstd * (g*w - x_hat * mean(g*w * x_hat))
        dot = (gw * x_hat).mean(-1, keepdim=True)
        grad_x = gw.sub_(x_hat * dot).mul_(rstd)
        return grad_x, grad_w, None


def rms_norm_fp32(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of fp32 `x` (any leading shape) with gain `weight`, closed-form backward."""
    return _RMSNormFn.apply(x, weight, eps)


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain, computed in fp32 for stability under autocast."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _eager_cpu(x) and self.weight.dtype == torch.float32:
            return rms_norm_fp32(x, self.weight, self.eps)
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).type_as(x)


class Rotary(nn.Module):
    """Rotary position embedding (rotate-half form) with cached cos/sin tables.

    `cos`/`sin` are [positions, head_dim] with the half-width frequency table already repeated
    (cat done once here, not on every call); buffers are `inv_freq`, `cos`, `sin`.
    """

    def __init__(self, head_dim: int, max_len: int, theta: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._build(max_len)

    def _build(self, length: int) -> None:
        t = torch.arange(length, dtype=torch.float32, device=self.inv_freq.device)
        freqs = torch.outer(t, self.inv_freq)
        freqs = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """x: [B, H, T, D] -> rotated x, positions start..start+T-1."""
        T = x.shape[-2]
        if start + T > self.cos.shape[0]:
            self._build(max(start + T, 2 * self.cos.shape[0]))
        cos = self.cos[start : start + T].to(x.dtype)
        sin = self.sin[start : start + T].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class _CrossEntropyFn(torch.autograd.Function):
    """Mean cross-entropy over rows whose target is not -100, with the gradient computed in the
    forward pass, block by block of rows while they are in cache.

    ATen's path (log_softmax -> nll_loss -> their backwards) writes three fresh [N, V] tensors
    (log-probabilities, a zero-filled gradient, the logits' gradient) and reads them back; here
    one [N, V] gradient is written and returned as is by the backward pass.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, n_valid: int) -> torch.Tensor:  # type: ignore[override]
        N, V = logits.shape
        valid = targets != -100
        tgt = torch.where(valid, targets, 0).unsqueeze(1)
        inv_n = 1.0 / n_valid
        grad = torch.empty_like(logits)
        picked = torch.empty(N, 1, dtype=logits.dtype)
        minus = torch.full((N, 1), -inv_n, dtype=logits.dtype)
        rows = max(1, (1 << 18) // V)  # ~1 MiB of fp32 per block: stays in L2
        for s in range(0, N, rows):
            g, t = grad[s : s + rows], tgt[s : s + rows]
            torch.ops.aten._log_softmax.out(logits[s : s + rows], -1, False, out=g)
            torch.gather(g, 1, t, out=picked[s : s + rows])
            g.exp_().mul_(inv_n).scatter_add_(1, t, minus[s : s + rows])  # (softmax - onehot) / n
        if n_valid < N:
            grad.index_fill_(0, (~valid).nonzero().squeeze(1), 0.0)
        ctx.save_for_backward(grad)
        ctx.scale = 1.0
        return -(picked.squeeze(1) * valid).sum() * inv_n

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        (grad,) = ctx.saved_tensors
        s = float(grad_out)
        if s == 0.0:
            return torch.zeros_like(grad), None, None
        if s != ctx.scale:
            # Scale in place (no second [N, V] tensor) and remember the factor applied, so a
            # retained graph's next backward rescales correctly. `.data` keeps autograd's
            # version check, which would reject the change to a saved tensor, out of this.
            grad.data.mul_(s / ctx.scale)
            ctx.scale = s
        return grad, None, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (fp32) over targets != -100; logits [..., V], targets [...].

    Uses the fused CPU kernel above when training in fp32 on CPU in eager mode, else
    `F.cross_entropy` on fp32 logits."""
    flat = logits.reshape(-1, logits.shape[-1])
    tgt = targets.reshape(-1)
    if _eager_cpu(flat) and torch.is_grad_enabled() and flat.requires_grad:
        n_valid = int((tgt != -100).sum())
        if n_valid > 0:
            return _CrossEntropyFn.apply(flat, tgt, n_valid)
    return F.cross_entropy(flat.float(), tgt, ignore_index=-100)


class SwiGLU(nn.Module):
    """SwiGLU MLP of one layer's own width: down(silu(gate(x)) * up(x)).

    The gate and up projections are one fused [2*width, d] matrix (one matmul instead of two);
    its first half is the gate.
    """

    def __init__(self, d_model: int, width: int) -> None:
        super().__init__()
        self.width = width
        self.w_in = nn.Linear(d_model, 2 * width, bias=False)
        self.w_out = nn.Linear(width, d_model, bias=False)
        self.w_out.residual_out = True  # type: ignore[attr-defined]  # depth-scaled init

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w_in(x).chunk(2, dim=-1)
        return self.w_out(F.silu(gate) * up)


class KVCache:
    """Keys and values of past positions of one attention layer (incremental decoding)."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k is None:
            self.k, self.v = k, v
        else:
            self.k = torch.cat((self.k, k), dim=-2)
            self.v = torch.cat((self.v, v), dim=-2)
        return self.k, self.v  # type: ignore[return-value]


class Attention(nn.Module):
    """Causal multi-head (or grouped-query) attention with RoPE and an optional G1 output gate.

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
    ) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.gate = gate
        hd = self.head_dim
        self.gate_dim = {None: 0, "elementwise": n_heads * hd, "headwise": n_heads}[gate]
        self.qkv = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * hd + self.gate_dim, bias=False)
        self.out = nn.Linear(n_heads * hd, d_model, bias=False)
        self.out.residual_out = True  # type: ignore[attr-defined]
        self.rotary = rotary

    def new_cache(self) -> KVCache:
        return KVCache()

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        H, Hkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
        proj = self.qkv(x)
        q, k, v, g = proj.split([H * hd, Hkv * hd, Hkv * hd, self.gate_dim], dim=-1)
        q = q.view(B, T, H, hd).transpose(1, 2)
        k = k.view(B, T, Hkv, hd).transpose(1, 2)
        v = v.view(B, T, Hkv, hd).transpose(1, 2)
        start = cache.length if cache is not None else 0
        q, k = self.rotary(q, start), self.rotary(k, start)
        if cache is not None:
            k, v = cache.append(k, v)
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


def init_weights(module: nn.Module, std: float, n_layers: int) -> None:
    """Normal(0, std) for matrices and embeddings; residual output projections get
    std / sqrt(2 * n_layers) so the residual stream's variance does not grow with depth."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            s = std / math.sqrt(2 * n_layers) if getattr(m, "residual_out", False) else std
            nn.init.normal_(m.weight, mean=0.0, std=s)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=std)

"""Titans neural long-term memory (LMM) as a sequence layer: projections, gates, state, output.

For every head the memory M is an MLP d_m -> h -> ... -> h -> d_m (depth L >= 2, SiLU inside)
whose weights are the recurrent state. Writing token t is one step of gradient descent on
l_t(M) = ||M(k_t) - v_t||^2 with momentum (Titans eqs 10-14):

    S_t = eta_t S_{t-1} - theta_t grad l_t(M_{t'})        M_t = (1 - alpha_t) M_{t-1} + S_t

theta_t = max_inner_lr * sigmoid(.), alpha_t = sigmoid(.), eta_t = sigmoid(.) per token and head;
each token's gradient is clipped to norm `max_grad_norm`. The chunk-wise form (every gradient of a
chunk at the chunk-start weights M_{t'}), its closed-form gradients and the fused recurrence are in
`taperlm.models.memory_recurrence`. Retrieval: tokens of chunk n read M at the end of chunk n-1
(M_0 for the first chunk), causal at token granularity. The memory math runs in fp32 with autocast
disabled.

Incremental decoding (`MemoryStream`): a token reads the state at the start of its chunk, and its
key, value and gates wait in a buffer until the chunk is complete and written — exactly what the
full-sequence forward computes for every prefix.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from taperlm.models.memory_recurrence import memory_forward, run_memory

# Initial gate pre-activations: theta = max_lr * sigmoid(0) = max_lr / 2, alpha = sigmoid(-4) ~
# 0.018 (slow forgetting), eta = sigmoid(0) = 0.5 (momentum amplifies steps at most 2x).
THETA_BIAS, ALPHA_BIAS, ETA_BIAS = 0.0, -4.0, 0.0


def causal_conv(
    x: torch.Tensor, weight: torch.Tensor, prev: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal convolution over time. x: [B, T, C]; weight: [C, K]; prev: the last K-1
    inputs before x ([B, K-1, C], zeros when None). Returns (y [B, T, C], new prev)."""
    B, _, Ch = x.shape
    K = weight.shape[-1]
    if prev is None:
        prev = x.new_zeros(B, K - 1, Ch)
    full = torch.cat((prev.to(x.dtype), x), 1)
    y = F.conv1d(full.transpose(1, 2), weight.to(x.dtype).unsqueeze(1), groups=Ch).transpose(1, 2)
    return y, full[:, full.shape[1] - (K - 1) :]


class MemoryState:
    """Per-sequence memory weights and momentum (fp32), flattened over (batch, head)."""

    def __init__(self, weights: list[torch.Tensor], momentum: list[torch.Tensor]) -> None:
        self.weights = weights
        self.momentum = momentum

    def select(self, index: torch.Tensor, heads: int) -> MemoryState:
        """The state of batch rows `index` (rows are (batch, head) pairs, heads fastest)."""
        rows = (index.view(-1, 1) * heads + torch.arange(heads, device=index.device)).view(-1)
        return MemoryState(
            [w.index_select(0, rows) for w in self.weights],
            [s.index_select(0, rows) for s in self.momentum],
        )


class MemoryStream:
    """Decoding cache of one memory stream: the conv tail, the state at the start of the chunk
    being filled, and the keys, values and gates of that chunk's tokens (written once the chunk
    is complete)."""

    def __init__(self) -> None:
        self.tail: torch.Tensor | None = None
        self.state: MemoryState | None = None
        self.pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def select(self, index: torch.Tensor, heads: int) -> None:
        """Keep/reorder the batch rows `index`."""
        if self.tail is not None:
            self.tail = self.tail.index_select(0, index)
        if self.state is not None:
            self.state = self.state.select(index, heads)
        if self.pending is not None:
            self.pending = tuple(x.index_select(0, index) for x in self.pending)  # type: ignore[assignment]


class NeuralMemory(nn.Module):
    """Titans LMM with its projections, gates, output norm and gate (docs/paper.md#titans-memory-block).

    u -> q, k, v = SiLU(conv(u W)) (q, k l2-normalised per head); gates from u W_g + b;
    retrieved r -> per-head RMSNorm -> * SiLU(u W_og) -> W_out. Per-head tensors are
    [B, T, H, d_m] (fp32), gate pre-activations [B, T, 3, H] (theta, alpha, eta).
    """

    def __init__(
        self,
        d_model: int,
        heads: int,
        head_dim: int,
        hidden: int,
        depth: int,
        chunk_size: int,
        conv_kernel: int,
        max_inner_lr: float,
        eps: float = 1e-6,
        max_grad_norm: float | None = None,
    ) -> None:
        super().__init__()
        self.heads, self.head_dim, self.chunk = heads, head_dim, chunk_size
        self.max_inner_lr, self.eps, self.max_grad_norm = max_inner_lr, eps, max_grad_norm
        d_in = heads * head_dim
        self.d_in = d_in
        self.w_q = nn.Linear(d_model, d_in, bias=False)
        self.w_kv = nn.Linear(d_model, 2 * d_in, bias=False)
        bound = 1.0 / math.sqrt(conv_kernel)
        self.conv = nn.Parameter(torch.empty(3 * d_in, conv_kernel).uniform_(-bound, bound))
        self.w_gates = nn.Linear(d_model, 3 * heads, bias=False)
        self.gate_bias = nn.Parameter(
            torch.tensor([THETA_BIAS] * heads + [ALPHA_BIAS] * heads + [ETA_BIAS] * heads)
        )
        shapes = [(head_dim, hidden)] + [(hidden, hidden)] * (depth - 2) + [(hidden, head_dim)]
        # M_0 (learned): unit-variance entries, since layer 0 sees unit-norm keys and later
        # layers scale their input by 1/sqrt(fan_in) (see layer_scales).
        self.init_state = nn.ParameterList(
            nn.Parameter(torch.randn(heads, i, o)) for i, o in shapes
        )
        self.out_norm = nn.Parameter(torch.ones(d_in))
        self.w_out_gate = nn.Linear(d_model, d_in, bias=False)
        self.w_out = nn.Linear(d_in, d_model, bias=False)
        self.w_out.residual_out = True  # type: ignore[attr-defined]

    # -- projections ---------------------------------------------------------------------------
    def project(
        self, x: torch.Tensor, prev: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Everything the memory takes from stream x [B, T, d], with one matmul for the five
        projections: (q, k, v, gate pre-activations, output-gate pre-activation [B, T, d_in],
        conv tail). `prev`: the conv tail of the stream before x."""
        B, T, _ = x.shape
        d, H = self.d_in, self.heads
        w = torch.cat(
            (self.w_q.weight, self.w_kv.weight, self.w_gates.weight, self.w_out_gate.weight)
        )
        proj = F.linear(x, w)
        qkv, tail = causal_conv(proj[..., : 3 * d], self.conv, prev)
        qkv = F.silu(qkv.float()).view(B, T, 3, d)
        # q and k are l2-normalised over all d_in channels together (not per head).
        qk = F.normalize(qkv[:, :, :2], dim=-1, eps=1e-6).view(B, T, 2, H, self.head_dim)
        v = qkv[:, :, 2].view(B, T, H, self.head_dim)
        g = (proj[..., 3 * d : 3 * d + 3 * H].float() + self.gate_bias.float()).view(B, T, 3, H)
        return qk[:, :, 0], qk[:, :, 1], v, g, proj[..., 3 * d + 3 * H :], tail

    def project_queries(
        self, x: torch.Tensor, prev: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries [B, T, H, d_m] and output-gate pre-activations of stream x (MAC's memory
        tokens), with the conv tail of the query channels."""
        B, T, _ = x.shape
        d = self.d_in
        proj = F.linear(x, torch.cat((self.w_q.weight, self.w_out_gate.weight)))
        q, tail = causal_conv(proj[..., :d], self.conv[:d], prev)
        q = F.normalize(F.silu(q.float()), dim=-1, eps=1e-6).view(B, T, self.heads, self.head_dim)
        return q, proj[..., d:], tail

    # -- state ---------------------------------------------------------------------------------
    def initial_state(self, batch: int) -> MemoryState:
        w = [
            p.float().unsqueeze(0).expand(batch, *p.shape).reshape(batch * self.heads, *p.shape[1:])
            for p in self.init_state
        ]
        return MemoryState(w, [torch.zeros_like(x) for x in w])

    def read(self, state: MemoryState, q: torch.Tensor) -> torch.Tensor:
        """Retrieve with a fixed state (no write). q: [B, T, H, d_m] -> [B, T, H, d_m]."""
        B, T, H, dm = q.shape
        r = memory_forward(state.weights, q.transpose(1, 2).reshape(B * H, T, dm))
        return r.view(B, H, T, dm).transpose(1, 2)

    def write_read(
        self,
        state: MemoryState,
        q: torch.Tensor | None,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
    ) -> tuple[torch.Tensor | None, MemoryState]:
        """Chunk-wise read (q; None: write only) and write (k, v, gates g) of a stream from
        `state`; returns (retrieved [B, T, H, d_m] or None, state after the stream)."""
        B, T, H, _ = k.shape
        theta = self.max_inner_lr * torch.sigmoid(g[:, :, 0])
        log_keep = F.logsigmoid(-g[:, :, 1])
        log_eta = F.logsigmoid(g[:, :, 2])
        gates = (x.transpose(1, 2).reshape(B * H, T) for x in (theta, log_keep, log_eta))
        r, w, s = run_memory(
            state.weights,
            state.momentum,
            q,
            k,
            v,
            *gates,
            self.chunk,
            max_grad_norm=self.max_grad_norm,
            heads_last=True,
        )
        return r, MemoryState(w, s)

    def continue_stream(
        self,
        cache: MemoryStream,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
    ) -> torch.Tensor:
        """Read and write tokens that continue a cached stream. Tokens of the chunk being filled
        read `cache.state`; each chunk completed here is written; the keys, values and gates of
        an incomplete last chunk wait in `cache.pending`. Equals the full-sequence forward."""
        B, Tn, H, dm = q.shape
        p = 0
        if cache.pending is not None:
            pk, pv, pg = cache.pending
            p = pk.shape[1]
            q = torch.cat((q.new_zeros(B, p, H, dm), q), 1)
            k, v, g = torch.cat((pk, k), 1), torch.cat((pv, v), 1), torch.cat((pg, g), 1)
        if cache.state is None:
            cache.state = self.initial_state(B)
        T = p + Tn
        done = T - T % self.chunk
        parts = []
        if done:
            r, cache.state = self.write_read(
                cache.state, q[:, :done], k[:, :done], v[:, :done], g[:, :done]
            )
            parts.append(r)
        if done < T:
            parts.append(self.read(cache.state, q[:, done:]))
        cache.pending = (k[:, done:], v[:, done:], g[:, done:]) if done < T else None
        return torch.cat(parts, 1)[:, p:]

    # -- output --------------------------------------------------------------------------------
    def output(self, r: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """Retrieved [B, T, H, d_m] -> per-head RMSNorm -> * SiLU(gate pre-activation
        [B, T, d_in]) -> W_out -> [B, T, d]."""
        B, T = r.shape[:2]
        r = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + self.eps)
        r = r * self.out_norm.float().view(self.heads, self.head_dim)
        r = r.reshape(B, T, self.d_in).to(gate.dtype)
        return self.w_out(r * F.silu(gate))

    def forward(self, u: torch.Tensor, cache: MemoryStream | None = None) -> torch.Tensor:
        """Memory as a sequence layer: read and write u (MAG, MAL); with a cache, u continues
        the cached stream."""
        q, k, v, g, og, tail = self.project(u, None if cache is None else cache.tail)
        with torch.autocast(device_type=u.device.type, enabled=False):
            if cache is None:
                r, _ = self.write_read(self.initial_state(u.shape[0]), q, k, v, g)
            else:
                cache.tail = tail
                r = self.continue_stream(cache, q, k, v, g)
        return self.output(r, og)

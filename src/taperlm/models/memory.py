"""Titans neural long-term memory (LMM): a per-head MLP whose weights are the recurrent state.

For every head the memory M is an MLP d_m -> h -> ... -> h -> d_m (depth L >= 2, SiLU inside).
Layer 0 reads l2-normalised keys/queries directly; layers >= 1 divide their input by sqrt(fan_in)
(a fixed multiplier, so the inner step size does not grow with the memory width h — the role
TTT/lucidrains give to a LayerNorm inside the memory). Writing token t means one step of gradient
descent on  l_t(M) = ||M(k_t) - v_t||^2  with momentum (Titans eqs 10-14):

    S_t = eta_t S_{t-1} - theta_t grad l_t(M_{t'})        M_t = (1 - alpha_t) M_{t-1} + S_t

theta_t = max_inner_lr * sigmoid(.), alpha_t = sigmoid(.), eta_t = sigmoid(.) per token and head.
Chunk-wise parallel form (eq 16-18): inside a chunk of C tokens every gradient is taken at the
chunk-start weights M_{t'}, so only the chunk-end state is needed and it is a *weighted sum* of the
per-token gradients. With A_t = prod_{j<=t} eta_j and B_t = prod_{j<=t} (1 - alpha_j) (inside
the chunk):

    S_C = A_C S_0 - sum_i theta_i (A_C / A_i) g_i
    M_C = B_C M_0 + (sum_t (B_C/B_t) A_t) S_0 - sum_i theta_i (sum_{t>=i} (B_C/B_t)(A_t/A_i)) g_i

Because a per-token weight commutes with back-propagation through the MLP (it scales one row),
the two weighted gradient sums share one forward and one backward pass; only the final
`a^T diag(c) g` products are done twice. The gradient is in closed form (plain tensor algebra),
so the outer loss back-propagates through it with ordinary autograd — no torch.func.

Retrieval: tokens of chunk n read M at the end of chunk n-1 (M_0 for the first chunk), which is
causal at token granularity. The memory math runs in fp32 with autocast disabled.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# Initial gate pre-activations: theta = max_lr * sigmoid(0) = max_lr / 2, alpha = sigmoid(-4) ~
# 0.018 (slow forgetting), eta = sigmoid(0) = 0.5 (momentum amplifies steps at most 2x).
THETA_BIAS, ALPHA_BIAS, ETA_BIAS = 0.0, -4.0, 0.0


def layer_scales(weights: list[torch.Tensor]) -> list[float]:
    """Forward multiplier of every memory layer: 1 for the first (unit-norm inputs), else
    1/sqrt(fan_in)."""
    return [1.0] + [1.0 / math.sqrt(w.shape[-2]) for w in weights[1:]]


def memory_forward(weights: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Apply the memory MLP with per-sequence weights. weights[i]: [N, in, out]; x: [N, C, d_m]."""
    a = x
    for i, (w, s) in enumerate(zip(weights, layer_scales(weights))):
        a = torch.bmm(a * s if s != 1.0 else a, w)
        if i < len(weights) - 1:
            a = F.silu(a)
    return a


def weighted_grads(
    weights: list[torch.Tensor], k: torch.Tensor, v: torch.Tensor, coeffs: torch.Tensor
) -> list[torch.Tensor]:
    """Closed-form sum_i c_{r,i} grad_W ||M(k_i) - v_i||^2 for R coefficient sets at once.

    weights[j]: [N, in_j, out_j]; k, v: [N, C, d_m]; coeffs: [R, N, C].
    Returns one [R, N, in_j, out_j] tensor per layer.
    """
    scales = layer_scales(weights)
    inputs, pre = [], []  # layer inputs (already scaled) and pre-activations
    a = k
    for i, (w, s) in enumerate(zip(weights, scales)):
        a_in = a * s if s != 1.0 else a
        inputs.append(a_in)
        z = torch.bmm(a_in, w)
        pre.append(z)
        a = F.silu(z) if i < len(weights) - 1 else z
    g = 2.0 * (a - v)  # d loss / d output, per token (unweighted)
    grads: list[torch.Tensor] = [torch.empty(0)] * len(weights)
    for i in range(len(weights) - 1, -1, -1):
        # dW_i = (diag(c) a_in_i)^T g_i for every coefficient set r
        grads[i] = torch.matmul(
            (inputs[i].unsqueeze(0) * coeffs.unsqueeze(-1)).transpose(-1, -2), g
        )
        if i > 0:
            z = pre[i - 1]
            sig = torch.sigmoid(z)
            g = torch.bmm(g, weights[i].transpose(1, 2)) * scales[i]
            g = g * (sig * (1 + z * (1 - sig)))  # silu'(z)
    return grads


def chunk_coefficients(
    theta: torch.Tensor, log_keep: torch.Tensor, log_eta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-chunk recurrence coefficients from per-token gates.

    theta, log_keep = log(1 - alpha), log_eta: [..., C] (one chunk in the last dim).
    Returns (coeffs [2, ..., C] for the momentum and weight gradient sums,
             A_C [...] momentum carry, c_S [...] weight <- momentum carry, B_C [...] weight decay).
    """
    lA = torch.cumsum(log_eta, -1)
    lB = torch.cumsum(log_keep, -1)
    C = theta.shape[-1]
    tril = torch.ones(C, C, dtype=torch.bool, device=theta.device).tril()
    diff = (lA.unsqueeze(-1) - lA.unsqueeze(-2)).masked_fill(~tril, float("-inf"))
    D = diff.exp()  # D[t, i] = A_t / A_i for t >= i
    beta = (lB[..., -1:] - lB).exp()  # B_C / B_t
    w_s = theta * (lA[..., -1:] - lA).exp()
    w_m = theta * torch.einsum("...t,...ti->...i", beta, D)
    carry_s = lA[..., -1].exp()
    s_to_m = (beta * lA.exp()).sum(-1)
    decay = lB[..., -1].exp()
    return torch.stack((w_s, w_m)), carry_s, s_to_m, decay


def run_memory(
    weights: list[torch.Tensor],
    momentum: list[torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    theta: torch.Tensor,
    log_keep: torch.Tensor,
    log_eta: torch.Tensor,
    chunk: int,
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """Read and write a sequence chunk by chunk (fp32).

    weights/momentum[j]: [N, in_j, out_j]; q, k, v: [N, T, d_m]; gates: [N, T]. A last partial
    chunk (T % chunk tokens) is a shorter chunk with the same semantics.
    Returns (retrieved [N, T, d_m], final weights, final momentum).
    """
    N, T, _ = q.shape
    n, rest = divmod(T, chunk)
    groups = []  # (first token, chunk length, number of chunks)
    if n:
        groups.append((0, chunk, n))
    if rest:
        groups.append((n * chunk, rest, 1))
    outs = []
    for start, size, count in groups:
        span = slice(start, start + size * count)
        coeffs, carry_s, s_to_m, decay = chunk_coefficients(
            *(x[:, span].reshape(N, count, size) for x in (theta, log_keep, log_eta))
        )
        for c in range(count):
            t = slice(start + c * size, start + (c + 1) * size)
            # Tokens of chunk c read the state at the end of the previous chunk (causal), then
            # chunk c writes with every gradient taken at that same state.
            outs.append(memory_forward(weights, q[:, t]))
            grads = weighted_grads(weights, k[:, t], v[:, t], coeffs[:, :, c])
            a_c = carry_s[:, c].view(N, 1, 1)
            m_c = s_to_m[:, c].view(N, 1, 1)
            b_c = decay[:, c].view(N, 1, 1)
            new_w, new_s = [], []
            for w, s, g in zip(weights, momentum, grads):
                new_s.append(a_c * s - g[0])
                new_w.append(b_c * w + m_c * s - g[1])
            weights, momentum = new_w, new_s
    return torch.cat(outs, 1), weights, momentum


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


class NeuralMemory(nn.Module):
    """Titans LMM with its projections, gates, output norm and gate (ARCHITECTURES.md §3.3).

    u -> q, k, v = SiLU(conv(u W)) (q, k l2-normalised per head); gates from u W_g + b;
    retrieved r -> per-head RMSNorm -> * SiLU(u W_og) -> W_out.
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
    ) -> None:
        super().__init__()
        self.heads, self.head_dim, self.chunk = heads, head_dim, chunk_size
        self.max_inner_lr, self.eps = max_inner_lr, eps
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
    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return (
            x.view(B, T, self.heads, self.head_dim)
            .transpose(1, 2)
            .reshape(B * self.heads, T, self.head_dim)
        )

    def queries(
        self, u: torch.Tensor, prev: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised memory queries [B*H, T, d_m] (fp32) of stream u, and the conv tail."""
        d = self.d_in
        q, tail = causal_conv(self.w_q(u), self.conv[:d], prev)
        q = F.normalize(F.silu(q.float()), dim=-1, eps=1e-6)
        return self._heads(q), tail

    def keys_values(
        self, u: torch.Tensor, prev: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Keys, values [B*H, T, d_m] and gate pre-activations [B*H, T, 3] (fp32), conv tail."""
        d = self.d_in
        kv, tail = causal_conv(self.w_kv(u), self.conv[d:], prev)
        kv = F.silu(kv.float())
        k = F.normalize(kv[..., :d], dim=-1, eps=1e-6)
        v = kv[..., d:]
        B, T, _ = u.shape
        g = self.w_gates(u).float() + self.gate_bias.float()  # [B, T, 3H]
        g = g.view(B, T, 3, self.heads).permute(0, 3, 1, 2).reshape(B * self.heads, T, 3)
        return self._heads(k), self._heads(v), g, tail

    # -- state ---------------------------------------------------------------------------------
    def initial_state(self, batch: int) -> MemoryState:
        w = [
            p.float().unsqueeze(0).expand(batch, *p.shape).reshape(batch * self.heads, *p.shape[1:])
            for p in self.init_state
        ]
        return MemoryState(w, [torch.zeros_like(x) for x in w])

    def read(self, state: MemoryState, q: torch.Tensor) -> torch.Tensor:
        """Retrieve with a fixed state (no write). q: [B*H, T, d_m] -> [B*H, T, d_m]."""
        return memory_forward(state.weights, q)

    def write_read(
        self, state: MemoryState, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor
    ) -> tuple[torch.Tensor, MemoryState]:
        """Chunk-wise read + write of a stream; returns (retrieved, state after the stream)."""
        theta = self.max_inner_lr * torch.sigmoid(g[..., 0])
        log_keep = F.logsigmoid(-g[..., 1])
        log_eta = F.logsigmoid(g[..., 2])
        out, w, s = run_memory(
            state.weights, state.momentum, q, k, v, theta, log_keep, log_eta, self.chunk
        )
        return out, MemoryState(w, s)

    # -- output --------------------------------------------------------------------------------
    def output(self, r: torch.Tensor, gate_input: torch.Tensor) -> torch.Tensor:
        """Retrieved [B*H, T, d_m] -> per-head RMSNorm -> * SiLU(gate) -> W_out -> [B, T, d]."""
        B, T, _ = gate_input.shape
        r = r.view(B, self.heads, T, self.head_dim).transpose(1, 2)  # B, T, H, d_m
        r = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + self.eps)
        r = r * self.out_norm.float().view(self.heads, self.head_dim)
        r = r.reshape(B, T, self.d_in).to(gate_input.dtype)
        return self.w_out(r * F.silu(self.w_out_gate(gate_input)))

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """Memory as a sequence layer: read and write u (MAG, MAL)."""
        device_type = u.device.type
        q, _ = self.queries(u)
        k, v, g, _ = self.keys_values(u)
        with torch.autocast(device_type=device_type, enabled=False):
            r, _ = self.write_read(self.initial_state(u.shape[0]), q, k, v, g)
        return self.output(r, u)

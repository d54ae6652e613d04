"""The Titans memory's update rule: closed-form inner gradient, chunk coefficients, and the chunk
recurrence as one autograd function with a hand-written backward.

One memory head (the code batches N = batch x heads). The memory is an MLP of L >= 2 layers with
weights W_j [in_j, out_j]; layer j multiplies its input by the fixed s_j of `layer_scales`:

    x_0 = k,  z_j = x_j W_j,  x_{j+1} = s_{j+1} silu(z_j),  M(k) = z_{L-1}.

Inner gradient of one token, l = ||M(k) - v||^2 (closed form, back-propagation by hand):

    d_{L-1} = M(k) - v,   d_{j-1} = s_j (d_j W_j^T) * silu'(z_{j-1}),   grad_{W_j} l = 2 x_j^T d_j.

**Bounded writes** (our stabilisation; docs/architectures.md): every token's inner gradient is
clipped to norm `max_grad_norm` (tau) before it is written. Each grad_{W_j} is an outer
product, so the norm is closed-form, ||grad l||^2 = 4 sum_j ||x_j||^2 ||d_j||^2, and the clip
is one more per-token factor f = min(1, tau / ||grad l||) on the chunk coefficients below.

Chunk-wise parallel form (Titans eqs 16-18): inside a chunk of C tokens every gradient is taken
at the chunk-start weights, so the chunk-end state is a weighted sum of per-token gradients.
With A_t = prod_{j<=t} eta_j and B_t = prod_{j<=t} (1 - alpha_j) inside the chunk:

    S_C = A_C S_0 - sum_i theta_i (A_C / A_i) g_i
    M_C = B_C M_0 + (sum_t (B_C/B_t) A_t) S_0 - sum_i theta_i (sum_{t>=i} (B_C/B_t)(A_t/A_i)) g_i

The products A_t/A_i are formed as sums of log-gates over the segment i < j <= t (never as a
difference of two cumulative sums), so a gate at 0 or 1 (pre-activation +-inf) gives an exact 0
instead of inf - inf = NaN.

`run_memory` runs the recurrence. With gradients required it is one autograd function
(`_ChunkRecurrence`) whose backward walks the chunks in reverse, recomputing each chunk's
activations from its start state: it keeps only the state at the start of every
`checkpoint`-th chunk (plus, transiently, one group), not the per-chunk graph autograd would.
Its gradients equal autograd's through the same math (tests: gradcheck in float64, and equality
with the plain autograd loop `run_memory_autograd`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

Tensors = list[torch.Tensor]


def layer_scales(weights: Tensors) -> list[float]:
    """Input multiplier of every memory layer: 1 for the first (unit-norm keys), else
    1/sqrt(fan_in)."""
    return [1.0] + [1.0 / math.sqrt(w.shape[-2]) for w in weights[1:]]


def memory_forward(weights: Tensors, x: torch.Tensor) -> torch.Tensor:
    """Apply the memory MLP with per-sequence weights. weights[j]: [N, in, out]; x: [N, T, d_m]."""
    a = x
    for j, (w, s) in enumerate(zip(weights, layer_scales(weights))):
        a = torch.bmm(a * s if s != 1.0 else a, w)
        if j < len(weights) - 1:
            a = F.silu(a)
    return a


# -- closed-form pieces, shared by the reference (`weighted_grads`) and the fused recurrence ----


def _mlp(
    weights: Tensors, scales: list[float], x: torch.Tensor
) -> tuple[Tensors, Tensors, Tensors]:
    """Memory forward keeping the layer inputs x_j, pre-activations z_j and sigmoid(z_j)."""
    xs, zs, sigs = [], [], []
    a = x
    last = len(weights) - 1
    for j, (w, s) in enumerate(zip(weights, scales)):
        xj = a if s == 1.0 else a * s
        z = torch.bmm(xj, w)
        xs.append(xj)
        zs.append(z)
        if j < last:
            sg = torch.sigmoid(z)
            sigs.append(sg)
            a = z * sg
    return xs, zs, sigs


def _silu_grad_times(u: torch.Tensor, z: torch.Tensor, sg: torch.Tensor) -> torch.Tensor:
    """u * silu'(z), with sg = sigmoid(z). ATen's fused kernel has no derivative, so the
    composite form is used when autograd records."""
    if torch.is_grad_enabled() and (u.requires_grad or z.requires_grad):
        return u * (sg * (1 + z * (1 - sg)))
    return torch.ops.aten.silu_backward(u, z)


def _inner_deltas(
    weights: Tensors, scales: list[float], zs: Tensors, sigs: Tensors, err: torch.Tensor
) -> tuple[Tensors, Tensors]:
    """Back-propagated errors d_j of every layer from d_{L-1} = err = M(k) - v, and the
    back-projections u_j = s_j d_j W_j^T (j >= 1; u_0 is None) the outer backward reuses."""
    L = len(weights)
    deltas: list = [None] * L
    us: list = [None] * L
    deltas[-1] = d = err
    for j in range(L - 1, 0, -1):
        u = torch.bmm(d, weights[j].transpose(1, 2))
        if scales[j] != 1.0:
            u = u * scales[j]
        us[j] = u
        deltas[j - 1] = d = _silu_grad_times(u, zs[j - 1], sigs[j - 1])
    return deltas, us


def _sq_norms(xs: Tensors, deltas: Tensors) -> tuple[Tensors, Tensors]:
    """Per-token squared norms ||x_j||^2 and ||d_j||^2, each [N, C]."""
    return [(x * x).sum(-1) for x in xs], [(d * d).sum(-1) for d in deltas]


def _clip_factor(sq: torch.Tensor, max_norm: float) -> torch.Tensor:
    """min(1, tau / ||grad||) with ||grad|| = 2 sqrt(sq); written without a division by zero
    (tokens below the bound get exactly 1 and a zero derivative)."""
    return (0.5 * max_norm) * torch.rsqrt(sq.clamp_min(0.25 * max_norm * max_norm))


def _weighted_sums(xs: Tensors, deltas: Tensors, coeffs: torch.Tensor) -> Tensors:
    """sum_i coeffs[i, r] x_{j,i}^T d_{j,i} for every layer j and coefficient set r, as one bmm
    per layer. xs[j]: [N, C, in]; deltas[j]: [N, C, out]; coeffs: [N, C, R] -> [N, R, in, out]."""
    N, C, R = coeffs.shape
    out = []
    for x, d in zip(xs, deltas):
        xc = (x.unsqueeze(2) * coeffs.unsqueeze(-1)).reshape(N, C, R * x.shape[-1])
        out.append(torch.bmm(xc.transpose(1, 2), d).view(N, R, x.shape[-1], d.shape[-1]))
    return out


def token_grad_sq_norms(weights: Tensors, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """||grad_W ||M(k_i) - v_i||^2||^2 of every token, closed form: [N, C]."""
    scales = layer_scales(weights)
    xs, zs, sigs = _mlp(weights, scales, k)
    deltas, _ = _inner_deltas(weights, scales, zs, sigs, zs[-1] - v)
    qx, qd = _sq_norms(xs, deltas)
    return 4 * sum(a * b for a, b in zip(qx, qd))


def weighted_grads(
    weights: Tensors,
    k: torch.Tensor,
    v: torch.Tensor,
    coeffs: torch.Tensor,
    max_grad_norm: float | None = None,
) -> Tensors:
    """Closed-form sum_i c_{r,i} f_i grad_W ||M(k_i) - v_i||^2 for R coefficient sets at once,
    with f_i the clip factor of `max_grad_norm` (1 when None).

    weights[j]: [N, in_j, out_j]; k, v: [N, C, d_m]; coeffs: [R, N, C].
    Returns one [R, N, in_j, out_j] tensor per layer.
    """
    scales = layer_scales(weights)
    xs, zs, sigs = _mlp(weights, scales, k)
    deltas, _ = _inner_deltas(weights, scales, zs, sigs, zs[-1] - v)
    c = 2 * coeffs.permute(1, 2, 0)
    if max_grad_norm is not None:
        qx, qd = _sq_norms(xs, deltas)
        c = c * _clip_factor(sum(a * b for a, b in zip(qx, qd)), max_grad_norm).unsqueeze(-1)
    return [g.transpose(0, 1) for g in _weighted_sums(xs, deltas, c)]


def _segment_log_sums(log_x: torch.Tensor) -> torch.Tensor:
    """out[..., t, i] = sum_{i < j <= t} log_x[..., j] for t >= i, -inf above the diagonal.
    Summing each segment directly keeps a -inf entry from meeting another (-inf - -inf)."""
    C = log_x.shape[-1]
    x = log_x.unsqueeze(-1).expand(*log_x.shape, C)  # x[..., j, i] = log_x[..., j]
    lower = torch.ones(C, C, dtype=torch.bool, device=log_x.device).tril()
    strict = lower.tril(-1)  # j > i
    seg = x.masked_fill(~strict, 0.0).cumsum(-2)  # seg[t, i] = sum over i < j <= t
    return seg.masked_fill(~lower, float("-inf"))


def chunk_coefficients(
    theta: torch.Tensor, log_keep: torch.Tensor, log_eta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-chunk recurrence coefficients from per-token gates.

    theta, log_keep = log(1 - alpha), log_eta: [..., C] (one chunk in the last dim).
    Returns (coeffs [2, ..., C] for the momentum and weight gradient sums,
             A_C [...] momentum carry, c_S [...] weight <- momentum carry, B_C [...] weight decay).
    """
    D = _segment_log_sums(log_eta).exp()  # D[t, i] = A_t / A_i for t >= i, else 0
    Dk = _segment_log_sums(log_keep).exp()  # Dk[t, i] = B_t / B_i
    beta = Dk[..., -1, :]  # B_C / B_t
    A = log_eta[..., :1].exp() * D[..., :, 0]  # A_t
    w_s = theta * D[..., -1, :]
    w_m = theta * torch.einsum("...t,...ti->...i", beta, D)
    carry_s = A[..., -1]
    s_to_m = (beta * A).sum(-1)
    decay = log_keep[..., 0].exp() * beta[..., 0]
    return torch.stack((w_s, w_m)), carry_s, s_to_m, decay


# -- the chunk recurrence ------------------------------------------------------------------------


def _reference_chunk(
    W: Tensors,
    S: Tensors,
    rows: torch.Tensor,
    v: torch.Tensor,
    cn: torch.Tensor,
    carry: torch.Tensor,
    s_to_m: torch.Tensor,
    decay: torch.Tensor,
    r: int,
    max_norm: float | None,
) -> tuple[torch.Tensor, Tensors, Tensors]:
    """One chunk step in plain autograd operations, built from the closed-form pieces above:
    the reference `_ChunkRecurrence` is tested against. Arguments as in `_chunk_step`."""
    scales = layer_scales(W)
    xs, zs, sigs = _mlp(W, scales, rows)
    xk = [x[:, r:] for x in xs]
    zk = [z[:, r:] for z in zs]
    deltas, _ = _inner_deltas(W, scales, zk, [g[:, r:] for g in sigs], zk[-1] - v)
    c = cn
    if max_norm is not None:
        qx, qd = _sq_norms(xk, deltas)
        c = cn * _clip_factor(sum(a * b for a, b in zip(qx, qd)), max_norm).unsqueeze(-1)
    G = _weighted_sums(xk, deltas, c)
    S_new = [g[:, 0] + carry * s for g, s in zip(G, S)]
    W_new = [g[:, 1] + decay * w + s_to_m * s for g, w, s in zip(G, W, S)]
    return zs[-1][:, :r], W_new, S_new


def _chunk_activations(
    W: Tensors, scales: list[float], rows: torch.Tensor, v: torch.Tensor, r: int
) -> tuple[Tensors, Tensors, list, list]:
    """One chunk's memory-MLP pass (no autograd) over its rows (r read queries, then the keys):
    layer inputs A_j (unscaled), pre-activations Z_j, and over the keys the back-projections
    U_j = s_j D_j W_j^T (U_0 is None) and errors D_j, from D_{L-1} = M(k) - v."""
    L = len(W)
    A, Z = [rows], []
    for j in range(L):
        z = torch.bmm(A[j], W[j])
        if scales[j] != 1.0:
            z.mul_(scales[j])
        Z.append(z)
        if j < L - 1:
            A.append(F.silu(z))
    D: list = [None] * L
    U: list = [None] * L
    D[-1] = Z[-1][:, r:] - v
    for j in range(L - 1, 0, -1):
        U[j] = torch.bmm(D[j], W[j].transpose(1, 2))
        if scales[j] != 1.0:
            U[j].mul_(scales[j])
        D[j - 1] = torch.ops.aten.silu_backward(U[j], Z[j - 1][:, r:])
    return A, Z, U, D


def _chunk_step(
    W: Tensors,
    S: Tensors,
    W_out: Tensors,
    S_out: Tensors,
    rows: torch.Tensor,
    v: torch.Tensor,
    cn: torch.Tensor,
    carry: torch.Tensor,
    s_to_m: torch.Tensor,
    decay: torch.Tensor,
    k_sq: torch.Tensor | None,
    r: int,
    scales: list[float],
    max_norm: float | None,
) -> torch.Tensor:
    """Read and write one chunk (no autograd), every gradient at the start state (W, S); the
    new state is written into W_out, S_out. Returns the reads [N, r, d_m].

    rows: [N, r + C, d_m], the r read queries then the C keys (one MLP pass for both);
    v: [N, C, d_m]; cn: [N, C, 2] = -2 x the (momentum, weight) coefficients of the tokens;
    carry, s_to_m, decay: [N, 1, 1]; k_sq: ||k||^2 [N, C] (needed with a clip).
    Layer j's input scale s_j multiplies z_j = s_j a_j W_j, so the layer inputs a_j are kept
    unscaled and s_j goes into the coefficients of layer j's gradient sum.
    """
    L = len(W)
    A, Z, _, D = _chunk_activations(W, scales, rows, v, r)
    c = cn
    if max_norm is not None:
        sq = k_sq * torch.linalg.vecdot(D[0], D[0])
        for j in range(1, L):
            ak = A[j][:, r:]
            sq = torch.addcmul(
                sq,
                torch.linalg.vecdot(ak, ak),
                torch.linalg.vecdot(D[j], D[j]),
                value=scales[j] ** 2,
            )
        c = cn * _clip_factor(sq, max_norm).unsqueeze(-1)
    for j in range(L):
        ak = A[j][:, r:]
        N, C, width = ak.shape
        cj = c if scales[j] == 1.0 else c * scales[j]
        xc = (ak.unsqueeze(2) * cj.unsqueeze(-1)).reshape(N, C, 2 * width)
        G = torch.bmm(xc.transpose(1, 2), D[j]).view(N, 2, width, -1)  # minus the grad sums
        torch.addcmul(G[:, 0], S[j], carry, out=S_out[j])
        torch.addcmul(G[:, 1], W[j], decay, out=W_out[j]).addcmul_(S[j], s_to_m)
    return Z[-1][:, :r]


def _silu_second(z: torch.Tensor) -> torch.Tensor:
    """silu''(z) = s (1 - s) (2 + z (1 - 2 s)), s = sigmoid(z)."""
    s = torch.sigmoid(z)
    return s * (1 - s) * (2 + z * (1 - 2 * s))


class _Chunks:
    """The chunk-major inputs of the recurrence, one chunk step at a time."""

    def __init__(self, rows, v, cn, carry, s_to_m, decay, r: int, max_norm: float | None, W):
        self.rows, self.v, self.cn, self.carry, self.s_to_m, self.decay = (
            rows, v, cn, carry, s_to_m, decay
        )  # fmt: skip
        self.r, self.max_norm, self.scales = r, max_norm, layer_scales(list(W))
        keys = rows[:, :, r:]
        self.k_sq = None if max_norm is None else torch.linalg.vecdot(keys, keys)

    def __len__(self) -> int:
        return self.rows.shape[0]

    def step(self, c: int, W: Tensors, S: Tensors, W_out: Tensors, S_out: Tensors) -> torch.Tensor:
        """Chunk c from state (W, S); the new state goes into (W_out, S_out); returns the reads."""
        return _chunk_step(
            W, S, W_out, S_out, self.rows[c], self.v[c], self.cn[c], self.carry[c],
            self.s_to_m[c], self.decay[c], None if self.k_sq is None else self.k_sq[c], self.r,
            self.scales, self.max_norm,
        )  # fmt: skip


class _ChunkRecurrence(torch.autograd.Function):
    """The chunk loop as one autograd node.

    Inputs are chunk-major: rows [n, N, r + C, d_m], v [n, N, C, d_m], cn [n, N, C, 2],
    carry / s_to_m / decay [n, N, 1, 1], then the L weight and L momentum tensors of the start
    state. Outputs: reads [n, N, r, d_m], the L final weights, the L final momenta.

    The forward keeps only the state at the start of every `checkpoint`-th chunk. The backward
    walks the chunks in reverse: per group of `checkpoint` chunks it recomputes their start
    states, then per chunk it recomputes the activations and back-propagates through them while
    they are in cache.
    """

    @staticmethod
    def forward(ctx, rows, v, cn, carry, s_to_m, decay, r, max_norm, checkpoint, *state):  # type: ignore[override]
        L, n, K = len(state) // 2, rows.shape[0], checkpoint
        kept = [x.new_empty(-(-n // K), *x.shape) for x in state]  # every K-th start state
        for buf, x in zip(kept, state):
            buf[0].copy_(x)
        spare = [[torch.empty_like(x) for x in state] for _ in range(2)]  # the others
        chunks = _Chunks(rows, v, cn, carry, s_to_m, decay, r, max_norm, state[:L])
        cur, reads = [b[0] for b in kept], []
        for c in range(n):
            if c == n - 1:
                nxt = [torch.empty_like(x) for x in state]
            elif (c + 1) % K == 0:
                nxt = [b[(c + 1) // K] for b in kept]
            else:
                nxt = spare[c % 2]
            reads.append(chunks.step(c, cur[:L], cur[L:], nxt[:L], nxt[L:]))
            cur = nxt
        ctx.save_for_backward(rows, v, cn, carry, s_to_m, decay, *kept)
        ctx.r, ctx.max_norm, ctx.L, ctx.K = r, max_norm, L, K
        return (torch.stack(reads), *cur)

    @staticmethod
    def backward(ctx, dreads, *dstate):  # type: ignore[override]
        rows, v, cn, carry, s_to_m, decay, *kept = ctx.saved_tensors
        with torch.autocast(rows.device.type, enabled=False):
            return _recurrence_backward(
                rows, v, cn, carry, s_to_m, decay, kept, dreads, dstate, ctx.r, ctx.max_norm, ctx.K
            )


def _recurrence_backward(rows, v, cn, carry, s_to_m, decay, kept, dreads, dstate, r, tau, K):
    """The backward of `_ChunkRecurrence`; gradients of its inputs in order."""
    L = len(kept) // 2
    n, N, R, dm = rows.shape
    C = R - r
    chunks = _Chunks(rows, v, cn, carry, s_to_m, decay, r, tau, [w[0] for w in kept[:L]])
    scales, k_sq = chunks.scales, chunks.k_sq
    # gg[j]: (dS, dW) of the state after the chunk being processed, [N, 2, in, out]. Written
    # without `out=` into views, so Dynamo traces this backward whole (no graph break).
    gg = [
        torch.stack([torch.zeros_like(w[0]) if g is None else g for g in (dS, dW)], 1)
        for w, dS, dW in zip(kept[:L], dstate[L:], dstate[:L])
    ]
    # per-chunk gradients, collected in reverse and stacked once at the end
    drows, dv, dcn, dcarry, ds_to_m, ddecay = [], [], [], [], [], []
    group: list = []
    for c in range(n - 1, -1, -1):
        if not group:  # recompute the start states of the chunks of c's checkpoint group
            start = c - c % K
            group = [[b[start // K] for b in kept]]
            for i in range(start, c):
                nxt = [torch.empty_like(x) for x in group[-1]]
                chunks.step(i, group[-1][:L], group[-1][L:], nxt[:L], nxt[L:])
                group.append(nxt)
        state = group.pop()
        W, S = state[:L], state[L:]
        A, Z, U, D = _chunk_activations(W, scales, rows[c], v[c], r)  # recomputed
        Ak = [a[:, r:] for a in A]
        cf = cn[c]
        if tau is not None:
            qa = [k_sq[c]] + [torch.linalg.vecdot(a, a) for a in Ak[1:]]
            qd = [torch.linalg.vecdot(d, d) for d in D]
            sq = sum(s * s * x * y for s, x, y in zip(scales, qa, qd))
            f = _clip_factor(sq, tau)
            cf = cf * f.unsqueeze(-1)
        cs = [cf if s == 1.0 else cf * s for s in scales]
        clip = None if tau is None else (tau, f, sq, qa, qd)
        dd, da, dcn_c = _gradient_sums_backward(gg, Ak, D, cs, scales, cn[c], clip, N, C)
        dcn.append(dcn_c)
        # -- the update: S' = carry S + G0, W' = decay W + s_to_m S + G1
        dW = [gg[j][:, 1] * decay[c] for j in range(L)]
        dz_err: list = [None] * L
        # -- the error recursion d_{j-1} = silu'(z_{j-1}) u_j, u_j = s_j d_j W_j^T
        for j in range(1, L):
            zk = Z[j - 1][:, r:]
            du = torch.ops.aten.silu_backward(dd[j - 1], zk)
            dz_err[j - 1] = dd[j - 1] * U[j] * _silu_second(zk)
            if scales[j] != 1.0:
                du.mul_(scales[j])
            dd[j] = torch.baddbmm(dd[j], du, W[j])
            dW[j] = torch.baddbmm(dW[j], du.transpose(1, 2), D[j])
        dv.append(-dd[L - 1])
        # -- the memory MLP over the read and key rows: d z_{L-1} = (d reads, d d_{L-1})
        dz = dd[L - 1]
        if r:
            dz = torch.cat((dreads[c] if dreads is not None else dz.new_zeros(N, r, dm), dz), 1)
        for j in range(L - 1, -1, -1):
            dW[j] = torch.baddbmm(dW[j], A[j].transpose(1, 2), dz, alpha=scales[j])
            dx = torch.bmm(dz, W[j].transpose(1, 2))
            if scales[j] != 1.0:
                dx.mul_(scales[j])
            dx[:, r:] += da[j]
            if j > 0:
                dz = torch.ops.aten.silu_backward(dx, Z[j - 1])
                dz[:, r:] += dz_err[j - 1]
        drows.append(dx)
        # -- gradients of carry, s_to_m, decay and of the state at the chunk start
        dot = lambda x, y: torch.linalg.vecdot(x.flatten(1), y.flatten(1))  # noqa: E731
        dcarry.append(sum(dot(gg[j][:, 0], S[j]) for j in range(L)).view(N, 1, 1))
        ds_to_m.append(sum(dot(gg[j][:, 1], S[j]) for j in range(L)).view(N, 1, 1))
        ddecay.append(sum(dot(gg[j][:, 1], W[j]) for j in range(L)).view(N, 1, 1))
        dS = [torch.addcmul(gg[j][:, 1] * s_to_m[c], gg[j][:, 0], carry[c]) for j in range(L)]
        if c:
            gg = [torch.stack((a, b), 1) for a, b in zip(dS, dW)]
    grads = (torch.stack(x[::-1]) for x in (drows, dv, dcn, dcarry, ds_to_m, ddecay))
    return (*grads, None, None, None, *dW, *dS)


def _gradient_sums_backward(gg, Ak, D, cs, scales, cn_c, clip, N, C):
    """Backward through the gradient sums G^r_j = a_j^T diag(c_j,r) d_j (r = momentum, weights)
    of one chunk: the gradients of every d_j and a_j and of the chunk's step sizes, through the
    norm clip when `clip` = (tau, factor, squared norm, |a_j|^2, |d_j|^2)."""
    L = len(gg)
    dd, da, cbar = [], [], None
    for j in range(L):
        ggv = gg[j].view(N, -1, gg[j].shape[-1])  # [N, 2 in, out]
        xc = (Ak[j].unsqueeze(2) * cs[j].unsqueeze(-1)).reshape(N, C, -1)
        dd.append(torch.bmm(xc, ggv))
        p = torch.bmm(D[j], ggv.transpose(1, 2)).view(N, C, 2, -1)
        da.append((p * cs[j].unsqueeze(-1)).sum(2))
        cb = torch.linalg.vecdot(p, Ak[j].unsqueeze(2))
        if scales[j] != 1.0:
            cb = cb * scales[j]
        cbar = cb if cbar is None else cbar + cb
    if clip is not None:
        tau, f, sq, qa, qd = clip
        dcn_c = cbar * f.unsqueeze(-1)
        clipped = sq > 0.25 * tau * tau  # f = tau/2 rsqrt(sq) there: df/dsq = -f / (2 sq)
        dsq = torch.where(clipped, (cbar * cn_c).sum(-1) * f / sq.clamp_min(1e-30), 0.0)
        for j in range(L):
            w2 = (-(scales[j] ** 2)) * dsq  # d sq / d a_j = 2 s_j^2 |d_j|^2 a_j, and d_j alike
            dd[j] = torch.addcmul(dd[j], (w2 * qa[j]).unsqueeze(-1), D[j])
            da[j] = torch.addcmul(da[j], (w2 * qd[j]).unsqueeze(-1), Ak[j])
    else:
        dcn_c = cbar
    return dd, da, dcn_c


def _recurrence_no_grad(
    chunks: _Chunks, W: Tensors, S: Tensors
) -> tuple[torch.Tensor, Tensors, Tensors]:
    """The forward of `_ChunkRecurrence` without keeping states (inference)."""
    reads = []
    for c in range(len(chunks)):
        W_new, S_new = [torch.empty_like(w) for w in W], [torch.empty_like(s) for s in S]
        reads.append(chunks.step(c, W, S, W_new, S_new))
        W, S = W_new, S_new
    return torch.stack(reads), W, S


def _chunked_coefficients(
    theta: torch.Tensor, log_keep: torch.Tensor, log_eta: torch.Tensor, chunk: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """chunk_coefficients for every chunk of [N, T] gates: coeffs [2, N, n, chunk] and carries
    [N, n]. A last partial chunk gets its own (shorter) coefficients, zero-padded: padded
    tokens take no part in the write."""
    N, T = theta.shape
    full, rest = divmod(T, chunk)
    parts = []
    if full:
        span = slice(0, full * chunk)
        parts.append(
            chunk_coefficients(
                *(x[:, span].reshape(N, full, chunk) for x in (theta, log_keep, log_eta))
            )
        )
    if rest:
        tail = chunk_coefficients(
            *(x[:, full * chunk :].unsqueeze(1) for x in (theta, log_keep, log_eta))
        )
        parts.append((F.pad(tail[0], (0, chunk - rest)), *tail[1:]))
    if len(parts) == 1:
        return parts[0]
    return tuple(torch.cat(xs, -2 if i == 0 else -1) for i, xs in enumerate(zip(*parts)))  # type: ignore[return-value]


def run_memory(
    weights: Tensors,
    momentum: Tensors,
    q: torch.Tensor | None,
    k: torch.Tensor,
    v: torch.Tensor,
    theta: torch.Tensor,
    log_keep: torch.Tensor,
    log_eta: torch.Tensor,
    chunk: int,
    max_grad_norm: float | None = None,
    checkpoint: int = 1,
    fused: bool = True,
    heads_last: bool = False,
) -> tuple[torch.Tensor | None, Tensors, Tensors]:
    """Read and write a sequence chunk by chunk (fp32): tokens of chunk c read the state at the
    end of chunk c-1, then chunk c is written with every gradient at that same state.

    weights/momentum[j]: [N, in_j, out_j]; q (None: write only), k, v: [N, T, d_m], or
    [B, T, H, d_m] with N = B * H when `heads_last`; gates: [N, T]. A last partial chunk
    (T % chunk tokens) is a shorter chunk with the same semantics. `max_grad_norm`: clip of
    every token's inner gradient (None: no clip). `checkpoint`: the backward keeps the state at
    the start of every checkpoint-th chunk and recomputes the others. `fused=False` runs the same math as plain autograd operations (the
    reference the fused backward is tested against).
    Returns (retrieved, in the layout of q, or None; final weights; final momentum).
    """
    N, T = theta.shape
    dm = k.shape[-1]
    n = -(-T // chunk)
    pad = n * chunk - T
    coeffs, carry, s_to_m, decay = _chunked_coefficients(theta, log_keep, log_eta, chunk)
    r = 0 if q is None else chunk

    def chunk_major(x: torch.Tensor) -> torch.Tensor:  # -> [n, N, chunk, d_m], a view
        if pad:
            x = F.pad(x, (0, 0, 0, 0, 0, pad) if heads_last else (0, 0, 0, pad))
        if heads_last:  # [B, n*chunk, H, d] -> [n, B, H, chunk, d]
            return x.view(x.shape[0], n, chunk, x.shape[2], dm).permute(1, 0, 3, 2, 4)
        return x.view(N, n, chunk, dm).transpose(0, 1)

    if q is None:
        rows = chunk_major(k).reshape(n, N, chunk, dm)
    else:
        rows = torch.cat((chunk_major(q), chunk_major(k)), -2).reshape(n, N, 2 * chunk, dm)
    vs = chunk_major(v).reshape(n, N, chunk, dm)
    cneg = (-2.0 * coeffs).permute(2, 1, 3, 0).contiguous()  # [n, N, chunk, 2]
    carry, s_to_m, decay = (x.t().reshape(n, N, 1, 1).contiguous() for x in (carry, s_to_m, decay))
    inputs = (rows, vs, cneg, carry, s_to_m, decay, *weights, *momentum)
    L = len(weights)
    if not fused:
        W, S, out = list(weights), list(momentum), []
        for c in range(n):
            read, W, S = _reference_chunk(
                W, S, rows[c], vs[c], cneg[c], carry[c], s_to_m[c], decay[c], r, max_grad_norm
            )
            out.append(read)
        reads = torch.stack(out)
    elif torch.is_grad_enabled() and any(x.requires_grad for x in inputs):
        reads, *state = _ChunkRecurrence.apply(
            rows, vs, cneg, carry, s_to_m, decay, r, max_grad_norm, checkpoint, *weights, *momentum
        )
        W, S = state[:L], state[L:]
    else:
        with torch.no_grad():
            chunks = _Chunks(rows, vs, cneg, carry, s_to_m, decay, r, max_grad_norm, weights)
            reads, W, S = _recurrence_no_grad(chunks, list(weights), list(momentum))
    if q is None:
        return None, list(W), list(S)
    if heads_last:  # [n, B, H, chunk, d] -> [B, n*chunk, H, d]
        B, H = q.shape[0], q.shape[2]
        out = reads.view(n, B, H, chunk, dm).permute(1, 0, 3, 2, 4).reshape(B, n * chunk, H, dm)
    else:
        out = reads.transpose(0, 1).reshape(N, n * chunk, dm)
    return out[:, :T], list(W), list(S)

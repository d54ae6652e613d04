"""Neural long-term memory math: closed-form inner gradient, chunk-wise recurrence, the fused
recurrence's hand-written backward, bounded writes, fp32 state."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from taperlm.models import memory as mem
from taperlm.models.memory import NeuralMemory
from taperlm.models.memory_recurrence import (
    chunk_coefficients,
    memory_forward,
    run_memory,
    token_grad_sq_norms,
    weighted_grads,
)


def _weights(N: int, dm: int, h: int, depth: int, dtype=torch.float64) -> list[torch.Tensor]:
    shapes = [(dm, h)] + [(h, h)] * (depth - 2) + [(h, dm)]
    g = torch.Generator().manual_seed(0)
    return [torch.randn(N, i, o, generator=g, dtype=dtype) for i, o in shapes]


def _token_grads(W, k, v):
    """Autograd gradient of ||M(k_i) - v_i||^2 for every token i separately."""
    out = []
    for i in range(k.shape[1]):
        Wr = [w.clone().requires_grad_() for w in W]
        loss = ((memory_forward(Wr, k[:, i : i + 1]) - v[:, i : i + 1]) ** 2).sum()
        out.append(torch.autograd.grad(loss, Wr))
    return out


@pytest.mark.parametrize("depth", [2, 3])
@pytest.mark.parametrize("clipped", [False, True])
def test_closed_form_gradient_equals_autograd(depth: int, clipped: bool) -> None:
    """sum_i c_{r,i} f_i grad l_i in closed form equals autograd, with f_i the clip factor of
    token i's own gradient norm (the bound is the median norm: some tokens clipped, some not)."""
    N, C, dm, h, R = 3, 5, 4, 6, 2
    W = _weights(N, dm, h, depth)
    k = F.normalize(torch.randn(N, C, dm, dtype=torch.float64), dim=-1)
    v = torch.randn(N, C, dm, dtype=torch.float64)
    c = torch.rand(R, N, C, dtype=torch.float64)
    per_token = _token_grads(W, k, v)
    norms = torch.stack([sum((g**2).sum((1, 2)) for g in gs) for gs in per_token], 1).sqrt()
    torch.testing.assert_close(token_grad_sq_norms(W, k, v), norms**2, rtol=1e-10, atol=1e-12)
    clip = float(norms.median()) if clipped else None
    closed = weighted_grads(W, k, v, c, max_grad_norm=clip)
    f = torch.ones_like(norms) if clip is None else (clip / norms).clamp(max=1)
    for r in range(R):
        for j in range(depth):
            ref = sum((c[r, :, i] * f[:, i]).view(N, 1, 1) * per_token[i][j] for i in range(C))
            torch.testing.assert_close(closed[j][r], ref, rtol=1e-10, atol=1e-10)


def _reference(W0, q, k, v, theta, alpha, eta, chunk, clip=None):
    """Token-by-token Titans recurrence; gradients at the chunk-start weights (autograd),
    each clipped to norm `clip`; reads at the chunk-start weights."""
    N, T, _ = q.shape
    W = [w.clone() for w in W0]
    S = [torch.zeros_like(w) for w in W0]
    outs = []
    for start in range(0, T, chunk):
        W_start = [w.clone() for w in W]
        for t in range(start, start + chunk):
            outs.append(memory_forward(W_start, q[:, t : t + 1]))
            Wr = [w.clone().requires_grad_() for w in W_start]
            loss = ((memory_forward(Wr, k[:, t : t + 1]) - v[:, t : t + 1]) ** 2).sum()
            grads = torch.autograd.grad(loss, Wr)
            if clip is not None:
                norm = sum((g**2).sum((1, 2)) for g in grads).sqrt()
                grads = [g * (clip / norm).clamp(max=1).view(N, 1, 1) for g in grads]
            th, al, et = (x[:, t].view(N, 1, 1) for x in (theta, alpha, eta))
            S = [et * s - th * g for s, g in zip(S, grads)]
            W = [(1 - al) * w + s for w, s in zip(W, S)]
    return torch.cat(outs, 1), W, S


@pytest.mark.parametrize("chunk", [1, 4])
@pytest.mark.parametrize("clip", [None, 1.0])
@pytest.mark.parametrize("fused", [True, False])
def test_chunkwise_equals_token_recurrence(chunk: int, clip: float | None, fused: bool) -> None:
    """chunk 1: exactly the per-token recurrence; chunk 4: the cumulative-product coefficients
    reproduce per-token momentum/decay with chunk-start gradients; with and without the clip of
    every token's gradient; the fused recurrence and the plain autograd one alike."""
    N, T, dm, h = 2, 8, 3, 5
    torch.manual_seed(1)
    W0 = _weights(N, dm, h, 2)
    q, k = (
        torch.nn.functional.normalize(torch.randn(N, T, dm, dtype=torch.float64), dim=-1)
        for _ in range(2)
    )
    v = torch.randn(N, T, dm, dtype=torch.float64)
    theta = 0.1 * torch.rand(N, T, dtype=torch.float64)
    alpha = 0.2 * torch.rand(N, T, dtype=torch.float64)
    eta = torch.rand(N, T, dtype=torch.float64)
    S0 = [torch.zeros_like(w) for w in W0]
    W0 = [w.requires_grad_() for w in W0]  # the fused path runs under autograd
    gates = (theta, torch.log1p(-alpha), torch.log(eta))
    out, W, S = run_memory(W0, S0, q, k, v, *gates, chunk, max_grad_norm=clip, fused=fused)
    ref_out, ref_W, ref_S = _reference(W0, q, k, v, theta, alpha, eta, chunk, clip)
    torch.testing.assert_close(out, ref_out, rtol=1e-9, atol=1e-10)
    for a, b in zip(W + S, ref_W + ref_S):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_chunk_coefficients_single_token() -> None:
    th, ak, et = torch.tensor([[0.3]]), torch.tensor([[0.9]]), torch.tensor([[0.5]])
    coeffs, carry, s_to_m, decay = chunk_coefficients(th, ak.log(), et.log())
    torch.testing.assert_close(coeffs[:, 0, 0], torch.tensor([0.3, 0.3]))
    torch.testing.assert_close(carry, torch.tensor([0.5]))
    torch.testing.assert_close(s_to_m, torch.tensor([0.5]))
    torch.testing.assert_close(decay, torch.tensor([0.9]))


def _inputs(N: int, T: int, dm: int, h: int, depth: int, seed: int):
    """Weights, momentum, q, k, v and gate pre-activations (float64, requiring grad)."""
    g = torch.Generator().manual_seed(seed)
    W = [w.requires_grad_() for w in _weights(N, dm, h, depth)]
    S = [(0.1 * torch.randn(w.shape, generator=g, dtype=w.dtype)).requires_grad_() for w in W]
    q, k = (
        F.normalize(torch.randn(N, T, dm, generator=g, dtype=torch.float64), dim=-1) for _ in "qk"
    )
    v = torch.randn(N, T, dm, generator=g, dtype=torch.float64)
    gates = torch.randn(3, N, T, generator=g, dtype=torch.float64)
    return [x.requires_grad_() for x in (*W, *S, q, k, v, gates)]


def _run(depth: int, chunk: int, clip: float | None, fused: bool, *ins):
    W, S = list(ins[:depth]), list(ins[depth : 2 * depth])
    q, k, v, gates = ins[2 * depth :]
    theta = 0.3 * torch.sigmoid(gates[0])
    lk, le = F.logsigmoid(-gates[1]), F.logsigmoid(gates[2])
    out, Wf, Sf = run_memory(W, S, q, k, v, theta, lk, le, chunk, max_grad_norm=clip, fused=fused)
    return out, *Wf, *Sf


@pytest.mark.parametrize("clip", [None, 0.5])
def test_fused_recurrence_gradcheck(clip: float | None) -> None:
    """The hand-written backward of the fused chunk recurrence against finite differences
    (float64; 3 chunks, the last partial; with the clip active on some tokens)."""
    ins = _inputs(N=2, T=7, dm=3, h=4, depth=2, seed=2)
    assert torch.autograd.gradcheck(lambda *x: _run(2, 3, clip, True, *x), ins)


@pytest.mark.parametrize("depth", [2, 3])
@pytest.mark.parametrize("clip", [None, 0.5])
@pytest.mark.parametrize("chunk", [1, 4, 16])
def test_fused_recurrence_equals_autograd(depth: int, clip: float | None, chunk: int) -> None:
    """Forward and every gradient of the fused recurrence equal plain autograd through the same
    math: several chunks and a partial one (T = 11), one chunk longer than the stream."""
    ins = _inputs(N=3, T=11, dm=4, h=6, depth=depth, seed=3)
    outs = {}
    for fused in (True, False):
        out = _run(depth, chunk, clip, fused, *ins)
        weights = [torch.cos(torch.arange(x.numel(), dtype=x.dtype)).view_as(x) for x in out]
        loss = sum((w * x).sum() for w, x in zip(weights, out))
        outs[fused] = (out, torch.autograd.grad(loss, ins))
    for a, b in zip([*outs[True][0], *outs[True][1]], [*outs[False][0], *outs[False][1]]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_inference_path_equals_autograd_path() -> None:
    ins = _inputs(N=2, T=13, dm=4, h=6, depth=2, seed=4)
    ref = _run(2, 4, 0.5, False, *ins)
    with torch.no_grad():
        got = _run(2, 4, 0.5, True, *ins)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b.detach(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("gate", [0, 1, 2])
@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_saturated_gates_stay_finite(gate: int, value: float) -> None:
    """A gate pre-activation of +-inf (theta, alpha or eta exactly 0 or 1) gives finite reads,
    states and gradients: the coefficients are exact products, never inf - inf."""
    ins = _inputs(N=2, T=9, dm=3, h=4, depth=2, seed=5)
    gates = ins[-1].detach().clone()
    gates[gate, :, 2] = value
    gates[gate, 1, 5:] = value
    ins[-1] = gates.requires_grad_()
    for fused in (True, False):
        out = _run(2, 4, 1.0, fused, *ins)
        assert all(torch.isfinite(x).all() for x in out)
        grads = torch.autograd.grad(sum(x.sum() for x in out), ins)
        assert all(torch.isfinite(g).all() for g in grads)


def test_chunk_coefficients_of_saturated_gates() -> None:
    """eta = 0 at token 1 cuts the momentum products through it; 1 - alpha = 0 at token 2 wipes
    the weights written before it; both exactly."""
    theta = torch.full((1, 4), 0.5)
    log_keep = torch.log(torch.tensor([[0.9, 0.8, 0.0, 0.7]]))
    log_eta = torch.log(torch.tensor([[0.5, 0.0, 0.5, 0.5]]))
    coeffs, carry, s_to_m, decay = chunk_coefficients(theta, log_keep, log_eta)
    assert all(torch.isfinite(x).all() for x in (coeffs, carry, s_to_m, decay))
    # w_s[i] = theta_i prod_{i<j<=C} eta_j: only token 0 sees the cut at token 1
    torch.testing.assert_close(coeffs[0, 0], torch.tensor([0.0, 0.125, 0.25, 0.5]))
    assert carry.item() == 0.0 and decay.item() == 0.0
    # w_m[i] = theta_i sum_{t >= i} (B_C/B_t)(A_t/A_i) with B_C/B_t = 0, 0, 0.7, 1 and
    # A_t/A_i = 0 across token 1: i=1: 0.5 (0.7 * 0.5 + 0.25); i=2: 0.5 (0.7 + 0.5)
    torch.testing.assert_close(coeffs[1, 0], torch.tensor([0.0, 0.3, 0.6, 0.5]))


def test_clip_bounds_an_unstable_inner_loop() -> None:
    """Gates at their largest (theta = max_lr, no forgetting, momentum ~1) and large values
    make the unclipped inner loop blow up within one sequence; with the clip every state is
    finite and bounded by the number of chunks times the largest write."""
    N, T, dm, h, chunk = 4, 256, 8, 16, 16
    g = torch.Generator().manual_seed(6)
    W0 = [torch.randn(N, dm, h, generator=g), torch.randn(N, h, dm, generator=g)]
    S0 = [torch.zeros_like(w) for w in W0]
    # one key per head, repeated: every gradient of a chunk points the same way
    k = F.normalize(torch.randn(N, 1, dm, generator=g), dim=-1).expand(N, T, dm)
    v = 30 * torch.randn(N, T, dm, generator=g)
    theta = torch.full((N, T), 0.1)
    log_keep, log_eta = torch.zeros(N, T), torch.full((N, T), -1e-3)
    with torch.no_grad():
        _, W, _ = run_memory(W0, S0, None, k, v, theta, log_keep, log_eta, chunk)
        assert not all(torch.isfinite(w).all() for w in W)
        _, W, S = run_memory(W0, S0, None, k, v, theta, log_keep, log_eta, chunk, max_grad_norm=1.0)
    assert all(torch.isfinite(x).all() for x in W + S)
    # |S_c| <= c C theta tau and |W_{c+1}| <= |W_c| + C |S_c| + C^2 theta tau per head
    n, theta_tau = T // chunk, 0.1 * 1.0
    bound = sum(w.norm(dim=(1, 2)) for w in W0) + chunk**2 * theta_tau * n * (n + 1) / 2
    assert (sum(w.pow(2).sum((1, 2)) for w in W).sqrt() <= bound).all()


def test_partial_last_chunk_is_a_short_chunk() -> None:
    """A stream whose length is not a multiple of the chunk: its last chunk is processed as a
    shorter chunk (same outputs and state as processing the pieces one after another)."""
    torch.manual_seed(3)
    m = NeuralMemory(16, 2, 4, 8, 2, chunk_size=4, conv_kernel=3, max_inner_lr=0.1)
    u = torch.randn(1, 6, 16)
    q, k, v, g, _, _ = m.project(u)
    st0 = m.initial_state(1)
    r6, st6 = m.write_read(st0, q, k, v, g)
    assert r6.shape[1] == 6
    r4, st4 = m.write_read(st0, q[:, :4], k[:, :4], v[:, :4], g[:, :4])
    r2, st2 = m.write_read(st4, q[:, 4:], k[:, 4:], v[:, 4:], g[:, 4:])
    torch.testing.assert_close(r6, torch.cat((r4, r2), 1))
    for a, b in zip(st6.weights + st6.momentum, st2.weights + st2.momentum):
        torch.testing.assert_close(a, b)


def test_memory_math_is_fp32_under_autocast(monkeypatch) -> None:
    seen: list[torch.dtype] = []
    real = mem.run_memory

    def spy(weights, momentum, q, k, v, *rest, **kw):
        seen.extend([weights[0].dtype, momentum[0].dtype, q.dtype, k.dtype, v.dtype])
        out, w, s = real(weights, momentum, q, k, v, *rest, **kw)
        seen.extend([out.dtype, w[0].dtype])
        return out, w, s

    monkeypatch.setattr(mem, "run_memory", spy)
    torch.manual_seed(4)
    m = NeuralMemory(32, 2, 8, 16, 2, chunk_size=4, conv_kernel=4, max_inner_lr=0.1)
    u = torch.randn(2, 12, 32)
    ref = m(u)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(u)
    assert seen and all(d == torch.float32 for d in seen)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, rtol=0.1, atol=0.05)


def test_dynamo_traces_the_recurrence_without_graph_breaks() -> None:
    """Under train.compile the memory's chunk recurrence (its autograd function, forward and
    hand-written backward) is one graph with the model around it: a graph break there (e.g. an
    `out=` into a non-contiguous view, which Dynamo cannot trace) would run the recurrence's
    thousands of small ops eagerly inside the compiled model."""
    import torch._dynamo

    from conftest import tiny_config
    from taperlm.models import TaperedLM

    torch.manual_seed(0)
    model = TaperedLM(tiny_config(preset="titans-mag-tiny", n_layers=1, chunk_size=4))
    x = torch.randint(0, 64, (1, 13))
    torch._dynamo.reset()
    try:
        report = torch._dynamo.explain(model)(x[:, :-1], targets=x[:, 1:])
    finally:
        torch._dynamo.reset()
    assert report.graph_break_count == 0, [str(b.reason)[:200] for b in report.break_reasons]
    assert report.graph_count == 1

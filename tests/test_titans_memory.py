"""Neural long-term memory math: closed-form inner gradient, chunk-wise recurrence, fp32 state."""

from __future__ import annotations

import pytest
import torch

from taperlm.models import memory as mem
from taperlm.models.memory import (
    NeuralMemory,
    chunk_coefficients,
    memory_forward,
    run_memory,
    weighted_grads,
)


def _weights(N: int, dm: int, h: int, depth: int, dtype=torch.float64) -> list[torch.Tensor]:
    shapes = [(dm, h)] + [(h, h)] * (depth - 2) + [(h, dm)]
    g = torch.Generator().manual_seed(0)
    return [torch.randn(N, i, o, generator=g, dtype=dtype) for i, o in shapes]


@pytest.mark.parametrize("depth", [2, 3])
def test_closed_form_gradient_equals_autograd(depth: int) -> None:
    N, C, dm, h, R = 3, 5, 4, 6, 2
    W = _weights(N, dm, h, depth)
    k = torch.nn.functional.normalize(torch.randn(N, C, dm, dtype=torch.float64), dim=-1)
    v = torch.randn(N, C, dm, dtype=torch.float64)
    c = torch.rand(R, N, C, dtype=torch.float64)
    closed = weighted_grads(W, k, v, c)
    for r in range(R):
        Wr = [w.clone().requires_grad_() for w in W]
        loss = (c[r].unsqueeze(-1) * (memory_forward(Wr, k) - v) ** 2).sum()
        ref = torch.autograd.grad(loss, Wr)
        for j in range(depth):
            torch.testing.assert_close(closed[j][r], ref[j], rtol=1e-10, atol=1e-10)


def _reference(W0, q, k, v, theta, alpha, eta, chunk):
    """Token-by-token Titans recurrence; gradients at the chunk-start weights (autograd),
    reads at the chunk-start weights."""
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
            th, al, et = (x[:, t].view(N, 1, 1) for x in (theta, alpha, eta))
            S = [et * s - th * g for s, g in zip(S, grads)]
            W = [(1 - al) * w + s for w, s in zip(W, S)]
    return torch.cat(outs, 1), W, S


@pytest.mark.parametrize("chunk", [1, 4])
def test_chunkwise_equals_token_recurrence(chunk: int) -> None:
    """chunk 1: exactly the per-token recurrence; chunk 4: the cumulative-product coefficients
    reproduce per-token momentum/decay with chunk-start gradients."""
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
    out, W, S = run_memory(W0, S0, q, k, v, theta, torch.log1p(-alpha), torch.log(eta), chunk)
    ref_out, ref_W, ref_S = _reference(W0, q, k, v, theta, alpha, eta, chunk)
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


def test_outer_gradient_through_memory_gradcheck() -> None:
    """Outer backprop through the closed-form inner loop (plain autograd) is correct."""
    N, T, dm, h = 1, 4, 2, 3
    torch.manual_seed(2)
    W0 = [w.requires_grad_() for w in _weights(N, dm, h, 2)]
    q, k, v = (torch.randn(N, T, dm, dtype=torch.float64, requires_grad=True) for _ in range(3))
    gates = torch.randn(3, N, T, dtype=torch.float64, requires_grad=True)

    def f(w1, w2, q, k, v, gates):
        th = 0.1 * torch.sigmoid(gates[0])
        lk = torch.nn.functional.logsigmoid(-gates[1])
        le = torch.nn.functional.logsigmoid(gates[2])
        S0 = [torch.zeros_like(w1), torch.zeros_like(w2)]
        out, W, _ = run_memory([w1, w2], S0, q, k, v, th, lk, le, 2)
        return out.sum() + W[0].sum() + W[1].sum()

    assert torch.autograd.gradcheck(f, (*W0, q, k, v, gates))


def test_partial_last_chunk_is_a_short_chunk() -> None:
    """A stream whose length is not a multiple of the chunk: its last chunk is processed as a
    shorter chunk (same outputs and state as processing the pieces one after another)."""
    torch.manual_seed(3)
    m = NeuralMemory(16, 2, 4, 8, 2, chunk_size=4, conv_kernel=3, max_inner_lr=0.1)
    u = torch.randn(1, 6, 16)
    q, _ = m.queries(u)
    k, v, g, _ = m.keys_values(u)
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

    def spy(weights, momentum, q, k, v, *rest):
        seen.extend([weights[0].dtype, momentum[0].dtype, q.dtype, k.dtype, v.dtype])
        out, w, s = real(weights, momentum, q, k, v, *rest)
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

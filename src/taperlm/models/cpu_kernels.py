"""Hand-written CPU autograd kernels for fp32 training in eager mode (measured in
benchmarks/README.md): a closed-form RMSNorm and a blockwise cross-entropy, each making fewer
passes over memory than the composite ATen ops. `taperlm.models.layers` uses them where
`applies(x)`; on GPU and under `torch.compile` it uses the plain ops, since fused kernels and
Inductor already do better there. Both paths compute the same function (tests compare them;
`applies` is the one switch to turn the kernels off).
"""

from __future__ import annotations

import torch


def applies(x: torch.Tensor) -> bool:
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


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of fp32 `x` (any leading shape) with gain `weight`, closed-form backward."""
    return _RMSNormFn.apply(x, weight, eps)


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


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, n_valid: int) -> torch.Tensor:
    """Mean cross-entropy of fp32 `logits` [N, V] over the `n_valid` (> 0) rows whose target is
    not -100, with the gradient computed in the forward pass."""
    return _CrossEntropyFn.apply(logits, targets, n_valid)

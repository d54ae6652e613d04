"""Cross-entropy over a large vocabulary without an fp32 copy of the whole logits tensor.

`F.cross_entropy(logits.float(), targets)` on bf16 logits of a batch of 8 x 4096 tokens and a
32K vocabulary first writes a 4 GiB fp32 copy, then a log-softmax of the same size, and a
gradient of that size again. `chunked_cross_entropy` walks the rows in chunks of about
`CHUNK_ELEMENTS` values: each chunk is upcast, reduced to its log-sum-exp and target logit, and
dropped; the backward pass recomputes each chunk's softmax from the saved (bf16) logits and
writes the gradient straight into a tensor of the logits' dtype. Extra memory: one fp32 chunk
and two fp32 numbers per row. The value and gradient are the plain loss's up to fp32 rounding
(tests/training/test_scale.py).
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 24  # 64 MiB of fp32 per chunk


def _rows(vocab: int, chunk_elements: int) -> int:
    return max(1, chunk_elements // max(1, vocab))


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, rows: int) -> torch.Tensor:  # type: ignore[override]
        n = logits.shape[0]
        valid = targets != -100
        tgt = torch.where(valid, targets, 0).unsqueeze(1)
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        picked = torch.empty(n, dtype=torch.float32, device=logits.device)
        for s in range(0, n, rows):
            x = logits[s : s + rows].float()
            torch.logsumexp(x, -1, out=lse[s : s + rows])
            picked[s : s + rows] = x.gather(1, tgt[s : s + rows]).squeeze(1)
        count = valid.sum()
        ctx.save_for_backward(logits, tgt, valid, lse, count)
        ctx.rows = rows
        return ((lse - picked) * valid).sum() / count

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        logits, tgt, valid, lse, count = ctx.saved_tensors
        rows = ctx.rows
        grad = torch.empty_like(logits)
        scale = (grad_out / count).float()
        for s in range(0, logits.shape[0], rows):
            p = logits[s : s + rows].float().sub_(lse[s : s + rows].unsqueeze(1)).exp_()
            p.scatter_add_(1, tgt[s : s + rows], torch.full_like(p[:, :1], -1.0))
            p.mul_(valid[s : s + rows].unsqueeze(1) * scale)
            grad[s : s + rows] = p
        return grad, None, None


@torch.compiler.disable
def chunked_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, chunk_elements: int = CHUNK_ELEMENTS
) -> torch.Tensor:
    """Mean cross-entropy (fp32) of logits [N, V] (any float dtype) over targets [N] != -100.

    Outside torch.compile's graph on purpose (a graph break at the loss), so the chunking is
    never traced or re-fused into a whole-tensor upcast."""
    rows = _rows(logits.shape[-1], chunk_elements)
    return _ChunkedCrossEntropy.apply(logits, targets, rows)


def distillation_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """T^2 x mean over positions with targets != -100 of KL(p_teacher || p_student), both
    softmaxes at temperature T (Hinton et al. 2015), in fp32 (or the logits' wider dtype). The T^2 keeps the gradient's size
    independent of T: d/dz_student = T (softmax(z_s / T) - softmax(z_t / T)) / N per position.
    The teacher's logits carry no gradient (detached here: the teacher is never trained)."""
    vocab = student_logits.shape[-1]
    if teacher_logits.shape[-1] != vocab:
        raise ValueError(
            f"teacher vocabulary {teacher_logits.shape[-1]} != student vocabulary {vocab}"
        )
    valid = (targets != -100).reshape(-1)
    dtype = torch.promote_types(student_logits.dtype, torch.float32)  # fp32 at least
    s = student_logits.reshape(-1, vocab)[valid].to(dtype) / temperature
    t = teacher_logits.detach().reshape(-1, vocab)[valid].to(dtype) / temperature
    log_p_t = torch.log_softmax(t, dim=-1)
    log_p_s = torch.log_softmax(s, dim=-1)
    kl = (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1)
    n = max(int(valid.sum()), 1)
    return kl.sum() * (temperature * temperature / n)

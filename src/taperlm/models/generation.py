"""Sampling from a TaperedLM: temperature, top-k, top-p (nucleus), seed, EOS stop.

Uses the model's incremental-decoding cache (`model.new_cache()`: key/value caches for the
attention families, memory state and attention caches for Titans; any batch size, prompts and
steps of any length) and falls back to recomputing the whole prefix each step for a model without
one (NotImplementedError).
The context never exceeds `context_length`: past it, the oldest tokens are dropped and the
window is recomputed (no cache).

`greedy_batch` decodes many prompts greedily at once (the NIAH evaluation): prompts of equal
length share a batch, prefilled once, then decoded with the same cache (or recomputation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from taperlm.errors import ConfigError


@dataclass
class SamplingConfig:
    max_new_tokens: int = 128
    temperature: float = 1.0  # 0 = greedy
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    eos_id: int | None = None
    use_cache: bool = True

    def validate(self) -> None:
        if self.max_new_tokens < 0:
            raise ConfigError(f"--max-new-tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"--temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"--top-k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"--top-p must be in (0, 1], got {self.top_p}")


def filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Set logits outside the top-k and outside the top-p nucleus to -inf ([V] or [B, V])."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the mass *before* it already reaches top_p (keeps at least one).
        drop = (probs.cumsum(-1) - probs) >= top_p
        drop = drop.scatter(-1, order, drop)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def next_token(logits: torch.Tensor, cfg: SamplingConfig, gen: torch.Generator | None) -> int:
    """Pick the next token from last-position logits [V]."""
    if cfg.temperature == 0:
        return int(logits.argmax().item())
    logits = filter_logits(logits.float() / cfg.temperature, cfg.top_k, cfg.top_p)
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs.cpu(), 1, generator=gen).item())


@torch.no_grad()
def generate_tokens(
    model: Any, prompt: Sequence[int], cfg: SamplingConfig, device: str | torch.device = "cpu"
) -> Iterator[int]:
    """Yield new token ids one at a time (stops at EOS, which is not yielded, or the budget)."""
    cfg.validate()
    if not prompt:
        raise ValueError("the prompt is empty; give at least one token (e.g. EOS)")
    gen = None
    if cfg.seed is not None:
        gen = torch.Generator().manual_seed(cfg.seed)
    ctx_len = int(model.config.context_length)
    tokens = list(prompt)[-ctx_len:]
    cache = None
    if cfg.use_cache:
        try:
            cache = model.new_cache()
        except NotImplementedError:
            cache = None

    def run(ids: Sequence[int], with_cache: Any) -> torch.Tensor:
        x = torch.tensor([list(ids)], dtype=torch.long, device=device)
        out = model(x) if with_cache is None else model(x, cache=with_cache)
        return out.logits[0, -1]

    logits = run(tokens, cache)
    for _ in range(cfg.max_new_tokens):
        tok = next_token(logits, cfg, gen)
        if cfg.eos_id is not None and tok == cfg.eos_id:
            return
        yield tok
        tokens.append(tok)
        if len(tokens) > ctx_len:  # slide the window; the cache no longer matches positions
            tokens = tokens[-ctx_len:]
            cache = None
            logits = run(tokens, None)
        elif cache is not None:
            logits = run([tok], cache)
        else:
            logits = run(tokens, None)


def new_cache_or_none(model: Any) -> Any:
    """The model's decoding cache, or None when its family has none (then: recompute)."""
    try:
        return model.new_cache()
    except NotImplementedError:
        return None


@torch.no_grad()
def greedy_batch(
    model: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_id: int | None = None,
    batch_size: int = 8,
    device: str | torch.device = "cpu",
    use_cache: bool = True,
    dtype: torch.dtype | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> list[list[int]]:
    """Greedy continuations (token ids, EOS excluded) of every prompt, batched.

    Only prompts of equal token length share a batch (longest first, at most `batch_size`): the
    models take no attention mask, so a padded row would see its pads (left padding) or put its
    new tokens at the wrong positions (right padding); equal lengths make every row compute
    exactly what it would alone. Each batch is prefilled once, then decoded one token per step
    with the model's cache (`model.new_cache()`); a family without one recomputes the whole
    sequence every step. A row is done at `eos_id`; the batch stops when every row is done or
    after `max_new_tokens`. No context limit is applied (the caller checks lengths).
    `on_batch(rows)` is called after each batch (progress)."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("a prompt is empty; give at least one token")
    order = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), i))
    out: list[list[int]] = [[] for _ in prompts]
    dev = torch.device(device)
    start = 0
    while start < len(order):
        n = len(prompts[order[start]])
        rows = [order[start]]
        while (
            len(rows) < batch_size
            and start + len(rows) < len(order)
            and len(prompts[order[start + len(rows)]]) == n
        ):
            rows.append(order[start + len(rows)])
        start += len(rows)
        ids = torch.tensor([list(prompts[r]) for r in rows], dtype=torch.long, device=dev)
        with torch.autocast(dev.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            for r, toks in zip(rows, _greedy_rows(model, ids, max_new_tokens, eos_id, use_cache)):
                out[r] = toks
        if on_batch is not None:
            on_batch(len(rows))
    return out


def _greedy_rows(
    model: Any, ids: torch.Tensor, max_new_tokens: int, eos_id: int | None, use_cache: bool
) -> list[list[int]]:
    """Greedy decoding of one batch of equal-length prompts [B, T]."""
    cache = new_cache_or_none(model) if use_cache else None
    B = ids.shape[0]
    new = [[] for _ in range(B)]  # type: list[list[int]]
    done = torch.zeros(B, dtype=torch.bool, device=ids.device)
    seq = ids
    logits = model(ids, cache=cache, logits_to_keep=1).logits[:, -1]
    for step in range(max_new_tokens):
        tok = logits.argmax(-1)
        if eos_id is not None:
            done |= tok == eos_id
        for b, (t, d) in enumerate(zip(tok.tolist(), done.tolist())):
            if not d:
                new[b].append(t)
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        if cache is not None:
            logits = model(tok[:, None], cache=cache, logits_to_keep=1).logits[:, -1]
        else:
            seq = torch.cat((seq, tok[:, None]), 1)
            logits = model(seq, logits_to_keep=1).logits[:, -1]
    return new


def stream_text(token_iter: Iterator[int], decode: Callable[[list[int]], str]) -> Iterator[str]:
    """Turn a token stream into text pieces; holds back incomplete UTF-8 (U+FFFD at the end)."""
    ids: list[int] = []
    emitted = ""
    for tok in token_iter:
        ids.append(tok)
        text = decode(ids)
        if text.endswith("\ufffd"):
            continue
        if text.startswith(emitted):
            piece, emitted = text[len(emitted) :], text
            if piece:
                yield piece
    text = decode(ids) if ids else ""
    if text.startswith(emitted) and len(text) > len(emitted):
        yield text[len(emitted) :]

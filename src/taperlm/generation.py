"""Sampling from a TaperedLM: temperature, top-k, top-p (nucleus), seed, EOS stop.

Uses the model's incremental-decoding cache (`model.new_cache()`, attention families) and falls
back to recomputing the whole prefix each step when a family has none (NotImplementedError).
The context never exceeds `context_length`: past it, the oldest tokens are dropped and the
window is recomputed (no cache).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch


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
        from taperlm.errors import ConfigError

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

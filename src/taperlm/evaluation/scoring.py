"""Batched log-likelihood scoring with lm-evaluation-harness's conventions.

- `encode_pair`: trailing spaces of the context move to the continuation; the continuation's
  tokens are the tail of the tokenized whole string (so BPE merges across the boundary match);
  an empty context is replaced by the prefix token (EOS).
- `loglikelihood`: the model sees `(context + continuation)[-(max_length + 1):][:-1]`
  (contexts left-truncated, the continuation kept), requests are sorted longest first and
  right-padded into batches; returns (sum log p(continuation), greedy?) per request.
- `rolling_windows`: disjoint prediction windows of `max_length` tokens; the first is
  conditioned on the prefix token, later ones on up to `max_length` preceding tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from taperlm.errors import DataError
from taperlm.runtime.progress import progress_bar


class Tokenizer(Protocol):
    eos_id: int

    def encode(self, text: str) -> list[int]: ...


class HFTokenizerAdapter:
    """A `transformers` tokenizer seen through our tokenizer interface (no special tokens)."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.eos_id = tok.eos_token_id
        self.bos_id = tok.bos_token_id
        self.vocab_size = len(tok)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)


Pair = tuple[list[int], list[int]]


def rolling_windows(tokens: Sequence[int], prefix: int, max_length: int) -> list[Pair]:
    """(context, continuation) token windows that together predict every token once.

    Window 1 predicts tokens[:L] from [prefix] + tokens[:L-1]; each later window predicts the
    next <= L tokens and is conditioned on the tokens right before them, so that context plus
    continuation fills L + 1 positions (the scorer drops the last one)."""
    tokens = list(tokens)
    if not tokens:
        return []
    L = max_length
    first = min(L, len(tokens))
    out: list[Pair] = [([prefix], tokens[:first])]
    done = first
    while done < len(tokens):
        n = min(len(tokens) - done, L)
        end = done + n
        ctx_start = max(end - L - 1, 0)
        out.append((tokens[ctx_start:done], tokens[done:end]))
        done = end
    return out


class Scorer:
    """Log-likelihoods of token continuations under a causal LM.

    model: any module whose `model(idx).logits` is [B, T, V] (TaperedLM or a transformers LM).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Tokenizer,
        max_length: int,
        batch_size: int = 16,
        device: str | torch.device = "cpu",
        progress: bool = True,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.model = model
        self.tok = tokenizer
        self.max_length = int(max_length)
        self.batch_size = max(1, int(batch_size))
        self.device = torch.device(device)
        self.progress = progress
        self.dtype = dtype  # autocast dtype (None = the model's own precision)
        # lm-eval's prefix token: BOS when the tokenizer has one, else EOS.
        bos = getattr(tokenizer, "bos_id", None)
        self.prefix = int(tokenizer.eos_id if bos is None else bos)

    # -- tokenization --------------------------------------------------------------------------
    def encode_pair(self, context: str, continuation: str) -> Pair:
        if context == "":
            cont = self.tok.encode(continuation)
            if cont and cont[0] == self.prefix:
                return cont[:1], cont[1:]
            return [self.prefix], cont
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        whole = self.tok.encode(context + continuation)
        ctx = self.tok.encode(context)
        return ctx, whole[len(ctx) :]

    # -- model ---------------------------------------------------------------------------------
    @torch.no_grad()
    def _logprobs(self, batch: torch.Tensor) -> torch.Tensor:
        with torch.autocast(
            device_type=self.device.type,
            dtype=self.dtype or torch.float32,
            enabled=self.dtype is not None,
        ):
            logits = self.model(batch).logits
        return F.log_softmax(logits.float(), dim=-1)

    def loglikelihood(
        self, pairs: Sequence[Pair], desc: str = "loglikelihood"
    ) -> list[tuple[float, bool]]:
        """Sum log p(continuation | context) and whether greedy decoding reproduces it.

        A continuation longer than max_length (where lm-eval stops with an assertion) is scored
        in consecutive chunks of max_length tokens, each conditioned on what precedes it; the
        chunk log-likelihoods add up and the greedy flags are and-ed. Shorter requests are
        scored exactly as lm-eval scores them."""
        L = self.max_length
        flat: list[Pair] = []
        owner: list[int] = []
        for k, (ctx, cont) in enumerate(pairs):
            if not cont:
                raise DataError(f"{desc}: a continuation tokenizes to nothing; check the eval file")
            for s in range(0, len(cont), L):
                flat.append((list(ctx) + list(cont[:s]), list(cont[s : s + L])))
                owner.append(k)
        scored = self._score(flat, desc)
        out: list[list] = [[0.0, True] for _ in pairs]
        for k, (ll, greedy) in zip(owner, scored):
            out[k][0] += ll
            out[k][1] = out[k][1] and greedy
        return [(ll, greedy) for ll, greedy in out]

    def _score(self, pairs: Sequence[Pair], desc: str) -> list[tuple[float, bool]]:
        L = self.max_length
        order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
        results: list[tuple[float, bool] | None] = [None] * len(pairs)
        bar = progress_bar(
            total=len(pairs),
            desc=desc,
            unit="req",
            disable=not self.progress,
            dynamic_ncols=True,
            leave=False,
        )
        for start in range(0, len(order), self.batch_size):
            idxs = order[start : start + self.batch_size]
            inputs, conts = [], []
            for i in idxs:
                ctx, cont = pairs[i]
                inputs.append((ctx + cont)[-(L + 1) :][:-1])
                conts.append(cont)
            width = max(len(x) for x in inputs)
            batch = torch.zeros(len(inputs), width, dtype=torch.long)
            for r, x in enumerate(inputs):
                batch[r, : len(x)] = torch.tensor(x, dtype=torch.long)
            logp = self._logprobs(batch.to(self.device))
            for r, i in enumerate(idxs):
                n, cont = len(inputs[r]), conts[r]
                lp = logp[r, n - len(cont) : n]
                target = torch.tensor(cont, dtype=torch.long, device=lp.device)
                ll = lp.gather(-1, target[:, None]).sum().item()
                greedy = bool((lp.argmax(-1) == target).all().item())
                results[i] = (ll, greedy)
            bar.update(len(idxs))
        bar.close()
        return results  # type: ignore[return-value]

    def loglikelihood_rolling(
        self, token_lists: Sequence[Sequence[int]], desc: str = "rolling"
    ) -> list[float]:
        """Total log-likelihood of each token list, every token predicted once (see module doc)."""
        windows, owner = [], []
        for d, toks in enumerate(token_lists):
            for w in rolling_windows(toks, self.prefix, self.max_length):
                windows.append(w)
                owner.append(d)
        lls = self.loglikelihood(windows, desc=desc)
        totals = [0.0] * len(token_lists)
        for d, (ll, _) in zip(owner, lls):
            totals[d] += ll
        return totals

    @torch.no_grad()
    def token_losses(
        self, tokens: torch.Tensor, desc: str = "val", max_windows: int | None = None
    ) -> tuple[float, int, list[float]]:
        """Mean next-token loss over non-overlapping windows of max_length + 1 tokens of a 1-D
        token stream (each window predicts max_length tokens). Returns (total nll, tokens,
        per-window mean losses)."""
        L = self.max_length
        n_win = (len(tokens) - 1) // L
        if max_windows is not None:
            n_win = min(n_win, max_windows)
        total, count, per = 0.0, 0, []
        bar = progress_bar(
            total=n_win, desc=desc, unit="win", disable=not self.progress, leave=False
        )
        for s in range(0, n_win, self.batch_size):
            rows = range(s, min(s + self.batch_size, n_win))
            chunk = torch.stack([tokens[r * L : r * L + L + 1] for r in rows]).long()
            logp = self._logprobs(chunk[:, :-1].to(self.device))
            nll = -logp.gather(-1, chunk[:, 1:, None].to(logp.device)).squeeze(-1)
            total += nll.sum().item()
            count += nll.numel()
            per.extend(nll.mean(-1).tolist())
            bar.update(len(rows))
        bar.close()
        return total, count, per


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0

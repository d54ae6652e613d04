"""A model that can pass S-NIAH: a 2-layer Transformer++ trained here on a synthetic retrieval
corpus (niah_single_1 items with their answers, plus digit copy drills; tests/evaluation/niah_helpers.py)
scores >= 90% on niah_single_1 at 256 and 512 tokens through `run_niah` (what `taperlm eval`
runs), and ~0 on the same items with the needle taken out, while still answering with a number.
Slow: ~2-3 minutes of training on one core."""

from __future__ import annotations

import random
import re

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_config
from niah_helpers import copy_drill, digit_pair_tokenizer, needle_example
from taperlm.evaluation import niah
from taperlm.evaluation.suite import niah_generate, run_niah
from taperlm.models import TaperedLM

pytestmark = pytest.mark.slow

STEPS, WARMUP, DECAY_FROM = 900, 50, 650  # constant lr between warmup and the linear decay
LR = 3e-3
NEEDLES, DRILLS = 8, 16  # examples per step
MAX_LINES = 10  # haystack lines of the training items (niah_single_1 fits 10 at 512 tokens)
PROMPT_WEIGHT = 0.1  # loss weight of the prompt tokens; the answer's (and EOS's) is 1
LENGTHS, LIMIT = [256, 512], 50


def _batch(examples: list[tuple[str, str]], tok) -> tuple[torch.Tensor, ...]:
    """Inputs, targets and loss weights of (prompt, answer) texts, each ending in EOS."""
    rows = []
    for prompt, answer in examples:
        p = tok.encode(prompt)
        rows.append((p, [*tok.encode(prompt + answer)[len(p) :], tok.eos_id]))
    T = max(len(p) + len(a) for p, a in rows) - 1
    x = torch.full((len(rows), T), tok.eos_id)
    y = torch.full((len(rows), T), -100)
    w = torch.zeros(len(rows), T)
    for i, (p, a) in enumerate(rows):
        ids = torch.tensor(p + a)
        n = len(ids) - 1
        x[i, :n], y[i, :n] = ids[:-1], ids[1:]
        w[i, :n] = PROMPT_WEIGHT
        w[i, len(p) - 1 : n] = 1.0
    return x, y, w


def _loss(model: TaperedLM, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    x, y, w = batch
    logits = model(x).logits
    nll = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none", ignore_index=-100)
    return (nll * w.flatten()).sum() / w.sum()


def _lr(step: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    if step < DECAY_FROM:
        return LR
    return LR * (0.1 + 0.9 * (STEPS - step) / (STEPS - DECAY_FROM))


@pytest.fixture(scope="module")
def trained():
    tok = digit_pair_tokenizer()
    # Larger init than the presets' 0.02: at 0.02 this 64-wide model sat on the copy plateau
    # for 1000+ steps; at 0.1 the induction head forms in ~500.
    cfg = tiny_config(
        preset="transformer-tiny",
        vocab_size=tok.vocab_size,
        d_model=64,
        n_heads=4,
        n_layers=2,
        mlp_width=256,
        context_length=512,
        init_std=0.1,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = TaperedLM(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.0)
        rng = random.Random(1)
        for step in range(STEPS):
            for group in opt.param_groups:
                group["lr"] = _lr(step)
            opt.zero_grad(set_to_none=True)
            _loss(model, _batch([copy_drill(rng) for _ in range(DRILLS)], tok)).backward()
            needles = [needle_example(rng, MAX_LINES) for _ in range(NEEDLES)]
            _loss(model, _batch(needles, tok)).backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval(), tok


def test_tokenizer_cuts_numbers_into_digit_pairs() -> None:
    tok = digit_pair_tokenizer()
    pieces = [tok.decode([i]) for i in tok.encode("is: 9152513. is 9152513.")]
    assert pieces == [
        "is",
        ":",
        " ",
        "91",
        "52",
        "51",
        "3",
        ".",
        " is",
        " ",
        "91",
        "52",
        "51",
        "3",
        ".",
    ]
    vocab = tok.backend.get_vocab()
    assert all(f"{a}{b}" in vocab for a in "0123456789" for b in "0123456789")


def test_trained_model_finds_the_needle(trained) -> None:
    model, tok = trained
    res = run_niah(model, tok, "niah_single_1", LENGTHS, limit=LIMIT, batch_size=25, progress=False)
    assert res.counts == {"256": LIMIT, "512": LIMIT}
    assert res.metrics["256"] >= 0.9, res.metrics
    assert res.metrics["512"] >= 0.9, res.metrics


def test_without_the_needle_the_score_is_near_zero(trained) -> None:
    model, tok = trained
    codec = niah.TokenizerCodec(tok)
    data = niah.Generator("niah_single_1", lambda t: len(codec.encode(t))).lengths(LENGTHS, LIMIT)
    samples = [s for d in data.values() for s in d.samples]
    for s in samples:
        key = s.gen_prefix.split()[5]
        needle = niah.NEEDLE.format(kinds="numbers", key=key, value=s.answers[0])
        assert s.input.count(needle + "\n") == 1
        s.input = s.input.replace(needle + "\n", "")
    records = niah_generate(model, codec, samples, batch_size=25, progress=False)
    assert sum(r["score"] for r in records) / len(records) <= 0.02
    # It still answers with a 7-digit number; it just has none to copy.
    numbers = sum(bool(re.search(r"\d{7}", r["prediction"])) for r in records)
    assert numbers >= 0.9 * len(records), [r["prediction"] for r in records[:5]]

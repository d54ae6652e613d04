"""Helpers for the NIAH tests (no tests here): a synthetic retrieval corpus in RULER's S-NIAH
format, a byte-level BPE tokenizer trained on it (short prompts, so tiny lengths fit), and tiny
models sized for that tokenizer."""

from __future__ import annotations

import random
from functools import lru_cache

from taperlm.evaluation import niah

FILLER_WORDS = (
    "the a river stone light green old small quiet road house window field cloud rain "
    "morning evening walks sees holds finds over under near with and but then slowly"
).split()


def random_sentence(rng: random.Random) -> str:
    return " ".join(rng.choices(FILLER_WORDS, k=rng.randint(4, 12))).capitalize() + "."


def retrieval_document(rng: random.Random, max_lines: int, with_answer: bool = True) -> str:
    """A key-value needle among `0..max_lines` filler lines, RULER's question and answer prefix,
    then the answer: what a model must learn to pass S-NIAH-1. The filler repeats RULER's line
    or one or two random sentences of this document, so most of it is predictable only by
    copying from earlier in the context (which teaches the copying the answer needs)."""
    keys = niah.key_words()
    key = keys[rng.randrange(len(keys))]
    value = str(rng.randint(10**6, 10**7 - 1))
    if rng.random() < 0.4:
        pool = [niah.REPEAT_LINE]
    else:
        pool = [random_sentence(rng) for _ in range(rng.randint(1, 2))]
    lines = [rng.choice(pool) for _ in range(rng.randint(0, max_lines))]
    needle = niah.NEEDLE.format(kinds="numbers", key=key, value=value)
    lines.insert(rng.randint(0, len(lines)), needle)
    text = niah.TEMPLATE.format(kind="number", context="\n".join(lines), query=key)
    text += " " + niah.GEN_PREFIX.format(kind="number", query=key)
    return text + (f" {value}." if with_answer else "")


def retrieval_corpus(n: int, max_lines: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [retrieval_document(rng, max_lines) for _ in range(n)]


@lru_cache(maxsize=1)
def niah_tokenizer():
    """BPE-1024 trained on the retrieval corpus: the S-NIAH template is ~40 tokens."""
    from taperlm.data.tokenizer import train_bpe

    return train_bpe(retrieval_corpus(400, 8, seed=7), 1024)


def niah_model(family: str = "transformer", context_length: int = 512, seed: int = 0):
    """A tiny random model (2 layers, d_model 32) over `niah_tokenizer()`'s vocabulary."""
    from test_eval_helpers import tiny_model

    return tiny_model(
        family,
        context_length=context_length,
        seed=seed,
        vocab_size=niah_tokenizer().vocab_size,
    )

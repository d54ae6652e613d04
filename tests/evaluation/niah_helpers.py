"""Helpers for the NIAH tests (no tests here): a synthetic retrieval corpus in RULER's S-NIAH
format, byte-level BPE tokenizers trained on it (short prompts, so tiny lengths fit), tiny models
sized for them, and the training examples of the trained-model test (niah_single_1 items with
their answers, digit copy drills)."""

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
    from eval_helpers import tiny_model

    return tiny_model(
        family,
        context_length=context_length,
        seed=seed,
        vocab_size=niah_tokenizer().vocab_size,
    )


@lru_cache(maxsize=1)
def digit_pair_tokenizer():
    """BPE-1024 on the retrieval corpus that cuts every digit run into pairs before merging
    ("9152513" -> 91 52 51 3), in the needle and in the answer alike. Copying a number is then
    copying tokens that rarely repeat within it, which one induction head does; with single
    digits (10 symbols) the next digit is ambiguous and the copy needs a longer match."""
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
    from tokenizers import Tokenizer as Backend

    from taperlm.data.tokenizer import EOS_TOKEN, Tokenizer

    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\d{1,2}"), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        min_frequency=2,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(retrieval_corpus(400, 8, seed=7), trainer=trainer)
    return Tokenizer(backend, kind="bpe", spec="bpe:1024+digit-pairs", eos_token=EOS_TOKEN)


def needle_example(rng: random.Random, max_lines: int) -> tuple[str, str]:
    """(prompt, answer) of a niah_single_1 item as RULER writes it: the needle among 1..max_lines
    copies of the repeated line, the question, the answer prefix; answer " VALUE."."""
    keys = niah.key_words()
    key = keys[rng.randrange(len(keys))]
    value = str(rng.randint(10**6, 10**7 - 1))
    lines = [niah.REPEAT_LINE] * rng.randint(1, max_lines)
    lines.insert(
        rng.randint(0, len(lines)), niah.NEEDLE.format(kinds="numbers", key=key, value=value)
    )
    text = niah.TEMPLATE.format(kind="number", context="\n".join(lines), query=key)
    return text + " " + niah.GEN_PREFIX.format(kind="number", query=key), f" {value}."


def copy_drill(rng: random.Random, max_digits: int = 48) -> tuple[str, str]:
    """(prompt, answer) = (" N.", " N.") for a random number N of max_digits/2..max_digits
    digits: every answer token is a copy from a varying distance, a dense signal that makes the
    induction head form in a few hundred steps (the needle items alone give ~5 such tokens per
    ~200, and a tiny model trained on them alone stays at chance)."""
    digits = "".join(
        rng.choice("0123456789") for _ in range(rng.randint(max_digits // 2, max_digits))
    )
    return f" {digits}.", f" {digits}."

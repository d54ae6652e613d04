"""Helpers for the evaluation/export/generation tests: tiny eval files in every local format,
a tiny byte-level BPE tokenizer trained on them, and tiny random models. (No tests here.)"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from conftest import tiny_config

# WikiText raw layout: " = Title = " headings, blank lines are a single space.
WIKI = "\n".join(
    [
        " ",
        " = Alpha Beta = ",
        " ",
        ' Alpha Beta is a test article . It has 2 @,@ 000 words , " quoted " text and '
        "( brackets ) . ",
        " ",
        " = = History = = ",
        " ",
        " The history of Alpha 's town began in 1900 @-@ 1910 . N people lived there ; many "
        "left ! ",
        " ",
        " = Gamma = ",
        " ",
        " Gamma is another page . It is short . ",
        "",
    ]
)

LAMBADA = [
    {"context": "The cat sat on the", "continuation": "mat"},
    {"context": "She opened the door and saw her old friend", "continuation": "Tom"},
    {"context": 'He said:\n\n"Go home now,', "continuation": "please"},
]
PIQA = [
    {"goal": "How to boil water?", "sol1": "Put it in a pot on the stove.", "sol2": "Freeze it."},
    {"goal": "Open a jar", "sol1": "Twist the lid.", "sol2": "Paint the lid."},
]
PIQA_LABELS = ["0", "0"]
HELLASWAG = [
    "Cooking: A man stands in a kitchen. he",
    "2",
    "flies away.",
    "sings a song.",
    "picks up a knife.",
    "paints [title] the wall.",
    "Sports: A girl holds a ball. she",
    "0",
    "throws the ball.",
    "eats the ball.",
    "reads the ball.",
    "sleeps.",
]
WINOGRANDE = [
    {
        "context_options": ["Ann gave Bea a gift because Ann", "Ann gave Bea a gift because Bea"],
        "continuation": "was generous.",
        "gold": 0,
    },
    {
        "context_options": [
            "The cup fell off the table since the cup",
            "The cup fell off the table since the table",
        ],
        "continuation": "was tilted.",
        "gold": 1,
    },
]
ARC = [
    {
        "query": "Question: What do plants need?",
        "choices": ["light", "rocks", "noise", "plastic"],
        "gold": 0,
    },
    {
        "query": "Question: Which is a planet?",
        "choices": ["Moon", "Sun", "Mars", "Comet"],
        "gold": 2,
    },
]
SIQA = [
    {
        "context": "Tracy stayed home.",
        "question": "Why did Tracy do this?",
        "options": ["to rest", "to run", "to fly"],
        "answer": "to rest",
        "metadata": {},
    },
    {
        "context": "Kai fed the dog.",
        "question": "How would Kai feel?",
        "options": ["angry", "caring", "lost"],
        "answer": "caring",
        "metadata": {},
    },
]
BOOLQ = [
    {
        "query": "Passage: Water boils at 100 degrees.\nQuestion: does water boil at 100 degrees?",
        "choices": ["no", "yes"],
        "gold": 1,
    },
    {
        "query": "Passage: Cats are mammals.\nQuestion: are cats birds?",
        "choices": ["no", "yes"],
        "gold": 0,
    },
]

COUNTS = {
    "wikitext": 2,
    "lambada_openai": 3,
    "piqa": 2,
    "hellaswag": 2,
    "winogrande": 2,
    "arc_easy": 2,
    "arc_challenge": 2,
    "social_iqa": 2,
    "boolq": 2,
}


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def write_eval_files(root: Path) -> Path:
    """A data dir laid out like ../shared/data with a few items per task."""
    (root / "wikitext-2").mkdir(parents=True, exist_ok=True)
    (root / "wikitext-2" / "wiki.test.raw").write_text(WIKI, encoding="utf-8")
    _jsonl(root / "lambada" / "lambada_openai.jsonl", LAMBADA)
    _jsonl(root / "piqa" / "valid.jsonl", PIQA)
    (root / "piqa" / "valid-labels.lst").write_text("\n".join(PIQA_LABELS) + "\n")
    (root / "hellaswag").mkdir(exist_ok=True)
    (root / "hellaswag" / "hellaswag_val_full.txt").write_text("\n".join(HELLASWAG) + "\n")
    _jsonl(root / "winogrande" / "winogrande_dev.jsonl", WINOGRANDE)
    _jsonl(root / "arc" / "arc_easy_test.jsonl", ARC)
    _jsonl(root / "arc" / "arc_challenge_test.jsonl", ARC[::-1])
    _jsonl(root / "siqa" / "dev.jsonl", SIQA)
    _jsonl(root / "boolq" / "boolq_dev.jsonl", BOOLQ)
    return root


def corpus_text() -> list[str]:
    rows = [WIKI, *HELLASWAG]
    for group in (LAMBADA, PIQA, WINOGRANDE, ARC, SIQA, BOOLQ):
        rows += [json.dumps(r) for r in group]
    return rows * 3 + ["Question: Answer: Q: A: the a of and to is in"] * 5


@lru_cache(maxsize=1)
def tiny_tokenizer():
    """taperlm's own byte-level BPE (EOS id 0), trained on the fixture text."""
    from taperlm.data.tokenizer import train_bpe

    return train_bpe(corpus_text(), 400)


def tiny_model(family: str = "transformer", context_length: int = 128, seed: int = 0, **kw):
    import torch

    from taperlm.models import TaperedLM

    fields = dict(
        vocab_size=tiny_tokenizer().vocab_size, n_heads=2, n_layers=2, context_length=context_length
    )
    cfg = tiny_config(preset=f"{family}-tiny", **{**fields, **kw})
    torch.manual_seed(seed)
    return TaperedLM(cfg).eval()

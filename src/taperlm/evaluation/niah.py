"""RULER's single needle-in-a-haystack tasks (S-NIAH-1/2/3) as lm-evaluation-harness 0.4.x
builds them (`niah_single_1/2/3` of its `ruler` tasks): the data, the prompt and the score.
No torch import; the model side is `taperlm.evaluation.suite.run_niah`.

Every item hides one needle "One of the special magic numbers for <key> is: <value>." in a
haystack, asks for the value and lets the model continue the answer prefix:

- niah_single_1: the needle among copies of one repeated line (the pass-key test); value a
  7-digit number.
- niah_single_2: the needle between sentences of prose at a depth drawn from 40 depths spread
  evenly over 0-100% of the text; value a 7-digit number.
- niah_single_3: as niah_single_2 with a UUID value.

Facts of RULER / lm-eval followed exactly: the template, needle and answer prefix strings; keys
drawn from wonderwords' adjective-noun pairs (`KeyWords`); one `random.Random(seed)` stream for
all lengths of a task, in order, with lm-eval's sequence of draws (seed 0 = lm-eval's default
`random_seed`); the haystack sized with the model's own tokenizer so that the input plus 128
generated tokens fits the length (`fit_haystack`: haystack units added in steps of 5 lines (25 from
4096 tokens) or 500 words, each item shrunk by the same step until it fits); 500 items per length;
the score = the fraction of answers found, case-insensitively, in the stripped generation
(`string_match_all`).

The deviation: RULER's prose is Paul Graham's essays, downloaded at run time. We are offline,
so the default prose ships with Python itself: the prose paragraphs of the Python language
reference in CPython's standard library (`pydoc_data.topics`, see `python_docs_prose`; any text,
WikiText-2, or the essays themselves with `hf:baber/paul_graham_essays` on request), and sentences
are split by a small rule (`split_sentences`) instead of NLTK's Punkt model, which needs a
download.
"""

from __future__ import annotations

import bisect
import hashlib
import platform
import random
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from taperlm.data.corpus import open_source, read_text_file
from taperlm.errors import ConfigError, DataError
from taperlm.evaluation.locate import WIKITEXT_TEST
from taperlm.evaluation.tasks import wikitext_detokenize

TASKS = ("niah_single_1", "niah_single_2", "niah_single_3")
NUM_SAMPLES = 500  # items per length (RULER's num_samples in lm-eval)
MAX_NEW_TOKENS = 128  # RULER's tokens_to_generate = lm-eval's max_gen_toks
DEFAULT_LENGTHS = (4096, 8192, 16384)  # the paper's Table 3

# The single-needle form of RULER's template (its "Some ... are all ..." text with one needle
# and one query put in the singular, as RULER does), the needle, the answer prefix.
TEMPLATE = (
    "A special magic {kind} is hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {kind} afterwards.\n{context}\n"
    "What is the special magic {kind} for {query} mentioned in the provided text?"
)
NEEDLE = "One of the special magic {kinds} for {key} is: {value}."
GEN_PREFIX = "The special magic {kind} for {query} mentioned in the provided text is"
REPEAT_LINE = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
)
# Needle depths in percent: 40 evenly spaced from 0 to 100, rounded (numpy's linspace + round).
DEPTHS = [round(k * 100 / 39) for k in range(40)]


@dataclass(frozen=True)
class TaskSpec:
    haystack: str  # "repeat" | "essay"
    values: str  # "numbers" | "uuids"

    @property
    def kind(self) -> str:
        return self.values[:-1]


SPECS = {
    "niah_single_1": TaskSpec("repeat", "numbers"),
    "niah_single_2": TaskSpec("essay", "numbers"),
    "niah_single_3": TaskSpec("essay", "uuids"),
}


def parse_lengths(text: str, option: str = "--niah-lengths") -> list[int]:
    """Comma-separated NIAH lengths: positive integers, in the order given (the order fixes the
    items); ConfigError naming `option` otherwise."""
    out: list[int] = []
    for part in (x.strip() for x in text.split(",")):
        if not part:
            continue
        try:
            n = int(part)
        except ValueError:
            raise ConfigError(f"{option}: {part!r} is not a whole number of tokens") from None
        if n < 1:
            raise ConfigError(f"{option}: {n} must be a positive number of tokens")
        if n in out:
            raise ConfigError(f"{option}: {n} is given twice")
        out.append(n)
    if not out:
        raise ConfigError(f"{option} is empty; give e.g. 4096,8192,16384")
    return out


def length_label(length: int) -> str:
    """4096 -> "4K", 16384 -> "16K", 256 -> "256" (column names of the paper table)."""
    return f"{length // 1024}K" if length % 1024 == 0 else str(length)


# ----------------------------------------------------------------------------------------------
# keys: sorted(set(f"{adjective}-{noun}")) over wonderwords' lists, indexable without building it


class KeyWords(Sequence[str]):
    """The sorted set of strings `f"{adjective}-{noun}"` (RULER's key words, 6.2M of them with
    wonderwords' lists), indexed without materializing it (`random.choice` only needs len and
    indexing).

    Strings of two adjectives interleave in sorted order only when one adjective's "adj-" starts
    another's ("blue-" and "blue-eyed-"); such clusters are materialized (sorted, deduplicated),
    every other adjective is one block of its nouns in sorted order."""

    def __init__(self, adjectives: Iterable[str], nouns: Iterable[str]) -> None:
        self._nouns = sorted(set(nouns))
        keys = sorted({a + "-" for a in adjectives})
        clusters: list[list[str]] = []
        for key in keys:
            if clusters and key.startswith(clusters[-1][0]):
                clusters[-1].append(key)
            else:
                clusters.append([key])
        self._starts: list[int] = []
        self._blocks: list[str | list[str]] = []
        total = 0
        for cluster in clusters:
            if len(cluster) == 1:
                block: str | list[str] = cluster[0]
                size = len(self._nouns)
            else:
                block = sorted({k + n for k in cluster for n in self._nouns})
                size = len(block)
            self._starts.append(total)
            self._blocks.append(block)
            total += size
        self._len = total

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> str:  # type: ignore[override]
        if not isinstance(i, int):
            raise TypeError("KeyWords supports integer indices only")
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(i)
        b = bisect.bisect_right(self._starts, i) - 1
        block, offset = self._blocks[b], i - self._starts[b]
        return block[offset] if isinstance(block, list) else block + self._nouns[offset]


@lru_cache(maxsize=1)
def key_words() -> KeyWords:
    """RULER's key words: wonderwords' default adjective and noun lists, read the way lm-eval's
    RULER code reads them (`RandomWord()._categories`)."""
    try:
        from wonderwords import RandomWord  # lazy: a missing install gets the DataError below
    except ImportError:
        raise DataError(
            "the NIAH tasks draw their keys from the `wonderwords` word lists, as RULER does: "
            "pip install wonderwords (a dependency of taperlm; reinstall it)"
        ) from None
    categories = getattr(RandomWord(), "_categories", None)
    if not isinstance(categories, dict) or not {"adjectives", "nouns"} <= set(categories):
        raise DataError(
            "this wonderwords version keeps its word lists elsewhere; install wonderwords 2.2-3.x"
        )
    return KeyWords(categories["adjectives"], categories["nouns"])


# ----------------------------------------------------------------------------------------------
# the prose haystack


@dataclass
class Haystack:
    """Prose as RULER's word list: whitespace runs collapsed to one space, split on spaces."""

    words: list[str]
    source: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_texts(cls, texts: Iterable[str], source: dict[str, Any] | None = None) -> Haystack:
        words = re.sub(r"\s+", " ", " ".join(texts)).split(" ")
        return cls(words=words, source=dict(source or {}) | {"words": len(words)})


_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
# Words whose period does not end a sentence (besides single letters: initials).
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr mt gen col lt sgt capt rev hon vs etc e.g i.e no fig vol "
    "inc ltd co corp dept est approx u.s u.k jan feb mar apr jun jul aug sep sept oct nov dec".split()
)


def split_sentences(text: str) -> list[str]:
    """Sentences of whitespace-normalized prose: a sentence ends at . ! or ? (with any closing
    quotes or brackets) followed by a space and a capital, a digit or an opening quote, unless
    the period closes an initial or a common abbreviation ("Mr.", "e.g."). Joining the sentences
    with single spaces gives the text back."""
    out, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        if text[m.start() - 1] == "." and m.group(0).strip() == "":
            word = text[start : m.start()].rsplit(" ", 1)[-1].lstrip("\"'([")
            stem = word[:-1].lower()
            if (len(stem) == 1 and stem.isalpha()) or stem in _ABBREVIATIONS:
                continue
        out.append(text[start : m.start()] + m.group(0).rstrip())
        start = m.end()
    if start < len(text):
        out.append(text[start:])
    return out


def wikitext_prose(raw: str) -> list[str]:
    """The paragraphs of a WikiText raw file as plain prose: headings and blank lines dropped,
    lm-eval's WikiText detokenization applied."""
    paras = []
    for line in raw.split("\n"):
        s = line.strip()
        if s and not (s.startswith("=") and s.endswith("=")):
            paras.append(wikitext_detokenize(line).strip())
    return paras


DEFAULT_HAYSTACK = "python-docs"
_UNDERLINE = re.compile(r"[*=\-~^\"]+")


def python_docs_prose() -> list[str]:
    """The prose paragraphs of the Python language reference as CPython's standard library ships
    it for `help()` (`pydoc_data.topics`, ~33K words in 3.11), topics in sorted order: blocks
    separated by blank lines that start unindented and end like a sentence, headings and
    indented code or grammar dropped, lines joined with spaces."""
    try:
        from pydoc_data.topics import topics  # lazy: some Pythons lack it (DataError below)
    except ImportError:  # some distributions split it off (Debian keeps it in libpython3.x-stdlib)
        raise DataError(
            "niah: the default haystack is the Python language reference of the standard "
            "library (pydoc_data.topics), which this Python lacks; pass --niah-haystack "
            "PATH|wikitext|hf:NAME"
        ) from None
    paragraphs = []
    for name in sorted(topics):
        for block in re.split(r"\n[ \t]*\n", topics[name]):
            lines = block.split("\n")
            if not lines[0] or lines[0][0].isspace() or _UNDERLINE.fullmatch(lines[-1].strip()):
                continue
            text = " ".join(line.strip() for line in lines)
            if text[-1] in ".!?:":
                paragraphs.append(text)
    return paragraphs


def load_haystack(spec: str, data_dir: str | Path | None, max_chars: int) -> Haystack:
    """The prose of S-NIAH-2/3.

    spec "python-docs" (default, always present): `python_docs_prose`, the Python language
    reference of the standard library (enough for ~40K tokens); "wikitext": the WikiText-2 test
    articles of the evaluation data dir (`wikitext-2/wiki.test.raw`, ~200K words, enough for
    ~250K tokens); otherwise a `taperlm prepare --source` value: a .txt/.jsonl file or folder,
    `default` (the built-in corpus) or `hf:NAME` (e.g. `hf:baber/paul_graham_essays`, RULER's own
    essays, as lm-eval loads them). Documents are joined with spaces, at most `max_chars`
    characters are read."""
    if spec == DEFAULT_HAYSTACK:
        text = " ".join(python_docs_prose())[:max_chars]
        source = {
            "spec": spec,
            "module": "pydoc_data.topics",
            "python": platform.python_version(),
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
        }
        return Haystack.from_texts([text], source)
    if spec == "wikitext":
        if data_dir is None:
            raise DataError(
                "niah: the default haystack is the WikiText-2 test text of the evaluation data; "
                "pass --data-dir DIR (laid out like ../shared/data), set TAPERLM_EVAL_DATA, or "
                "give another prose source with --niah-haystack PATH|default|hf:NAME"
            )
        path = Path(data_dir) / WIKITEXT_TEST
        if not path.is_file():
            raise DataError(
                f"niah: haystack file {path} does not exist; point --data-dir at a folder laid "
                "out like ../shared/data or pass --niah-haystack PATH|default|hf:NAME"
            )
        return Haystack.from_texts(
            wikitext_prose(read_text_file(path, max_chars)),
            {"spec": spec, "path": str(path.resolve())},
        )
    source = open_source(spec)
    texts = [d.text for d in source.documents(max_chars=max_chars)]
    return Haystack.from_texts(texts, source.describe())


def check_haystack(haystack: Haystack, count_tokens: Callable[[str], int], length: int) -> None:
    """Before any item runs: DataError unless the whole haystack, in the template, reaches
    `length` tokens with the 128 generated (what `Generator.fit_haystack` needs)."""
    text = TEMPLATE.format(kind="number", context=" ".join(haystack.words), query="key")
    have = count_tokens(text) + MAX_NEW_TOKENS
    if have < length:
        raise DataError(
            f"niah: the haystack ({len(haystack.words)} words, "
            f"{haystack.source.get('spec', '?')}) fills only {have} of the {length} tokens of "
            "niah_single_2/3; give longer prose with --niah-haystack PATH|wikitext|hf:NAME or "
            "shorter --niah-lengths"
        )


# ----------------------------------------------------------------------------------------------
# items


@dataclass
class Sample:
    """One item. `input` is RULER's text and `prompt` what the model continues (lm-eval joins
    them with the task's target delimiter, a space)."""

    task: str
    length: int  # the requested sequence length
    index: int  # RULER's item index at this length (skipped items leave gaps)
    input: str
    gen_prefix: str
    answers: list[str]
    input_tokens: int  # tokens of `input` (RULER's `length` field minus the 128 generated)

    @property
    def prompt(self) -> str:
        return self.input + " " + self.gen_prefix


@dataclass
class LengthData:
    samples: list[Sample]
    haystack_units: int  # lines (niah_single_1) or words (2, 3) of the fitted haystack
    skipped: int = 0  # items RULER drops because even a shrunk haystack did not fit


class Generator:
    """RULER's sample generator for one S-NIAH task and one token counter.

    count_tokens(text) must count what the model will see (the tokenizer with its special
    tokens, as `transformers`' `tokenizer(text).input_ids`); `haystack` is needed by
    niah_single_2/3."""

    def __init__(
        self,
        task: str,
        count_tokens: Callable[[str], int],
        haystack: Haystack | None = None,
        seed: int = 0,
        num_samples: int = NUM_SAMPLES,
    ) -> None:
        if task not in SPECS:
            raise DataError(f"unknown NIAH task {task!r}; choose from {', '.join(TASKS)}")
        self.task, self.spec = task, SPECS[task]
        if self.spec.haystack == "essay" and haystack is None:
            raise DataError(f"{task} hides its needle in prose: give a haystack")
        self.count = count_tokens
        self.haystack = haystack
        self.rng = random.Random(seed)
        self.num_samples = num_samples
        self.keys = key_words()
        self._sentences: dict[int, list[str]] = {}

    # -- one draw: RULER's generate_input_output for one needle, one key, one query ----------
    def _value(self) -> str:
        if self.spec.values == "numbers":
            return str(self.rng.randint(10**6, 10**7 - 1))
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def _sentences_of(self, n_words: int) -> list[str]:
        if n_words not in self._sentences:
            assert self.haystack is not None
            text = " ".join(self.haystack.words[:n_words]).strip()
            self._sentences[n_words] = split_sentences(text)
        return self._sentences[n_words]

    def draw(self, units: int) -> tuple[str, str, str]:
        """(input, value, key) with a haystack of `units` lines or words."""
        key = self.rng.choice(self.keys)
        value = self._value()
        needle = NEEDLE.format(kinds=self.spec.values, key=key, value=value)
        if self.spec.haystack == "essay":
            sents = self._sentences_of(units)
            depth = self.rng.sample(DEPTHS, 1)[0]
            at = int(len(sents) * (depth / 100))
            context = " ".join((" ".join(sents[:at]), needle, " ".join(sents[at:])))
        else:
            lines = [REPEAT_LINE] * units
            lines.insert(self.rng.sample(range(units), 1)[0], needle)
            context = "\n".join(lines)
        # RULER then draws which of its keys to ask for; with one key the draw only advances
        # the stream, but it must happen for the later items to match.
        self.rng.sample(range(1), 1)
        text = TEMPLATE.format(kind=self.spec.kind, context=context, query=key)
        return text, value, key

    def _step(self, length: int) -> int:
        if self.spec.haystack == "essay":
            return 500
        return 25 if length >= 4096 else 5

    def fit_haystack(self, length: int) -> int:
        """RULER's sizing loop: the largest haystack (in steps) whose input, answer included,
        leaves room for the 128 generated tokens. It draws from the item stream like RULER."""
        step = self._step(length)
        units, total = step, 0
        while total + MAX_NEW_TOKENS < length:
            text, value, _ = self.draw(units)
            total = self.count(text + value)
            if total + MAX_NEW_TOKENS > length:
                units -= step
                break
            if self.spec.haystack == "essay" and units > len(self.haystack.words):  # type: ignore[union-attr]
                raise DataError(
                    f"{self.task}: the haystack ({len(self.haystack.words)} words, "  # type: ignore[union-attr]
                    f"{self.haystack.source.get('spec', '?')}) fills only {total} of the "  # type: ignore[union-attr]
                    f"{length} tokens; give longer prose with --niah-haystack or a shorter length"
                )
            if units > length:
                raise DataError(
                    f"{self.task}: {units} haystack units still fit in {length} tokens; the "
                    "tokenizer seems to under-count (every unit is at least one token)"
                )
            units += step
        return max(units, 1)

    def length_data(self, length: int, limit: int | None = None) -> LengthData:
        """The items of one length (the first `limit` of RULER's 500; the stream then stops)."""
        units = self.fit_haystack(length)
        step = self._step(length)
        samples: list[Sample] = []
        skipped = 0
        for index in range(self.num_samples):
            if limit is not None and len(samples) >= limit:
                break
            used, found = units, None
            while used > 0:
                text, value, key = self.draw(used)
                n = self.count(text)
                if n + MAX_NEW_TOKENS <= length:
                    found = (text, value, key, n)
                    break
                used -= step
            if found is None:
                skipped += 1
                continue
            text, value, key, n = found
            samples.append(
                Sample(
                    task=self.task,
                    length=length,
                    index=index,
                    input=text,
                    gen_prefix=GEN_PREFIX.format(kind=self.spec.kind, query=key),
                    answers=[value],
                    input_tokens=n,
                )
            )
        if not samples:
            raise DataError(
                f"{self.task}: no item fits {length} tokens: the template, the needle and the "
                f"{MAX_NEW_TOKENS} generated tokens need more with this tokenizer; use a longer "
                "--niah-lengths value"
            )
        return LengthData(samples=samples, haystack_units=units, skipped=skipped)

    def lengths(self, lengths: Sequence[int], limit: int | None = None) -> dict[int, LengthData]:
        """Every length in order from one stream, as lm-eval does (`limit` cuts only the last
        length short, so the items of each length equal lm-eval's with the same lengths)."""
        out = {}
        for i, length in enumerate(lengths):
            out[length] = self.length_data(length, limit if i == len(lengths) - 1 else None)
            if limit is not None:
                out[length].samples = out[length].samples[:limit]
        return out


# ----------------------------------------------------------------------------------------------
# scoring (RULER's postprocess_pred and string_match_all)

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess(prediction: str) -> str:
    """Strip, turn control characters into newlines, strip again."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def string_match_all(prediction: str, answers: Sequence[str]) -> float:
    """Fraction of the answers that occur in the prediction, case-insensitively."""
    pred = postprocess(prediction).lower()
    return sum(1.0 for a in answers if a.lower() in pred) / len(answers)


class TokenizerCodec:
    """Text <-> ids as lm-eval's `hf` model sees them: encode with the tokenizer's special
    tokens (transformers' default), decode without them. Takes taperlm's `Tokenizer`, a
    `transformers` tokenizer, or anything with `.tok` holding one (HFTokenizerAdapter)."""

    def __init__(self, tokenizer: Any) -> None:
        backend = getattr(tokenizer, "backend", None)
        hf = getattr(tokenizer, "tok", tokenizer)
        eos = getattr(tokenizer, "eos_id", None)
        self.eos_id = int(hf.eos_token_id if eos is None else eos)
        if backend is not None:  # a `tokenizers.Tokenizer`
            self.encode = lambda text: backend.encode(text, add_special_tokens=True).ids
            self.decode = lambda ids: backend.decode(list(ids), skip_special_tokens=True)
            self.eos_text = backend.decode([self.eos_id], skip_special_tokens=False)
        elif hasattr(hf, "convert_ids_to_tokens"):  # a transformers tokenizer
            self.encode = lambda text: list(hf.encode(text))
            self.decode = lambda ids: hf.decode(list(ids), skip_special_tokens=True)
            self.eos_text = hf.decode([self.eos_id], skip_special_tokens=False)
        else:
            raise DataError(
                f"cannot use tokenizer {type(tokenizer).__name__} for NIAH: expected taperlm's "
                "Tokenizer or a transformers tokenizer"
            )

    def prediction(self, ids: Sequence[int]) -> str:
        """The generated text as lm-eval keeps it: decoded, cut at the first EOS text."""
        return self.decode(ids).split(self.eos_text)[0] if self.eos_text else self.decode(ids)

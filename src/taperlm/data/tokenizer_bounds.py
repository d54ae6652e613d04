"""Bounds on what a tokenizer definition from a file becomes, checked before it is used.

A tokenizer.json is small next to what the tokenizers library makes of it: every vocabulary
entry and merge costs about 120 bytes once built (a 246 MB file of one repeated merge grows past
4 GB and the library aborts), a normaliser step may turn each character into many (a 100-byte
`Replace` of " " by 20,000 characters made a 1 MB document need gigabytes), and a regex from
the file (a `Split` pre-tokeniser, a `Replace` pattern) runs in a backtracking engine whose
step limit ends in a Rust panic (`PanicException`, a BaseException, outside `except
Exception`). So, for every tokenizer read from a file (`build_backend`):

- the entries are counted before the library parses anything: every element of a JSON array
  or object but the first of each is preceded by a comma, so commas + brackets bound them
  (`MAX_ENTRIES`, about 8x the largest released tokenizer's);
- the normaliser, pre-tokeniser and decoder definitions are read back from the built tokenizer
  and their worst output per input character is computed step by step (`expansion`: a Unicode
  normal form's longest decomposition, a `Replace` content's length, a precompiled
  SentencePiece map's longest replacement, ...): above `MAX_EXPANSION` the file is refused;
- every regex is bounded in length, one that repeats a repeated group (`(a+)+`, the classic
  exponential backtracking) is refused, and the pre-tokeniser and normaliser are run on probe
  texts (runs of each kind of character) so that a pattern the engine gives up on is refused at
  load, naming the file, not in the middle of `prepare`; `guarded` turns a panic during
  encoding into the same one-line error.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from tokenizers import Tokenizer as Backend

from taperlm.errors import DataError
from taperlm.files.io import error_text, parse_json, quoted

# Released tokenizers hold at most about a million entries (Gemma 3: 262k ids and their merges;
# XLM-V: 900k unigram pieces with scores); 2^23 built costs about 1 GB.
MAX_ENTRIES = 1 << 23
# Output characters per input character of normaliser x pre-tokeniser (and of the decoder per
# character of its tokens). Released pipelines reach about 90 (NFKC's longest decomposition,
# 18, times byte-level's 4 bytes + a prefix space); a 20,000-character replacement is refused.
MAX_EXPANSION = 100
MAX_PATTERN_CHARS = 4096  # released pre-tokeniser patterns are under 400 characters
PROBE_RUN = 64  # characters of each probe run: enough for the engine's step limit (10^7)

_T = TypeVar("_T")

# Longest output, in characters, per input character of each fixed step (Unicode's longest
# decompositions: NFD 4, NFKD/NFKC 18, NFC 3; full case mapping 3; byte-level: one character
# per UTF-8 byte, + a prefix space; Bert: spaces around CJK, lowercase, accents stripped by NFD).
_FIXED = {
    "NFC": 3,
    "NFD": 4,
    "NFKC": 18,
    "NFKD": 18,
    "Lowercase": 3,
    "Strip": 1,
    "StripAccents": 1,
    "Nmt": 1,
    "ByteLevel": 5,
    "BertNormalizer": 36,
    "Metaspace": 2,
    "Split": 1,
    "Whitespace": 1,
    "WhitespaceSplit": 1,
    "Punctuation": 1,
    "Digits": 1,
    "BertPreTokenizer": 1,
    "CharDelimiterSplit": 1,
    "UnicodeScripts": 1,
    "FixedLength": 1,
    # decoders that join tokens with a space: one more character per token
    "WordPiece": 2,
    "BPEDecoder": 2,
    "CTC": 2,
    "Fuse": 1,
    "ByteFallback": 1,
}


def refuse(where: str | Path, what: str) -> DataError:
    return DataError(
        f"{where}: {what}; taperlm refuses it before use. Use the tokenizer as it was released "
        "(or a bpe:N one)"
    )


def check_entry_count(text: str, where: str | Path, lines: int = 0) -> None:
    """DataError when the JSON `text` (+ `lines` entries of a merges.txt) may hold more than
    MAX_ENTRIES elements (an upper bound computed without parsing: commas + opening brackets;
    commas inside strings only raise it)."""
    count = text.count(",") + text.count("[") + text.count("{") + lines
    if count > MAX_ENTRIES:
        raise refuse(
            where,
            f"it holds up to {count:,} entries (vocabulary, merges, ...), more than the "
            f"{MAX_ENTRIES:,} taperlm builds (about 120 bytes each once built; released "
            "tokenizers hold about a million)",
        )


def build_backend(text: str, where: str | Path) -> Backend:
    """A `tokenizers.Tokenizer` from the tokenizer.json `text` read from `where`, within the
    module's bounds; DataError naming `where` for a file the library refuses (its panics too)."""
    check_entry_count(text, where)
    try:
        with quiet_stderr():
            backend = Backend.from_str(text)
    except BaseException as err:  # the library's errors and its Rust panics (BaseException)
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        raise DataError(
            f"{where}: not a valid Hugging Face tokenizers file ({error_text(err)})"
        ) from None
    check_pipeline(backend, where)
    return backend


def _state(component: Any) -> Any:
    """The JSON definition of a normaliser / pre-tokeniser / decoder (None when absent)."""
    if component is None:
        return None
    state = component.__getstate__()
    return parse_json(state.decode("utf-8") if isinstance(state, bytes) else state)


def _pool_longest(charsmap: str) -> int:
    """The longest replacement (in characters) of a SentencePiece precompiled character map:
    a u32 trie size, the trie, then the NUL-separated replacement strings."""
    try:
        blob = base64.b64decode(charsmap, validate=False)
        (trie,) = struct.unpack("<I", blob[:4])
        pool = blob[4 + trie :]
    except (ValueError, struct.error):
        return 1
    return max((len(p.decode("utf-8", "replace")) for p in pool.split(b"\0")), default=1)


def _replace_factor(step: dict[str, Any]) -> float:
    pattern, content = step.get("pattern") or {}, step.get("content") or ""
    literal = pattern.get("String") if isinstance(pattern, dict) else None
    if isinstance(literal, str) and literal:
        return max(1.0, len(content) / len(literal))
    return 1.0 + len(content)  # a regex may match the empty string between any two characters


def expansion(step: Any) -> float:
    """The most characters one input character can become through the step `step` (a
    normaliser, pre-tokeniser or decoder definition; a Sequence multiplies its steps)."""
    if step is None:
        return 1.0
    kind = step.get("type")
    if kind == "Sequence":
        inner = [*step.get("normalizers", []), *step.get("pretokenizers", [])]
        inner += step.get("decoders", [])
        out = 1.0
        for part in inner:
            out *= expansion(part)
        return out
    if kind == "Replace":
        return _replace_factor(step)
    if kind == "Prepend":
        return 1.0 + len(step.get("prepend") or "")
    if kind == "Strip" and "content" in step:  # the decoder Strip removes characters
        return 1.0
    if kind == "Precompiled":
        return float(max(1, _pool_longest(step.get("precompiled_charsmap") or "")))
    if kind in _FIXED:
        return float(_FIXED[kind])
    return float("inf")  # a step this bound does not know: refused by name


def _patterns(step: Any) -> Iterator[str]:
    """Every regex of a definition (Split and Replace patterns, in Sequences too)."""
    if isinstance(step, dict):
        pattern = step.get("pattern")
        if isinstance(pattern, dict) and isinstance(pattern.get("Regex"), str):
            yield pattern["Regex"]
        for value in step.values():
            if isinstance(value, list):
                for item in value:
                    yield from _patterns(item)


_QUANTIFIER = re.compile(r"[*+]|\{\d*,\d*\}")


def repeated_repetition(pattern: str) -> str | None:
    """The first group of `pattern` that is repeated without bound (`*`, `+`, `{n,}`) and holds
    a repetition itself (`(a+)+`, `(?:x*y)*`): the shape whose backtracking grows exponentially.
    None when there is none. Escapes and character classes are skipped."""
    stack: list[tuple[int, bool]] = []  # (start, holds a repetition)
    i, n = 0, len(pattern)
    holds = False
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":  # a class: up to its closing bracket (a leading ] or ^] is literal)
            j = i + 1
            if j < n and pattern[j] == "^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            i = j + 1
            continue
        if c == "(":
            stack.append((i, holds))
            holds = False
            i += 1
            continue
        if c == ")" and stack:
            start, outer = stack.pop()
            m = _QUANTIFIER.match(pattern, i + 1)
            unbounded = m is not None and (m.group() in "*+" or m.group().endswith(",}"))
            if unbounded and holds:
                return pattern[start : m.end()]
            holds = outer or holds or m is not None
            i += 1
            continue
        if _QUANTIFIER.match(pattern, i):
            holds = True
        i += 1
    return None


# Runs of each kind of character a pattern may repeat over, each ended by a character of
# another kind (where a backtracking match fails late); and mixed text.
_PROBE_CHARS = [*"a A 0 _ . ' - / \u00e9 \u4e00 \u0627 \U0001f600".split(), " ", "\n", "\t"]
PROBES = [c * PROBE_RUN + end for c in _PROBE_CHARS for end in ("!", "a", " ")] + [
    "Hello, world! It's 2024: naïve café, 東京 -- ok?\n\n  x" * 4
]


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """File descriptor 2 sent to /dev/null for the duration: a Rust panic prints its message
    and a backtrace there before it becomes a Python exception, which is reported instead."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def check_pipeline(backend: Backend, where: str | Path) -> None:
    """DataError naming `where` when the tokenizer's normaliser, pre-tokeniser or decoder may
    expand text past MAX_EXPANSION, or one of its regexes is unbounded or fails the probes."""
    parts = {
        "normalizer": _state(backend.normalizer),
        "pre_tokenizer": _state(backend.pre_tokenizer),
        "decoder": _state(backend.decoder),
    }
    for name, step in parts.items():
        for pattern in _patterns(step):
            if len(pattern) > MAX_PATTERN_CHARS:
                raise refuse(
                    where,
                    f"its {name} has a regex of {len(pattern):,} characters, more than "
                    f"{MAX_PATTERN_CHARS:,}",
                )
            bad = repeated_repetition(pattern)
            if bad is not None:
                raise refuse(
                    where,
                    f"its {name} regex {quoted(pattern, 120)} repeats a repeated group "
                    f"({quoted(bad, 60)}), which can take exponential time on some text",
                )
    grow = expansion(parts["normalizer"]) * expansion(parts["pre_tokenizer"])
    for name, factor in (("normalizer and pre_tokenizer", grow), ("decoder", None)):
        factor = expansion(parts["decoder"]) if factor is None else factor
        if factor > MAX_EXPANSION:
            unknown = factor == float("inf")
            raise refuse(
                where,
                f"its {name} use a step taperlm cannot bound"
                if unknown
                else f"its {name} can turn one character into up to {factor:,.0f} (at most "
                f"{MAX_EXPANSION} are allowed: a long Replace or Prepend content)",
            )
    _probe(backend, where)


def _probe(backend: Backend, where: str | Path) -> None:
    """Run the normaliser and pre-tokeniser on the probe texts; a regex the engine gives up on
    (its step limit: a Rust panic) is refused here, naming the file."""
    steps: list[tuple[str, Callable[[str], Any]]] = []
    if backend.normalizer is not None:
        steps.append(("normalizer", backend.normalizer.normalize_str))
    if backend.pre_tokenizer is not None:
        steps.append(("pre_tokenizer", backend.pre_tokenizer.pre_tokenize_str))
    for name, run in steps:
        for text in PROBES:
            try:
                with quiet_stderr():
                    run(text)
            except BaseException as err:
                if isinstance(err, (KeyboardInterrupt, SystemExit)):
                    raise
                raise refuse(
                    where,
                    f"its {name} fails on the text {quoted(text[:20], 40)}... "
                    f"({error_text(err, 120)}): a regex the engine gives up on",
                ) from None


def guarded(call: Callable[[], _T], where: str) -> _T:
    """`call()` (an encode), with a panic of the tokenizers library (a regex past the engine's
    step limit on this text) turned into a DataError naming the tokenizer `where` (the panic's
    own report to fd 2, a backtrace, silenced: the error is the one line)."""
    try:
        with quiet_stderr():
            return call()
    except BaseException as err:
        if type(err).__name__ != "PanicException":
            raise
        raise DataError(
            f"tokenizer {where} failed on this text ({error_text(err, 120)}): its pre-tokenizer "
            "or normalizer regex cannot be run on it; use another tokenizer, or remove the text"
        ) from None

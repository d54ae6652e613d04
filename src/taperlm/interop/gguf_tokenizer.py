"""llama.cpp's `gpt2` tokenizer kind (a GGUF file's `tokenizer.ggml.*`), both ways.

Import (`read_gguf_tokenizer`): the tokenizer a GGUF file holds becomes a taperlm `Tokenizer`, so
that an imported run is evaluated and trained on text tokenized the way the model was trained
(`taperlm import FILE.gguf`). Export (`gguf_vocab`): our tokenizer becomes the tokens, token
types, merges and pre-tokenizer name `taperlm export --format gguf` writes.

Both go through one table, PRE_TOKENIZERS, of the pre-tokenizers known exactly here, so what
export writes is what import reads back and a name is written only for a splitting llama.cpp
reproduces:

- `gpt-2` (also `default`, or the key absent): GPT-2's split regex (taperlm's `bpe:N`, GPT-2's
  own files);
- `smollm`, `starcoder`, `refact`, `codeshell`: every digit alone first, then GPT-2's regex
  (llama.cpp splits these with `\\p{N}` before the GPT-2 pattern; SmolLM/SmolLM2's own
  tokenizer.json is `Digits(individual_digits)` + `ByteLevel`); export writes `smollm`;
- `llama-bpe` (also `llama3`, `llama-v3`): Llama 3's split regex (contractions in any case,
  letters with one leading non-letter, digits in runs of up to 3), then bytes; a word found
  whole in the vocabulary is that token without merging (`ignore_merges`, as llama.cpp and
  Llama 3's tokenizer.json both do);
- `qwen2` (also `deepseek-r1-qwen`): the same regex with every digit alone (Qwen2/2.5's;
  merges always applied).

The kind is a byte-level BPE: its tokens are the ids' strings, its merges "left right" pairs in
rank order. Control tokens (token type 3) and user-defined ones (4) are added tokens, as in the
tokenizer.json the file was converted from: text that spells one is that one id. The JSON built
on import goes through `taperlm.data.tokenizer_bounds.build_backend` like any tokenizer read from
a file (entry counts, patterns, probes). Any other kind (`llama`: SentencePiece; another
pre-tokenizer, a normalizer, byte fallback) is refused with the reason, on import and on export;
nothing here guesses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taperlm.data.tokenizer import Tokenizer
from taperlm.data.tokenizer_bounds import build_backend
from taperlm.errors import DataError
from taperlm.files.io import parse_json

# llama.cpp's token types (`llama_token_type`): 1 normal, 2 unknown, 3 control, 4 user-defined,
# 5 unused, 6 byte (SentencePiece byte tokens only)
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}  # fmt: skip
_DIGITS_THEN_GPT2 = {
    "type": "Sequence",
    "pretokenizers": [{"type": "Digits", "individual_digits": True}, _BYTE_LEVEL],
}


def _split_then_bytes(digits: str) -> dict[str, Any]:
    """Llama 3's pre-tokenizer as its tokenizer.json writes it (Qwen2's with `digits` = one
    digit): the split regex, then bytes without GPT-2's regex. llama.cpp spells the
    case-insensitive contractions out as character classes; the splits are the same."""
    regex = (
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" + digits
        + "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
    )  # fmt: skip
    split = {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}
    return {"type": "Sequence", "pretokenizers": [split, _BYTE_LEVEL | {"use_regex": False}]}


@dataclass(frozen=True)
class Splitting:
    """How llama.cpp tokenizes text under one `tokenizer.ggml.pre`: the tokenizer.json
    pre-tokenizer that splits text the same way, and whether a piece found whole in the
    vocabulary is that token without merges (llama.cpp's `ignore_merges` for that name; the
    BPE model's `ignore_merges` in tokenizer.json)."""

    pre_tokenizer: dict[str, Any]
    ignore_merges: bool = False


_GPT2 = Splitting(_BYTE_LEVEL)
_DIGITS_FIRST = Splitting(_DIGITS_THEN_GPT2)
_LLAMA3 = Splitting(_split_then_bytes("\\p{N}{1,3}"), ignore_merges=True)
_QWEN2 = Splitting(_split_then_bytes("\\p{N}"))
# tokenizer.ggml.pre -> how llama.cpp splits under it (import rebuilds that tokenizer): the
# names of llama-vocab.cpp that share each splitting
PRE_TOKENIZERS: dict[str, Splitting] = {
    "default": _GPT2,
    "gpt-2": _GPT2,
    "smollm": _DIGITS_FIRST,
    "starcoder": _DIGITS_FIRST,
    "refact": _DIGITS_FIRST,
    "codeshell": _DIGITS_FIRST,
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "qwen2": _QWEN2,
    "deepseek-r1-qwen": _QWEN2,
}
# the names export writes, in this order of preference (each splitting has one here)
EXPORT_PRE_NAMES = ("gpt-2", "smollm", "llama-bpe", "qwen2")


def _splitting(pre: dict[str, Any]) -> Any:
    """What of a tokenizer.json pre-tokenizer decides how text is split: `trim_offsets` only
    moves offsets; the defaults of a field left out are those `tokenizers` applies to what
    taperlm writes (`use_regex` true, `add_prefix_space` false)."""
    kind = pre.get("type")
    if kind == "ByteLevel":
        return (kind, bool(pre.get("add_prefix_space", False)), bool(pre.get("use_regex", True)))
    if kind == "Digits":
        return (kind, bool(pre.get("individual_digits", False)))
    if kind == "Sequence":
        return (kind, tuple(_splitting(p) for p in pre.get("pretokenizers") or []))
    if kind == "Split":
        pattern = pre.get("pattern")
        return (kind, repr(pattern), pre.get("behavior"), bool(pre.get("invert", False)))
    return (kind, repr(sorted(pre.items())))


def llama_cpp_pre_name(pre: dict[str, Any], ignore_merges: bool = False) -> str | None:
    """The `tokenizer.ggml.pre` that makes llama.cpp tokenize as a tokenizer.json with the
    pre-tokenizer `pre` and the BPE model's `ignore_merges` does (the inverse of
    PRE_TOKENIZERS), or None when it has none."""
    for name in EXPORT_PRE_NAMES:
        known = PRE_TOKENIZERS[name]
        if (_splitting(known.pre_tokenizer), known.ignore_merges) == (
            _splitting(pre),
            bool(ignore_merges),
        ):
            return name
    return None


def _special(meta: dict[str, Any], key: str, tokens: list[str]) -> str | None:
    value = meta.get(f"tokenizer.ggml.{key}_token_id")
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(tokens):
        return tokens[value]
    return None


def _strings(meta: dict[str, Any], key: str) -> list[str] | None:
    value = meta.get(key)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


def gguf_tokenizer_json(meta: dict[str, Any], vocab_size: int) -> tuple[dict[str, Any] | None, str]:
    """The tokenizer.json (as a dict) of the GGUF metadata `meta` for a model of `vocab_size`
    rows, or None and why it cannot be rebuilt exactly."""
    kind = meta.get("tokenizer.ggml.model")
    if kind is None:
        return None, "the file holds no tokenizer (tokenizer.ggml.model)"
    if kind != "gpt2":
        return None, (
            f"its tokenizer is llama.cpp's {kind!r} kind; taperlm rebuilds the 'gpt2' kind "
            "(byte-level BPE) only"
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        return None, (
            f"its pre-tokenizer is {pre!r} (tokenizer.ggml.pre), not one taperlm rebuilds "
            f"exactly ({', '.join(PRE_TOKENIZERS)})"
        )
    tokens, merges = (
        _strings(meta, "tokenizer.ggml.tokens"),
        _strings(meta, "tokenizer.ggml.merges"),
    )
    if tokens is None or merges is None:
        return None, "its tokenizer.ggml.tokens or .merges is not a list of strings"
    if len(tokens) > vocab_size:
        return None, f"it has {len(tokens):,} tokens but the model only {vocab_size:,} rows"
    if len(set(tokens)) != len(tokens):
        return None, "its token list names a token twice"
    if any(m.count(" ") != 1 for m in merges):
        return None, "a merge of its tokenizer.ggml.merges is not two tokens joined by one space"
    types = meta.get("tokenizer.ggml.token_type")
    if not isinstance(types, list) or len(types) != len(tokens):
        types = [1] * len(tokens)
    added = [
        {"id": i, "content": tokens[i], "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": t == USER_DEFINED, "special": t == CONTROL}
        for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED)
    ]  # fmt: skip
    data = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre].pre_tokenizer,
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": PRE_TOKENIZERS[pre].ignore_merges,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": [m.split(" ") for m in merges],
        },
    }
    return data, ""


def read_gguf_tokenizer(
    path: str | Path, meta: dict[str, Any], vocab_size: int
) -> tuple[Tokenizer | None, str]:
    """The GGUF file's tokenizer (EOS/BOS from its token ids) and "", or None and why not."""
    data, why = gguf_tokenizer_json(meta, vocab_size)
    if data is None:
        return None, why
    tokens = meta["tokenizer.ggml.tokens"]
    eos = _special(meta, "eos", tokens)
    if eos is None:
        return None, "it names no EOS token (tokenizer.ggml.eos_token_id)"
    try:
        backend = build_backend(json.dumps(data), path)
    except DataError as err:
        return None, f"its tokenizer cannot be built ({err})"
    tokenizer = Tokenizer(
        backend,
        kind="import",
        spec=str(path),
        eos_token=eos,
        bos_token=_special(meta, "bos", tokens),
    )
    return tokenizer, ""


def gguf_vocab(tokenizer: Any, vocab_size: int) -> dict[str, Any]:
    """tokens, token types, merges and pre-tokenizer name (`pre`) of llama.cpp's `gpt2`
    tokenizer from ours; ids the tokenizer lacks up to the model's `vocab_size` become unused
    padding tokens. DataError for a tokenizer llama.cpp would split differently."""
    backend = getattr(tokenizer, "backend", tokenizer)
    spec = getattr(tokenizer, "spec", type(tokenizer).__name__)
    data = parse_json(backend.to_str(), what="the tokenizer's JSON")
    model, pre = data.get("model") or {}, data.get("pre_tokenizer") or {}
    problems = []
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        problems.append(
            f"its model is {model.get('type')} (byte_fallback={model.get('byte_fallback')})"
        )
    ignore_merges = bool(model.get("ignore_merges", False))
    pre_name = llama_cpp_pre_name(pre, ignore_merges)
    if pre_name is None:
        problems.append(
            f"its pre-tokenizer is {json.dumps(pre, sort_keys=True)} with ignore_merges="
            f"{ignore_merges}"
        )
    if data.get("normalizer"):
        problems.append(f"it has a normalizer ({data['normalizer'].get('type')})")
    if problems:
        raise DataError(
            f"GGUF export: tokenizer {spec!r} is not a byte-level BPE whose pre-tokenization "
            f"llama.cpp reproduces ({'; '.join(problems)}); the splittings export names are "
            "GPT-2's, SmolLM's (digits alone, then GPT-2's), Llama 3's and Qwen2's: train the run "
            "on a bpe:N or GPT-2 style tokenizer, or use the Hugging Face export"
        )
    ids = backend.get_vocab(with_added_tokens=True)
    if max(ids.values()) >= vocab_size:
        raise DataError(
            f"GGUF export: tokenizer {spec!r} has ids up to {max(ids.values())} but the model's "
            f"vocab_size is {vocab_size}"
        )
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [UNUSED] * vocab_size
    for token, i in ids.items():
        tokens[i], types[i] = token, NORMAL
    for added in data.get("added_tokens") or []:
        types[added["id"]] = CONTROL if added.get("special") else USER_DEFINED
    for special in (getattr(tokenizer, "eos_id", None), getattr(tokenizer, "bos_id", None)):
        if special is not None:  # also where EOS is a plain vocabulary entry (GPT-2 files)
            types[special] = CONTROL
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    return {"tokens": tokens, "types": types, "merges": merges, "pre": pre_name}

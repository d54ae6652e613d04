"""The tokenizer a GGUF file holds (llama.cpp's `tokenizer.ggml.*` metadata) as a taperlm
`Tokenizer`, so that an imported run can be evaluated and trained on text tokenized the way the
model was trained (`taperlm import FILE.gguf`).

Rebuilt: llama.cpp's `gpt2` kind, a byte-level BPE (its tokens are the ids' strings, its merges
"left right" pairs in rank order), with the pre-tokenizer its `tokenizer.ggml.pre` names, where
that is one this module knows exactly:

- `gpt-2` (also `default`, or the key absent): GPT-2's split regex (what `taperlm export --format
  gguf` writes);
- `smollm`, `starcoder`, `refact`, `codeshell`: every digit alone first, then GPT-2's regex
  (llama.cpp splits these with `\\p{N}` before the GPT-2 pattern; SmolLM/SmolLM2's own
  tokenizer.json is `Digits(individual_digits)` + `ByteLevel`).

Control tokens (token type 3) and user-defined ones (4) are added tokens, as in the tokenizer.json
the file was converted from: text that spells one is that one id. The JSON built here goes through
`taperlm.data.tokenizer_bounds.build_backend` like any tokenizer read from a file (entry counts,
patterns, probes). Any other kind (`llama`: SentencePiece; another pre-tokenizer) gives no
tokenizer and the reason, which the import states; nothing here guesses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from taperlm.data.tokenizer import Tokenizer
from taperlm.data.tokenizer_bounds import build_backend
from taperlm.errors import DataError

# llama.cpp's token types (`llama_token_type`): 1 normal, 2 unknown, 3 control, 4 user-defined,
# 5 unused, 6 byte (SentencePiece byte tokens only)
_CONTROL, _USER_DEFINED = 3, 4
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}  # fmt: skip
_DIGITS_THEN_GPT2 = {
    "type": "Sequence",
    "pretokenizers": [{"type": "Digits", "individual_digits": True}, _BYTE_LEVEL],
}
# tokenizer.ggml.pre -> the tokenizers pre-tokenizer that splits text as llama.cpp does
PRE_TOKENIZERS: dict[str, dict[str, Any]] = {
    "default": _BYTE_LEVEL,
    "gpt-2": _BYTE_LEVEL,
    "smollm": _DIGITS_THEN_GPT2,
    "starcoder": _DIGITS_THEN_GPT2,
    "refact": _DIGITS_THEN_GPT2,
    "codeshell": _DIGITS_THEN_GPT2,
}


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


def tokenizer_json(meta: dict[str, Any], vocab_size: int) -> tuple[dict[str, Any] | None, str]:
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
         "rstrip": False, "normalized": t == _USER_DEFINED, "special": t == _CONTROL}
        for i, t in enumerate(types) if t in (_CONTROL, _USER_DEFINED)
    ]  # fmt: skip
    data = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
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
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": [m.split(" ") for m in merges],
        },
    }
    return data, ""


def read_tokenizer(path: str | Path, meta: dict[str, Any], vocab_size: int) -> tuple[Tokenizer | None, str]:  # fmt: skip
    """The GGUF file's tokenizer (EOS/BOS from its token ids) and "", or None and why not."""
    data, why = tokenizer_json(meta, vocab_size)
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

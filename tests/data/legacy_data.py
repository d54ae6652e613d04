"""A data dir as `taperlm prepare` wrote it before splits were sharded (format_version 1).

Kept as a generator rather than a committed binary. It writes what that code wrote: one shard per
split (`train.bin`, `val.bin`; the shard format itself did not change), meta.json with one
`file` per split, `tokenizer/` as saved by `Tokenizer.save`, and the `.taperlm-prepare` marker.
The meta.json keys and nesting are copied from a data dir that code produced.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from taperlm.data.shards import write_shard
from taperlm.data.tokenizer import train_bpe


def write_v1_data_dir(out: Path, texts: list[str], vocab: int = 300, val_every: int = 5) -> Path:
    """Documents i with i % val_every == 1 are the validation split (whole documents, in order)."""
    out.mkdir(parents=True, exist_ok=True)
    tok = train_bpe(texts, vocab)
    tok.save(out / "tokenizer")
    ids = {"train": [], "val": []}
    for i, text in enumerate(texts):
        ids["val" if i % val_every == 1 else "train"].append([*tok.encode(text), tok.eos_id])
    splits = {}
    for name, docs in ids.items():
        tokens = np.array([t for d in docs for t in d], dtype=np.int64)
        header = write_shard(out / f"{name}.bin", tokens, tok.vocab_size)
        splits[name] = {
            "file": f"{name}.bin",
            "tokens": header.count,
            "documents": len(docs),
            "crc32": header.crc32,
        }
    meta = {
        "format": "taperlm-tokens",
        "format_version": 1,
        "created_by": "taperlm 0.1.0",
        "source": {
            "spec": "legacy",
            "kind": "local",
            "path": str(out),
            "documents": len(texts),
            "chars": sum(len(t) for t in texts),
            "max_chars": None,
        },
        "tokenizer": {"kind": "bpe", "spec": f"bpe:{vocab}", "dir": "tokenizer"},
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "bos_id": tok.bos_id,
        "dtype": "uint16",
        "val_split": {
            "mode": "documents",
            "fraction": 0.2,
            "tokens_target": splits["val"]["tokens"],
            "seed": 0,
        },
        "splits": splits,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    (out / ".taperlm-prepare").write_text("written by taperlm prepare\n")
    return out

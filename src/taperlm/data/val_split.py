"""The validation split's last step in `taperlm prepare` (taperlm.data.prepare, step 3): when no
document went to training, the validation documents become the training split; when the
validation documents hold fewer tokens than asked, the last tokens of the training stream move
into the validation split (meta.json's `val_split.mode`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from taperlm.data.shards import HEADER_SIZE, ShardSeries, dtype_for_vocab, payload_crc32, shard_name
from taperlm.errors import DataError

COPY_CHUNK = 1 << 22  # tokens per copy when moving the tail into the validation split
EMPTY = {"tokens": 0, "crc32": 0}


def settle(
    work: Path,
    train: ShardSeries,
    val: ShardSeries,
    counts: dict[str, int],
    eos: int,
    shard_tokens: int,
    val_tokens: int | None,
    val_fraction: float,
) -> tuple[list[dict], list[dict], str, int, dict[str, Any]]:
    """Close both splits with the validation split at its target (`counts` updated): the shards
    of train and of val, the split's mode, its target in tokens and the tail moved."""
    vocab = train.vocab_size
    dtype = dtype_for_vocab(vocab)
    if counts["train_docs"] == 0:  # every document was a validation pick: use them as train
        moved = _rename_series(work, val.close(), "val", "train")
        train = ShardSeries(work, "train", vocab, shard_tokens, {"done": moved, "open": EMPTY})
        val = ShardSeries(work, "val", vocab, shard_tokens)
        counts["train_docs"], counts["val_docs"] = counts["val_docs"], 0
    total = train.tokens + val.tokens
    if val_tokens is not None:
        need = max(0, val_tokens - val.tokens)
        target = val_tokens
    else:
        target = max(2, round(val_fraction * total))
        need = target if counts["val_docs"] == 0 else 0
    if train.tokens - need < 2 or val.tokens + need < 2:
        raise DataError(
            f"the corpus has only {total:,} tokens, too few for a validation split of "
            f"{target:,}; add text or lower --val-fraction/--val-tokens"
        )
    tail = {"tokens": need, "starts": 0, "overlaps": 0}
    if need:
        shards = train.close()
        cut = train.tokens - need
        tail = _move_tail(work, shards, cut, val, dtype, eos)
        train = ShardSeries(
            work, "train", vocab, shard_tokens, _cut_state(work, shards, cut, dtype)
        )
    train_shards, val_shards = train.close(), val.close()
    mode = "documents" if not need else ("tail" if counts["val_docs"] == 0 else "documents+tail")
    return train_shards, val_shards, mode, target, tail


def _rename_series(work: Path, shards: list[dict], old: str, new: str) -> list[dict]:
    renamed = []
    for i, d in enumerate(shards):
        name = shard_name(new, i)
        os.replace(work / d["file"], work / name)
        renamed.append({**d, "file": name})
    return renamed


def _read_shard(work: Path, d: dict, dtype: np.dtype) -> np.ndarray:
    if d["tokens"] == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(
        work / d["file"], dtype=dtype, mode="r", offset=HEADER_SIZE, shape=(d["tokens"],)
    )


def _move_tail(
    work: Path, shards: list[dict], cut: int, val: ShardSeries, dtype: np.dtype, eos: int
) -> dict[str, int]:
    """Append train tokens [cut, end) to `val`; count the documents of the tail (`overlaps`:
    documents with a token in it, `starts`: documents that begin in it)."""
    eos_count, before, last, start = 0, None, None, 0
    for d in shards:
        end = start + d["tokens"]
        if end > cut or (end == cut and d["tokens"]):
            tokens = _read_shard(work, d, dtype)
            if start < cut <= end:
                before = int(tokens[cut - start - 1])
            for i in range(max(cut - start, 0), d["tokens"], COPY_CHUNK):
                chunk = np.asarray(tokens[i : i + COPY_CHUNK])
                val.write(chunk)
                eos_count += int(np.count_nonzero(chunk == eos))
                last = int(chunk[-1])
            del tokens
        start = end
    overlaps = eos_count + (1 if last is not None and last != eos else 0)
    starts_in_tail = overlaps - (0 if before is None or before == eos else 1)
    return {"tokens": start - cut, "overlaps": overlaps, "starts": starts_in_tail}


def _cut_state(work: Path, shards: list[dict], cut: int, dtype: np.dtype) -> dict:
    """A ShardSeries state holding exactly the first `cut` tokens of `shards`."""
    done, start = [], 0
    for d in shards:
        if start + d["tokens"] <= cut:
            done.append(d)
            start += d["tokens"]
            if start == cut:
                break
            continue
        n = cut - start
        return {
            "done": done,
            "open": {"tokens": n, "crc32": payload_crc32(work / d["file"], dtype, n)},
        }
    return {"done": done, "open": dict(EMPTY)}

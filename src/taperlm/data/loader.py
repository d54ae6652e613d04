"""Training and validation batches from a `taperlm prepare` data dir.

Sampling (TokenBatches). A split of N tokens holds `n_windows = (N - 1) // T` non-overlapping
windows; window w covers tokens [w*T, w*T + T] (T + 1 tokens: x is the first T, y the last T).
The windows are visited in epochs; epoch e uses the permutation
`numpy.random.default_rng([seed, e]).permutation(n_windows)`. Concatenating the epochs gives one
infinite *global sample sequence*: global sample g is window `perm_{g // n}[g % n]` (batches may
straddle an epoch boundary; nothing is dropped).

Ranks. With micro-batch B per rank and W ranks, global micro-step s covers global samples
[s*B*W, (s+1)*B*W); rank r takes samples s*B*W + r + j*W for j = 0..B-1 (row j of its batch).
Invariant: for one seed, the union over ranks of a global micro-step is the same set of samples
whatever W is, as long as B*W is the same — so 2 ranks with B=4 see exactly the sequences one
process with B=8 sees, and with gradient accumulation each optimizer step of W ranks x k
micro-steps covers the same samples as 1 process x W*k micro-steps at the same B.

Resuming. `state_dict()` records the global sample index of the next micro-step (plus epoch and
position for humans); `load_state_dict()` continues exactly there.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from taperlm.config import ModelConfig
from taperlm.data.datadir import META_FILE, SPLITS, load_meta, resolve, split_shards
from taperlm.data.shards import TokenStream, open_shard
from taperlm.errors import DataError
from taperlm.files.io import quoted
from taperlm.spec.domains import MAX_VOCAB, set_advice

__all__ = ["TokenBatches", "check_vocab", "load_meta", "open_split", "val_batches"]

AUTO_VERIFY_BYTES = 64 << 20  # shards up to this size are checksummed on open
STATE_VERSION = 1


def open_split(
    data_dir: str | Path, split: str, verify: bool | None = None
) -> tuple[dict[str, Any], TokenStream]:
    """(meta, the split's tokens as one stream over its shards), checked against meta.json.

    verify=None checksums shards up to AUTO_VERIFY_BYTES each; True/False force it on/off.
    Every shard's header (count, vocab, checksum) is always compared with meta.json.
    """
    data_dir = Path(data_dir)
    meta = load_meta(data_dir)
    if split not in SPLITS or split not in meta["splits"]:
        raise DataError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    parts = []
    for info in split_shards(meta, split):
        path = resolve(data_dir, info["file"])
        check = verify
        if check is None:
            check = path.is_file() and path.stat().st_size <= AUTO_VERIFY_BYTES
        header, tokens = open_shard(path, verify=check)
        if header.vocab_size != meta["vocab_size"]:
            raise DataError(
                f"{path}: shard vocab_size {header.vocab_size} differs from meta.json "
                f"({meta['vocab_size']}); re-run `taperlm prepare`"
            )
        expected = info.get("tokens")
        if (expected is not None and header.count != expected) or (
            info.get("crc32") is not None and header.crc32 != info["crc32"]
        ):
            raise DataError(
                f"{path}: shard does not match meta.json (token count or checksum); it "
                "was replaced or corrupted, re-run `taperlm prepare`"
            )
        parts.append(tokens)
    return meta, TokenStream(parts)


def check_vocab(data_dir: str | Path, model_vocab_size: int) -> int:
    """Raise DataError when the data's token ids do not fit the model; return the data's vocab."""
    vocab = int(load_meta(data_dir)["vocab_size"])
    if vocab > model_vocab_size:
        advice = set_advice(ModelConfig, "vocab_size", vocab, "model.vocab_size")
        if vocab > MAX_VOCAB:
            advice += f"; its {META_FILE} is damaged or not taperlm's: re-run `taperlm prepare`"
        raise DataError(
            f"tokenizer of {data_dir} has {quoted(vocab)} ids but model.vocab_size is "
            f"{model_vocab_size}; " + advice
        )
    return vocab


def check_data_fits(data_dir: str | Path, seq_len: int, step_windows: int, validate: bool) -> None:
    """Before a run starts: the train split holds at least one optimizer step of distinct
    windows (`step_windows` = batch_tokens / seq_len), and, when the run validates, the val split
    at least one window. Reads the counts in meta.json (the shards are checked when opened)."""
    data_dir = Path(data_dir)
    splits = load_meta(data_dir)["splits"]
    n = int(splits.get("train", {}).get("tokens", 0))
    _check_length(data_dir, "train", n, seq_len)
    windows = (n - 1) // seq_len
    if windows < step_windows:
        raise DataError(
            f"the train split of {data_dir} has {n} tokens = {windows} windows of seq_len + 1 = "
            f"{seq_len + 1}, fewer than one optimizer step takes ({step_windows} windows: "
            "train.batch_tokens / train.seq_len), so every step would repeat sequences; prepare "
            "more data or lower train.batch_tokens"
        )
    if validate:
        n_val = int(splits.get("val", {}).get("tokens", 0))
        _check_length(data_dir, "val", n_val, seq_len)


def _check_length(data_dir: Path, split: str, n_tokens: int, seq_len: int) -> None:
    if n_tokens < seq_len + 1:
        more = (
            "`taperlm prepare --val-tokens N` with a larger N"
            if split == "val"
            else "`taperlm prepare` on more text"
        )
        raise DataError(
            f"the {split} split of {data_dir} has {n_tokens} tokens, fewer than seq_len + 1 = "
            f"{seq_len + 1}; lower train.seq_len or prepare more data ({more})"
        )


def _windows(tokens: TokenStream, window_ids: np.ndarray, seq_len: int) -> tuple[torch.Tensor, ...]:
    rows = np.stack(
        [np.asarray(tokens[w * seq_len : w * seq_len + seq_len + 1]) for w in window_ids]
    )
    rows = torch.from_numpy(rows.astype(np.int64))
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


class TokenBatches:
    """Endless iterator of (x, y) LongTensor pairs [micro_batch_size, seq_len] for one rank.

    See the module docstring for the exact sampling and rank-partition invariant.
    """

    def __init__(
        self,
        data_dir: str | Path,
        split: str,
        seq_len: int,
        micro_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        verify: bool | None = None,
    ) -> None:
        if seq_len < 1 or micro_batch_size < 1:
            raise DataError(
                f"seq_len ({seq_len}) and micro_batch_size ({micro_batch_size}) must be positive"
            )
        if world_size < 1 or not 0 <= rank < world_size:
            raise DataError(f"rank {rank} is not in [0, world_size={world_size})")
        self.data_dir = Path(data_dir)
        self.split = split
        self.meta, self.tokens = open_split(self.data_dir, split, verify=verify)
        _check_length(self.data_dir, split, len(self.tokens), seq_len)
        self.seq_len = seq_len
        self.micro_batch_size = micro_batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.n_windows = (len(self.tokens) - 1) // seq_len
        self.global_batch = micro_batch_size * world_size
        self.sample = 0  # global index of the first sample of the next global micro-step
        self._perms: dict[int, np.ndarray] = {}

    @property
    def epoch(self) -> int:
        return self.sample // self.n_windows

    @property
    def position(self) -> int:
        return self.sample % self.n_windows

    def permutation(self, epoch: int) -> np.ndarray:
        """Window order of one epoch (cached for the current and next epoch only)."""
        if epoch not in self._perms:
            if len(self._perms) >= 2:
                del self._perms[min(self._perms)]
            rng = np.random.default_rng([self.seed, epoch])
            self._perms[epoch] = rng.permutation(self.n_windows)
        return self._perms[epoch]

    def window_ids(self, samples: np.ndarray) -> np.ndarray:
        """Window index of each global sample index."""
        out = np.empty(len(samples), dtype=np.int64)
        for i, g in enumerate(samples):
            out[i] = self.permutation(int(g) // self.n_windows)[int(g) % self.n_windows]
        return out

    def rank_samples(self, sample: int | None = None) -> np.ndarray:
        """Global sample indices of this rank's rows in the micro-step starting at `sample`."""
        start = self.sample if sample is None else sample
        return start + self.rank + self.world_size * np.arange(self.micro_batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        ids = self.window_ids(self.rank_samples())
        self.sample += self.global_batch
        return _windows(self.tokens, ids, self.seq_len)

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "split": self.split,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "n_windows": self.n_windows,
            "global_batch": self.global_batch,
            "sample": self.sample,
            "epoch": self.epoch,
            "position": self.position,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where `state` stopped (the data and sampling must be the same)."""
        for key in ("split", "seed", "seq_len", "n_windows"):
            if key in state and state[key] != getattr(self, key):
                raise DataError(
                    f"cannot resume the data loader: saved {key}={state[key]!r} but this run has "
                    f"{key}={getattr(self, key)!r}; use the same data dir, seed and seq_len"
                )
        if "sample" in state:
            sample = int(state["sample"])
        else:
            sample = int(state["epoch"]) * self.n_windows + int(state["position"])
        if sample < 0:
            raise DataError(f"cannot resume the data loader: sample index {sample} is negative")
        self.sample = sample


def val_batches(
    data_dir: str | Path,
    seq_len: int,
    batch_size: int,
    max_tokens: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    verify: bool | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The validation split in order as non-overlapping windows (x, y); the last batch may be
    smaller. `max_tokens` caps the windows (at least one); with several ranks, rank r takes
    windows r, r+W, ... of that list."""
    if seq_len < 1 or batch_size < 1:
        raise DataError(f"seq_len ({seq_len}) and batch_size ({batch_size}) must be positive")
    _, tokens = open_split(data_dir, "val", verify=verify)
    _check_length(Path(data_dir), "val", len(tokens), seq_len)
    n = (len(tokens) - 1) // seq_len
    if max_tokens is not None:
        n = min(n, max(1, max_tokens // seq_len))
    mine = np.arange(rank, n, world_size)
    for start in range(0, len(mine), batch_size):
        yield _windows(tokens, mine[start : start + batch_size], seq_len)

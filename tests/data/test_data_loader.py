"""TokenBatches / val_batches / check_vocab: determinism, exact resume, rank partition, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import raises_naming
from taperlm.data.loader import TokenBatches, check_vocab, load_meta, val_batches
from taperlm.data.prepare import META_FORMAT
from taperlm.data.shards import HEADER_SIZE, write_shard
from taperlm.errors import DataError

VOCAB = 1000


def make_data_dir(path: Path, n_train: int = 1000, n_val: int = 300) -> Path:
    """A data dir with arange-like tokens, so each window's content reveals its position."""
    path.mkdir(parents=True, exist_ok=True)
    splits = {}
    for name, n in (("train", n_train), ("val", n_val)):
        h = write_shard(path / f"{name}.bin", np.arange(n) % VOCAB, VOCAB)
        splits[name] = {"file": f"{name}.bin", "tokens": n, "documents": 1, "crc32": h.crc32}
    meta = {"format": META_FORMAT, "vocab_size": VOCAB, "eos_id": 0, "splits": splits}
    (path / "meta.json").write_text(json.dumps(meta))
    return path


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return make_data_dir(tmp_path / "data")


def take(it, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [next(it) for _ in range(n)]


def test_batches_shape_shift_and_window_alignment(data_dir: Path) -> None:
    x, y = next(TokenBatches(data_dir, "train", seq_len=16, micro_batch_size=4, seed=0))
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.all(x[:, 0] % 16 == 0)  # non-overlapping windows start at multiples of T
    assert torch.equal(y - x, torch.ones_like(x))


def test_epoch_is_a_permutation_and_seeded(data_dir: Path) -> None:
    tb = TokenBatches(data_dir, "train", seq_len=10, micro_batch_size=9, seed=5)
    assert tb.n_windows == 99
    starts = torch.cat([x[:, 0] for x, _ in take(tb, 11)]).tolist()  # 11 * 9 = one epoch
    assert sorted(starts) == list(range(0, 990, 10))
    assert tb.epoch == 1 and tb.position == 0
    again = torch.cat(
        [
            x[:, 0]
            for x, _ in take(
                TokenBatches(data_dir, "train", seq_len=10, micro_batch_size=9, seed=5), 11
            )
        ]
    ).tolist()
    assert again == starts
    other = torch.cat(
        [
            x[:, 0]
            for x, _ in take(
                TokenBatches(data_dir, "train", seq_len=10, micro_batch_size=9, seed=6), 11
            )
        ]
    ).tolist()
    assert other != starts
    second_epoch = torch.cat([x[:, 0] for x, _ in take(tb, 11)]).tolist()
    assert sorted(second_epoch) == sorted(starts) and second_epoch != starts


def test_resume_mid_epoch_continues_exactly(data_dir: Path) -> None:
    ref = take(TokenBatches(data_dir, "train", 8, 5, seed=1), 40)  # crosses epochs (124 windows)
    tb = TokenBatches(data_dir, "train", 8, 5, seed=1)
    take(tb, 17)
    state = json.loads(json.dumps(tb.state_dict()))  # survives serialisation
    assert state["epoch"] == 0 and state["position"] == 85
    resumed = TokenBatches(data_dir, "train", 8, 5, seed=1)
    resumed.load_state_dict(state)
    for (x, y), (rx, ry) in zip(take(resumed, 23), ref[17:]):
        assert torch.equal(x, rx) and torch.equal(y, ry)
    with raises_naming(DataError, "seq_len=8", "seq_len=16"):
        TokenBatches(data_dir, "train", 16, 5, seed=1).load_state_dict(state)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_partition_the_single_process_order(data_dir: Path, world_size: int) -> None:
    b = 2
    single = take(TokenBatches(data_dir, "train", 12, b * world_size, seed=3), 30)
    ranks = [
        TokenBatches(data_dir, "train", 12, b, rank=r, world_size=world_size, seed=3)
        for r in range(world_size)
    ]
    for step in range(30):
        parts = [next(r)[0] for r in ranks]
        # rank r row j == global sample r + j*W of the micro-step
        merged = torch.stack([parts[r][j] for j in range(b) for r in range(world_size)])
        assert torch.equal(merged, single[step][0])


def test_val_batches_in_order(data_dir: Path) -> None:
    xs = [x for x, _ in val_batches(data_dir, seq_len=10, batch_size=4)]
    assert [len(x) for x in xs] == [4] * 7 + [1]  # (300 - 1) // 10 = 29 windows
    assert torch.cat(xs)[:, 0].tolist() == list(range(0, 290, 10))
    capped = list(val_batches(data_dir, 10, 4, max_tokens=55))
    assert sum(len(x) for x, _ in capped) == 5
    r1 = next(x for x, _ in val_batches(data_dir, 10, 100, rank=1, world_size=2))
    assert r1[:, 0].tolist() == list(range(10, 290, 20))


def test_check_vocab(data_dir: Path) -> None:
    assert check_vocab(data_dir, 1024) == VOCAB
    with raises_naming(DataError, "1000 ids", "model.vocab_size is 512", "model.vocab_size=1000"):
        check_vocab(data_dir, 512)


def test_missing_and_empty_data_dir(tmp_path: Path) -> None:
    with raises_naming(DataError, str(tmp_path / "nope"), "taperlm prepare"):
        TokenBatches(tmp_path / "nope", "train", 8, 2)
    (tmp_path / "empty").mkdir()
    with raises_naming(DataError, str(tmp_path / "empty"), "taperlm prepare"):
        TokenBatches(tmp_path / "empty", "train", 8, 2)
    (tmp_path / "empty" / "train.bin").write_bytes(b"x")
    with raises_naming(DataError, str(tmp_path / "empty"), "meta.json"):
        load_meta(tmp_path / "empty")


def test_short_shard_and_bad_split(tmp_path: Path) -> None:
    d = make_data_dir(tmp_path / "d", n_train=100, n_val=20)
    with raises_naming(DataError, "val", str(d), "20 tokens", "seq_len + 1 = 33"):
        list(val_batches(d, 32, 2))
    with raises_naming(DataError, "'test'", "train", "val"):
        TokenBatches(d, "test", 8, 2)
    with raises_naming(DataError, "rank 2", "world_size=2"):
        TokenBatches(d, "train", 8, 2, rank=2, world_size=2)


def test_corrupt_shards_detected_on_open(data_dir: Path) -> None:
    path = data_dir / "train.bin"
    raw = bytearray(path.read_bytes())
    raw[HEADER_SIZE + 7] ^= 0x10
    path.write_bytes(bytes(raw))
    with raises_naming(DataError, "train.bin", "checksum", "taperlm prepare"):
        TokenBatches(data_dir, "train", 8, 2)  # small shards are verified on open
    TokenBatches(data_dir, "train", 8, 2, verify=False)
    path.write_bytes(b"GARBAGE!" + bytes(raw[8:]))
    with raises_naming(DataError, "train.bin", "magic bytes", "taperlm prepare"):
        TokenBatches(data_dir, "train", 8, 2, verify=False)


def make_sharded_data_dir(path: Path, sizes: dict[str, list[int]]) -> Path:
    """The same arange-like stream as make_data_dir, cut into shards of the given sizes."""
    path.mkdir(parents=True, exist_ok=True)
    splits = {}
    for name, parts in sizes.items():
        shards, start = [], 0
        for i, n in enumerate(parts):
            file = f"{name}-{i:05d}.bin"
            h = write_shard(path / file, np.arange(start, start + n) % VOCAB, VOCAB)
            shards.append({"file": file, "tokens": n, "crc32": h.crc32})
            start += n
        splits[name] = {"tokens": start, "documents": 1, "shards": shards}
    meta = {"format": META_FORMAT, "format_version": 2, "vocab_size": VOCAB, "eos_id": 0}
    (path / "meta.json").write_text(json.dumps({**meta, "splits": splits}))
    return path


def test_shards_read_as_one_stream(tmp_path: Path) -> None:
    """Batches, resume state and validation windows of a sharded split equal those of the same
    tokens in one file (windows straddle shard boundaries, one shard is empty)."""
    single = make_data_dir(tmp_path / "single")
    sharded = make_sharded_data_dir(
        tmp_path / "sharded", {"train": [333, 0, 100, 567], "val": [7, 293]}
    )
    a = TokenBatches(single, "train", 16, 3, seed=2)
    b = TokenBatches(sharded, "train", 16, 3, seed=2)
    for (xa, ya), (xb, yb) in zip(take(a, 30), take(b, 30)):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    state = b.state_dict()
    assert state == a.state_dict()
    resumed = TokenBatches(sharded, "train", 16, 3, seed=2)
    resumed.load_state_dict(state)
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(take(resumed, 5), take(a, 5)))
    for (xa, _), (xb, _) in zip(val_batches(single, 10, 4), val_batches(sharded, 10, 4)):
        assert torch.equal(xa, xb)


def test_each_shard_is_checked_against_meta(tmp_path: Path) -> None:
    d = make_sharded_data_dir(tmp_path / "d", {"train": [300, 300, 400], "val": [300]})
    raw = bytearray((d / "train-00001.bin").read_bytes())
    raw[HEADER_SIZE + 3] ^= 0x01
    (d / "train-00001.bin").write_bytes(bytes(raw))
    with raises_naming(DataError, "train-00001.bin", "checksum", "taperlm prepare"):
        TokenBatches(d, "train", 8, 2)
    meta = json.loads((d / "meta.json").read_text())
    meta["splits"]["train"]["shards"][2]["tokens"] = 399
    (d / "meta.json").write_text(json.dumps(meta))
    with raises_naming(DataError, "train-00002.bin", "meta.json"):
        TokenBatches(d, "train", 8, 2, verify=False)
    (d / "train-00000.bin").unlink()
    with raises_naming(DataError, "train-00000.bin", "not found"):
        TokenBatches(d, "train", 8, 2)
    meta["format_version"] = 3
    (d / "meta.json").write_text(json.dumps(meta))
    with raises_naming(DataError, "meta.json", "version 3", "upgrade taperlm", "taperlm prepare"):
        TokenBatches(d, "train", 8, 2)

"""Splits as lists of shards: ShardSeries (fixed-size shards, crash and resume) and TokenStream."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import raises_naming
from taperlm.data.shards import (
    ResumeMismatch,
    ShardSeries,
    TokenStream,
    open_shard,
    write_shard,
)

pytestmark = pytest.mark.unit

VOCAB = 1000


def _chunks(seed: int, n: int = 12) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, VOCAB, size=int(rng.integers(0, 20))).astype(np.uint16) for _ in range(n)
    ]


def _read_series(directory: Path, shards: list[dict]) -> np.ndarray:
    parts = []
    for d in shards:
        header, tokens = open_shard(directory / d["file"], verify=True)
        assert (header.count, header.crc32) == (d["tokens"], d["crc32"])
        parts.append(np.asarray(tokens))
    return np.concatenate(parts)


def test_fixed_size_shards(tmp_path: Path) -> None:
    chunks = _chunks(0)
    series = ShardSeries(tmp_path, "train", VOCAB, shard_tokens=7)
    for c in chunks:
        series.write(c)
    shards = series.close()
    total = sum(len(c) for c in chunks)
    assert [d["tokens"] for d in shards] == [7] * (total // 7) + ([total % 7] if total % 7 else [])
    assert [d["file"] for d in shards] == [f"train-{i:05d}.bin" for i in range(len(shards))]
    assert np.array_equal(_read_series(tmp_path, shards), np.concatenate(chunks))
    assert sorted(p.name for p in tmp_path.iterdir()) == [d["file"] for d in shards]


def test_empty_series_is_one_empty_shard(tmp_path: Path) -> None:
    shards = ShardSeries(tmp_path, "val", VOCAB, 5).close()
    assert shards == [{"file": "val-00000.bin", "tokens": 0, "crc32": 0}]


@pytest.mark.parametrize("synced_after", [0, 1, 4, 7, 11])
@pytest.mark.parametrize("lost_after", [0, 1, 5])
def test_resume_after_a_crash_is_exact(tmp_path: Path, synced_after: int, lost_after: int) -> None:
    """Write, sync (state saved), write more (perhaps publishing shards), crash without closing;
    continuing from the state and writing the rest again gives the uninterrupted bytes."""
    chunks = _chunks(1)
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    ref_dir.mkdir()
    run_dir.mkdir()
    ref = ShardSeries(ref_dir, "train", VOCAB, 7)
    for c in chunks:
        ref.write(c)
    expected = ref.close()

    series = ShardSeries(run_dir, "train", VOCAB, 7)
    for c in chunks[:synced_after]:
        series.write(c)
    state = series.sync()
    for c in chunks[synced_after : synced_after + lost_after]:
        series.write(c)
    del series  # the crash: nothing closed (the buffered bytes reach the file on collection)
    gc.collect()

    resumed = ShardSeries(run_dir, "train", VOCAB, 7, state=state)
    for c in chunks[synced_after:]:
        resumed.write(c)
    assert resumed.close() == expected
    for d in expected:
        assert (run_dir / d["file"]).read_bytes() == (ref_dir / d["file"]).read_bytes()
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(p.name for p in ref_dir.iterdir())


def test_resume_refuses_files_that_do_not_match(tmp_path: Path) -> None:
    series = ShardSeries(tmp_path, "train", VOCAB, 7)
    for c in [*_chunks(2), np.arange(3)]:
        series.write(c)
    state = series.sync()
    assert state["done"] and state["open"]["tokens"] == 3
    series.abort()  # the open shard is gone
    tmp = tmp_path / f"train-{len(state['done']):05d}.bin.tmp"
    with raises_naming(ResumeMismatch, str(tmp), f"{state['open']['tokens']} tokens"):
        ShardSeries(tmp_path, "train", VOCAB, 7, state=state)
    tmp.write_bytes(b"\0" * 64 + b"\1\0" * state["open"]["tokens"])
    with raises_naming(ResumeMismatch, str(tmp), "checksum"):
        ShardSeries(tmp_path, "train", VOCAB, 7, state=state)
    (tmp_path / state["done"][0]["file"]).unlink()
    with raises_naming(ResumeMismatch, "train-00000.bin"):
        ShardSeries(tmp_path, "train", VOCAB, 7, state=state)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 9), min_size=1, max_size=6),
    queries=st.lists(st.tuples(st.integers(-12, 40), st.integers(-12, 40)), max_size=10),
)
def test_token_stream_indexes_like_one_array(lengths: list[int], queries) -> None:
    rng = np.random.default_rng(sum(lengths))
    parts = [rng.integers(0, VOCAB, size=n).astype(np.uint16) for n in lengths]
    stream, whole = TokenStream(parts), np.concatenate(parts)
    assert len(stream) == len(whole) and stream.dtype == whole.dtype
    assert np.array_equal(np.asarray(stream), whole)
    assert np.array_equal(stream.astype(np.int64), whole.astype(np.int64))
    for a, b in queries:
        assert np.array_equal(np.asarray(stream[a:b]), whole[a:b])
        assert np.array_equal(np.asarray(stream[a:b:2]), whole[a:b:2])
        if -len(whole) <= a < len(whole):
            assert stream[a] == whole[a]
        else:
            with pytest.raises(IndexError):
                stream[a]


def test_token_stream_over_memmapped_shards(tmp_path: Path) -> None:
    parts = []
    for i, n in enumerate([5, 0, 3, 8]):
        write_shard(tmp_path / f"s{i}.bin", np.arange(n) + 10 * i, VOCAB)
        parts.append(open_shard(tmp_path / f"s{i}.bin")[1])
    stream = TokenStream(parts)
    assert stream[3:12].tolist() == [3, 4, 20, 21, 22, 30, 31, 32, 33]
    assert isinstance(stream[0:3], np.memmap)  # inside one shard: a view, no copy

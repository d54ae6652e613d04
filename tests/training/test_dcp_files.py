"""Which files of a just-written DCP checkpoint each rank hashes (`dcp.own_files`): every file
on disk exactly once over the ranks, whether `save` returns the storage map or not (torch 2.11's
`save` returned metadata with `storage_data=None` on an H200 machine, which failed every
checkpoint there before `own_files` fell back to the directory)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from taperlm.checkpoint import dcp


def _state() -> dict:
    torch.manual_seed(0)
    return {dcp.MODEL_KEY: {"a.weight": torch.randn(4, 3), "b.bias": torch.randn(5)}}


@pytest.mark.parametrize("storage_map", [True, False], ids=["storage-map", "no-storage-map"])
def test_written_files_are_every_file_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, storage_map: bool
) -> None:
    if not storage_map:
        save = dcp.torch_dcp.save

        def save_without_storage_map(*args, **kwargs):
            meta = save(*args, **kwargs)
            return dataclasses.replace(meta, storage_data=None)

        monkeypatch.setattr(dcp.torch_dcp, "save", save_without_storage_map)
    out = tmp_path / "ckpt"
    out.mkdir()
    written = dcp.write_shards(out, _state()).result()
    assert written == sorted(p.name for p in out.iterdir())
    assert dcp.METADATA_FILE in written and any(f.endswith(".distcp") for f in written)
    hashes = dcp.hash_files(out, written)
    assert sorted(hashes) == written


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("from_disk", [True, False], ids=["from-disk", "from-metadata"])
def test_every_file_is_hashed_by_exactly_one_rank(
    tmp_path: Path, world: int, from_disk: bool
) -> None:
    names = [f"__{r}_{i}.distcp" for r in range(world) for i in range(2)] + ["extra.distcp"]
    for n in [*names, dcp.METADATA_FILE, "notes.txt"]:
        (tmp_path / n).write_bytes(b"x")

    class Item:
        def __init__(self, name: str) -> None:
            self.relative_path = name

    class Meta:
        storage_data = None if from_disk else {i: Item(n) for i, n in enumerate(names)}

    per_rank = [dcp.own_files(Meta(), r, world, tmp_path) for r in range(world)]
    flat = [f for files in per_rank for f in files]
    assert sorted(flat) == sorted([*names, dcp.METADATA_FILE])  # each once; no stray file
    for r, files in enumerate(per_rank):
        assert all(f.startswith(f"__{r}_") for f in files if f.startswith("__"))

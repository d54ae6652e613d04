"""Reading DCP checkpoints without running code from them.

`torch.distributed.checkpoint` reads a checkpoint's `.metadata` with plain `pickle.load` and the
non-tensor items of its shards (optimizer hyperparameters) with `torch.load(weights_only=False)`:
both run whatever a crafted file asks for, and a manifest's sha256 does not help (whoever can
write the file can rewrite its hash). Checkpoints travel between people and clusters, so every
DCP read in taperlm goes through `reader(path)` and `planner()` here instead:

- `SafeReader.read_metadata` unpickles with an allow-list: only the classes a DCP index is made
  of (`ALLOWED`), torch dtypes and layouts, and paths; any other global stops the read with a
  `CheckpointError` before it is imported, let alone called;
- `SafeLoadPlanner.load_bytes` reads byte items with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from taperlm.errors import CheckpointError

METADATA_FILE = ".metadata"

# Every global a DCP `.metadata` written by torch 2.x pickles (module -> names). Each is a plain
# dataclass or enum rebuilt from data, or a constructor/lookup of data (Size, path, layout).
ALLOWED: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "Metadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.distributed.checkpoint.planner": frozenset({"LoadItemType", "WriteItemType"}),
    "torch": frozenset({"Size"}),  # dtypes are checked by type below
    "torch.serialization": frozenset({"_get_layout"}),  # a lookup in torch's layouts by name
    "pathlib": frozenset({"Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"}),
    "collections": frozenset({"OrderedDict"}),
}


class _IndexUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, source: Path) -> None:
        super().__init__(file)
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        if name in ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CheckpointError(
            f"{self._source} refers to {module}.{name}, which a checkpoint index never holds: "
            "the file was altered or is not a taperlm checkpoint. It was not loaded (nothing "
            "in it ran); delete this checkpoint or use one from a source you trust"
        )


def read_metadata(path: str | Path) -> Metadata:
    """The DCP index (`.metadata`) of checkpoint dir `path`, read with the allow-list."""
    source = Path(path) / METADATA_FILE
    try:
        with open(source, "rb") as f:
            meta = _IndexUnpickler(f, source).load()
    except CheckpointError:
        raise
    except OSError as err:
        raise CheckpointError(f"cannot read {source}: {err.strerror or err}") from None
    except Exception as err:  # truncated or garbled pickle: many exception types
        raise CheckpointError(
            f"{source} is not a readable checkpoint index ({type(err).__name__}: {err}); "
            "delete this checkpoint or resume from an earlier one"
        ) from None
    if not isinstance(meta, Metadata) or not isinstance(meta.state_dict_metadata, dict):
        raise CheckpointError(
            f"{source} is not a checkpoint index (it holds a {type(meta).__name__}); delete "
            "this checkpoint or resume from an earlier one"
        )
    return meta


class SafeReader(FileSystemReader):
    """DCP's file-system reader with `read_metadata` through the allow-list."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:  # per-rank metadata files: taperlm never writes them
            raise CheckpointError(f"{self.path}: per-rank checkpoint metadata is not supported")
        meta = read_metadata(Path(self.path))
        if getattr(meta, "storage_meta", None) is None:
            meta.storage_meta = StorageMeta()
        meta.storage_meta.load_id = self.load_id
        return meta


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, reading non-tensor items with `weights_only=True`."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def reader(path: str | Path) -> SafeReader:
    return SafeReader(str(path))


def planner() -> SafeLoadPlanner:
    return SafeLoadPlanner()

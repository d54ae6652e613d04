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

The index is a stranger's data too: it says which file, offset and length hold each item, and
how to decode it. `SafeReader` reads only files the checkpoint's manifest names (so only files
that were verified with it; never `../step_12/...`, an absolute path or `/dev/zero`), only
byte ranges inside them, no decoding transform (torch's `stream.zstd` would inflate a small
frame past any bound; taperlm never writes one), opens them as regular files (a FIFO would
block), and loads each item only when it is an uncompressed torch archive that fits its range.
"""

from __future__ import annotations

import contextlib
import enum
import io
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from taperlm.errors import CheckpointError, UnsafeFileError
from taperlm.files.io import MAX_RECORD_BYTES, check_stored_zip, error_text, open_regular, quoted

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
        if (module, name) == ("builtins", "getattr"):
            return self._enum_member  # the only getattr an index holds: an enum member by name
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise self._refused(f"{module}.{name}")

    def _enum_member(self, cls: Any, name: Any) -> enum.Enum:
        """`getattr(cls, name)` for a member of an allow-listed enum only: some Pythons (3.11.2,
        Debian 12's) pickle an enum member as `getattr(EnumClass, "NAME")`, others by value."""
        allowed = ALLOWED.get(getattr(cls, "__module__", ""), ())
        if not (
            isinstance(cls, enum.EnumMeta)
            and getattr(cls, "__qualname__", None) in allowed
            and isinstance(name, str)
            and name in cls.__members__
        ):
            shown = getattr(cls, "__qualname__", type(cls).__name__)
            raise self._refused(f"getattr({quoted(shown)}, {quoted(name)})")
        return cls.__members__[name]

    def _refused(self, what: str) -> CheckpointError:
        return CheckpointError(
            f"{self._source} refers to {what}, which a checkpoint index never holds: "
            "the file was altered or is not a taperlm checkpoint. It was not loaded (nothing "
            "in it ran); delete this checkpoint or use one from a source you trust"
        )


def read_metadata(path: str | Path) -> Metadata:
    """The DCP index (`.metadata`) of checkpoint dir `path`, read with the allow-list."""
    source = Path(path) / METADATA_FILE
    try:
        with open_regular(source, MAX_RECORD_BYTES, "checkpoint index") as f:
            meta = _IndexUnpickler(f, source).load()
    except CheckpointError:
        raise
    except UnsafeFileError as err:
        raise CheckpointError(
            f"{err}; delete this checkpoint or resume from an earlier one"
        ) from None
    except OSError as err:
        raise CheckpointError(f"cannot read {source}: {err.strerror or err}") from None
    except Exception as err:  # truncated or garbled pickle: many exception types
        raise CheckpointError(
            f"{source} is not a readable checkpoint index ({error_text(err)}); "
            "delete this checkpoint or resume from an earlier one"
        ) from None
    if not isinstance(meta, Metadata) or not isinstance(meta.state_dict_metadata, dict):
        raise CheckpointError(
            f"{source} is not a checkpoint index (it holds a {type(meta).__name__}); delete "
            "this checkpoint or resume from an earlier one"
        )
    return meta


class _Slice(io.RawIOBase):
    """Bytes `offset .. offset + length` of an open file, as a seekable file of its own (torch's
    own view gets seeks from the end wrong, which a zip reader needs)."""

    def __init__(self, base: IO[bytes], offset: int, length: int) -> None:
        super().__init__()
        self._base, self._start, self._len, self._pos = base, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET, /) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._len}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), self._len - self._pos))
        if n == 0:
            return 0
        self._base.seek(self._start + self._pos)
        got = self._base.readinto(memoryview(b)[:n])
        self._pos += got or 0
        return got or 0


class _RegularFiles(FileSystem):
    """DCP's file system, opening every file through `open_regular` (no FIFO or device) and
    at no more than the size its manifest gives."""

    def __init__(self, sizes: dict[str, int]) -> None:
        super().__init__()
        self._sizes = sizes

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[IO[bytes]]:
        if mode != "rb":
            raise CheckpointError(f"{path}: a checkpoint is only read here")
        p = Path(path)
        with open_regular(p, self._sizes.get(p.name, 0), "checkpoint shard") as f:
            yield f


class SafeReader(FileSystemReader):
    """DCP's file-system reader with `read_metadata` through the allow-list and the index
    checked against the checkpoint's `manifest` (module doc)."""

    def __init__(self, path: str | Path, shards: dict[str, int]) -> None:
        super().__init__(str(path))
        self._root = Path(path)
        self._sizes = dict(shards)
        self.fs = _RegularFiles(self._sizes)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:  # per-rank metadata files: taperlm never writes them
            raise CheckpointError(f"{self.path}: per-rank checkpoint metadata is not supported")
        meta = read_metadata(self._root)
        check_storage(self._root, meta, self._sizes)
        if getattr(meta, "storage_meta", None) is None:
            meta.storage_meta = StorageMeta()
        meta.storage_meta.load_id = self.load_id
        return meta

    def _slice_file(self, file: Any, sinfo: Any) -> IO[bytes]:
        view = _Slice(file, sinfo.offset, sinfo.length)
        try:
            check_stored_zip(view, sinfo.length, f"an item of {self._root / sinfo.relative_path}")
        except UnsafeFileError as err:
            raise CheckpointError(
                f"{err}; delete this checkpoint or resume from an earlier one"
            ) from None
        return view  # type: ignore[return-value]


def check_storage(root: Path, meta: Metadata, sizes: dict[str, int]) -> None:
    """CheckpointError unless every item of the index lies in a shard file the manifest names
    (`sizes`: name -> bytes), inside its bytes, with no decoding transform."""
    storage = getattr(meta, "storage_data", None)
    if not isinstance(storage, dict):
        raise CheckpointError(f"{root / METADATA_FILE} has no storage table; it is corrupt")
    for info in storage.values():
        name = getattr(info, "relative_path", None)
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        shown = repr(name)[:100]
        problem = None
        if not isinstance(name, str) or name not in sizes:
            problem = f"places an item in {shown}, a file its manifest does not name"
        elif getattr(info, "transform_descriptors", None):
            problem = f"asks for a decoding transform of an item of {shown} (taperlm writes none)"
        elif not (isinstance(offset, int) and isinstance(length, int) and offset >= 0):
            problem = f"gives an item of {shown} no valid byte range"
        elif length < 0 or offset + length > sizes[name]:
            problem = f"places an item past the end of {shown} ({sizes[name]} bytes)"
        if problem is not None:
            raise CheckpointError(
                f"checkpoint index {root / METADATA_FILE} {problem}: it was edited or crafted. "
                "Nothing was loaded from it; delete this checkpoint or resume from an earlier one"
            )


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, reading non-tensor items with `weights_only=True`."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def reader(path: str | Path, shards: dict[str, int]) -> SafeReader:
    """The safe DCP reader of checkpoint `path`, reading only the shard files `shards` (name ->
    bytes, from its checked manifest: `store.shard_sizes`) names."""
    return SafeReader(path, shards)


def planner() -> SafeLoadPlanner:
    return SafeLoadPlanner()

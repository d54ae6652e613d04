"""Read a GGUF file that a stranger wrote, bounded (the reading half of `taperlm.interop.gguf_export`).

The `gguf` package's reader memory-maps the whole file and trusts its header: a crafted count
or length makes it allocate or walk without bound. So the header is parsed here, every number
checked before it is used: the magic and version, tensor and key counts, each string's and
array's declared length against the bytes left in the file (and a cap), value types from the
format's closed set (arrays of arrays refused), tensor ranks, dimensions, element counts and
ggml types, the alignment, and every tensor's byte range inside the file, aligned, with no two
ranges overlapping. Tensors are then read with one bounded read each through
`taperlm.files.io.open_regular` (a FIFO or device is refused without blocking) and dequantized to
float32 with `gguf.quants.dequantize` (numpy only: no code runs from the file).
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from taperlm.errors import CheckpointError, ConfigError
from taperlm.files.io import open_regular

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # 1 used 32-bit counts and is long gone
# Far beyond any real file (a 405B model has ~1,100 tensors and ~40 keys; a 256k vocabulary is
# one array of 256k strings), so a crafted count fails at once.
MAX_TENSORS = 1 << 16
MAX_KEYS = 1 << 12
MAX_STRING_BYTES = 1 << 20  # one key or string value (a chat template is a few KiB)
MAX_ARRAY_ITEMS = 1 << 24
MAX_HEADER_BYTES = 1 << 30  # tokens and merges of a large vocabulary: tens of MiB
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_ELEMENTS = 1 << 40
DEFAULT_ALIGNMENT = 32
# GGUFValueType -> struct format of its scalars (8 = string, 9 = array: read below)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: its ggml type name, shape in our (row-major, outermost
    first) order, and its absolute byte range in the file."""

    type_name: str
    """the ggml type (F32, F16, BF16, Q8_0, Q4_K, ...)."""
    shape: tuple[int, ...]
    """numpy shape (GGUF lists the dimensions innermost first: reversed)."""
    start: int
    """first byte in the file."""
    nbytes: int
    """bytes of its data."""


@dataclass(frozen=True)
class GGUFHeader:
    """The metadata keys and tensor table of a GGUF file, checked."""

    metadata: dict[str, Any]
    """key -> value (numbers, strings, booleans, lists of them)."""
    tensors: dict[str, TensorInfo]
    """tensor name -> where and what it is."""


class _Reader:
    """Reads the header's little-endian fields, each bounded by the bytes left in the file."""

    def __init__(self, f: IO[bytes], size: int, path: Path) -> None:
        self.f, self.size, self.path = f, size, path

    def bad(self, what: str) -> CheckpointError:
        return CheckpointError(
            f"{self.path} is not a GGUF file taperlm reads, or it is damaged or crafted: {what}"
        )

    def take(self, n: int, what: str) -> bytes:
        left = self.size - self.f.tell()
        if n > left or self.f.tell() + n > MAX_HEADER_BYTES:
            raise self.bad(f"{what} claims {n} bytes where {left} remain")
        return self.f.read(n)

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def count(self, what: str, cap: int) -> int:
        n = self.scalar("<Q", what)
        if n > cap:
            raise self.bad(f"{what} is {n}, more than taperlm reads ({cap})")
        return n

    def string(self, what: str) -> str:
        n = self.count(f"the length of {what}", MAX_STRING_BYTES)
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError:
            raise self.bad(f"{what} is not UTF-8") from None

    def value(self, vtype: int, what: str, nested: bool = False) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY and not nested:
            inner = self.scalar("<I", f"the item type of {what}")
            n = self.count(f"the length of {what}", MAX_ARRAY_ITEMS)
            if inner in _SCALARS:  # the items' bytes, checked at once
                fmt = _SCALARS[inner]
                raw = self.take(n * struct.calcsize(fmt), what)
                return [x[0] for x in struct.iter_unpack(fmt, raw)] if n else []
            return [self.value(inner, f"{what}[{i}]", nested=True) for i in range(n)]
        raise self.bad(f"{what} has value type {vtype}, which GGUF does not define here")


def _ggml_types() -> dict[int, tuple[str, int, int]]:
    """ggml type id -> (name, elements per block, bytes per block), from the gguf package."""
    try:
        import gguf
    except ImportError:
        raise ConfigError(
            "GGUF import needs the gguf package: pip install 'taperlm[gguf]'"
        ) from None
    return {
        int(t): (t.name, *gguf.GGML_QUANT_SIZES[t])
        for t in gguf.GGMLQuantizationType
        if t in gguf.GGML_QUANT_SIZES
    }


def read_header(path: str | Path) -> GGUFHeader:
    """The checked header of the GGUF file `path` (see the module docstring); CheckpointError
    naming what is wrong with a damaged or crafted one."""
    path = Path(path)
    types = _ggml_types()
    with open_regular(path, what="GGUF file") as f:
        size = f.seek(0, 2)
        f.seek(0)
        r = _Reader(f, size, path)
        if size < 4 or f.read(4) != MAGIC:
            raise r.bad("it does not start with GGUF")
        version = r.scalar("<I", "the version")
        if version not in VERSIONS:
            raise r.bad(f"its version is {version}; taperlm reads GGUF {VERSIONS}")
        n_tensors = r.count("the tensor count", MAX_TENSORS)
        n_keys = r.count("the metadata key count", MAX_KEYS)
        metadata: dict[str, Any] = {}
        for i in range(n_keys):
            key = r.string(f"metadata key {i}")
            if key in metadata:
                raise r.bad(f"the metadata key {key!r} is given twice")
            metadata[key] = r.value(r.scalar("<I", f"the type of {key!r}"), repr(key))
        table = [_tensor_entry(r, types, i) for i in range(n_tensors)]
        align = _alignment(r, metadata)
        data_start = _aligned(f.tell(), align)
    return GGUFHeader(metadata, _place(r, table, data_start, align))


def _alignment(r: _Reader, metadata: dict[str, Any]) -> int:
    align = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(align, bool) or not isinstance(align, int) or not 0 < align <= 1 << 16:
        raise r.bad(f"general.alignment is {align!r}")
    if align & (align - 1):
        raise r.bad(f"general.alignment {align} is not a power of two")
    return align


def _aligned(offset: int, align: int) -> int:
    return (offset + align - 1) // align * align


def _tensor_entry(
    r: _Reader, types: dict[int, tuple[str, int, int]], i: int
) -> tuple[str, str, tuple[int, ...], int, int]:
    """(name, type name, numpy shape, offset from the data start, bytes) of tensor `i`."""
    name = r.string(f"the name of tensor {i}")
    n_dims = r.scalar("<I", f"the rank of {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise r.bad(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS})")
    dims = [r.scalar("<Q", f"a dimension of {name!r}") for _ in range(n_dims)]
    ggml_type = r.scalar("<I", f"the type of {name!r}")
    offset = r.scalar("<Q", f"the offset of {name!r}")
    if ggml_type not in types:
        raise r.bad(f"tensor {name!r} has ggml type {ggml_type}, which gguf does not know")
    type_name, block, block_bytes = types[ggml_type]
    if any(d < 1 for d in dims) or math.prod(dims) > MAX_ELEMENTS:
        raise r.bad(f"tensor {name!r} has dimensions {dims}")
    if dims[0] % block:
        raise r.bad(f"tensor {name!r} ({type_name}) has rows of {dims[0]}, not whole blocks")
    nbytes = math.prod(dims) // block * block_bytes
    return name, type_name, tuple(reversed(dims)), offset, nbytes


def _place(
    r: _Reader, table: list[tuple[str, str, tuple[int, ...], int, int]], start: int, align: int
) -> dict[str, TensorInfo]:
    """Each tensor's absolute byte range: aligned, inside the file, no two overlapping, no name
    twice."""
    out: dict[str, TensorInfo] = {}
    for name, type_name, shape, offset, nbytes in table:
        if name in out:
            raise r.bad(f"tensor {name!r} is listed twice")
        if offset % align or start + offset + nbytes > r.size:
            raise r.bad(
                f"tensor {name!r} claims bytes {start + offset}..{start + offset + nbytes} "
                f"(alignment {align}), outside the file's {r.size} bytes or misaligned"
            )
        out[name] = TensorInfo(type_name, shape, start + offset, nbytes)
    ranges = sorted((t.start, t.start + t.nbytes, n) for n, t in out.items())
    for (_, end, a), (begin, _, b) in itertools.pairwise(ranges):
        if begin < end:
            raise r.bad(f"the data of tensors {a!r} and {b!r} overlap")
    return out


def read_tensor(path: str | Path, info: TensorInfo) -> np.ndarray:
    """One tensor of the file as float32 of its shape (dequantized when quantized)."""
    import gguf  # present: read_header needed it

    with open_regular(Path(path), what="GGUF file") as f:
        f.seek(info.start)
        raw = f.read(info.nbytes)
    if len(raw) != info.nbytes:
        raise CheckpointError(f"{path} was truncated while a tensor was read")
    qtype = gguf.GGMLQuantizationType[info.type_name]
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(*info.shape[:-1], -1)
    # a copy: the F32 case is a view of the read-only bytes
    return np.array(gguf.quants.dequantize(rows, qtype), dtype=np.float32).reshape(info.shape)


def read_tensors(
    path: str | Path, header: GGUFHeader, names: list[str], convert: Callable[..., Any] = np.array
) -> dict[str, Any]:
    """`names` of the file as float32 arrays (passed through `convert`, e.g. torch.from_numpy)."""
    return {n: convert(read_tensor(path, header.tensors[n])) for n in names}

"""Token shards: a 64-byte header followed by little-endian uint16/uint32 token ids.

Header layout (little-endian, 64 bytes):

    offset size  field
    0      8     magic b"TAPERTOK"
    8      4     format version (uint32, currently 1)
    12     4     dtype code (uint32): 2 = uint16, 4 = uint32 (the item size in bytes)
    16     8     token count (uint64)
    24     8     vocab size (uint64): every id is < vocab size
    32     4     zlib.crc32 of the token payload (uint32)
    36     4     zlib.crc32 of header bytes 0..35 (uint32)
    40     24    zeros (reserved)

uint16 is used when vocab_size <= 65536. Readers map the payload with `numpy.memmap` at offset 64.
Writes go to `<name>.tmp` and are moved into place with os.replace, so a reader never sees a
half-written shard.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from taperlm.errors import DataError

MAGIC = b"TAPERTOK"
VERSION = 1
HEADER_SIZE = 64
_FIELDS = struct.Struct("<8sIIQQI")  # magic, version, dtype code, count, vocab, payload crc
_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}
_CRC_CHUNK = 1 << 24  # bytes per crc32 update when verifying (bounded memory)


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """uint16 when every id fits in 16 bits, else uint32."""
    if vocab_size <= 0 or vocab_size > 2**32:
        raise DataError(f"vocab_size {vocab_size} is out of range for a token shard")
    return _DTYPES[2] if vocab_size <= 2**16 else _DTYPES[4]


@dataclass(frozen=True)
class ShardHeader:
    version: int
    dtype: np.dtype
    count: int
    vocab_size: int
    crc32: int

    def pack(self) -> bytes:
        head = _FIELDS.pack(
            MAGIC, self.version, self.dtype.itemsize, self.count, self.vocab_size, self.crc32
        )
        return (head + struct.pack("<I", zlib.crc32(head))).ljust(HEADER_SIZE, b"\0")


def parse_header(raw: bytes, path: str | Path = "<shard>") -> ShardHeader:
    """Decode and check a header; DataError says which check failed."""
    if len(raw) < HEADER_SIZE:
        raise DataError(
            f"{path}: truncated shard: {len(raw)} bytes, smaller than the "
            f"{HEADER_SIZE}-byte header; re-run `taperlm prepare`"
        )
    magic, version, code, count, vocab, crc = _FIELDS.unpack_from(raw)
    if magic != MAGIC:
        raise DataError(
            f"{path}: not a taperlm token shard (magic bytes {magic!r}, expected "
            f"{MAGIC!r}); re-run `taperlm prepare`"
        )
    (head_crc,) = struct.unpack_from("<I", raw, _FIELDS.size)
    if head_crc != zlib.crc32(raw[: _FIELDS.size]):
        raise DataError(
            f"{path}: corrupt shard header (header checksum mismatch); re-run `taperlm prepare`"
        )
    if version != VERSION:
        raise DataError(
            f"{path}: unsupported shard format version {version} (this taperlm "
            f"reads version {VERSION}); re-run `taperlm prepare` or upgrade taperlm"
        )
    if code not in _DTYPES:
        raise DataError(f"{path}: corrupt shard header (dtype code {code})")
    return ShardHeader(version, _DTYPES[code], count, vocab, crc)


class ShardWriter:
    """Streams token arrays into a shard; `close()` writes the header and publishes the file.

    Use as a context manager: on an exception the temporary file is removed.
    """

    def __init__(self, path: str | Path, vocab_size: int) -> None:
        self.path = Path(path)
        self.vocab_size = int(vocab_size)
        self.dtype = dtype_for_vocab(self.vocab_size)
        self.count = 0
        self.crc = 0
        self._tmp = self.path.with_name(self.path.name + ".tmp")
        self._file = open(self._tmp, "wb")  # noqa: SIM115 (closed in close/abort)
        self._file.write(b"\0" * HEADER_SIZE)

    def write(self, tokens: np.ndarray | Iterable[int]) -> None:
        arr = np.asarray(tokens)
        if arr.size == 0:
            return
        if arr.min() < 0 or arr.max() >= self.vocab_size:
            bad = int(arr.max()) if arr.max() >= self.vocab_size else int(arr.min())
            raise DataError(
                f"{self.path}: token id {bad} is outside [0, {self.vocab_size}); the "
                "tokenizer and vocab_size disagree"
            )
        data = arr.astype(self.dtype, copy=False).tobytes()
        self.crc = zlib.crc32(data, self.crc)
        self.count += arr.size
        self._file.write(data)

    def close(self) -> ShardHeader:
        header = ShardHeader(VERSION, self.dtype, self.count, self.vocab_size, self.crc)
        self._file.seek(0)
        self._file.write(header.pack())
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self.path)
        return header

    def abort(self) -> None:
        self._file.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_shard(
    path: str | Path, tokens: np.ndarray | Iterable[int], vocab_size: int
) -> ShardHeader:
    """Write one array of token ids as a shard (atomically)."""
    writer = ShardWriter(path, vocab_size)
    try:
        writer.write(np.asarray(tokens))
    except BaseException:
        writer.abort()
        raise
    return writer.close()


def read_header(path: str | Path) -> ShardHeader:
    """Header of a shard, checked against the file size."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: shard not found; run `taperlm prepare`")
    size = path.stat().st_size
    with open(path, "rb") as f:
        header = parse_header(f.read(HEADER_SIZE), path)
    expected = HEADER_SIZE + header.count * header.dtype.itemsize
    if size < expected:
        raise DataError(
            f"{path}: truncated shard: header says {header.count} tokens "
            f"({expected} bytes) but the file has {size} bytes; re-run "
            "`taperlm prepare`"
        )
    if size > expected:
        raise DataError(
            f"{path}: shard has {size - expected} bytes after its {header.count} "
            "tokens; the file is corrupt, re-run `taperlm prepare`"
        )
    return header


def open_shard(path: str | Path, verify: bool = False) -> tuple[ShardHeader, np.ndarray]:
    """(header, read-only memmap of the tokens). `verify=True` also checks the payload checksum
    and that every id is < vocab_size (reads the whole file)."""
    header = read_header(path)
    if header.count == 0:
        tokens = np.zeros(0, dtype=header.dtype)
    else:
        tokens = np.memmap(
            path, dtype=header.dtype, mode="r", offset=HEADER_SIZE, shape=(header.count,)
        )
    if verify:
        verify_tokens(path, header, tokens)
    return header, tokens


def verify_tokens(path: str | Path, header: ShardHeader, tokens: np.ndarray) -> None:
    """Checksum and id-range check of a shard's payload, in bounded-memory chunks."""
    crc = 0
    top = -1
    step = max(1, _CRC_CHUNK // header.dtype.itemsize)
    for start in range(0, header.count, step):
        chunk = np.asarray(tokens[start : start + step])
        crc = zlib.crc32(chunk.tobytes(), crc)
        top = max(top, int(chunk.max()))
    if crc != header.crc32:
        raise DataError(
            f"{path}: checksum mismatch (crc32 {crc:#010x}, header says "
            f"{header.crc32:#010x}): the shard is corrupt; re-run `taperlm prepare`"
        )
    if top >= header.vocab_size:
        raise DataError(
            f"{path}: token id {top} >= vocab_size {header.vocab_size}; the shard "
            "does not match its tokenizer, re-run `taperlm prepare`"
        )

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

A split is a list of shards read as one stream (`TokenStream`); `ShardSeries` writes one as
shards of a fixed token count (``PREFIX-00000.bin``, ...) and can continue after a crash from its
last `sync()`.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from taperlm.errors import DataError, UnsafeFileError
from taperlm.files.io import not_a_file, open_regular

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

    Use as a context manager: on an exception the temporary file is removed. `resume=(count,
    crc32)` reopens an existing `<name>.tmp` whose first `count` tokens (payload checksum `crc32`)
    were written before, cutting off anything after them.
    """

    def __init__(
        self, path: str | Path, vocab_size: int, *, resume: tuple[int, int] | None = None
    ) -> None:
        self.path = Path(path)
        self.vocab_size = int(vocab_size)
        self.dtype = dtype_for_vocab(self.vocab_size)
        self.count = 0
        self.crc = 0
        self._tmp = self.path.with_name(self.path.name + ".tmp")
        if resume is None:
            self._file = open(self._tmp, "wb")  # noqa: SIM115 (closed in close/abort)
            self._file.write(b"\0" * HEADER_SIZE)
        else:
            self.count, self.crc = int(resume[0]), int(resume[1])
            self._file = open(self._tmp, "r+b")  # noqa: SIM115
            self._file.truncate(HEADER_SIZE + self.count * self.dtype.itemsize)
            self._file.seek(0, os.SEEK_END)

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

    def sync(self) -> None:
        """Make everything written so far durable (before recording it as resumable)."""
        self._file.flush()
        os.fsync(self._file.fileno())

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
    kind = not_a_file(path)
    if kind is not None:
        raise DataError(
            f"{path}: the shard is {kind}, not a regular file; re-run `taperlm prepare`"
        )
    if not path.is_file():
        raise DataError(f"{path}: shard not found; run `taperlm prepare`")
    try:
        with open_regular(path, what="shard") as f:
            size = os.fstat(f.fileno()).st_size
            header = parse_header(f.read(HEADER_SIZE), path)
    except UnsafeFileError as err:
        raise DataError(f"{err}; re-run `taperlm prepare`") from None
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


def payload_crc32(path: str | Path, dtype: np.dtype, count: int) -> int:
    """zlib.crc32 of the first `count` tokens of a shard file (bounded memory)."""
    crc = 0
    left = count * dtype.itemsize
    with open_regular(path, what="shard") as f:
        f.seek(HEADER_SIZE)
        while left > 0:
            data = f.read(min(left, _CRC_CHUNK))
            if not data:
                raise DataError(f"{path}: shorter than {count} tokens")
            crc = zlib.crc32(data, crc)
            left -= len(data)
    return crc


# --- a split as a list of shards ----------------------------------------------------------------


def shard_name(prefix: str, index: int) -> str:
    return f"{prefix}-{index:05d}.bin"


class ResumeMismatch(Exception):
    """The files on disk do not match a saved ShardSeries state (the caller starts over)."""


class ShardSeries:
    """One split written as shards of exactly `shard_tokens` tokens (the last may hold fewer),
    ``PREFIX-00000.bin``, ``PREFIX-00001.bin``, ... in `directory`. A shard is published (header
    written, renamed from .tmp) as soon as it is full. `sync()` makes everything durable and
    returns a state; `ShardSeries(..., state=s)` continues from it after a crash: published shards
    are checked against their recorded headers, the open shard is cut back to its recorded length
    (after checking its checksum) and later files are removed. Any disagreement raises
    `ResumeMismatch`."""

    def __init__(
        self,
        directory: Path,
        prefix: str,
        vocab_size: int,
        shard_tokens: int,
        state: dict | None = None,
    ) -> None:
        if shard_tokens < 1:
            raise DataError(f"shard size {shard_tokens} must be at least 1 token")
        self.directory = Path(directory)
        self.prefix = prefix
        self.vocab_size = int(vocab_size)
        self.shard_tokens = int(shard_tokens)
        self.done: list[dict] = []
        self._writer: ShardWriter | None = None
        if state is not None:
            self._restore(state)

    @property
    def tokens(self) -> int:
        open_count = self._writer.count if self._writer is not None else 0
        return sum(d["tokens"] for d in self.done) + open_count

    def write(self, tokens: np.ndarray) -> None:
        pos = 0
        while pos < len(tokens):
            if self._writer is None:
                self._writer = ShardWriter(self._path(len(self.done)), self.vocab_size)
            take = min(len(tokens) - pos, self.shard_tokens - self._writer.count)
            self._writer.write(tokens[pos : pos + take])
            pos += take
            if self._writer.count == self.shard_tokens:
                self._publish()

    def state(self) -> dict:
        w = self._writer
        return {
            "done": [dict(d) for d in self.done],
            "open": {"tokens": w.count if w else 0, "crc32": w.crc if w else 0},
        }

    def sync(self) -> dict:
        if self._writer is not None:
            self._writer.sync()
        return self.state()

    def close(self) -> list[dict]:
        """Publish the open shard (an empty split still gets one empty shard); return the list."""
        if self._writer is not None and (self._writer.count > 0 or not self.done):
            self._publish()
        elif self._writer is not None:
            self._writer.abort()
            self._writer = None
        elif not self.done:
            self._writer = ShardWriter(self._path(0), self.vocab_size)
            self._publish()
        return [dict(d) for d in self.done]

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.abort()
            self._writer = None

    def _path(self, index: int) -> Path:
        return self.directory / shard_name(self.prefix, index)

    def _publish(self) -> None:
        assert self._writer is not None
        header = self._writer.close()
        self.done.append(
            {"file": self._writer.path.name, "tokens": header.count, "crc32": header.crc32}
        )
        self._writer = None

    def _restore(self, state: dict) -> None:
        for i, d in enumerate(state["done"]):
            path = self._path(i)
            if d["file"] != path.name:
                raise ResumeMismatch(f"{path}: saved as {d['file']}")
            try:
                header = read_header(path)
            except DataError as err:
                raise ResumeMismatch(str(err)) from None
            if (header.count, header.crc32) != (d["tokens"], d["crc32"]):
                raise ResumeMismatch(f"{path}: header differs from the saved state")
            self.done.append(dict(d))
        k = len(self.done)
        count, crc = int(state["open"]["tokens"]), int(state["open"]["crc32"])
        path = self._path(k)
        tmp = path.with_name(path.name + ".tmp")
        if not tmp.exists() and path.exists():
            os.replace(path, tmp)  # published after the state was saved: reopen it
        for extra in self._later_files(k):
            extra.unlink()
        if count == 0:
            tmp.unlink(missing_ok=True)
            return
        dtype = dtype_for_vocab(self.vocab_size)
        if not tmp.exists() or tmp.stat().st_size < HEADER_SIZE + count * dtype.itemsize:
            raise ResumeMismatch(f"{tmp}: missing or shorter than its saved {count} tokens")
        if payload_crc32(tmp, dtype, count) != crc:
            raise ResumeMismatch(f"{tmp}: checksum differs from the saved state")
        self._writer = ShardWriter(path, self.vocab_size, resume=(count, crc))

    def _later_files(self, k: int) -> Iterator[Path]:
        for p in self.directory.glob(f"{self.prefix}-*.bin*"):
            stem = p.name[len(self.prefix) + 1 :].split(".", 1)[0]
            if stem.isdigit() and int(stem) > k:
                yield p


class TokenStream:
    """Several shards' tokens read as one array (a split). `len()`, an integer index and a slice
    of step 1 work as on a numpy array (a slice inside one shard is a view of its memmap, one
    across shards a copy); `numpy.asarray(stream)` concatenates everything (small splits only)."""

    def __init__(self, parts: list[np.ndarray]) -> None:
        self.parts = parts
        self.starts = np.cumsum([0] + [len(p) for p in parts], dtype=np.int64)
        self.dtype = parts[0].dtype if parts else np.dtype("<u2")

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                return np.asarray(self)[key]
            return self._range(start, stop)
        i = int(key)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"index {key} is out of range for {len(self)} tokens")
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return self.parts[k][i - self.starts[k]]

    def _range(self, start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return np.empty(0, dtype=self.dtype)
        k = int(np.searchsorted(self.starts, start, side="right")) - 1
        first = int(self.starts[k])
        if stop <= self.starts[k + 1]:
            return self.parts[k][start - first : stop - first]
        pieces = []
        while start < stop:
            lo, hi = int(self.starts[k]), int(self.starts[k + 1])
            if hi > start:
                pieces.append(np.asarray(self.parts[k][start - lo : min(stop, hi) - lo]))
                start = min(stop, hi)
            k += 1
        return np.concatenate(pieces)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        arr = np.asarray(self._range(0, len(self)))
        return arr if dtype is None else arr.astype(dtype)

    def astype(self, dtype) -> np.ndarray:
        return np.asarray(self, dtype=dtype)

"""Streaming readers: local files and Hugging Face datasets, read incrementally and restartable.

Every reader yields `(Document, Cursor)` pairs in a fixed order; the cursor names the position
*after* that document, and `read(start=cursor)` continues from exactly there (how a killed
`taperlm prepare` resumes). Memory does not depend on the size of a file or of the corpus: text is
read in blocks or lines, and a document longer than `max_doc_chars` is cut into pieces.

Kinds of local file (a folder: every file of these kinds below it, hidden ones skipped, sorted by
relative path):

- ``.txt``: one document, cut into pieces when longer than ``max_doc_chars`` (`split_stream`).
- ``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst``: one document per line, from the string field
  ``text_field`` (empty texts skipped). ``.zst`` needs the ``zstandard`` package.
- ``.parquet``: one document per row, from the string column ``text_field`` (nulls and empty
  texts skipped). Needs ``pyarrow``.

Cutting long documents (`split_stream`): while more than ``cap`` characters are left, the next piece
ends at the last blank line (``\\n\\n``) within the next ``cap`` characters, else at the last line
break, else at the last space, else after exactly ``cap`` characters; the separator at the cut is
dropped (the pieces are separate documents, so an EOS takes its place), the pieces of a cut
document lose their leading and trailing line breaks, and pieces that are only whitespace are
skipped. A document of at most ``cap`` characters is kept as it is. The rule depends only on the text, so a file streamed in blocks and the
same text held in memory give the same pieces.
"""

from __future__ import annotations

import codecs
import gzip
import importlib
import io
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from taperlm.errors import DataError, MalformedFileError, UnsafeFileError
from taperlm.files.io import bounded_line, check_regular, not_a_file, open_regular, parse_json

DEFAULT_MAX_DOC_CHARS = 1_000_000
DATA_EXTRA = "pip install 'taperlm[data]'"
_BLOCK = 1 << 20  # bytes per read of a .txt file
_SNIFF = 1 << 16  # bytes checked for NUL (binary files)
_HF_SNAPSHOT_ROWS = 1000  # rows between saved positions of a streamed Hugging Face dataset


def max_line_bytes(cap: int) -> int:
    """The longest .jsonl line read when documents are cut at `cap` characters: a line whose
    text field holds `cap` characters is at most 12 bytes per character (a character outside
    the BMP written as two \\uXXXX escapes) plus 1 MiB for the other fields, so every document
    that fits `--max-doc-chars` is read, and a longer line (a 60 KB .zst holding one 2 GB line)
    is refused after that many bytes instead of being decompressed whole."""
    return 12 * cap + (1 << 20)


# name suffix -> kind; the longest matching suffix wins (".jsonl.gz" before ".gz").
KINDS = {
    ".txt": "txt",
    ".jsonl": "jsonl",
    ".jsonl.gz": "jsonl.gz",
    ".jsonl.zst": "jsonl.zst",
    ".parquet": "parquet",
}


@dataclass(frozen=True)
class Document:
    """One unit of text; documents are separated by EOS in the token stream."""

    name: str
    text: str


@dataclass(frozen=True)
class Cursor:
    """A position in a source: the next document is piece `piece` of row `row` of file `file`
    (a .txt file is one row; for hf: sources `file` is 0). `snapshot` is a Hugging Face
    dataset's own saved position at an earlier row, (row, state_dict), so resuming a stream does
    not download it again."""

    file: int = 0
    row: int = 0
    piece: int = 0
    snapshot: tuple[int, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "row": self.row, "piece": self.piece}
        if self.snapshot is not None:
            out["snapshot"] = {"row": self.snapshot[0], "state": self.snapshot[1]}
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cursor:
        snap = data.get("snapshot")
        return cls(
            int(data["file"]),
            int(data["row"]),
            int(data["piece"]),
            (int(snap["row"]), snap["state"]) if snap else None,
        )


# --- cutting long documents ---------------------------------------------------------------------


def split_stream(chunks: Iterable[str], cap: int) -> Iterator[str]:
    """Pieces of the text `chunks` concatenate to, each at most `cap` characters (module doc)."""
    buf, start, cut_any = "", 0, False
    for chunk in chunks:
        buf = buf[start:] + chunk if start else buf + chunk
        start = 0
        while len(buf) - start > cap:
            end = start + cap
            for sep in ("\n\n", "\n", " "):
                cut = buf.rfind(sep, start, end)
                if cut > start:
                    skip = len(sep)
                    break
            else:
                cut, skip = end, 0
            piece = buf[start:cut].strip("\n")
            if piece and not piece.isspace():
                yield piece
            start, cut_any = cut + skip, True
    rest = buf[start:].strip("\n") if cut_any else buf[start:]
    if rest and not rest.isspace():
        yield rest


def split_long(text: str, cap: int) -> Iterator[str]:
    """`split_stream` of one in-memory text."""
    return split_stream((text,), cap)


# --- listing and checking local files ----------------------------------------------------------


def kind_of(path: Path) -> str | None:
    name = path.name.lower()
    best = None
    for suffix, kind in KINDS.items():
        if name.endswith(suffix) and (best is None or len(suffix) > len(best[0])):
            best = (suffix, kind)
    return best[1] if best else None


def local_files(path: Path) -> list[Path]:
    """The source files of a local path: the file itself, or the known kinds below a folder."""
    kind = not_a_file(path)
    if kind and kind != "a folder":
        raise DataError(
            f"source {path} is {kind}, not a file or folder; taperlm reads regular files "
            f"({', '.join(KINDS)}) or folders of them"
        )
    if not path.exists():
        raise DataError(
            f"source {path} does not exist; pass --source default, a file "
            f"({', '.join(KINDS)}) or folder, or hf:NAME[:CONFIG]"
        )
    if path.is_file():
        if kind_of(path) is None:
            raise DataError(
                f"source {path}: unknown kind of file; expected one of {', '.join(KINDS)}"
            )
        return [path]
    found = [
        p
        for p in path.rglob("*")
        if kind_of(p) is not None
        and not any(part.startswith(".") for part in p.relative_to(path).parts)
    ]
    # A source-named entry that is no regular file would be skipped without a word (a FIFO
    # would hang the reader): name it. Subfolders named like files are folders to walk.
    odd = [(p, k) for p in found if (k := not_a_file(p)) and k != "a folder"]
    if odd:
        p, k = odd[0]
        more = f" (and {len(odd) - 1} more)" if len(odd) > 1 else ""
        raise DataError(
            f"source folder {path}: {p.relative_to(path)} is {k}, not a regular file{more}; "
            "remove it or move it out of the folder"
        )
    files = sorted((p for p in found if p.is_file()), key=lambda p: p.relative_to(path).as_posix())
    if not files:
        raise DataError(f"source folder {path} has no {', '.join(KINDS)} files")
    return files


def require_module(module: str, what: str):
    """Import an optional dependency or fail naming the extra that provides it."""

    try:
        return importlib.import_module(module)
    except ImportError:
        raise DataError(f"{what} needs the {module!r} package: {DATA_EXTRA}") from None


_MAGIC = {"jsonl.gz": b"\x1f\x8b", "jsonl.zst": b"\x28\xb5\x2f\xfd", "parquet": b"PAR1"}


def check_file(path: Path) -> None:
    """Cheap checks before any work: empty, binary, wrong magic bytes, missing optional package."""
    kind = kind_of(path)
    if kind == "jsonl.zst":
        require_module("zstandard", f"{path} (.zst)")
    if kind == "parquet":
        require_module("pyarrow", f"{path} (Parquet)")
    try:
        with open_regular(path, what="source file") as f:
            head = f.read(_SNIFF)
    except UnsafeFileError as err:
        raise DataError(str(err)) from None
    if not head.strip() and len(head) < _SNIFF:
        raise DataError(f"{path}: file is empty; remove it or add text")
    magic = _MAGIC.get(kind or "")
    if magic is not None and not head.startswith(magic):
        raise DataError(
            f"{path}: not a {kind} file (it does not start with the {kind} magic bytes); "
            "rename it or fix the file"
        )
    if magic is None and b"\x00" in head:
        raise DataError(
            f"{path}: looks like a binary file (contains NUL bytes); only UTF-8 text "
            f"({', '.join(KINDS)}) can be used as a source"
        )


# --- reading local files -------------------------------------------------------------------------


class ByteCounter:
    """How many bytes of the source have been read (for progress and ETA)."""

    def __init__(self) -> None:
        self.done = 0  # bytes of files finished
        self.current: Callable[[], int] = lambda: 0  # position in the open file

    def __call__(self) -> int:
        return self.done + self.current()


def _text_blocks(raw: BinaryIO, path: Path) -> Iterator[str]:
    """Decoded text of a .txt file in blocks: strict UTF-8 (error names the byte offset), BOM
    removed, CRLF turned into LF (also across block boundaries)."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset = 0
    first, held_cr = True, ""
    while True:
        data = raw.read(_BLOCK)
        final = not data
        pending = len(decoder.getstate()[0])
        try:
            text = decoder.decode(data, final=final)
        except UnicodeDecodeError as err:
            pos = offset - pending + err.start
            raise DataError(
                f"{path}: not valid UTF-8 (byte {pos}: {err.object[err.start : err.start + 4]!r}); "
                "convert it, e.g. `iconv -f latin1 -t utf-8`"
            ) from None
        offset += len(data)
        if first:
            text, first = text.removeprefix("\ufeff"), False
        text = held_cr + text
        held_cr = ""
        if text.endswith("\r") and not final:
            text, held_cr = text[:-1], "\r"
        yield text.replace("\r\n", "\n")
        if final:
            return


def _txt_documents(path: Path, name: str, index: int, cap: int, start: Cursor, count: ByteCounter):
    with open_source_file(path) as raw:
        count.current = raw.tell
        pieces = 0
        for k, piece in enumerate(split_stream(_text_blocks(raw, path), cap)):
            pieces += 1
            if k < start.piece:
                continue
            yield Document(name if k == 0 else f"{name}#{k + 1}", piece), Cursor(index, 0, k + 1)
    if pieces == 0:
        raise DataError(f"{path}: file is empty; remove it or add text")


def _open_lines(path: Path, kind: str) -> tuple[BinaryIO, BinaryIO]:
    """(raw file, binary line stream) of a .jsonl / .jsonl.gz / .jsonl.zst file (read a line at
    a time with `bounded_line`, so decompression never runs past one line's bound)."""
    raw = open_source_file(path)
    if kind == "jsonl.gz":
        return raw, gzip.GzipFile(fileobj=raw, mode="rb")
    if kind == "jsonl.zst":
        zstd = require_module("zstandard", f"{path} (.zst)")
        reader = zstd.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        return raw, io.BufferedReader(reader, _BLOCK)
    return raw, raw


def open_source_file(path: Path) -> BinaryIO:
    """A source file opened for reading: a regular file only (a FIFO would block the reader)."""
    try:
        return open_regular(path, what="source file")
    except UnsafeFileError as err:
        raise DataError(str(err)) from None


def _lines(stream: BinaryIO, path: Path, cap: int) -> Iterator[bytes]:
    limit = max_line_bytes(cap)
    hint = (
        f"split the document, or raise --max-doc-chars (lines up to 12 x it + 1 MiB are read; "
        f"now {cap:,})"
    )
    while True:
        try:
            line = bounded_line(stream, limit, str(path), hint)
        except UnsafeFileError as err:
            raise DataError(str(err)) from None
        if not line:
            return
        yield line


def _jsonl_text(line: bytes, where: str, field: str) -> str | None:
    try:
        row = parse_json(line.decode("utf-8").removeprefix("\ufeff"), what=where)
    except UnicodeDecodeError as err:
        raise DataError(
            f"{where}: not valid UTF-8 (byte {err.start} of the line: "
            f"{line[err.start : err.start + 4]!r})"
        ) from None
    except MalformedFileError as err:  # not JSON, or nested deeper than a document's record
        raise DataError(str(err)) from None
    if not isinstance(row, dict) or not isinstance(row.get(field), str):
        raise DataError(f"{where}: each line must be a JSON object with a string field {field!r}")
    return _checked_text(row[field], where, field)


def _column_text(value: Any, where: str, field: str) -> str | None:
    """A Parquet or dataset column's value as a document: a null is a missing row (skipped),
    anything else must be a string."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise DataError(
            f"{where}: {field!r} holds {type(value).__name__}, not a string; "
            "choose the text column with --text-field"
        )
    return _checked_text(value, where, field)


def _checked_text(text: str, where: str, field: str) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate escape such as "\ud800"
        raise DataError(
            f"{where}: {field!r} is not valid Unicode ({err.reason} at character "
            f"{err.start}); fix or drop this row"
        ) from None
    return text if text.strip() else None


def _jsonl_documents(
    path: Path, kind: str, name: str, index: int, cap: int, field: str, start: Cursor, count
):
    raw, lines = _open_lines(path, kind)
    count.current = raw.tell
    found = start.row > 0 or start.piece > 0
    try:
        for row, line in enumerate(_lines(lines, path, cap)):
            if row < start.row:
                continue
            if not line.strip():
                continue
            text = _jsonl_text(line, f"{path}:{row + 1}", field)
            if text is None:
                continue
            found = True
            yield from row_pieces(text, f"{name}:{row + 1}", index, row, cap, start)
    except DataError:
        raise
    except Exception as err:  # a corrupt .gz/.zst stream, an I/O error
        raise DataError(f"{path}: cannot be read ({type(err).__name__}: {err})") from None
    finally:
        lines.close()
        raw.close()
    if not found:
        raise DataError(
            f"{path}: no non-empty {field!r} fields; name the field that holds the text with "
            "--text-field"
        )


def row_pieces(text: str, name: str, index: int, row: int, cap: int, start: Cursor):
    """The pieces of one row's text as (Document, Cursor), skipping those before `start`."""
    skip = start.piece if (index, row) == (start.file, start.row) else 0
    for k, piece in enumerate(split_long(text, cap)):
        if k >= skip:
            yield Document(name if k == 0 else f"{name}#{k + 1}", piece), Cursor(index, row, k + 1)


def _parquet_documents(
    path: Path, name: str, index: int, cap: int, field: str, start: Cursor, count: ByteCounter
):
    pq = require_module("pyarrow.parquet", f"{path} (Parquet)")
    try:
        pf = pq.ParquetFile(check_regular(path, what="source file"))
    except UnsafeFileError as err:
        raise DataError(str(err)) from None
    except Exception as err:
        raise DataError(f"{path}: not a readable Parquet file ({err})") from None
    schema = pf.schema_arrow
    if field not in schema.names:
        raise DataError(f"{path}: no {field!r} column (columns: {', '.join(schema.names)})")
    import pyarrow as pa

    if not (
        pa.types.is_string(schema.field(field).type)
        or pa.types.is_large_string(schema.field(field).type)
    ):
        raise DataError(f"{path}: column {field!r} holds {schema.field(field).type}, not strings")
    meta = pf.metadata
    _check_parquet_sizes(path, meta, field, cap)
    total_rows = max(1, meta.num_rows)
    size = path.stat().st_size
    first_row, groups = 0, []  # skip whole row groups before the start row
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        if not groups and first_row + n <= start.row:
            first_row += n
        else:
            groups.append(g)
    found = start.row > 0 or start.piece > 0
    row = first_row
    count.current = lambda: size * row // total_rows
    # One reader per row group: a single iter_batches over many row groups keeps Arrow memory
    # of the groups it has passed (pyarrow 26: about 30 MB more per 100 MB of text read).
    for group in groups:
        for batch in pf.iter_batches(batch_size=1024, columns=[field], row_groups=[group]):
            for text in batch.column(0).to_pylist():
                if row >= start.row:
                    text = _column_text(text, f"{path}: row {row}", field)
                    if text is not None:
                        found = True
                        yield from row_pieces(text, f"{name}:{row}", index, row, cap, start)
                row += 1
    if not found:
        raise DataError(
            f"{path}: no non-empty {field!r} values; name the column that holds the text with "
            "--text-field"
        )


def _check_parquet_sizes(path: Path, meta: Any, field: str, cap: int) -> None:
    """DataError when a row group declares more bytes for the text column than its rows can
    hold at `max_line_bytes(cap)` each (a tiny compressed page that would decode to gigabytes):
    checked from the footer, before a page is decompressed."""
    limit = max_line_bytes(cap)
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            column = group.column(c)
            if column.path_in_schema != field:
                continue
            if column.total_uncompressed_size > limit * max(1, group.num_rows):
                raise DataError(
                    f"{path}: row group {g} declares {column.total_uncompressed_size:,} bytes of "
                    f"{field!r} for {group.num_rows} rows, more than {limit:,} per row (12 x "
                    "--max-doc-chars + 1 MiB); split the documents, or raise --max-doc-chars"
                )


def read_local(
    files: list[Path],
    base: Path,
    *,
    cap: int,
    field: str = "text",
    start: Cursor | None = None,
    count: ByteCounter | None = None,
) -> Iterator[tuple[Document, Cursor]]:
    """Documents of local files in the given order, from `start` on."""
    start = start or Cursor()
    count = count or ByteCounter()
    for index, path in enumerate(files):
        if index < start.file:
            count.done += path.stat().st_size
            continue
        at = start if index == start.file else Cursor(index)
        name = path.relative_to(base).as_posix()
        kind = kind_of(path)
        if kind == "txt":
            docs = _txt_documents(path, name, index, cap, at, count)
        elif kind == "parquet":
            docs = _parquet_documents(path, name, index, cap, field, at, count)
        else:
            docs = _jsonl_documents(path, kind or "jsonl", name, index, cap, field, at, count)
        yield from docs
        count.done += path.stat().st_size
        count.current = lambda: 0


# --- Hugging Face datasets ----------------------------------------------------------------------


def parse_hf_spec(spec: str) -> tuple[str, str | None]:
    """ "hf:NAME[:CONFIG]" -> (NAME, CONFIG or None)."""
    rest = spec[len("hf:") :]
    name, _, config = rest.partition(":")
    if not name:
        raise DataError(f"source {spec!r}: expected hf:NAME or hf:NAME:CONFIG")
    return name, (config or None)


def _open_hf(spec: str, name: str, config: str | None):
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"source {spec!r} needs the 'datasets' package: pip install 'taperlm[hf]'"
        ) from None
    if datasets is None:  # a test or an environment that blocks the import
        raise DataError(f"source {spec!r} needs the 'datasets' package: pip install 'taperlm[hf]'")
    return datasets.load_dataset(name, config, split="train", streaming=True)


def read_hf(
    spec: str, *, cap: int, field: str = "text", start: Cursor | None = None
) -> Iterator[tuple[Document, Cursor]]:
    """Rows of a Hugging Face dataset's train split, streamed in the dataset's own order.

    A dataset with `state_dict()` (datasets >= 2.18) records its position every
    `_HF_SNAPSHOT_ROWS` rows in the cursors, and a restart loads it instead of streaming the
    skipped rows again; any other iterable is restarted by skipping rows.
    """
    name, config = parse_hf_spec(spec)
    start = start or Cursor()
    where = f"Hugging Face dataset {name!r}" + (f" (config {config!r})" if config else "")
    try:
        ds = _open_hf(spec, name, config)
        row = 0
        if start.snapshot is not None and hasattr(ds, "load_state_dict"):
            ds.load_state_dict(start.snapshot[1])
            row = start.snapshot[0]
        snapshot = start.snapshot if row else None
        rows = iter(ds)
        first = next(rows, None)
    except DataError:
        raise
    except Exception as err:  # network, auth, unknown dataset: all surface as one clear error
        raise DataError(
            f"could not open {where}: {type(err).__name__}: {str(err).rstrip('.')}. hf: sources "
            "need internet access; offline, use --source default or local files"
        ) from None
    if first is None:
        if row == 0:
            raise DataError(f"Hugging Face dataset {spec!r} has an empty train split")
        return
    if field not in first:
        raise DataError(
            f"Hugging Face dataset {spec!r} has no {field!r} column (columns: {', '.join(first)})"
        )
    item: dict | None = first
    while item is not None:
        if row >= start.row:
            text = _column_text(item[field], f"Hugging Face dataset {spec!r}, row {row}", field)
            if text is not None:
                for doc, cur in row_pieces(text, f"{name}:{row}", 0, row, cap, start):
                    yield doc, Cursor(0, cur.row, cur.piece, snapshot)
        row += 1
        if row % _HF_SNAPSHOT_ROWS == 0:
            snapshot = _hf_snapshot(ds, row) or snapshot
        item = next(rows, None)


def _hf_snapshot(ds, row: int) -> tuple[int, Any] | None:
    state = getattr(ds, "state_dict", None)
    return (row, state()) if callable(state) else None

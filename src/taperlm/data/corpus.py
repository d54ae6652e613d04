"""Text sources for `taperlm prepare`: the default corpus, local files, Hugging Face datasets.

`open_source(spec)` parses the `--source` argument into a `Source`, whose `read(start)` yields
`(Document, Cursor)` pairs in a deterministic order (see `taperlm.data.readers`):

- ``default``: English prose from three Debian documentation packages (see `DEFAULT_PARTS`),
  with reST/POD markup stripped and duplicates removed; needs `INSTALL_COMMAND`.
- a path: a file of a kind in `readers.KINDS` (.txt, .jsonl, .jsonl.gz, .jsonl.zst, .parquet) or
  a folder searched recursively for them, in sorted path order.
- ``hf:NAME[:CONFIG]``: the ``train`` split of a Hugging Face dataset, streamed (needs internet
  and the ``datasets`` package).

Documents longer than `max_doc_chars` are cut into pieces by `readers.split_stream`.
"""

from __future__ import annotations

import gzip
import hashlib
import multiprocessing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taperlm.data import readers
from taperlm.data.markup import pod_to_text, rst_to_text
from taperlm.data.readers import ByteCounter, Cursor, Document
from taperlm.errors import DataError
from taperlm.files.io import file_identity, open_regular

DEFAULT_PACKAGES = ("python3.11-doc", "perl-doc", "linux-doc-6.1")
INSTALL_COMMAND = "sudo apt-get update && sudo apt-get install -y " + " ".join(DEFAULT_PACKAGES)

# Paragraphs at least this long that already appeared earlier in the corpus are dropped
# (licence boilerplate, repeated "see also" notes); documents shorter than MIN_DOC_CHARS after
# cleaning (index pages, stubs) are dropped.
DEDUP_MIN_PARAGRAPH_CHARS = 64
MIN_DOC_CHARS = 200
MAX_DOC_FILE_BYTES = 64 << 20  # a documentation page (or its .gz) is far smaller


@dataclass(frozen=True)
class CorpusPart:
    """One Debian package's share of the default corpus."""

    package: str
    directory: str  # glob relative to the root; the last match in sorted order is used
    pattern: str  # file glob (recursive) below it
    markup: str  # "rst" | "rst.gz" | "pod"
    exclude: tuple[str, ...] = field(default=())  # relative-path prefixes or exact stems

    def find_dir(self, root: Path) -> Path | None:
        matches = sorted(p for p in root.glob(self.directory) if p.is_dir())
        return matches[-1] if matches else None


DEFAULT_PARTS: tuple[CorpusPart, ...] = (
    # The Python 3.11 documentation: tutorial, library and language reference, HOWTOs.
    CorpusPart("python3.11-doc", "usr/share/doc/python3.11/html/_sources", "**/*.rst.txt", "rst"),
    # Perl's manual pages. Generated listings (table of contents, C API, Unicode property
    # tables, module list) are left out: they are not prose.
    CorpusPart(
        "perl-doc",
        "usr/share/perl/5.*/pod",
        "*.pod",
        "pod",
        exclude=(
            "perltoc.pod",
            "perlapi.pod",
            "perlintern.pod",
            "perluniprops.pod",
            "perlmodlib.pod",
        ),
    ),
    # The Linux kernel's Documentation tree; translations/ is left out (not English).
    CorpusPart(
        "linux-doc-6.1",
        "usr/share/doc/linux-doc-6.1/Documentation",
        "**/*.rst.gz",
        "rst.gz",
        exclude=("translations/",),
    ),
)


def default_corpus_files(root: str | Path = "/") -> list[tuple[str, Path, str]]:
    """(document name, file, markup) for every default-corpus file, in a fixed order.

    Raises DataError with the install command when any of the packages is missing.
    """
    root = Path(root)
    files: list[tuple[str, Path, str]] = []
    missing: list[str] = []
    for part in DEFAULT_PARTS:
        base = part.find_dir(root)
        found = sorted(base.glob(part.pattern)) if base else []
        chosen = []
        for path in found:
            rel = path.relative_to(base).as_posix()
            if any(rel == ex or rel.startswith(ex) for ex in part.exclude):
                continue
            chosen.append((f"{part.package}:{rel}", path, part.markup))
        if not chosen:
            missing.append(part.package)
        files.extend(chosen)
    if missing:
        raise DataError(
            f"the default corpus needs the Debian package(s) {', '.join(missing)}, which are not "
            f"installed (looked under {root}); install them with:\n  {INSTALL_COMMAND}\n"
            "or pass --source PATH (a file or folder of text) or --source hf:NAME"
        )
    return files


def extract_file(path: Path, markup: str) -> str:
    """Plain prose of one documentation file."""
    with open_regular(path, MAX_DOC_FILE_BYTES, "documentation file") as f:
        if markup == "rst.gz":
            with gzip.GzipFile(fileobj=f, mode="rb") as z:
                raw = z.read(MAX_DOC_FILE_BYTES + 1)  # decompression bounded too
        else:
            raw = f.read(MAX_DOC_FILE_BYTES + 1)
    if len(raw) > MAX_DOC_FILE_BYTES:
        raise DataError(
            f"{path} holds more than {MAX_DOC_FILE_BYTES >> 20} MiB of text, more than any "
            "documentation page: it is not one of the package's files; reinstall the package"
        )
    src = raw.decode("utf-8", errors="replace")
    return pod_to_text(src) if markup == "pod" else rst_to_text(src)


def _extract_job(job: tuple[str, str, str]) -> tuple[str, str]:
    name, path, markup = job
    return name, extract_file(Path(path), markup)


def default_corpus_identity(root: str | Path = "/") -> list[list[Any]]:
    """[name, size, mtime_ns] of every default-corpus file: an upgraded package replaces its
    files with the new release's sizes and times, seen without reading them (ctime is left
    out: re-extracting the same image would look like a change)."""
    out = []
    for name, path, _ in default_corpus_files(root):
        st = path.stat()
        out.append([name, st.st_size, st.st_mtime_ns])
    return out


def iter_default_corpus(root: str | Path = "/", workers: int = 1) -> Iterator[Document]:
    """The default corpus: cleaned, deduplicated documents in a fixed order.

    Extraction runs on `workers` processes; the output does not depend on the worker count.
    """
    jobs = [(name, str(path), markup) for name, path, markup in default_corpus_files(root)]
    if workers > 1:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(workers) as pool:
            yield from _dedupe(pool.imap(_extract_job, jobs, chunksize=16))
    else:
        yield from _dedupe(map(_extract_job, jobs))


def _dedupe(items: Iterable[tuple[str, str]]) -> Iterator[Document]:
    """Drop long paragraphs seen before, then short or duplicate documents (first one wins)."""
    seen_paragraphs: set[bytes] = set()
    seen_docs: set[bytes] = set()
    for name, text in items:
        kept = []
        for para in text.split("\n\n"):
            if len(para) >= DEDUP_MIN_PARAGRAPH_CHARS:
                key = hashlib.blake2b(para.encode(), digest_size=16).digest()
                if key in seen_paragraphs:
                    continue
                seen_paragraphs.add(key)
            kept.append(para)
        doc = "\n\n".join(kept)
        if len(doc) < MIN_DOC_CHARS:
            continue
        key = hashlib.blake2b(doc.encode(), digest_size=16).digest()
        if key in seen_docs:
            continue
        seen_docs.add(key)
        yield Document(name, doc)


# --- dispatch ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """A parsed --source: `kind` is default | local | hf; read it with `read()`."""

    spec: str
    kind: str
    files: tuple[Path, ...] = ()
    base: Path | None = None
    workers: int = 1
    root: str = "/"
    max_doc_chars: int = readers.DEFAULT_MAX_DOC_CHARS
    text_field: str = "text"

    def read(
        self, start: Cursor | None = None, count: ByteCounter | None = None
    ) -> Iterator[tuple[Document, Cursor]]:
        """(document, position after it) from `start` on; `count` follows the bytes read."""
        cap, field = self.max_doc_chars, self.text_field
        if self.kind == "local":
            assert self.base is not None
            return readers.read_local(
                list(self.files), self.base, cap=cap, field=field, start=start, count=count
            )
        if self.kind == "hf":
            return readers.read_hf(self.spec, cap=cap, field=field, start=start)
        return _read_default(self.root, self.workers, cap, start or Cursor())

    def documents(self, max_chars: int | None = None) -> Iterator[Document]:
        docs = (doc for doc, _ in self.read())
        return cap_chars(docs, max_chars) if max_chars else docs

    def total_bytes(self) -> int | None:
        """Size of the input when it is known in advance (local files), for progress and ETA."""
        return sum(f.stat().st_size for f in self.files) if self.kind == "local" else None

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"spec": self.spec, "kind": self.kind}
        if self.kind == "default":
            info["packages"] = list(DEFAULT_PACKAGES)
            info["install"] = INSTALL_COMMAND
        elif self.kind == "local":
            info["path"] = str(Path(self.spec).resolve())
            info["files"] = len(self.files)
            info["bytes"] = self.total_bytes()
        if self.kind != "default":
            info["text_field"] = self.text_field
        info["max_doc_chars"] = self.max_doc_chars
        return info

    def fingerprint(self) -> dict[str, Any]:
        """What must not change for a resumed prepare to continue this one: the spec, the
        settings of the readers and every file read, by relative path and `file_identity`
        (size, mtime, ctime and a content digest: a same-size edit after a kill is seen)."""
        info: dict[str, Any] = {
            "spec": self.spec,
            "kind": self.kind,
            "max_doc_chars": self.max_doc_chars,
            "text_field": self.text_field,
        }
        if self.kind == "local":
            assert self.base is not None
            info["files"] = [
                [f.relative_to(self.base).as_posix(), *file_identity(f)] for f in self.files
            ]
        elif self.kind == "default":
            info["files"] = default_corpus_identity(self.root)
        return info


def _read_default(root: str, workers: int, cap: int, start: Cursor):
    for row, doc in enumerate(iter_default_corpus(root, workers=workers)):
        if row >= start.row:
            yield from readers.row_pieces(doc.text, doc.name, 0, row, cap, start)


def open_source(
    spec: str,
    workers: int = 1,
    root: str | Path = "/",
    *,
    max_doc_chars: int = readers.DEFAULT_MAX_DOC_CHARS,
    text_field: str = "text",
) -> Source:
    """Parse a --source value and check what can be checked before reading (paths exist, files
    are not empty or binary, optional packages are installed)."""
    if max_doc_chars < 1:
        raise DataError(f"--max-doc-chars {max_doc_chars} must be positive")
    if not text_field:
        raise DataError("--text-field must not be empty")
    settings = {"max_doc_chars": max_doc_chars, "text_field": text_field}
    if spec == "default":
        default_corpus_files(root)  # fail early with the install command
        return Source(spec, "default", workers=workers, root=str(root), **settings)
    if spec.startswith("hf:"):
        readers.parse_hf_spec(spec)
        return Source(spec, "hf", **settings)
    path = Path(spec)
    files = readers.local_files(path)
    for f in files:
        readers.check_file(f)
    base = path if path.is_dir() else path.parent
    return Source(spec, "local", files=tuple(files), base=base, **settings)


def iter_local(path: str | Path, max_doc_chars: int = readers.DEFAULT_MAX_DOC_CHARS):
    """Documents of a local file or folder (checks as `open_source`)."""
    return open_source(str(path), max_doc_chars=max_doc_chars).documents()


def cap_chars(docs: Iterable[Document], max_chars: int) -> Iterator[Document]:
    """Stop after `max_chars` characters; the last document is cut to fit exactly."""
    left = max_chars
    for doc in docs:
        if left <= 0:
            return
        if len(doc.text) > left:
            yield Document(doc.name, doc.text[:left])
            return
        left -= len(doc.text)
        yield doc


def read_text_file(path: str | Path, max_chars: int | None = None) -> str:
    """The UTF-8 text of a file, e.g. a NIAH haystack, up to `max_chars` characters (the read
    stops there, whatever the file's size): the streaming readers' checks and decoding (empty,
    binary, not UTF-8 with the byte offset; BOM and CRLF removed)."""
    path = Path(path)
    readers.check_file(path)
    parts: list[str] = []
    have = 0
    with readers.open_source_file(path) as raw:
        for block in readers._text_blocks(raw, path):
            parts.append(block)
            have += len(block)
            if max_chars is not None and have >= max_chars:
                break
    text = "".join(parts)
    return text if max_chars is None else text[:max_chars]

"""Text sources for `taperlm prepare`: the default corpus, local files, Hugging Face datasets.

Every source yields `Document`s (one per source file, JSONL line or dataset row) in a deterministic
order. `open_source(spec)` parses the `--source` argument:

- ``default``: English prose from three Debian documentation packages (see `DEFAULT_PARTS`),
  with reST/POD markup stripped and duplicates removed; needs `INSTALL_COMMAND`.
- a path: a ``.txt`` file (one document), a ``.jsonl`` file (one document per line, field
  ``text``) or a folder searched recursively for both, in sorted path order.
- ``hf:NAME[:CONFIG]``: the ``train`` split of a Hugging Face dataset, streamed (needs internet
  and the ``datasets`` package).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import multiprocessing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from taperlm.data.markup import pod_to_text, rst_to_text
from taperlm.errors import DataError

DEFAULT_PACKAGES = ("python3.11-doc", "perl-doc", "linux-doc-6.1")
INSTALL_COMMAND = "sudo apt-get update && sudo apt-get install -y " + " ".join(DEFAULT_PACKAGES)

# Paragraphs at least this long that already appeared earlier in the corpus are dropped
# (licence boilerplate, repeated "see also" notes); documents shorter than MIN_DOC_CHARS after
# cleaning (index pages, stubs) are dropped.
DEDUP_MIN_PARAGRAPH_CHARS = 64
MIN_DOC_CHARS = 200


@dataclass(frozen=True)
class Document:
    """One unit of text; documents are separated by EOS in the token stream."""

    name: str
    text: str


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
            "or pass --source PATH (.txt/.jsonl file or folder) or --source hf:NAME"
        )
    return files


def extract_file(path: Path, markup: str) -> str:
    """Plain prose of one documentation file."""
    if markup == "rst.gz":
        with gzip.open(path, "rb") as f:
            raw = f.read()
    else:
        raw = path.read_bytes()
    src = raw.decode("utf-8", errors="replace")
    return pod_to_text(src) if markup == "pod" else rst_to_text(src)


def _extract_job(job: tuple[str, str, str]) -> tuple[str, str]:
    name, path, markup = job
    return name, extract_file(Path(path), markup)


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


# --- local files ------------------------------------------------------------------------------

LOCAL_SUFFIXES = (".txt", ".jsonl")


def read_text_file(path: Path) -> str:
    """UTF-8 text of a file; DataError naming the file when it is empty, binary or not UTF-8."""
    data = path.read_bytes()
    if not data.strip():
        raise DataError(f"{path}: file is empty; remove it or add text")
    if b"\x00" in data[:65536]:
        raise DataError(
            f"{path}: looks like a binary file (contains NUL bytes); only UTF-8 text "
            "(.txt, or .jsonl with a 'text' field) can be used as a source"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"{path}: not valid UTF-8 (byte {err.start}: {data[err.start : err.start + 4]!r}); "
            "convert it, e.g. `iconv -f latin1 -t utf-8`"
        ) from None
    return text.removeprefix("\ufeff").replace("\r\n", "\n")


def _iter_jsonl(path: Path, name: str) -> Iterator[Document]:
    text = read_text_file(path)
    count = 0
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
        except RecursionError:
            raise DataError(f"{path}:{lineno}: JSON nested too deeply to be a document") from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise DataError(
                f"{path}:{lineno}: each line must be a JSON object with a string field 'text'"
            )
        try:
            row["text"].encode("utf-8")
        except UnicodeEncodeError as err:  # a lone surrogate escape such as "\ud800"
            raise DataError(
                f"{path}:{lineno}: 'text' is not valid Unicode ({err.reason} at character "
                f"{err.start}); fix or drop this line"
            ) from None
        if row["text"].strip():
            count += 1
            yield Document(f"{name}:{lineno}", row["text"])
    if count == 0:
        raise DataError(f"{path}: no non-empty 'text' fields")


def local_files(path: Path) -> list[Path]:
    """The source files of a local path: the file itself, or .txt/.jsonl files below a folder."""
    if not path.exists():
        raise DataError(
            f"source {path} does not exist; pass --source default, a .txt/.jsonl "
            "file or folder, or hf:NAME[:CONFIG]"
        )
    if path.is_file():
        return [path]
    files = sorted(
        (
            p
            for p in path.rglob("*")
            if p.is_file()
            and p.suffix.lower() in LOCAL_SUFFIXES
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
        ),
        key=lambda p: p.relative_to(path).as_posix(),
    )
    if not files:
        raise DataError(f"source folder {path} has no .txt or .jsonl files")
    return files


def iter_local(path: str | Path) -> Iterator[Document]:
    """Documents of a local file or folder (sorted relative paths; .jsonl: one per line)."""
    path = Path(path)
    files = local_files(path)
    base = path if path.is_dir() else path.parent
    for f in files:
        name = f.relative_to(base).as_posix()
        if f.suffix.lower() == ".jsonl":
            yield from _iter_jsonl(f, name)
        else:
            yield Document(name, read_text_file(f))


# --- Hugging Face datasets --------------------------------------------------------------------


def parse_hf_spec(spec: str) -> tuple[str, str | None]:
    """ "hf:NAME[:CONFIG]" -> (NAME, CONFIG or None)."""
    rest = spec[len("hf:") :]
    name, _, config = rest.partition(":")
    if not name:
        raise DataError(f"source {spec!r}: expected hf:NAME or hf:NAME:CONFIG")
    return name, (config or None)


def iter_hf(spec: str, text_field: str = "text") -> Iterator[Document]:
    """Rows of a Hugging Face dataset's train split, streamed in the dataset's own order."""
    name, config = parse_hf_spec(spec)
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"source {spec!r} needs the 'datasets' package: pip install 'taperlm[hf]'"
        ) from None
    try:
        ds = datasets.load_dataset(name, config, split="train", streaming=True)
        rows = iter(ds)
        first = next(rows, None)
    except Exception as err:  # network, auth, unknown dataset: all surface as one clear error
        raise DataError(
            f"could not open Hugging Face dataset {name!r}"
            + (f" (config {config!r})" if config else "")
            + f": {type(err).__name__}: {str(err).rstrip('.')}. hf: sources need internet access; offline, use "
            "--source default or a local .txt/.jsonl folder"
        ) from None
    if first is None:
        raise DataError(f"Hugging Face dataset {spec!r} has an empty train split")
    if text_field not in first:
        raise DataError(
            f"Hugging Face dataset {spec!r} has no {text_field!r} column "
            f"(columns: {', '.join(first)})"
        )
    for i, row in enumerate(_chain(first, rows)):
        text = row[text_field]
        if isinstance(text, str) and text.strip():
            yield Document(f"{name}:{i}", text)


def _chain(first, rest):
    yield first
    yield from rest


# --- dispatch ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """A parsed --source: `kind` is default | local | hf; iterate with `documents()`."""

    spec: str
    kind: str
    workers: int = 1
    root: str = "/"

    def documents(self, max_chars: int | None = None) -> Iterator[Document]:
        if self.kind == "default":
            docs = iter_default_corpus(self.root, workers=self.workers)
        elif self.kind == "hf":
            docs = iter_hf(self.spec)
        else:
            docs = iter_local(self.spec)
        return cap_chars(docs, max_chars) if max_chars else docs

    def describe(self) -> dict:
        info: dict = {"spec": self.spec, "kind": self.kind}
        if self.kind == "default":
            info["packages"] = list(DEFAULT_PACKAGES)
            info["install"] = INSTALL_COMMAND
        elif self.kind == "local":
            info["path"] = str(Path(self.spec).resolve())
        return info


def open_source(spec: str, workers: int = 1, root: str | Path = "/") -> Source:
    """Parse a --source value (does not read anything yet, except checking paths exist)."""
    if spec == "default":
        default_corpus_files(root)  # fail early with the install command
        return Source(spec, "default", workers=workers, root=str(root))
    if spec.startswith("hf:"):
        parse_hf_spec(spec)
        return Source(spec, "hf")
    local_files(Path(spec))
    return Source(spec, "local")


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

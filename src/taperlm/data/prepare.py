"""`taperlm prepare`: source -> tokenizer -> train.bin / val.bin / meta.json / tokenizer/.

Stages (each deterministic, so the same command gives byte-identical outputs):

1. Read the source once into a spool file (`.docs.jsonl.tmp`), capped at --max-chars.
2. Build the tokenizer (bpe:N is trained on the spooled corpus) and save it to tokenizer/.
3. Tokenize the documents on `workers` processes (batches of documents, results consumed in
   order) into a temporary token stream, recording each document's length (+1 for its EOS).
4. Choose the validation documents (below) and copy each document's tokens into train.bin or
   val.bin, keeping corpus order. meta.json is written last: a folder without it is incomplete.

Validation split: a seeded permutation of the documents is walked until the chosen documents
hold at least the target number of tokens (val_fraction * total, or val_tokens). When whole
documents cannot give a sensible split (fewer than 2 documents, or the chosen ones would hold more
than twice the target or every document), the last `target` tokens of the stream are used
instead ("tail" mode, recorded in meta.json).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from taperlm.data.corpus import open_source
from taperlm.data.shards import VERSION, ShardWriter, dtype_for_vocab
from taperlm.data.tokenizer import Tokenizer, build_tokenizer, iter_batches, load_tokenizer
from taperlm.errors import DataError
from taperlm.io import atomic_write_text

META_FILE = "meta.json"
MARKER_FILE = ".taperlm-prepare"
META_FORMAT = "taperlm-tokens"
DEFAULT_VAL_FRACTION = 0.01
_SPOOL = ".docs.jsonl.tmp"
_STREAM = ".tokens.tmp"
_BATCH_DOCS = 64  # documents per worker task
_COPY_CHUNK = 1 << 22  # tokens per copy when writing shards


def is_prepare_output(directory: Path) -> bool:
    """Whether `directory` was written (or is being written) by `taperlm prepare`."""
    if (directory / MARKER_FILE).exists():
        return True
    meta = directory / META_FILE
    if meta.is_file():
        try:
            return json.loads(meta.read_text()).get("format") == META_FORMAT
        except ValueError:
            return False
    return False


def _check_out_dir(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} is a file; choose a folder")
    if out.is_dir() and any(out.iterdir()) and not force and not is_prepare_output(out):
        raise DataError(
            f"--out {out} is not empty and is not a `taperlm prepare` output; choose "
            "another folder or pass --force to write into it"
        )


def _validate_split_args(val_fraction: float | None, val_tokens: int | None) -> None:
    if val_fraction is not None and val_tokens is not None:
        raise DataError("give either --val-fraction or --val-tokens, not both")
    if val_fraction is not None and not 0.0 < val_fraction <= 0.5:
        raise DataError(f"--val-fraction {val_fraction} must be in (0, 0.5]")
    if val_tokens is not None and val_tokens < 2:
        raise DataError(f"--val-tokens {val_tokens} must be at least 2")


def prepare(
    source: str,
    out: str | Path,
    tokenizer: str = "bpe:8192",
    *,
    val_fraction: float | None = None,
    val_tokens: int | None = None,
    workers: int = 2,
    max_chars: int | None = None,
    seed: int = 0,
    force: bool = False,
    progress: bool = True,
    corpus_root: str | Path = "/",
) -> dict[str, Any]:
    """Run the whole pipeline; return the meta.json contents (plus timings under "_timing")."""
    from tqdm.auto import tqdm

    from taperlm import __version__

    _validate_split_args(val_fraction, val_tokens)
    if val_fraction is None and val_tokens is None:
        val_fraction = DEFAULT_VAL_FRACTION
    if max_chars is not None and max_chars <= 0:
        raise DataError(f"--max-chars {max_chars} must be positive")
    workers = max(1, int(workers))
    out = Path(out)
    _check_out_dir(out, force)
    src = open_source(source, workers=workers, root=corpus_root)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER_FILE).write_text("written by taperlm prepare\n")
    timing: dict[str, float] = {}
    spool, stream = out / _SPOOL, out / _STREAM
    try:
        t0 = time.perf_counter()
        n_docs, n_chars = _spool_documents(src, spool, max_chars, progress, tqdm)
        timing["read_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        tok = build_tokenizer(
            tokenizer, texts=(d["text"] for d in _read_spool(spool)), show_progress=progress
        )
        if tok.vocab_size > 2**32:
            raise DataError(f"tokenizer {tokenizer!r} has {tok.vocab_size} ids, more than uint32")
        # The first old output is replaced here: from now on the folder is incomplete until
        # meta.json is rewritten (a failure before this point leaves a previous output usable).
        (out / META_FILE).unlink(missing_ok=True)
        if (out / "tokenizer").exists():
            shutil.rmtree(out / "tokenizer")
        tok.save(out / "tokenizer")
        timing["tokenizer_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        lengths = _tokenize(out, spool, stream, tok, n_docs, n_chars, workers, progress, tqdm)
        timing["tokenize_s"] = time.perf_counter() - t0

        total = int(lengths.sum())
        target = val_tokens if val_tokens is not None else round(val_fraction * total)
        target = max(2, int(target))
        if target >= total - 1:
            raise DataError(
                f"the corpus has only {total} tokens, too few for a validation split "
                f"of {target}; add text or lower --val-fraction/--val-tokens"
            )
        mask = choose_validation(lengths, target, seed)
        t0 = time.perf_counter()
        splits = _write_splits(out, stream, lengths, mask, target, tok)
        timing["write_s"] = time.perf_counter() - t0
    finally:
        spool.unlink(missing_ok=True)
        stream.unlink(missing_ok=True)

    meta = {
        "format": META_FORMAT,
        "format_version": VERSION,
        "created_by": f"taperlm {__version__}",
        "source": {**src.describe(), "documents": n_docs, "chars": n_chars, "max_chars": max_chars},
        "tokenizer": {"kind": tok.kind, "spec": tok.spec, "dir": "tokenizer"},
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "bos_id": tok.bos_id,
        "dtype": str(dtype_for_vocab(tok.vocab_size)),
        "val_split": {
            "mode": "documents" if mask is not None else "tail",
            "fraction": val_fraction,
            "tokens_target": target,
            "seed": seed,
        },
        "splits": splits,
    }
    atomic_write_text(out / META_FILE, json.dumps(meta, indent=2) + "\n")
    return {**meta, "_timing": timing}


def _spool_documents(src, spool: Path, max_chars, progress, tqdm) -> tuple[int, int]:
    n_docs = n_chars = 0
    bar = tqdm(desc="read", unit=" docs", disable=not progress)
    with open(spool, "w", encoding="utf-8") as f:
        for doc in src.documents(max_chars=max_chars):
            f.write(json.dumps({"name": doc.name, "text": doc.text}, ensure_ascii=False) + "\n")
            n_docs += 1
            n_chars += len(doc.text)
            bar.update(1)
    bar.close()
    if n_docs == 0:
        raise DataError(f"source {src.spec!r} produced no documents")
    return n_docs, n_chars


def _read_spool(spool: Path) -> Iterator[dict]:
    with open(spool, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


# --- tokenization (worker processes) ----------------------------------------------------------

_WORKER_TOKENIZER: Tokenizer | None = None


def _init_worker(tokenizer_dir: str) -> None:
    os.environ["RAYON_NUM_THREADS"] = "1"  # one core per worker process
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = load_tokenizer(tokenizer_dir)


def _encode_texts(tok: Tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray, int]:
    """(concatenated ids with an EOS after each document, per-document lengths incl. EOS,
    characters encoded)."""
    docs = tok.encode_batch(texts)
    lengths = np.fromiter((len(d) + 1 for d in docs), dtype=np.int64, count=len(docs))
    ids = np.empty(int(lengths.sum()), dtype=np.uint32)
    pos = 0
    for d in docs:
        ids[pos : pos + len(d)] = d
        ids[pos + len(d)] = tok.eos_id
        pos += len(d) + 1
    return ids, lengths, sum(len(t) for t in texts)


def _encode_job(texts: list[str]) -> tuple[np.ndarray, np.ndarray, int]:
    assert _WORKER_TOKENIZER is not None
    return _encode_texts(_WORKER_TOKENIZER, texts)


def _tokenize(out, spool, stream, tok, n_docs, n_chars, workers, progress, tqdm) -> np.ndarray:
    """Tokenize the spool into `stream` (dtype of the vocab); return per-document lengths."""
    dtype = dtype_for_vocab(tok.vocab_size)
    batches = ([d["text"] for d in b] for b in iter_batches(_read_spool(spool), _BATCH_DOCS))
    lengths: list[np.ndarray] = []
    n_tokens = 0
    start = time.perf_counter()
    bar = tqdm(total=n_chars, desc="tokenize", unit="char", unit_scale=True, disable=not progress)
    pool = None
    try:
        if workers > 1:
            pool = multiprocessing.get_context("spawn").Pool(
                workers, initializer=_init_worker, initargs=(str(out / "tokenizer"),)
            )
            results = pool.imap(_encode_job, batches)  # ordered: output order = corpus order
        else:
            results = (_encode_texts(tok, texts) for texts in batches)
        with open(stream, "wb") as f:
            for ids, lens, chars in results:
                f.write(ids.astype(dtype).tobytes())
                lengths.append(lens)
                n_tokens += ids.size
                bar.update(chars)
                elapsed = max(time.perf_counter() - start, 1e-9)
                bar.set_postfix(tokens=f"{n_tokens:,}", tok_s=f"{n_tokens / elapsed:,.0f}")
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
    return np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)


# --- split -------------------------------------------------------------------------------------


def choose_validation(lengths: np.ndarray, target: int, seed: int) -> np.ndarray | None:
    """Boolean mask of validation documents, or None to fall back to the tail split."""
    n = len(lengths)
    if n < 2:
        return None
    order = np.random.default_rng(seed).permutation(n)
    cum = np.cumsum(lengths[order])
    k = int(np.searchsorted(cum, target)) + 1  # fewest documents holding >= target tokens
    if k >= n or cum[k - 1] > 2 * target:
        return None
    mask = np.zeros(n, dtype=bool)
    mask[order[:k]] = True
    return mask


def _write_splits(
    out: Path,
    stream: Path,
    lengths: np.ndarray,
    mask: np.ndarray | None,
    target: int,
    tok: Tokenizer,
) -> dict[str, dict[str, Any]]:
    dtype = dtype_for_vocab(tok.vocab_size)
    total = int(lengths.sum())
    tokens = np.memmap(stream, dtype=dtype, mode="r", shape=(total,))
    writers = {name: ShardWriter(out / f"{name}.bin", tok.vocab_size) for name in ("train", "val")}
    docs = {"train": 0, "val": 0}
    try:
        if mask is None:  # tail mode: the last `target` tokens are validation
            cut = total - target
            _copy(writers["train"], tokens, 0, cut)
            _copy(writers["val"], tokens, cut, total)
            ends = np.cumsum(lengths)
            docs["train"] = int(np.searchsorted(ends - lengths, cut, side="left"))
            docs["val"] = len(lengths) - int(np.searchsorted(ends, cut, side="right"))
        else:
            starts = np.concatenate([[0], np.cumsum(lengths)])
            # Copy runs of consecutive documents that go to the same split.
            i, n = 0, len(lengths)
            while i < n:
                j = i
                while j + 1 < n and mask[j + 1] == mask[i]:
                    j += 1
                name = "val" if mask[i] else "train"
                _copy(writers[name], tokens, int(starts[i]), int(starts[j + 1]))
                docs[name] += j - i + 1
                i = j + 1
        headers = {name: w.close() for name, w in writers.items()}
    except BaseException:
        for w in writers.values():
            if not w._file.closed:
                w.abort()
        raise
    finally:
        del tokens
    return {
        name: {
            "file": f"{name}.bin",
            "tokens": h.count,
            "documents": docs[name],
            "crc32": h.crc32,
        }
        for name, h in headers.items()
    }


def _copy(writer: ShardWriter, tokens: np.ndarray, start: int, end: int) -> None:
    for s in range(start, end, _COPY_CHUNK):
        writer.write(np.asarray(tokens[s : min(end, s + _COPY_CHUNK)]))

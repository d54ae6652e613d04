"""Order-preserving parallel tokenization with bounded memory.

`OrderedEncoder.map(jobs)` tokenizes batches of texts on `workers` processes (one thread each) and
yields the results in submission order, so the output does not depend on the number of workers.
At most `2 * workers` batches are in flight: a slow consumer stops the reading instead of piling
up text in memory. With one worker the batches are tokenized in this process, also on one thread.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from taperlm.data.heap import fix_mmap_threshold
from taperlm.data.tokenizer import Tokenizer, load_tokenizer
from taperlm.errors import DataError

_SUB_BATCH_CHARS = 1 << 18  # characters per encode call (bounds a worker's transient memory)

_WORKER: tuple[Tokenizer, np.dtype] | None = None
_WORKER_ERROR: str | None = None


def encode_texts(
    tok: Tokenizer, texts: list[str | None], dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """(ids of every text followed by EOS, concatenated; per-text lengths). A None text is
    skipped (length 0, no EOS)."""
    lengths = np.zeros(len(texts), dtype=np.int64)
    parts: list[np.ndarray] = []
    eos = np.array([tok.eos_id], dtype=dtype)
    group: list[int] = []
    chars = 0

    def flush() -> None:
        nonlocal chars
        for i, ids in zip(group, tok.encode_batch([texts[i] for i in group])):  # type: ignore[misc]
            parts.append(np.array(ids, dtype=dtype))
            parts.append(eos)
            lengths[i] = len(ids) + 1
        group.clear()
        chars = 0

    for i, text in enumerate(texts):
        if text is None:
            continue
        group.append(i)
        chars += len(text)
        if chars >= _SUB_BATCH_CHARS:
            flush()
    if group:
        flush()
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    return ids, lengths


def _init_worker(tokenizer_dir: str, dtype: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is handled once, by the parent
    os.environ["RAYON_NUM_THREADS"] = "1"  # one core per worker process
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    fix_mmap_threshold()
    global _WORKER, _WORKER_ERROR
    try:
        _WORKER = (load_tokenizer(tokenizer_dir), np.dtype(dtype))
    except Exception as err:  # reported by the first job: a pool replaces workers that die here
        _WORKER_ERROR = f"{type(err).__name__}: {err}"


def _encode_job(texts: list[str | None]) -> tuple[np.ndarray, np.ndarray]:
    if _WORKER is None:
        raise DataError(f"a tokenizer worker could not start: {_WORKER_ERROR}")
    return encode_texts(_WORKER[0], texts, _WORKER[1])


@contextlib.contextmanager
def _single_threaded() -> Iterator[None]:
    """The tokenizers library parallelises encode_batch unless told not to (read per call)."""
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = old


class OrderedEncoder:
    """Tokenize (texts, tag) jobs; yield (tag, ids, lengths) in job order (module docstring)."""

    def __init__(self, tokenizer: Tokenizer, tokenizer_dir: Path, workers: int, dtype: np.dtype):
        self.tokenizer = tokenizer
        self.tokenizer_dir = Path(tokenizer_dir)
        self.workers = max(1, int(workers))
        self.dtype = np.dtype(dtype)

    def map(
        self, jobs: Iterable[tuple[list[str | None], Any]]
    ) -> Iterator[tuple[Any, np.ndarray, np.ndarray]]:
        if self.workers == 1:
            with _single_threaded():
                for texts, tag in jobs:
                    yield (tag, *encode_texts(self.tokenizer, texts, self.dtype))
            return
        ctx = multiprocessing.get_context("spawn")
        pool = ctx.Pool(
            self.workers,
            initializer=_init_worker,
            initargs=(str(self.tokenizer_dir), self.dtype.str),
        )
        try:
            pending: deque = deque()
            for texts, tag in jobs:
                pending.append((tag, pool.apply_async(_encode_job, (texts,))))
                while len(pending) >= 2 * self.workers:
                    tag0, res = pending.popleft()
                    yield (tag0, *res.get())
            while pending:
                tag0, res = pending.popleft()
                yield (tag0, *res.get())
        finally:
            pool.terminate()
            pool.join()

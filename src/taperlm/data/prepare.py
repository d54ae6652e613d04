"""`taperlm prepare`: a source -> a data dir of token shards (layout: taperlm.data.datadir).

After the tokenizer exists the source is read once, and memory does not grow with the corpus or
with the size of any file:

1. Tokenizer. ``bpe:N`` is trained on a sample: the first `tokenizer_sample_chars` characters of
   the training documents (documents the validation rule picks are never in it, unless every
   document is picked). Other kinds are loaded (taperlm.data.tokenizer).
2. Stream. Documents are read in order (taperlm.data.readers), batched, tokenized on `workers`
   processes and consumed in order (taperlm.data.encode), so the output is the same for any
   number of workers. Every document is followed by EOS.
3. Validation split, decided per document while streaming: a document is picked when
   ``blake2b(text, key=seed)`` read as a number in [0, 1) is below `val_fraction`; with
   `val_tokens` = N, only until the validation split holds N tokens (later picks go to train).
   Identical documents therefore always land in the same split. When no document was picked (a
   corpus of one or a few documents), or fewer than N tokens were, the missing tokens are the
   last ones of the training stream (taperlm.data.val_split); meta.json's ``val_split.mode``
   says ``documents``, ``documents+tail`` or ``tail``.
4. Shards. Each split is written as shards of `shard_tokens` tokens. `max_tokens` stops the
   training split after exactly that many tokens (the last document is cut); with `val_tokens`
   the stream is then read on for validation documents only, until N tokens.
5. Commit. Everything is written in OUT/.prepare/ and switched in when complete
   (datadir.commit): a prepare that fails or is killed never damages the data dir that was there.

Resuming. OUT/.prepare/state.json is saved whenever a shard is published and at least every
`CHECKPOINT_SECONDS`: the source position after the last complete batch, the shard lists and the
counts. The same command run again (with any --workers) continues from there and writes the same
bytes as an uninterrupted run; a different command, or changed input files, starts over. A bad
input (DataError) discards the work; anything else (a kill, Ctrl-C, a full disk) keeps it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from taperlm import __version__
from taperlm.data import val_split
from taperlm.data.corpus import Source, open_source
from taperlm.data.datadir import (
    MARKER_FILE,
    META_FILE,
    META_FORMAT,
    META_VERSION,
    TOKENIZER_DIR,
    WORK_DIR,
    check_out_dir,
    commit,
    exclusive,
    roll_forward,
)
from taperlm.data.encode import OrderedEncoder
from taperlm.data.heap import fix_mmap_threshold, release_free_memory
from taperlm.data.identity import tokenizer_identity
from taperlm.data.progress import Progress
from taperlm.data.readers import DEFAULT_MAX_DOC_CHARS, ByteCounter, Cursor
from taperlm.data.shards import (
    ResumeMismatch,
    ShardSeries,
    dtype_for_vocab,
)
from taperlm.data.tokenizer import (
    TOKENIZER_FILE,
    Tokenizer,
    build_tokenizer,
    load_tokenizer,
    parse_bpe_spec,
    train_bpe,
)
from taperlm.errors import DataError, UnsafeFileError
from taperlm.files.io import MAX_RECORD_BYTES, atomic_write_text, fsync_dir, read_json
from taperlm.runtime.cpus import usable_cpus

__all__ = ["MARKER_FILE", "META_FILE", "META_FORMAT", "doc_hash", "prepare"]

DEFAULT_VAL_FRACTION = 0.01
DEFAULT_SAMPLE_CHARS = 250_000_000
DEFAULT_SHARD_TOKENS = 100_000_000
CHECKPOINT_SECONDS = 30.0
PIPELINE_VERSION = 2  # part of the resume key: bump when the same arguments give other bytes
STATE_FILE = "state.json"
_BATCH_CHARS = 1 << 20  # characters per tokenization job
_BATCH_DOCS = 4096


def doc_hash(text: str, seed: int) -> float:
    """The document's validation draw: blake2b of its UTF-8 text keyed by the seed, in [0, 1)."""
    digest = hashlib.blake2b(
        text.encode("utf-8", "surrogatepass"), digest_size=8, key=str(seed).encode()
    ).digest()
    return int.from_bytes(digest, "big") / 2.0**64


@dataclass(frozen=True)
class Settings:
    """Everything that decides the output bytes (besides the source and the tokenizer)."""

    tokenizer: str
    val_fraction: float
    val_tokens: int | None
    seed: int
    max_chars: int | None
    max_tokens: int | None
    tokenizer_sample_chars: int
    shard_tokens: int


def _positive(name: str, value: int | None, minimum: int = 1) -> None:
    if value is not None and (not isinstance(value, int) or value < minimum):
        raise DataError(f"{name} {value} must be an integer >= {minimum}")


def _settings(
    tokenizer: str,
    val_fraction: float | None,
    val_tokens: int | None,
    seed: int,
    max_chars: int | None,
    max_tokens: int | None,
    sample_chars: int,
    shard_tokens: int,
) -> Settings:
    if val_fraction is not None and not 0.0 < val_fraction <= 0.5:
        raise DataError(f"--val-fraction {val_fraction} must be in (0, 0.5]")
    _positive("--val-tokens", val_tokens, 2)
    _positive("--max-chars", max_chars)
    _positive("--max-tokens", max_tokens, 2)
    _positive("--tokenizer-sample-chars", sample_chars)
    _positive("--shard-tokens", shard_tokens)
    if tokenizer.startswith("bpe:"):
        parse_bpe_spec(tokenizer)  # fail before reading anything
    return Settings(
        tokenizer=tokenizer,
        val_fraction=DEFAULT_VAL_FRACTION if val_fraction is None else float(val_fraction),
        val_tokens=val_tokens,
        seed=int(seed),
        max_chars=max_chars,
        max_tokens=max_tokens,
        tokenizer_sample_chars=sample_chars,
        shard_tokens=shard_tokens,
    )


def prepare(
    source: str,
    out: str | Path,
    tokenizer: str = "bpe:8192",
    *,
    val_fraction: float | None = None,
    val_tokens: int | None = None,
    workers: int | None = None,
    max_chars: int | None = None,
    max_tokens: int | None = None,
    tokenizer_sample_chars: int = DEFAULT_SAMPLE_CHARS,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    max_doc_chars: int = DEFAULT_MAX_DOC_CHARS,
    text_field: str = "text",
    seed: int = 0,
    force: bool = False,
    progress: bool = True,
    corpus_root: str | Path = "/",
) -> dict[str, Any]:
    """Run the whole pipeline (module docstring); return the meta.json contents plus timings
    under "_timing" and, for a resumed run, where it resumed under "_resumed"."""
    settings = _settings(
        tokenizer,
        val_fraction,
        val_tokens,
        seed,
        max_chars,
        max_tokens,
        tokenizer_sample_chars,
        shard_tokens,
    )
    workers = usable_cpus() if workers is None else int(workers)
    if workers < 1:
        raise DataError(f"--workers {workers} must be at least 1")
    out = Path(out)
    check_out_dir(out, force)
    src = open_source(
        source,
        workers=workers,
        root=corpus_root,
        max_doc_chars=max_doc_chars,
        text_field=text_field,
    )
    fixed_tokenizer = None if tokenizer.startswith("bpe:") else build_tokenizer(tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER_FILE).write_text("written by taperlm prepare\n")
    fix_mmap_threshold()  # memory stays flat over a long stream (taperlm.data.heap)
    with exclusive(out):
        roll_forward(out)  # a previous prepare that stopped while moving its result into place
        job = _Preparation(out, src, settings, workers, progress, fixed_tokenizer)
        try:
            meta = job.run()
        except DataError:
            job.discard()
            raise
        except BaseException:
            if (out / WORK_DIR).is_dir():
                print(
                    f"taperlm prepare stopped; the work done so far is kept in {out / WORK_DIR}: "
                    "run the same command again to continue from it",
                    file=sys.stderr,
                )
            raise
        t0 = time.perf_counter()
        commit(out, job.work)
        job.timing["commit_s"] = time.perf_counter() - t0
    return {**meta, "_timing": job.timing, "_resumed": job.resumed}


def _changed_files(old: Any, new: dict[str, Any]) -> list[str]:
    """Names of the files whose identity differs between two source fingerprints (added and
    removed ones too); [] when the fingerprints are not comparable."""
    if not isinstance(old, dict) or old.get("spec") != new.get("spec"):
        return []
    before = {f[0]: f[1:] for f in old.get("files") or [] if isinstance(f, list) and f}
    after = {f[0]: f[1:] for f in new.get("files") or []}
    return sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))


class _Preparation:
    """One run of the pipeline in OUT/.prepare/ (fresh or resumed)."""

    def __init__(
        self,
        out: Path,
        src: Source,
        settings: Settings,
        workers: int,
        progress: bool,
        fixed_tokenizer: Tokenizer | None,
    ) -> None:
        self.out = out
        self.work = out / WORK_DIR
        self.src = src
        self.s = settings
        self.workers = workers
        self.progress = progress
        self.fixed_tokenizer = fixed_tokenizer
        self.key = self._key()
        self.timing: dict[str, float] = {}
        self.resumed: dict[str, Any] | None = None
        self.train_full = False  # max_tokens reached
        self.train_count = self.val_count = 0  # tokens written to each split so far

    # --- state ------------------------------------------------------------------------------

    def _key(self) -> str:
        self.source_id = self.src.fingerprint()
        ident: dict[str, Any] = {
            "pipeline": PIPELINE_VERSION,
            "settings": asdict(self.s),
            "source": self.source_id,
        }
        if self.fixed_tokenizer is not None:
            tok = self.fixed_tokenizer
            text = tok.backend.to_str() + json.dumps(tok.meta, sort_keys=True)
            ident["tokenizer"] = hashlib.sha256(text.encode()).hexdigest()
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()

    def _load_state(self) -> dict[str, Any] | None:
        path = self.work / STATE_FILE
        try:
            state = read_json(path, MAX_RECORD_BYTES, "prepare state")
        except (OSError, UnsafeFileError):
            return None
        if not isinstance(state, dict) or state.get("key") != self.key:
            changed = _changed_files(
                state.get("source") if isinstance(state, dict) else None, self.source_id
            )
            what = (
                f"input file(s) changed since it was interrupted: {', '.join(changed[:3])}"
                + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
                if changed
                else "other arguments or other input files"
            )
            self._note(f"{self.work} holds an unfinished prepare with {what}; starting over")
            return None
        return state

    def _save_state(self, state: dict[str, Any]) -> None:
        atomic_write_text(self.work / STATE_FILE, json.dumps(state) + "\n", fsync=True)
        fsync_dir(self.work)

    def discard(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)

    def _note(self, text: str) -> None:
        if self.progress:
            print(f"taperlm prepare: {text}", file=sys.stderr)

    # --- stages -----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        state = self._load_state() if self.work.is_dir() else None
        if state is not None:
            try:
                return self._run_from(state)
            except ResumeMismatch as err:
                self._note(f"cannot continue the unfinished prepare ({err}); starting over")
        self.discard()
        self.work.mkdir(parents=True)
        t0 = time.perf_counter()
        tok, sampled = self._build_tokenizer()
        tok.save(self.work / TOKENIZER_DIR)
        release_free_memory()  # what tokenizer training used
        self.timing["tokenizer_s"] = time.perf_counter() - t0
        empty = {"done": [], "open": {"tokens": 0, "crc32": 0}}
        state = {
            "key": self.key,
            "source": self.source_id,  # to name what changed when a resume is refused
            "phase": "stream",
            "sampled_chars": sampled,
            "cursor": None,
            "counts": {"docs": 0, "chars": 0, "train_docs": 0, "val_docs": 0},
            "train": empty,
            "val": empty,
        }
        self._save_state(state)
        return self._run_from(state, fresh=True)

    def _run_from(self, state: dict[str, Any], fresh: bool = False) -> dict[str, Any]:
        tok = load_tokenizer(self.work / TOKENIZER_DIR)
        if not fresh:
            tokens = sum(
                state[k]["open"]["tokens"] + sum(d["tokens"] for d in state[k]["done"])
                for k in ("train", "val")
            )
            self.resumed = {
                "phase": state["phase"],
                "documents": state["counts"]["docs"],
                "tokens": tokens,
            }
            self._note(
                f"continuing the unfinished prepare in {self.work} after "
                f"{self.resumed['documents']:,} documents ({self.resumed['tokens']:,} tokens)"
            )
        if state["phase"] == "stream":
            t0 = time.perf_counter()
            state = self._stream(state, tok)
            self.timing["tokenize_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        meta = self._finish(state, tok)
        self.timing["finish_s"] = time.perf_counter() - t0
        return meta

    def _build_tokenizer(self) -> tuple[Tokenizer, int]:
        if self.fixed_tokenizer is not None:
            return self.fixed_tokenizer, 0
        n = parse_bpe_spec(self.s.tokenizer)
        sampled = [0]
        texts = self._sample(sampled, exclude_val=True)
        first = next(texts, None)
        if first is None:  # every document is a validation pick: sample them all the same
            texts = self._sample(sampled, exclude_val=False)
            first = next(texts, None)
        if first is None:
            raise DataError(f"source {self.src.spec!r} produced no documents")
        tok = train_bpe(_chain(first, texts), n, show_progress=self.progress)
        self._note(f"trained {self.s.tokenizer} on a sample of {sampled[0]:,} characters")
        return tok, sampled[0]

    def _sample(self, sampled: list[int], exclude_val: bool) -> Iterator[str]:
        """The tokenizer sample: training documents from the start, up to the sample size."""
        s = self.s
        left = s.tokenizer_sample_chars
        count = ByteCounter()
        bar = Progress("tokenizer sample", enabled=self.progress)
        docs = 0
        try:
            for text, _ in _capped(self.src.read(count=count), s.max_chars, 0):
                if exclude_val and doc_hash(text, s.seed) < s.val_fraction:
                    continue
                text = text[:left]
                left -= len(text)
                sampled[0] += len(text)
                docs += 1
                bar.update(count(), docs, 0)
                yield text
                if left <= 0:
                    return
        finally:
            bar.close()

    # --- streaming ----------------------------------------------------------------------------

    def _val_full(self) -> bool:
        return self.s.val_tokens is not None and self.val_count >= self.s.val_tokens

    def _finished(self) -> bool:
        """Nothing more to take from the stream (max_tokens reached and validation complete)."""
        return self.train_full and (self.s.val_tokens is None or self._val_full())

    def _jobs(self, docs, chars: int) -> Iterator[tuple[list[str | None], _Batch]]:
        """Tokenization jobs from the documents: texts plus, per document, its validation draw
        and length. Documents that can only be discarded are not tokenized (text None)."""
        s = self.s
        texts: list[str | None] = []
        draws: list[tuple[float, int]] = []
        size = 0
        cursor = None
        for text, cursor in _capped(docs, s.max_chars, chars):
            draw = doc_hash(text, s.seed)
            if self.train_full:
                if self._finished():
                    break
                if draw >= s.val_fraction or self._val_full():
                    texts.append(None)
                    draws.append((draw, len(text)))
                    continue
            texts.append(text)
            draws.append((draw, len(text)))
            size += len(text)
            if size >= _BATCH_CHARS or len(texts) >= _BATCH_DOCS:
                yield texts, _Batch(draws, cursor)
                texts, draws, size = [], [], 0
        if texts:
            yield texts, _Batch(draws, cursor)

    def _stream(self, state: dict[str, Any], tok: Tokenizer) -> dict[str, Any]:
        s = self.s
        dtype = dtype_for_vocab(tok.vocab_size)
        train = ShardSeries(self.work, "train", tok.vocab_size, s.shard_tokens, state["train"])
        val = ShardSeries(self.work, "val", tok.vocab_size, s.shard_tokens, state["val"])
        counts = dict(state["counts"])
        self.train_count, self.val_count = train.tokens, val.tokens
        self.train_full = s.max_tokens is not None and self.train_count >= s.max_tokens
        start = Cursor.from_json(state["cursor"]) if state["cursor"] else None
        count = ByteCounter()
        jobs = self._jobs(self.src.read(start=start, count=count), counts["chars"])
        encoder = OrderedEncoder(tok, self.work / TOKENIZER_DIR, self.workers, dtype)
        bar = Progress(
            "tokenize",
            enabled=self.progress,
            total_bytes=self.src.total_bytes(),
            total_tokens=s.max_tokens,
            resumed_tokens=train.tokens + val.tokens,
        )
        published = len(train.done) + len(val.done)
        saved_at = time.perf_counter()
        try:
            for batch, ids, lengths in encoder.map(jobs):
                self._route(batch, ids, lengths, train, val, counts)
                bar.update(count(), counts["docs"], train.tokens + val.tokens)
                if self._finished():
                    break
                now = time.perf_counter()
                shards = len(train.done) + len(val.done)
                if shards != published or now - saved_at >= CHECKPOINT_SECONDS:
                    state = {
                        **state,
                        "cursor": batch.cursor.to_json(),
                        "counts": dict(counts),
                        "train": train.sync(),
                        "val": val.sync(),
                    }
                    self._save_state(state)
                    published, saved_at = shards, now
        finally:
            bar.close()
        state = {
            **state,
            "phase": "final",
            "cursor": None,
            "counts": dict(counts),
            "train": train.sync(),
            "val": val.sync(),
        }
        self._save_state(state)
        return state

    def _route(self, batch: _Batch, ids: np.ndarray, lengths: np.ndarray, train, val, counts):
        """Send each document of a tokenized batch to its split (module docstring, step 3);
        consecutive training documents are written with one call."""
        s = self.s
        ends = np.cumsum(lengths)
        run = [0, 0]  # training documents not yet written: ids[run[0]:run[1]]

        def flush() -> None:
            if run[1] > run[0]:
                train.write(ids[run[0] : run[1]])
            run[0] = run[1]

        for i, (draw, n_chars) in enumerate(batch.draws):
            counts["docs"] += 1
            counts["chars"] += n_chars
            a, b = int(ends[i] - lengths[i]), int(ends[i])
            if draw < s.val_fraction and not self._val_full():
                flush()
                val.write(ids[a:b])
                self.val_count += b - a
                counts["val_docs"] += 1
            elif not self.train_full:
                if s.max_tokens is not None and b - a >= s.max_tokens - self.train_count:
                    b = a + s.max_tokens - self.train_count
                    self.train_full = True
                if a != run[1]:
                    flush()
                    run[0] = a
                run[1] = b
                self.train_count += b - a
                counts["train_docs"] += 1
            if self._finished():
                break
        flush()

    # --- the end: tail split, last shards, meta.json -----------------------------------------

    def _finish(self, state: dict[str, Any], tok: Tokenizer) -> dict[str, Any]:
        s, vocab, work = self.s, tok.vocab_size, self.work
        counts = dict(state["counts"])
        if counts["docs"] == 0:
            raise DataError(f"source {self.src.spec!r} produced no documents")
        train = ShardSeries(work, "train", vocab, s.shard_tokens, state["train"])
        val = ShardSeries(work, "val", vocab, s.shard_tokens, state["val"])
        train_shards, val_shards, mode, target, tail = val_split.settle(
            work, train, val, counts, tok.eos_id, s.shard_tokens, s.val_tokens, s.val_fraction
        )
        meta = self._meta(tok, counts, state, train_shards, val_shards, mode, target, tail)
        atomic_write_text(work / META_FILE, json.dumps(meta, indent=2) + "\n")
        (work / STATE_FILE).unlink(missing_ok=True)
        return meta

    def _meta(self, tok, counts, state, train_shards, val_shards, mode, target, tail):
        s = self.s
        splits = {}
        for name, shards, docs in (
            ("train", train_shards, counts["train_docs"] - tail["starts"]),
            ("val", val_shards, counts["val_docs"] + tail["overlaps"]),
        ):
            splits[name] = {
                "tokens": sum(d["tokens"] for d in shards),
                "documents": docs,
                "shards": shards,
            }
        tokenizer_info: dict[str, Any] = {"kind": tok.kind, "spec": tok.spec, "dir": TOKENIZER_DIR}
        # what the tokens were made with, whatever later happens to the file
        tokenizer_info["identity"] = tokenizer_identity(self.work / TOKENIZER_DIR / TOKENIZER_FILE)
        if s.tokenizer.startswith("bpe:"):
            tokenizer_info["sample_chars"] = state["sampled_chars"]
        return {
            "format": META_FORMAT,
            "format_version": META_VERSION,
            "created_by": f"taperlm {__version__}",
            "source": {
                **self.src.describe(),
                "documents": counts["docs"],
                "chars": counts["chars"],
                "max_chars": s.max_chars,
            },
            "tokenizer": tokenizer_info,
            "vocab_size": tok.vocab_size,
            "eos_id": tok.eos_id,
            "bos_id": tok.bos_id,
            "dtype": str(dtype_for_vocab(tok.vocab_size)),
            "shard_tokens": s.shard_tokens,
            "max_tokens": s.max_tokens,
            "val_split": {
                "mode": mode,
                "rule": "blake2b(text, key=seed) < fraction",
                "fraction": s.val_fraction,
                "tokens_target": target,
                "tail_tokens": tail["tokens"],
                "seed": s.seed,
            },
            "splits": splits,
        }


@dataclass(frozen=True)
class _Batch:
    draws: list[tuple[float, int]]  # (validation draw, characters) per document
    cursor: Cursor  # source position after the batch


def _capped(docs, max_chars: int | None, chars: int) -> Iterator[tuple[str, Cursor]]:
    """(text, cursor) of the documents until `max_chars` characters in all (`chars` were read
    before); the last text is cut to fit."""
    for doc, cursor in docs:
        text = doc.text
        if max_chars is not None:
            if chars >= max_chars:
                return
            text = text[: max_chars - chars]
        chars += len(text)
        yield text, cursor


def _chain(first, rest):
    yield first
    yield from rest

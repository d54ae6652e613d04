"""Tokenizers: every kind becomes one `tokenizers.Tokenizer` wrapped by `Tokenizer`.

Kinds (the `--tokenizer` argument of `taperlm prepare`):

- ``bpe:N``: a byte-level BPE with N ids trained offline on the corpus with the `tokenizers`
  library (GPT-2 pre-tokenization, ``<|endoftext|>`` = id 0 is EOS). Deterministic given the corpus.
- a path: a GPT-2-style folder (vocab.json + merges.txt), a tokenizer.json file or a folder with
  one (optionally tokenizer_config.json / tokenizer_meta.json naming EOS/BOS), or a data dir
  written by `taperlm prepare` (its tokenizer/ is reused).
- ``hf:NAME``: any Hugging Face tokenizer with a fast version (needs transformers and internet).

Saved form (``DATA_DIR/tokenizer/``): tokenizer.json (Hugging Face tokenizers format) and
tokenizer_meta.json (kind, spec, EOS/BOS tokens and ids, vocab size).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as Backend

from taperlm.data.datadir import TOKENIZER_DIR, resolve
from taperlm.data.tokenizer_bounds import build_backend, check_entry_count, check_pipeline, guarded
from taperlm.errors import DataError, UnsafeFileError
from taperlm.files.io import (
    MAX_RECORD_BYTES,
    atomic_write_text,
    check_regular,
    not_a_file,
    read_bytes,
    read_json,
    read_text,
)
from taperlm.spec.domains import MAX_VOCAB, choices

EOS_TOKEN = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"
META_FILE = "tokenizer_meta.json"
# EOS spellings recognised in tokenizers that do not say which token ends a document.
_EOS_CANDIDATES = (EOS_TOKEN, "</s>", "<eos>", "<|end_of_text|>", "[SEP]")
MAX_TOKENIZER_BYTES = 256 << 20  # a 256K-id tokenizer.json is ~35 MB; 10^6 ids ~100 MB
MIN_BPE_VOCAB = 258  # 256 byte symbols + EOS + at least one merge
# Where a tokenizer came from: trained on the corpus (bpe:N), a Hugging Face hub name (hf:NAME),
# files on disk (a tokenizer.json, vocab.json + merges.txt, or a data dir), or the checkpoint
# folder `taperlm import` read.
TokenizerKind = Literal["bpe", "hf", "local", "import"]


class Tokenizer:
    """A `tokenizers.Tokenizer` plus the facts training needs (vocab size, EOS/BOS ids)."""

    def __init__(
        self,
        backend: Any,
        *,
        kind: TokenizerKind,
        spec: str,
        eos_token: str,
        bos_token: str | None = None,
    ) -> None:
        self.backend = backend
        self.kind = kind
        self.spec = spec
        self.eos_token = eos_token
        self.bos_token = bos_token
        eos_id = backend.token_to_id(eos_token)
        if eos_id is None:
            raise DataError(f"tokenizer {spec!r}: EOS token {eos_token!r} is not in its vocabulary")
        self.eos_id: int = int(eos_id)
        bos_id = backend.token_to_id(bos_token) if bos_token else None
        self.bos_id: int | None = None if bos_id is None else int(bos_id)
        # The largest id + 1 (not the count of ids): a model's embedding must cover every id.
        self.vocab_size: int = max(backend.get_vocab(with_added_tokens=True).values()) + 1
        if self.vocab_size > MAX_VOCAB:  # one id of 2^31 makes every table sized by ids huge
            raise DataError(
                f"tokenizer {spec!r} has ids up to {self.vocab_size - 1:,}, past the "
                f"{MAX_VOCAB:,} rows a taperlm model's embedding can have; it is damaged or "
                "crafted: use the tokenizer as it was released (or a bpe:N one)"
            )

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no BOS/EOS added)."""
        return guarded(lambda: self.backend.encode(text, add_special_tokens=False).ids, self.spec)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text; the same ids as `encode` (the fast path skips offsets)."""
        encode = getattr(self.backend, "encode_batch_fast", None) or self.backend.encode_batch
        return guarded(lambda: [e.ids for e in encode(texts, add_special_tokens=False)], self.spec)

    def decode(self, ids: Iterable[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False)

    @property
    def meta(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "spec": self.spec,
            "vocab_size": self.vocab_size,
            "eos_token": self.eos_token,
            "eos_id": self.eos_id,
            "bos_token": self.bos_token,
            "bos_id": self.bos_id,
        }

    def save(self, directory: str | Path) -> Path:
        """Write tokenizer.json + tokenizer_meta.json into `directory` (atomically per file)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(directory / TOKENIZER_FILE, self.backend.to_str())
        atomic_write_text(directory / META_FILE, json.dumps(self.meta, indent=2) + "\n")
        return directory

    def to_hf(self):
        """A `transformers.PreTrainedTokenizerFast` with the same vocabulary (for HF export)."""
        try:
            from transformers import PreTrainedTokenizerFast
        except ImportError:
            raise DataError(
                "exporting a tokenizer needs transformers: pip install 'taperlm[hf]'"
            ) from None

        tok = PreTrainedTokenizerFast(
            tokenizer_object=Backend.from_str(self.backend.to_str()),
            eos_token=self.eos_token,
            bos_token=self.bos_token,
        )
        return tok

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, spec={self.spec!r}, vocab_size={self.vocab_size})"


# --- building from a --tokenizer spec ------------------------------------------------------------


def parse_bpe_spec(spec: str) -> int:
    """ "bpe:N" -> N, validated."""
    value = spec[len("bpe:") :]
    try:
        n = int(value)
    except ValueError:
        raise DataError(
            f"tokenizer {spec!r}: expected bpe:N with an integer N, e.g. bpe:8192"
        ) from None
    if n < MIN_BPE_VOCAB or n > 2**31:
        raise DataError(f"tokenizer {spec!r}: N must be between {MIN_BPE_VOCAB} and 2**31")
    return n


def train_bpe(texts: Iterable[str], vocab_size: int, show_progress: bool = False) -> Tokenizer:
    """Train a byte-level BPE (GPT-2 pre-tokenization) with EOS = <|endoftext|> = id 0."""

    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    return Tokenizer(backend, kind="bpe", spec=f"bpe:{vocab_size}", eos_token=EOS_TOKEN)


def build_tokenizer(
    spec: str, texts: Iterable[str] | None = None, show_progress: bool = False
) -> Tokenizer:
    """Tokenizer for a --tokenizer value; `texts` (the corpus) is needed only for bpe:N."""
    if spec.startswith("bpe:"):
        n = parse_bpe_spec(spec)
        if texts is None:
            raise DataError(f"tokenizer {spec!r} is trained on the corpus; no texts were given")
        return train_bpe(texts, n, show_progress=show_progress)
    if spec.startswith("hf:"):
        return _from_hf(spec)
    path = Path(spec)
    if not path.exists():
        raise DataError(
            f"tokenizer {spec!r}: no such file or folder; use bpe:N, hf:NAME, a "
            "folder with vocab.json+merges.txt or tokenizer.json, or a data dir"
        )
    return load_tokenizer(path, spec=spec)


def _from_hf(spec: str) -> Tokenizer:
    name = spec[len("hf:") :]
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise DataError(
            f"tokenizer {spec!r} needs transformers: pip install 'taperlm[hf]'"
        ) from None
    try:
        # Never the tokenizer's own code (auto_map), and never an interactive prompt about it.
        hf = AutoTokenizer.from_pretrained(name, trust_remote_code=False)
    except Exception as err:  # offline, unknown name, gated repo
        raise DataError(
            f"could not load Hugging Face tokenizer {name!r}: {type(err).__name__}: "
            f"{str(err).rstrip('.')}. "
            "hf: tokenizers need internet access; offline, use bpe:N or a local folder"
        ) from None
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        raise DataError(f"Hugging Face tokenizer {name!r} has no fast (tokenizers) version")

    backend = Backend.from_str(backend.to_str())
    check_pipeline(backend, spec)
    eos = hf.eos_token or _find_eos(backend)
    return _with_eos(backend, "hf", spec, eos, hf.bos_token)


def _find_eos(backend) -> str | None:
    for token in _EOS_CANDIDATES:
        if backend.token_to_id(token) is not None:
            return token
    return None


def _with_eos(
    backend, kind: TokenizerKind, spec: str, eos: str | None, bos: str | None
) -> Tokenizer:
    """Make sure EOS exists and is a special token (added as a new id when the vocab lacks one)."""

    eos = eos or EOS_TOKEN
    backend.add_special_tokens([AddedToken(eos, special=True, normalized=False)])
    if bos and backend.token_to_id(bos) is None:
        bos = None
    return Tokenizer(backend, kind=kind, spec=spec, eos_token=eos, bos_token=bos)


def load_tokenizer(path: str | Path, spec: str | None = None) -> Tokenizer:
    """Load a tokenizer from a data dir, a saved tokenizer dir, a tokenizer.json file, or a
    GPT-2-style folder (vocab.json + merges.txt)."""

    path = Path(path)
    spec = spec or str(path)
    if path.is_dir() and not (path / TOKENIZER_FILE).exists():
        tokenizer_dir = resolve(path, TOKENIZER_DIR)
        if tokenizer_dir.is_dir():
            path = tokenizer_dir  # a data dir written by `taperlm prepare`
    if path.is_file():
        file, folder = path, path.parent
    elif (path / TOKENIZER_FILE).is_file() or not_a_file(path / TOKENIZER_FILE):
        file, folder = path / TOKENIZER_FILE, path  # a FIFO there is named, not skipped
    elif (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
        return _from_gpt2_files(path, spec)
    else:
        raise DataError(
            f"no tokenizer in {path}: expected tokenizer.json, vocab.json + merges.txt, or a data "
            "dir from `taperlm prepare` (with tokenizer/)"
        )
    try:
        backend = build_backend(read_text(file, MAX_TOKENIZER_BYTES, "tokenizer file"), file)
    except UnsafeFileError as err:
        raise DataError(str(err)) from None
    meta = _read_json(folder / META_FILE) if file.name == TOKENIZER_FILE else {}
    _check_meta_types(folder / META_FILE, meta)
    if meta.get("eos_token"):
        tok = Tokenizer(
            backend,
            kind=meta.get("kind", "local"),
            spec=meta.get("spec", spec),
            eos_token=meta["eos_token"],
            bos_token=meta.get("bos_token"),
        )
        if meta.get("vocab_size") not in (None, tok.vocab_size):
            raise DataError(
                f"{folder / META_FILE}: vocab_size {meta['vocab_size']} does not match "
                f"{file} ({tok.vocab_size} ids); re-run `taperlm prepare`"
            )
        return tok
    config = _read_json(folder / "tokenizer_config.json")
    eos = _token_str(config.get("eos_token")) or _find_eos(backend)
    return _with_eos(backend, "local", spec, eos, _token_str(config.get("bos_token")))


_META_TYPES: dict[str, tuple[type, ...]] = {
    "kind": (str,),
    "spec": (str,),
    "eos_token": (str,),
    "bos_token": (str, type(None)),
    "vocab_size": (int, type(None)),
}


def _check_meta_types(path: Path, meta: dict[str, Any]) -> None:
    """DataError naming the first field of tokenizer_meta.json with a wrong type."""
    for key, types in _META_TYPES.items():
        if (key in meta and not isinstance(meta[key], types)) or isinstance(meta.get(key), bool):
            raise DataError(
                f"{path}: {key!r} must be {' or '.join(t.__name__ for t in types)}, got "
                f"{type(meta[key]).__name__}; the file is damaged: restore it or re-run "
                "`taperlm prepare`"
            )
    if "kind" in meta and meta["kind"] not in choices(TokenizerKind):
        raise DataError(
            f"{path}: 'kind' must be one of {', '.join(choices(TokenizerKind))}, got "
            f"{meta['kind']!r}; the file is damaged: restore it or re-run `taperlm prepare`"
        )


def _from_gpt2_files(folder: Path, spec: str) -> Tokenizer:
    try:
        vocab = check_regular(folder / "vocab.json", MAX_TOKENIZER_BYTES, "tokenizer vocabulary")
        merges = check_regular(folder / "merges.txt", MAX_TOKENIZER_BYTES, "tokenizer merges")
        lines = read_bytes(merges, MAX_TOKENIZER_BYTES, "tokenizer merges").count(b"\n")
        check_entry_count(
            read_text(vocab, MAX_TOKENIZER_BYTES, "tokenizer vocabulary"), folder, lines
        )
        model = models.BPE.from_file(str(vocab), str(merges))
    except (UnsafeFileError, DataError) as err:
        raise DataError(str(err)) from None
    except Exception as err:
        raise DataError(f"{folder}: cannot read vocab.json + merges.txt ({err})") from None
    backend = Backend(model)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    config = _read_json(folder / "tokenizer_config.json")
    eos = _token_str(config.get("eos_token")) or _find_eos(backend)
    return _with_eos(backend, "local", spec, eos, _token_str(config.get("bos_token")))


def _token_str(value: Any) -> str | None:
    """tokenizer_config.json stores tokens as strings or as {"content": ...} objects."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _read_json(path: Path) -> dict:
    if not path.is_file() and not_a_file(path) is None:
        return {}
    try:
        data = read_json(path, MAX_RECORD_BYTES, "tokenizer file")
    except UnsafeFileError as err:
        raise DataError(str(err)) from None
    return data if isinstance(data, dict) else {}


def iter_batches(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """Consecutive lists of `size` items (the last may be shorter)."""
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch

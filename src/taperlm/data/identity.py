"""A run is bound to the data it trains on: its tokenizer (a copy) and the data's identity.

When a run starts, the trainer writes into the run dir

    RUN/tokenizer/      a copy of the data dir's tokenizer (tokenizer.json, tokenizer_meta.json)
    RUN/data.json       the data's identity: sha256 of tokenizer.json, vocab size, EOS id, and
                        meta.json's record of every split (token count and checksums)

so that a data dir re-prepared later (another tokenizer, other text) is recognised instead of
silently giving wrong numbers: `eval`, `generate`, `export` and `novelty` tokenize with the run's
own copy, and whatever reads the data dir's tokens again (resuming, `eval`'s val task, compare's
evaluation) compares the identity first and stops with an error saying what changed. Runs
written before this existed carry neither file and keep working with their data dir's tokenizer.

Weights are bound to their tokenizer. A tokenizer's identity (`tokenizer_identity`) is the
sha256 of its normalised definition: tokenizer.json parsed and written again with sorted keys
and no whitespace (and merges in one spelling), so a re-serialised file keeps it while any change
of vocabulary, merges, normaliser, pre-tokeniser or special tokens changes it. A data dir
records it in meta.json (`tokenizer.identity`), a trained run in data.json, an imported one in
RUN/tokenizer/tokenizer_meta.json (`stamp_tokenizer`). `taperlm.checkpoint.loading.weights_tokenizer`
finds the tokenizer any weights were trained with (recorded, or computed from the file a run
holds when it predates the record), and `taperlm.checkpoint.loading.check_tokenizer` compares it on every
path where weights meet a data dir, with one refusal (`other_tokenizer`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taperlm.data import datadir
from taperlm.data.tokenizer import MAX_TOKENIZER_BYTES
from taperlm.errors import DataError, UnsafeFileError
from taperlm.files.io import (
    MAX_RECORD_BYTES,
    atomic_write_json,
    read_json,
    read_text,
    replace_dir,
    sha256_file,
    strict_json_loads,
)
from taperlm.files.runlock import pid_alive

RECORD_FILE = "data.json"
TOKENIZER_COPY = "tokenizer"
RECORD_VERSION = 1
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_meta.json")
# Reads of a data dir that a re-prepare replaced meanwhile are repeated this often.
_ATTEMPTS = 5
# Identities computed this process, by the file's (path, inode, size, mtime, ctime): a 256k-id
# tokenizer.json takes a second to parse, and one command checks it on several paths.
_IDENTITIES: dict[tuple[Any, ...], str] = {}
_MAX_CACHED = 64


def definition_identity(text: str, name: str | Path = "tokenizer.json") -> str:
    """sha256 of a tokenizer.json's normalised definition: parsed (a key given twice is
    refused), merges in one spelling ("a b" and ["a", "b"] are the same merge), written again
    with sorted keys and no whitespace. MalformedFileError for text that is not such JSON."""
    data = strict_json_loads(text, name, "tokenizer file")
    model = data.get("model") if isinstance(data, dict) else None
    if isinstance(model, dict) and isinstance(model.get("merges"), list):
        model["merges"] = [
            m.split(" ") if isinstance(m, str) and m.count(" ") == 1 else m for m in model["merges"]
        ]
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def tokenizer_identity(path: str | Path) -> str:
    """`definition_identity` of the tokenizer.json file `path`; DataError for a file that is not
    one (not a regular file, too large, not JSON)."""
    path = Path(path)
    st = os.stat(path)
    key = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _IDENTITIES:
        try:
            text = read_text(path, MAX_TOKENIZER_BYTES, "tokenizer file")
            identity = definition_identity(text, path)
        except UnsafeFileError as err:  # MalformedFileError too
            raise DataError(str(err)) from None
        if len(_IDENTITIES) >= _MAX_CACHED:
            _IDENTITIES.clear()
        _IDENTITIES[key] = identity
    return _IDENTITIES[key]


def _tokenizer_dir(data_dir: Path, meta: dict[str, Any]) -> Path:
    """The tokenizer folder of the preparation `meta` describes: inside a commit still being
    moved into place, else in the data dir (the loader reads shards the same way)."""
    info = meta.get("tokenizer") if isinstance(meta.get("tokenizer"), dict) else {}
    return datadir.resolve(data_dir, str(info.get("dir", datadir.TOKENIZER_DIR)))


def _replaced_meanwhile(data_dir: Path, attempt: int) -> DataError:
    return DataError(
        f"{data_dir} was replaced by a `taperlm prepare` {attempt} times while being read; "
        "wait for that prepare to finish and try again"
    )


def data_identity(data_dir: str | Path) -> dict[str, Any]:
    """What identifies a `taperlm prepare` output: its tokenizer and its splits.

    meta.json and the tokenizer are read as one: a re-prepare committing in between (its files
    moving into place) shows as a changed meta.json, and the reading is repeated."""
    data_dir = Path(data_dir)
    for _ in range(_ATTEMPTS):
        meta = datadir.load_meta(data_dir)
        tok = _tokenizer_dir(data_dir, meta) / "tokenizer.json"
        try:
            sha, identity = sha256_file(tok), tokenizer_identity(tok)
        except FileNotFoundError:
            sha = identity = None  # missing, or moved into place just now
        if datadir.load_meta(data_dir) == meta:
            break
    else:
        raise _replaced_meanwhile(data_dir, _ATTEMPTS)
    if sha is None:
        raise DataError(f"{data_dir} has no {tok.relative_to(data_dir)}; re-run `taperlm prepare`")
    info = meta.get("tokenizer") if isinstance(meta.get("tokenizer"), dict) else {}
    recorded = info.get("identity")
    if recorded is not None and recorded != identity:  # older data dirs record none
        raise DataError(
            f"{tok} is not the tokenizer the tokens of {data_dir} were made with (its meta.json "
            f"records tokenizer {str(recorded)[:16]}, the file is {identity[:16]}): it was "
            "replaced after `taperlm prepare`; restore it or re-run `taperlm prepare`"
        )
    return {
        "version": RECORD_VERSION,
        "data_dir": str(data_dir.resolve()),
        "tokenizer": {
            "sha256": sha,
            "identity": identity,
            "spec": info.get("spec"),
            "vocab_size": meta["vocab_size"],
            "eos_id": meta["eos_id"],
        },
        "splits": meta["splits"],
    }


def read_record(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's data record (None for runs that predate it); DataError for a damaged one (a
    damaged record must not silently switch the data check off)."""

    path = Path(run_dir) / RECORD_FILE
    if not path.exists():
        return None
    try:
        record = read_json(path, MAX_RECORD_BYTES, RECORD_FILE)
        why = _record_problem(record)
    except (OSError, UnsafeFileError) as err:  # not UTF-8, not JSON, too deep, not a file
        why = str(err)
    if why:
        raise DataError(
            f"{path} is damaged ({why}), so the data this run was trained on cannot be checked; "
            f"restore it, or delete it to accept the data dir in the run's config as is (it is "
            "written again on the next train)"
        )
    return record


def _record_problem(record: Any) -> str | None:
    if not isinstance(record, dict):
        return f"it holds a {type(record).__name__}, not an object"
    tok, splits = record.get("tokenizer"), record.get("splits", {})
    if not isinstance(tok, dict) or not isinstance(tok.get("sha256"), str):
        return "its 'tokenizer' is not an object with a sha256"
    if not isinstance(splits, dict) or not all(isinstance(v, dict) for v in splits.values()):
        return "its 'splits' is not an object of objects"
    return None


def run_tokenizer_dir(run_dir: str | Path) -> Path | None:
    """The run's own tokenizer copy, if it has one."""
    path = Path(run_dir) / TOKENIZER_COPY
    return path if (path / "tokenizer.json").is_file() else None


def record_run_data(run_dir: str | Path, data_dir: str | Path) -> dict[str, Any]:
    """Copy the data dir's tokenizer into the run and write its identity (each atomically: a
    temp folder renamed into place, then the record). Returns the record."""

    run_dir, data_dir = Path(run_dir), Path(data_dir)
    final = run_dir / TOKENIZER_COPY
    for stale in run_dir.glob(f".tmp-*{TOKENIZER_COPY}-*"):  # of writers killed mid-copy
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = run_dir / f".tmp-{TOKENIZER_COPY}-{os.getpid()}"
    try:
        for _ in range(_ATTEMPTS):  # the copy and the record of one and the same preparation
            record = data_identity(data_dir)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            src = _tokenizer_dir(data_dir, datadir.load_meta(data_dir))
            try:
                for name in _TOKENIZER_FILES:
                    if (src / name).is_file():
                        shutil.copyfile(src / name, tmp / name)
                copied = sha256_file(tmp / "tokenizer.json")
            except FileNotFoundError:  # moved into place by a re-prepare just now
                continue
            if copied == record["tokenizer"]["sha256"] and data_identity(data_dir) == record:
                break
        else:
            raise _replaced_meanwhile(data_dir, _ATTEMPTS)
        replace_dir(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    atomic_write_json(run_dir / RECORD_FILE, record, indent=2, fsync=True)
    return record


def _short(record: dict[str, Any]) -> str:
    t = record["tokenizer"]
    return f"{t.get('spec') or 'tokenizer'}, vocab {t.get('vocab_size')}, sha256 {str(t.get('sha256'))[:12]}"


def difference(
    recorded: dict[str, Any], current: dict[str, Any], splits: tuple[str, ...]
) -> str | None:
    """What differs between the run's record and a data dir's identity (the tokenizer, then
    the given splits), or None."""
    if not _same_tokenizer(recorded["tokenizer"], current["tokenizer"]):
        return (
            f"it holds another tokenizer ({_short(current)}) than the one the run was trained "
            f"with ({_short(recorded)}; re-prepared since?)"
        )
    for name in splits:
        a, b = recorded.get("splits", {}).get(name), current.get("splits", {}).get(name)
        if a != b:

            def tokens(s: Any) -> str:
                return str(s.get("tokens")) if isinstance(s, dict) else "no"

            return (
                f"its {name} split holds other tokens ({tokens(b)} tokens now, {tokens(a)} "
                "when the run trained on it)"
            )
    return None


def check_run_data(
    run_dir: str | Path, data_dir: str | Path, splits: tuple[str, ...]
) -> str | None:
    """Why `data_dir` is not the data run `run_dir` was trained on (its tokenizer, or the
    tokens of `splits`), or None (also for runs that predate the record)."""
    recorded = read_record(run_dir)
    if recorded is None:
        return None
    return difference(recorded, data_identity(data_dir), splits)


# ----------------------------------------------------------------------------------------------
# weights bound to their tokenizer

META_COPY = "tokenizer_meta.json"


def _same_tokenizer(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two tokenizer records name one tokenizer: by identity where both have one, else
    (a record written before identities) by the sha256 of the file."""
    if a.get("identity") and b.get("identity"):
        return a["identity"] == b["identity"]
    return a.get("sha256") == b.get("sha256")


@dataclass(frozen=True)
class TokenizerRef:
    """Which tokenizer something holds or was trained with, and where that was read."""

    identity: str | None  # `tokenizer_identity`; None: only the file's sha256 is known
    sha256: str | None
    spec: str | None  # what it was made from (bpe:N, a path, an imported folder)
    vocab_size: int | None
    origin: str  # the file it was read or computed from
    prepare_with: str | None  # what `taperlm prepare --tokenizer` takes to use it

    def same_as(self, other: TokenizerRef) -> bool:
        return _same_tokenizer(
            {"identity": self.identity, "sha256": self.sha256},
            {"identity": other.identity, "sha256": other.sha256},
        )

    def describe(self) -> str:
        name = self.identity[:16] if self.identity else f"sha256 {str(self.sha256)[:16]}"
        made = ", ".join(
            x
            for x in (self.spec, None if self.vocab_size is None else f"{self.vocab_size} ids")
            if x
        )
        return f"{name} ({made}; {self.origin})" if made else f"{name} ({self.origin})"


def _read_meta(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        meta = read_json(path, MAX_RECORD_BYTES, META_COPY)
    except (OSError, UnsafeFileError) as err:
        raise DataError(f"{path} is damaged ({err}); restore it") from None
    return meta if isinstance(meta, dict) else {}


def stamp_tokenizer(folder: str | Path) -> str:
    """Record the identity of `folder`/tokenizer.json in its tokenizer_meta.json (a run's own
    copy written without a data record: `taperlm import`). Returns the identity."""
    folder = Path(folder)
    identity = tokenizer_identity(folder / "tokenizer.json")
    meta = _read_meta(folder / META_COPY)
    atomic_write_json(folder / META_COPY, {**meta, "identity": identity}, indent=2)
    return identity


def copy_tokenizer(copy: Path) -> TokenizerRef:
    """The tokenizer of a run's own copy `copy` (RUN/tokenizer)."""
    file = copy / "tokenizer.json"
    identity = tokenizer_identity(file)
    meta = _read_meta(copy / META_COPY)
    recorded = meta.get("identity")
    if recorded is not None and recorded != identity:
        raise DataError(
            f"{file} was changed after it was written (its {META_COPY} records tokenizer "
            f"{str(recorded)[:16]}, the file is {identity[:16]}): the weights beside it were not "
            "trained with it; restore it"
        )
    spec, size = meta.get("spec"), meta.get("vocab_size")
    return TokenizerRef(
        identity,
        sha256_file(file),
        spec if isinstance(spec, str) else None,
        size if isinstance(size, int) and not isinstance(size, bool) else None,
        str(file),
        str(copy),
    )


def data_tokenizer(data_dir: str | Path) -> TokenizerRef:
    """The tokenizer the tokens of data dir `data_dir` were made with."""
    data_dir = Path(data_dir)
    tok = data_identity(data_dir)["tokenizer"]
    where = _tokenizer_dir(data_dir, datadir.load_meta(data_dir)) / "tokenizer.json"
    return TokenizerRef(
        tok["identity"], tok["sha256"], tok.get("spec"), tok.get("vocab_size"), str(where),
        str(data_dir),
    )  # fmt: skip


def other_tokenizer(
    weights: Path, model: TokenizerRef, data_dir: Path, data: TokenizerRef
) -> DataError:
    """The one refusal of weights meeting a data dir of another tokenizer (every path)."""
    prepare = model.prepare_with or "THE_MODELS_TOKENIZER"
    return DataError(
        f"{weights} was trained with another tokenizer than the data dir {data_dir} holds: the "
        f"model's is {model.describe()}, the data's is {data.describe()}. The same ids stand for "
        "other strings there; use data made with the model's tokenizer: the data it was trained "
        f"on, or text prepared with it, `taperlm prepare --tokenizer {prepare} --source TEXT "
        "--out NEW_DATA`"
    )

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
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from taperlm.data import datadir
from taperlm.errors import DataError, UnsafeFileError
from taperlm.io import (
    MAX_RECORD_BYTES,
    atomic_write_json,
    read_json,
    replace_dir,
    sha256_file,
)
from taperlm.runlock import pid_alive

RECORD_FILE = "data.json"
TOKENIZER_COPY = "tokenizer"
RECORD_VERSION = 1
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_meta.json")
# Reads of a data dir that a re-prepare replaced meanwhile are repeated this often.
_ATTEMPTS = 5


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
            sha = sha256_file(tok)
        except FileNotFoundError:
            sha = None  # missing, or moved into place just now
        if datadir.load_meta(data_dir) == meta:
            break
    else:
        raise _replaced_meanwhile(data_dir, _ATTEMPTS)
    if sha is None:
        raise DataError(f"{data_dir} has no {tok.relative_to(data_dir)}; re-run `taperlm prepare`")
    info = meta.get("tokenizer") if isinstance(meta.get("tokenizer"), dict) else {}
    return {
        "version": RECORD_VERSION,
        "data_dir": str(data_dir.resolve()),
        "tokenizer": {
            "sha256": sha,
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
    if recorded["tokenizer"].get("sha256") != current["tokenizer"].get("sha256"):
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

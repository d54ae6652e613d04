"""A data dir on disk: meta.json, shard lists, and replacing one data dir by another safely.

Layout (format_version 2)::

    DATA_DIR/
      meta.json                 what the shards are; written last (the commit point)
      train-00000.bin ...       token shards of each split (taperlm.data.shards)
      val-00000.bin ...
      tokenizer/                tokenizer.json + tokenizer_meta.json
      .taperlm-prepare          marker: this folder belongs to `taperlm prepare`
      .prepare/                 work in progress of an unfinished prepare (resumable)
      .prepare-commit/          a finished prepare being moved into place (see `commit`)

format_version 1 (before sharding) had one ``train.bin`` / ``val.bin`` per split; such data dirs
load unchanged (`split_shards`).

Replacing a data dir (`commit`): a prepare writes everything into ``.prepare/``; when it is
complete it is renamed to ``.prepare-commit/`` (one atomic rename: the new data now counts), then
its files are moved into place one by one (each move atomic) and its meta.json last. While that
runs, readers use `resolve`, which prefers ``.prepare-commit/`` whenever it still holds a meta.json,
so at every moment a reader sees either the complete old data dir or the complete new one. A
prepare that stops in the middle of the moves is finished by the next `taperlm prepare` (or
`roll_forward`); until then readers still see the new data.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from taperlm.errors import ConfigError, DataError, UnsafeFileError
from taperlm.files.io import (
    MAX_RECORD_BYTES,
    fsync_dir,
    not_a_file,
    parse_json,
    path_inside,
    read_text,
)
from taperlm.files.outdirs import check_folder

META_FILE = "meta.json"
MARKER_FILE = ".taperlm-prepare"
META_FORMAT = "taperlm-tokens"
META_VERSION = 2
WORK_DIR = ".prepare"
COMMIT_DIR = ".prepare-commit"
LOCK_FILE = ".prepare.lock"
TOKENIZER_DIR = "tokenizer"
SPLITS = ("train", "val")
# Shard files a prepare may have written (current and format_version 1 names, and temporaries).
_SHARD_NAME = re.compile(r"^(train|val)(-\d{5})?\.bin(\.tmp)?$")
_SHARD_FILE = re.compile(r"^(train|val)(-\d{5})?\.bin$")  # a name meta.json may give


def prepare_hint(data_dir: Path) -> str:
    return f"create it with `taperlm prepare --source default --out {data_dir}`"


def resolve(data_dir: str | Path, name: str) -> Path:
    """Where `name` (a file or the tokenizer folder) of a data dir is now: inside a commit that is
    still being moved into place, else in the data dir itself."""
    data_dir = Path(data_dir)
    pending = data_dir / COMMIT_DIR
    if (pending / META_FILE).is_file() and (pending / name).exists():
        return _inside(pending, name)
    return _inside(data_dir, name)


def _inside(folder: Path, name: str) -> Path:
    """`folder / name`, refused (DataError) when a link there leads outside the folder."""
    try:
        path_inside(folder, name, "data file")
    except UnsafeFileError as err:
        raise DataError(f"{err}; or re-run `taperlm prepare` into a new folder") from None
    return folder / name


def read_meta_text(path: Path) -> str:
    """The text of a meta.json: a regular file of a sane size (a FIFO would block the read)."""
    try:
        return read_text(path, MAX_RECORD_BYTES, "data meta file")
    except UnsafeFileError as err:
        raise DataError(f"{err}; re-run `taperlm prepare`") from None


def is_prepare_output(directory: Path) -> bool:
    """Whether `directory` was written (or is being written) by `taperlm prepare`."""
    if (directory / MARKER_FILE).exists():
        return True
    meta = directory / META_FILE
    if meta.is_file():
        try:
            data = parse_json(read_meta_text(meta), meta, META_FILE)
        except (OSError, UnsafeFileError, DataError):
            return False
        return isinstance(data, dict) and data.get("format") == META_FORMAT
    return False


def check_out_dir(out: Path, force: bool) -> None:
    """A data dir may be written into `out`: new, empty or a data dir; with `force`, also a
    folder of the user's where none of the names prepare writes is taken (`taperlm.files.outdirs`)."""

    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} is a file; choose a folder")
    ours = (META_FILE, TOKENIZER_DIR, WORK_DIR, COMMIT_DIR, LOCK_FILE)
    listed = list(out.iterdir()) if force and out.is_dir() else []
    taken = tuple(p.name for p in listed if _SHARD_NAME.match(p.name))
    try:
        check_folder(out, "data", "--out", (*ours, *taken) if force else ())
    except ConfigError as err:
        raise DataError(str(err)) from None


def load_meta(data_dir: str | Path) -> dict[str, Any]:
    """meta.json of a data dir, with errors for a missing/empty dir or missing/invalid meta."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"data dir {data_dir} does not exist; {prepare_hint(data_dir)}")
    if not any(data_dir.iterdir()):
        raise DataError(f"data dir {data_dir} is empty; {prepare_hint(data_dir)}")
    path = resolve(data_dir, META_FILE)
    kind = not_a_file(path)
    if kind is not None:
        raise DataError(
            f"{path} is {kind}, not a regular file: this is not a data dir `taperlm prepare` "
            f"wrote, or it was altered; {prepare_hint(data_dir)}"
        )
    if not path.is_file():
        if (data_dir / WORK_DIR).is_dir():
            raise DataError(
                f"{data_dir} has no {META_FILE}: a `taperlm prepare` into it has not finished "
                f"(its work is in {data_dir / WORK_DIR}); run the same prepare command again "
                "to continue it"
            )
        raise DataError(
            f"{data_dir} has no {META_FILE}: it is not a complete `taperlm prepare` output "
            f"(an interrupted prepare leaves none); {prepare_hint(data_dir)}"
        )
    try:
        meta = parse_json(read_meta_text(path), path, META_FILE)
    except UnsafeFileError as err:
        raise DataError(f"{err}; re-run `taperlm prepare`") from None
    if not isinstance(meta, dict) or meta.get("format") != META_FORMAT:
        raise DataError(f"{path}: not a taperlm data meta file; re-run `taperlm prepare`")
    version = meta.get("format_version", 1)
    if not isinstance(version, int) or version > META_VERSION:
        raise DataError(
            f"{path}: data format version {version!r} is newer than this taperlm reads "
            f"({META_VERSION}); upgrade taperlm or re-run `taperlm prepare`"
        )
    for key in ("vocab_size", "eos_id", "splits"):
        if key not in meta:
            raise DataError(f"{path}: missing key {key!r}; re-run `taperlm prepare`")
    return meta


def split_shards(meta: dict[str, Any], split: str) -> list[dict[str, Any]]:
    """The shards of a split as [{"file", "tokens", "crc32"}], for both meta.json layouts.

    Every file name is one prepare writes (`train-00000.bin`, `val.bin`, ...): meta.json is a
    stranger's data, and a name such as `../victim.txt` would be read, or (by a prepare that
    finishes an interrupted commit) moved over a file outside the data dir."""
    info = meta["splits"][split]
    if not isinstance(info, dict):
        raise DataError(f"meta.json: split {split!r} is not a mapping; re-run `taperlm prepare`")
    if "shards" in info:
        shards = info["shards"]
        if not isinstance(shards, list) or not all(isinstance(s, dict) for s in shards):
            raise DataError(f"meta.json: the shards of {split!r} are not a list of records")
        shards = list(shards)
    else:
        shards = [  # format_version 1: one file per split
            {
                "file": info.get("file", f"{split}.bin"),
                "tokens": info.get("tokens"),
                "crc32": info.get("crc32"),
            }
        ]
    for shard in shards:
        name = shard.get("file")
        if not isinstance(name, str) or not _SHARD_FILE.match(name):
            shown = repr(name)[:100]
            raise DataError(
                f"meta.json names the shard {shown}, which is not a shard name `taperlm "
                "prepare` writes (train-00000.bin, val-00000.bin, ...): the data dir was "
                "edited or crafted. Nothing was read or moved; re-run `taperlm prepare` into a new folder"
            )
    return shards


def referenced_files(meta: dict[str, Any]) -> list[str]:
    return [s["file"] for split in meta.get("splits", {}) for s in split_shards(meta, split)]


# --- replacing a data dir -------------------------------------------------------------------------


def commit(out: Path, work: Path) -> None:
    """Make the complete data dir in `work` (with its meta.json) the content of `out`."""
    if not (work / META_FILE).is_file():
        raise AssertionError(f"{work} has no {META_FILE}; nothing to commit")
    fsync_dir(work)
    os.replace(work, out / COMMIT_DIR)  # the commit point
    fsync_dir(out)
    roll_forward(out)


def roll_forward(out: Path) -> None:
    """Finish moving a committed data dir into place (idempotent; nothing to do without one)."""
    pending = out / COMMIT_DIR
    if not pending.is_dir():
        return
    meta_path = pending / META_FILE
    if meta_path.is_file():
        meta = parse_json(read_meta_text(meta_path), meta_path, META_FILE)
        for name in referenced_files(meta):
            if (pending / name).exists():
                os.replace(_inside(pending, name), _inside(out, name))
        if (pending / TOKENIZER_DIR).is_dir():
            old = pending / (TOKENIZER_DIR + ".old")
            shutil.rmtree(old, ignore_errors=True)
            if (out / TOKENIZER_DIR).exists():
                os.replace(out / TOKENIZER_DIR, old)
            os.replace(pending / TOKENIZER_DIR, out / TOKENIZER_DIR)
        fsync_dir(out)
        os.replace(meta_path, out / META_FILE)  # from here on the data dir itself is complete
        fsync_dir(out)
    remove_stale_shards(out)
    shutil.rmtree(pending, ignore_errors=True)


def remove_stale_shards(out: Path) -> None:
    """Delete shard files of earlier preparations that meta.json no longer names (only files
    named as prepare names them; anything else in the folder is left alone)."""
    try:
        keep = set(referenced_files(parse_json(read_meta_text(out / META_FILE))))
    except (OSError, UnsafeFileError, DataError):
        return
    for p in out.iterdir():
        if p.is_file() and _SHARD_NAME.match(p.name) and p.name not in keep:
            p.unlink(missing_ok=True)


@contextlib.contextmanager
def exclusive(out: Path) -> Iterator[None]:
    """Hold `out`'s prepare lock (released by the OS if the process dies)."""
    try:
        import fcntl  # lazy: POSIX only; elsewhere prepare runs without the lock
    except ImportError:  # not POSIX: no lock
        yield
        return
    lock = out / LOCK_FILE
    kind = not_a_file(lock)
    if kind is not None:
        raise DataError(
            f"{lock} is {kind}, not the lock file `taperlm prepare` keeps there: remove it and "
            "rerun"
        )
    try:
        path_inside(out, LOCK_FILE, "lock file")
    except UnsafeFileError as err:
        raise DataError(str(err)) from None
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o644)
    with os.fdopen(fd, "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise DataError(
                f"another `taperlm prepare` is writing {out}; wait for it to finish or choose "
                "another --out"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)

"""Which folders a command may write into: its own, a new one or an empty one -- never a
folder of the user's or of another command, so no command overwrites, deletes or chmods a file
it did not write.

Every folder a command fills carries its kind's marker file (`claim`), written before anything
else; folders written before the markers existed are recognised by their layout (`legacy`).
`check_folder` runs for every folder output before the command starts (`taperlm.spec.domains`) and
again where a library caller reaches the writer directly (the trainer).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from taperlm.errors import ConfigError, UnsafeFileError
from taperlm.files.io import (
    MAX_RECORD_BYTES,
    atomic_write_json,
    path_inside,
    read_json,
    refuse_links_leading_out,
    sha256_file,
)
from taperlm.files.runlock import LOCK_FILE


@dataclass(frozen=True)
class FolderKind:
    name: str
    what: str  # "a `taperlm train` run dir"
    marker: str
    legacy: Callable[[Path], bool]  # recognises folders written before the marker existed


def _json_field(path: Path, key: str) -> object:
    try:
        data = read_json(path, MAX_RECORD_BYTES, path.name)
    except (OSError, UnsafeFileError):
        return None
    return data.get(key) if isinstance(data, dict) else None


def _legacy_run(p: Path) -> bool:
    if (p / "sessions.jsonl").is_file():  # a compare cell stopped before its first step
        return True
    return (p / "config.yaml").is_file() and any(
        (p / n).exists() for n in ("checkpoints", "metrics.jsonl", "data.json")
    )


def _legacy_data(p: Path) -> bool:
    return _json_field(p / "meta.json", "format") == "taperlm-tokens"


def _legacy_compare(p: Path) -> bool:
    return (p / "runs").is_dir() or (p / "report.json").is_file()


def _legacy_export(p: Path) -> bool:
    return _json_field(p / "config.json", "model_type") == "taperlm"


def _legacy_tasks(p: Path) -> bool:
    return (p / "taperlm_utils.py").is_file() and any(p.glob("taperlm_*.yaml"))


KINDS: dict[str, FolderKind] = {
    k.name: k
    for k in (
        FolderKind("run", "a `taperlm train` run dir", ".taperlm-run", _legacy_run),
        FolderKind("data", "a `taperlm prepare` data dir", ".taperlm-prepare", _legacy_data),
        FolderKind("compare", "a `taperlm compare` folder", ".taperlm-compare", _legacy_compare),
        FolderKind("export", "a `taperlm export` folder", ".taperlm-export", _legacy_export),
        FolderKind(
            "lm-eval-tasks",
            "a `taperlm eval --write-lm-eval-tasks` folder",
            ".taperlm-lm-eval-tasks",
            _legacy_tasks,
        ),
    )
}

# (command, option) -> the kind of folder it writes. Every folder output of every command is
# here (tests/safety/test_outdirs.py checks the parsers against this table).
OUTPUT_FOLDERS: dict[tuple[str, str], str] = {
    ("train", "--out"): "run",
    ("import", "--out"): "run",
    ("prune", "--out"): "run",  # the pruned model is a run dir
    ("prepare", "--out"): "data",
    ("compare", "--out"): "compare",
    ("export", "--out"): "export",
    ("eval", "--write-lm-eval-tasks"): "lm-eval-tasks",
}


# What --force allows, said where a folder is refused (kinds whose command has --force).
FORCE_NOTES = {
    "data": "; or pass --force to add the data beside its files (only when none of the names "
    "prepare writes is taken there)",
}


def kind_of(folder: Path) -> str | None:
    """The kind of taperlm folder `folder` is (by its marker, else its layout), or None."""
    for kind in KINDS.values():
        if (folder / kind.marker).is_file():
            return kind.name
    return next((k.name for k in KINDS.values() if k.legacy(folder)), None)


def check_folder(path: Path, kind: str, option: str, force_clashes: tuple[str, ...] = ()) -> None:
    """ConfigError unless `path` is a folder that `kind`'s command may write into: missing,
    empty, or of its own kind. `force_clashes`: with --force, a non-empty folder of no taperlm
    kind is accepted when none of these names exists in it (the command adds its files beside
    the user's, never replacing one)."""
    p = Path(path)
    own = KINDS[kind]
    if p.is_symlink() and not p.exists():
        raise ConfigError(
            f"{option} {p} is a symbolic link to {os.readlink(p)}, which does not exist; create "
            "that folder or choose another path"
        )
    if not p.is_dir():
        return  # created new (a file there is reported by domains.check_output)
    try:
        names = sorted(x.name for x in p.iterdir())
    except OSError as err:
        raise ConfigError(f"{option} {p} cannot be listed: {err.strerror or err}") from None
    if set(names) <= {LOCK_FILE}:  # empty but for a writer's lock: the lock decides who writes
        _no_links_out(p, own)
        return
    found = kind_of(p)
    if found == kind:
        _no_links_out(p, own)
        return
    shown = ", ".join(names[:5]) + (f", ... ({len(names)} in all)" if len(names) > 5 else "")
    if found is not None:
        raise ConfigError(
            f"{option} {p} is {KINDS[found].what}, not {own.what}; choose a new or empty folder "
            f"(taperlm never writes over another command's output)"
        )
    if force_clashes:
        clash = [n for n in force_clashes if (p / n).exists() or (p / n).is_symlink()]
        if not clash:
            return
        raise ConfigError(
            f"{option} {p} already holds {', '.join(clash)}, which this command would replace; "
            "--force only adds files beside the ones there. Choose a new or empty folder"
        )
    raise ConfigError(
        f"{option} {p} is not empty ({shown}) and is not {own.what}; choose a new or empty "
        f"folder (taperlm writes only into folders it created, never over files it did not "
        f"write){FORCE_NOTES.get(kind, '')}"
    )


def _no_links_out(path: Path, kind: FolderKind) -> None:
    """ConfigError if a symlink inside our own folder leads outside it: every file the command
    writes, appends to, replaces or deletes there (`RUN/tensorboard`, `RUN/metrics.jsonl`, a
    checkpoint, a shard, an exported file) would reach through it. (Under --force into a user's
    folder only names that do not exist yet are written, so there is nothing to follow.)"""
    try:
        refuse_links_leading_out(path, kind.what.removeprefix("a ").capitalize())
    except UnsafeFileError as err:
        raise ConfigError(str(err)) from None


def claim(path: Path, kind: str) -> None:
    """Create `path` if needed and mark it as `kind`'s (before anything else is written)."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    marker = p / KINDS[kind].marker
    if not marker.is_file():
        marker.write_text(f"written by taperlm ({KINDS[kind].what})\n", encoding="utf-8")


# A folder whose files are replaced by a later run of its command (`export --force`) records in
# its marker the sha256 of every file it wrote; only those files, unchanged since, are replaced.
def written_files(path: Path, kind: str) -> dict[str, list[str]]:
    """{relative path: [sha256, ...]} that `kind`'s command recorded in `path`'s marker (a
    file whose content is one of these is its own); {} for a marker without a record.

    The record is a stranger's data: a name that leads outside `path` (`../victim.txt`, an
    absolute path, through a link) is an UnsafeFileError, so no file outside the folder is ever
    replaced or deleted as "our own"."""
    try:
        data = read_json(Path(path) / KINDS[kind].marker, MAX_RECORD_BYTES, "folder marker")
    except (OSError, UnsafeFileError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict):
        return {}
    record = {str(k): [str(h) for h in v] for k, v in files.items() if isinstance(v, list) and v}
    for rel in record:
        path_inside(path, rel, f"a file recorded in {KINDS[kind].marker}")
    return record


def record_written_files(path: Path, kind: str, files: dict[str, list[str]]) -> None:
    """Write `kind`'s marker in `path` with the record of the files written (atomically)."""
    atomic_write_json(
        Path(path) / KINDS[kind].marker,
        {"written_by": f"taperlm ({KINDS[kind].what})", "files": files},
        indent=1,
    )


def unchanged_own_file(path: Path, record: dict[str, list[str]], rel: str) -> bool:
    """Whether `path / rel` is a regular file (not a link) whose content is still one that
    was recorded for it (and stays inside `path`)."""
    p = Path(path) / rel
    if p.is_symlink() or not p.is_file() or rel not in record:
        return False
    path_inside(path, rel, "a file named in the folder's record")
    try:
        return sha256_file(p) in record[rel]
    except OSError:
        return False


def install_files(
    staging: Path, out: Path, kind: str, option: str, elsewhere: str, keep_others: bool = False
) -> None:
    """Move the files of `staging` (a folder inside `out` that only this command wrote) into
    `out`, `kind`'s folder, replacing only files an earlier run of the command wrote and nobody
    changed since (checked for all before any is moved: else ConfigError naming them, with
    `option` and the advice `elsewhere`, and nothing is written), and removing that run's files
    this one no longer writes (unless `keep_others`: a folder filled in parts, such as task
    files written a few tasks at a time, keeps them and their record). The marker's record is updated around the moves so that a crash
    between them leaves every file recognisable. Every command that rewrites files in a folder
    it wrote on a rerun installs them through here (REWRITES)."""
    staging, out = Path(staging), Path(out)
    new = {p.relative_to(staging).as_posix(): p for p in sorted(staging.rglob("*")) if p.is_file()}
    record = written_files(out, kind)
    hashes = {rel: sha256_file(p) for rel, p in new.items()}
    taken = [
        rel
        for rel in new
        if ((out / rel).exists() or (out / rel).is_symlink())
        and not unchanged_own_file(out, record, rel)
    ]
    if taken:
        shown = ", ".join(taken[:10]) + (f" and {len(taken) - 10} more" if len(taken) > 10 else "")
        raise ConfigError(
            f"{option} {out} already holds {shown}, which this command would replace but which "
            "taperlm did not write there (or which was changed since); nothing was written. "
            f"Move it out of the folder, or {elsewhere}"
        )
    others = {r: record[r] for r in record if r not in new and unchanged_own_file(out, record, r)}
    both = {rel: sorted({*record.get(rel, []), h}) for rel, h in hashes.items()}
    record_written_files(out, kind, {**others, **both})
    for rel, p in new.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(p, out / rel)
    if not keep_others:
        for rel in others:
            (out / rel).unlink(missing_ok=True)
    kept = others if keep_others else {}
    record_written_files(out, kind, {**kept, **{rel: [h] for rel, h in hashes.items()}})


# How a rerun of each folder's command treats the files already there: never a user's edits.
# "install": the files are outputs a user may edit or use as they are (an export, lm-eval task
# files): replaced only while unchanged since the command wrote them (`install_files`). The
# others hold the command's own state, continued, not rewritten, by a rerun; their reports and
# plots are regenerated from that state by design.
REWRITES: dict[str, str] = {
    "run": "state: a rerun resumes the run (checkpoints, metrics); plots regenerated",
    "data": "state: a rerun continues or re-prepares the data dir; shards are its own",
    "compare": "state: a rerun resumes the grid; report.md/report.json/plots regenerated",
    "export": "install",
    "lm-eval-tasks": "install",
}

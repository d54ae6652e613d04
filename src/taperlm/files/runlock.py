"""One writer per run directory: an exclusive lock that a crash cannot leave stuck (no torch).

The lock is `flock(LOCK_EX | LOCK_NB)` on `DIR/.lock`. The kernel drops it when the holder's
file is closed, which includes every way a process can end (exit, exception, SIGKILL, OOM kill),
so there is nothing stale to detect or clean up. While held, the file names the holder (pid,
host, start time, command line) so that a second writer's error can say who it is; it is
emptied again on release, so an idle run dir always holds an empty `.lock`.

Locks are re-entrant within one process (compare holds a cell's lock while the trainer it calls
takes it again). Readers (eval, export, generate, novelty) never lock: checkpoints are renamed
into place atomically, so reading a run that is still training is safe.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from taperlm.errors import ConfigError, RunInUseError, UnsafeFileError
from taperlm.files.io import not_a_file, os_error_cause, parse_json, read_text

LOCK_FILE = ".lock"
LOCK_BYTES = 64 << 10  # what a holder records (pid, host, command) is a few hundred bytes

try:  # POSIX; elsewhere runs are not locked (taperlm trains on Linux and macOS)
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

# resolved lock path -> [open file, hold count] of the locks this process holds
_HELD: dict[str, list[Any]] = {}


def holder_of(directory: str | Path) -> dict[str, Any] | None:
    """What the holder of `directory`'s lock recorded (None if nothing readable)."""
    try:
        path = Path(directory) / LOCK_FILE
        text = read_text(path, LOCK_BYTES, "lock file")
        info = parse_json(text, path, "lock file") if text.strip() else None
    except (OSError, UnsafeFileError):
        return None
    return info if isinstance(info, dict) else None


def describe_holder(info: dict[str, Any] | None) -> str:
    if not info:
        return "another process (it has not recorded itself yet)"
    cmd = str(info.get("command", ""))
    cmd = cmd if len(cmd) <= 200 else cmd[:197] + "..."
    return f"pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}" + (
        f" ({cmd})" if cmd else ""
    )


class RunLock:
    """The lock of one directory (which must exist); `acquire` raises RunInUseError naming the
    holder when another process holds it."""

    def __init__(self, directory: str | Path, what: str = "run dir") -> None:
        self.directory = Path(directory)
        self.what = what
        self.path = self.directory / LOCK_FILE
        self._key = os.path.realpath(self.path)  # no error on a symlink loop (reported below)
        self.held = False

    def acquire(self) -> RunLock:
        if self.held:
            return self
        entry = _HELD.get(self._key)
        if entry is not None:  # this process holds it already
            entry[1] += 1
            self.held = True
            return self
        kind = not_a_file(self.path)
        if kind:  # opening a FIFO could block; a folder is no full disk
            raise OSError(
                errno.EISDIR if kind == "a folder" else errno.EINVAL, kind, str(self.path)
            )
        f = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 (held until release)
        if fcntl is not None:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                raise RunInUseError(
                    f"{self.what} {self.directory} is in use by "
                    f"{describe_holder(holder_of(self.directory))}; one process writes a run at "
                    "a time: wait for it to finish or stop it (a process that died holds no "
                    "lock), or use another --out"
                ) from None
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        }
        f.seek(0)
        f.truncate()
        f.write(json.dumps(record) + "\n")
        f.flush()
        _HELD[self._key] = [f, 1]
        self.held = True
        return self

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        entry = _HELD.get(self._key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _HELD[self._key]
        f = entry[0]
        with contextlib.suppress(OSError):
            f.seek(0)
            f.truncate()  # an idle run dir holds an empty lock file
            f.flush()
        f.close()  # drops the flock

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def locked(directory: str | Path, what: str = "run dir") -> Iterator[RunLock]:
    """Hold `directory`'s lock for the block (the directory must exist); a lock file that
    cannot be opened is a ConfigError naming the cause (a folder or FIFO in its place, ...)."""
    lock = RunLock(directory, what)
    try:
        lock.acquire()
    except OSError as err:
        raise ConfigError(
            f"cannot lock the {what} {directory}: {err.strerror or err}. "
            f"{os_error_cause(err, lock.path)}"
        ) from None
    with lock:
        yield lock


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (a pid reused by another process
    counts as alive: callers then keep what they would have deleted, which is safe)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed process its parent has not reaped yet (a zombie) is gone too
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True

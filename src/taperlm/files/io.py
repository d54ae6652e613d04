"""Files that a reader never sees half-written, their hashes, JSON without NaN, and the bounded
readers of a stranger's files and of the JSON and YAML in them (no torch).

Every write goes to `<name>.tmp-<pid>` in the same folder and is renamed into place with
`os.replace` (atomic on POSIX), so a crash or a concurrent reader sees the old file or the new
one, never a torn one. `fsync=True` also flushes the data to disk before the rename (for files a
resumed run depends on).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import shutil
import stat
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from taperlm.errors import MalformedFileError, UnsafeFileError


def temp_path(path: str | Path) -> Path:
    """The temporary name a write of `path` uses: `<name>.tmp-<pid>` beside it."""
    p = Path(path)
    return p.with_name(f"{p.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def atomic_output(path: str | Path, fsync: bool = False) -> Iterator[Path]:
    """Yield a temporary path to write `path` through (e.g. for `savefig`, `torch.save`); it is
    renamed into place when the block ends without an error and removed when it raises. Missing
    folders above `path` are created: an output option may name a new folder (`--out res/x.json`),
    which the commands' argument checks accept (`taperlm.spec.domains.check_output`)."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(final)
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def replace_dir(new: str | Path, final: str | Path) -> Path:
    """Move the finished folder `new` to `final` (same file system), replacing a folder already
    there: the old one is renamed aside first and removed last, so `final` is always either the
    old folder or the new one, never a mix."""
    new, final = Path(new), Path(final)
    if final.exists():
        old = final.with_name(f".tmp-old-{final.name}-{os.getpid()}")
        os.replace(final, old)
        os.replace(new, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, final)
    return final


def atomic_write_text(path: str | Path, text: str, fsync: bool = False) -> Path:
    """Write UTF-8 `text` to `path` atomically; returns the path."""
    with atomic_output(path, fsync) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def atomic_write_json(path: str | Path, obj: Any, indent: int = 1, fsync: bool = False) -> Path:
    """Write `obj` as JSON (non-finite floats as null, see `finite_json`) plus a newline."""
    text = json.dumps(finite_json(obj), indent=indent, allow_nan=False)
    return atomic_write_text(path, text + "\n", fsync)


def fsync_dir(path: str | Path) -> None:
    """Make renames inside the folder `path` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def finite_json(obj: Any) -> Any:
    """`obj` with every NaN/inf float replaced by None (JSON has no NaN); tuples become lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def not_a_file(path: str | Path) -> str | None:
    """What `path` is when it exists but is not a regular file (following symlinks): `a folder`,
    `a FIFO (named pipe)`, `a socket`, `a device`, `a symlink loop`, `a broken symlink`; None for
    a regular file or nothing there. Messages name the kind instead of guessing (a FIFO is not
    a "folder", a folder where a lock file belongs is not a full disk)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a broken symlink" if os.path.islink(path) else None
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "a symlink loop"
        return None  # unreadable metadata: the caller's open reports it
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device"


def os_error_cause(err: OSError, path: str | Path) -> str:
    """What to do about an OSError met while writing `path`, by its errno (not a guess), as a
    sentence:
    a full disk, a permission, a read-only file system, a folder or other non-file where a file
    belongs, ..."""
    p = Path(path)
    code = err.errno
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"The file system of {p.parent} is full (or over quota): free space there"
    if code in (errno.EACCES, errno.EPERM):
        return f"Permission denied: fix the permissions of {p if p.is_dir() else p.parent}"
    if code == errno.EROFS:
        return f"The folder {p.parent} is on a read-only file system: write to another place"
    kind = not_a_file(p)
    if code in (errno.EISDIR, errno.ENXIO, errno.ELOOP, errno.EINVAL) and kind:
        return f"The path {p} is {kind} where taperlm writes a file: remove or rename it"
    if code == errno.ENOTDIR:
        return f"A part of {p.parent} is a file, not a folder: remove or rename it"
    if code == errno.ENAMETOOLONG:
        return "The path is too long for the file system: use a shorter one"
    if code == errno.EIO:
        return "The disk or network file system reported an I/O error: check it"
    return f"Fix the cause above at {p}"


FULL_HASH_BYTES = 16 << 20  # files up to this size are hashed whole
SAMPLE_BLOCK = 64 << 10
SAMPLE_BLOCKS = 64  # evenly spaced blocks (first and last included) of a larger file


def file_identity(path: str | Path, content: bool = True) -> list[Any]:
    """What tells a file apart from an edited copy, cheaply: [size, mtime_ns, ctime_ns, digest].

    The kernel sets ctime on every write and no tool can set it back (touch -r, cp -p and
    rsync -t restore mtime only), so on a local file system any edit changes it even when the
    size and mtime stay. The digest (sha256 of the whole file up to 16 MiB, else of 64 evenly
    spaced 64 KiB blocks and the size) also catches same-size edits where timestamps are coarse
    or not kept (some network and FAT file systems). A file copied or re-extracted
    unchanged gets a new ctime: it counts as changed (the safe side). `content=False` leaves
    the digest out (many files that change only as a whole, e.g. installed packages)."""
    st = os.stat(path)
    ident: list[Any] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    if not content:
        return ident
    h = hashlib.sha256()
    with open_regular(path, what="file") as f:
        if st.st_size <= FULL_HASH_BYTES:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        else:
            last = st.st_size - SAMPLE_BLOCK
            for i in range(SAMPLE_BLOCKS):
                f.seek(last * i // (SAMPLE_BLOCKS - 1))
                h.update(f.read(SAMPLE_BLOCK))
    return [*ident, h.hexdigest()]


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a regular file (a FIFO or device is refused, see `open_regular`), read in
    1 MiB blocks."""
    h = hashlib.sha256()
    with open_regular(path, what="file") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------
# Reading a file whose contents (and whose name, when another file names it) come from a
# stranger. Every reader of a user-supplied or file-named path goes through these, so that
# nothing we open can block (a FIFO, a device), reach outside the folder that names it, or be
# read past what its format can legitimately hold.


# The most a JSON or text record taperlm writes beside its data can hold (a data dir's meta.json
# with thousands of shards, a checkpoint manifest, a folder's record of written files are far
# smaller): a larger one is not ours, and is refused before it is read.
MAX_RECORD_BYTES = 64 << 20


def _size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def path_inside(root: str | Path, name: str | Path, what: str = "a file") -> Path:
    """`root/name` resolved (symlinks followed), refused unless it stays inside `root` resolved.

    For every path read from a file (a manifest's entries, a record of written files, a data
    dir's shard names): an absolute name, a `..` that climbs out, or a link inside the folder
    that leads out are refused the same way, naming the entry and the folder."""
    base = Path(root).resolve()
    text = str(name)
    if not text or "\x00" in text:
        raise UnsafeFileError(f"{what} {text!r} named in {root} is not a usable path")
    target = (base / text).resolve()
    if target != base and base not in target.parents:
        shown = text if len(text) <= 200 else text[:200] + "..."
        raise UnsafeFileError(
            f"{what} {shown!r} named in {root} leads outside that folder (to {target}); "
            "taperlm reads and writes only inside the folder that names a file. The folder was "
            "edited or crafted: restore it from a copy you trust"
        )
    return target


def open_regular(path: str | Path, max_bytes: int | None = None, what: str = "file") -> BinaryIO:
    """Open `path` for binary reading only if it is a regular file (links followed), and, with
    `max_bytes`, only if it is no larger than that.

    The file type is checked on the open descriptor (O_NONBLOCK, so a FIFO does not block the
    open itself), not by a stat before the open that a swap could race."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafeFileError(
                f"the {what} {p} is a symlink loop: replace it with a file"
            ) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = (
                "a folder"
                if stat.S_ISDIR(st.st_mode)
                else "a FIFO (named pipe)"
                if stat.S_ISFIFO(st.st_mode)
                else "a socket"
                if stat.S_ISSOCK(st.st_mode)
                else "a device"
            )
            raise UnsafeFileError(
                f"the {what} {p} is {kind}, not a regular file: taperlm reads only regular files "
                "(a pipe or device could block or never end); point it at a file"
            )
        if max_bytes is not None and st.st_size > max_bytes:
            raise UnsafeFileError(
                f"the {what} {p} is {_size_text(st.st_size)}, more than the {_size_text(max_bytes)}"
                f" a {what} can hold: it is not one taperlm wrote, or it is damaged"
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | Path, max_bytes: int, what: str = "file") -> bytes:
    """The whole of a regular file of at most `max_bytes` (checked before reading, and again
    while reading: a file that grows in between is cut off and refused, never read unbounded)."""
    with open_regular(path, max_bytes, what) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnsafeFileError(
            f"the {what} {path} grew past {_size_text(max_bytes)} while it was read: it is not "
            "one taperlm wrote, or something is writing it now"
        )
    return data


def read_text(path: str | Path, max_bytes: int, what: str = "file") -> str:
    """`read_bytes` decoded as UTF-8; undecodable bytes are a clear error naming the file."""
    data = read_bytes(path, max_bytes, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UnsafeFileError(
            f"the {what} {path} is not UTF-8 text (byte {err.start}): it is not one taperlm "
            "wrote, or it is damaged"
        ) from None


# ----------------------------------------------------------------------------------------------
# The one reader of structured files (JSON, JSON lines, YAML). Python's json and PyYAML parse by
# recursion, so a file nested 200,000 deep is a RecursionError from deep inside them; YAML's
# aliases let 400 bytes stand for a billion nodes that every later walk (checks, copies, dumps)
# expands. So the depth and the expanded size are measured before anything is built: JSON by a
# scan of its brackets outside strings, YAML by its parser's events (an iterative state
# machine). No file taperlm writes or reads legitimately nests deeper than about 8.

MAX_DEPTH = 64
MAX_YAML_NODES = 100_000  # after expanding aliases; a full run config has about 150
MAX_CONFIG_BYTES = 4 << 20  # a config YAML; one with per-layer lists for 1,000 layers is 60 KiB
MAX_QUOTED = 200  # characters of a value from a file or flag that a message quotes

# a JSON string (escapes skipped; unrolled so that a long string is one C-level match)
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"\[\]|\{\}")  # once strings and values are cut out


def quoted(value: Any, limit: int = MAX_QUOTED) -> str:
    """`repr(value)` cut to `limit` characters (with how much was left out), for a message that
    quotes a value from a file or a flag: no message prints an unbounded value."""
    text = value if isinstance(value, str) else None
    if text is not None and len(text) > limit:
        return repr(text[:limit]) + f"... ({len(text):,} characters)"
    shown = repr(value)
    return shown if len(shown) <= limit else shown[:limit] + f"... ({len(shown):,} characters)"


MAX_MESSAGE = 2000  # characters of one error line; the CLI cuts the middle of a longer one


def bounded_message(text: str, limit: int = MAX_MESSAGE) -> str:
    """`text` if it fits in `limit` characters, else its start and its end (what went wrong,
    and what to do) with the middle cut out and counted: a message that quotes a value of a
    stranger's file, which no reader bounded, still prints as one readable line."""
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 3
    return f"{text[:head]} [... {len(text) - head - tail:,} characters ...] {text[-tail:]}"


def _where(name: str | Path | None, what: str) -> str:
    if name is None:
        return what
    return str(name) if Path(name).name == what else f"{what} {name}"


def json_depth(text: str, limit: int = MAX_DEPTH) -> int:
    """An upper bound of how deep `text`'s JSON arrays/objects nest, exact once it passes
    `limit` (it returns `limit + 1` then): brackets inside strings do not count. Exact for every
    prefix json.loads accepts, so a text within `limit` cannot make the parser recurse deeper.

    Done in C-speed passes: strings and everything but brackets are cut out, then each pass
    removes the innermost bracket pairs (one level), at most `limit + 1` passes. Brackets left
    unpaired (text that is not JSON) count as levels: the safe side."""
    brackets = text.count("[") + text.count("{")
    if brackets <= limit:
        return brackets
    rest = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    if re.search(r"[\[{]{" + str(limit + 1) + "}", rest):  # a run of openers: too deep at once
        return limit + 1
    depth = 0
    while rest and depth <= limit:
        rest, pairs = _INNERMOST.subn("", rest)
        if not pairs:
            break
        depth += 1
    return min(depth + rest.count("[") + rest.count("{"), limit + 1)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise json.JSONDecodeError(f"key {quoted(key)} is given twice; keep one", "", 0)
        out[key] = value
    return out


def _json_too_deep(where: str) -> MalformedFileError:
    return MalformedFileError(
        f"{where} nests deeper than {MAX_DEPTH} levels: no file taperlm reads is nested like "
        "that, so it was not written by taperlm, or it is damaged"
    )


def parse_json(
    text: str, name: str | Path | None = None, what: str = "JSON", strict: bool = False
) -> Any:
    """`json.loads(text)` with its nesting bounded before parsing (MAX_DEPTH); `strict` also
    refuses an object that gives one key twice (plain json keeps the last one silently).

    Every failure is a MalformedFileError (a ValueError too) naming `what` and `name`: not JSON,
    nested too deeply, a key given twice."""
    where = _where(name, what)
    if json_depth(text) > MAX_DEPTH:
        raise _json_too_deep(where)
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs if strict else None)
    except json.JSONDecodeError as err:
        raise MalformedFileError(
            f"{where}: not valid JSON ({err.msg}, line {err.lineno} column {err.colno})"
            if err.doc
            else f"{where}: {err.msg}"
        ) from None
    except RecursionError:  # unreachable after the scan; the same error all the same
        raise _json_too_deep(where) from None
    except ValueError as err:  # an integer of more digits than Python converts (4,300)
        raise MalformedFileError(f"{where} is not JSON taperlm reads: {quoted(str(err))}") from None


def strict_json_loads(text: str, name: str | Path | None = None, what: str = "JSON") -> Any:
    """`parse_json` that also refuses a key given twice in one object."""
    return parse_json(text, name, what, strict=True)


def read_json(
    path: str | Path,
    max_bytes: int = MAX_RECORD_BYTES,
    what: str = "JSON file",
    strict: bool = False,
) -> Any:
    """The JSON in the regular file `path` of at most `max_bytes`: the size checked before
    reading (`read_text`), the nesting before parsing (`parse_json`). UnsafeFileError for a file
    that is not a regular one or too large, MalformedFileError (a ValueError) for its contents."""
    return parse_json(read_text(path, max_bytes, what), path, what, strict)


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping that gives one key twice (YAML forbids it; PyYAML keeps the last silently), or
    two `<<:` merges that bring one key with different values."""


class YAMLSyntaxError(MalformedFileError):
    """Text that is not YAML at all (a `--set` value that is not YAML is taken as a string)."""


_MERGE_TAG = "tag:yaml.org,2002:merge"


class StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` (builds no objects) that rejects a key given twice in one mapping, at
    every depth: with the plain loader a second `train:` replaces the whole first section
    without a word. A key written explicitly may override one brought in by a `<<:` merge (the
    purpose of merges); two merges that bring one key with different values are refused (which
    one wins is a rule of YAML few know), naming the key and both lines."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            self._check_merges(node)
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:
                    continue  # an unhashable key: the base class reports it
                if first is not key_node:
                    raise DuplicateKeyError(
                        None,
                        None,
                        f"key {quoted(key)} is given twice (first at line "
                        f"{first.start_mark.line + 1}); the later one would silently replace "
                        "the earlier -- keep one",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep=deep)

    def _merged_pairs(self, node: yaml.MappingNode) -> dict[Any, yaml.Node]:
        """{key: value node} that the mapping `node` holds once its own merges are applied."""
        self._check_merges(node)
        out: dict[Any, yaml.Node] = {}
        own = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                for source in self._sources(value_node):
                    out.update(self._merged_pairs(source))
            else:
                own.append((key_node, value_node))
        for key_node, value_node in own:
            try:
                out[self.construct_object(key_node, deep=True)] = value_node
            except TypeError:
                continue
        return out

    @staticmethod
    def _sources(value_node: yaml.Node) -> list[yaml.MappingNode]:
        if isinstance(value_node, yaml.MappingNode):
            return [value_node]
        if isinstance(value_node, yaml.SequenceNode):
            return [n for n in value_node.value if isinstance(n, yaml.MappingNode)]
        return []  # the base class reports a merge of a scalar

    def _check_merges(self, node: yaml.MappingNode) -> None:
        merges = [v for k, v in node.value if k.tag == _MERGE_TAG]
        sources = [s for v in merges for s in self._sources(v)]
        if len(sources) < 2:
            return
        own = set()
        for key_node, _ in node.value:
            if key_node.tag != _MERGE_TAG:
                try:
                    own.add(self.construct_object(key_node, deep=True))
                except TypeError:
                    continue
        brought: dict[Any, yaml.Node] = {}
        for source in sources:
            for key, value_node in self._merged_pairs(source).items():
                if key in own:
                    continue  # written explicitly: it overrides every merge, on purpose
                first = brought.setdefault(key, value_node)
                if first is value_node:
                    continue
                if self.construct_object(first, deep=True) != self.construct_object(
                    value_node, deep=True
                ):
                    raise DuplicateKeyError(
                        None,
                        None,
                        f"key {quoted(key)} is brought in by two `<<:` merges with different "
                        f"values (lines {first.start_mark.line + 1} and "
                        f"{value_node.start_mark.line + 1}); which one wins is easy to get "
                        "wrong -- write the key explicitly in this mapping, or merge only one",
                        value_node.start_mark,
                    )


_YAML_EVENTS_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TOO_DEEP = f"it nests deeper than {MAX_DEPTH} levels"


def yaml_shape_problem(text: str) -> str | None:
    """Why `text` may not be built as YAML, from its parser's events alone (nothing is built):
    collections nested deeper than MAX_DEPTH, or more than MAX_YAML_NODES nodes once every alias
    is expanded (an "alias bomb": each level of anchors multiplies the nodes). None when fine;
    a syntax error is left to the loader, which reports it with its line.

    The answer does not depend on the parser: one with a nesting limit of its own (libyaml
    0.2.5, bundled with PyYAML 6.0.4, stops at 1,000 levels) looks up to 1,024 characters ahead
    for a key in flow style, so `[[[[...` is refused by it before it sends a single event. When
    the parser gives up, the brackets are counted as JSON's are (`json_depth`, an upper bound),
    and a text that deep is refused as too deep rather than handed to the recursive loader."""
    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (expanded nodes, depth below)
    stack: list[list[Any]] = []  # per open collection: [anchor, nodes, depth below]
    total = 0
    try:
        for event in yaml.parse(text, Loader=_YAML_EVENTS_LOADER):
            if isinstance(event, yaml.CollectionStartEvent):
                stack.append([event.anchor, 1, 0])
                total += 1
                if len(stack) > MAX_DEPTH:
                    return _TOO_DEEP
                continue
            if isinstance(event, yaml.CollectionEndEvent):
                anchor, size, below = stack.pop()
                depth = below + 1  # its nodes are already in `total`
                if anchor is not None:
                    anchors[anchor] = (size, depth)
            elif isinstance(event, yaml.ScalarEvent):
                size, depth = 1, 0
                total += 1
                if event.anchor is not None:
                    anchors[event.anchor] = (1, 0)
            elif isinstance(event, yaml.AliasEvent):
                size, depth = anchors.get(event.anchor, (1, 0))
                total += size
            else:
                continue
            if stack:
                stack[-1][1] += size
                stack[-1][2] = max(stack[-1][2], depth)
                if len(stack) + depth > MAX_DEPTH:
                    return f"an alias (*name) makes it nest deeper than {MAX_DEPTH} levels"
            if total > MAX_YAML_NODES:
                return (
                    f"it expands to more than {MAX_YAML_NODES:,} values once its aliases (*name) "
                    "are expanded (an alias bomb?): a config needs a few hundred; write the "
                    "values out, or use fewer levels of anchors"
                )
    except yaml.YAMLError:
        return _TOO_DEEP if json_depth(text) > MAX_DEPTH else None
    return None


def parse_yaml(text: str, name: str | Path | None = None, what: str = "YAML") -> Any:
    """The YAML in `text`, built by `StrictLoader` only after `yaml_shape_problem` found its depth
    and expanded size within bounds. Every failure is a MalformedFileError naming `what`,
    `name` and the line: not YAML, too deep, an alias bomb, a key given twice."""
    where = _where(name, what)
    problem = yaml_shape_problem(text)
    if problem:
        raise MalformedFileError(f"{where} is refused: {problem}")
    try:
        return yaml.load(text, Loader=StrictLoader)  # a SafeLoader subclass: builds no objects
    except DuplicateKeyError as err:
        mark = err.problem_mark
        raise MalformedFileError(f"{where}, line {mark.line + 1}: {err.problem}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise YAMLSyntaxError(
            f"{where} is not valid YAML{at}: {getattr(err, 'problem', None) or err}"
        ) from None
    except RecursionError:  # unreachable after the shape check; the same error all the same
        raise MalformedFileError(f"{where} is refused: {_TOO_DEEP}") from None


def read_yaml(path: str | Path, max_bytes: int = MAX_CONFIG_BYTES, what: str = "YAML file") -> Any:
    """The YAML in the regular file `path` of at most `max_bytes` (`read_text`, `parse_yaml`)."""
    return parse_yaml(read_text(path, max_bytes, what), path, what)


def links_leading_out(root: str | Path, limit: int = 100_000) -> list[tuple[Path, Path]]:
    """(link, where it leads) for every symlink below the folder `root` (links are not followed
    into) whose target, resolved, is outside `root` resolved (a dangling one too: a write
    through it creates its target; a loop leads nowhere and is left to the writer's error).

    For every folder a command writes in: a file written, appended to or deleted through such a
    link (`RUN/tensorboard -> ~/thesis`) would change a file outside the folder. At most `limit`
    entries are looked at (a folder taperlm wrote holds far fewer); past that, the walk stops
    with an UnsafeFileError rather than taking unbounded time."""
    base = Path(root).resolve()
    found: list[tuple[Path, Path]] = []
    seen = 0
    for folder, dirs, files in os.walk(base, followlinks=False):
        for name in [*dirs, *files]:
            seen += 1
            if seen > limit:
                raise UnsafeFileError(
                    f"{root} holds more than {limit} entries: it is not a folder taperlm wrote "
                    "(or not one it can check); choose another folder"
                )
            entry = Path(folder) / name
            if not entry.is_symlink():
                continue
            try:  # a dangling link is followed by a write too (it creates its target)
                target = entry.resolve(strict=False)
            except (OSError, RuntimeError):  # a loop: no write gets through it (ELOOP)
                continue
            if target != base and base not in target.parents:
                found.append((entry, target))
    return found


def refuse_links_leading_out(root: str | Path, what: str) -> None:
    """UnsafeFileError naming the first symlink below `root` that leads outside it (see
    `links_leading_out`); `what` names the folder (`the run dir`)."""
    bad = links_leading_out(root)
    if bad:
        link, target = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise UnsafeFileError(
            f"{what} {root} holds a symbolic link {link.relative_to(Path(root).resolve())} that "
            f"leads outside it (to {target}){more}: taperlm would write or delete through it. "
            "Remove the link (or replace it with a real folder or file) and rerun"
        )


def is_link(path: str | Path) -> bool:
    """Whether `path` itself is a symbolic link (whatever it points at)."""
    return os.path.islink(path)


_ZIP_LOCAL_HEADER = struct.Struct("<4sHHH")  # signature, version, flags, method


def check_stored_zip(f: BinaryIO, size: int, what: str) -> None:
    """Refuse a zip archive (a `torch.save` file or one item of a checkpoint shard) unless every
    member is stored uncompressed and fits inside its `size` bytes.

    torch writes its archives uncompressed; its reader also inflates DEFLATE members, so a
    crafted 1 MB file could expand to gigabytes while it is loaded. Both the central directory
    and each member's local header (which torch's reader may use instead) are checked. `f` is
    seekable and positioned at the archive's start; it is left there."""
    start = f.tell()
    try:
        with zipfile.ZipFile(f) as z:
            members = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        raise UnsafeFileError(
            f"{what} is not an archive torch wrote ({err}): it is damaged or crafted"
        ) from None
    try:
        total = 0
        for m in members:
            f.seek(start + m.header_offset)
            head = f.read(_ZIP_LOCAL_HEADER.size)
            local = _ZIP_LOCAL_HEADER.unpack(head) if len(head) == _ZIP_LOCAL_HEADER.size else None
            stored = local is not None and local[0] == b"PK\x03\x04" and local[3] == 0
            if m.compress_type != zipfile.ZIP_STORED or not stored:
                raise UnsafeFileError(
                    f"{what} holds a compressed member ({m.filename[:100]!r}); torch writes its "
                    "files uncompressed, so this one was crafted (it could expand past any "
                    "bound while it is read). It was not loaded: use a file from a source you "
                    "trust"
                )
            total += m.file_size
        if total > size:
            raise UnsafeFileError(
                f"{what} declares {_size_text(total)} of members in {_size_text(size)}: it is "
                "damaged or crafted. It was not loaded"
            )
    finally:
        f.seek(start)


def bounded_line(stream: BinaryIO, max_bytes: int, where: str, hint: str) -> bytes:
    """The next line of a binary stream (b"" at its end), read no further than `max_bytes`: a
    longer line (one 2 GB line of a 60 KB compressed file) is an UnsafeFileError naming
    `where` and what to do (`hint`), raised before more than `max_bytes` are held."""
    line = stream.readline(max_bytes + 1)
    if len(line) > max_bytes and not line.endswith(b"\n"):
        raise UnsafeFileError(
            f"{where}: a line is longer than {_size_text(max_bytes)}, more than any document "
            f"this reads can need; {hint}"
        )
    return line


def check_regular(path: str | Path, max_bytes: int | None = None, what: str = "file") -> Path:
    """`path`, after `open_regular` found it a regular file (of at most `max_bytes`): for a
    library that opens the file by name itself (safetensors, numpy.memmap, pyarrow), so that a
    FIFO or device there is refused instead of blocking it. (A file swapped between this check
    and the library's open is out of its reach; every reader we own opens through
    `open_regular` itself.)"""
    with open_regular(path, max_bytes, what):
        return Path(path)


_TORCH_ADVICE = ("weights only load failed", "weights_only", "check the documentation of torch")


def error_text(err: BaseException, limit: int = 300) -> str:
    """`Type: first line` of an exception from a library, for a one-line message: at most
    `limit` characters (a crafted file can put anything in an error), and never torch's advice
    to retry with `weights_only=False` (which would run the code a hostile file carries)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    kept = [ln for ln in lines if not any(a in ln.lower() for a in _TORCH_ADVICE)]
    text = kept[0] if kept else ("refused by torch's safe loader" if lines else "")
    if len(text) > limit:
        text = text[:limit] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def open_append(path: str | Path, what: str = "file") -> Any:
    """Open `path` for appending UTF-8 text (created if missing) only if it is a regular file
    and not a symbolic link: appending to a FIFO would block until someone reads it, and a link
    would put our lines into a file outside the folder (every folder we append in is ours; its
    files are never links)."""
    p = Path(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENXIO):  # a link, or a FIFO nobody reads
            kind = "a symbolic link" if os.path.islink(p) else (not_a_file(p) or "not a file")
            raise UnsafeFileError(
                f"the {what} {p} is {kind}, not a regular file: taperlm appends only to its own "
                "files; remove it and rerun"
            ) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(
                f"the {what} {p} is {not_a_file(p) or 'not a regular file'}, not a regular "
                "file: taperlm appends only to its own files; remove it and rerun"
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "a", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise

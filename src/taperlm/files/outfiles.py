"""Which files a command may replace: a new path, or a file taperlm wrote -- never a file of the
user's, `--force` included (the file counterpart of `taperlm.files.outdirs`).

Every named output file carries a mark inside its own format, added by its writer:

- JSON (`novelty --out`, `eval --out`, `plan --block-configs`): a top-level key `"written_by": "taperlm ..."`;
- YAML (`allocate --out`): a first-line comment `# written by taperlm ...`;
- PNG (every `--plot`): a tEXt chunk with the keyword `taperlm` (matplotlib's savefig metadata);
- GGUF (`export --format gguf`): the metadata key `taperlm.written_by`;
- plain text (`generate --out`) has no place for a mark, so it is written only to a new path.

`check_output_file` runs for every output file before the command starts
(`taperlm.spec.domains.check_arguments`); a symbolic link at the path is never written through nor
replaced.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from taperlm.errors import ConfigError, UnsafeFileError
from taperlm.files.io import MAX_RECORD_BYTES, open_regular, read_json

WRITTEN_BY = "written by taperlm"
JSON_KEY = "written_by"
PNG_KEY = "taperlm"
GGUF_KEY = "taperlm.written_by"
YAML_MARK = f"# {WRITTEN_BY}"

# (command, option) -> the format of the file it writes. Every file output of every command is
# here (tests/safety/test_outfiles.py checks the parsers against this table).
OUTPUT_FILES: dict[tuple[str, str], str] = {
    ("novelty", "--out"): "json",
    ("novelty", "--plot"): "png",
    ("plan", "--plot"): "png",
    ("plan", "--block-configs"): "json",
    ("allocate", "--out"): "yaml",
    ("allocate", "--plot"): "png",
    ("eval", "--out"): "json",
    ("generate", "--out"): "text",
    ("export", "--out"): "gguf",
}

# Options whose earlier output is replaced only under --force (others replace their own freely).
FORCE_TO_REPLACE = {("export", "--out")}


def json_mark(obj: dict, command: str) -> dict:
    """`obj` with the mark as its first key."""
    return {JSON_KEY: f"{WRITTEN_BY} {command}", **obj}


def yaml_mark(text: str, command: str) -> str:
    return f"{YAML_MARK} {command}\n{text}"


def png_metadata() -> dict[str, str]:
    """`savefig(metadata=...)` for a PNG taperlm writes."""
    return {PNG_KEY: WRITTEN_BY}


def _head(path: Path, n: int) -> bytes:
    with open_regular(path, what="output file") as f:
        return f.read(n)


def _json_ours(path: Path) -> bool:
    if _head(path, 1) != b"{":  # cheap refusal of anything not a JSON object
        return False
    try:
        data = read_json(path, MAX_RECORD_BYTES, path.name)
    except (OSError, UnsafeFileError):
        return False
    return isinstance(data, dict) and str(data.get(JSON_KEY, "")).startswith(WRITTEN_BY)


def _yaml_ours(path: Path) -> bool:
    return _head(path, len(YAML_MARK)) == YAML_MARK.encode()


def _png_ours(path: Path) -> bool:
    """A tEXt chunk `taperlm` before the image data (matplotlib writes metadata first)."""
    with open_regular(path, what="output file") as f:
        if f.read(8) != b"\x89PNG\r\n\x1a\n":
            return False
        while True:
            head = f.read(8)
            if len(head) < 8:
                return False
            size, kind = struct.unpack(">I4s", head)
            if kind in (b"IDAT", b"IEND") or size > 1 << 20:
                return False
            body = f.read(size)
            f.seek(4, os.SEEK_CUR)  # CRC
            if kind == b"tEXt" and body.split(b"\0", 1)[0] == PNG_KEY.encode():
                return True


# GGUF value types -> fixed sizes (8: string, 9: array handled apart)
_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _gguf_ours(path: Path) -> bool:
    """A scan of the GGUF header's key/value pairs for `GGUF_KEY` (no tensor data read)."""
    with open_regular(path, what="output file") as f:
        if f.read(4) != b"GGUF":
            return False

        def u(fmt: str) -> int:
            raw = f.read(struct.calcsize(fmt))
            if len(raw) < struct.calcsize(fmt):
                raise ValueError("truncated")
            return struct.unpack("<" + fmt, raw)[0]

        def string() -> bytes:
            n = u("Q")
            if n > 1 << 20:
                raise ValueError("not a key")
            return f.read(n)

        def skip(vtype: int) -> None:
            if vtype == 8:
                f.seek(u("Q"), os.SEEK_CUR)
            elif vtype == 9:
                item, count = u("I"), u("Q")
                if item in _GGUF_SIZES:
                    f.seek(_GGUF_SIZES[item] * count, os.SEEK_CUR)
                else:
                    for _ in range(count):
                        skip(item)
            elif vtype in _GGUF_SIZES:
                f.seek(_GGUF_SIZES[vtype], os.SEEK_CUR)
            else:
                raise ValueError("unknown type")

        try:
            if u("I") < 2:
                return False
            u("Q")  # tensor count
            for _ in range(min(u("Q"), 4096)):
                key, vtype = string(), u("I")
                if key == GGUF_KEY.encode():
                    return vtype == 8 and string().startswith(WRITTEN_BY.encode())
                skip(vtype)
        except (ValueError, OSError, struct.error):
            return False
    return False


_READERS = {"json": _json_ours, "yaml": _yaml_ours, "png": _png_ours, "gguf": _gguf_ours}
_WHAT = {
    "json": "JSON file",
    "yaml": "YAML file",
    "png": "PNG image",
    "gguf": "GGUF file",
    "text": "text file",
}


def written_by_taperlm(path: str | Path, fmt: str) -> bool:
    """Whether the regular file `path` carries taperlm's mark for `fmt`."""
    reader = _READERS.get(fmt)
    try:
        return reader is not None and reader(Path(path))
    except (OSError, UnsafeFileError):
        return False


def check_output_file(path: str | Path, fmt: str, option: str, force: bool | None = None) -> None:
    """ConfigError unless writing `path` replaces nothing but a file taperlm wrote: the path is
    new, or a regular file with taperlm's `fmt` mark. `force`: None where the option has no
    --force (its own earlier output is replaced); False/True where replacing needs --force."""
    p = Path(path)
    if p.is_symlink():
        raise ConfigError(
            f"{option} {p} is a symbolic link (to {os.readlink(p)}); taperlm never writes "
            "through a link nor replaces one. Choose another path, or remove the link yourself"
        )
    if not p.exists():
        return
    if not p.is_file():
        raise ConfigError(f"{option} {p} exists and is not a regular file; choose another path")
    if not written_by_taperlm(p, fmt):
        forced = ", --force included" if force is not None else ""
        why = (
            "plain text has no place for a mark, so this option writes only new files"
            if fmt == "text"
            else f"it is not a {_WHAT[fmt]} written by taperlm (no taperlm mark in it)"
        )
        raise ConfigError(
            f"{option} {p} already exists and {why}; taperlm never replaces a file it did not "
            f"write{forced}. Choose another path, or remove the file yourself if it may go"
        )
    if force is False:
        raise ConfigError(
            f"{option} {p} holds an earlier taperlm output; add --force to replace it, or "
            "choose another path"
        )


# The end of each output file option's --help (what it may replace).
R_FILE = " (a new path, or a file taperlm wrote there; never a file of yours)"

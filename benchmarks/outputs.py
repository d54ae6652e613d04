"""Where the benchmark scripts write, and what they may replace.

They follow the project's rule for every command: never write over a file they did not write.
A file is the benchmarks' own when it carries STAMP (a JSON key, a PNG text chunk, a markdown
comment) or lies in the repository's own output folders (benchmarks/results, docs/img), whose
files these scripts wrote and git keeps. Output options take `type=output_file`, so a refused
path ends the script when its arguments are parsed, before any work. No torch import here: the
memory benchmark (prepare_scale.py) uses it too.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"

STAMP = "written by taperlm's benchmark scripts"
OWN_FOLDERS = (RESULTS_DIR, RESULTS_DIR.parents[1] / "docs" / "img")
_STAMP_SCAN = 1 << 16  # the stamp sits in the first bytes: first key, early PNG chunk, line 1


def is_ours(path: str | Path) -> bool:
    """Whether a benchmark may replace the file at `path` (see STAMP)."""
    p = Path(path)
    real = p.resolve()
    if any(real.is_relative_to(f) for f in OWN_FOLDERS):
        return True
    try:
        with open(real, "rb") as f:
            return STAMP.encode() in f.read(_STAMP_SCAN)
    except OSError:
        return False


def output_problem(path: str | Path) -> str | None:
    """Why a benchmark may not write the file `path` (None: it may)."""
    p = Path(path)
    if p.is_dir():
        return f"{p} is a folder; give a file path such as {p / 'results.json'}"
    if p.is_symlink() and not p.exists():
        return f"{p} is a symbolic link to {os.readlink(p)}, which does not exist"
    if p.exists() and not is_ours(p):
        return (
            f"{p} exists and was not written by a benchmark script (it does not carry their "
            "stamp and is not in benchmarks/results or docs/img); choose a new path: benchmarks "
            "never replace a file they did not write"
        )
    return None


def output_file(text: str) -> Path:
    """argparse `type` of an option naming a file the benchmark writes: checked when the
    arguments are parsed, before any work (see `output_problem`)."""
    p = Path(text).expanduser()
    problem = output_problem(p)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return p


def _write(path: str | Path, fill: Any, suffix: str = "") -> Path:
    """Refuse `path` unless ours (`output_problem`), else have `fill(tmp)` write a temporary file
    beside it and move that into place (a reader never sees half a file)."""
    p = Path(path)
    problem = output_problem(p)
    if problem:
        raise SystemExit(f"error: {problem}")
    p = p.resolve() if p.is_symlink() else p  # write through a link to our file; keep the link
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}{suffix}")
    fill(tmp)
    os.replace(tmp, p)
    return p


def write_output(path: str | Path, text: str) -> Path:
    """Write `text` to `path` atomically, refusing a file that is not ours."""
    return _write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def save_figure(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    """Save a matplotlib figure as PNG with STAMP in its metadata (so a rerun may replace it),
    refusing a file that is not ours."""
    return _write(path, lambda tmp: fig.savefig(tmp, dpi=dpi, metadata={"Comment": STAMP}), ".png")


# A folder a benchmark fills (compare_precision.py --out) is claimed by this file before anything
# else is written, so an interrupted run's folder is still recognised as ours.
FOLDER_MARKER = ".written-by-benchmarks"


def folder_problem(path: str | Path, legacy: Any = None) -> str | None:
    """Why a benchmark may not fill the folder `path` (None: it may): it must be new, empty, or
    claimed by a benchmark (FOLDER_MARKER), or match `legacy(path)` (a folder written before the
    marker existed)."""
    p = Path(path)
    if p.is_symlink() and not p.exists():
        return f"{p} is a symbolic link to {os.readlink(p)}, which does not exist"
    if not p.exists():
        return None
    if not p.is_dir():
        return f"{p} is a file, not a folder"
    if not any(p.iterdir()) or is_ours(p / FOLDER_MARKER) or (legacy and legacy(p)):
        return None
    return (
        f"{p} is not empty and was not filled by a benchmark script; choose a new or empty "
        "folder: benchmarks never write over files they did not write"
    )


def claim_folder(path: str | Path) -> Path:
    """Create `path` if needed and mark it as a benchmark's (call after `folder_problem`)."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    marker = p / FOLDER_MARKER
    if not marker.exists():
        marker.write_text(STAMP + "\n", encoding="utf-8")
    return p

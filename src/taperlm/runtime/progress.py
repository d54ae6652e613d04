"""Progress bars that suit where they are shown (no torch).

On a terminal: tqdm, redrawn in place. In a log (stderr is not a terminal: a file, a pipe, CI):
one plain line per update, at most every `LOG_INTERVAL_S` seconds plus the last one, with no
carriage returns or terminal escape codes (tqdm moves the cursor with them to redraw nested
bars), and transient bars (`leave=False` or a `position` below the main bar) are not shown at all.
"""

from __future__ import annotations

import io
import re
import sys
from typing import Any, TextIO

from tqdm.auto import tqdm
from tqdm.std import tqdm as plain

LOG_INTERVAL_S = 30.0
_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def is_terminal(stream: TextIO | None = None) -> bool:
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


class LogLines(io.TextIOBase):
    """tqdm's output as lines: every redraw becomes one line, escapes and blank lines dropped."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        for line in _ESCAPE.sub("", text).replace("\r", "\n").split("\n"):
            if line.strip():
                self.stream.write(line.rstrip() + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(**kw: Any):
    """A tqdm bar (same arguments) for stderr, shown as the module docstring says."""
    file = kw.pop("file", None) or sys.stderr
    if kw.get("disable") or is_terminal(file):
        return tqdm(file=file, **kw)

    if kw.get("leave") is False or kw.get("position"):
        return plain(file=file, **{**kw, "disable": True})
    kw.pop("dynamic_ncols", None)
    kw.pop("position", None)
    return plain(file=LogLines(file), mininterval=LOG_INTERVAL_S, **kw)

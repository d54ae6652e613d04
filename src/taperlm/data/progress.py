"""A status line for long data work: bytes read (with percent and ETA when the size is known),
documents, tokens and their rates, all counts as exact integers.

On a terminal the line is redrawn in place (at most a few times a second); otherwise (a log file,
a CI job) one line is printed every `interval` seconds, plus a last one when the work ends.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1000
    raise AssertionError


def _duration(seconds: float) -> str:
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}"


def format_status(
    label: str,
    *,
    bytes_done: int,
    docs: int,
    tokens: int,
    elapsed: float,
    total_bytes: int | None = None,
    total_tokens: int | None = None,
    rate_base: tuple[int, int] = (0, 0),
) -> str:
    """One status line. Rates and the ETA use the work done since the start of this process
    (`rate_base` = bytes and tokens already done before it, e.g. by a run that was resumed)."""
    parts = [label]
    if total_bytes:
        pct = 100.0 * min(bytes_done, total_bytes) / total_bytes
        parts.append(f"{_size(bytes_done)} / {_size(total_bytes)} ({pct:.1f}%)")
    elif bytes_done:
        parts.append(_size(bytes_done))
    parts.append(f"{docs:,} docs")
    parts.append(f"{tokens:,} tokens" + (f" / {total_tokens:,}" if total_tokens else ""))
    elapsed = max(elapsed, 1e-9)
    byte_rate = (bytes_done - rate_base[0]) / elapsed
    token_rate = (tokens - rate_base[1]) / elapsed
    if byte_rate > 0:
        parts.append(f"{_size(byte_rate)}/s")
    parts.append(f"{token_rate:,.0f} tokens/s")
    etas = []
    if total_bytes and byte_rate > 0:
        etas.append(max(0, total_bytes - bytes_done) / byte_rate)
    if total_tokens and token_rate > 0:
        etas.append(max(0, total_tokens - tokens) / token_rate)
    if etas:
        parts.append(f"ETA {_duration(min(etas))}")
    parts.append(f"elapsed {_duration(elapsed)}")
    return " | ".join(parts)


class Progress:
    """Prints `format_status` lines for one stage of work (see the module docstring)."""

    def __init__(
        self,
        label: str,
        *,
        enabled: bool = True,
        total_bytes: int | None = None,
        total_tokens: int | None = None,
        stream: TextIO | None = None,
        interval: float = 30.0,
        resumed_tokens: int = 0,
    ) -> None:
        self.label = label
        self.enabled = enabled
        self.total_bytes = total_bytes
        self.total_tokens = total_tokens
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = 0.25 if self.tty else interval
        self.start = time.perf_counter()
        self.last = self.start
        # What a resumed run had done before this process: rates count only the new work (the
        # bytes skipped to reach the resume point are taken from the first update).
        self.resumed_tokens = resumed_tokens
        self.base: tuple[int, int] | None = None if resumed_tokens else (0, 0)
        self.state = (0, 0, 0)
        self.printed: tuple[int, int, int] | None = None

    def update(self, bytes_done: int, docs: int, tokens: int, *, force: bool = False) -> None:
        if self.base is None:
            self.base = (bytes_done, self.resumed_tokens)
        self.state = (bytes_done, docs, tokens)
        now = time.perf_counter()
        if self.enabled and (force or now - self.last >= self.interval):
            self.last = now
            self._print(end="" if self.tty else "\n")

    def close(self) -> None:
        if self.enabled and (self.tty or self.printed != self.state):
            self._print(end="\n")

    def _print(self, end: str) -> None:
        bytes_done, docs, tokens = self.state
        line = format_status(
            self.label,
            bytes_done=bytes_done,
            docs=docs,
            tokens=tokens,
            elapsed=time.perf_counter() - self.start,
            total_bytes=self.total_bytes,
            total_tokens=self.total_tokens,
            rate_base=self.base or (0, 0),
        )
        self.printed = self.state
        prefix = "\r\033[K" if self.tty else ""
        self.stream.write(prefix + line + end)
        self.stream.flush()

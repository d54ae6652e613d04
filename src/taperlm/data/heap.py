"""Keep a long-running process's heap from growing: glibc malloc settings (no-ops elsewhere).

glibc serves blocks above its mmap threshold with mmap and returns them to the OS on free, but
each time such a block is freed it raises the threshold to that block's size, after which blocks
of that size come from the heap. A stream of ~1 MB texts and token arrays (what `taperlm
prepare` moves between processes) then fragments the heap, and the resident size of the
prepare process grew by about 80 MB a minute (measured, benchmarks/prepare_scale.py). Setting
the threshold explicitly turns that adjustment off; the resident size then stays flat.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 128 * 1024  # glibc's own starting value


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    if libc is None or not hasattr(libc, "mallopt") or not hasattr(libc, "malloc_trim"):
        return None  # not glibc
    return libc


def fix_mmap_threshold() -> bool:
    """Turn off glibc's sliding mmap threshold in this process; True if it applied."""
    libc = _libc()
    return bool(libc and libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def release_free_memory() -> None:
    """Give freed heap memory back to the OS (e.g. after training a tokenizer)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)

"""Where a command runs: one resolver for the `--device` of every command and `train.device`,
which checks that the device exists, and one translation of out-of-memory failures into a
clear error (torch is imported only when needed)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from taperlm.errors import ConfigError, ResourceError

KINDS = ("cpu", "cuda", "mps")


def resolve_device(name: str = "auto", what: str = "--device") -> str:
    """`auto` -> `cuda` when a CUDA device is visible, else `cpu`; any other name (`cpu`,
    `cuda`, `cuda:1`, `mps`) is checked to exist here and returned as given. ConfigError, naming
    `what` and the devices there are, for a name torch does not know, an unsupported kind, or a
    device that is not present."""
    import torch  # lazy: plan stays torch-free

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        raise ConfigError(
            f"{what} {name!r} is not a device; use auto, cpu, cuda or cuda:N ({available()})"
        ) from None
    if dev.type not in KINDS:
        raise ConfigError(f"{what} {name!r}: taperlm runs on cpu, cuda or mps ({available()})")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = (
                "this torch has no CUDA support"
                if torch.version.cuda is None
                else "no GPU is visible"
            )
            raise ConfigError(
                f"{what} {name!r}: no CUDA device is available ({why}); use cpu or auto"
            )
        n = torch.cuda.device_count()
        if dev.index is not None and dev.index >= n:
            raise ConfigError(
                f"{what} {name!r}: there is no such CUDA device ({available()}); use one of "
                "those, cpu or auto"
            )
    if dev.type == "mps" and not (torch.backends.mps.is_available()):
        raise ConfigError(
            f"{what} {name!r}: MPS is not available here ({available()}); use one of those, "
            "cpu or auto"
        )
    return name


def available() -> str:
    """The devices this process can use, in words."""
    import torch  # lazy: plan stays torch-free

    out = ["cpu"]
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        out.append("cuda" if n == 1 else f"cuda:0..cuda:{n - 1}")
    if torch.backends.mps.is_available():
        out.append("mps")
    return "available: " + ", ".join(out)


def available_memory(device: str = "cpu") -> int | None:
    """Bytes that can still be allocated on `device`: CUDA's free memory as the driver reports
    it; for the CPU the smaller of MemAvailable (/proc/meminfo) and what the cgroup's
    memory.max leaves (a container sees the host's meminfo). None when unknown."""
    if str(device).startswith("cuda"):
        import torch  # lazy: plan stays torch-free

        try:
            return int(torch.cuda.mem_get_info(torch.device(device))[0])
        except (RuntimeError, AssertionError, ValueError):
            return None
    if str(device) != "cpu":
        return None
    found = []
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError):
        cg = Path("/sys/fs/cgroup")
        limit = (cg / "memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int((cg / "memory.current").read_text()))
    if not found:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return max(0, min(found)) if found else None


def check_memory(need: int, what: str, device: str, detail: str, hint: str) -> None:
    """ResourceError before anything is allocated when `need` bytes (`detail`: what they are)
    exceed what `device` has available: `WHAT needs at least N GiB (DETAIL) but DEVICE has M GiB
    available; HINT`. Nothing is checked when the free memory is unknown."""
    have = available_memory(device)
    if have is not None and need > have:
        raise ResourceError(
            f"{what} needs at least {need / 2**30:,.1f} GiB ({detail}) but {device} has "
            f"{have / 2**30:,.1f} GiB available; {hint}"
        )


def is_out_of_memory(err: BaseException) -> bool:
    """Whether an exception is an allocation failure (CUDA OOM, the CPU allocator, numpy)."""
    if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and (
        "can't allocate memory" in text or "out of memory" in text.lower()
    )


@contextlib.contextmanager
def out_of_memory(what: str | Callable[[], str], hint: str) -> Iterator[None]:
    """Turn an allocation failure inside the block into ResourceError: `what` (or what it
    returns, asked after the failure) needed more memory than there is, with the allocator's
    own words, and `hint` how to need less."""
    try:
        yield
    except Exception as err:
        if not is_out_of_memory(err):
            raise
        raise memory_error(err, what() if callable(what) else what, hint) from None


def memory_error(err: BaseException, what: str, hint: str) -> ResourceError:
    """The ResourceError for allocation failure `err`: `not enough memory for WHAT (the
    allocator's words); HINT` (see `out_of_memory`)."""
    text = " ".join(str(err).split()) or type(err).__name__
    text = text.split("] ", 1)[-1].removeprefix("err == 0. ")  # c10's "[enforce fail at ...]"
    return ResourceError(
        f"not enough memory{' for ' + what if what else ''} ({text[:300]}); {hint}"
    )

"""Where a command runs: one resolver for the `--device` of every command and `train.device`,
which checks that the device exists, and one translation of out-of-memory failures into a
clear error (torch is imported only when needed)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from taperlm.errors import ConfigError, ResourceError

KINDS = ("cpu", "cuda", "mps")


def resolve_device(name: str = "auto", what: str = "--device") -> str:
    """`auto` -> `cuda` when a CUDA device is visible, else `cpu`; any other name (`cpu`,
    `cuda`, `cuda:1`, `mps`) is checked to exist here and returned as given. ConfigError, naming
    `what` and the devices there are, for a name torch does not know, an unsupported kind, or a
    device that is not present."""
    import torch

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
            raise ConfigError(f"{what} {name!r}: there is no such CUDA device ({available()})")
    if dev.type == "mps" and not (torch.backends.mps.is_available()):
        raise ConfigError(f"{what} {name!r}: MPS is not available here ({available()})")
    return name


def available() -> str:
    """The devices this process can use, in words."""
    import torch

    out = ["cpu"]
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        out.append("cuda" if n == 1 else f"cuda:0..cuda:{n - 1}")
    if torch.backends.mps.is_available():
        out.append("mps")
    return "available: " + ", ".join(out)


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

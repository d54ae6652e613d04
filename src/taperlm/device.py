"""Where a command runs: one resolver for the `auto` device of every command and of training."""

from __future__ import annotations


def resolve_device(name: str = "auto") -> str:
    """`auto` -> `cuda` when a CUDA device is visible, else `cpu`; any other name is returned as
    given (`cpu`, `cuda`, `cuda:1`, ...)."""
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"

"""Shared test fixtures. Real benchmark files live in ../shared/data beside the checkout; tests
that need them use the `shared_data` fixture and skip cleanly when it is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def _shared_data_dir() -> Path | None:
    env = os.environ.get("TAPERLM_SHARED_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(REPO_ROOT.parent / "shared" / "data")
    for c in candidates:
        if c.is_dir():
            return c
    return None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path to ../shared/data (real eval sets, GPT-2 tokenizer, tiny-shakespeare); skip if absent."""
    path = _shared_data_dir()
    if path is None:
        pytest.skip("../shared/data is not present beside the checkout")
    return path


@pytest.fixture(autouse=True)
def _few_threads():
    """Tests run on 2 cores; keep torch from oversubscribing when it is imported."""
    try:
        import torch
    except ImportError:  # pure-python tests
        yield
        return
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)

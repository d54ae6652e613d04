"""Shared test fixtures. Real benchmark files live in ../shared/data beside the checkout (or
$TAPERLM_EVAL_DATA, the library's own lookup); tests that need them use the `shared_data`
fixture and skip cleanly when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from taperlm.evaluation.locate import eval_data_dir


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path to ../shared/data (real eval sets, GPT-2 tokenizer, tiny-shakespeare); skip if absent."""
    path = eval_data_dir()
    if path is None or not path.is_dir():
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

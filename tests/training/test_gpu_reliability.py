"""Issue 16's classes on a real GPU (skipped without CUDA; the CPU suite simulates these).

* the step guard undoes a non-finite update on CUDA, where AdamW runs its fused kernel (its
  state lives on the GPU, its step counter too), bitwise, and nothing non-finite is saved;
* a model that cannot be allocated on the GPU is one line naming what needed the memory (the
  allocator's real CUDA out-of-memory error, not a simulated one);
* a CUDA index beyond the GPUs present names the devices there are.

Run on a machine with a GPU: `python -m pytest -q tests/training/test_gpu_reliability.py` (about a
minute).
"""

from __future__ import annotations

import pytest
import torch

import fault_harness as H
from taperlm.cli import main as cli_main
from test_faults import _all_checkpoints_finite, train_with_a_non_finite_update

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    H.preload()
    return H.prepare_data(tmp_path_factory.mktemp("gpu") / "data")


@pytest.mark.parametrize(
    ("where", "value"), [("param", float("nan")), ("exp_avg_sq", float("inf"))]
)
def test_guard_undoes_a_non_finite_update_with_fused_adamw(data, tmp_path, where, value):
    """As tests/training/test_faults.py::test_non_finite_update_is_undone_and_skipped, on the GPU."""
    run = tmp_path / "run"
    res = train_with_a_non_finite_update(data, run, where, value, "train.device=cuda")
    assert res.step == 16 and res.skipped_steps == 1
    assert _all_checkpoints_finite(run) == [15, 16]


def _too_large_for_the_gpu() -> list[str]:
    """Sets of a model whose training state is about twice the free GPU memory, inside every
    domain (vocabulary 2^24, d_model a multiple of 64)."""
    free, _ = torch.cuda.mem_get_info()
    d = 64 * max(1, round(2 * free / (16 * 2 * 2**24) / 64))
    return ["train.device=cuda", "model.vocab_size=16777216", f"model.d_model={d}"]


def test_a_model_too_large_for_the_gpu_is_refused_up_front(data, tmp_path, capsys):
    out = tmp_path / "run"
    rc = cli_main(H.train_argv(data, out, *_too_large_for_the_gpu()))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert "training this transformer model needs at least" in err, err
    assert "but cuda" in err and "GiB available; use a smaller model" in err, err
    assert not out.exists()


def test_a_model_too_large_for_the_gpu_is_one_line(data, tmp_path, capsys, monkeypatch):
    """The allocator's own failure (the free memory made unknown to the up-front check)."""
    import taperlm.runtime.device

    monkeypatch.setattr(taperlm.runtime.device, "available_memory", lambda device="cpu": None)
    out = tmp_path / "run"
    rc = cli_main(H.train_argv(data, out, *_too_large_for_the_gpu()))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert "not enough memory for starting the run on cuda" in err, err
    assert "CUDA out of memory" in err and "smaller model" in err, err
    assert not out.exists()


def test_a_cuda_index_beyond_the_gpus_present(tmp_path, capsys):
    n = torch.cuda.device_count()
    rc = cli_main(["generate", str(tmp_path / "no-run"), "--device", f"cuda:{n}"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    there = "cuda" if n == 1 else f"cuda:0..cuda:{n - 1}"
    assert f"there is no such CUDA device (available: cpu, {there})" in err, err

"""training/ is cut by concept (issue 40): no test hook in the library (tests inject faults from
outside, through the trainer's public `forward_backward`), the checkpoint format is one
package outside it, and loading a model for inference lives outside training/."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "taperlm"


def _sources(root: Path) -> dict[str, str]:
    return {str(p.relative_to(SRC)): p.read_text(encoding="utf-8") for p in root.rglob("*.py")}


def test_no_fault_injection_hook_in_the_library():
    readers = [n for n, text in _sources(SRC).items() if "TAPERLM_INJECT" in text]
    assert readers == []
    assert not (SRC / "training" / "fault_injection.py").exists()


def test_the_checkpoint_format_and_the_loader_are_a_room_below_training():
    """The format (directory, shards, safe reader) and the loader of finished runs are one
    package outside training/, which keeps only the live run's saver; nothing in it imports
    training, so training may read a finished run (the distillation teacher) without a loop."""
    training = SRC / "training"
    assert not list((training / "checkpoint").glob("*.py"))  # a stale __pycache__ may linger
    assert [p.name for p in training.glob("*.py") if "checkpoint" in p.name or "dcp" in p.name] == [
        "checkpointer.py"
    ]
    assert {p.relative_to(SRC).as_posix() for p in (SRC / "checkpoint").glob("*.py")} == {
        "checkpoint/__init__.py",
        "checkpoint/store.py",
        "checkpoint/dcp.py",
        "checkpoint/safe_load.py",
        "checkpoint/loading.py",
    }
    assert not [
        n
        for n, text in _sources(SRC / "checkpoint").items()
        if re.search(r"^\s*(from|import) taperlm\.training", text, re.M)
    ]


def test_one_training_step_reads_top_to_bottom():
    """The step is one method of the trainer; Hope's periods are the optimizer wrapper's, the
    compile fallback the forward wrapper's, so neither shows up as a branch of the step."""
    from taperlm.training.loop import Trainer

    step = inspect.getsource(Trainer.train_step)
    for call in ("set_lr(", "self.forward_backward(", "clip_grad_norm_(", "self.optimizer.step()"):
        assert call in step
    assert "p.grad = " not in step  # the periods hide and restore gradients in the optimizer


def test_inference_loading_lives_outside_training():
    training = _sources(SRC / "training")
    assert not [n for n, text in training.items() if "def load_run_model" in text]
    assert "def load_run_model" in (SRC / "checkpoint/loading.py").read_text(encoding="utf-8")

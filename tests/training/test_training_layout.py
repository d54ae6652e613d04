"""training/ is split by concern (issue 30): the NaN-injection test hook is read in one named
module only, the checkpoint modules form one package, and loading a model for inference lives
outside training/."""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "taperlm"


def _sources(root: Path) -> dict[str, str]:
    return {str(p.relative_to(SRC)): p.read_text(encoding="utf-8") for p in root.rglob("*.py")}


def test_the_nan_injection_hook_is_read_only_by_fault_injection():
    readers = [n for n, text in _sources(SRC).items() if "TAPERLM_INJECT_NAN_AT_STEP" in text]
    assert readers == ["training/fault_injection.py"]


def test_checkpoint_modules_are_one_package():
    training = SRC / "training"
    assert not [p.name for p in training.glob("*.py") if "checkpoint" in p.name or "dcp" in p.name]
    assert {p.name for p in (training / "checkpoint").glob("*.py")} >= {
        "store.py",
        "dcp.py",
        "safe_load.py",
        "saver.py",
        "restore.py",
    }


def test_inference_loading_lives_outside_training():
    training = _sources(SRC / "training")
    assert not [n for n, text in training.items() if "def load_run_model" in text]
    assert "def load_run_model" in (SRC / "loading.py").read_text(encoding="utf-8")

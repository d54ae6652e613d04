"""Load what evaluation needs from a training run directory: the model (newest complete
checkpoint), its tokenizer (the run's data dir) and the run config.

Relies on `taperlm.training.checkpoint.load_run_model` and `taperlm.data.tokenizer.load_tokenizer`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from taperlm.errors import CheckpointError, DataError


def resolve_data_dir(run_dir: Path, run_config: Any) -> Path | None:
    """The run's data dir (config data.dir; relative paths tried against the run dir and cwd)."""
    raw = getattr(getattr(run_config, "data", None), "dir", "") or ""
    if not raw:
        return None
    p = Path(raw)
    for cand in ([p] if p.is_absolute() else [Path.cwd() / p, run_dir / p, run_dir.parent / p]):
        if cand.is_dir():
            return cand
    return None


def load_run(run_dir: str | Path, step: int | None = None, device: str = "cpu"):
    """(model in eval mode, tokenizer, run_config) of a run directory."""
    run = Path(run_dir)
    if not run.is_dir():
        raise CheckpointError(f"run directory {run} does not exist; pass the folder `taperlm train` wrote")
    try:
        from taperlm.training.checkpoint import load_run_model
    except ImportError as err:
        raise CheckpointError(f"cannot load runs: taperlm.training is unavailable ({err})") from None
    model, run_config = load_run_model(run, step=step, device=device)
    model.eval()
    data_dir = resolve_data_dir(run, run_config)
    if data_dir is None:
        raise DataError(
            f"{run}/config.yaml: data.dir {getattr(run_config.data, 'dir', '')!r} is not a folder; "
            "the run's tokenizer lives there (re-run `taperlm prepare` or fix data.dir)"
        )
    from taperlm.data.tokenizer import load_tokenizer

    return model, load_tokenizer(data_dir), run_config

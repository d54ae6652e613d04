"""Load a model with its tokenizer from a training run directory (newest complete checkpoint),
a checkpoint directory, or a `taperlm export` directory — for eval, export and generate.

Relies on `taperlm.training.checkpoint.load_run_model` and `taperlm.data.tokenizer.load_tokenizer`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from taperlm.errors import CheckpointError, DataError


def resolve_data_dir(run_dir: Path, run_config: Any) -> Path | None:
    """The run's data dir (config data.dir; relative paths tried against the run dir and cwd)."""
    raw = getattr(getattr(run_config, "data", None), "dir", "") or ""
    if not raw:
        return None
    p = Path(raw)
    for cand in [p] if p.is_absolute() else [Path.cwd() / p, run_dir / p, run_dir.parent / p]:
        if cand.is_dir():
            return cand
    return None


def is_hf_export(path: Path) -> bool:
    cfg = path / "config.json"
    if not cfg.is_file():
        return False
    try:
        return json.loads(cfg.read_text(encoding="utf-8")).get("model_type") == "taperlm"
    except ValueError:
        return False


def load_export(path: str | Path, device: str = "cpu"):
    """(TaperedLM, tokenizer, None) from a directory written by `taperlm export` (no transformers
    needed: the config's `taperlm` dict rebuilds the model, safetensors holds the weights)."""
    from safetensors.torch import load_file

    from taperlm.config import ModelConfig, from_dict
    from taperlm.data.tokenizer import load_tokenizer
    from taperlm.errors import ConfigError
    from taperlm.models import TaperedLM

    path = Path(path)
    data = json.loads((path / "config.json").read_text(encoding="utf-8"))
    try:
        cfg = from_dict(ModelConfig, dict(data.get("taperlm") or {}), "config.json:taperlm")
        cfg.validate()
    except ConfigError as err:
        raise CheckpointError(f"{path}/config.json: {err}") from None
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"{path} has no model.safetensors; re-run `taperlm export`")
    state = {k.removeprefix("model."): v for k, v in load_file(str(weights)).items()}
    model = TaperedLM(cfg)
    if cfg.tie_embeddings:
        state.setdefault("lm_head.weight", state.get("embed.weight"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{weights} does not match its config.json (missing {missing[:4]}, unexpected "
            f"{unexpected[:4]}); re-run `taperlm export`"
        )
    return model.to(device).eval(), load_tokenizer(path), None


def load_any(path: str | Path, step: int | None = None, device: str = "cpu"):
    """A training run directory (or checkpoint dir), or a directory from `taperlm export`."""
    p = Path(path)
    if p.is_dir() and is_hf_export(p):
        return load_export(p, device)
    return load_run(p, step=step, device=device)


def load_run(run_dir: str | Path, step: int | None = None, device: str = "cpu"):
    """(model in eval mode, tokenizer, run_config) of a run directory."""
    run = Path(run_dir)
    if not run.is_dir():
        raise CheckpointError(
            f"run directory {run} does not exist; pass the folder `taperlm train` wrote"
        )
    try:
        from taperlm.training.checkpoint import load_run_model
    except ImportError as err:
        raise CheckpointError(
            f"cannot load runs: taperlm.training is unavailable ({err})"
        ) from None
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

"""Load a model with its tokenizer from a training run directory (newest complete checkpoint),
a checkpoint directory, or a `taperlm export` directory — for eval, export, generate and
novelty (the one place a run's data dir, and so its tokenizer, is looked up).

Relies on `taperlm.training.checkpoint.load_run_model` and `taperlm.data.tokenizer.load_tokenizer`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from taperlm.errors import CheckpointError, DataError


def resolve_data_dir(run_dir: Path, run_config: Any) -> Path | None:
    """The run's data dir (config data.dir; a relative path is tried against the working
    directory, the run dir and its parent, since training may have run elsewhere); None if absent."""
    found, _ = _data_dir_candidates(run_dir, run_config)
    return found


def _data_dir_candidates(run_dir: Path, run_config: Any) -> tuple[Path | None, list[Path]]:
    raw = getattr(getattr(run_config, "data", None), "dir", "") or ""
    if not raw or raw == ".":
        return None, []
    p = Path(raw)
    tried = [p] if p.is_absolute() else [p, run_dir / p, run_dir.parent / p]
    return next((c for c in tried if c.is_dir()), None), tried


def require_data_dir(run_dir: Path, run_config: Any) -> Path:
    """`resolve_data_dir`, or a DataError saying what is missing and how to fix it."""
    found, tried = _data_dir_candidates(run_dir, run_config)
    if found is not None:
        return found
    if not tried:
        raise DataError(
            f"run {run_dir} has no data.dir in its config, so its tokenizer is unknown; set "
            "data.dir in its config.yaml to the folder `taperlm prepare` wrote"
        )
    raise DataError(
        f"the tokenizer of run {run_dir} lives in its data dir {tried[0]}, which does not exist "
        f"(tried {', '.join(map(str, tried))}); re-create it with `taperlm prepare` or fix "
        "data.dir in the run's config.yaml"
    )


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
    from taperlm.device import out_of_memory

    p = Path(path)
    with out_of_memory(
        f"loading the model of {p} onto {device}",
        "load it onto another device (--device) or on a machine with more memory",
    ):
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
    from taperlm.data.identity import run_tokenizer_dir
    from taperlm.data.tokenizer import load_tokenizer

    # The run's own copy of its tokenizer; runs that predate it use their data dir's.
    root = run_root(run)
    source = run_tokenizer_dir(root) or require_data_dir(root, run_config)
    tok = load_tokenizer(source)
    if tok.vocab_size > run_config.model.vocab_size:
        raise DataError(
            f"tokenizer in {source} has {tok.vocab_size} ids but the model's vocab_size is "
            f"{run_config.model.vocab_size}; the run's data.dir points at the wrong data"
        )
    return model, tok, run_config


def run_root(path: Path) -> Path:
    """The run directory of a path given to eval/generate/...: itself, or RUN for a checkpoint
    directory RUN/checkpoints/step_N."""
    from taperlm.training.checkpoint import CHECKPOINT_DIR, MANIFEST_FILE

    if (path / MANIFEST_FILE).is_file() and path.parent.name == CHECKPOINT_DIR:
        return path.parent.parent
    return path

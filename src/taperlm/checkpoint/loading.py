"""Load a model for inference, with its tokenizer, from a training run directory (newest complete
checkpoint), a checkpoint directory, or a `taperlm export` directory — for eval, export, generate
and novelty (the one place a run's data dir, and so its tokenizer, is looked up) -- and the
tokenizer any weights were trained with (`weights_tokenizer`), which every path where weights
meet a data dir checks (`check_tokenizer`).

The checkpoint files are read through `taperlm.checkpoint.store`.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from taperlm.checkpoint import store
from taperlm.config import (
    ModelConfig,
    config_differences,
    format_differences,
    from_dict,
    load_run_config,
    run_config_from_dict,
    to_dict,
)
from taperlm.data.identity import (
    RECORD_FILE,
    TOKENIZER_COPY,
    TokenizerRef,
    copy_tokenizer,
    data_tokenizer,
    other_tokenizer,
    read_record,
    run_tokenizer_dir,
    tokenizer_identity,
)
from taperlm.data.tokenizer import load_tokenizer
from taperlm.errors import CheckpointError, ConfigError, DataError, UnsafeFileError
from taperlm.files.io import (
    MAX_RECORD_BYTES,
    check_regular,
    error_text,
    not_a_file,
    read_json,
    sha256_file,
)
from taperlm.runtime.device import out_of_memory


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
        data = read_json(cfg, MAX_RECORD_BYTES, "config.json")
    except (OSError, UnsafeFileError):
        return False
    return isinstance(data, dict) and data.get("model_type") == "taperlm"


def load_export(path: str | Path, device: str = "cpu"):
    """(TaperedLM, tokenizer, None) from a directory written by `taperlm export` (no transformers
    needed: the config's `taperlm` dict rebuilds the model, safetensors holds the weights)."""
    path = Path(path)
    try:
        data = read_json(path / "config.json", MAX_RECORD_BYTES, "config.json")
    except UnsafeFileError as err:
        raise CheckpointError(f"export {path}: {err}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}/config.json holds no JSON object; re-run `taperlm export`")
    try:
        cfg = from_dict(ModelConfig, dict(data.get("taperlm") or {}), "config.json:taperlm")
        cfg.validate()
    except ConfigError as err:
        raise CheckpointError(f"{path}/config.json: {err}") from None
    weights = path / "model.safetensors"
    if not weights.is_file() and not not_a_file(weights):
        raise CheckpointError(f"{path} has no model.safetensors; re-run `taperlm export`")
    try:
        check_regular(weights, what="weights file")
    except UnsafeFileError as err:
        raise CheckpointError(str(err)) from None
    from safetensors.torch import load_file  # lazy: torch; eval/generate --help stay torch-free

    from taperlm.models import TaperedLM  # lazy: torch

    try:
        state = {k.removeprefix("model."): v for k, v in load_file(str(weights)).items()}
    except Exception as err:  # safetensors' own error types on a damaged file
        raise CheckpointError(
            f"{weights} cannot be read ({error_text(err)}); re-run `taperlm export`"
        ) from None
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
    model, run_config = load_run_model(run, step=step, device=device)
    model.eval()
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
    if (path / store.MANIFEST_FILE).is_file() and path.parent.name == store.CHECKPOINT_DIR:
        return path.parent.parent
    return path


# A reader of a run that is training retries this often when pruning removes its checkpoint.
_READ_ATTEMPTS = 5


def _load_newest(run: Path, step: int | None) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """(checkpoint, model state, manifest) of run `run`'s newest complete checkpoint (or `step`),
    read consistently while the run trains: a checkpoint pruned between its lookup and its read
    (a newer one exists by then) is replaced by the newer one."""
    for _ in range(_READ_ATTEMPTS):
        listed = store.list_checkpoints(run)
        found = store.find_checkpoint(run, step)
        if found is None:
            why = "none of its checkpoints verifies" if listed else "it has no checkpoint yet"
            raise CheckpointError(
                f"run {run} has no usable checkpoint: {why}; train it (`taperlm train --out {run}`)"
            )
        try:
            model_state, _, manifest = store.load_checkpoint(found, verify=False)
            return found, model_state, manifest
        except CheckpointError:
            if found.exists():
                raise
            if step is not None:
                raise CheckpointError(
                    f"checkpoint {found} was deleted while it was read (the run that is training "
                    "prunes old checkpoints, train.keep_checkpoints); choose a newer --step"
                ) from None
    raise CheckpointError(
        f"run {run} pruned {_READ_ATTEMPTS} checkpoints in a row while they were read; try again, "
        "or raise train.keep_checkpoints"
    )


def load_run_model(run_dir: str | Path, step: int | None = None, device: str = "cpu"):
    """(model, run_config) of a run's newest complete checkpoint (or checkpoint `step`).

    `run_dir` may also be a checkpoint directory itself. The model is built from the resolved
    config (widths are never recomputed), loaded in fp32 and put in eval mode on `device`.
    Raises CheckpointError when the run dir is missing, has no usable checkpoint, or the
    checkpoint does not match the run's config (naming the mismatching keys).
    """
    run = Path(run_dir)
    if not run.exists():
        raise CheckpointError(
            f"run directory {run} does not exist; pass the --out directory of a `taperlm train` run"
        )
    if (run / store.MANIFEST_FILE).is_file():  # a checkpoint directory
        ckpt = run
        manifest = store.verify_checkpoint(ckpt)
        if step is not None and manifest.get("step") != step:
            raise CheckpointError(f"checkpoint {ckpt} is step {manifest.get('step')}, not {step}")
        cfg_path = None
    else:
        cfg_path = run / "config.yaml"
        if not cfg_path.is_file():
            raise CheckpointError(
                f"{run} is not a run directory: {cfg_path.name} is missing (expected the --out "
                "directory of `taperlm train`)"
            )
        ckpt, model_state, manifest = _load_newest(run, step)
    if cfg_path is None:
        model_state, _, manifest = store.load_checkpoint(ckpt, verify=False)
    try:
        if cfg_path is not None:
            run_config = load_run_config(cfg_path)
        else:
            run_config = run_config_from_dict(
                manifest["run_config"], str(ckpt / store.MANIFEST_FILE)
            )
        run_config.resolve()
        # Read through the config classes, so a manifest in an older layout compares by meaning.
        saved_model = (manifest.get("run_config") or {}).get("model")
        if saved_model is not None:
            saved_model = to_dict(from_dict(ModelConfig, saved_model, "model"))
    except ConfigError as err:
        raise CheckpointError(f"cannot rebuild the model of {run}: {err}") from None
    if saved_model is not None:
        diffs = config_differences(saved_model, to_dict(run_config.model), "model.")
        if diffs:
            raise CheckpointError(
                f"checkpoint {ckpt} does not match {cfg_path}: "
                + format_differences(diffs, "checkpoint", "config")
                + "; load it with the config it was trained with"
            )
    from taperlm.models import TaperedLM  # lazy: torch; eval/generate --help stay torch-free

    model = TaperedLM(run_config.model)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in model_state.items()}
    bad = [
        f"{k}: checkpoint {got.get(k)} vs model {expected.get(k)}"
        for k in sorted(set(expected) | set(got))
        if expected.get(k) != got.get(k)
    ]
    if bad:
        shown = "; ".join(bad[:8]) + (f"; ... ({len(bad)} in all)" if len(bad) > 8 else "")
        raise CheckpointError(
            f"checkpoint {ckpt} does not fit a {run_config.model.family} model of this config "
            f"(other family or shape): {shown}"
        )
    model.load_state_dict(model_state)
    return model.to(device).eval(), run_config


# ----------------------------------------------------------------------------------------------
# the tokenizer weights were trained with


def _configured_data_dir(root: Path, path: Path) -> tuple[Path | None, str]:
    """(the data dir the run's config names, if found; the data.dir setting) of weights that hold
    neither a data record nor a tokenizer copy: from the run's config.yaml, else from the
    checkpoint's manifest."""
    raw: Any = ""
    if (root / "config.yaml").is_file():
        raw = load_run_config(root / "config.yaml").data.dir
    elif (path / store.MANIFEST_FILE).is_file():
        try:
            manifest = read_json(path / store.MANIFEST_FILE, MAX_RECORD_BYTES, "manifest")
        except UnsafeFileError as err:
            raise CheckpointError(f"{path}: {err}") from None
        run = manifest.get("run_config") if isinstance(manifest, dict) else None
        data = run.get("data") if isinstance(run, dict) else None
        raw = data.get("dir", "") if isinstance(data, dict) else ""
    raw = raw if isinstance(raw, str) else ""
    found, _ = _data_dir_candidates(root, SimpleNamespace(data=SimpleNamespace(dir=raw)))
    return found, raw


def weights_tokenizer(path: str | Path) -> TokenizerRef | None:
    """The tokenizer the weights of `path` (a run dir, or a checkpoint dir) were trained with:
    the one its data.json records; else the tokenizer file it holds (RUN/tokenizer: an import);
    else, for a run that predates both, its data dir's (what `generate` uses for it). A run
    whose data.json predates recorded identities gets its identity computed from its tokenizer
    copy (when that is the file the record names), else is compared by the file's sha256.

    None for weights that came without a tokenizer (`taperlm import` of a folder without one:
    the data they are trained on gives them theirs). DataError when the run names a data dir
    that is gone, so its tokenizer cannot be known (never a silent pass)."""
    path = Path(path)
    root = path.parent.parent if path.parent.name == store.CHECKPOINT_DIR else path
    record = read_record(root)
    copy = run_tokenizer_dir(root)
    if record is not None:
        tok = record["tokenizer"]
        identity, origin = tok.get("identity"), str(root / RECORD_FILE)
        if not identity and copy is not None:
            file = copy / "tokenizer.json"
            if sha256_file(file) == tok["sha256"]:
                identity = tokenizer_identity(file)
                origin = f"{file}, computed: {root / RECORD_FILE} predates recorded identities"
        return TokenizerRef(
            identity,
            tok["sha256"],
            tok.get("spec"),
            tok.get("vocab_size"),
            origin,
            str(copy) if copy is not None else record.get("data_dir"),
        )
    if copy is not None:
        return copy_tokenizer(copy)
    found, raw = _configured_data_dir(root, path)
    if found is not None:
        ref = data_tokenizer(found)
        note = f", its data dir's: {root} predates {RECORD_FILE} and {TOKENIZER_COPY}/"
        return TokenizerRef(
            ref.identity, ref.sha256, ref.spec, ref.vocab_size, ref.origin + note, ref.prepare_with
        )
    if raw and raw != ".":
        raise DataError(
            f"cannot tell which tokenizer {path} was trained with: it holds neither {RECORD_FILE} "
            f"nor {TOKENIZER_COPY}/ (it predates them) and its data dir {raw} is gone; copy the "
            "tokenizer it was trained with (tokenizer.json and tokenizer_meta.json) into "
            f"{root / TOKENIZER_COPY}"
        )
    return None


def check_tokenizer(weights: str | Path, data_dir: str | Path) -> None:
    """The one check of every path where weights meet a data dir (continuing a run, an import
    or a branch's source; train.init_from; train.distill_from; prune's calibration; the val
    split eval, novelty and allocate read): the weights of `weights` (a run or checkpoint dir)
    were trained with the tokenizer the tokens of `data_dir` were made with, else the one
    refusal, `taperlm.data.identity.other_tokenizer`."""
    weights, data_dir = Path(weights), Path(data_dir)
    model = weights_tokenizer(weights)
    if model is None:
        return
    data = data_tokenizer(data_dir)
    if not model.same_as(data):
        raise other_tokenizer(weights, model, data_dir, data)

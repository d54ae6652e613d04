"""A training run directory's lifecycle around the loop: its data dir checked before any work,
the directory created and locked (one writer), the resume verdict (mode, config conflicts, a
checkpoint that verifies, the same data as before), the config and data record written once a
resume succeeded, and the one wording of a failed write in it. Besides resuming its own
checkpoint, a run dir can start from another run's (a cooldown branch) or from given weights.

Every check here is read-only and reaches the same verdict on every rank (rank 0's, broadcast
where only rank 0 acts), so no rank hangs on another's error.

Cooldown branches (`check_branch`): under `train.schedule: wsd` the LR of every step before a run's decay (`LRSchedule.decay_start`)
is the warmup's or the plateau's, whatever `train.tokens` is; the data order and every RNG do
not depend on it either. So the state of a longer run R at step k is, bit for bit, the state a
run B of fewer tokens (and otherwise the same config) would reach at step k, as long as k is at
or before B's decay start (and R's). A branch is B started from R's checkpoint at such a step:
it restores the model, optimizer, data position and RNGs from it and trains only B's decay
(and any plateau steps between k and B's decay start) into its own run dir, which then resumes
from its own checkpoints like any run. `tests/training/test_wsd.py` shows a branch equals B trained from
step 0.

The branch's metrics.jsonl starts at step k (the steps before are R's); `branch.json` in its run
dir names R and k.

A run from given weights (`write_start_run`, used by `taperlm import`): its directory holds what
`taperlm train` writes for a run at step 0 — config.yaml, a checkpoint `step_00000000`
(the weights, a fresh AdamW with no moments yet, the data position at the first sample, the
generators as the seed sets them) and the tokenizer the weights were trained with, in
`RUN/tokenizer/` — so `eval`, `export`, `generate` and `novelty` load it like any run, and
`taperlm train --out RUN --data DATA` continues training it from those weights (deterministically:
everything it resumes from is a function of the config).
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any

import torch

from taperlm.checkpoint import store as ckpt
from taperlm.checkpoint.dcp import training_state
from taperlm.checkpoint.loading import check_tokenizer
from taperlm.config import (
    RUNTIME_KEYS,
    RunConfig,
    config_differences,
    format_differences,
    load_run_config,
    run_config_from_dict,
    save_yaml,
    to_dict,
)
from taperlm.data.identity import (
    TOKENIZER_COPY,
    check_run_data,
    read_record,
    record_run_data,
    stamp_tokenizer,
)
from taperlm.data.loader import check_data_fits, check_vocab
from taperlm.errors import CheckpointError, ConfigError, DataError, RunInUseError
from taperlm.files.io import atomic_write_json, os_error_cause
from taperlm.files.outdirs import KINDS, check_folder, claim
from taperlm.files.runlock import LOCK_FILE, RunLock
from taperlm.models import TaperedLM
from taperlm.spec.domains import check_output, choices
from taperlm.training import ResumeMode
from taperlm.training import distributed as D
from taperlm.training.checkpointer import (
    ShardedCheckpointer,
    rng_state,
    seed_everything,
    set_rng_state,
)
from taperlm.training.optim import LRSchedule, build_optimizer, parameter_periods
from taperlm.training.settings import validate_train_config

RESUME_MODES = choices(ResumeMode)
BRANCH_FILE = "branch.json"


def resume_conflicts(
    old: RunConfig | dict[str, Any], new: RunConfig | dict[str, Any]
) -> list[tuple[str, Any, Any]]:
    """Differences between a run's saved config and a new one that would change the result
    (RUNTIME_KEYS excluded: the one place training reads them). A dict (e.g. from result.json)
    is read as a run config first, so configs written by older versions compare by meaning,
    not by layout."""

    def as_dict(cfg: RunConfig | dict[str, Any]) -> dict[str, Any]:
        return to_dict(cfg if isinstance(cfg, RunConfig) else run_config_from_dict(cfg))

    diffs = config_differences(as_dict(old), as_dict(new))
    return [d for d in diffs if d[0] not in RUNTIME_KEYS]


def os_error_message(path: Path, err: OSError, run_dir: Path) -> str:
    """A failed write in the run dir: the path, the OS error, which checkpoint is intact, and
    what to do (then rerun the same command to resume)."""
    good = ckpt.list_checkpoints(run_dir)
    where = (
        f"the last checkpoint {good[-1][1]} is intact"
        if good
        else "no checkpoint has been written yet"
    )
    return (
        f"could not write {path}: {err.strerror or err} ({type(err).__name__}, errno "
        f"{err.errno}); {where}. {os_error_cause(err, path)}, then rerun the same "
        "command to resume"
    )


def check_data_dir(run: RunConfig, out: Path) -> Path:
    """The run's data dir, checked before any work: it exists, its vocabulary fits the model,
    it holds enough tokens for one step (and one validation window), and the run dir can be
    written beside it (the CLI checks --out the same way; this covers in-process callers)."""
    cfg = run.train
    data_dir = Path(run.data.dir) if run.data.dir else None
    if data_dir is None:
        raise ConfigError(
            "no data directory: pass --data DIR (a folder written by `taperlm prepare`) "
            "or set data.dir in the config"
        )
    if not data_dir.is_dir():
        raise DataError(
            f"data directory {data_dir} does not exist; create it with "
            f"`taperlm prepare --source SRC --out {data_dir}`"
        )
    check_vocab(data_dir, run.model.vocab_size)
    check_data_fits(
        data_dir, cfg.seq_len, cfg.batch_tokens // cfg.seq_len, validate=cfg.eval_tokens > 0
    )
    check_output(out, "dir", "the run dir", [("the data dir", data_dir)])
    return data_dir


class RunDir:
    """The run directory one trainer writes: created and locked by rank 0 for the whole job,
    released by `release`, and removed again by `discard_if_unused` after a failed start."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.lock: RunLock | None = None
        self.created = False

    def take(self, info: D.DistInfo) -> None:
        """Create the run dir and take its lock (rank 0): one writer per run dir. Every rank
        gets rank 0's verdict."""
        err: tuple[str, str] | None = None
        if info.is_main:
            try:
                self.created = not self.out.exists()
                check_folder(self.out, "run", "--out")  # library callers too: never a foreign one
                claim(self.out, "run")
                self.lock = RunLock(self.out).acquire()
            except ConfigError as e:
                err = ("config", str(e))
            except OSError as e:
                path = Path(e.filename) if e.filename else self.out
                err = ("os", os_error_message(path, e, self.out))
            except RunInUseError as e:
                err = ("busy", str(e))
        err = D.broadcast_object(err, info)
        if err is not None:
            kinds = {"busy": RunInUseError, "config": ConfigError}
            raise kinds.get(err[0], CheckpointError)(err[1])

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def discard_if_unused(self) -> None:
        """After a failed start: remove the run dir this attempt created if nothing but its
        lock file was written (a bad --resume must not leave an empty run behind)."""
        if not self.created or not self.out.is_dir():
            return
        if {p.name for p in self.out.iterdir()} <= {LOCK_FILE, KINDS["run"].marker}:
            (self.out / LOCK_FILE).unlink(missing_ok=True)
            (self.out / KINDS["run"].marker).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.out.rmdir()


def checkpoint_to_resume(
    run: RunConfig, out: Path, resume: str, info: D.DistInfo | None = None
) -> Path | None:
    """Check the run dir against the config and resume mode; return the checkpoint to resume.

    Read-only: every rank calls it and reaches the same verdict (no rank hangs on an error);
    each rank hashes only its share of a checkpoint's files.
    """
    if resume not in RESUME_MODES:
        raise ConfigError(
            f"--resume {resume!r} is unknown; choose {', '.join(RESUME_MODES[:-1])} or "
            f"{RESUME_MODES[-1]}"
        )
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder; choose a folder for the run")
    have = ckpt.list_checkpoints(out)
    if resume == "never":
        if have:
            raise ConfigError(
                f"{out} already holds checkpoints (newest: {have[-1][1].name}) and --resume is "
                "never; train into a fresh --out directory, or use --resume auto to continue it"
            )
        return None
    if resume == "must" and not have:
        raise CheckpointError(
            f"--resume must, but {out} has no checkpoint; train it first or use --resume auto"
        )
    if not have:
        return None
    _check_saved_config(run, out)
    info = info or D.DistInfo()
    found = ckpt.find_checkpoint(
        out, part=(info.rank, info.world_size), agree=lambda x: D.gather_objects(x, info)
    )
    if found is None:
        # Never silently restart from scratch over a run's (possibly repairable) checkpoints.
        raise CheckpointError(
            f"none of the {len(have)} checkpoint(s) in {ckpt.checkpoints_dir(out)} verifies "
            "(see the warnings above): they are corrupt or incomplete. Restore them from a "
            "backup, delete them to restart this run from step 0, or train into a fresh --out"
        )
    return found


def _check_saved_config(run: RunConfig, out: Path) -> None:
    """A resume must not change what the run computes: its saved config.yaml against `run`."""
    cfg_path = out / "config.yaml"
    if not cfg_path.is_file():
        return
    try:
        old = load_run_config(cfg_path).resolve()
    except ConfigError as err:
        raise ConfigError(
            f"cannot resume {out}: its config.yaml is unreadable ({err}); use a fresh --out"
        ) from None
    conflicts = resume_conflicts(old, run)
    if conflicts:
        raise ConfigError(
            f"cannot resume {out} with a different config: "
            + format_differences(conflicts, "run", "now")
            + f". Continue it with its own settings (`taperlm train --out {out}`), or train "
            "into a fresh --out directory"
        )


def check_resume_data(out: Path, data_dir: Path) -> None:
    """A resumed run must read the data it was trained on (its recorded identity): tokens of
    its own tokenizer (a run from given weights, `taperlm import`, carries theirs but no data
    record yet), and the very splits it read before."""
    check_tokenizer(out, data_dir)
    why = check_run_data(out, data_dir, ("train", "val"))
    if why:
        raise DataError(
            f"cannot resume {out}: the data dir {data_dir} is not the data this run "
            f"was trained on: {why}. Resume with that data (--data or data.dir), or train "
            "into a fresh --out"
        )


def check_start_tokenizers(run: RunConfig, data_dir: Path, resumed: bool) -> None:
    """The weights a new run starts from (train.init_from) and its teacher's
    (train.distill_from, whose logits meet the student's batches) were trained with the
    tokenizer of the run's data (`check_tokenizer`). A resumed run has its start weights
    already (their source may be gone)."""
    cfg = run.train
    if cfg.init_from and not resumed:
        check_tokenizer(Path(cfg.init_from).expanduser(), data_dir)
    if cfg.distill_from:
        check_tokenizer(Path(cfg.distill_from).expanduser(), data_dir)


def write_run_record(
    run: RunConfig, out: Path, data_dir: Path, resumed: bool, info: D.DistInfo
) -> None:
    """Write config.yaml and (new runs, and runs that predate it) the data record, on rank 0,
    once a resume succeeded (a failed resume leaves the old config intact); a failed write is
    a CheckpointError on every rank."""
    err = None
    if info.is_main:
        try:
            save_yaml(run, out / "config.yaml")
            if not resumed or read_record(out) is None:
                record_run_data(out, data_dir)  # the run's tokenizer and data identity
        except OSError as e:
            err = os_error_message(Path(e.filename or out / "config.yaml"), e, out)
    err = D.broadcast_object(err, info)
    if err is not None:
        raise CheckpointError(err)


# ----------------------------------------------------------------------------------------------
# cooldown branches: a run started from a longer WSD run's checkpoint


def schedule_of(run: RunConfig) -> LRSchedule:
    return LRSchedule.from_config(run.train, run.train.steps)


def branch_step(run: RunConfig) -> int:
    """The last step at which a longer WSD run's checkpoint can start `run` as a branch: its
    decay start (ConfigError unless train.schedule is wsd)."""
    if run.train.schedule != "wsd":
        raise ConfigError(
            f"a cooldown branch needs train.schedule: wsd (this run's is "
            f"{run.train.schedule!r}: its LR before the end depends on train.tokens)"
        )
    return schedule_of(run).decay_start


def check_branch(run: RunConfig, source: Path, step: int, info: D.DistInfo | None = None) -> Path:
    """The verified checkpoint of run dir `source` at `step` from which `run` starts as a
    branch, after checking that it is `run`'s own state there: both WSD, the same config but
    for train.tokens, the same warmup, and `step` at or before both runs' decay start."""
    info = info or D.DistInfo()
    source = Path(source)
    src = branch_source_config(source)
    mine = branch_step(run)
    theirs = branch_step(src)
    conflicts = [d for d in resume_conflicts(src, run) if d[0] != "train.tokens"]
    if conflicts:
        raise ConfigError(
            f"cannot branch from {source}: its config differs in more than train.tokens: "
            + format_differences(conflicts, "source", "branch")
        )
    a, b = schedule_of(src), schedule_of(run)
    if a.warmup_steps != b.warmup_steps:
        raise ConfigError(
            f"cannot branch from {source}: the warmups differ ({a.warmup_steps} vs "
            f"{b.warmup_steps} steps; a warmup longer than a run is cut to it): give both runs "
            "train.warmup_tokens shorter than the shorter run"
        )
    if step > min(mine, theirs) or step < 0:
        raise ConfigError(
            f"cannot branch at step {step}: the branch's decay starts at step {mine} and the "
            f"source's at step {theirs}; a branch starts at a step <= both"
        )
    found = ckpt.find_checkpoint(
        source, step, part=(info.rank, info.world_size), agree=lambda x: D.gather_objects(x, info)
    )
    if found is None:  # find_checkpoint raises for a missing step; kept for the type checker
        raise CheckpointError(f"{source} has no checkpoint at step {step}")
    return found


def branch_source_config(source: Path, option: str = "branch source") -> RunConfig:
    """The config of run dir `source` (resolved), or a ConfigError naming `option` (how the
    caller names the source: `taperlm train --branch-from`)."""
    path = Path(source) / "config.yaml"
    if not path.is_file():
        raise ConfigError(
            f"{option} {source} is no run dir (it has no config.yaml): name the folder a WSD "
            "run was trained into (`taperlm train --out RUN`)"
        )
    try:
        return load_run_config(path).resolve()
    except ConfigError as err:
        raise ConfigError(f"{option} {source}: its config.yaml is unreadable ({err})") from None


def record_branch(out: Path, source: Path, step: int) -> None:
    """branch.json: which run and step this run branched from (provenance)."""
    atomic_write_json(out / BRANCH_FILE, {"source": str(Path(source).resolve()), "step": step})


# ----------------------------------------------------------------------------------------------
# a run from given weights


def write_start_run(
    out: str | Path,
    run: RunConfig,
    weights: dict[str, torch.Tensor],
    tokenizer: Any | None = None,
    records: dict[str, str] | None = None,
) -> Path:
    """Write run directory `out` (new, or empty) whose step-0 checkpoint holds `weights` (a
    `TaperedLM` state dict of `run.model`, loaded strictly) and whose tokenizer is `tokenizer`;
    `records` (file name -> text) are written beside config.yaml (an import's provenance).
    Takes the run's lock while writing; a failure removes what this call wrote (and the folder,
    when it created it), so no half-written run is left behind."""
    out = Path(out)
    run = run.resolve()
    ckpt.require_finite(
        weights.items(), f"the weights for {out}", "Start from weights that are all finite"
    )
    validate_train_config(run, 1)  # what `train` would refuse when it continues, refused now
    # Built without drawing an initialisation (the weights replace it; a 7B draw takes minutes
    # and would move the caller's generators): on the meta device, then given storage. Only the
    # persistent tensors matter here (they are what the checkpoint holds), and `weights` fills
    # every one of them (a strict load).
    with torch.device("meta"):
        model = TaperedLM(run.model)
    model.to_empty(device="cpu")
    if run.model.tie_embeddings:
        model.lm_head.weight = model.embed.weight  # to_empty made each its own tensor
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:
        raise CheckpointError(
            f"the weights do not fit the model: {str(err).splitlines()[0]}"
        ) from None
    info = D.DistInfo()
    before = {p.name for p in out.iterdir()} if out.is_dir() else set()
    run_dir = RunDir(out)
    run_dir.take(info)
    try:
        if ckpt.list_checkpoints(out):
            raise CheckpointError(f"{out} already holds checkpoints; choose a new --out folder")
        periods = parameter_periods(model)
        optimizer = build_optimizer(model, run.train, torch.device("cpu"), periods)
        periodic = [(n, p) for n, p in model.named_parameters() if n in periods]
        caller = rng_state()
        seed_everything(run.train.seed)  # what a fresh run's generators start from
        seeded = rng_state()
        set_rng_state(caller)  # the caller's generators are left as they were
        state = {
            "step": 0,
            "tokens": 0,
            "skipped_steps": 0,
            "bad_streak": 0,
            "scheduler": LRSchedule.from_config(run.train, run.train.steps).state_dict(),
            # The first sample of the seed's order; the loader checks split, seed and seq_len
            # against the data it is given when the run continues.
            "loader": [
                {
                    "split": "train",
                    "seed": run.train.seed,
                    "seq_len": run.train.seq_len,
                    "sample": 0,
                }
            ],
            "rng": seeded,
            "world_size": 1,
            "last_loss": None,
            "last_val_loss": None,
        }
        tensors = training_state(model, optimizer, periodic)
        # DCP's state dict fills an empty optimizer by one step at lr 0 (zero moments, but
        # `step` 1, which would shrink the first real update through Adam's bias correction);
        # step 0 with zero moments is exactly the state a fresh AdamW makes at its first step.
        for param_state in tensors["optimizer"]["state"].values():
            for key in ("exp_avg", "exp_avg_sq", "step"):
                if isinstance(param_state.get(key), torch.Tensor):
                    param_state[key].zero_()
        saver = ShardedCheckpointer(out, info)
        saver.save(
            0,
            tensors,
            state,
            to_dict(run),
            run.train.keep_checkpoints,
        )
        saver.finish()
        if tokenizer is not None:
            tokenizer.save(out / TOKENIZER_COPY)
            stamp_tokenizer(out / TOKENIZER_COPY)  # the weights' tokenizer, recorded
        save_yaml(run, out / "config.yaml")
        for name, text in (records or {}).items():
            (out / name).write_text(text, encoding="utf-8")
    except BaseException:
        for name in (ckpt.CHECKPOINT_DIR, TOKENIZER_COPY, "config.yaml", *(records or {})):
            path = out / name
            if name not in before and path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            elif name not in before:
                path.unlink(missing_ok=True)
        run_dir.release()
        if not before:  # the folder was new or empty: it is left as it was
            (out / LOCK_FILE).unlink(missing_ok=True)
            (out / KINDS["run"].marker).unlink(missing_ok=True)
        run_dir.discard_if_unused()
        raise
    run_dir.release()
    return out

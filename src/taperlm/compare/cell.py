"""One cell of a comparison to done: train (or resume), evaluate, measure, record.

Each cell (allocation, seed) lives in `OUT/runs/<allocation>-s<seed>/`, a normal run directory of
`taperlm train` (config.yaml, metrics.jsonl, checkpoints/). After training, validation, the
zero-shot tasks and novelty have all finished, the cell's numbers are written atomically to
`result.json` in that folder; its presence marks the cell as done:

- a done cell is never retrained; if only the evaluation settings changed, it is re-evaluated from
  its final checkpoint; if its training config differs, compare stops and says so;
- an interrupted cell (no result.json) is continued by the trainer from its newest checkpoint
  (`resume="auto"`, bitwise on CPU), or evaluated straight away if training had finished.

Measurements per cell:
- validation loss/ppl: mean next-token loss over the first `val_tokens` tokens of the data dir's
  val split (non-overlapping windows of train.seq_len), the same tokens for every cell;
- the validation-loss curve: the trainer's evaluations every train.eval_every steps
  (train.eval_tokens tokens, again the same for every cell), read from metrics.jsonl;
- tokens/s: mean of the trainer's logged window throughputs (evaluation and checkpoint time
  excluded);
- zero-shot tasks (optional): `taperlm.evaluation` scoring on the first `eval_limit` items;
- novelty: `taperlm.analysis.novelty.measure` on the first `novelty_tokens` tokens of a fixed
  text (WikiText-2 test when present, else the val split), in windows of train.seq_len.

`run_one` is a cell as the executor runs it, here or on a worker; the typed result it writes is
`taperlm.compare.results.CellResult`."""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taperlm.analysis.sources import first_tokens, first_val_tokens
from taperlm.checkpoint.store import list_checkpoints
from taperlm.compare.grid import Cell
from taperlm.compare.results import (
    RESULT_FILE,
    CellResult,
    DataOrder,
    NoveltyRecord,
    SessionRecord,
    TaskScore,
    TrainRecord,
    ValRecord,
    ZeroShotRecord,
    append_line,
    read_lines,
    write_record,
)
from taperlm.config import format_differences, load_run_config, to_dict
from taperlm.data import corpus as data_corpus
from taperlm.data.identity import check_run_data
from taperlm.data.tokenizer import load_tokenizer
from taperlm.errors import ConfigError, DataError, UnsafeFileError
from taperlm.evaluation import niah
from taperlm.evaluation.registry import get_task, load_task, needs_haystack
from taperlm.files.io import finite_json, not_a_file, sha256_file
from taperlm.files.outdirs import claim
from taperlm.files.runlock import locked
from taperlm.runtime.device import resolve_device
from taperlm.training.metrics import read_metrics

if TYPE_CHECKING:
    from taperlm.training.loop import StepHook


SESSIONS_FILE = "sessions.jsonl"  # one line per training/evaluation session of a cell


@dataclass
class EvalSettings:
    """How every cell is evaluated (changing these re-evaluates, never retrains)."""

    val_tokens: int | None = None  # None = the whole val split
    eval_tasks: list[str] = field(default_factory=list)
    eval_limit: int | None = None
    eval_data: str | None = None  # folder laid out like ../shared/data
    eval_batch_size: int = 16
    novelty_tokens: int = 2048
    novelty_text: str | None = None  # a text file; None = the val split
    niah_lengths: list[int] | None = None  # NIAH tasks; None = the cell's context_length
    niah_haystack: str | None = None  # the prose of niah_single_2/3 (None: no such task)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("niah_lengths", "niah_haystack"):  # as before they existed: caches stay valid
            if d[key] is None:
                del d[key]
        identity = self.input_identity()
        if identity:
            d[_INPUT_IDENTITY] = identity
        return d

    def input_identity(self) -> dict[str, Any]:
        """What the input files are, by content ([size, sha256]), not where they are: the
        novelty text and every local file of the zero-shot tasks. An edited file re-evaluates
        the cells; the same files reached through another path (a re-install, a moved
        ../shared) do not."""
        identity: dict[str, Any] = {}
        if self.novelty_text:
            with contextlib.suppress(OSError):
                identity["novelty_text"] = _content_identity(self.novelty_text)
        if self.eval_data:
            files = {}
            for name in self.eval_tasks:
                for rel in get_task(name).files:
                    with contextlib.suppress(OSError):
                        files[rel] = _content_identity(Path(self.eval_data) / rel)
            if files:
                identity["eval_data"] = files
        return identity

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvalSettings:
        """The settings `to_dict` wrote (the input identities it adds are not settings)."""
        return cls(**{k: v for k, v in d.items() if k not in _IDENTITY_KEYS})


_INPUT_IDENTITY = "input_identity"
_LEGACY_NOVELTY_IDENTITY = "novelty_text_identity"  # [size, mtime, ctime, digest], path-bound
_IDENTITY_KEYS = (_INPUT_IDENTITY, _LEGACY_NOVELTY_IDENTITY)
_INPUT_PATHS = ("novelty_text", "eval_data")


_DIGESTS: dict[tuple, list[Any]] = {}  # (path, stat) -> [size, sha256]: each file read once


def _content_identity(path: str | Path) -> list[Any]:
    """[size, sha256 of the whole file], remembered while the file's stat is unchanged (every
    cell of a grid asks)."""
    st = os.stat(path)
    memo = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if memo not in _DIGESTS:
        _DIGESTS[memo] = [st.st_size, sha256_file(path)]
    return _DIGESTS[memo]


def evaluation_key(settings: dict[str, Any]) -> dict[str, Any]:
    """The part of a cell's recorded eval settings that decides whether its numbers still hold:
    the settings without the input files' paths, with their content identities (a result
    recorded before identities were by content keeps its novelty text's size and digest)."""
    key = {k: v for k, v in settings.items() if k not in (*_INPUT_PATHS, *_IDENTITY_KEYS)}
    identity = dict(settings.get(_INPUT_IDENTITY) or {})
    legacy = settings.get(_LEGACY_NOVELTY_IDENTITY)
    if legacy and len(legacy) == 4:
        identity["novelty_text"] = [legacy[0], legacy[3]]
    for path_key in _INPUT_PATHS:  # a file given but unreadable: its path is all there is
        if settings.get(path_key) and path_key not in identity:
            identity[path_key] = settings[path_key]
    key[_INPUT_IDENTITY] = identity
    return key


# ----------------------------------------------------------------------------------------------
# shared inputs (computed once per grid)


class SharedInputs:
    """Things every cell uses: the tokenizer, the novelty token ids, loaded zero-shot tasks."""

    def __init__(self, data_dir: Path, settings: EvalSettings) -> None:
        self.data_dir = data_dir
        self.settings = settings
        self._tokenizer = None
        self._novelty_ids: list[int] | None = None
        self._tasks: dict[str, Any] = {}
        self._haystack = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.data_dir)
        return self._tokenizer

    def novelty_ids(self) -> list[int]:
        if self._novelty_ids is None:
            n = self.settings.novelty_tokens
            if self.settings.novelty_text:
                self._novelty_ids = first_tokens(
                    Path(self.settings.novelty_text),
                    self.tokenizer.encode,
                    n,
                    ("--novelty-data", "--novelty-tokens"),
                )
            else:
                self._novelty_ids = first_val_tokens(self.data_dir, n, "--novelty-tokens")
        return self._novelty_ids

    def load(self) -> SharedInputs:
        """Read every input now (the novelty tokens, the task files, the NIAH prose), so that a text too short
        for --novelty-tokens or a malformed task file stops a job before any training."""
        self.novelty_ids()
        for name in self.settings.eval_tasks:
            if get_task(name).reads_docs:
                self.task(name)
            elif needs_haystack(name):
                self._check_haystack()
        return self

    def _check_haystack(self) -> None:
        """The prose must fill the longest --eval-niah-lengths value, before any training.
        (Without the option every cell evaluates at its own context length, checked when the
        cell's items are drawn.)"""
        hay = self.haystack()
        if self.settings.niah_lengths:
            codec = niah.TokenizerCodec(self.tokenizer)
            niah.check_haystack(
                hay, lambda text: len(codec.encode(text)), max(self.settings.niah_lengths)
            )

    def task(self, name: str):
        if name not in self._tasks:
            self._tasks[name] = load_task(
                name, self.settings.eval_data, source="local", limit=self.settings.eval_limit
            )
        return self._tasks[name]

    def haystack(self):
        """The prose of niah_single_2/3 (`taperlm eval`'s default haystack)."""
        if self._haystack is None:
            spec = self.settings.niah_haystack or niah.DEFAULT_HAYSTACK
            self._haystack = niah.load_haystack(spec, self.settings.eval_data, 10**7)
        return self._haystack


def read_result(run_dir: Path) -> CellResult | None:
    """The cell's result.json, or None when it has none or a damaged one (recomputed: the
    write is atomic, so this is rare)."""
    path = run_dir / RESULT_FILE
    if not path.is_file() and not_a_file(path) is None:
        return None
    try:
        return CellResult.read(path)
    except UnsafeFileError:  # not UTF-8, not JSON, too deep, too large, not of this layout
        return None


def _check_saved_config(run_dir: Path, saved: Any, cell: Cell, what: str) -> None:
    """ConfigError unless the config a cell folder holds trains exactly like the cell's."""
    from taperlm.training.run_dir import resume_conflicts  # lazy: torch; compare --help torch-free

    conflicts = resume_conflicts(saved, cell.config)
    if conflicts:
        raise ConfigError(
            f"{run_dir} {what} ("
            + format_differences(conflicts, "saved", "now")
            + "); write this comparison to a fresh --out, or delete that run folder"
        )


def _has_final_checkpoint(run_dir: Path, total_steps: int) -> bool:
    return any(step >= total_steps for step, _ in list_checkpoints(run_dir))


def data_order_fingerprint(cell: Cell, data_dir: Path, steps: int = 1) -> DataOrder:
    """sha256 of the token ids of the first `steps` optimizer steps this cell trains on (the
    trainer's loader with the cell's seed), and the first ids: equal for every allocation of one
    seed, different across seeds."""
    from taperlm.data.loader import TokenBatches  # lazy: torch; compare --help torch-free
    from taperlm.training.settings import accumulation_steps  # lazy: torch

    t = cell.config.train
    batches = TokenBatches(data_dir, "train", t.seq_len, t.micro_batch_size, seed=t.seed)
    h = hashlib.sha256()
    first: list[int] = []
    for _ in range(steps * accumulation_steps(t, 1)):
        x, _y = next(batches)
        h.update(x.numpy().astype("<i8").tobytes())
        if not first:
            first = [int(v) for v in x[0, :16]]
    return DataOrder(steps, h.hexdigest(), first)


def read_curve(run_dir: Path) -> tuple[list[list[float]], list[float]]:
    """([tokens, val_loss] per evaluation, logged tokens/s values) from metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return [], []
    curve, rates = [], []
    for r in read_metrics(path):
        v = r.get("val_loss")
        if isinstance(v, (int, float)) and math.isfinite(v):
            curve.append([float(r["tokens"]), float(v)])
        tps = r.get("tokens_per_s")
        if isinstance(tps, (int, float)) and tps > 0:
            rates.append(float(tps))
    return curve, rates


def _zero_shot(model, shared: SharedInputs, cell: Cell) -> ZeroShotRecord | None:
    from taperlm.evaluation.runner import EvalOptions, evaluate  # lazy: torch-free --help
    from taperlm.evaluation.suite import no_skill_accuracy, paper_row  # lazy: torch-free --help

    if not shared.settings.eval_tasks:
        return None
    context = cell.config.model.context_length
    options = EvalOptions(
        max_length=context,
        batch_size=shared.settings.eval_batch_size,
        device=next(model.parameters()).device,
        limit=shared.settings.eval_limit,
        task_data=shared.task,
        niah_lengths=shared.settings.niah_lengths or [context],
        haystack=shared.haystack,
        progress=False,
    )
    results = evaluate(model, shared.tokenizer, shared.settings.eval_tasks, options).results
    tasks = {k: TaskScore(v.metrics, v.n, v.counts or None) for k, v in results.items()}
    # the accuracy without skill (guessing, or the most frequent answer), to mark results that
    # are at chance level; a needle cannot be guessed (None: no mark)
    chance = {
        k: no_skill_accuracy(shared.task(k)) if get_task(k).reads_docs else None for k in results
    }
    return ZeroShotRecord(paper_row(results), tasks, chance)


@dataclass(frozen=True)
class Evaluation:
    """What evaluating a trained cell measured (its result.json's fields of the same names)."""

    val: ValRecord
    zero_shot: ZeroShotRecord | None
    novelty: NoveltyRecord
    times: dict[str, float]  # seconds: val_s, zero_shot_s, novelty_s


def evaluate_cell(cell: Cell, run_dir: Path, shared: SharedInputs) -> Evaluation:
    """Validation loss, zero-shot tasks and novelty of a trained cell (its final checkpoint)."""
    from taperlm.analysis.novelty import measure  # lazy: torch; compare --help stays torch-free
    from taperlm.checkpoint.loading import load_run_model  # lazy: loads torch models
    from taperlm.training.metrics import validation_loss  # lazy: torch

    # Evaluated where it trained (train.device).
    model, _ = load_run_model(run_dir, device=resolve_device(cell.config.train.device))
    model.eval()
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    t = cell.config.train
    loss, n_tok = validation_loss(
        model, shared.data_dir, t.seq_len, t.micro_batch_size, shared.settings.val_tokens
    )
    times["val_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    zero_shot = _zero_shot(model, shared, cell)
    times["zero_shot_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    nov = measure(
        model,
        shared.novelty_ids(),
        seq_len=min(cell.config.train.seq_len, cell.config.model.context_length),
        name=cell.allocation.label,
    )
    times["novelty_s"] = time.perf_counter() - t0
    return Evaluation(
        val=ValRecord(loss, math.exp(min(loss, 700.0)), n_tok),
        zero_shot=zero_shot,
        novelty=NoveltyRecord.from_json(finite_json(nov.to_dict())),
        times=times,
    )


class CellInterrupted(Exception):
    """A cell stopped early because a stop was requested; its newest checkpoint holds the
    progress (rerunning the comparison continues it)."""

    def __init__(self, cell: str, step: int, total: int) -> None:
        super().__init__(f"{cell} stopped at step {step}/{total} (checkpointed)")
        self.cell, self.step, self.total = cell, step, total


def cell_state(
    cell: Cell, run_dir: Path, settings: dict[str, Any]
) -> tuple[str, CellResult | None]:
    """What a cell needs: ("cached", result) when it is done with these evaluation settings,
    ("evaluate", old result) when only the evaluation settings changed, ("train", None)
    otherwise. ConfigError when its folder holds a run of a different training config, and
    DataError when it was trained on other data (a data dir re-prepared since)."""
    data_dir = Path(cell.config.data.dir)
    why = check_run_data(run_dir, data_dir, ("train", "val")) if data_dir.is_dir() else None
    if why:
        raise DataError(
            f"{run_dir} was trained on other data than {data_dir}: {why}; write this "
            "comparison to a fresh --out, or point --data at the data it was trained on"
        )
    cached = read_result(run_dir)
    if cached is not None:
        _check_saved_config(run_dir, cached.config, cell, "was trained with a different config")
        why = _other_data_order(cell, data_dir, cached.data_order) if data_dir.is_dir() else None
        if why:
            raise DataError(
                f"{run_dir} was trained on other data than {data_dir}: {why}; write this "
                "comparison to a fresh --out, or point --data at the data it was trained on"
            )
        if evaluation_key(cached.eval_settings) == evaluation_key(settings):
            return "cached", cached
        total_steps = cell.config.train.steps
        if _has_final_checkpoint(run_dir, total_steps):
            return "evaluate", cached
    elif (run_dir / "config.yaml").is_file() and list_checkpoints(run_dir):
        saved = load_run_config(run_dir / "config.yaml")
        _check_saved_config(run_dir, saved, cell, "holds checkpoints of a different config")
    return "train", None


def _other_data_order(cell: Cell, data_dir: Path, recorded: DataOrder) -> str | None:
    """Why `data_dir` is not the data a finished cell trained on, by the fingerprint of its
    first batches (`result.json` records it), or None. A kept `result.json` is all a finished
    cell needs, and it holds no other record of its data: without this check a corpus rebuilt
    from other inputs under another folder (the built-in corpus after a documentation package
    update, 2026-12-04) would mix cells of two corpora in one comparison unnoticed."""
    now = data_order_fingerprint(cell, data_dir, recorded.steps)
    if now.sha256 == recorded.sha256:
        return None
    why = (
        f"the first batches of seed {cell.config.train.seed} differ from those its "
        f"{RESULT_FILE} records (token ids {recorded.first_ids[:4]}... then, "
        f"{now.first_ids[:4]}... now)"
    )
    if data_dir.name.startswith("default-"):
        why += (
            " — the built-in corpus is built from the installed Debian documentation packages, "
            "and other versions of them give other data (the latest: "
            f"`{data_corpus.INSTALL_COMMAND}`)"
        )
    return why


def runtime_info(device: str, jobs: int) -> SessionRecord:
    """How this process computes (recorded per cell session: numbers are bit-identical only
    between runs with the same torch version, CPU capability and device)."""
    import torch  # lazy: compare --help stays torch-free

    return SessionRecord(
        threads=torch.get_num_threads(),
        jobs=jobs,
        # processes the cell trains on (--nproc-per-cell: a torchrun-style group sets it)
        processes=int(os.environ.get("WORLD_SIZE", "1")),
        torch=torch.__version__,
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        device=device,
        machine=platform.machine(),
    )


def _log_session(run_dir: Path, phase: str, from_step: int, runtime: SessionRecord) -> None:
    """Append one line to the cell's sessions.jsonl: what ran (training from a step, or the
    evaluation) with which settings."""
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    session = replace(runtime, phase=phase, from_step=from_step, started=started)
    append_line(run_dir / SESSIONS_FILE, session, "sessions file")


def read_sessions(run_dir: Path, total_steps: int) -> list[SessionRecord]:
    """The cell's sessions with `to_step` filled in (where the next training session began, or
    the end) for training sessions; damaged lines left out."""
    path = run_dir / SESSIONS_FILE
    if not path.is_file():
        return []
    out = read_lines(path, "sessions file", SessionRecord.from_json)
    train = [s for s in out if s.phase == "train"]
    for a, b in zip(train, [*train[1:], None]):
        a.to_step = total_steps if b is None else b.from_step
    return out


def run_cell(
    cell: Cell,
    run_dir: Path,
    shared: SharedInputs,
    progress: bool = True,
    on_step: StepHook | None = None,
    on_evaluate: Callable[[], None] | None = None,
    jobs: int = 1,
) -> tuple[CellResult, str]:
    """Bring one cell to done; returns (result, status) with status one of "cached",
    "re-evaluated", "trained" or "resumed". `on_step` goes to the trainer (progress, and
    "stop" to stop at the next step with a checkpoint: CellInterrupted); `on_evaluate` is
    called when the evaluation begins; `jobs` is recorded with the session. The cell's run dir
    is locked throughout (one writer per run dir; the trainer takes the same lock again)."""
    claim(run_dir, "run")  # a cell is a run dir (the trainer checks and keeps the marker)
    with locked(run_dir):
        return _run_cell(cell, run_dir, shared, progress, on_step, on_evaluate, jobs)


def _run_cell(cell, run_dir, shared, progress, on_step, on_evaluate, jobs):
    from taperlm.training.loop import train  # lazy: torch; compare --help stays torch-free

    settings = shared.settings.to_dict()
    state, cached = cell_state(cell, run_dir, settings)
    if state == "cached":
        return cached, "cached"
    total_steps = cell.config.train.steps
    device = resolve_device(cell.config.train.device)
    train_info: TrainRecord
    if state == "evaluate":
        status = "re-evaluated"
        train_info = cached.train
    else:
        before = [s for s, _ in list_checkpoints(run_dir)]
        resumed_from = max(before) if before else 0
        _log_session(run_dir, "train", resumed_from, runtime_info(device, jobs))
        t0 = time.perf_counter()
        res = train(cell.config, run_dir, resume="auto", progress=progress, on_step=on_step)
        wall = time.perf_counter() - t0
        if not res.finished:
            raise CellInterrupted(cell.name, res.step, res.total_steps)
        status = "resumed" if resumed_from else "trained"
        train_info = TrainRecord(
            steps=res.step,
            tokens=res.tokens,
            train_loss=res.train_loss,
            skipped_steps=res.skipped_steps,
            resumed_from_step=resumed_from,
            wall_s=wall,
        )
    if on_evaluate is not None:
        on_evaluate()
    _log_session(run_dir, "evaluate", total_steps, runtime_info(device, jobs))
    curve, rates = read_curve(run_dir)
    train_info = replace(train_info, tokens_per_s=sum(rates) / len(rates) if rates else None)
    ev = evaluate_cell(cell, run_dir, shared)
    result = CellResult(
        cell=cell.name,
        allocation=cell.allocation.name,
        label=cell.allocation.label,
        taper=cell.allocation.spec_string,
        seed=cell.seed,
        config=to_dict(cell.config),
        eval_settings=settings,
        train=train_info,
        curve=curve,
        data_order=data_order_fingerprint(cell, shared.data_dir),
        val=ev.val,
        zero_shot=ev.zero_shot,
        novelty=ev.novelty,
        times=ev.times,
        sessions=read_sessions(run_dir, total_steps),
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    write_record(run_dir / RESULT_FILE, result)
    return result, status


# ----------------------------------------------------------------------------------------------
# when a running cell checkpoints or stops

# A cell asks for a checkpoint when this long has passed since its last one, so that a crash or
# kill loses at most about a minute (a Ctrl-C stops at the next step with a checkpoint).
CHECKPOINT_SECONDS = 60.0


class CheckpointClock:
    """The `on_step` policy of one cell: "stop" once a stop is requested, "checkpoint" when
    CHECKPOINT_SECONDS have passed since the cell's last checkpoint."""

    def __init__(
        self,
        checkpoint_every: int,
        stop: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every, self.stop = checkpoint_every, stop
        self.clock = clock  # seconds; a test passes a fake one
        self.last = clock()

    def __call__(self, step: int, total: int) -> str | None:
        if self.stop():
            return "stop"
        now = self.clock()
        if self.every and step % self.every == 0:
            self.last = now  # the trainer checkpoints this step anyway
        elif now - self.last >= CHECKPOINT_SECONDS and step < total:
            self.last = now
            return "checkpoint"
        return None


def run_one(
    cell: Cell,
    run_dir: Path,
    shared: SharedInputs,
    jobs: int,
    stopping: Callable[[], bool],
    on_step: Callable[[int, int, float], None],
    on_evaluate: Callable[[], None],
) -> tuple[CellResult, str]:
    """One cell as the compare executor runs it, the same code in a worker process and in this
    one (`taperlm.compare.executor`, `taperlm.compare.workers`): `run_cell` with the cell's
    `CheckpointClock`, which stops it at the next step with a checkpoint (CellInterrupted) once
    `stopping()`. `on_step(step, total, loss)` and `on_evaluate()` report progress; `jobs` is
    recorded with the session."""
    clock = CheckpointClock(cell.config.train.checkpoint_every, stopping)

    def step_hook(step: int, total: int, loss: float) -> str | None:
        on_step(step, total, loss)
        return clock(step, total)

    return run_cell(
        cell, run_dir, shared, progress=False, on_step=step_hook, on_evaluate=on_evaluate, jobs=jobs
    )

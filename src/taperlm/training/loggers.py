"""Live metrics in TensorBoard and Weights & Biases (`train.loggers`), beside RUN/metrics.jsonl.

Every record the trainer writes to metrics.jsonl (loss, lr, grad norm, tokens/s, MFU, skipped
steps, val loss/ppl, per-layer gradient norms) also goes to each logger named in
`train.loggers`, as scalars tagged `train/...`, `val/...` and `grad_norm/...` (`TAGS`); at the
start each logger gets the resolved config and the per-layer MLP widths and heads.

Only rank 0 logs. A logger never stops or slows training: rank 0 hands records to a queue and
returns; one background thread starts the loggers (their imports, files, network) and writes to
them. A logger that cannot be imported, fails to start or raises is dropped with a warning; one
that hangs fills the bounded queue, after which records for the loggers are dropped (with one
warning), and closing waits at most `CLOSE_SECONDS` for it. metrics.jsonl always has every value.

A resumed run continues the same logged run: TensorBoard writes to the same RUN/tensorboard
folder with `purge_step` at the first redone step (so a viewer discards what the crashed session
logged after the checkpoint); W&B resumes the run whose id RUN/loggers.json holds and is sent
only steps after the last one it received, so no step appears twice (the redone steps are
bitwise the same on CPU; elsewhere equal up to floating-point reordering).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import queue
import re
import secrets
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from taperlm.config import to_dict
from taperlm.errors import TrainingWarning, UnsafeFileError
from taperlm.files.io import MAX_RECORD_BYTES, atomic_write_json, read_json

# The package each logger needs and the extra that installs it.
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}
STATE_FILE = "loggers.json"  # the W&B run id and the last step it received
TB_DIR = "tensorboard"
QUEUE_RECORDS = 10_000  # records waiting for a slow logger before they are dropped
CLOSE_SECONDS = 30.0  # how long the end of a run waits for the loggers to finish

# metrics.jsonl key -> logger tag; a list value is one tag per layer (`grad_norm/layer_00`).
TAGS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "tokens_per_s": "train/tokens_per_s",
    "mfu": "train/mfu",
    "skipped_steps": "train/skipped_steps",
    "tokens": "train/tokens",
    "val_loss": "val/loss",
    "val_ppl": "val/ppl",
    "layer_grad_norm": "grad_norm/layer",
    "layer_mlp_grad_norm": "grad_norm/mlp",
}
_LAYER = re.compile(r"(?:^|\.)blocks\.(\d+)\.(mlp\.)?")
_STOP = object()


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The logger tags and values of one metrics record (step excluded; None and non-numbers,
    e.g. MFU on CPU, left out)."""
    out: dict[str, float] = {}

    def put(tag: str, value: Any) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[tag] = float(value)

    for key, value in record.items():
        if key == "step":
            continue
        tag = TAGS.get(key, f"train/{key}")
        if isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                put(f"{tag}_{i:02d}", v)
        else:
            put(tag, value)
    return out


def layer_table(model: Any) -> list[dict[str, int]]:
    """Per layer: its MLP width and attention query / KV heads (of a resolved ModelConfig)."""
    rows = []
    for i in range(model.n_layers):
        q, kv = model.attention_heads(i)
        width = model.mlp_widths[i] if model.mlp_widths else model.mlp_width
        rows.append({"layer": i, "mlp_width": int(width), "heads": int(q), "kv_heads": int(kv)})
    return rows


def layer_grad_norms(
    named_params: Iterable[tuple[str, torch.Tensor]], n_layers: int, sharded: bool
) -> dict[str, list[float]]:
    """L2 norm of the gradients of each block (`layer_grad_norm`) and of its MLP alone
    (`layer_mlp_grad_norm`), before clipping. `sharded` (FSDP2): every rank holds a shard of each
    gradient, so the squared norms are summed across ranks (collective: call on every rank)."""
    sq = torch.zeros(2, n_layers, dtype=torch.float64)
    grads, layers, mlp = [], [], []
    for name, p in named_params:
        m = _LAYER.search(name)
        if p.grad is None or m is None or int(m.group(1)) >= n_layers:
            continue
        g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        grads.append(g)
        layers.append(int(m.group(1)))
        mlp.append(m.group(2) is not None)
    if grads:
        device = grads[0].device
        norms = torch.stack([torch.linalg.vector_norm(g.float()).to(device) for g in grads])
        squares = (norms.double() ** 2).cpu()
        index = torch.tensor(layers)
        sq[0].index_add_(0, index, squares)
        keep = torch.tensor(mlp)
        sq[1].index_add_(0, index[keep], squares[keep])
    if sharded and torch.distributed.is_initialized():
        backend = torch.distributed.get_backend()
        on = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else "cpu"
        total = sq.to(on)
        torch.distributed.all_reduce(total)
        sq = total.cpu()
    norms = sq.sqrt()
    return {"layer_grad_norm": norms[0].tolist(), "layer_mlp_grad_norm": norms[1].tolist()}


# ----------------------------------------------------------------------------------------------
# the loggers


@dataclass
class RunInfo:
    """What a logger is told at its start."""

    run_dir: Path
    name: str  # the logged run's name (train.log_name, else the run dir's name)
    group: str | None
    project: str
    config: dict[str, Any]  # the resolved run config
    layers: list[dict[str, int]]
    start_step: int  # the step the run (re)starts from
    notify: Callable[[str], None] = print  # a note for the user (warned from the main thread)


def read_state(run_dir: Path) -> dict[str, Any]:
    """RUN/loggers.json ({} when absent or unreadable: a new logged run is started)."""
    try:
        data = read_json(run_dir / STATE_FILE, MAX_RECORD_BYTES, "logger state")
    except (OSError, UnsafeFileError):
        return {}
    return data if isinstance(data, dict) else {}


class TensorBoardLogger:
    """Scalars and the start-up text in RUN/tensorboard (`tensorboard --logdir RUN`)."""

    def __init__(self, info: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter  # lazy: needs the [tensorboard] extra

        # A restart redoes the steps after its checkpoint: a viewer drops events of a crashed
        # session from purge_step on.
        self.writer = SummaryWriter(str(info.run_dir / TB_DIR), purge_step=info.start_step + 1)
        config = yaml.safe_dump(info.config, sort_keys=False, width=100)
        self.writer.add_text("config", _indent(config), info.start_step)
        rows = ["| layer | MLP width | heads | KV heads |", "|---|---|---|---|"]
        rows += [
            f"| {r['layer']} | {r['mlp_width']} | {r['heads']} | {r['kv_heads']} |"
            for r in info.layers
        ]
        self.writer.add_text("layers", "\n".join(rows), info.start_step)

    def log(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """One W&B run per run dir: its id in RUN/loggers.json, resumed by a restarted run. Without
    W&B credentials (and no WANDB_MODE) it logs offline, for `wandb sync` later."""

    def __init__(self, info: RunInfo) -> None:
        import wandb

        self.state_path = info.run_dir / STATE_FILE
        state = read_state(info.run_dir).get("wandb") or {}
        run_id = state.get("id") or secrets.token_hex(6)
        self.last_step = int(state.get("last_step", 0)) if state.get("id") else 0
        self.resumed_last = self.last_step  # steps up to here were sent before a restart
        self.run_id = run_id
        self._save()  # before init: a crash during it still resumes this id
        mode = None
        chosen = os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun")
        if not chosen and _no_credentials(wandb):
            mode = "offline"
            info.notify(
                "no W&B credentials (`wandb login` or WANDB_API_KEY): logging to W&B offline "
                f"into {os.environ.get('WANDB_DIR') or info.run_dir}/wandb; upload it later "
                "with `wandb sync`"
            )
        self.run = wandb.init(
            project=info.project,
            name=info.name,
            group=info.group,
            id=run_id,
            resume="allow",
            dir=os.environ.get("WANDB_DIR") or str(info.run_dir),  # wandb caches it otherwise
            config={**info.config, "layers": info.layers},
            allow_val_change=True,  # runtime settings may change on resume
            mode=mode,
            reinit="create_new",
            settings=wandb.Settings(console="off"),  # leave stdout/stderr and the bar alone
        )
        self._saved = self.last_step

    def log(self, step: int, values: dict[str, float]) -> None:
        if step <= self.resumed_last:
            return  # W&B already has this step from the session before the restart
        self.run.log(values, step=step)
        self.last_step = max(self.last_step, step)

    def flush(self) -> None:
        if self.last_step != self._saved:
            self._save()

    def close(self) -> None:
        self.run.finish()
        self.flush()

    def _save(self) -> None:
        state = read_state(self.state_path.parent)
        state["wandb"] = {"id": self.run_id, "last_step": self.last_step}
        atomic_write_json(self.state_path, state)
        self._saved = self.last_step


def _no_credentials(wandb: Any) -> bool:
    """True when W&B has no API key (so wandb.init would prompt or fail); never a network call."""
    try:
        return not wandb.login(prompt=False, verify=False)
    except TypeError:  # an older wandb without `prompt`: let wandb.init decide
        return False


BACKENDS: dict[str, Any] = {"tensorboard": TensorBoardLogger, "wandb": WandbLogger}


class Loggers:
    """The loggers of one process (none on ranks other than 0): `log` queues a metrics record
    and returns at once; `close` finishes them (waiting at most CLOSE_SECONDS)."""

    def __init__(self, names: list[str], info: RunInfo | None) -> None:
        self.names = list(dict.fromkeys(names))  # once each, in order
        self._problems: list[str] = []
        self._lock = threading.Lock()
        self._dropping = False
        self._tokens_step = -1
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_RECORDS)
        self._thread: threading.Thread | None = None
        if not self.names or info is None:
            self.names = []
            return
        for name in list(self.names):
            if importlib.util.find_spec(PACKAGES[name]) is None:
                _warn(
                    f"train.loggers: {name} is not installed (pip install 'taperlm[{name}]'); "
                    "training goes on without it (metrics.jsonl has every value)"
                )
                self.names.remove(name)
        if self.names:
            self._thread = threading.Thread(
                target=self._work, args=(info,), name="taperlm-loggers", daemon=True
            )
            self._thread.start()

    @classmethod
    def open(cls, run: Any, out: Path, is_main: bool, start_step: int) -> Loggers:
        """The loggers `run.train.loggers` names, on rank 0 (`is_main`); nothing elsewhere."""
        t = run.train
        if not (is_main and t.loggers):
            return cls([], None)
        info = RunInfo(
            run_dir=Path(out),
            name=t.log_name or Path(out).resolve().name,
            group=t.log_group or None,
            project=t.log_project,
            config=to_dict(run),
            layers=layer_table(run.model),
            start_step=start_step,
        )
        return cls(list(t.loggers), info)

    def log(self, record: dict[str, Any]) -> None:
        """Queue one metrics record for the loggers (never blocks)."""
        self._warn_problems()
        if self._thread is None:
            return
        step, values = int(record["step"]), scalars(record)
        if values.pop("train/tokens", None) is not None and step != self._tokens_step:
            values["train/tokens"] = float(record["tokens"])  # once per step, not per record
            self._tokens_step = step
        try:
            self._queue.put_nowait((step, values))
        except queue.Full:
            if not self._dropping:
                self._dropping = True
                _warn(
                    f"the {' and '.join(self.names)} logger(s) are not keeping up (waiting on the "
                    "network?); their records are dropped until they catch up (metrics.jsonl has "
                    "every value)"
                )
        else:
            self._dropping = False

    def close(self) -> None:
        """Let the loggers write what is queued and finish, waiting at most CLOSE_SECONDS."""
        thread, self._thread = self._thread, None
        if thread is not None:
            with contextlib.suppress(queue.Full):  # a hung logger: join times out below
                self._queue.put(_STOP, timeout=1.0)
            thread.join(CLOSE_SECONDS)
            if thread.is_alive():
                _warn(
                    f"the {' and '.join(self.names)} logger(s) did not finish within "
                    f"{CLOSE_SECONDS:.0f} s; their last records may be missing there "
                    "(metrics.jsonl has every value)"
                )
        self._warn_problems()

    # -- the background thread -------------------------------------------------------------

    def _work(self, info: RunInfo) -> None:
        info.notify = self._note
        live = []
        for name in self.names:
            try:
                live.append((name, BACKENDS[name](info)))
            except Exception as err:
                self._problem(f"the {name} logger could not start ({_describe(err)})")
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            step, values = item
            for entry in list(live):
                try:
                    entry[1].log(step, values)
                except Exception as err:
                    self._problem(f"the {entry[0]} logger failed at step {step} ({_describe(err)})")
                    live.remove(entry)
                    _close_quietly(entry[1])
            if self._queue.empty():  # a lull: make what was logged visible
                for entry in list(live):
                    try:
                        entry[1].flush()
                    except Exception as err:
                        self._problem(f"the {entry[0]} logger could not write ({_describe(err)})")
                        live.remove(entry)
                        _close_quietly(entry[1])
        for name, backend in live:
            try:
                backend.close()
            except Exception as err:
                self._problem(f"the {name} logger could not finish ({_describe(err)})")

    def _problem(self, text: str) -> None:
        self._note(f"{text}; training goes on without it (metrics.jsonl has every value)")

    def _note(self, text: str) -> None:
        with self._lock:
            self._problems.append(text)

    def _warn_problems(self) -> None:
        """Warnings from the main thread (where the caller's warning filters apply)."""
        if not self._problems:
            return
        with self._lock:
            problems, self._problems = self._problems, []
        for text in problems:
            _warn(text)


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".rstrip(": ")


def _close_quietly(backend: Any) -> None:
    with contextlib.suppress(Exception):  # already reported as failed
        backend.close()


def _indent(text: str) -> str:
    """Markdown code block (TensorBoard renders text as markdown)."""
    return "\n".join("    " + line for line in text.splitlines())


def _warn(message: str) -> None:
    warnings.warn(message, TrainingWarning, stacklevel=3)

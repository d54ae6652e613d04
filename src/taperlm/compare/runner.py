"""Train, evaluate and measure every cell of a comparison grid in-process, resumably.

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
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from taperlm.compare.grid import Cell, Grid
from taperlm.config import to_dict
from taperlm.device import resolve_device
from taperlm.errors import ConfigError, DataError
from taperlm.io import atomic_write_json, finite_json

RESULT_FILE = "result.json"
RESULT_VERSION = 1


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from taperlm.data.tokenizer import load_tokenizer

            self._tokenizer = load_tokenizer(self.data_dir)
        return self._tokenizer

    def novelty_ids(self) -> list[int]:
        if self._novelty_ids is None:
            n = self.settings.novelty_tokens
            if self.settings.novelty_text:
                from taperlm.analysis.sources import first_tokens

                self._novelty_ids = first_tokens(
                    Path(self.settings.novelty_text), self.tokenizer.encode, n
                )
            else:
                from taperlm.data.loader import open_split

                _, tokens = open_split(self.data_dir, "val")
                if len(tokens) < n:
                    raise DataError(
                        f"the val split of {self.data_dir} has {len(tokens)} tokens, fewer than "
                        f"--novelty-tokens {n}; lower it"
                    )
                self._novelty_ids = [int(t) for t in tokens[:n]]
        return self._novelty_ids

    def task(self, name: str):
        if name not in self._tasks:
            from taperlm.evaluation.tasks import load_task

            self._tasks[name] = load_task(
                name, self.settings.eval_data, source="local", limit=self.settings.eval_limit
            )
        return self._tasks[name]


# ----------------------------------------------------------------------------------------------
# one cell


def read_result(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / RESULT_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return None  # a damaged result is recomputed (write is atomic, so this is rare)
    return data if isinstance(data, dict) and data.get("version") == RESULT_VERSION else None


def _check_saved_config(run_dir: Path, saved: Any, cell: Cell, what: str) -> None:
    """ConfigError unless the config a cell folder holds trains exactly like the cell's."""
    from taperlm.training.checkpoint import format_differences
    from taperlm.training.loop import resume_conflicts

    conflicts = resume_conflicts(saved, cell.config)
    if conflicts:
        raise ConfigError(
            f"{run_dir} {what} ("
            + format_differences(conflicts, "saved", "now")
            + "); write this comparison to a fresh --out, or delete that run folder"
        )


def _has_final_checkpoint(run_dir: Path, total_steps: int) -> bool:
    from taperlm.training.checkpoint import list_checkpoints

    return any(step >= total_steps for step, _ in list_checkpoints(run_dir))


def data_order_fingerprint(cell: Cell, data_dir: Path, steps: int = 1) -> dict[str, Any]:
    """sha256 of the token ids of the first `steps` optimizer steps this cell trains on (the
    trainer's loader with the cell's seed), and the first ids: equal for every allocation of one
    seed, different across seeds."""
    from taperlm.data.loader import TokenBatches
    from taperlm.training.loop import accumulation_steps

    t = cell.config.train
    batches = TokenBatches(data_dir, "train", t.seq_len, t.micro_batch_size, seed=t.seed)
    h = hashlib.sha256()
    first: list[int] = []
    for _ in range(steps * accumulation_steps(t, 1)):
        x, _y = next(batches)
        h.update(x.numpy().astype("<i8").tobytes())
        if not first:
            first = [int(v) for v in x[0, :16]]
    return {"steps": steps, "sha256": h.hexdigest(), "first_ids": first}


def read_curve(run_dir: Path) -> tuple[list[list[float]], list[float]]:
    """([tokens, val_loss] per evaluation, logged tokens/s values) from metrics.jsonl."""
    from taperlm.training.metrics import read_metrics

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


def _zero_shot(model, shared: SharedInputs, cell: Cell) -> dict[str, Any]:
    from taperlm.evaluation.scoring import Scorer
    from taperlm.evaluation.suite import paper_row, run_task

    if not shared.settings.eval_tasks:
        return {}
    scorer = Scorer(
        model,
        shared.tokenizer,
        max_length=cell.config.model.context_length,
        batch_size=shared.settings.eval_batch_size,
        device=next(model.parameters()).device,
        progress=False,
    )
    results = {name: run_task(scorer, shared.task(name)) for name in shared.settings.eval_tasks}
    return {
        "paper_row": paper_row(results),
        "tasks": {k: {"metrics": v.metrics, "n": v.n} for k, v in results.items()},
    }


def evaluate_cell(cell: Cell, run_dir: Path, shared: SharedInputs) -> dict[str, Any]:
    """Validation loss, zero-shot tasks and novelty of a trained cell (its final checkpoint)."""
    from taperlm.analysis.novelty import measure
    from taperlm.training.checkpoint import load_run_model
    from taperlm.training.validation import validation_loss

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
    return {
        "val": {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "tokens": n_tok},
        "zero_shot": zero_shot,
        "novelty": finite_json(nov.to_dict()),
        "times": times,
    }


def run_cell(
    cell: Cell, run_dir: Path, shared: SharedInputs, progress: bool = True
) -> tuple[dict[str, Any], str]:
    """Bring one cell to done; returns (result, status) with status one of "cached",
    "re-evaluated", "trained" or "resumed"."""
    from taperlm.config import load_run_config
    from taperlm.training.checkpoint import list_checkpoints
    from taperlm.training.loop import train

    cfg_now = to_dict(cell.config)
    settings = shared.settings.to_dict()
    total_steps = cell.config.train.tokens // cell.config.train.batch_tokens
    cached = read_result(run_dir)
    if cached is not None:
        _check_saved_config(run_dir, cached["config"], cell, "was trained with a different config")
        if cached.get("eval_settings") == settings:
            return cached, "cached"
    elif (run_dir / "config.yaml").is_file() and list_checkpoints(run_dir):
        saved = load_run_config(run_dir / "config.yaml")
        _check_saved_config(run_dir, saved, cell, "holds checkpoints of a different config")

    train_info: dict[str, Any]
    if cached is not None and _has_final_checkpoint(run_dir, total_steps):
        status = "re-evaluated"
        train_info = cached["train"]
    else:
        before = [s for s, _ in list_checkpoints(run_dir)]
        resumed_from = max(before) if before else 0
        t0 = time.perf_counter()
        res = train(cell.config, run_dir, resume="auto", progress=progress)
        wall = time.perf_counter() - t0
        if not res.finished:
            raise ConfigError(f"{run_dir}: training stopped at step {res.step}/{res.total_steps}")
        status = "resumed" if resumed_from else "trained"
        train_info = {
            "steps": res.step,
            "tokens": res.tokens,
            "train_loss": res.train_loss,
            "skipped_steps": res.skipped_steps,
            "resumed_from_step": resumed_from,
            "wall_s": wall,
        }
    curve, rates = read_curve(run_dir)
    train_info["tokens_per_s"] = sum(rates) / len(rates) if rates else None
    ev = evaluate_cell(cell, run_dir, shared)
    result = {
        "version": RESULT_VERSION,
        "cell": cell.name,
        "allocation": cell.allocation.name,
        "label": cell.allocation.label,
        "taper": cell.allocation.spec_string,
        "seed": cell.seed,
        "config": cfg_now,
        "eval_settings": settings,
        "train": train_info,
        "curve": curve,
        "data_order": data_order_fingerprint(cell, shared.data_dir),
        **ev,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_json(run_dir / RESULT_FILE, result)
    return result, status


# ----------------------------------------------------------------------------------------------
# the grid


def run_grid(
    grid: Grid,
    out_dir: Path,
    data_dir: Path,
    settings: EvalSettings,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    on_seed_done: Callable[[dict[str, dict[str, Any]]], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run every cell (resuming/caching as described above); cell name -> result.
    `on_seed_done(results so far)` is called whenever the last cell of a seed finishes (not after
    the final cell), e.g. to write a partial report."""
    from tqdm.auto import tqdm

    runs = out_dir / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    shared = SharedInputs(data_dir, settings)
    done_tokens = sum(
        c.config.train.tokens for c in grid.cells if read_result(runs / c.name) is not None
    )
    bar = tqdm(
        total=grid.total_tokens,
        initial=done_tokens,
        unit="tok",
        unit_scale=True,
        desc="grid",
        dynamic_ncols=True,
        disable=not progress,
        position=0,
    )
    write = log or (lambda msg: tqdm.write(msg, file=sys.stderr))
    results: dict[str, dict[str, Any]] = {}
    n = len(grid.cells)
    done_before = done_tokens
    t_start = time.perf_counter()
    try:
        for i, cell in enumerate(grid.cells, 1):
            bar.set_description(f"grid {i}/{n} {cell.name}")
            was_done = read_result(runs / cell.name) is not None
            result, status = run_cell(cell, runs / cell.name, shared, progress=progress)
            results[cell.name] = result
            if not was_done:
                bar.update(cell.config.train.tokens)
                done_tokens += cell.config.train.tokens
            elapsed = time.perf_counter() - t_start
            rate = result["train"].get("tokens_per_s") or 0.0
            write(
                f"[{i}/{n}] {cell.name}: {status}; val loss {result['val']['loss']:.4f} "
                f"(ppl {result['val']['ppl']:.2f}), {rate:,.0f} tok/s, "
                f"rho_mlp r={_fmt(result['novelty'].get('pearson_mlp'))}; "
                f"grid {done_tokens:,}/{grid.total_tokens:,} tokens, {elapsed:.0f} s elapsed"
                + _eta(done_tokens - done_before, grid.total_tokens - done_tokens, elapsed)
            )
            seed_cells = [c.name for c in grid.cells if c.seed == cell.seed]
            if (
                on_seed_done is not None
                and status != "cached"
                and i < n
                and all(name in results for name in seed_cells)
            ):
                on_seed_done(dict(results))
    finally:
        bar.close()
    return results


def _eta(done_now: int, left: int, elapsed: float) -> str:
    if done_now <= 0 or left <= 0:
        return ""
    return f", ETA {left * elapsed / done_now / 60:.1f} min"


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f}"

"""The one evaluation runner: `evaluate(model, tokenizer, tasks, options)` scores each task by
its kind in the registry (`taperlm.evaluation.registry`) — the run's validation perplexity,
a zero-shot task's docs, or an S-NIAH task at each length — for `taperlm eval`, compare's
per-cell evaluation and the suite alike. The NIAH prose is loaded only for the tasks that hide
their needle in it (`needs_haystack`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taperlm.evaluation import niah, suite
from taperlm.evaluation.record import SkippedTask, Task
from taperlm.evaluation.registry import TaskData, get_task, load_task, needs_haystack
from taperlm.evaluation.scoring import Scorer
from taperlm.evaluation.suite import TaskResult


@dataclass(frozen=True)
class EvalOptions:
    """How the tasks are evaluated.

    max_length / batch_size / device / dtype: the scorer's window, batch, device and autocast
    dtype (None: the model's own precision); NIAH generates with the same batch, device, dtype.
    limit: the first N items per task (val: N windows; NIAH: per length).
    data_dir / source: where zero-shot docs come from (`load_task`), unless `task_data` gives
        them (compare reads each task once for every cell).
    niah_lengths / niah_extrapolate: the S-NIAH lengths, and whether lengths beyond the model's
        context are evaluated (else skipped with a note).
    haystack: loads the prose of niah_single_2/3 (called only when such a task runs).
    val_tokens: (token ids, source) of the `val` task; raises SkippedTask when there are none.
    keep_items / progress: per-item records in the results; progress bars.
    """

    max_length: int
    batch_size: int = 16
    device: Any = "cpu"
    dtype: Any = None
    limit: int | None = None
    data_dir: str | Path | None = None
    source: str = "local"
    task_data: Callable[[str], TaskData] | None = None
    niah_lengths: Sequence[int] = niah.DEFAULT_LENGTHS
    niah_extrapolate: bool = False
    haystack: Callable[[], niah.Haystack] | None = None
    val_tokens: Callable[[], tuple[Any, str]] | None = None
    keep_items: bool = False
    progress: bool = True


@dataclass
class Evaluation:
    """The results by task, in the order asked, and notes on what was skipped and why."""

    results: dict[str, TaskResult] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def evaluate(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[str],
    options: EvalOptions,
    on_result: Callable[[TaskResult], None] | None = None,
) -> Evaluation:
    """Every task of `tasks` on `model`; `on_result` sees each result as it is done (its
    `seconds` the task's whole wall time, reading its data included)."""
    scorer = Scorer(
        model,
        tokenizer,
        options.max_length,
        batch_size=options.batch_size,
        device=options.device,
        progress=options.progress,
        dtype=options.dtype,
    )
    out = Evaluation()
    for name in tasks:
        t0 = time.perf_counter()
        try:
            res = _run(get_task(name), scorer, options, out.notes)
        except SkippedTask as skip:
            out.notes.append(str(skip))
            continue
        res.seconds = time.perf_counter() - t0
        out.results[name] = res
        if on_result is not None:
            on_result(res)
    return out


def _run(task: Task, scorer: Scorer, options: EvalOptions, notes: list[str]) -> TaskResult:
    """One task, by its kind."""
    if task.kind == "perplexity":
        if options.val_tokens is None:
            raise SkippedTask(f"{task.name} skipped: no validation tokens")
        tokens, source = options.val_tokens()
        return suite.run_val(scorer, tokens, options.limit, source)
    if task.kind == "niah":
        return _run_niah(task.name, scorer, options, notes)
    if options.task_data is not None:
        data = options.task_data(task.name)
    else:
        data = load_task(task.name, options.data_dir, source=options.source, limit=options.limit)
    return suite.run_task(scorer, data, keep_items=options.keep_items)


def _run_niah(name: str, scorer: Scorer, options: EvalOptions, notes: list[str]) -> TaskResult:
    """One S-NIAH task at the options' lengths with the scorer's model, tokenizer, device and
    dtype; its skipped lengths and haystack notes are added to `notes`."""
    prose = needs_haystack(name) and options.haystack is not None
    haystack = options.haystack() if prose else None  # type: ignore[misc]
    res = suite.run_niah(
        scorer.model,
        scorer.tok,
        name,
        options.niah_lengths,
        haystack=haystack,
        limit=options.limit,
        extrapolate=options.niah_extrapolate,
        batch_size=options.batch_size,
        device=str(scorer.device),
        dtype=scorer.dtype,
        keep_items=options.keep_items,
        progress=options.progress,
    )
    notes += [f"{name} @ {n} skipped: {why}" for n, why in res.settings["skipped_lengths"].items()]
    notes += res.settings["notes"]
    return res

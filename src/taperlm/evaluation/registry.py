"""Every evaluation task, one `Task` record each (`taperlm.evaluation.record`), in the paper's
order: the run's validation perplexity, the zero-shot suite (`taperlm.evaluation.tasks`) and
RULER's S-NIAH tasks (`taperlm.evaluation.niah`). Adding a task is one record and
`register_task(TASK)`; the `--tasks` choices and groups, the paper's table and the files
`auto` looks for all follow from the registry. `load_task` reads a task's docs.

No torch import; `datasets` is imported only for `source="hf"`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taperlm.errors import DataError
from taperlm.evaluation import niah
from taperlm.evaluation.record import Column, Item, Task
from taperlm.evaluation.tasks import ZERO_SHOT
from taperlm.files.io import sha256_file

TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    """Add a task (ValueError if its name is taken)."""
    if task.name in TASKS:
        raise ValueError(f"evaluation task {task.name!r} is already registered")
    TASKS[task.name] = task
    return task


VAL = Task("val", "perplexity", groups=("paper",))
NIAH = tuple(
    Task(name, "niah", columns=(Column(label, "string_match_all", 100.0),), groups=("niah",))
    for name, label in zip(niah.TASKS, ("S-NIAH-1", "S-NIAH-2", "S-NIAH-3"))
)
for _task in (VAL, *ZERO_SHOT, *NIAH):  # the registry, in the paper's order
    register_task(_task)


def get_task(name: str) -> Task:
    """The task called `name`; DataError listing the known ones otherwise."""
    try:
        return TASKS[name]
    except (KeyError, TypeError):
        raise DataError(f"unknown task {name!r}; choose from {', '.join(TASKS)}") from None


def task_names(group: str | None = None) -> list[str]:
    """Every registered task's name (`all`), or those of one `--tasks` group, in order."""
    return [t.name for t in TASKS.values() if group is None or group in t.groups]


def zero_shot_tasks() -> list[str]:
    """The paper's zero-shot suite: its tasks scored from docs (not val, not NIAH)."""
    return [t.name for t in TASKS.values() if t.reads_docs and "paper" in t.groups]


def needs_haystack(name: str) -> bool:
    """Whether task `name` hides its needle in prose (niah_single_2/3; niah_single_1 repeats
    one line and needs none)."""
    return get_task(name).kind == "niah" and niah.SPECS[name].haystack == "essay"


@dataclass
class TaskData:
    name: str
    kind: str  # multiple_choice | loglikelihood | rolling
    docs: list[dict[str, Any]]
    source: str  # "local" or "hf"
    files: list[dict[str, str]] = field(default_factory=list)  # [{path, sha256}] or [{dataset..}]

    def items(self) -> list[Item]:
        to_item = get_task(self.name).to_item
        assert to_item is not None
        return [to_item(d) for d in self.docs]


def has_local_files(name: str, data_dir: str | Path | None) -> bool:
    """Whether every local file of task `name` is in `data_dir`."""
    files = get_task(name).files
    return data_dir is not None and all((Path(data_dir) / f).is_file() for f in files)


def load_task(
    name: str,
    data_dir: str | Path | None = None,
    source: str = "local",
    limit: int | None = None,
) -> TaskData:
    """Read task `name` as normalized docs from `data_dir` (source="local") or the Hub ("hf")."""
    task = TASKS.get(name)
    if task is None or not task.reads_docs:
        doc_tasks = [t.name for t in TASKS.values() if t.reads_docs]
        raise DataError(f"unknown task {name!r}; choose from val, {', '.join(doc_tasks)}")
    if source == "local":
        if data_dir is None:
            raise DataError(
                f"{name}: no evaluation data dir; pass --data-dir DIR or set TAPERLM_EVAL_DATA"
            )
        paths = [Path(data_dir) / f for f in task.files]
        docs = task.read(paths)  # type: ignore[misc]
        files = [{"path": str(p.resolve()), "sha256": sha256_file(p)} for p in paths]
    elif source == "hf":
        docs, files = _hub_docs(task, limit)
    else:
        raise DataError(f"unknown --source {source!r}; choose local or hf")
    if limit is not None:
        docs = docs[:limit]
    return TaskData(name=name, kind=task.kind, docs=docs, source=source, files=files)


def _hub_docs(task: Task, limit: int | None) -> tuple[list[dict], list[dict[str, str]]]:
    """The task's Hub dataset as normalized docs (the first `limit` rows), and its identity."""
    if task.hub is None or task.hub_doc is None:
        raise DataError(f"{task.name}: no Hugging Face source; use --source local")
    try:
        import datasets
    except ImportError:
        raise DataError(
            "--source hf needs the `datasets` package: pip install 'taperlm[hf]'"
        ) from None
    path, config, split = task.hub.dataset, task.hub.config, task.hub.split
    try:
        ds = datasets.load_dataset(path, config, split=split)
    except Exception as err:  # network, missing cache, removed dataset
        raise DataError(
            f"{task.name}: could not load Hugging Face dataset {path} ({config}, {split}): {err}. "
            "Check the connection or use the local files (--source local --data-dir DIR)"
        ) from None
    rows = ds if limit is None else ds.select(range(min(limit, len(ds))))
    docs = [task.hub_doc(dict(r)) for r in rows]
    return docs, [{"dataset": path, "config": str(config), "split": split}]

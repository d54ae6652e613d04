"""What one evaluation task is: the `Task` record (its kind, local files and reader, Hub source
and row mapping, prompt, paper-table columns) and the log-likelihood `Item` a doc becomes.

A new task is one `Task` (plus its reader) given to
`taperlm.evaluation.registry.register_task`; `taperlm eval`, `compare` and the suite read
everything else from the record. No torch import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# How a task is scored (`taperlm.evaluation.runner` dispatches on it):
# perplexity      the run's own validation shard (`val`), next-token loss in windows
# rolling         log-likelihood of whole documents in rolling windows (wikitext)
# loglikelihood   one continuation per doc, its log-likelihood and greedy match (LAMBADA)
# multiple_choice one continuation per choice, the most likely one wins (acc, acc_norm)
# niah            greedy generation at each length, string match (RULER S-NIAH)
KINDS = ("perplexity", "rolling", "loglikelihood", "multiple_choice", "niah")
# The kinds scored from docs read by the task's reader (or its Hub source).
DOC_KINDS = ("rolling", "loglikelihood", "multiple_choice")


@dataclass(frozen=True)
class Column:
    """One column of the paper's table: `metric` of the task times `scale` (100: percent);
    `average` columns make up its Avg. A NIAH task's column is its label plus each length."""

    label: str
    metric: str
    scale: float = 1.0
    average: bool = False


@dataclass(frozen=True)
class HubSource:
    """The Hugging Face dataset, config and split lm-eval evaluates (its test split, else
    validation)."""

    dataset: str
    config: str | None
    split: str


@dataclass
class Item:
    """One evaluation example as log-likelihood requests.

    requests: (context, continuation) pairs, one per choice (multiple choice) or one (LAMBADA).
    gold: index of the correct request.
    choices: lm-eval's doc_to_choice strings, whose lengths normalise acc_norm.
    text / words / bytes: rolling tasks (wikitext) — the string scored and the counts of the
        original page that word/byte perplexity divide by.
    """

    requests: list[tuple[str, str]] = field(default_factory=list)
    gold: int = 0
    choices: list[str] | None = None
    text: str | None = None
    words: int = 0
    bytes: int = 0


class SkippedTask(Exception):
    """A task that cannot run here (the message, a note, says why); the others still run."""


# A doc's prompt as lm-eval builds it: (context, choices, gold index).
Prompt = Callable[[dict[str, Any]], tuple[str, list[str], int]]


@dataclass(frozen=True)
class Task:
    """One evaluation task.

    name: the `--tasks` name (and the key of its results).
    kind: one of KINDS.
    files: local file(s), relative to the evaluation data dir (laid out like ../shared/data).
    read: the local reader: those paths -> normalized docs (DataError naming file and line).
    hub / hub_doc: the Hub dataset and its row -> the same normalized doc (`--source hf`).
    to_item: a normalized doc -> the requests lm-eval would issue (`choice_item(prompt)` for a
        plain multiple-choice prompt).
    columns: its columns in the paper's table, in order.
    groups: the `--tasks` groups it belongs to ("paper": the paper's suite and `auto`,
        "niah": RULER's S-NIAH tasks); every task is in `all`.
    """

    name: str
    kind: str
    files: tuple[str, ...] = ()
    read: Callable[[list[Path]], list[dict[str, Any]]] | None = None
    hub: HubSource | None = None
    hub_doc: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    to_item: Callable[[dict[str, Any]], Item] | None = None
    columns: tuple[Column, ...] = ()
    groups: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"task {self.name!r}: kind {self.kind!r} is not one of {KINDS}")
        if self.kind in DOC_KINDS and (self.to_item is None or self.read is None):
            raise ValueError(f"task {self.name!r}: a {self.kind} task needs read and to_item")
        if (self.hub is None) != (self.hub_doc is None):
            raise ValueError(f"task {self.name!r}: give hub and hub_doc together")

    @property
    def reads_docs(self) -> bool:
        """Whether the task is scored from docs of its files (or Hub source)."""
        return self.kind in DOC_KINDS


def choice_item(prompt: Prompt) -> Callable[[dict[str, Any]], Item]:
    """`Task.to_item` of a multiple-choice task: one request per choice after the prompt,
    lm-eval's target delimiter (one space) between them."""

    def to_item(doc: dict[str, Any]) -> Item:
        ctx, choices, gold = prompt(doc)
        return Item(requests=[(ctx, " " + c) for c in choices], gold=gold, choices=choices)

    return to_item

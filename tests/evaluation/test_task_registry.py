"""Adding an evaluation task is one record: a toy multiple-choice task (its reader, prompt and
paper-table column) registered with one line runs through `taperlm eval` on a tiny trained run,
its score in the table, the per-task line and the JSON; the registry is the one table the
`--tasks` choices and the paper's columns are read from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fault_harness as H
from conftest import raises_naming
from taperlm.cli import main
from taperlm.evaluation import niah
from taperlm.evaluation.record import Column, Task, choice_item
from taperlm.evaluation.registry import (
    TASKS,
    get_task,
    register_task,
    task_names,
    zero_shot_tasks,
)
from taperlm.evaluation.suite import paper_columns

# ----------------------------------------------------------------------------------------------
# a toy task: "question|choice 0|choice 1|gold" lines


def _read_pick(files: list[Path]) -> list[dict]:
    docs = []
    for line in files[0].read_text(encoding="utf-8").splitlines():
        question, first, second, gold = line.split("|")
        docs.append({"question": question, "choices": [first, second], "label": int(gold)})
    return docs


def _pick_prompt(doc: dict) -> tuple[str, list[str], int]:
    return f"Q: {doc['question']}\nA:", doc["choices"], doc["label"]


PICK = Task(
    "toy_pick",
    "multiple_choice",
    files=("toy/pick.txt",),
    read=_read_pick,
    to_item=choice_item(_pick_prompt),
    columns=(Column("Pick", "acc", 100.0),),
)


@pytest.fixture
def toy_task():
    register_task(PICK)  # the one registry line
    yield PICK
    del TASKS[PICK.name]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A tiny run trained for one step (its data dir gives val and the tokenizer)."""
    data = H.prepare_data(tmp_path_factory.mktemp("toy_task_data"))
    run = tmp_path_factory.mktemp("toy_task_run") / "run"
    assert main([*H.train_argv(data, run), "--stop-after-steps", "1"]) == 0
    return run


def test_toy_task_runs_through_eval(toy_task, run_dir, tmp_path, capsys):
    data = tmp_path / "evaldata"
    (data / "toy").mkdir(parents=True)
    lines = ["The sky is|blue|green|0", "Two and two make|five|four|1", "Fire is|hot|cold|0"]
    (data / "toy" / "pick.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "res.json"
    argv = ["eval", str(run_dir), "--tasks", "val,toy_pick", "--data-dir", str(data),
            "--device", "cpu", "--batch-size", "4", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    shown = capsys.readouterr()
    assert "| Pick |" in shown.out.split("\n")[0] + "|"
    assert "toy_pick: acc " in shown.err and "(n=3," in shown.err
    blob = json.loads(out.read_text(encoding="utf-8"))
    assert list(blob["tasks"]) == ["val", "toy_pick"]
    res = blob["tasks"]["toy_pick"]
    assert res["n"] == 3 and set(res["metrics"]) == {"acc", "acc_norm"}
    assert res["settings"]["requests"] == 6 and len(res["settings"]["files"][0]["sha256"]) == 64
    assert blob["paper_table"]["Pick"] == pytest.approx(100 * res["metrics"]["acc"])
    assert blob["paper_table"]["PIQA"] is None and blob["paper_table"]["Avg"] is None
    # --json prints the same record
    assert main([*argv[:-2], "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["tasks"]["toy_pick"]["metrics"] == res["metrics"]


def test_toy_task_is_a_compare_option(toy_task, tmp_path):
    """`compare --eval-tasks` reads the same registry: the toy task is accepted by name and
    belongs to `all` (after the paper suite and NIAH, whose order the reports keep)."""
    from taperlm.compare.comparison import compare_task_groups, eval_settings
    from taperlm.compare.options import CompareOptions

    groups = compare_task_groups()
    assert groups["all"][-1] == "toy_pick" and "toy_pick" not in groups["paper"]
    assert groups["all"][: len(groups["paper"])] == zero_shot_tasks()
    data = tmp_path / "eval"
    (data / "toy").mkdir(parents=True)
    (data / "toy" / "pick.txt").write_text("sky?|blue|green|0\n", encoding="utf-8")
    opts = CompareOptions(out=tmp_path / "c", eval_tasks="toy_pick", eval_data=data)
    settings = eval_settings(opts)
    assert settings.eval_tasks == ["toy_pick"] and settings.eval_data == str(data.resolve())


def test_the_registry_is_the_one_table():
    assert "toy_pick" not in TASKS  # the fixture cleaned up
    assert task_names("paper") == ["val", *zero_shot_tasks()]
    assert (
        task_names()
        == ["val", *zero_shot_tasks(), *niah.TASKS]
        == task_names("paper") + list(niah.TASKS)
    )
    assert [c.label for _, c in paper_columns()] == [
        "Wiki ppl", "LMB ppl", "LMB acc", "PIQA", "Hella", "Wino", "ARC-e", "ARC-c", "SIQA", "BoolQ"
    ]  # fmt: skip
    for name in zero_shot_tasks():
        task = get_task(name)
        assert task.files and task.read and task.hub and task.hub_doc and task.to_item, name
    with raises_naming(ValueError, "'piqa'"):  # already registered
        register_task(get_task("piqa"))
    with raises_naming(ValueError, "'broken'", "multiple_choice", "read", "to_item"):
        Task("broken", "multiple_choice")

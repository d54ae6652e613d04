"""Task readers: every local format, lm-eval's prompts, malformed files, and the real files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from conftest import raises_naming
from eval_helpers import COUNTS, write_eval_files
from taperlm.errors import DataError
from taperlm.evaluation.registry import load_task, zero_shot_tasks
from taperlm.evaluation.tasks import (
    split_wikitext_documents,
    wikitext_counts,
    wikitext_detokenize,
)

pytestmark = pytest.mark.unit

TASKS = tuple(zero_shot_tasks())


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return write_eval_files(tmp_path / "data")


def test_every_task_reads_with_counts_and_files(data_dir: Path) -> None:
    for task in TASKS:
        data = load_task(task, data_dir)
        assert len(data.docs) == COUNTS[task], task
        assert all(len(f["sha256"]) == 64 for f in data.files)
        assert len(load_task(task, data_dir, limit=1).docs) == 1


def test_prompts_follow_lm_eval_templates(data_dir: Path) -> None:
    it = load_task("piqa", data_dir).items()[0]
    assert it.requests == [
        ("Question: How to boil water?\nAnswer:", " Put it in a pot on the stove."),
        ("Question: How to boil water?\nAnswer:", " Freeze it."),
    ]
    assert it.choices == ["Put it in a pot on the stove.", "Freeze it."] and it.gold == 0

    it = load_task("lambada_openai", data_dir).items()[2]
    assert it.requests == [('He said:\n\n"Go home now,', " please")]

    it = load_task("hellaswag", data_dir).items()[0]
    assert it.requests[0] == ("Cooking: A man stands in a kitchen. he", " flies away.")
    assert it.choices[3] == "paints. the wall."  # lm-eval's [title] cleanup
    assert it.gold == 2

    it = load_task("winogrande", data_dir).items()[1]
    assert it.requests == [
        ("The cup fell off the table since the cup", " was tilted."),
        ("The cup fell off the table since the table", " was tilted."),
    ]
    assert it.gold == 1

    it = load_task("arc_challenge", data_dir).items()[0]
    assert it.requests[2] == ("Question: Which is a planet?\nAnswer:", " Mars") and it.gold == 2

    it = load_task("social_iqa", data_dir).items()[1]
    assert it.requests[1] == ("Q: Kai fed the dog. How would Kai feel?\nA:", " caring")
    assert it.gold == 1

    it = load_task("boolq", data_dir).items()[0]
    assert it.requests == [
        ("Water boils at 100 degrees.\nQuestion: does water boil at 100 degrees?\nAnswer:", " no"),
        ("Water boils at 100 degrees.\nQuestion: does water boil at 100 degrees?\nAnswer:", " yes"),
    ]
    assert it.gold == 1


def test_wikitext_documents_and_counts(data_dir: Path) -> None:
    items = load_task("wikitext", data_dir).items()
    assert items[0].text.startswith(" = Alpha Beta =\n\nAlpha Beta is a test article.")
    assert "2,000 words" in items[0].text and '"quoted"' in items[0].text
    assert "(brackets)" in items[0].text and "Alpha's town" in items[0].text
    assert "== History ==" in items[0].text and "1900-1910" in items[0].text
    assert items[1].text.startswith(" = Gamma =")
    page = split_wikitext_documents((data_dir / "wikitext-2/wiki.test.raw").read_text())[1]
    assert (items[1].words, items[1].bytes) == wikitext_counts(page)
    assert items[1].bytes == len(page.encode())


def _lm_eval_wikitext_module():
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or spec.origin is None:
        pytest.skip("lm_eval is not installed")
    path = Path(spec.origin).parent / "tasks" / "wikitext" / "preprocess_wikitext.py"
    mod_spec = importlib.util.spec_from_file_location("_lm_eval_wikitext", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def test_wikitext_detokenizer_equals_lm_eval(data_dir: Path) -> None:
    mod = _lm_eval_wikitext_module()
    for doc in load_task("wikitext", data_dir).docs:
        assert wikitext_detokenize(doc["page"]) == mod.wikitext_detokenizer(doc)
        res = mod.process_results(doc, [-1.0])
        assert (res["word_perplexity"][1], res["byte_perplexity"][1]) == wikitext_counts(
            doc["page"]
        )


# -- malformed files ---------------------------------------------------------------------------


def _expect(data_dir: Path, task: str, *needles: str) -> None:
    with pytest.raises(DataError) as err:
        load_task(task, data_dir)
    for n in needles:
        assert n in str(err.value), str(err.value)


def test_missing_field(data_dir: Path) -> None:
    p = data_dir / "arc/arc_easy_test.jsonl"
    p.write_text(p.read_text() + json.dumps({"query": "Question: x", "gold": 0}) + "\n")
    _expect(data_dir, "arc_easy", str(p), "line 3", "missing field 'choices'")


def test_bad_label(data_dir: Path) -> None:
    p = data_dir / "winogrande/winogrande_dev.jsonl"
    p.write_text(json.dumps({"context_options": ["a", "b"], "continuation": "c", "gold": 2}) + "\n")
    _expect(data_dir, "winogrande", "line 1", "out of range 0..1")
    p.write_text(
        json.dumps({"context_options": ["a", "b"], "continuation": "c", "gold": "1"}) + "\n"
    )
    _expect(data_dir, "winogrande", "line 1", "must be an integer")


def test_non_json_line(data_dir: Path) -> None:
    p = data_dir / "boolq/boolq_dev.jsonl"
    p.write_text(p.read_text() + "{not json\n")
    _expect(data_dir, "boolq", str(p), "line 3", "not valid JSON")


def test_empty_and_missing_file(data_dir: Path) -> None:
    (data_dir / "siqa/dev.jsonl").write_text("\n")
    _expect(data_dir, "social_iqa", "empty")
    (data_dir / "lambada/lambada_openai.jsonl").unlink()
    _expect(data_dir, "lambada_openai", "does not exist", "--data-dir")


def test_siqa_answer_not_an_option(data_dir: Path) -> None:
    p = data_dir / "siqa/dev.jsonl"
    row = {"context": "c", "question": "q", "options": ["a", "b", "c"], "answer": "d"}
    p.write_text(json.dumps(row) + "\n")
    _expect(data_dir, "social_iqa", "line 1", "not one of the options")


def test_piqa_labels_misaligned_or_bad(data_dir: Path) -> None:
    lab = data_dir / "piqa/valid-labels.lst"
    lab.write_text("0\n")
    _expect(data_dir, "piqa", "1 labels", "2 records")
    lab.write_text("0\n7\n")
    _expect(data_dir, "piqa", "valid-labels.lst, line 2", "must be 0 or 1")


def test_hellaswag_bad_layout(data_dir: Path) -> None:
    p = data_dir / "hellaswag/hellaswag_val_full.txt"
    lines = p.read_text().splitlines()
    p.write_text("\n".join(lines[:-1]) + "\n")
    _expect(data_dir, "hellaswag", "not a multiple of 6")
    lines[1] = "4"
    p.write_text("\n".join(lines) + "\n")
    _expect(data_dir, "hellaswag", "line 2", "gold index")


def test_boolq_query_layout(data_dir: Path) -> None:
    p = data_dir / "boolq/boolq_dev.jsonl"
    p.write_text(
        json.dumps({"query": "no question here", "choices": ["no", "yes"], "gold": 0}) + "\n"
    )
    _expect(data_dir, "boolq", "line 1", "Passage:")


def test_unknown_task_and_source(data_dir: Path) -> None:
    with raises_naming(DataError, "'mmlu'", "piqa"):
        load_task("mmlu", data_dir)
    with raises_naming(DataError, "--source", "local", "hf"):
        load_task("piqa", data_dir, source="ftp")


# -- the real files ------------------------------------------------------------------------------

REAL_COUNTS = {
    "wikitext": 62,
    "lambada_openai": 5153,
    "piqa": 1838,
    "hellaswag": 10042,
    "winogrande": 1267,
    "arc_easy": 2376,
    "arc_challenge": 1172,
    "social_iqa": 1954,
    "boolq": 3270,
}


def test_real_files_counts_and_labels(shared_data: Path) -> None:
    for task, n in REAL_COUNTS.items():
        assert len(load_task(task, shared_data).docs) == n, task
    piqa = load_task("piqa", shared_data).items()
    assert [it.gold for it in piqa[:3]] == [0, 1, 1]
    hs = load_task("hellaswag", shared_data).items()
    assert hs[0].gold == 3 and hs[0].requests[3][1] == " starts pulling up roofing on a roof."
    wg = load_task("winogrande", shared_data).items()
    assert [it.gold for it in wg[:2]] == [1, 0]
    siqa = load_task("social_iqa", shared_data).items()
    assert siqa[0].gold == 2 and siqa[1].gold == 0
    arc = load_task("arc_easy", shared_data).items()
    assert arc[0].gold == 0 and arc[1].gold == 1
    boolq = load_task("boolq", shared_data).items()
    assert boolq[0].gold == 0
    assert sum(it.gold for it in boolq) / len(boolq) == pytest.approx(0.622, abs=0.01)
    wiki = load_task("wikitext", shared_data).items()
    assert wiki[0].text.startswith(" = Robert Boulter =\n")


def test_real_wikitext_detokenizer_equals_lm_eval(shared_data: Path) -> None:
    mod = _lm_eval_wikitext_module()
    for doc in load_task("wikitext", shared_data).docs:
        assert wikitext_detokenize(doc["page"]) == mod.wikitext_detokenizer(doc)

"""The paper's zero-shot tasks, one `Task` record each (`ZERO_SHOT`, registered by
`taperlm.evaluation.registry`): readers for the local files (../shared/data formats) and the
Hugging Face datasets lm-evaluation-harness uses, and the prompt of each task exactly as
lm-eval 0.4.x builds it (doc_to_text / doc_to_choice / target_delimiter of its task YAMLs).

Every reader returns *normalized docs*: plain dicts with one schema per task, the same whether
they came from a local file or from the Hub. A task's `to_item` turns a doc into the
log-likelihood requests lm-eval would issue. The lm-eval task YAMLs we ship (`lm_eval_tasks/`)
read the same normalized docs, so both evaluators see identical strings.

No torch import.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from taperlm.errors import DataError, MalformedFileError, UnsafeFileError
from taperlm.evaluation.record import Column, HubSource, Item, Task, choice_item
from taperlm.files.io import parse_json, read_text

# ----------------------------------------------------------------------------------------------
# lm-eval's text transforms (facts of its task definitions, reimplemented)

# wikitext: lm-eval's doc_to_target detokenizes the page; word/byte counts use the original page.
_WIKITEXT_RULES: list[tuple[str, str, str]] = [
    ("str", "s '", "s'"),
    ("re", r"/' [0-9]/", r"/'[0-9]/"),
    ("str", " @-@ ", "-"),
    ("str", " @,@ ", ","),
    ("str", " @.@ ", "."),
    ("str", " : ", ": "),
    ("str", " ; ", "; "),
    ("str", " . ", ". "),
    ("str", " ! ", "! "),
    ("str", " ? ", "? "),
    ("str", " , ", ", "),
    ("re", r"\(\s*([^\)]*?)\s*\)", r"(\1)"),
    ("re", r"\[\s*([^\]]*?)\s*\]", r"[\1]"),
    ("re", r"{\s*([^}]*?)\s*}", r"{\1}"),
    ("re", r"\"\s*([^\"]*?)\s*\"", r'"\1"'),
    ("re", r"'\s*([^']*?)\s*'", r"'\1'"),
    ("str", "= = = =", "===="),
    ("str", "= = =", "==="),
    ("str", "= =", "=="),
    ("str", " \N{DEGREE SIGN} ", "\N{DEGREE SIGN}"),
    ("str", " \n", "\n"),
    ("str", "\n ", "\n"),
    ("str", " N ", " 1 "),
    ("str", " 's", "'s"),
]


def wikitext_detokenize(page: str) -> str:
    """The detokenization lm-eval's `wikitext` task applies to a document before scoring."""
    s = page
    for kind, pattern, repl in _WIKITEXT_RULES:
        s = s.replace(pattern, repl) if kind == "str" else re.sub(pattern, repl, s)
    return s


def wikitext_counts(page: str) -> tuple[int, int]:
    """(words, utf-8 bytes) of the original page, as lm-eval counts them."""
    return len(re.split(r"\s+", page)), len(page.encode("utf-8"))


def split_wikitext_documents(raw: str) -> list[str]:
    """Split a WikiText raw file into article pages like `EleutherAI/wikitext_document_level`:
    a new page starts at each top-level heading line ` = Title = `; the page keeps its lines
    joined with newlines; pages of only whitespace are dropped."""
    pages, lines = [], []
    for line in raw.split("\n"):
        probe = line.replace("= = =", "===").replace("= =", "==").strip()
        if probe.startswith("= ") and probe.endswith(" ="):
            page = "\n".join(lines)
            if page.strip():
                pages.append(page)
            lines = []
        lines.append(line)
    page = "\n".join(lines)
    if page.strip():
        pages.append(page)
    return pages


def hellaswag_preprocess(text: str) -> str:
    """lm-eval's HellaSwag cleanup: WikiHow `[title]` becomes a sentence break, other bracket
    tags are dropped, double spaces collapsed."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


# ----------------------------------------------------------------------------------------------
# doc -> requests (lm-eval's templates; the default target_delimiter is a single space)


def _wikitext_item(doc: dict[str, Any]) -> Item:
    words, nbytes = wikitext_counts(doc["page"])
    return Item(text=wikitext_detokenize(doc["page"]), words=words, bytes=nbytes)


def _lambada_item(doc: dict[str, Any]) -> Item:
    text = doc["text"]
    return Item(requests=[(" ".join(text.split(" ")[:-1]), " " + text.split(" ")[-1])])


def _winogrande_item(doc: dict[str, Any]) -> Item:
    # Partial scoring: one context per option, the shared continuation after the blank.
    ctxs = list(doc["contexts"])
    return Item(
        requests=[(c, " " + doc["continuation"]) for c in ctxs],
        gold=int(doc["label"]),
        choices=ctxs,
    )


def _piqa_prompt(doc: dict[str, Any]) -> tuple[str, list[str], int]:
    return f"Question: {doc['goal']}\nAnswer:", [doc["sol1"], doc["sol2"]], int(doc["label"])


def _hellaswag_prompt(doc: dict[str, Any]) -> tuple[str, list[str], int]:
    return doc["query"], list(doc["choices"]), int(doc["label"])


def _arc_prompt(doc: dict[str, Any]) -> tuple[str, list[str], int]:
    return f"Question: {doc['question']}\nAnswer:", list(doc["choices"]), int(doc["label"])


def _siqa_prompt(doc: dict[str, Any]) -> tuple[str, list[str], int]:
    choices = [doc["answerA"], doc["answerB"], doc["answerC"]]
    return f"Q: {doc['context']} {doc['question']}\nA:", choices, int(doc["label"]) - 1


def _boolq_prompt(doc: dict[str, Any]) -> tuple[str, list[str], int]:
    return (
        f"{doc['passage']}\nQuestion: {doc['question']}?\nAnswer:",
        ["no", "yes"],
        int(doc["label"]),
    )


# ----------------------------------------------------------------------------------------------
# local readers


MAX_TASK_FILE_BYTES = 1 << 30  # the largest evaluation file (LAMBADA, HellaSwag) is ~50 MB


class _Lines:
    """Reads a UTF-8 text file and produces DataErrors that name the file and line."""

    def __init__(self, path: Path, task: str) -> None:
        self.path, self.task = path, task
        if not path.is_file():
            raise DataError(
                f"{task}: evaluation file {path} does not exist; point --data-dir (or "
                "TAPERLM_EVAL_DATA) at a folder laid out like ../shared/data, or use --source hf"
            )
        try:
            self.text = read_text(path, MAX_TASK_FILE_BYTES, "evaluation file")
        except UnsafeFileError as err:
            raise DataError(str(err)) from None
        except UnicodeDecodeError as err:
            raise DataError(f"{path}: not UTF-8 text ({err}); re-download the file") from None
        if not self.text.strip():
            raise DataError(f"{path}: the file is empty; re-download or regenerate it")

    def fail(self, line: int, what: str) -> DataError:
        return DataError(f"{self.path}, line {line}: {what}")

    def json_records(self) -> list[tuple[int, dict]]:
        out = []
        for i, line in enumerate(self.text.split("\n"), 1):
            if not line.strip():
                continue
            try:
                rec = parse_json(line, what="the line")
            except MalformedFileError as err:  # not JSON, or nested deeper than a record
                raise self.fail(i, f"{err}; each line must be one JSON object") from None
            if not isinstance(rec, dict):
                raise self.fail(i, f"expected a JSON object, got {type(rec).__name__}")
            out.append((i, rec))
        return out

    def need(self, line: int, rec: dict, key: str, kind: type | tuple, example: str) -> Any:
        if key not in rec:
            raise self.fail(line, f"missing field {key!r}; expected a record like {example}")
        v = rec[key]
        if not isinstance(v, kind) or (isinstance(v, bool) and kind is int):
            raise self.fail(line, f"field {key!r} must be {_kind_name(kind)}, got {v!r}")
        if isinstance(v, str) and not v.strip():
            raise self.fail(line, f"field {key!r} is empty")
        return v

    def need_strings(self, line: int, rec: dict, key: str, n: int | None, example: str) -> list:
        v = self.need(line, rec, key, list, example)
        if n is not None and len(v) != n:
            raise self.fail(line, f"field {key!r} must hold {n} strings, got {len(v)}")
        if not v or not all(isinstance(x, str) and x.strip() for x in v):
            raise self.fail(line, f"field {key!r} must be a list of non-empty strings, got {v!r}")
        return v

    def need_label(self, line: int, rec: dict, key: str, n: int, example: str) -> int:
        v = self.need(line, rec, key, int, example)
        if not 0 <= v < n:
            raise self.fail(line, f"label {key!r} = {v} is out of range 0..{n - 1}")
        return v


def _kind_name(kind: type | tuple) -> str:
    names = {str: "a string", int: "an integer", list: "a list", dict: "an object"}
    if isinstance(kind, tuple):
        return " or ".join(names.get(k, k.__name__) for k in kind)
    return names.get(kind, kind.__name__)


def _read_wikitext(files: list[Path]) -> list[dict]:
    src = _Lines(files[0], "wikitext")
    pages = split_wikitext_documents(src.text)
    if not pages:
        raise DataError(f"{files[0]}: no WikiText article found (expected ` = Title = ` lines)")
    return [{"page": p} for p in pages]


def _read_lambada(files: list[Path]) -> list[dict]:
    src = _Lines(files[0], "lambada_openai")
    ex = '{"context": "...", "continuation": "word"}'
    docs = []
    for i, rec in src.json_records():
        ctx = src.need(i, rec, "context", str, ex)
        cont = src.need(i, rec, "continuation", str, ex)
        docs.append({"text": ctx + " " + cont})
    return docs


def _read_piqa(files: list[Path]) -> list[dict]:
    src, lab = _Lines(files[0], "piqa"), _Lines(files[1], "piqa")
    ex = '{"goal": "...", "sol1": "...", "sol2": "..."}'
    recs = src.json_records()
    labels = [(i, s.strip()) for i, s in enumerate(lab.text.split("\n"), 1) if s.strip()]
    if len(labels) != len(recs):
        raise DataError(
            f"{files[1]} has {len(labels)} labels but {files[0]} has {len(recs)} records; "
            "the two files must be aligned line by line (one 0/1 label per question)"
        )
    docs = []
    for (i, rec), (j, label) in zip(recs, labels):
        if label not in ("0", "1"):
            raise lab.fail(j, f"label {label!r} must be 0 or 1")
        docs.append(
            {
                "goal": src.need(i, rec, "goal", str, ex),
                "sol1": src.need(i, rec, "sol1", str, ex),
                "sol2": src.need(i, rec, "sol2", str, ex),
                "label": int(label),
            }
        )
    return docs


def _read_hellaswag(files: list[Path]) -> list[dict]:
    src = _Lines(files[0], "hellaswag")
    lines = src.text.split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    if len(lines) % 6:
        raise src.fail(
            len(lines) - len(lines) % 6 + 1,
            f"the file has {len(lines)} lines, not a multiple of 6; each item is 6 lines "
            "(`label: context`, gold index 0-3, then 4 endings)",
        )
    docs = []
    for k in range(0, len(lines), 6):
        query, gold, *endings = lines[k : k + 6]
        if not query.strip():
            raise src.fail(k + 1, "empty context line")
        if gold.strip() not in ("0", "1", "2", "3"):
            raise src.fail(k + 2, f"gold index {gold!r} must be 0, 1, 2 or 3")
        for e, ending in enumerate(endings):
            if not ending.strip():
                raise src.fail(k + 3 + e, "empty ending")
        docs.append(
            {
                "query": hellaswag_preprocess(query),
                "choices": [hellaswag_preprocess(e) for e in endings],
                "label": int(gold),
            }
        )
    return docs


def _read_winogrande(files: list[Path]) -> list[dict]:
    src = _Lines(files[0], "winogrande")
    ex = '{"context_options": ["... opt1", "... opt2"], "continuation": "...", "gold": 0}'
    docs = []
    for i, rec in src.json_records():
        ctxs = src.need_strings(i, rec, "context_options", 2, ex)
        cont = src.need(i, rec, "continuation", str, ex)
        gold = src.need_label(i, rec, "gold", 2, ex)
        docs.append({"contexts": ctxs, "continuation": cont, "label": gold})
    return docs


def _read_arc(files: list[Path], name: str) -> list[dict]:
    src = _Lines(files[0], name)
    ex = '{"query": "Question: ...", "choices": ["..", ".."], "gold": 0}'
    docs = []
    for i, rec in src.json_records():
        query = src.need(i, rec, "query", str, ex)
        choices = src.need_strings(i, rec, "choices", None, ex)
        gold = src.need_label(i, rec, "gold", len(choices), ex)
        question = query[len("Question: ") :] if query.startswith("Question: ") else query
        docs.append({"question": question, "choices": choices, "label": gold})
    return docs


def _read_siqa(files: list[Path]) -> list[dict]:
    src = _Lines(files[0], "social_iqa")
    ex = '{"context": "...", "question": "...", "options": [3 strings], "answer": "<one option>"}'
    docs = []
    for i, rec in src.json_records():
        context = src.need(i, rec, "context", str, ex)
        question = src.need(i, rec, "question", str, ex)
        options = src.need_strings(i, rec, "options", 3, ex)
        answer = src.need(i, rec, "answer", str, ex)
        if answer not in options:
            raise src.fail(i, f"answer {answer!r} is not one of the options {options}")
        docs.append(
            {
                "context": context,
                "question": question,
                "answerA": options[0],
                "answerB": options[1],
                "answerC": options[2],
                "label": str(options.index(answer) + 1),
            }
        )
    return docs


def _read_boolq(files: list[Path]) -> list[dict]:
    src = _Lines(files[0], "boolq")
    ex = '{"query": "Passage: ...\\nQuestion: ...?", "choices": ["no", "yes"], "gold": 1}'
    docs = []
    for i, rec in src.json_records():
        query = src.need(i, rec, "query", str, ex)
        choices = src.need_strings(i, rec, "choices", 2, ex)
        if choices != ["no", "yes"]:
            raise src.fail(i, f'choices must be ["no", "yes"], got {choices}')
        gold = src.need_label(i, rec, "gold", 2, ex)
        passage, sep, question = query.rpartition("\nQuestion: ")
        if not sep or not passage.startswith("Passage: ") or not question.endswith("?"):
            raise src.fail(i, 'query must read "Passage: <text>\\nQuestion: <question>?"')
        docs.append(
            {"passage": passage[len("Passage: ") :], "question": question[:-1], "label": gold}
        )
    return docs


# ----------------------------------------------------------------------------------------------
# Hugging Face rows (the datasets lm-eval downloads), normalized to the same schemas


def _hub_wikitext(row: dict) -> dict:
    return {"page": row["page"]}


def _hub_lambada(row: dict) -> dict:
    return {"text": row["text"]}


def _hub_piqa(row: dict) -> dict:
    return {k: row[k] for k in ("goal", "sol1", "sol2")} | {"label": int(row["label"])}


def _hub_hellaswag(row: dict) -> dict:
    ctx = row["ctx_a"] + " " + row["ctx_b"].capitalize()
    return {
        "query": hellaswag_preprocess(row["activity_label"] + ": " + ctx),
        "choices": [hellaswag_preprocess(e) for e in row["endings"]],
        "label": int(row["label"]),
    }


def _hub_winogrande(row: dict) -> dict:
    s = row["sentence"]
    idx = s.index("_")
    return {
        "contexts": [s[:idx] + row["option1"], s[:idx] + row["option2"]],
        "continuation": s[idx + 1 :].strip(),
        "label": {"1": 0, "2": 1}[row["answer"]],
    }


def _hub_arc(row: dict) -> dict:
    return {
        "question": row["question"],
        "choices": list(row["choices"]["text"]),
        "label": list(row["choices"]["label"]).index(row["answerKey"]),
    }


def _hub_siqa(row: dict) -> dict:
    keys = ("context", "question", "answerA", "answerB", "answerC")
    return {k: row[k] for k in keys} | {"label": str(row["label"])}


def _hub_boolq(row: dict) -> dict:
    return {"passage": row["passage"], "question": row["question"], "label": int(row["label"])}


# ----------------------------------------------------------------------------------------------
# the records, in the paper's order (local files as in docs/evaluation.md's task table)

_PAPER = ("paper",)


def _accuracy(label: str, metric: str = "acc") -> tuple[Column, ...]:
    return (Column(label, metric, 100.0, average=True),)


ZERO_SHOT: tuple[Task, ...] = (
    Task(
        "wikitext",
        "rolling",
        files=("wikitext-2/wiki.test.raw",),
        read=_read_wikitext,
        hub=HubSource("EleutherAI/wikitext_document_level", "wikitext-2-raw-v1", "test"),
        hub_doc=_hub_wikitext,
        to_item=_wikitext_item,
        columns=(Column("Wiki ppl", "word_perplexity"),),
        groups=_PAPER,
    ),
    Task(
        "lambada_openai",
        "loglikelihood",
        files=("lambada/lambada_openai.jsonl",),
        read=_read_lambada,
        hub=HubSource("EleutherAI/lambada_openai", "default", "test"),
        hub_doc=_hub_lambada,
        to_item=_lambada_item,
        columns=(Column("LMB ppl", "perplexity"), *_accuracy("LMB acc")),
        groups=_PAPER,
    ),
    Task(
        "piqa",
        "multiple_choice",
        files=("piqa/valid.jsonl", "piqa/valid-labels.lst"),
        read=_read_piqa,
        hub=HubSource("baber/piqa", None, "validation"),
        hub_doc=_hub_piqa,
        to_item=choice_item(_piqa_prompt),
        columns=_accuracy("PIQA"),
        groups=_PAPER,
    ),
    Task(
        "hellaswag",
        "multiple_choice",
        files=("hellaswag/hellaswag_val_full.txt",),
        read=_read_hellaswag,
        hub=HubSource("Rowan/hellaswag", None, "validation"),
        hub_doc=_hub_hellaswag,
        to_item=choice_item(_hellaswag_prompt),
        columns=_accuracy("Hella", "acc_norm"),
        groups=_PAPER,
    ),
    Task(
        "winogrande",
        "multiple_choice",
        files=("winogrande/winogrande_dev.jsonl",),
        read=_read_winogrande,
        hub=HubSource("allenai/winogrande", "winogrande_xl", "validation"),
        hub_doc=_hub_winogrande,
        to_item=_winogrande_item,
        columns=_accuracy("Wino"),
        groups=_PAPER,
    ),
    Task(
        "arc_easy",
        "multiple_choice",
        files=("arc/arc_easy_test.jsonl",),
        read=lambda files: _read_arc(files, "arc_easy"),
        hub=HubSource("allenai/ai2_arc", "ARC-Easy", "test"),
        hub_doc=_hub_arc,
        to_item=choice_item(_arc_prompt),
        columns=_accuracy("ARC-e"),
        groups=_PAPER,
    ),
    Task(
        "arc_challenge",
        "multiple_choice",
        files=("arc/arc_challenge_test.jsonl",),
        read=lambda files: _read_arc(files, "arc_challenge"),
        hub=HubSource("allenai/ai2_arc", "ARC-Challenge", "test"),
        hub_doc=_hub_arc,
        to_item=choice_item(_arc_prompt),
        columns=_accuracy("ARC-c", "acc_norm"),
        groups=_PAPER,
    ),
    Task(
        "social_iqa",
        "multiple_choice",
        files=("siqa/dev.jsonl",),
        read=_read_siqa,
        hub=HubSource("lighteval/siqa", None, "validation"),
        hub_doc=_hub_siqa,
        to_item=choice_item(_siqa_prompt),
        columns=_accuracy("SIQA"),
        groups=_PAPER,
    ),
    Task(
        "boolq",
        "multiple_choice",
        files=("boolq/boolq_dev.jsonl",),
        read=_read_boolq,
        hub=HubSource("aps/super_glue", "boolq", "validation"),
        hub_doc=_hub_boolq,
        to_item=choice_item(_boolq_prompt),
        columns=_accuracy("BoolQ"),
        groups=_PAPER,
    ),
)

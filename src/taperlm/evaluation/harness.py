"""lm-evaluation-harness adapters (extra `taperlm[eval]`).

- `write_task_dir(out, data_dir)`: normalized JSONL copies of the local eval files plus our task
  YAMLs (`lm_eval_tasks/taperlm_<task>.yaml`, lm-eval's prompts and metrics) with the data path
  filled in; pass the folder to `lm_eval --include_path` or `TaskManager(include_path=...)`.
- `make_hflm(model, tokenizer)`: an in-process `HFLM` around a TaperedLM (no export needed).
- `run_lm_eval(...)`: `simple_evaluate` on our local tasks, offline.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from taperlm.errors import DataError
from taperlm.evaluation.registry import load_task, zero_shot_tasks
from taperlm.files.outdirs import check_folder, claim, install_files

PLACEHOLDER = "__TAPERLM_DATA__"
UTILS_FILE = "taperlm_utils.py"
# The !function helpers the wikitext YAML names; they call taperlm's own implementations.
UTILS_CODE = '''"""Helpers for the taperlm_* lm-eval tasks (written by `taperlm eval --write-lm-eval-tasks`)."""

from taperlm.evaluation.tasks import wikitext_counts, wikitext_detokenize


def wikitext_target(doc):
    return wikitext_detokenize(doc["page"])


def wikitext_process_results(doc, results):
    (loglikelihood,) = results
    words, nbytes = wikitext_counts(doc["page"])
    return {
        "word_perplexity": (loglikelihood, words),
        "byte_perplexity": (loglikelihood, nbytes),
        "bits_per_byte": (loglikelihood, nbytes),
    }
'''


def lm_eval_task_name(task: str) -> str:
    return f"taperlm_{task}"


def _template(task: str) -> str:
    files = resources.files("taperlm.evaluation").joinpath("lm_eval_tasks")
    return files.joinpath(f"taperlm_{task}.yaml").read_text(encoding="utf-8")


def write_task_dir(
    out_dir: str | Path,
    data_dir: str | Path | None,
    tasks: Sequence[str] | None = None,
    source: str = "local",
    limit: int | None = None,
) -> Path:
    """Write `<out>/data/<task>.jsonl` (normalized docs) and `<out>/taperlm_<task>.yaml` for
    `tasks` (default: the paper's zero-shot suite)."""
    out = Path(out_dir).resolve()
    check_folder(out, "lm-eval-tasks", "--write-lm-eval-tasks")
    claim(out, "lm-eval-tasks")
    # Written aside and installed: a rerun replaces only the files it wrote before and nobody
    # edited since (a task YAML the user tuned is refused by name, not overwritten).
    staging = Path(tempfile.mkdtemp(prefix=".taperlm-tasks-tmp-", dir=out))
    try:
        (staging / "data").mkdir()
        for task in zero_shot_tasks() if tasks is None else tasks:
            data = load_task(task, data_dir, source=source, limit=limit)
            with open(staging / "data" / f"{task}.jsonl", "w", encoding="utf-8") as f:
                for doc in data.docs:
                    f.write(json.dumps(doc, ensure_ascii=False) + "\n")
            yaml_text = _template(task).replace(PLACEHOLDER, str(out / "data"))
            (staging / f"taperlm_{task}.yaml").write_text(yaml_text, encoding="utf-8")
        (staging / UTILS_FILE).write_text(UTILS_CODE, encoding="utf-8")
        install_files(
            staging,
            out,
            "lm-eval-tasks",
            "--write-lm-eval-tasks",
            "write the tasks to another folder",
            keep_others=True,  # tasks may be written a few at a time into one folder
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _require_lm_eval() -> None:
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise DataError(
            "lm-evaluation-harness is not installed: pip install 'taperlm[eval]'"
        ) from None


def make_hflm(
    model: Any,
    tokenizer: Any,
    batch_size: int = 16,
    max_length: int | None = None,
    device: str = "cpu",
) -> Any:
    """An lm-eval `HFLM` wrapping a TaperedLM (or a TaperLMForCausalLM) in process."""
    _require_lm_eval()
    from lm_eval.models.huggingface import HFLM

    from taperlm.hf.export import hf_tokenizer, to_hf_model  # lazy: needs the hf extra

    hf = model if hasattr(model, "generate") else to_hf_model(model)
    ctx = hf.config.max_position_embeddings
    tok = hf_tokenizer(tokenizer, ctx)
    return HFLM(
        pretrained=hf,
        tokenizer=tok,
        backend="causal",
        batch_size=batch_size,
        max_length=max_length or ctx,
        device=device,
    )


def run_lm_eval(
    lm: Any,
    task_dir: str | Path,
    tasks: list[str],
    limit: int | None = None,
    log_samples: bool = False,
) -> dict[str, Any]:
    """`lm_eval.simple_evaluate` on our local task YAMLs (zero-shot), offline."""
    _require_lm_eval()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(task_dir))
    return simple_evaluate(
        model=lm,
        tasks=[lm_eval_task_name(t) for t in tasks],
        num_fewshot=0,
        limit=limit,
        task_manager=tm,
        log_samples=log_samples,
        bootstrap_iters=0,
    )

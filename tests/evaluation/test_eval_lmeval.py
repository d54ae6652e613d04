"""Our evaluator vs lm-evaluation-harness on the same tiny model and items: per-item
log-likelihoods to 1e-4 and identical accuracies (offline: local JSON task files)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from eval_helpers import tiny_model, tiny_tokenizer, write_eval_files
from taperlm.evaluation.registry import load_task, zero_shot_tasks
from taperlm.evaluation.scoring import Scorer
from taperlm.evaluation.suite import run_task

pytestmark = pytest.mark.lmeval
TASKS = tuple(zero_shot_tasks())


def _resp_ll(resp) -> float:
    x = resp[0]
    return float(x[0] if isinstance(x, (list, tuple)) else x)


def test_per_item_loglikelihoods_and_metrics_equal_lm_eval(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("lm_eval")
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    from taperlm.evaluation.harness import make_hflm, run_lm_eval, write_task_dir

    data_dir = write_eval_files(tmp_path / "data")
    model, tok = tiny_model(context_length=128), tiny_tokenizer()
    task_dir = write_task_dir(tmp_path / "tasks", data_dir, TASKS)
    lm = make_hflm(model, tok, batch_size=4)
    out = run_lm_eval(lm, task_dir, list(TASKS), log_samples=True)
    scorer = Scorer(model, tok, 128, batch_size=3, progress=False)
    for task in TASKS:
        ours = run_task(scorer, load_task(task, data_dir), keep_items=True)
        theirs = out["results"][f"taperlm_{task}"]
        samples = sorted(out["samples"][f"taperlm_{task}"], key=lambda s: s["doc_id"])
        assert len(samples) == ours.n, task
        for s, item in zip(samples, ours.per_item):
            mine = item["lls"] if "lls" in item else [item["ll"]]
            assert [_resp_ll(r) for r in s["resps"]] == pytest.approx(mine, abs=1e-4), task
        for metric, value in ours.metrics.items():
            ref = theirs[f"{metric},none"]
            if metric in ("acc", "acc_norm"):
                assert value == ref, (task, metric)  # identical decisions
            else:
                assert math.log(value) == pytest.approx(math.log(ref), abs=1e-4), (task, metric)

"""Scoring: batched log-likelihoods equal a naive token-by-token reference; lm-eval's rolling
windows; metric definitions; the eval CLI end to end on an exported model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from conftest import assert_naming
from eval_helpers import tiny_model, tiny_tokenizer, write_eval_files
from taperlm.evaluation.record import Item
from taperlm.evaluation.registry import TaskData, load_task
from taperlm.evaluation.scoring import Scorer, rolling_windows
from taperlm.evaluation.suite import argmax, mean_stderr, ratio_stderr, run_task


def naive_ll(model, ctx: list[int], cont: list[int], max_length: int) -> tuple[float, bool]:
    """One forward pass per continuation token on the prefix before it. Like lm-eval, a long
    request is cut to its last max_length + 1 tokens, and every token is conditioned on what
    precedes it inside that window."""
    total, greedy = 0.0, True
    seq = (ctx + cont)[-(max_length + 1) :]
    for j in range(len(seq) - len(cont), len(seq)):
        prefix = seq[:j]
        with torch.no_grad():
            logits = model(torch.tensor([prefix])).logits[0, -1].double()
        logp = torch.log_softmax(logits, -1)
        total += logp[seq[j]].item()
        greedy &= int(logits.argmax()) == seq[j]
    return total, greedy


def test_loglikelihood_matches_naive_reference() -> None:
    model, tok = tiny_model(context_length=16), tiny_tokenizer()
    sc = Scorer(model, tok, max_length=16, batch_size=3, progress=False)
    texts = [
        ("Question: What do plants need?\nAnswer:", " light"),
        ("The cat sat on the", " mat"),
        ("Ann gave Bea a gift because Ann ", "was generous."),  # trailing space moves
        ("", "Gamma is another page."),  # empty context -> prefix token
        ("x" * 40, " long"),
    ]
    pairs = [sc.encode_pair(c, x) for c, x in texts]
    assert pairs[3][0] == [tok.eos_id]
    _, cont2 = pairs[2]
    assert tok.decode(cont2).startswith(" was")
    got = sc.loglikelihood(pairs)
    for (ctx, cont), (ll, greedy) in zip(pairs, got):
        ref, ref_greedy = naive_ll(model, ctx, cont, 16)
        assert ll == pytest.approx(ref, abs=1e-4)
        assert greedy == ref_greedy
    # batch composition does not change results
    one = Scorer(model, tok, max_length=16, batch_size=1, progress=False).loglikelihood(pairs)
    assert [a for a, _ in one] == pytest.approx([a for a, _ in got], abs=1e-5)


def test_continuation_longer_than_max_length_is_chunked() -> None:
    model, tok = tiny_model(context_length=8), tiny_tokenizer()
    sc = Scorer(model, tok, max_length=8, batch_size=2, progress=False)
    ctx, cont = [5, 6, 7], list(range(10, 30))  # 20 tokens > 8
    ((ll, _),) = sc.loglikelihood([(ctx, cont)])
    ref = sum(
        naive_ll(model, ctx + cont[:s], cont[s : s + 8], 8)[0] for s in range(0, len(cont), 8)
    )
    assert ll == pytest.approx(ref, abs=1e-4)


def test_greedy_flag_is_true_for_the_argmax_continuation() -> None:
    model, tok = tiny_model(), tiny_tokenizer()
    sc = Scorer(model, tok, max_length=64, progress=False)
    ctx = tok.encode("Question: What do plants need?")
    with torch.no_grad():
        nxt = int(model(torch.tensor([ctx])).logits[0, -1].argmax())
    (_, greedy), (_, other) = sc.loglikelihood([(ctx, [nxt]), (ctx, [(nxt + 1) % 50])])
    assert greedy and not other


@pytest.mark.parametrize("n", [1, 5, 8, 9, 17, 40])
def test_rolling_windows_predict_every_token_once(n: int) -> None:
    toks = list(range(100, 100 + n))
    wins = rolling_windows(toks, prefix=0, max_length=8)
    assert [t for _, cont in wins for t in cont] == toks
    assert wins[0][0] == [0]
    for ctx, cont in wins[1:]:
        assert len(ctx) + len(cont) == 9  # full window: L inputs, L+1 tokens
        assert ctx + cont == toks[toks.index(ctx[0]) : toks.index(cont[-1]) + 1]


def test_rolling_windows_equal_lm_eval() -> None:
    utils = pytest.importorskip("lm_eval.utils")
    for n in (1, 3, 8, 9, 16, 25):
        toks = list(range(1, n + 1))
        theirs = [
            utils.make_disjoint_window(w)
            for w in utils.get_rolling_token_windows(toks, 0, 8, context_len=1)
        ]
        assert rolling_windows(toks, 0, 8) == [(list(a), list(b)) for a, b in theirs]


def test_rolling_loglikelihood_matches_naive() -> None:
    model, tok = tiny_model(context_length=8), tiny_tokenizer()
    sc = Scorer(model, tok, max_length=8, batch_size=4, progress=False)
    toks = tok.encode("Alpha Beta is a test article. It has 2,000 words and more.")
    assert len(toks) > 16
    (total,) = sc.loglikelihood_rolling([toks])
    ref = 0.0
    for ctx, cont in rolling_windows(toks, tok.eos_id, 8):
        ref += naive_ll(model, ctx, cont, 8)[0]
    assert total == pytest.approx(ref, abs=1e-4)


def test_token_losses_equal_model_loss() -> None:
    model, tok = tiny_model(context_length=8), tiny_tokenizer()
    stream = torch.tensor(tok.encode("The cat sat on the mat. " * 6))
    sc = Scorer(model, tok, max_length=8, batch_size=2, progress=False)
    total, count, per = sc.token_losses(stream)
    n_win = (len(stream) - 1) // 8
    assert count == 8 * n_win and len(per) == n_win
    x = torch.stack([stream[i * 8 : i * 8 + 9] for i in range(n_win)])
    with torch.no_grad():
        loss = model(x[:, :-1], targets=x[:, 1:]).loss.item()
    assert total / count == pytest.approx(loss, abs=1e-5)


# -- metrics -------------------------------------------------------------------------------------


class FixedScorer(Scorer):
    """Returns preset log-likelihoods in request order (to test metric definitions)."""

    def __init__(self, lls: list[float]) -> None:
        super().__init__(None, tiny_tokenizer(), 64, progress=False)
        self.lls = lls

    def loglikelihood(self, pairs, desc=""):
        assert len(pairs) == len(self.lls)
        return [(x, x > -1) for x in self.lls]


def test_acc_and_acc_norm_definitions() -> None:
    items = [
        # acc picks choice 0 (higher ll); acc_norm divides by chars: -4/2 = -2 > -3/1 = -3 -> 0?
        Item(requests=[("q", " ab"), ("q", " c")], gold=1, choices=["ab", "c"]),
        Item(requests=[("q", " abcd"), ("q", " e")], gold=0, choices=["abcd", "e"]),
    ]
    lls = [-4.0, -3.5, -6.0, -2.0]
    data = TaskData("piqa", "multiple_choice", [], "local")
    data.items = lambda: items  # type: ignore[method-assign]
    res = run_task(FixedScorer(lls), data)
    # item 1: acc argmax(-4, -3.5) = 1 == gold; norm (-2, -3.5) -> 0 != gold
    # item 2: acc argmax(-6, -2) = 1 != gold; norm (-1.5, -2) -> 0 == gold
    assert res.metrics == {"acc": 0.5, "acc_norm": 0.5}
    assert res.stderr["acc"] == pytest.approx(math.sqrt(0.5) / math.sqrt(2))
    assert argmax([1.0, 1.0, 0.0]) == 0  # ties go to the first choice, like numpy


def test_stderr_formulas() -> None:
    xs = [1.0, 0.0, 1.0, 1.0]
    m = sum(xs) / 4
    assert mean_stderr(xs) == pytest.approx(math.sqrt(sum((x - m) ** 2 for x in xs) / 3) / 2)
    assert mean_stderr([1.0]) is None
    # ratio of sums with proportional items has zero error
    assert ratio_stderr([2.0, 4.0, 6.0], [1.0, 2.0, 3.0]) == pytest.approx(0.0)


def test_suite_on_fixture_files(tmp_path: Path) -> None:
    data_dir = write_eval_files(tmp_path / "data")
    model, tok = tiny_model(), tiny_tokenizer()
    sc = Scorer(model, tok, max_length=128, batch_size=4, progress=False)
    lam = run_task(sc, load_task("lambada_openai", data_dir), keep_items=True)
    lls = [r["ll"] for r in lam.per_item]
    assert lam.metrics["perplexity"] == pytest.approx(math.exp(-sum(lls) / len(lls)))
    wiki = run_task(sc, load_task("wikitext", data_dir), keep_items=True)
    items = load_task("wikitext", data_dir).items()
    total = sum(r["ll"] for r in wiki.per_item)
    assert wiki.metrics["word_perplexity"] == pytest.approx(
        math.exp(-total / sum(i.words for i in items))
    )
    assert wiki.metrics["bits_per_byte"] == pytest.approx(
        -total / sum(i.bytes for i in items) / math.log(2)
    )


# -- CLI -----------------------------------------------------------------------------------------


def test_eval_cli_on_export_dir(tmp_path: Path, capsys) -> None:
    pytest.importorskip("transformers")
    from taperlm.cli import main
    from taperlm.hf.export import export_model

    data_dir = write_eval_files(tmp_path / "data")
    export = export_model(tiny_model(), tmp_path / "export", tiny_tokenizer())
    out = tmp_path / "res.json"
    rc = main(
        ["eval", str(export), "--data-dir", str(data_dir), "--batch-size", "4", "--out", str(out)]
    )
    assert rc == 0
    table = capsys.readouterr().out
    assert "| Wiki ppl | LMB ppl | LMB acc | PIQA |" in table
    blob = json.loads(out.read_text())
    assert set(blob["tasks"]) == {
        "wikitext",
        "lambada_openai",
        "piqa",
        "hellaswag",
        "winogrande",
        "arc_easy",
        "arc_challenge",
        "social_iqa",
        "boolq",
    }
    assert "val skipped" in blob["meta"]["notes"][0]
    piqa = blob["tasks"]["piqa"]
    assert piqa["n"] == 2 and piqa["settings"]["max_length"] == 128
    assert piqa["settings"]["files"][0]["sha256"]
    row = blob["paper_table"]
    accs = [row[c] for c in ("LMB acc", "PIQA", "Hella", "Wino", "ARC-e", "ARC-c", "SIQA", "BoolQ")]
    assert row["Avg"] == pytest.approx(sum(accs) / 8)
    assert row["Hella"] == pytest.approx(100 * blob["tasks"]["hellaswag"]["metrics"]["acc_norm"])


def test_eval_cli_errors(tmp_path: Path, capsys) -> None:
    from taperlm.cli import main

    assert main(["eval", str(tmp_path), "--tasks", "mmlu"]) == 2
    assert "unknown task 'mmlu'" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "nope"), "--tasks", "piqa"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_eval_auto_runs_what_it_has_and_names_the_rest(tmp_path: Path, capsys) -> None:
    """The default `--tasks auto`: every task whose files are present, a note naming the others
    with the options that get them; with nothing to run, an error that says the same."""
    pytest.importorskip("transformers")
    import shutil

    from taperlm.cli import main
    from taperlm.hf.export import export_model

    data_dir = write_eval_files(tmp_path / "data")
    shutil.rmtree(data_dir / "piqa")
    shutil.rmtree(data_dir / "boolq")
    export = export_model(tiny_model(), tmp_path / "export", tiny_tokenizer())
    out = tmp_path / "res.json"
    argv = [
        "eval",
        str(export),
        "--data-dir",
        str(data_dir),
        "--batch-size",
        "4",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    capsys.readouterr()
    blob = json.loads(out.read_text())
    assert "piqa" not in blob["tasks"] and "boolq" not in blob["tasks"]
    assert {"wikitext", "hellaswag", "arc_easy"} <= set(blob["tasks"])
    (note,) = [n for n in blob["meta"]["notes"] if "skipped" in n and "zero-shot" in n]
    assert "piqa, boolq" in note and "--tasks paper --source hf" in note

    # the suite runs with the evaluation-data lookup off (conftest.py)
    assert main(["eval", str(export)]) == 2
    err = capsys.readouterr().err
    assert_naming(err, "--source hf", "--data-dir DIR", "val", "run data dir")

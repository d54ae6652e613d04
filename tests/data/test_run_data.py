"""Class 5 of issue 16: a run is bound to its data and tokenizer.

A run is trained on a data dir, which is then re-prepared in place with another tokenizer (and
other text). Each command that reads the run must either use the run's own tokenizer copy --
giving exactly the output it gave before the re-prepare -- or stop with an error saying what
changed: never a silent wrong number.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import fault_harness as H
from taperlm.cli import main as cli_main
from taperlm.data.identity import RECORD_FILE, TOKENIZER_COPY, read_record


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = cli_main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _eval_files(root: Path) -> Path:
    d = root / "evaldata"
    (d / "arc").mkdir(parents=True)
    rows = [
        {"query": "Question: who rules the castle?\nAnswer:", "choices": ["the king", "bread"], "gold": 0},
        {"query": "Question: what burns?\nAnswer:", "choices": ["fire", "the river"], "gold": 0},
    ]  # fmt: skip
    (d / "arc" / "arc_easy_test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(data dir, run, eval data, text, outputs of every command before the re-prepare), with
    the data dir re-prepared afterwards with another tokenizer."""
    root = tmp_path_factory.mktemp("rundata")
    data = H.prepare_data(root / "d")
    run = root / "run"
    assert cli_main([*H.train_argv(data, run), "--stop-after-steps", "2"]) == 0
    evaldata = _eval_files(root)
    text = root / "text.txt"
    text.write_text(H.corpus_text(300, seed=3))
    return root, data, run, evaldata, text


def _commands(run: Path, evaldata: Path, text: Path, out: Path) -> dict[str, list[str]]:
    return {
        "eval": ["eval", str(run), "--tasks", "arc_easy", "--data-dir", str(evaldata),
                 "--device", "cpu", "--json"],
        "generate": ["generate", str(run), "--prompt", "The king", "--temperature", "0",
                     "--max-new-tokens", "12", "--device", "cpu"],
        "novelty": ["novelty", str(run), "--data", str(text), "--tokens", "64", "--seq-len",
                    "32", "--device", "cpu", "--json"],
        "export": ["export", str(run), "--out", str(out)],
    }  # fmt: skip


def _numbers(cmd: str, stdout: str) -> object:
    if cmd == "eval":
        return {k: v["metrics"] for k, v in json.loads(stdout)["tasks"].items()}
    if cmd == "novelty":
        blob = json.loads(stdout)
        return [blob["layers"], blob["input_tokens"]]
    if cmd == "export":  # its tokenizer is compared below
        return None
    return stdout


def test_every_reader_uses_the_runs_tokenizer_after_a_re_prepare(world, tmp_path, capsys):
    root, data, run, evaldata, text = world
    pytest.importorskip("transformers")
    work = tmp_path / "copy"
    shutil.copytree(root, work, symlinks=True)
    data, run = work / data.relative_to(root), work / run.relative_to(root)
    # the run dir records where its data was: point the copy's config at the copied data
    cfg = (run / "config.yaml").read_text().replace(str(root), str(work))
    (run / "config.yaml").write_text(cfg)
    evaldata, text = work / evaldata.relative_to(root), work / text.relative_to(root)
    record = read_record(run)
    assert record is not None and (run / TOKENIZER_COPY / "tokenizer.json").is_file()
    original_tok = (run / TOKENIZER_COPY / "tokenizer.json").read_bytes()
    assert original_tok == (data / "tokenizer" / "tokenizer.json").read_bytes()

    before = {}
    for cmd, argv in _commands(run, evaldata, text, tmp_path / "export0").items():
        rc, out, err = _cli(argv, capsys)
        assert rc == 0, (cmd, err)
        before[cmd] = _numbers(cmd, out)

    # re-prepare the data dir in place: other text, another tokenizer (same vocab size)
    other = tmp_path / "other.txt"
    other.write_text(H.corpus_text(6000, seed=11).upper())
    prep = ["prepare", "--source", str(other), "--tokenizer", "bpe:300", "--out", str(data)]
    assert cli_main([*prep, "--val-tokens", "400", "--workers", "1", "--no-progress"]) == 0
    capsys.readouterr()
    assert (data / "tokenizer" / "tokenizer.json").read_bytes() != original_tok

    snapshot = H.snapshot(run)
    for cmd, argv in _commands(run, evaldata, text, tmp_path / "export1").items():
        rc, out, err = _cli(argv, capsys)
        assert rc == 0, (cmd, err)
        assert _numbers(cmd, out) == before[cmd], cmd  # the run's own tokenizer: same output
    exported = (tmp_path / "export1" / "tokenizer.json").read_text()
    assert json.loads(exported)["model"] == json.loads(original_tok)["model"]
    assert H.snapshot(run) == snapshot

    # what reads the data dir's tokens again stops, naming both tokenizers (the one refusal of
    # weights meeting another tokenizer's data, tests/data/test_tokenizer_binding.py)
    mismatch = f"{run} was trained with another tokenizer than the data dir {data} holds"
    for argv in (["eval", str(run), "--tasks", "val", "--device", "cpu"],
                 ["train", "--out", str(run), "--no-progress"]):  # fmt: skip
        rc, _, err = _cli(argv, capsys)
        assert rc == 2 and mismatch in err, err
        assert f"--tokenizer {run / TOKENIZER_COPY} " in err
    assert H.snapshot(run) == snapshot

    # the run's tokenizer survives even the data dir's removal
    shutil.rmtree(data)
    rc, out, err = _cli(_commands(run, evaldata, text, tmp_path / "x")["generate"], capsys)
    assert rc == 0 and out == before["generate"], err


def test_same_tokenizer_other_tokens_is_caught_on_resume(world, tmp_path, capsys):
    """Re-prepared with the same tokenizer (reused) but other text: resuming would train on
    other tokens at the saved position; it stops instead."""
    _, data, run, _, _ = world
    run_copy = tmp_path / "run"
    shutil.copytree(run, run_copy)
    data_copy = tmp_path / "data"
    shutil.copytree(data, data_copy)
    other = tmp_path / "other.txt"
    other.write_text(H.corpus_text(6000, seed=12))
    prep = ["prepare", "--source", str(other), "--tokenizer", str(data), "--out", str(data_copy)]
    assert cli_main([*prep, "--val-tokens", "400", "--workers", "1", "--no-progress"]) == 0
    capsys.readouterr()
    before = H.snapshot(run_copy)
    rc, _, err = _cli(H.train_argv(data_copy, run_copy), capsys)
    assert rc == 2 and "its train split holds other tokens" in err, err
    assert H.snapshot(run_copy) == before


def test_runs_without_a_record_keep_working(world, tmp_path, capsys):
    """Runs written before the record existed use their data dir's tokenizer as before."""
    _, data, run, evaldata, text = world
    run_copy = tmp_path / "run"
    shutil.copytree(run, run_copy)
    (run_copy / RECORD_FILE).unlink()
    shutil.rmtree(run_copy / TOKENIZER_COPY)
    argv = _commands(run_copy, evaldata, text, tmp_path / "e")["generate"]
    rc, out, err = _cli(argv, capsys)
    assert rc == 0 and out.startswith("The king"), err
    rc, _, err = _cli(["eval", str(run_copy), "--tasks", "val", "--device", "cpu"], capsys)
    assert rc == 0, err
    # resuming such a run records its data from then on
    assert _cli([*H.train_argv(data, run_copy), "--stop-after-steps", "3"], capsys)[0] == 0
    assert read_record(run_copy) is not None


def _reprepare_from_other_text(data: Path, tmp_path: Path, capsys) -> None:
    """Prepare `data` again, in place, from other text with the same tokenizer spec."""
    other = tmp_path / "other.txt"
    other.write_text(H.corpus_text(6000, seed=13).upper())
    prep = ["prepare", "--source", str(other), "--tokenizer", "bpe:300", "--out", str(data)]
    assert cli_main([*prep, "--val-tokens", "400", "--workers", "1", "--no-progress"]) == 0
    capsys.readouterr()


def test_compare_stops_when_its_data_was_re_prepared(tmp_path, capsys):
    """A comparison whose data dir was re-prepared between two invocations: its finished cells
    were trained on the old data, so mixing them with new ones is refused."""
    data = H.prepare_data(tmp_path / "d")
    out = tmp_path / "cmp"
    argv = H.compare_argv(data, out)
    rc, _, err = _cli(argv, capsys)
    assert rc == 0, err
    result = (out / "runs" / "uniform-s0" / "result.json").read_bytes()
    _reprepare_from_other_text(data, tmp_path, capsys)
    rc, _, err = _cli(argv, capsys)
    assert rc == 2 and "uniform-s0 was trained on other data than" in err, err
    assert "another tokenizer" in err and "fresh --out" in err
    assert (out / "runs" / "uniform-s0" / "result.json").read_bytes() == result


def test_compare_stops_when_kept_results_were_trained_on_other_data(tmp_path, capsys):
    """A finished cell needs only its result.json (benchmarks/results keeps no more), and that
    holds no data record but the fingerprint of its first batches: a comparison continued on
    other data (here re-prepared from other text; in life, the built-in corpus rebuilt from
    updated documentation packages under another folder) is refused by that fingerprint, while
    on the same data the kept cells are reused as they are."""
    data = H.prepare_data(tmp_path / "d")
    out = tmp_path / "cmp"
    argv = H.compare_argv(data, out)
    rc, _, err = _cli(argv, capsys)
    assert rc == 0, err
    cell = out / "runs" / "uniform-s0"
    result = (cell / "result.json").read_bytes()
    for p in cell.iterdir():  # keep result.json alone
        if p.name != "result.json":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    rc, _, err = _cli(argv, capsys)
    assert rc == 0, err
    assert (cell / "result.json").read_bytes() == result  # reused, not retrained
    assert not (cell / "metrics.jsonl").exists()
    _reprepare_from_other_text(data, tmp_path, capsys)
    rc, _, err = _cli(argv, capsys)
    assert rc == 2 and "uniform-s0 was trained on other data than" in err, err
    assert "the first batches of seed 0 differ from those its result.json records" in err
    assert "Debian documentation" not in err and "fresh --out" in err
    assert (cell / "result.json").read_bytes() == result


def test_other_data_of_the_built_in_corpus_names_the_packages(tmp_path):
    """The refusal for the built-in corpus (a cache folder `default-...`) says where other data
    comes from: other versions of the documentation packages, and how to get the latest."""
    import json as _json

    from taperlm.compare import cell as compare_cell
    from taperlm.compare import results
    from taperlm.compare.grid import Allocation, Cell
    from taperlm.config import run_config_from_dict
    from taperlm.spec.taper import TaperSpec

    data = H.prepare_data(tmp_path / "d")
    default = tmp_path / "cache" / "default-bpe300-0123456789ab"
    shutil.copytree(data, default)
    cfg = run_config_from_dict(
        {
            "model": {"family": "transformer", "vocab_size": 300},
            "train": {"seq_len": 32, "micro_batch_size": 2, "batch_tokens": 64},
        }
    )
    cell = Cell(Allocation("uniform", "uniform", TaperSpec.parse("uniform")), 0, cfg)
    right = compare_cell.data_order_fingerprint(cell, default)
    assert compare_cell._other_data_order(cell, default, right) is None
    wrong = results.DataOrder(right.steps, "0" * 64, [1, 2, 3, 4])
    why = compare_cell._other_data_order(cell, default, wrong)
    assert why and "Debian documentation packages" in why and "apt-get install" in why
    assert "[1, 2, 3, 4]..." in why and _json.dumps(right.first_ids[:4])[1:-1] in why

"""`taperlm prepare` end to end through the CLI, on small text the tests write themselves."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from taperlm.cli import main
from taperlm.data import corpus
from taperlm.data.prepare import choose_validation, prepare
from taperlm.data.shards import open_shard
from taperlm.data.tokenizer import load_tokenizer
from test_data import fake_debian_root, make_text


@pytest.fixture
def text_folder(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for i in range(12):
        (src / f"doc{i:02d}.txt").write_text(make_text(300, i))
    rows = [{"text": make_text(100, 100 + i)} for i in range(20)]
    (src / "sub" / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return src


def _docs_of(tokens: np.ndarray, tok) -> list[str]:
    """Split a shard at EOS and decode each document."""
    ids = np.asarray(tokens).tolist()
    docs, cur = [], []
    for t in ids:
        if t == tok.eos_id:
            docs.append(tok.decode(cur))
            cur = []
        else:
            cur.append(t)
    assert cur == []  # every document ends with EOS
    return docs


def test_prepare_cli_end_to_end(text_folder: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "data"
    argv = [
        "prepare",
        "--source",
        str(text_folder),
        "--tokenizer",
        "bpe:320",
        "--out",
        str(out),
        "--val-fraction",
        "0.1",
        "--no-progress",
    ]
    assert main([*argv, "--workers", "2"]) == 0
    assert "wrote" in capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    assert meta["vocab_size"] == 320 and meta["eos_id"] == 0 and meta["dtype"] == "uint16"
    assert meta["val_split"]["mode"] == "documents"
    train, val = meta["splits"]["train"], meta["splits"]["val"]
    assert train["documents"] + val["documents"] == 32 == meta["source"]["documents"]
    assert val["tokens"] >= meta["val_split"]["tokens_target"]

    tok = load_tokenizer(out)
    texts = [d.text for d in corpus.iter_local(text_folder)]
    _, train_tokens = open_shard(out / "train.bin", verify=True)
    _, val_tokens = open_shard(out / "val.bin", verify=True)
    train_docs, val_docs = _docs_of(train_tokens, tok), _docs_of(val_tokens, tok)
    # Lossless: every source document is in exactly one split, each split in corpus order.
    assert sorted(train_docs + val_docs) == sorted(texts)
    assert train_docs == [t for t in texts if t in set(train_docs)]
    assert val_docs == [t for t in texts if t in set(val_docs)]

    # One worker gives byte-identical output; re-running over a prepare output is allowed.
    out1 = tmp_path / "data1"
    assert (
        main(
            [
                *argv[:-3],
                "--out",
                str(out1),
                "--val-fraction",
                "0.1",
                "--workers",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    for name in ("train.bin", "val.bin", "tokenizer/tokenizer.json"):
        assert (out / name).read_bytes() == (out1 / name).read_bytes()
    assert main([*argv, "--workers", "1", "--seed", "3"]) == 0
    assert json.loads((out / "meta.json").read_text())["val_split"]["seed"] == 3
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_prepare_refuses_foreign_folder(text_folder: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    argv = [
        "prepare",
        "--source",
        str(text_folder),
        "--tokenizer",
        "bpe:300",
        "--out",
        str(out),
        "--workers",
        "1",
        "--no-progress",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "taperlm prepare: error:" in err and "--force" in err
    assert main([*argv, "--force"]) == 0
    assert (out / "notes.txt").read_text() == "keep me" and (out / "meta.json").is_file()


def test_prepare_errors_name_the_problem(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "src"
    bad.mkdir()
    (bad / "ok.txt").write_text("fine text")
    (bad / "latin.txt").write_bytes("caf\u00e9".encode("latin-1"))
    assert (
        main(
            [
                "prepare",
                "--source",
                str(bad),
                "--out",
                str(tmp_path / "o"),
                "--workers",
                "1",
                "--no-progress",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert str(bad / "latin.txt") in err and "not valid UTF-8" in err
    assert (
        main(
            [
                "prepare",
                "--source",
                str(bad / "ok.txt"),
                "--out",
                str(tmp_path / "o2"),
                "--val-fraction",
                "0.9",
                "--no-progress",
            ]
        )
        == 2
    )
    assert "--val-fraction must be in (0, 0.5], got 0.9" in capsys.readouterr().err


def test_single_document_uses_tail_split(tmp_path: Path) -> None:
    src = tmp_path / "one.txt"
    src.write_text(make_text(2000, 1))
    meta = prepare(str(src), tmp_path / "d", "bpe:300", val_tokens=100, workers=1, progress=False)
    assert meta["val_split"]["mode"] == "tail"
    assert meta["splits"]["val"]["tokens"] == 100
    assert meta["splits"]["train"]["documents"] == meta["splits"]["val"]["documents"] == 1


def test_choose_validation() -> None:
    lengths = np.array([10] * 100)
    mask = choose_validation(lengths, 50, seed=0)
    assert mask is not None and mask.sum() == 5
    assert np.array_equal(mask, choose_validation(lengths, 50, seed=0))
    assert not np.array_equal(mask, choose_validation(lengths, 50, seed=1))
    assert choose_validation(np.array([1000, 1000]), 10, seed=0) is None  # too coarse
    assert choose_validation(np.array([50]), 10, seed=0) is None


def test_gpt2_tokenizer_and_max_chars(shared_data: Path, text_folder: Path, tmp_path: Path) -> None:
    gpt2 = shared_data / "tokenizers" / "gpt2"
    meta = prepare(
        str(text_folder),
        tmp_path / "g",
        str(gpt2),
        max_chars=5000,
        workers=1,
        val_tokens=50,
        progress=False,
    )
    assert meta["vocab_size"] == 50257 and meta["eos_id"] == 50256
    assert meta["source"]["chars"] == 5000
    tok = load_tokenizer(tmp_path / "g")
    assert tok.encode("Hello world") == [15496, 995]


def test_prepare_default_corpus_fake_tree(tmp_path: Path) -> None:
    root = fake_debian_root(tmp_path / "root")
    meta = prepare(
        "default",
        tmp_path / "d",
        "bpe:300",
        workers=1,
        progress=False,
        corpus_root=root,
        val_tokens=20,
    )
    assert meta["source"]["kind"] == "default" and meta["source"]["documents"] == 4
    assert meta["source"]["install"] == corpus.INSTALL_COMMAND


def test_prepare_default_corpus_installed(tmp_path: Path) -> None:
    try:
        corpus.default_corpus_files()
    except corpus.DataError:
        pytest.skip("Debian documentation packages not installed: " + corpus.INSTALL_COMMAND)
    assert (
        main(
            [
                "prepare",
                "--out",
                str(tmp_path / "d"),
                "--tokenizer",
                "bpe:512",
                "--max-chars",
                "200000",
                "--workers",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    assert meta["source"]["chars"] == 200000
    assert 30_000 < meta["splits"]["train"]["tokens"] < 120_000


def test_progress_bar_shows_whole_token_counts(text_folder: Path, tmp_path: Path, capsys) -> None:
    """The tokenize bar's postfix prints its token count as a whole number with separators
    (tqdm's default would print 6.1e+06)."""
    import re

    prepare(str(text_folder), tmp_path / "data", "bpe:320", val_tokens=200, progress=True)
    err = capsys.readouterr().err
    counts = re.findall(r"tokens=([^,\s\]]+(?:,\d{3})*)", err)
    assert counts, err[-500:]
    assert all(re.fullmatch(r"\d{1,3}(,\d{3})*", c) for c in counts), counts
    assert int(counts[-1].replace(",", "")) > 1000  # large enough for tqdm to use e-notation

"""`taperlm prepare` end to end, on small text the tests write themselves."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_naming, raises_naming
from legacy_data import write_v1_data_dir
from taperlm.cli import main
from taperlm.data import corpus, datadir, encode, identity, shards, val_split
from taperlm.data import prepare as prep
from taperlm.data.loader import TokenBatches, open_split, val_batches
from taperlm.data.prepare import doc_hash, prepare
from taperlm.data.progress import Progress, format_status
from taperlm.data.tokenizer import Tokenizer, load_tokenizer, train_bpe
from taperlm.errors import DataError
from test_data import fake_debian_root, make_text


def write_folder(src: Path, n_txt: int = 12, n_rows: int = 20, words: int = 300) -> Path:
    (src / "sub").mkdir(parents=True)
    for i in range(n_txt):
        (src / f"doc{i:02d}.txt").write_text(make_text(words, i))
    rows = [{"text": make_text(100, 100 + i)} for i in range(n_rows)]
    (src / "sub" / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return src


@pytest.fixture
def text_folder(tmp_path: Path) -> Path:
    return write_folder(tmp_path / "src")


def _docs_of(tokens, tok: Tokenizer) -> list[str]:
    """Split a token stream at EOS and decode each document."""
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


def digest(data_dir: Path) -> dict[str, str]:
    """sha256 of every file a data dir consists of (meta.json, shards, tokenizer files)."""
    meta = json.loads((data_dir / "meta.json").read_text())
    names = ["meta.json", *datadir.referenced_files(meta)]
    names += [f"tokenizer/{p.name}" for p in sorted((data_dir / "tokenizer").iterdir())]
    return {n: hashlib.sha256((data_dir / n).read_bytes()).hexdigest() for n in names}


def loaded(data_dir: Path) -> tuple:
    """What a reader of the data dir gets: meta, both splits' tokens, the tokenizer, and what a
    run starting on it records (its data identity and its own copy of the tokenizer)."""
    meta, train = open_split(data_dir, "train", verify=True)
    _, val = open_split(data_dir, "val", verify=True)
    tok = load_tokenizer(data_dir).backend.to_str()
    with tempfile.TemporaryDirectory() as run:
        record = identity.record_run_data(run, data_dir)
        copy = (Path(run) / identity.TOKENIZER_COPY / "tokenizer.json").read_text()
        assert identity.read_record(run) == record
    assert record == identity.data_identity(data_dir)
    assert record["tokenizer"]["sha256"] == hashlib.sha256(copy.encode()).hexdigest()
    del record["data_dir"]
    return (
        json.dumps(meta, sort_keys=True),
        np.asarray(train).tobytes(),
        np.asarray(val).tobytes(),
        tok,
        json.dumps(record, sort_keys=True),
        copy,
    )


ARGS = ["--tokenizer", "bpe:320", "--val-fraction", "0.1", "--shard-tokens", "3000"]


def _argv(src: Path, out: Path, *extra: str) -> list[str]:
    return ["prepare", "--source", str(src), "--out", str(out), *ARGS, "--no-progress", *extra]


def test_prepare_cli_end_to_end(text_folder: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "data"
    assert main([*_argv(text_folder, out), "--workers", "2"]) == 0
    printed = capsys.readouterr().out
    assert "wrote" in printed and "shards)" in printed
    meta = json.loads((out / "meta.json").read_text())
    assert meta["format_version"] == 2 and meta["shard_tokens"] == 3000
    assert meta["vocab_size"] == 320 and meta["eos_id"] == 0 and meta["dtype"] == "uint16"
    assert meta["val_split"]["mode"] == "documents"
    train, val = meta["splits"]["train"], meta["splits"]["val"]
    assert train["documents"] + val["documents"] == 32 == meta["source"]["documents"]
    assert len(train["shards"]) == -(-train["tokens"] // 3000) > 1
    assert all(s["tokens"] == 3000 for s in train["shards"][:-1])

    tok = load_tokenizer(out)
    texts = [d.text for d in corpus.iter_local(text_folder)]
    train_docs = _docs_of(open_split(out, "train", verify=True)[1], tok)
    val_docs = _docs_of(open_split(out, "val", verify=True)[1], tok)
    # The split rule: exactly the documents whose seeded hash is below the fraction, in order.
    assert val_docs == [t for t in texts if doc_hash(t, 0) < 0.1]
    assert train_docs == [t for t in texts if doc_hash(t, 0) >= 0.1]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            ".prepare.lock",
            ".taperlm-prepare",
            "meta.json",
            "tokenizer",
            *datadir.referenced_files(meta),
        ]
    )

    # Re-running over a prepare output is allowed and replaces it (here with another seed).
    assert main([*_argv(text_folder, out), "--workers", "1", "--seed", "3"]) == 0
    meta3 = json.loads((out / "meta.json").read_text())
    assert meta3["val_split"]["seed"] == 3
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert not (out / datadir.WORK_DIR).exists() and not (out / datadir.COMMIT_DIR).exists()


def test_output_is_identical_for_any_workers_and_batching(
    text_folder: Path, tmp_path: Path, monkeypatch
) -> None:
    runs = {}
    for workers, batch_chars in [(1, 1 << 20), (2, 1 << 20), (3, 2000), (1, 700)]:
        monkeypatch.setattr(prep, "_BATCH_CHARS", batch_chars)
        out = tmp_path / f"w{workers}-{batch_chars}"
        assert main([*_argv(text_folder, out), "--workers", str(workers)]) == 0
        runs[out.name] = digest(out)
    first = next(iter(runs.values()))
    assert all(d == first for d in runs.values()), runs


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


def test_val_tokens_caps_the_picks_and_the_tail_fills_up(text_folder: Path, tmp_path: Path):
    texts = [d.text for d in corpus.iter_local(text_folder)]
    picks = [t for t in texts if doc_hash(t, 0) < 0.3]
    assert len(picks) >= 4
    common = dict(tokenizer="bpe:320", workers=1, progress=False, val_fraction=0.3)
    meta = prepare(str(text_folder), tmp_path / "a", val_tokens=300, **common)
    tok = load_tokenizer(tmp_path / "a")
    val_docs = _docs_of(open_split(tmp_path / "a", "val")[1], tok)
    n_taken = len(val_docs)
    assert val_docs == picks[:n_taken] and n_taken < len(picks)  # stopped once >= 300 tokens
    assert meta["val_split"]["mode"] == "documents" and meta["splits"]["val"]["tokens"] >= 300
    train_docs = _docs_of(open_split(tmp_path / "a", "train")[1], tok)
    assert train_docs == [t for t in texts if t not in val_docs]  # later picks went to train

    # More than the picks hold: the end of the training stream makes up the rest.
    total = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
    big = total // 2
    meta = prepare(str(text_folder), tmp_path / "b", val_tokens=big, **common)
    assert meta["val_split"]["mode"] == "documents+tail"
    assert meta["splits"]["val"]["tokens"] == big
    _, train = open_split(tmp_path / "b", "train")
    _, val = open_split(tmp_path / "b", "val")
    pick_tokens = sum(len(tok.encode(t)) + 1 for t in picks)
    assert val[:pick_tokens].tolist() == [i for t in picks for i in [*tok.encode(t), tok.eos_id]]
    train_stream = [i for t in texts if t not in picks for i in [*tok.encode(t), tok.eos_id]]
    assert np.asarray(train).tolist() + np.asarray(val[pick_tokens:]).tolist() == train_stream
    docs = meta["splits"]
    assert docs["train"]["documents"] + docs["val"]["documents"] > len(texts)  # one is cut in two

    with raises_naming(DataError, f"{total:,} tokens", "--val-fraction/--val-tokens"):
        prepare(str(text_folder), tmp_path / "c", val_tokens=total, **common)


def test_single_document_uses_tail_split(tmp_path: Path) -> None:
    src = tmp_path / "one.txt"
    src.write_text(make_text(2000, 1))
    meta = prepare(str(src), tmp_path / "d", "bpe:300", val_tokens=100, workers=1, progress=False)
    assert meta["val_split"]["mode"] == "tail"
    assert meta["splits"]["val"]["tokens"] == 100
    assert meta["splits"]["train"]["documents"] == meta["splits"]["val"]["documents"] == 1
    # Also when the one document is the validation pick (then it is the training stream).
    seed = next(s for s in range(100) if doc_hash(src.read_text(), s) < 0.5)
    meta = prepare(str(src), tmp_path / "e", "bpe:300", val_fraction=0.5, seed=seed, workers=1,
                   progress=False)  # fmt: skip
    assert meta["val_split"]["mode"] == "tail"
    total = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
    assert meta["splits"]["val"]["tokens"] == round(0.5 * total)


def test_max_tokens_is_exact_and_a_prefix(text_folder: Path, tmp_path: Path) -> None:
    common = dict(tokenizer=str(tmp_path / "full"), workers=1, progress=False, val_fraction=0.1)
    full = prepare(str(text_folder), tmp_path / "full", "bpe:320", workers=1, progress=False,
                   val_fraction=0.1)  # fmt: skip
    n = full["splits"]["train"]["tokens"] // 3
    meta = prepare(str(text_folder), tmp_path / "cut", max_tokens=n, **common)
    assert meta["splits"]["train"]["tokens"] == n and meta["max_tokens"] == n
    _, whole = open_split(tmp_path / "full", "train")
    _, part = open_split(tmp_path / "cut", "train")
    assert np.array_equal(np.asarray(part), np.asarray(whole[:n]))
    _, val_whole = open_split(tmp_path / "full", "val")
    _, val_part = open_split(tmp_path / "cut", "val")
    assert np.array_equal(np.asarray(val_part), np.asarray(val_whole[: len(val_part)]))
    assert meta["source"]["documents"] < full["source"]["documents"]  # stopped reading early
    # With --val-tokens the stream is read on for validation documents only.
    target = full["splits"]["val"]["tokens"]
    meta = prepare(str(text_folder), tmp_path / "v", max_tokens=n, val_tokens=target, **common)
    assert meta["splits"]["train"]["tokens"] == n and meta["val_split"]["mode"] == "documents"
    _, val_v = open_split(tmp_path / "v", "val")
    assert np.array_equal(np.asarray(val_v), np.asarray(val_whole))


def test_tokenizer_is_trained_on_a_sample_of_training_documents(
    text_folder: Path, tmp_path: Path
) -> None:
    meta = prepare(str(text_folder), tmp_path / "d", "bpe:300", val_fraction=0.2,
                   tokenizer_sample_chars=5000, workers=1, progress=False)  # fmt: skip
    assert meta["tokenizer"]["sample_chars"] == 5000
    sample, left = [], 5000
    for doc in corpus.iter_local(text_folder):
        if doc_hash(doc.text, 0) >= 0.2 and left > 0:
            sample.append(doc.text[:left])
            left -= len(sample[-1])
    expected = train_bpe(sample, 300)
    assert load_tokenizer(tmp_path / "d").backend.to_str() == expected.backend.to_str()


def test_refuses_foreign_folder_and_bad_arguments(text_folder: Path, tmp_path: Path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    argv = _argv(text_folder, out, "--workers", "1")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "taperlm prepare: error:" in err and "--force" in err
    assert main([*argv, "--force"]) == 0
    assert (out / "notes.txt").read_text() == "keep me" and (out / "meta.json").is_file()
    # The command line checks each option's domain before any work (taperlm.spec.domains) ...
    for bad, message in [
        # the option, its allowed range and the value given
        (["--val-fraction", "0.9"], ("--val-fraction", "(0, 0.5]", "0.9")),
        (["--max-tokens", "1"], ("--max-tokens", ">= 2", "got 1")),
        (["--val-tokens", "1e0"], ("--val-tokens", ">= 2", "got 1")),
        (["--shard-tokens", "0"], ("--shard-tokens", ">= 1", "got 0")),
        (["--tokenizer-sample-chars", "0"], ("--tokenizer-sample-chars", ">= 1", "got 0")),
        (["--max-doc-chars", "0"], ("--max-doc-chars", ">= 1", "got 0")),
        (["--workers", "0"], ("--workers", ">= 1", "got 0")),
    ]:
        assert main([*_argv(text_folder, tmp_path / "x"), *bad]) == 2
        assert_naming(capsys.readouterr().err, *message)
    with pytest.raises(SystemExit) as exit_:  # argparse's own usage error
        main([*_argv(text_folder, tmp_path / "x"), "--max-tokens", "2.5"])
    assert exit_.value.code == 2
    assert_naming(capsys.readouterr().err, "--max-tokens", "whole number", "'2.5'")
    assert not (tmp_path / "x").exists()
    # ... and prepare() itself, for callers that skip the command line.
    for bad, message in [
        ({"val_fraction": 0.9}, ("--val-fraction 0.9", "(0, 0.5]")),
        ({"max_tokens": 1}, ("--max-tokens 1", ">= 2")),
        ({"shard_tokens": 0}, ("--shard-tokens 0", ">= 1")),
        ({"tokenizer_sample_chars": 0}, ("--tokenizer-sample-chars 0",)),
        ({"max_doc_chars": 0}, ("--max-doc-chars 0", "positive")),
        ({"workers": 0}, ("--workers 0", "1")),
    ]:
        with raises_naming(DataError, *message):
            prepare(str(text_folder), tmp_path / "x", "bpe:300", progress=False, **bad)
    assert not (tmp_path / "x").exists()


def test_count_arguments_accept_readable_numbers(text_folder: Path, tmp_path: Path) -> None:
    from taperlm.spec.domains import count

    _count = count("[1, inf)")
    assert _count("30e9") == _count("30_000_000_000") == _count("30,000,000,000") == 30 * 10**9
    with raises_naming(Exception, "whole number", "'2.5'"):
        _count("2.5")


def test_gpt2_tokenizer_and_max_chars(shared_data: Path, text_folder: Path, tmp_path: Path) -> None:
    gpt2 = shared_data / "tokenizers" / "gpt2"
    meta = prepare(str(text_folder), tmp_path / "g", str(gpt2), max_chars=5000, workers=1,
                   val_tokens=50, progress=False)  # fmt: skip
    assert meta["vocab_size"] == 50257 and meta["eos_id"] == 50256
    assert meta["source"]["chars"] == 5000
    assert "sample_chars" not in meta["tokenizer"]
    tok = load_tokenizer(tmp_path / "g")
    assert tok.encode("Hello world") == [15496, 995]


def test_prepare_default_corpus_fake_tree(tmp_path: Path) -> None:
    root = fake_debian_root(tmp_path / "root")
    meta = prepare("default", tmp_path / "d", "bpe:300", workers=1, progress=False,
                   corpus_root=root, val_tokens=20)  # fmt: skip
    assert meta["source"]["kind"] == "default" and meta["source"]["documents"] == 4
    assert meta["source"]["install"] == corpus.INSTALL_COMMAND


def test_prepare_default_corpus_installed(tmp_path: Path) -> None:
    try:
        corpus.default_corpus_files()
    except corpus.DataError:
        pytest.skip("Debian documentation packages not installed: " + corpus.INSTALL_COMMAND)
    argv = ["prepare", "--out", str(tmp_path / "d"), "--tokenizer", "bpe:512"]
    assert main([*argv, "--max-chars", "200000", "--workers", "1", "--no-progress"]) == 0
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    assert meta["source"]["chars"] == 200000
    assert 30_000 < meta["splits"]["train"]["tokens"] < 120_000


def test_progress_bar_shows_whole_token_counts(text_folder: Path, tmp_path: Path, capsys) -> None:
    """The tokenize status line prints its counts as whole numbers with separators (never
    6.1e+06), and a last line when the stage ends even in a log (not a terminal)."""
    prepare(str(text_folder), tmp_path / "data", "bpe:320", val_tokens=200, progress=True)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("tokenize |")]
    assert lines
    counts = re.findall(r"\| ([\d,]+) (?:docs|tokens)(?= \|)", lines[-1])
    assert len(counts) == 2 and all(re.fullmatch(r"\d{1,3}(,\d{3})*", c) for c in counts), lines
    assert int(counts[1].replace(",", "")) > 1000  # large enough for e-notation to show


# --- old data dirs ---------------------------------------------------------------------------------


def test_format_1_data_dir_still_loads_and_is_replaced_cleanly(text_folder: Path, tmp_path: Path):
    texts = [make_text(120, i) for i in range(20)]
    old = write_v1_data_dir(tmp_path / "old", texts)
    meta, train = open_split(old, "train", verify=True)
    assert meta["format_version"] == 1 and len(train) == meta["splits"]["train"]["tokens"]
    tok = load_tokenizer(old)
    assert _docs_of(train, tok) == [t for i, t in enumerate(texts) if i % 5 != 1]
    x, _y = next(TokenBatches(old, "train", seq_len=16, micro_batch_size=2))
    assert x.shape == (2, 16) and list(val_batches(old, 16, 4))
    # Its tokenizer can be reused, and a re-prepare into it leaves only the new layout.
    meta = prepare(str(text_folder), old, str(old), workers=1, progress=False, val_fraction=0.1)
    assert meta["vocab_size"] == tok.vocab_size and meta["tokenizer"]["kind"] == "bpe"
    assert not (old / "train.bin").exists() and not (old / "val.bin").exists()
    assert loaded(old)


# --- failures never damage a good data dir ---------------------------------------------------


def _boom_oserror(*_a, **_k):
    raise OSError(errno.ENOSPC, "No space left on device")


def _fail_nth(monkeypatch, owner, name, n: int, exc: BaseException) -> None:
    real = getattr(owner, name)
    calls = {"n": 0}

    def wrapper(*a, **k):
        calls["n"] += 1
        if calls["n"] == n:
            raise exc
        return real(*a, **k)

    monkeypatch.setattr(owner, name, wrapper)


FAILURES = {
    # stage: (how to make it fail, error, is the work kept for a rerun)
    "bad_source": (lambda mp, src: (src / "zz.txt").write_bytes(b""), DataError, False),
    "too_small_for_val": (lambda mp, src: None, DataError, False),
    "tokenizer_training": (
        lambda mp, src: _fail_nth(mp, prep, "train_bpe", 1, DataError("tokenizer failed")),
        DataError,
        False,
    ),
    "tokenizer_save": (
        lambda mp, src: _fail_nth(mp, Tokenizer, "save", 1, OSError(errno.ENOSPC, "full")),
        OSError,
        True,
    ),
    "disk_full_mid_stream": (
        lambda mp, src: _fail_nth(mp, shards.ShardWriter, "write", 3, OSError(errno.ENOSPC, "x")),
        OSError,
        True,
    ),
    "bad_file_mid_stream": (
        lambda mp, src: _fail_nth(mp, encode, "encode_texts", 2, DataError("bad")),
        DataError,
        False,
    ),
    "interrupt_mid_stream": (
        lambda mp, src: _fail_nth(mp, shards.ShardSeries, "_publish", 2, KeyboardInterrupt()),
        KeyboardInterrupt,
        True,
    ),
    "finish": (
        lambda mp, src: _fail_nth(mp, val_split, "_move_tail", 1, OSError(errno.EIO, "io")),
        OSError,
        True,
    ),
    "meta_write": (
        lambda mp, src: _fail_nth(mp, val_split, "_cut_state", 1, MemoryError()),
        MemoryError,
        True,
    ),
}


@pytest.mark.parametrize("stage", list(FAILURES))
def test_failed_reprepare_keeps_the_old_data_dir(
    stage: str, text_folder: Path, tmp_path: Path, monkeypatch
) -> None:
    """The class: a re-prepare failing at any stage leaves the data dir that was there exactly
    loadable as before (today's issue: a source too small for the validation split)."""
    data = tmp_path / "data"
    prepare(str(text_folder), data, "bpe:300", workers=1, progress=False, val_fraction=0.1,
            shard_tokens=3000)  # fmt: skip
    before, files = loaded(data), digest(data)
    small = tmp_path / "small"
    small.mkdir()
    for i in range(3):
        (small / f"{i}.txt").write_text(make_text(300, 7 + i))
    make_fail, error, kept = FAILURES[stage]
    make_fail(monkeypatch, small)
    kwargs = dict(workers=1, progress=False, shard_tokens=100)
    if stage in ("too_small_for_val", "finish", "meta_write"):
        kwargs["val_tokens"] = 10**6 if stage == "too_small_for_val" else 50
    monkeypatch.setattr(prep, "_BATCH_CHARS", 200)
    with pytest.raises(error):
        prepare(str(small), data, "bpe:260", **kwargs)
    assert loaded(data) == before and digest(data) == files
    assert (data / datadir.WORK_DIR).is_dir() == kept
    monkeypatch.undo()
    # The next run (here the same command) completes, continuing from kept work.
    monkeypatch.setattr(prep, "_BATCH_CHARS", 200)
    if stage != "too_small_for_val" and stage != "bad_source":
        meta = prepare(str(small), data, "bpe:260", **kwargs)
        assert (meta["_resumed"] is not None) == (kept and stage != "tokenizer_save")
        assert loaded(data) != before and not (data / datadir.WORK_DIR).exists()


def test_failure_while_moving_into_place_leaves_the_new_data_loadable(
    text_folder: Path, tmp_path: Path, monkeypatch
) -> None:
    """After the commit point the new data counts: readers see it in full while the files are
    being moved, and the next prepare (or roll_forward) finishes the move."""
    pristine = tmp_path / "pristine"
    prepare(str(text_folder), pristine, "bpe:300", workers=1, progress=False, shard_tokens=2000)
    old = loaded(pristine)
    ref = tmp_path / "ref"
    prepare(str(text_folder), ref, "bpe:280", workers=1, progress=False, shard_tokens=1500)
    new = loaded(ref)
    real_replace = datadir.os.replace
    moves = {"n": 0, "stop": 0}

    def replace(a, b):
        if Path(a).parent.name == datadir.COMMIT_DIR or Path(a).name == datadir.WORK_DIR:
            moves["n"] += 1
            if moves["n"] == moves["stop"]:
                raise OSError(errno.EIO, "stopped here")
        return real_replace(a, b)

    monkeypatch.setattr(datadir.os, "replace", replace)
    prepare(str(text_folder), tmp_path / "count", "bpe:280", workers=1, progress=False,
            shard_tokens=1500)  # fmt: skip
    total = moves["n"]  # the commit rename, every shard, the tokenizer folder, meta.json
    assert total > 5
    for k in sorted({1, 2, 3, total // 2, total - 1, total}):
        data = tmp_path / f"data{k}"
        shutil.copytree(pristine, data)
        moves.update(n=0, stop=k)
        with pytest.raises(OSError, match="stopped here"):
            prepare(str(text_folder), data, "bpe:280", workers=1, progress=False,
                    shard_tokens=1500)  # fmt: skip
        assert loaded(data) == (old if k == 1 else new), f"stopped at move {k} of {total}"
        moves["stop"] = 0
        datadir.roll_forward(data)
        assert loaded(data) == (old if k == 1 else new)
        if k > 1:
            assert digest(data) == digest(ref)
            assert not (data / datadir.COMMIT_DIR).exists()


def test_resume_after_an_interrupt_is_byte_identical(
    text_folder: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(prep, "_BATCH_CHARS", 1500)
    ref = tmp_path / "ref"
    prepare(str(text_folder), ref, "bpe:300", workers=1, progress=False, shard_tokens=700)
    out = tmp_path / "out"
    _fail_nth(monkeypatch, shards.ShardSeries, "_publish", 9, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        prepare(str(text_folder), out, "bpe:300", workers=1, progress=False, shard_tokens=700)
    monkeypatch.undo()
    state = json.loads((out / datadir.WORK_DIR / prep.STATE_FILE).read_text())
    assert state["phase"] == "stream" and state["cursor"] is not None
    with raises_naming(
        DataError, str(out), str(out / datadir.WORK_DIR), "the same prepare command"
    ):
        open_split(out, "train")
    meta = prepare(str(text_folder), out, "bpe:300", workers=2, progress=False, shard_tokens=700)
    assert meta["_resumed"]["documents"] == state["counts"]["docs"] > 0
    assert digest(out) == digest(ref)
    # Other arguments do not continue the kept work; they start over.
    _fail_nth(monkeypatch, shards.ShardSeries, "_publish", 9, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        prepare(str(text_folder), out, "bpe:300", workers=1, progress=False, shard_tokens=700)
    monkeypatch.undo()
    meta = prepare(str(text_folder), out, "bpe:300", workers=1, progress=False, shard_tokens=600)
    assert meta["_resumed"] is None


def test_a_second_prepare_on_the_same_folder_is_refused(text_folder: Path, tmp_path: Path):
    out = tmp_path / "d"
    out.mkdir()
    (out / datadir.MARKER_FILE).write_text("")
    with datadir.exclusive(out), raises_naming(DataError, "taperlm prepare", str(out), "--out"):
        prepare(str(text_folder), out, "bpe:300", workers=1, progress=False)


def test_progress_line() -> None:
    line = format_status("tokenize", bytes_done=1_500_000_000, total_bytes=3_000_000_000,
                         docs=1_234_567, tokens=6_100_000, elapsed=100.0)  # fmt: skip
    assert line == (
        "tokenize | 1.50 GB / 3.00 GB (50.0%) | 1,234,567 docs | 6,100,000 tokens | "
        "15.00 MB/s | 61,000 tokens/s | ETA 0:01:40 | elapsed 0:01:40"
    )
    line = format_status("tokenize", bytes_done=0, docs=10, tokens=500, elapsed=10.0,
                         total_tokens=1000)  # fmt: skip
    assert "500 tokens / 1,000" in line and "ETA 0:00:10" in line
    stream = io.StringIO()
    bar = Progress("x", stream=stream, interval=0.0)
    bar.update(10, 1, 5)
    bar.update(20, 2, 9)
    bar.close()
    assert stream.getvalue().count("\n") == 2 and "9 tokens" in stream.getvalue()


def test_a_worker_that_cannot_start_is_an_error_not_a_hang(tmp_path: Path) -> None:
    tok = train_bpe([make_text(200, 1)], 300)
    encoder = encode.OrderedEncoder(tok, tmp_path / "missing", workers=2, dtype=np.uint16)
    with raises_naming(DataError, "tokenizer worker", "DataError: no tokenizer"):
        list(encoder.map([(["some text"], 0)]))

"""Streaming readers: every kind of source, cutting long documents, restarting at every cursor."""

from __future__ import annotations

import gzip
import itertools
import json
import sys
import tracemalloc
import types
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import raises_naming
from taperlm.data import corpus, readers
from taperlm.data.readers import Cursor, split_long, split_stream
from taperlm.errors import DataError
from test_data import make_text

# --- cutting long documents --------------------------------------------------------------------


@pytest.mark.unit
def test_split_rule() -> None:
    # Paragraph break first, then a line break, then a space, then a hard cut; the separator at
    # the cut is dropped and whitespace-only pieces are skipped.
    assert list(split_long("aaaa\n\nbb\ncc dd", 9)) == ["aaaa", "bb\ncc dd"]
    assert list(split_long("aaaa bb\ncc dd", 9)) == ["aaaa bb", "cc dd"]
    assert list(split_long("aaaa bbbb cc", 9)) == ["aaaa", "bbbb cc"]
    assert list(split_long("abcdefghijk", 4)) == ["abcd", "efgh", "ijk"]
    assert list(split_long("ab\n\n\n\n\n\n\n\ncd", 4)) == ["ab", "cd"]
    assert list(split_long("short", 100)) == ["short"]
    assert list(split_long("   \n  ", 100)) == []


@pytest.mark.unit
@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from("ab \n\u00e9\U0001f600"), max_size=400),
    cap=st.integers(1, 40),
    cuts=st.lists(st.integers(0, 400), max_size=8),
)
def test_split_stream_is_independent_of_blocks(text: str, cap: int, cuts: list[int]) -> None:
    pieces = list(split_long(text, cap))
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
    assert list(split_stream(chunks, cap)) == pieces
    assert all(0 < len(p) <= cap and not p.isspace() for p in pieces)
    # Nothing but separators and whitespace-only pieces is dropped.
    assert "".join(pieces).replace(" ", "").replace("\n", "") == text.replace(" ", "").replace(
        "\n", ""
    )


# --- every kind of local file ------------------------------------------------------------------


def _rows(n: int, seed: int) -> list[str]:
    return [make_text(20 + (7 * i) % 50, seed + i) for i in range(n)]


def write_zst(path: Path, data: bytes) -> None:
    zstandard = pytest.importorskip("zstandard")
    path.write_bytes(zstandard.ZstdCompressor().compress(data))


def write_parquet(path: Path, texts: list, row_group_size: int = 4) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(
        pa.table({"id": list(range(len(texts))), "text": texts}),
        path,
        row_group_size=row_group_size,
    )


def mixed_folder(root: Path) -> tuple[Path, list[str]]:
    """A folder with every kind of file, and the document texts in reading order."""
    root.mkdir(parents=True, exist_ok=True)
    expected: list[str] = []
    big = "\n\n".join(make_text(40, 900 + i) for i in range(30))  # cut into pieces (cap 600)
    (root / "a.txt").write_text(big)
    expected += list(split_long(big, 600))
    rows = _rows(6, 10)
    lines = "".join(json.dumps({"text": t}) + "\n" for t in rows).encode()
    (root / "b.jsonl").write_bytes(lines)
    expected += rows
    (root / "c").mkdir()
    with gzip.open(root / "c" / "d.jsonl.gz", "wb") as f:
        f.write(lines)
    expected += rows
    write_zst(root / "c" / "e.jsonl.zst", lines)
    expected += rows
    long_row = "\n\n".join(make_text(40, 700 + i) for i in range(5))
    texts = [*_rows(5, 30), None, "  ", long_row, *_rows(3, 40)]
    write_parquet(root / "f.parquet", texts)
    expected += [t for t in texts[:5]] + list(split_long(long_row, 600)) + texts[-3:]
    return root, expected


@pytest.mark.unit
def test_every_kind_in_one_folder(tmp_path: Path) -> None:
    folder, expected = mixed_folder(tmp_path / "src")
    src = corpus.open_source(str(folder), max_doc_chars=600)
    docs = list(src.read())
    assert [d.text for d, _ in docs] == expected
    names = [d.name for d, _ in docs]
    assert names[0] == "a.txt" and names[1] == "a.txt#2"
    assert next(n for n in names if n.startswith("c/d")) == "c/d.jsonl.gz:1"
    assert "f.parquet:7" in names  # row 7 is the long row, rows 5 and 6 (null, blank) skipped
    assert src.total_bytes() == sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.mark.unit
def test_restart_at_every_cursor_gives_the_rest(tmp_path: Path) -> None:
    """The class behind resuming a prepare: from any cursor a reader yields exactly the
    documents after it, for every kind of file and across file boundaries."""
    folder, _ = mixed_folder(tmp_path / "src")
    src = corpus.open_source(str(folder), max_doc_chars=600)
    full = [(d, c) for d, c in src.read()]
    for i, (_, cursor) in enumerate(full):
        cursor = Cursor.from_json(json.loads(json.dumps(cursor.to_json())))
        rest = list(src.read(start=cursor))
        assert rest == full[i + 1 :], f"restart after document {i} ({full[i][0].name})"


@pytest.mark.unit
def test_text_files_are_read_in_bounded_memory(tmp_path: Path, monkeypatch) -> None:
    """Peak memory follows the block and piece sizes, not the file (here 64 KiB blocks and
    100,000-character pieces of a 9 MB file)."""
    monkeypatch.setattr(readers, "_BLOCK", 1 << 16)
    path = tmp_path / "big.txt"
    para = make_text(200, 1)
    with open(path, "w") as f:
        for _ in range(8_000):  # about 9 MB
            f.write(para + "\n\n")
    size = path.stat().st_size
    tracemalloc.start()
    n = sum(1 for _ in readers.read_local([path], tmp_path, cap=100_000))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert n == pytest.approx(size / 100_000, rel=0.05)
    assert peak < size / 10, f"peak {peak} bytes for a {size}-byte file"


@pytest.mark.unit
def test_parquet_is_read_one_row_group_at_a_time(tmp_path: Path) -> None:
    """Arrow's memory while reading follows one row group, not the file (here 160 row groups;
    one reader over all of them held half the file's text)."""
    pa = pytest.importorskip("pyarrow")
    texts = [make_text(150, 1)[: 300 + i % 700] for i in range(8_000)]
    write_parquet(tmp_path / "big.parquet", texts, row_group_size=50)
    group = max(sum(len(t) for t in texts[i : i + 50]) for i in range(0, len(texts), 50))
    before, peak, read = pa.total_allocated_bytes(), 0, []
    for doc, _ in readers.read_local([tmp_path / "big.parquet"], tmp_path, cap=10**6):
        read.append(doc.text)
        peak = max(peak, pa.total_allocated_bytes() - before)
    assert read == texts
    assert peak < 10 * group, f"peak {peak} bytes of Arrow memory for {group}-byte row groups"


@pytest.mark.unit
def test_compressed_and_parquet_errors_name_the_file(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "x.jsonl.gz").write_bytes(b"not gzip at all")
    with raises_naming(DataError, "x.jsonl.gz", "not a jsonl.gz"):
        corpus.open_source(str(tmp_path / "x.jsonl.gz"))
    with gzip.open(tmp_path / "y.jsonl.gz", "wb") as f:
        f.write(b'{"text": "ok"}\n' * 100)
    raw = (tmp_path / "y.jsonl.gz").read_bytes()
    (tmp_path / "y.jsonl.gz").write_bytes(raw[: len(raw) // 2])  # truncated stream
    with raises_naming(DataError, "y.jsonl.gz"):
        list(corpus.iter_local(tmp_path / "y.jsonl.gz"))
    write_parquet(tmp_path / "p.parquet", ["a", "b"])
    with raises_naming(DataError, "p.parquet", "'body'", "columns: id, text"):
        list(readers.read_local([tmp_path / "p.parquet"], tmp_path, cap=10, field="body"))
    with raises_naming(DataError, "p.parquet", "'id'", "int64"):
        list(readers.read_local([tmp_path / "p.parquet"], tmp_path, cap=10, field="id"))


@pytest.mark.unit
@pytest.mark.parametrize(
    ("name", "module"), [("a.jsonl.zst", "zstandard"), ("a.parquet", "pyarrow")]
)
def test_missing_optional_package_names_the_extra(tmp_path: Path, monkeypatch, name, module):
    path = tmp_path / name
    path.write_bytes(b"\x28\xb5\x2f\xfd" if name.endswith("zst") else b"PAR1")
    monkeypatch.setitem(sys.modules, module, None)
    with raises_naming(DataError, name, f"'{module}'", "pip install 'taperlm[data]'"):
        corpus.open_source(str(path))


# --- Hugging Face streaming (offline: a fake load_dataset) ------------------------------------


def _fake_load_dataset(monkeypatch, make, real_module=None) -> list:
    """Route `datasets.load_dataset` to `make()` (on the real module when given, else on a
    stand-in module) and record the calls."""
    calls: list = []

    def load_dataset(name, config, split, streaming):
        calls.append((name, config, split, streaming))
        return make()

    if real_module is not None:
        monkeypatch.setattr(real_module, "load_dataset", load_dataset)
    else:
        fake = types.SimpleNamespace(load_dataset=load_dataset)
        monkeypatch.setitem(sys.modules, "datasets", fake)
    return calls


HF_ROWS = [{"text": make_text(15 + i % 7, i) if i % 9 else "  ", "id": i} for i in range(60)]


def _hf_rows():
    yield from HF_ROWS


@pytest.mark.parametrize("stateful", [False, True], ids=["plain_iterable", "iterable_dataset"])
def test_hf_restart_at_every_cursor(monkeypatch, stateful: bool) -> None:
    """A plain iterable restarts by skipping rows; a datasets.IterableDataset (offline, from a
    generator) restarts from its own saved state, which the cursors carry."""
    datasets = pytest.importorskip("datasets") if stateful else None

    def make():
        if datasets is not None:
            return datasets.IterableDataset.from_generator(_hf_rows)
        return iter(HF_ROWS)

    calls = _fake_load_dataset(monkeypatch, make, datasets)
    monkeypatch.setattr(readers, "_HF_SNAPSHOT_ROWS", 8)
    full = list(readers.read_hf("hf:org/set", cap=60))
    assert [d.text for d, _ in full] == [
        p for r in HF_ROWS if r["text"].strip() for p in split_long(r["text"], 60)
    ]
    snapshots = {c.snapshot is not None for _, c in full}
    assert snapshots == ({False, True} if stateful else {False})
    for i in range(0, len(full), 5):
        cursor = Cursor.from_json(json.loads(json.dumps(full[i][1].to_json())))
        assert list(readers.read_hf("hf:org/set", cap=60, start=cursor)) == full[i + 1 :]
    assert calls[0] == ("org/set", None, "train", True)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("value", "error"),
    [
        (42, "holds int, not a string"),
        (1.5, "holds float, not a string"),
        (True, "holds bool, not a string"),
        (["a", "b"], "holds list, not a string"),
        ({"t": "x"}, "holds dict, not a string"),
        (b"bytes", "holds bytes, not a string"),
        ("ok \ud800 no", "'text' is not valid Unicode"),
    ],
)
def test_hf_row_that_is_not_text_is_an_error(monkeypatch, value, error) -> None:
    """Like the local readers: a dataset row whose text column holds anything but a string (or
    a string that is not Unicode) stops the read with the row named; a null is a missing row."""
    rows = [{"text": "first row"}, {"text": None}, {"text": "third"}, {"text": value}]
    _fake_load_dataset(monkeypatch, lambda: iter(rows))
    read = readers.read_hf("hf:org/set", cap=60)
    assert [d.text for d, _ in itertools.islice(read, 2)] == ["first row", "third"]
    with pytest.raises(DataError, match=rf"dataset 'hf:org/set', row 3: .*{error}"):
        next(read)
